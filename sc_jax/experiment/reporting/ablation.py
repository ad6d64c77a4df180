"""Ablations of SC refitted from a finished run's scores, with no model and no LLM
forward pass (``sc-jax ablate DIR``), in the style of the paper's appendix.

A run of ``sc-jax run`` keeps each (dataset, k, seed)'s assembled label log-probs
in ``DIR/scores/`` (:func:`sc_jax.experiment.evaluation.store.save_scores`). From them
:func:`ablate` refits SC under other settings and scores the test queries again:

* ``lambda_trust``: the invariance weight lambda_inv over a grid, crossed with the
  directional trust region on (the run's tau: the Appendix A schedule unless the
  run fixed one) or off (tau = -1), plus the uncalibrated model. The paper's
  ablation table is the rows "uncalibrated", lambda_inv = 0 without trust region
  ("neither"), lambda_inv > 0 without ("invariance only"), lambda_inv = 0 with
  ("trust region only") and both. Two rows beside "uncalibrated" give BC as the paper
  defines it (p / mean p) and as the reference code computes it (softmax(p - mean p)),
  for reference (:data:`BC_SETTINGS`).
* ``sc_n``: the ensemble over sizes 1..N, N = 1..max size (the paper's context-size
  figure; SC-5 is SC).
* ``m_i``: m of the m_i sampled test-time sub-contexts of every size, a uniformly
  random subset (:func:`context_subset`; nested: the m = 2 subset contains the m = 1
  one), for m in ``m_values`` up to what the run scored (the paper's m_i figure).
* ``single_size``: each size i alone (SC_i).
* ``guard``: what SC does with sizes whose surrogate data the LLM scores below
  chance: nothing (the paper), the guard (SC* for those sizes,
  :func:`sc_jax.calibration.numpy_fit.below_chance`), SC* for every size, and SC* without trust
  region (tau = -1) for every size, at the run's lambda_inv and tau
  (:data:`GUARD_SETTINGS`).

All but ``guard`` use the run's guard; the last three also its lambda_inv and tau.

lambda_inv "paper": the paper's objective sums the NLL over the N rows and the
penalty over the P pairs of rows that share a query, with weight 10; ours averages
both (``sc_jax.calibration.objective``), so the same problem has lambda_inv = 10 P / N, computed
per problem (it grows with the size: P / N = (M - 1) / 2 for groups of M rows, e.g.
10 at k = 4, size 1 and 12,595 at k = 8, size 5).

The tables, CSV and plots of the studies are :mod:`sc_jax.experiment.reporting.ablation_report`'s;
the surrogate data against test time, :mod:`sc_jax.experiment.reporting.diagnostics`'.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np

from sc_jax.calibration import baselines
from sc_jax.calibration.numpy_fit import fit_batch
from sc_jax.calibration.numpy_predict import predict_proba
from sc_jax.calibration.objective import log_odds
from sc_jax.experiment.evaluation import metrics
from sc_jax.experiment.evaluation.methods import fits_noted
from sc_jax.experiment.evaluation.store import load_run_scores
from sc_jax.runtime import ranges

log = logging.getLogger(__name__)

STUDIES = ("lambda_trust", "sc_n", "m_i", "single_size", "guard")
# (label, guard, SC*, tau: None the run's, -1.0 no trust region).
# The guard's SC* without trust region ("bias_only_free") is not a row of its own: under
# the tau schedule it equals the guard row (below chance, the schedule gives tau = -1).
GUARD_SETTINGS = (("paper (no guard)", "none", False, None),
                  ("guard: SC* where below chance", "bias_only", False, None),
                  ("SC* at every size", "none", True, None),
                  ("SC* without trust region at every size", "none", True, -1.0))
PAPER_LAMBDA = 10.0
M_VALUES = (1, 2, 4, 8, 16, 24)
ROW_FIELDS = ("dataset", "shots", "seed", "study", "setting", "lambda_inv", "trust_region",
              "sizes", "m", "accuracy", "macro_f1")


def context_subset(m_i: int, m: int, seed: int, size: int) -> np.ndarray:
    """Indices of m of the m_i test-time sub-contexts a run scored for one (seed,
    size), uniformly at random and nested in m (a prefix of one fixed permutation).

    The run stores its sampled sub-contexts in lexicographic order (so that shared
    prefixes sit together for the engine), so its first m are not a uniform sample:
    at size 2 they mostly begin with the first demonstration."""
    order = np.random.default_rng([seed, size, 2024]).permutation(m_i)
    return np.sort(order[:min(m, m_i)])


def paper_lambda_inv(query_ids, weight: float = PAPER_LAMBDA) -> float:
    """The paper's summed-objective weight on our mean scale: weight x P / N for the
    N rows and P same-query pairs of one problem (``query_ids [N]``)."""
    counts = np.bincount(np.unique(np.asarray(query_ids), return_inverse=True)[1].ravel())
    rows = counts.sum()
    pairs = float(np.sum(counts * (counts - 1)) / 2)
    return weight * pairs / rows if rows else 0.0


def surrogate_problems(per_seed: dict) -> tuple[list, list]:
    """The SC fitting problems of one (dataset, k) of a run, from its saved scores:
    ``per_seed`` maps seed -> scores (:func:`sc_jax.experiment.evaluation.store.load_scores`).
    Returns ``keys [(seed, size)]`` and ``problems [(log-odds [N, n-1], labels [N],
    query_ids [N])]`` in the same order, seeds and sizes ascending."""
    seeds = sorted(per_seed)
    keys = [(seed, i) for seed in seeds for i in sorted(per_seed[seeds[0]].surrogate)]
    problems = [(log_odds(per_seed[seed].surrogate[i][0]), per_seed[seed].surrogate[i][1],
                 per_seed[seed].surrogate[i][2]) for seed, i in keys]
    return keys, problems


@dataclasses.dataclass(frozen=True)
class _Refit:
    """One (dataset, k) of a run, with what every refit of it shares: its problems
    (:func:`surrogate_problems`) and the run's settings."""

    name: str
    k: int
    per_seed: dict
    keys: list
    problems: list
    run_lambda: float
    run_guard: str
    tau: float | None
    solver: str
    dtype: str
    weighting: str
    bc_batch: int

    @property
    def seeds(self) -> list[int]:
        return sorted(self.per_seed)

    @property
    def sizes(self) -> list[int]:
        return sorted({i for _, i in self.keys})

    def fit(self, lam, tau, guard=None, sc_star=False) -> dict:
        """(seed, size) -> fit, every problem in one ``fit_batch`` call; ``lam`` None is
        the run's lambda_inv, "paper" :func:`paper_lambda_inv`; ``guard`` None the run's."""
        lams = [paper_lambda_inv(q) if lam == "paper" else (self.run_lambda if lam is None else lam)
                for _, _, q in self.problems]
        res = fit_batch(self.problems, lambda_inv=lams, tau=tau, solver=self.solver,
                        dtype=self.dtype, guard=self.run_guard if guard is None else guard,
                        sc_star=sc_star)
        return dict(zip(self.keys, res))

    def score(self, seed: int, fits: dict, use_sizes, m=None) -> dict:
        """Accuracy and macro-F1 of the SC ensemble over ``use_sizes`` (m sub-contexts
        per size, :func:`context_subset`; None: all the run scored)."""
        s = self.per_seed[seed]
        feats = [log_odds(s.test[i][context_subset(s.test[i].shape[0], m, seed, i)]
                          if m else s.test[i]) for i in use_sizes]
        with fits_noted():
            pred = predict_proba([fits[(seed, i)] for i in use_sizes], feats,
                                 size_weights=self.weighting, shots=self.k,
                                 sizes=list(use_sizes)).argmax(-1)
        n = s.base.shape[-1]
        return dict(accuracy=metrics.accuracy(s.y_test, pred),
                    macro_f1=metrics.macro_f1(s.y_test, pred, num_classes=n))

    def row(self, seed: int, study: str, setting: str, result: dict, **fields) -> dict:
        row = dict(dataset=self.name, shots=self.k, seed=seed, study=study, setting=setting,
                   lambda_inv=None, trust_region=None, sizes=None, m=None)
        row.update(fields, **result)
        return row


# Reference rows of the lambda_trust study beside "uncalibrated": BC as the paper
# defines it (the best baseline in every run reported here) and as the reference code
# computes it (sc_jax.calibration.baselines.batch_calibration_reference), from the same scores.
BC_SETTINGS = (("BC (paper: p / mean p)", baselines.batch_calibration),
               ("BC (reference code: softmax(p - mean p))", baselines.batch_calibration_reference))


def _uncalibrated_rows(r: _Refit) -> list[dict]:
    """The uncalibrated model and both forms of BC, per seed (no fit)."""
    rows = []
    for seed in r.seeds:
        s = r.per_seed[seed]
        p = np.exp(s.base.astype(np.float64))
        n = s.base.shape[-1]
        for setting, probs in (("uncalibrated", p),
                               *((label, bc(p, r.bc_batch)) for label, bc in BC_SETTINGS)):
            pred = probs.argmax(-1)
            rows.append(r.row(seed, "lambda_trust", setting,
                              dict(accuracy=metrics.accuracy(s.y_test, pred),
                                   macro_f1=metrics.macro_f1(s.y_test, pred, num_classes=n))))
    return rows


def _lambda_trust_rows(r: _Refit, lambda_invs) -> tuple[list[dict], dict | None]:
    """The ``lambda_trust`` study, and the fits at the run's own lambda_inv and tau
    if the grid holds them (None otherwise)."""
    rows, default_fits = [], None
    for lam in lambda_invs:
        for trust in (True, False):
            fits = r.fit(lam, r.tau if trust else -1.0)
            label = "paper" if lam == "paper" else float(r.run_lambda if lam is None else lam)
            if lam is None and trust:
                default_fits = fits
            for seed in r.seeds:
                rows.append(r.row(seed, "lambda_trust",
                                  f"lambda_inv={label}, trust region {'on' if trust else 'off'}",
                                  r.score(seed, fits, r.sizes), lambda_inv=label,
                                  trust_region=trust, sizes=len(r.sizes)))
    return rows, default_fits


def _size_rows(r: _Refit, fits: dict, m_values) -> list[dict]:
    """The ``sc_n``, ``single_size`` and ``m_i`` studies, seed by seed, from the run's fits."""
    rows, sizes = [], r.sizes
    for seed in r.seeds:
        for n_max in range(1, len(sizes) + 1):
            rows.append(r.row(seed, "sc_n", f"SC-{sizes[n_max - 1]}",
                              r.score(seed, fits, sizes[:n_max]), sizes=sizes[n_max - 1]))
        for i in sizes:
            rows.append(r.row(seed, "single_size", f"SC_{i}", r.score(seed, fits, [i]), sizes=i))
        scored = max(r.per_seed[seed].test[i].shape[0] for i in sizes)
        for m in m_values:
            if m <= scored:
                rows.append(r.row(seed, "m_i", f"m={m}", r.score(seed, fits, sizes, m=m), m=m))
    return rows


def _guard_rows(r: _Refit, default_fits: dict) -> list[dict]:
    rows = []
    for label, guard, star, tau in GUARD_SETTINGS:
        # The run's own setting was fitted already; the others are fitted here.
        fits = (default_fits if (guard, star) == (r.run_guard, False)
                else r.fit(None, r.tau if tau is None else tau, guard=guard, sc_star=star))
        for seed in r.seeds:
            rows.append(r.row(seed, "guard", label, r.score(seed, fits, r.sizes),
                              sizes=len(r.sizes)))
    return rows


def ablate(run_dir, *, lambda_invs=(0.0, None, 1.0, "paper"), m_values=None,
           solver: str | None = None, dtype: str = "float32", guard: str | None = None,
           progress: bool = False) -> list[dict]:
    """Refit SC from the scores of the run in ``run_dir`` under the settings of every
    study in :data:`STUDIES` and return a tidy table: one dict per (dataset, shots,
    seed, study, setting) with the fields of :data:`ROW_FIELDS`.

    lambda_invs: the grid of the ``lambda_trust`` study; None stands for the run's
        lambda_inv and "paper" for :func:`paper_lambda_inv`.
    m_values: test-time sub-contexts per size for the ``m_i`` study; None: those of
        :data:`M_VALUES` up to what the run scored. A (dataset, k) whose run scored fewer
        than a value leaves that value out (sizes with fewer use all theirs); a value
        above what any (dataset, k) scored is left out; when every value is, the study
        would be empty and they are refused,
        before any fit; values above it beside others are left out with a warning.
    solver: None uses the run's. Every fit of one setting is one ``fit_batch`` call.
    guard: the guard of every study but ``guard`` ("none" or "bias_only", see
        :func:`sc_jax.calibration.numpy_fit.fit_batch`); None uses the run's.
    No model is loaded and no LLM forward pass is made.
    """
    bad = [m for m in m_values or () if int(m) != m or m < 1]
    if bad:
        raise ValueError(f"m_values (--m-values) are test-time sub-contexts per size and must be "
                         f"whole numbers of at least 1, got {bad}")
    for v in lambda_invs:  # the run's range (sc_jax.runtime.ranges), before any refit
        if v is not None and v != "paper":
            ranges.check("lambda_inv", v)
    run_dir = Path(run_dir)
    results, runs = load_run_scores(run_dir)
    # The most test-time sub-contexts of one size any (dataset, k, seed) scored.
    scored = max(t.shape[0] for per_seed in runs.values() for s in per_seed.values()
                 for t in s.test.values())
    if m_values is None:
        m_values = tuple(m for m in M_VALUES if m <= scored)
    bad = [m for m in m_values if m > scored]
    # Issue 64, found case 9: values above what the run scored were dropped without a
    # word, and with none left the m_i section with them. No value left: refused;
    # some: said (the documented `--m-values 1 2 4 8` on an m_i cap 4 run keeps 1 2 4).
    if bad and len(bad) == len(m_values):
        raise ValueError(f"--m-values {' '.join(map(str, bad))}: the run scored at most {scored} "
                         f"test-time sub-contexts per size; give values up to {scored}")
    if bad:
        log.warning("--m-values %s left out: the run scored at most %d test-time sub-contexts "
                    "per size", " ".join(map(str, bad)), scored)
    shared = dict(
        run_lambda=results.fit_lambda_inv, run_guard=guard or results.guard, tau=results.tau,
        solver=solver or results.solver, dtype=dtype,
        weighting="uniform" if results.size_weighting == "uniform" else "reference",
        bc_batch=results.bc_batch)
    rows = []
    for (name, k), per_seed in runs.items():
        if progress:
            log.info("[ablate %s k=%d] %d seeds", name, k, len(per_seed))
        keys, problems = surrogate_problems(per_seed)
        r = _Refit(name, k, per_seed, keys, problems, **shared)
        rows += _uncalibrated_rows(r)
        study_rows, default_fits = _lambda_trust_rows(r, lambda_invs)
        rows += study_rows
        if default_fits is None:
            default_fits = r.fit(None, r.tau)
        rows += _size_rows(r, default_fits, m_values)
        rows += _guard_rows(r, default_fits)
    return rows
