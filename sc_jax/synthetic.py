"""Synthetic surrogate data with a known truth, for checking a calibrator without an LLM.

A :class:`World` is a hidden classification problem whose Bayes rule is known, seen
through a simulated LLM whose label log-odds are rescaled per class (possibly with the
wrong sign, the situation of the paper's Figure 1), shifted by a label bias, shifted
again by each context, and noisy. :meth:`World.surrogate` runs Algorithm 1 on k
demonstrations drawn from it, so its output has exactly the shape of the scored
surrogate data that :func:`sc_jax.calibrators.fit_batch` takes.

Used by the behaviour tests and ``benchmarks/bench_solver.py``; also a quick way for a
user to see what SC, SC* and the baselines can and cannot correct::

    world = World(3, slopes=(-0.3, 1.0), seed=0)        # class 1 points the wrong way
    fits = fit_batch(list(world.surrogate(k=16, sizes=(1, 2)).values()))
"""

from __future__ import annotations

import itertools

import numpy as np

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
