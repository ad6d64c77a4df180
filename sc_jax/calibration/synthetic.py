"""Synthetic surrogate data with a known truth, for checking a calibrator without an LLM.

A :class:`World` is a hidden classification problem whose Bayes rule is known, seen
through a simulated LLM whose label log-odds are rescaled per class (possibly with the
wrong sign, the situation of the paper's Figure 1), shifted by a label bias, shifted
again by each context, and noisy. :meth:`World.surrogate` runs Algorithm 1 on k
demonstrations drawn from it, so its output has exactly the shape of the scored
surrogate data that :func:`sc_jax.calibration.numpy_fit.fit_batch` takes.

Used by the behaviour tests and ``benchmarks/bench_solver.py``; also a quick way for a
user to see what SC, SC* and the baselines can and cannot correct::

    world = World(3, slopes=(-0.3, 1.0), seed=0)        # class 1 points the wrong way
    fits = fit_batch(list(world.surrogate(k=16, sizes=(1, 2)).values()))
"""

from __future__ import annotations

import itertools

import numpy as np

from sc_jax.calibration.defaults import base_accuracy, tau_from_accuracy, tau_levels

__all__ = ["World"]


class World:
    """x | y ~ N(mu_y, I) in R^(n-1) with mu_0 = 0 and mu_c = s e_c, y uniform, so the
    true log-odds against class 0 are affine, t_c(x) = s x_c - s^2 / 2, and the Bayes
    rule is argmax(0, t_1, ..., t_{n-1}). The "LLM" reports

        m_c(x; C) = a_c t_c(x) + beta_c + delta_c(C) + noise,

    delta(C) ~ N(0, ctx_sd^2 I) drawn once per context, noise ~ N(0, row_sd^2 I) per row.
    a_c < 0 makes class c's log-odds point the wrong way. All draws come from one
    generator seeded by ``seed``, so a World replays exactly.
    """

    def __init__(self, num_classes: int, slopes, *, s: float = 2.0, beta=None,
                 ctx_sd: float = 0.5, row_sd: float = 0.5, seed: int = 0):
        self.n = int(num_classes)
        self.a = np.asarray(slopes, float)
        if self.n < 2 or self.a.shape != (self.n - 1,):
            raise ValueError(f"need num_classes >= 2 and {self.n - 1} slopes, got {self.a.shape}")
        self.s = float(s)
        self.beta = np.zeros(self.n - 1) if beta is None else np.asarray(beta, float)
        self.ctx_sd, self.row_sd = float(ctx_sd), float(row_sd)
        self.rng = np.random.default_rng(seed)

    def sample(self, m: int, y=None) -> tuple[np.ndarray, np.ndarray]:
        """``m`` points: x ``[m, n-1]`` and labels ``[m]`` (uniform unless ``y`` is given)."""
        y = self.rng.integers(0, self.n, m) if y is None else np.asarray(y)
        mu = np.zeros((self.n, self.n - 1))
        mu[1:] = self.s * np.eye(self.n - 1)
        return mu[y] + self.rng.normal(size=(len(y), self.n - 1)), y

    def true_logodds(self, x: np.ndarray) -> np.ndarray:
        """t(x) ``[m, n-1]``."""
        return self.s * x - self.s**2 / 2

    def bayes(self, x: np.ndarray) -> np.ndarray:
        """Bayes-optimal labels ``[m]``."""
        t = self.true_logodds(x)
        return np.argmax(np.concatenate([np.zeros((len(x), 1)), t], 1), 1)

    def context(self) -> np.ndarray:
        """A fresh context's shift delta(C) ``[n-1]``."""
        return self.rng.normal(size=self.n - 1) * self.ctx_sd

    def llm(self, x: np.ndarray, delta: np.ndarray) -> np.ndarray:
        """The simulated LLM's log-odds ``[m, n-1]`` of points x under a context with shift delta."""
        noise = self.rng.normal(size=(len(x), self.n - 1)) * self.row_sd
        return self.a * self.true_logodds(x) + self.beta + delta + noise

    def surrogate(self, k: int, sizes) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Algorithm 1 on k class-balanced demonstrations: every ordered i-tuple as the
        context, every held-out demonstration as the query, a fresh context shift per
        tuple. ``{i: (features [N_i, n-1], labels [N_i], query ids [N_i])}`` with
        N_i = P(k, i) (k - i)."""
        y = np.arange(k) % self.n
        self.rng.shuffle(y)
        x, _ = self.sample(k, y)
        out = {}
        for i in sizes:
            feats, labels, qids = [], [], []
            for ctx in itertools.permutations(range(k), i):
                q = [j for j in range(k) if j not in ctx]
                feats.append(self.llm(x[q], self.context()))
                labels += list(y[q])
                qids += q
            out[i] = (np.concatenate(feats), np.array(labels), np.array(qids))
        return out


# ---------------------------------------------------------------------------------
# Solver test instances: the families a calibrator meets, drawn at random.

FAMILIES = ("informative", "flipped", "apex", "near_separable", "tight_tau", "no_trust_region",
            "strong_invariance", "near_apex", "multiclass_strong", "mixture")


def solver_instance(family: str, seed: int):
    """One random SC problem of a family, for solver parity and robustness checks.

    Returns ``(features [N, n-1], labels [N], query_ids [N], lambda_inv, tau)``.
    Surrogate data come from :meth:`World.surrogate` with k demonstrations and one
    context size i, so N = P(k, i) (k - i) ranges from 12 (k = 4, i = 1) to 20,160
    (k = 8, i = 5); large N is drawn only for small n, to keep reference solves
    affordable. Families:

    * ``informative``: slopes in [0.5, 1.5], a label bias; tau from Appendix A.
    * ``flipped``: one class's slope negative (the paper's Figure 1); tau from
      Appendix A, which here is often tight, so the constraint binds.
    * ``apex``: uninformative log-odds (slopes 0, pure noise) with a strong
      invariance weight (1 or 10): the optimum shrinks towards theta = 0.
    * ``near_separable``: a large signal and little noise.
    * ``tight_tau``: n in {5, 6} with tau from the Appendix A schedule at high
      accuracy (alpha = 20^(1/(K-1)) degrees, the tightest it gives).
    * ``no_trust_region``: tau = -1.
    * ``strong_invariance``: n = 2, lambda_inv = 1, tau = 0.5, 200 rows over 8
      queries (25 contexts per query, drawn from the k = 8, i = 2 surrogate data),
      with signal, slope (either sign, possibly near 0), label bias and context and
      row noise drawn per seed: an invariance term of the NLL's weight, whose
      optimum is often the apex (a flat calibrator) or competes with it.
    * ``near_apex``: near-uninformative log-odds (slopes within 0.1 of 0) with
      lambda_inv in {0.5, 1}, tau in {0.5, 0.7, 0.9}, n in {2, 3}: the optimum
      lies near theta = 0, on the cone, where the smoothed cosine's curvature is
      1 / COSINE_EPS^2.
    * ``multiclass_strong``: n in {3, 4}, lambda_inv = 10, tau in {0, 0.3}, with
      informative, mixed-sign or near-uninformative slopes: the invariance term
      dominates, and a class is often switched off (theta_c near its apex) while
      the others carry the signal.
    * ``mixture``: not from :class:`World` but drawn directly: n in {2, 3}, 8 queries
      x 25 rows, each class's log-odds a two-component normal mixture whose
      components may point opposite ways, per-query shifts from a heavy-tailed
      (Student t, 2 degrees of freedom) law and per-component row noise;
      lambda_inv in {0.5, 1, 2}, tau in {0.3, 0.5, 0.7}. The objective has several
      basins here, and one start often ends in a worse one.

    lambda_inv is drawn from {0, 0.1, 1, 10} except where the family fixes it.
    """
    rng = np.random.default_rng([FAMILIES.index(family), seed])
    if family in _STRONG_INVARIANCE_FAMILIES:
        return _STRONG_INVARIANCE_FAMILIES[family](rng)
    n = int(rng.integers(2, 7))
    k, i = [(4, 1), (4, 2), (6, 1), (6, 2), (8, 1), (8, 2), (8, 3)][int(rng.integers(0, 7))]
    if n <= 3 and rng.uniform() < 0.25:  # large N, small n only
        k, i = (8, int(rng.integers(4, 6)))
    k = max(k, n)
    i = min(i, k - 1)
    lam = float(rng.choice([0.0, 0.1, 1.0, 10.0]))
    slopes = rng.uniform(0.5, 1.5, n - 1)
    kw = dict(beta=rng.normal(size=n - 1) * 0.5, seed=int(rng.integers(1 << 30)))
    tau = None
    if family == "flipped":
        slopes[int(rng.integers(0, n - 1))] *= -1.0
    elif family == "apex":
        slopes[:] = 0.0
        lam = float(rng.choice([1.0, 10.0]))
    elif family == "near_separable":
        kw.update(s=4.0, ctx_sd=0.1, row_sd=0.1)
    elif family == "tight_tau":
        n = int(rng.integers(5, 7))
        k, i = 8, int(rng.integers(1, 3))
        slopes = rng.uniform(0.5, 1.5, n - 1)
        kw["beta"] = rng.normal(size=n - 1) * 0.5
        tau = tau_levels(n)[0]
    elif family == "no_trust_region":
        tau = -1.0
    world = World(n, slopes, **kw)
    x, y, g = world.surrogate(k, (i,))[i]
    if tau is None:
        tau = tau_from_accuracy(base_accuracy(x, y), n)
    return x, y, g, lam, float(tau)


def _per_query(x, y, g, rows_per_query: int, rng):
    """``rows_per_query`` rows of every query, drawn without replacement (the rows
    keep their order, grouped per query as the surrogate data are)."""
    keep = np.concatenate([rng.choice(np.flatnonzero(g == q), rows_per_query, replace=False)
                           for q in np.unique(g)])
    keep.sort()
    return x[keep], y[keep], g[keep]


def _strong_invariance(rng):
    # Anything from no signal to a clear one, either way round, seen through a noisy,
    # biased LLM whose context shifts range from mild to larger than the signal: the
    # invariance term pulls towards flat calibrators (the apex, f = log 2 +
    # 2 lambda_inv log 2) while the NLL pulls towards the data, and which wins
    # differs from seed to seed.
    world = World(2, rng.uniform(-1.5, 1.5, 1), s=float(rng.uniform(0.5, 3.0)),
                  beta=rng.normal(size=1) * 1.5, ctx_sd=float(rng.uniform(0.3, 3.0)),
                  row_sd=float(rng.uniform(0.3, 2.0)), seed=int(rng.integers(1 << 30)))
    x, y, g = world.surrogate(8, (2,))[2]
    x, y, g = _per_query(x, y, g, 25, rng)
    return x, y, g, 1.0, 0.5


_SMALL_CONTEXTS = [(4, 1), (4, 2), (6, 1), (6, 2), (8, 1), (8, 2)]


def _near_apex(rng):
    n = int(rng.integers(2, 4))
    k, i = _SMALL_CONTEXTS[int(rng.integers(0, 6))]
    world = World(n, rng.uniform(-0.1, 0.1, n - 1), beta=rng.normal(size=n - 1) * 0.3,
                  ctx_sd=float(rng.uniform(0.2, 1.0)), row_sd=float(rng.uniform(0.3, 1.0)),
                  seed=int(rng.integers(1 << 30)))
    x, y, g = world.surrogate(max(k, n), (i,))[i]
    return x, y, g, float(rng.choice([0.5, 1.0])), float(rng.choice([0.5, 0.7, 0.9]))


def _multiclass_strong(rng):
    # Informative, mixed-sign or near-uninformative slopes: with lambda_inv = 10 the
    # invariance term dominates, and a class is often switched off (theta_c near 0)
    # while the others carry the signal.
    n = int(rng.integers(3, 5))
    k, i = _SMALL_CONTEXTS[int(rng.integers(0, 6))]
    lo, hi = [(0.3, 1.5), (-1.5, 1.5), (-0.15, 0.15)][int(rng.integers(0, 3))]
    world = World(n, rng.uniform(lo, hi, n - 1), s=float(rng.uniform(0.5, 3.0)),
                  beta=rng.normal(size=n - 1) * float(rng.uniform(0.0, 2.0)),
                  ctx_sd=float(rng.uniform(0.1, 2.0)), row_sd=float(rng.uniform(0.1, 1.5)),
                  seed=int(rng.integers(1 << 30)))
    x, y, g = world.surrogate(max(k, n), (i,))[i]
    return x, y, g, 10.0, float(rng.choice([0.0, 0.3]))


def _mixture(rng):
    # Another generator than World's affine truth: per class two normal components
    # (the second possibly mirrored), shifted per query by a heavy-tailed draw.
    n = int(rng.choice([2, 2, 3]))
    queries, per_query = 8, 25
    y = rng.integers(0, n, queries * per_query)
    g = np.repeat(np.arange(queries), per_query)
    comp = (rng.uniform(size=len(y)) < rng.uniform(0.1, 0.9)).astype(int)
    mu = rng.normal(size=(n, 2, n - 1)) * rng.uniform(0.1, 2.0)  # [class, component, n-1]
    mu[:, 1] *= rng.choice([-1.0, 1.0])
    shift = rng.standard_t(2, size=(queries, n - 1)) * rng.uniform(0.1, 2.0)
    sd = rng.uniform(0.2, 2.0, 2)
    x = mu[y, comp] + shift[g] + rng.normal(size=(len(y), n - 1)) * sd[comp][:, None]
    return x, y, g, float(rng.choice([0.5, 1.0, 2.0])), float(rng.choice([0.3, 0.5, 0.7]))


# The families whose invariance term weighs as much as the NLL or more: their optima
# sit at or near a class's apex, or in one of several basins.
_STRONG_INVARIANCE_FAMILIES = {"strong_invariance": _strong_invariance,
                               "near_apex": _near_apex,
                               "multiclass_strong": _multiclass_strong,
                               "mixture": _mixture}
