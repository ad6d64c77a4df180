"""Ablations of SC refitted from a finished run's scores, with no model and no LLM
forward pass (``sc-jax ablate DIR``), in the style of the paper's appendix.

A run of ``sc-jax run`` keeps each (dataset, k, seed)'s assembled label log-probs
in ``DIR/scores/`` (:func:`sc_jax.experiment.store.save_scores`). From them
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
"""

from __future__ import annotations

import csv
import dataclasses
import logging
import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from sc_jax.calibration import baselines
from sc_jax.calibration.defaults import DEFAULT_LAMBDA_INV, base_accuracy
from sc_jax.calibration.numpy_fit import fit_batch
from sc_jax.calibration.numpy_predict import FitResult, predict_proba
from sc_jax.calibration.objective import log_odds
from sc_jax.calibration.solvers import Status
from sc_jax.experiment import metrics, samples
from sc_jax.experiment.config import METHODS, SC_FITS, RunConfig
from sc_jax.experiment.data import DataUnavailableError
from sc_jax.experiment.jobs import draw_split, load_datasets
from sc_jax.experiment.predictions import fits_noted, method_probs, sc_size_probs
from sc_jax.experiment.report import can_plot, load_results, save_figure
from sc_jax.experiment.store import (config_tag, load_scores, make_out_dir,
                                     refuse_foreign_outputs, scores_path)
from sc_jax.models.named_models import display_name

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


def _load_run(run_dir: Path):
    results = load_results(run_dir)
    config = results["config"]
    skipped = {(x["dataset"], x["shots"]) for x in results.get("skipped", [])}
    runs, missing = {}, []
    tag = config_tag(config)
    for name in config["datasets"]:
        for k in config["shots"]:
            if (name, k) in skipped:
                continue
            for seed in config["seeds"]:
                path = scores_path(run_dir, name, k, seed)
                if path.exists():
                    runs.setdefault((name, k), {})[seed] = load_scores(path, tag)
                else:
                    missing.append(path.name)
    if missing:
        raise FileNotFoundError(
            f"{run_dir}: no saved scores for {len(missing)} (dataset, k, seed) "
            f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}). Runs made "
            "before scores were saved can write them: run the same `sc-jax run` command "
            "again with the same --out (every score is read from its cache, no forward "
            "pass).")
    if not runs:
        raise ValueError(f"{run_dir}: the run has no (dataset, k) to ablate")
    return results, runs


def surrogate_problems(per_seed: dict) -> tuple[list, list]:
    """The SC fitting problems of one (dataset, k) of a run, from its saved scores:
    ``per_seed`` maps seed -> scores (:func:`sc_jax.experiment.store.load_scores`). Returns
    ``keys [(seed, size)]`` and ``problems [(log-odds [N, n-1], labels [N],
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
    bad = [v for v in lambda_invs if v is not None and v != "paper" and not 0 <= v < math.inf]
    if bad:
        raise ValueError(f"lambda_invs (--lambda-inv) must be finite numbers >= 0, 'run' or "
                         f"'paper', got {bad}")
    run_dir = Path(run_dir)
    results, runs = _load_run(run_dir)
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
    config = results["config"]
    shared = dict(
        run_lambda=results.get("lambda_inv", DEFAULT_LAMBDA_INV),
        run_guard=guard or config.get("guard", "none"), tau=config.get("tau"),
        solver=solver or config.get("solver", "augmented_lagrangian"), dtype=dtype,
        weighting="uniform" if config.get("size_weighting", "uniform") == "uniform" else "reference",
        bc_batch=int(config.get("bc_batch", baselines.BC_BATCH_SIZE)))
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


def _fit_from_param(p: dict, solver: str) -> FitResult:
    """The :class:`FitResult` of one param record of results.json (the run's own b and
    w, stored as exact float64 JSON numbers): predictions from it are the run's."""
    nan = float("nan")
    return FitResult(b=np.asarray(p["b"], np.float64), w=np.asarray(p["w"], np.float64),
                     status=Status[p.get("status", "CONVERGED")], iterations=0,
                     outer_iterations=0, objective=p.get("objective", nan), constraint=nan,
                     violation=nan, tau=p.get("tau", nan), lambda_inv=p.get("lambda_inv", nan),
                     solver=solver, sc_star=p["method"] != "sc" or bool(p.get("guarded")),
                     num_rows=int(p.get("rows", 0)),
                     base_accuracy=p.get("base_accuracy", nan), guarded=bool(p.get("guarded")))


def _drawn_splits(results: dict) -> tuple[dict, str | None]:
    """(dataset, k, seed) -> (dataset, Split) as the run drew them, checked against the
    test-set hashes in results.json; ``({}, why)`` when the data cannot be had here."""
    config = results["config"]
    known = {f.name for f in dataclasses.fields(RunConfig)}

    def frozen(v):  # JSON lists back to the tuples RunConfig holds
        return tuple(frozen(x) for x in v) if isinstance(v, list) else v

    try:
        cfg = RunConfig(**{k: frozen(v) for k, v in config.items() if k in known})
        datasets = load_datasets(cfg)
    except (DataUnavailableError, OSError, ValueError, TypeError) as e:
        return {}, f"the run's data could not be loaded here ({type(e).__name__}: {e})"
    out = {}
    for rec in results.get("splits", []):
        name, k, seed = rec["dataset"], rec["shots"], rec["seed"]
        split = draw_split(datasets[name], cfg, k, seed)
        if split.test_hash() != rec.get("test_hash"):
            return {}, (f"{name} k={k} seed {seed}: the data here draw another test set than "
                        "the run's (its hash differs)")
        out[(name, k, seed)] = (datasets[name], split)
    return out, None


def regenerate_samples(run_dir, *, with_texts: bool = True) -> tuple[Path, list[str]]:
    """Write the per-sample records (:mod:`sc_jax.experiment.samples`) of a finished run beside
    its results.json, from its score files (``DIR/scores/``) and the SC parameters its
    results.json holds: no model, no forward pass, no refit. Returns the file and notes.

    Baselines: every baseline of :data:`sc_jax.experiment.config.METHODS`, ``bc_reference``
    included for a run that predates it (its ``bc_batch``). SC methods: those with
    params in results.json. The records of the run's own methods reproduce its
    results.json rows (:func:`sc_jax.experiment.samples.check_samples`). Dataset rows and text
    hashes are filled in when ``with_texts`` and the run's data load here and draw the
    test sets the run recorded; otherwise they are null, and a note says why.
    """
    run_dir = Path(run_dir)
    results, runs = _load_run(run_dir)
    config = results["config"]
    solver = config.get("solver", "augmented_lagrangian")
    bc_batch = int(config.get("bc_batch", baselines.BC_BATCH_SIZE))
    weighting = config.get("size_weighting", "uniform")
    fits = defaultdict(dict)  # (method, dataset, shots, seed) -> size -> FitResult
    for p in results.get("params") or []:
        fits[(p["method"], p["dataset"], p["shots"], p["seed"])][p["size"]] = _fit_from_param(p, solver)
    drawn, why = _drawn_splits(results) if with_texts else ({}, "texts not asked for")
    notes = [] if why is None else [f"no dataset rows or text hashes: {why}"]
    records = []
    for (name, k), per_seed in runs.items():
        for seed in sorted(per_seed):
            s = per_seed[seed]
            probs, per_size = {}, {}
            for method in METHODS:
                per = fits.get((method, name, k, seed)) if method in SC_FITS else None
                if method in SC_FITS and not per:
                    continue  # the run did not fit it
                sizes = sorted(per) if per else []
                probs[method] = method_probs(method, s, per, sizes, bc_batch=bc_batch,
                                             size_weighting=weighting, shots=k)
                if per:
                    per_size[method] = sc_size_probs(s, per, sizes)
            ds, split = drawn.get((name, k, seed), (None, None))
            records += samples.seed_records(
                name, k, seed, s.y_test, probs, per_size,
                rows=None if split is None else split.test_indices,
                texts=None if split is None else split.test_texts(ds))
    return samples.write_samples(run_dir, records), notes


DIAGNOSTIC_FIELDS = ("dataset", "shots", "seed", "size", "rows", "surrogate_accuracy",
                     "test_accuracy_same_size", "base_accuracy", "heldout_class_share",
                     "test_class_share", "tau", "mean_w", "status", "sc_size_accuracy")


def diagnose(run_dir, *, solver: str | None = None, dtype: str = "float32") -> list[dict]:
    """Why SC helps or hurts, per (dataset, shots, seed, size i), from saved scores:

    surrogate_accuracy: the LLM's in-sample accuracy on the surrogate data (what the
        Appendix A tau schedule reads); test_accuracy_same_size: its accuracy on the
        test queries under size-i sub-contexts (mean over the m_i of them): the two
        would agree if the surrogate data were representative of test time;
        base_accuracy: the full k-shot prompt's.
    heldout_class_share: mean over surrogate rows of the share of the held-out
        demonstration's own class among the other k - 1 demonstrations, which its
        sub-contexts are drawn from: (n_y - 1) / (k - 1) for n_y demonstrations of its
        class; test_class_share: the same for the test queries, whose sub-contexts
        come from all k: n_y / k. A model that copies the labels in its context sees
        the held-out class under-represented in the surrogate data only.
    tau, mean_w, status, sc_size_accuracy: SC fitted as the paper does (no guard; its tau
        from the schedule, mean slope, solver status) and its test accuracy alone.
    """
    results, runs = _load_run(Path(run_dir))
    config = results["config"]
    lam = results.get("lambda_inv", DEFAULT_LAMBDA_INV)
    solver = solver or config.get("solver", "augmented_lagrangian")
    rows = []
    for (name, k), per_seed in runs.items():
        keys, problems = surrogate_problems(per_seed)
        fits = dict(zip(keys, fit_batch(problems, lambda_inv=lam, tau=config.get("tau"),
                                        solver=solver, dtype=dtype)))
        for (seed, i), (feats, y, q) in zip(keys, problems):
            s = per_seed[seed]
            demo_label = np.zeros(k, np.int64)  # the label of each held-out demonstration
            demo_label[q] = y
            per_class = np.bincount(demo_label, minlength=s.base.shape[-1])
            test_pred = s.test[i].argmax(-1)  # [m_i, T]
            fit_i = fits[(seed, i)]
            with fits_noted():
                pred = predict_proba([fit_i], [log_odds(s.test[i])]).argmax(-1)
            rows.append(dict(
                dataset=name, shots=k, seed=seed, size=i, rows=int(len(y)),
                surrogate_accuracy=base_accuracy(feats, y),
                test_accuracy_same_size=float(np.mean(test_pred == s.y_test[None])),
                base_accuracy=float(np.mean(s.base.argmax(-1) == s.y_test)),
                heldout_class_share=float(np.mean((per_class[y] - 1) / (k - 1))),
                test_class_share=float(np.mean(per_class[s.y_test] / k)),
                tau=float(fit_i.tau), mean_w=float(np.mean(fit_i.w)), status=fit_i.status.name,
                sc_size_accuracy=metrics.accuracy(s.y_test, pred)))
    return rows


def diagnostics_markdown(rows) -> str:
    """Per dataset and shots, one row per size: the :func:`diagnose` fields averaged
    over seeds (accuracies and shares in %)."""
    out = ["# Surrogate data against test time (the LLM alone, then SC of that size)", "",
           "Means over seeds. surrogate acc: the LLM's in-sample accuracy on the surrogate "
           "data; test acc: its accuracy on the test queries under sub-contexts of the "
           "same size; shares: the query's own class among the demonstrations its "
           "sub-contexts are drawn from (held-out rows: the other k - 1; test queries: "
           "all k).", ""]
    groups = defaultdict(list)
    for r in rows:
        groups[(r["dataset"], r["shots"], r["size"])].append(r)
    for d, k in sorted({(r["dataset"], r["shots"]) for r in rows}):
        out += [f"## {d}, {k}-shot", "",
                "| size | rows | surrogate acc | test acc (same size) | k-shot acc | held-out share "
                "| test share | tau | mean w | not converged | SC_i test acc |",
                "|---|---|---|---|---|---|---|---|---|---|---|"]
        for i in sorted({r["size"] for r in rows if r["dataset"] == d and r["shots"] == k}):
            rs = groups[(d, k, i)]

            def pct(field, rs=rs):
                return f"{100 * np.mean([r[field] for r in rs]):.1f}"

            bad = sum(r["status"] != "CONVERGED" for r in rs)
            out.append(f"| {i} | {rs[0]['rows']} | {pct('surrogate_accuracy')} | "
                       f"{pct('test_accuracy_same_size')} | {pct('base_accuracy')} | "
                       f"{pct('heldout_class_share')} | {pct('test_class_share')} | "
                       f"{np.mean([r['tau'] for r in rs]):.3f} | "
                       f"{np.mean([r['mean_w'] for r in rs]):.2f} | {bad}/{len(rs)} | "
                       f"{pct('sc_size_accuracy')} |")
        out.append("")
    return "\n".join(out)


def summarize(rows) -> dict[tuple, dict]:
    """``{(study, setting, dataset, shots): {metric: (mean, std, n_seeds)}}``."""
    groups = defaultdict(list)
    for r in rows:
        groups[(r["study"], r["setting"], r["dataset"], r["shots"])].append(r)
    return {key: {m: (float(np.mean([r[m] for r in rs])), float(np.std([r[m] for r in rs])), len(rs))
                  for m in ("accuracy", "macro_f1")} for key, rs in groups.items()}


_TITLES = {
    "lambda_trust": "Invariance weight x trust region (the paper's ablation table)",
    "sc_n": "SC-N: the ensemble over sizes 1..N (the paper's context-size figure)",
    "m_i": "Test-time sub-contexts per size m (the paper's m_i figure)",
    "single_size": "Each size alone (SC_i)",
    "guard": "Sizes the LLM scores below chance on the surrogate data: the guard",
}


def markdown(rows) -> str:
    """One macro-F1 table per study and shot count: settings as rows, datasets and
    their average as columns, cells mean ± std over seeds (in %)."""
    summ = summarize(rows)
    datasets = sorted({r["dataset"] for r in rows})
    out = ["# Ablations (refitted from saved scores; no forward pass)", "",
           "Cells: macro-F1, mean ± std over seeds (in %; the population std, ddof = 0). lambda_inv=paper is the paper's "
           "summed-objective weight 10 on our mean scale (10 P / N per problem).", ""]
    for study in STUDIES:
        for k in sorted({r["shots"] for r in rows if r["study"] == study}):
            settings = list(dict.fromkeys(r["setting"] for r in rows
                                          if r["study"] == study and r["shots"] == k))
            out += [f"## {_TITLES[study]}, {k}-shot", "",
                    "| Setting | " + " | ".join(datasets) + " | Average |",
                    "|---|" + "---|" * (len(datasets) + 1)]
            for setting in settings:
                cells, means = [], []
                for d in datasets:
                    v = summ.get((study, setting, d, k))
                    if v is None:
                        cells.append("-")
                        continue
                    mean, std, _ = v["macro_f1"]
                    means.append(mean)
                    cells.append(f"{100 * mean:.1f} ± {100 * std:.1f}")
                avg = f"{100 * np.mean(means):.1f}" if len(means) == len(datasets) else "-"
                out.append(f"| {setting} | " + " | ".join(cells) + f" | {avg} |")
            out.append("")
    return "\n".join(out)


def _plot_curve(rows, study: str, x_field: str, xlabel: str, path: Path,
                model: str | None = None) -> bool:
    """The curve of :func:`curve_figure` as ``path`` (PNG), PDF and SVG
    (:func:`sc_jax.experiment.report.save_figure`); False when the study has no rows."""
    fig = curve_figure(rows, study, x_field, xlabel, model)
    if fig is None:
        return False
    save_figure(fig, path)
    return True


def curve_figure(rows, study: str, x_field: str, xlabel: str, model: str | None = None):
    """Macro-F1 (mean and std over seeds) of ``study``'s rows against the integer
    ``x_field`` (N sizes, m sub-contexts), one line per (dataset, k): a
    ``matplotlib.figure.Figure``, or None when the study has no rows."""
    summ = summarize(rows)
    keys = sorted({(r["dataset"], r["shots"]) for r in rows if r["study"] == study})
    if not keys:
        return None
    # matplotlib loads on first plot (about 0.5 s to import; see report.plot_f1_bars).
    from matplotlib.figure import Figure  # noqa: PLC0415
    from matplotlib.ticker import MaxNLocator  # plotting only, loaded on first plot

    fig = Figure(figsize=(6, 4))  # not pyplot: the caller's backend stays as it is
    ax = fig.subplots()
    # N sizes and m sub-contexts are counts: no tick at 2.5.
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if model is not None:
        ax.set_title(f"{display_name(str(model))}: macro-F1 against {xlabel}", fontsize=9)
    for d, k in keys:
        pts = sorted({(r[x_field], r["setting"]) for r in rows
                      if r["study"] == study and r["dataset"] == d and r["shots"] == k})
        xs = [x for x, _ in pts]
        ys = [100 * summ[(study, s, d, k)]["macro_f1"][0] for _, s in pts]
        es = [100 * summ[(study, s, d, k)]["macro_f1"][1] for _, s in pts]
        ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=f"{d}, k={k}")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("macro-F1 (%)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


#: What ``sc-jax ablate`` writes into its --out (the plots also as PDF and SVG).
ABLATION_OUTPUTS = ("ablation.md", "ablation.csv", "diagnostics.md", "diagnostics.csv") + tuple(
    f"ablation_{name}.{ext}" for name in ("sc_n", "m") for ext in ("png", "pdf", "svg"))


def written_by_ablate(out_dir) -> bool:
    """Whether ``out_dir``'s files are sc-jax ablate's: its ablation.csv opens with the
    header every ablate writes (:data:`ROW_FIELDS`), which versions before this test
    wrote too, so their outputs are replaced by a rerun as before."""
    try:
        with open(Path(out_dir) / "ablation.csv") as f:
            return f.readline().rstrip("\r\n") == ",".join(ROW_FIELDS)
    except (OSError, UnicodeDecodeError):
        return False


def check_ablation_out(out_dir, overwrite: bool = False) -> Path:
    """``ablate --out``, checked before any refit: a directory (created if need be; a
    file there is refused, issue 64 case 9) that holds no user's file by the names
    ablate writes, unless ``overwrite`` (the rule of ``run --out``,
    :func:`sc_jax.experiment.store.refuse_foreign_outputs`; issue 64 case 6)."""
    out = make_out_dir(out_dir, "--out")
    if not overwrite:
        refuse_foreign_outputs(out, ABLATION_OUTPUTS, written_by_ablate(out), command="ablate",
                               sign="no ablation.csv with its header")
    return out


def write_ablation(rows, out_dir, diagnostics=None, model: str | None = None) -> dict[str, Path]:
    """``ablation.md``, ``ablation.csv`` and the SC-N and m_i plots into ``out_dir``;
    with the rows of :func:`diagnose`, ``diagnostics.md`` and ``diagnostics.csv``.
    ``model`` (the run's ``--model``) titles the plots."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = {"table": out / "ablation.md", "csv": out / "ablation.csv"}
    files["table"].write_text(markdown(rows))
    if diagnostics:
        files["diagnostics"] = out / "diagnostics.md"
        files["diagnostics"].write_text(diagnostics_markdown(diagnostics))
        files["diagnostics_csv"] = out / "diagnostics.csv"
        with open(files["diagnostics_csv"], "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=DIAGNOSTIC_FIELDS)
            w.writeheader()
            w.writerows(diagnostics)
    with open(files["csv"], "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=ROW_FIELDS)
        w.writeheader()
        w.writerows({k: r.get(k) for k in ROW_FIELDS} for r in rows)
    if not can_plot():
        return files
    if _plot_curve(rows, "sc_n", "sizes", "largest size N in the ensemble", out / "ablation_sc_n.png",
                   model):
        files["sc_n_plot"] = out / "ablation_sc_n.png"
    if _plot_curve(rows, "m_i", "m", "test-time sub-contexts per size m", out / "ablation_m.png",
                   model):
        files["m_plot"] = out / "ablation_m.png"
    return files
