"""Per-sample records of a run: one JSON line per (dataset, k, seed, test query).

``sc-jax run --log-samples`` writes them beside ``results.json``; ``sc-jax report DIR
--log-samples`` writes them for a finished run from its score files
(``DIR/scores/``) and the fitted parameters in its results.json, with no model
(:func:`regenerate_samples`). A record::

    {"dataset": str, "shots": k, "seed": int, "index": t (position in the test set),
     "row": dataset row of the query or null, "text_sha256": first 16 hex digits of the
     sha256 of its UTF-8 text or null, "gold": class id,
     "probs": {method: [n] probabilities}, "pred": {method: class id},
     "sc_sizes": {method: {"i": [n]}}}

``probs`` holds every method's calibrated probabilities p(y | x) (``[n]``, rounded to
:data:`DIGITS` significant digits; ``pred`` is the argmax of the unrounded ones).
``sc_sizes`` holds, for SC and SC*, the per-size probabilities (1/m_i) sum_j
f(m(x; C_i^(j)); theta_i) of Algorithm 2 that the ensemble averages.

The file is ``samples.jsonl``, or ``samples.jsonl.gz`` above :data:`GZIP_ABOVE`
bytes. :func:`check_samples` recomputes accuracy, macro-F1 and ECE from the records
and compares them with results.json; :func:`paired_tests` gives per-query paired
tests (exact McNemar per seed, and a signed-rank test over queries that treats the
shared test set as one sample; :mod:`sc_jax.experiment.reporting.stats`) that per-seed means
cannot.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from sc_jax.calibration import methods as registry
from sc_jax.calibration.numpy_predict import FitResult
from sc_jax.calibration.solvers import Status
from sc_jax.experiment.evaluation import metrics
from sc_jax.experiment.evaluation.methods import method_probs, sc_size_probs
from sc_jax.experiment.evaluation.results import METRICS, FitRecord, ResultRow, RunResults
from sc_jax.experiment.evaluation.store import load_run_scores, recorded_tasks, task_difference
from sc_jax.experiment.protocol.config import RunConfig
from sc_jax.experiment.protocol.jobs import draw_split, load_datasets, task_file_records
from sc_jax.experiment.reporting.names import dataset_name, method_name
from sc_jax.experiment.reporting.stats import mcnemar_exact_p, query_signed_rank_p
from sc_jax.experiment.tasks.loading import DataUnavailableError
from sc_jax.models.identity import text_hash  # a query named without copying its text

SAMPLES_FILE = "samples.jsonl"
GZIP_ABOVE = 4 << 20  # bytes of JSONL; a 9-task, 3-seed, 128-query run is about 5 MB
DIGITS = 8  # significant digits kept of each probability

__all__ = ["SAMPLES_FILE", "check_samples", "paired_tests", "read_samples", "regenerate_samples",
           "rows_from_samples", "sample_paths", "samples_markdown", "seed_records", "text_hash",
           "write_samples"]


def _rounded(p: np.ndarray) -> list:
    return [float(f"{v:.{DIGITS}g}") for v in np.asarray(p, np.float64).tolist()]


def seed_records(dataset: str, shots: int, seed: int, gold, probs: Mapping[str, np.ndarray],
                 sc_sizes: Mapping[str, Mapping[int, np.ndarray]] | None = None,
                 rows: Sequence[int] | None = None,
                 texts: Sequence[str] | None = None) -> list[dict]:
    """The records of one (dataset, k, seed).

    gold: ``[T]`` class ids; probs: method -> ``[T, n]``; sc_sizes: method -> size ->
    ``[T, n]`` (SC's per-size probabilities); rows: ``[T]`` dataset rows of the test
    queries and texts: their ``T`` texts (hashed with :func:`text_hash`), or None
    where the dataset is not at hand.
    """
    gold = np.asarray(gold)
    t = gold.shape[0]
    for name, p in probs.items():
        if np.shape(p)[:1] != (t,) or np.ndim(p) != 2:
            raise ValueError(f"probs[{name!r}] must be [{t}, n], got shape {np.shape(p)}")
    for what, seq in (("rows", rows), ("texts", texts)):
        if seq is not None and len(seq) != t:
            raise ValueError(f"{what} must have one entry per test query ({t}), got {len(seq)}")
    preds = {m: np.asarray(p).argmax(-1) for m, p in probs.items()}
    out = []
    for j in range(t):
        out.append({
            "dataset": dataset, "shots": int(shots), "seed": int(seed), "index": j,
            "row": None if rows is None else int(rows[j]),
            "text_sha256": None if texts is None else text_hash(texts[j]),
            "gold": int(gold[j]),
            "probs": {m: _rounded(p[j]) for m, p in probs.items()},
            "pred": {m: int(v[j]) for m, v in preds.items()},
            "sc_sizes": {m: {str(i): _rounded(p[j]) for i, p in sorted(per.items())}
                         for m, per in (sc_sizes or {}).items()},
        })
    return out


def sample_paths(run_dir) -> tuple[Path, Path]:
    """The two places a run's records may be: plain and gzipped JSONL."""
    run_dir = Path(run_dir)
    return run_dir / SAMPLES_FILE, run_dir / (SAMPLES_FILE + ".gz")


def write_samples(run_dir, records: Sequence[dict]) -> Path:
    """Write ``records`` into ``run_dir`` (plain, or gzip above :data:`GZIP_ABOVE`
    bytes) atomically, removing the other form; returns the path."""
    run_dir = Path(run_dir)
    text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records).encode()
    plain, packed = sample_paths(run_dir)
    path, other = (packed, plain) if len(text) > GZIP_ABOVE else (plain, packed)
    tmp = path.with_name(f".tmp-{path.name}")
    # mtime=0: the same records give the same bytes (reproducible, diffable files).
    tmp.write_bytes(gzip.compress(text, mtime=0) if path is packed else text)
    tmp.replace(path)
    other.unlink(missing_ok=True)
    return path


def read_samples(run_dir) -> list[dict] | None:
    """The records in ``run_dir`` (either form), or None when it has no such file. A
    file that is not JSON lines, or holds no record (a run writes one per test query,
    so an empty log is a damaged one, not an absent one), raises ValueError naming it."""
    run_dir = Path(run_dir)
    for path in sample_paths(run_dir):
        if path.exists():
            try:
                raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
                records = [json.loads(line) for line in raw.decode().split("\n") if line.strip()]
            except (OSError, EOFError, ValueError) as e:
                raise ValueError(f"{path}: unreadable sample log ({type(e).__name__}: {e}); "
                                 "rewrite it with `sc-jax report DIR --log-samples`") from e
            if not records:
                raise ValueError(f"{path} is empty (a sample log holds one record per test "
                                 "query): rewrite it with `sc-jax report DIR --log-samples`, or "
                                 "delete it")
            for j, r in enumerate(records):
                if not isinstance(r, dict) or not _RECORD_KEYS <= set(r):
                    raise ValueError(f"{path}, record {j + 1}: not a sample record (an object with "
                                     f"{', '.join(sorted(_RECORD_KEYS))}); rewrite it with "
                                     "`sc-jax report DIR --log-samples`")
            return records
    return None


# What the checks and tables read of each record (seed_records writes more).
_RECORD_KEYS = frozenset(("dataset", "shots", "seed", "gold", "pred", "probs"))


def _groups(records) -> dict:
    """(dataset, shots, seed) -> its records, in test order."""
    out = defaultdict(list)
    for r in records:
        out[(r["dataset"], r["shots"], r["seed"])].append(r)
    return out


def rows_from_samples(records: Sequence[dict],
                      methods: Sequence[str] | None = None) -> list[ResultRow]:
    """results.json's rows (:class:`ResultRow`, with no ``model``) recomputed from the
    records, for ``methods`` (None: every method they hold): e.g. ``bc_reference`` for
    a run whose results.json predates it."""
    out = []
    for (d, k, seed), recs in sorted(_groups(records).items()):
        gold = np.array([r["gold"] for r in recs])
        for m in (methods if methods is not None else recs[0]["pred"]):
            if m not in recs[0]["pred"]:
                continue
            pred = np.array([r["pred"][m] for r in recs])
            probs = np.array([r["probs"][m] for r in recs])
            out.append(ResultRow(dataset=d, shots=k, seed=seed, method=m,
                                 accuracy=metrics.accuracy(gold, pred),
                                 macro_f1=metrics.macro_f1(gold, pred, num_classes=probs.shape[-1]),
                                 ece=metrics.expected_calibration_error(probs, gold)))
    return out


def check_samples(records: Sequence[dict], rows: Sequence[ResultRow], *, tol: float = 1e-9,
                  ece_tol: float = 1e-6) -> list[str]:
    """Accuracy and macro-F1 (from ``pred``) and ECE (from the rounded ``probs``, hence
    ``ece_tol``) recomputed per (dataset, shots, seed, method) from the records, against
    results.json's ``rows``: one line per disagreement, and one per row that has no
    records; empty when they agree. Methods in the records but not in the rows (e.g.
    ``bc_reference`` regenerated for an older run) are not compared."""
    got = {(r.dataset, r.shots, r.seed, r.method): r for r in rows_from_samples(records)}
    problems = []
    for row in rows:
        key = (row.dataset, row.shots, row.seed, row.method)
        where = f"{key[0]} k={key[1]} seed {key[2]} {key[3]}"
        if key not in got:
            problems.append(f"{where}: no per-sample records")
            continue
        for name in METRICS:
            value, kept = got[key].metric(name), row.metric(name)
            if abs(value - kept) > (ece_tol if name == "ece" else tol):
                problems.append(f"{where}: {name} {value:.6f} from the records, "
                                f"{kept:.6f} in results.json")
    return problems


def paired_tests(records: Sequence[dict], a: str = "sc", b: str = "bc") -> list[dict]:
    """Method ``a`` against ``b`` query by query, per (dataset, shots).

    Every seed scores the same test queries (with its own demonstrations), so the
    (seed, query) pairs are not independent units and are never pooled. Per seed s:
    ``a_only[s]`` queries ``a`` gets right and ``b`` wrong, ``b_only[s]`` the reverse,
    and ``mcnemar_p[s]``, the exact McNemar p-value (:func:`stats.mcnemar_exact_p`).
    Over seeds: ``signed_rank_p``, the Wilcoxon signed-rank test over queries of the
    per-query difference in correctness averaged over seeds
    (:func:`stats.query_signed_rank_p`). ``queries``: the test-set size; ``seeds``: the
    seeds with both methods, sorted. Queries are matched across seeds by their
    position in the test set (``index``)."""
    groups = defaultdict(dict)  # (dataset, shots) -> seed -> records
    for (d, k, seed), recs in _groups(records).items():
        if all(a in r["pred"] and b in r["pred"] for r in recs):
            groups[(d, k)][seed] = recs
    out = []
    for (d, k), per_seed in sorted(groups.items()):
        seeds = sorted(per_seed)
        if len({len(per_seed[s]) for s in seeds}) != 1:
            raise ValueError(f"per-sample records of {d} k={k}: the seeds have different test "
                             "sets; rewrite them with `sc-jax report DIR --log-samples`")
        correct = {m: np.array([[r["pred"][m] == r["gold"] for r in _by_index(per_seed[s])]
                                for s in seeds]) for m in (a, b)}
        a_only = (correct[a] & ~correct[b]).sum(axis=1)
        b_only = (correct[b] & ~correct[a]).sum(axis=1)
        out.append({"dataset": d, "shots": k, "a": a, "b": b, "queries": correct[a].shape[1],
                    "seeds": seeds, "a_only": a_only.tolist(), "b_only": b_only.tolist(),
                    "mcnemar_p": [mcnemar_exact_p(x, y) for x, y in zip(a_only, b_only)],
                    "signed_rank_p": query_signed_rank_p(correct[a], correct[b])})
    return out


def _by_index(recs: list[dict]) -> list[dict]:
    """One seed's records in test-set order (``index``, else as written)."""
    if all("index" in r for r in recs):
        return sorted(recs, key=lambda r: r["index"])
    return recs


def samples_markdown(records: Sequence[dict], rows: Sequence[ResultRow]) -> list[str]:
    """Report lines: whether the records reproduce results.json, and SC against BC in
    both forms query by query (:func:`paired_tests`)."""
    problems = check_samples(records, rows)
    out = ["## Per-sample records", "",
           f"{len(records)} records (samples.jsonl). " + (
               "Accuracy, macro-F1 and ECE recomputed from them match results.json."
               if not problems else
               f"{len(problems)} disagreements with results.json, e.g. {problems[0]}."), ""]
    tables = [paired_tests(records, registry.subject(), b) for b in registry.paired()]
    if any(tables):
        out += ["### SC against BC, query by query", "",
                ("Every seed uses the same test queries, so (seed, query) pairs are not "
                 "independent and are not pooled. Per seed: queries SC gets right and the "
                 "baseline wrong (SC only), the reverse, and the exact two-sided McNemar "
                 "p-value (scipy.stats.binomtest on the discordant pairs). The seeds' McNemar "
                 "tests share the queries, so they are not independent either and are not "
                 "combined; over seeds: the Wilcoxon signed-rank test (scipy.stats.wilcoxon, "
                 "two-sided, zero differences dropped) over queries of the per-query "
                 "difference in correctness (SC - baseline) averaged over the seeds."), "",
                "| Dataset | k | baseline | queries | SC only (per seed) | baseline only "
                "(per seed) | McNemar exact p (per seed) | Wilcoxon signed-rank p (queries) |",
                "|---|---|---|---|---|---|---|---|"]
        for table in tables:
            out += [f"| {dataset_name(c['dataset'])} | {c['shots']} | {method_name(c['b'])} | "
                    f"{c['queries']} | {', '.join(map(str, c['a_only']))} | "
                    f"{', '.join(map(str, c['b_only']))} | "
                    f"{', '.join(f'{p:.3g}' for p in c['mcnemar_p'])} | "
                    f"{c['signed_rank_p']:.3g} |" for c in table]
        out.append("")
    return out


def _sc_star(method: str) -> bool:
    """Whether ``method``'s fits are SC* (w = 1) by its registered :class:`SCFit`; a
    method no longer registered, by its parameters alone (:func:`_fit_from_param`)."""
    try:
        fit = registry.get(method).sc_fit
    except ValueError:
        fit = None
    return fit is not None and fit.sc_star


def _fit_from_param(p: FitRecord, solver: str) -> FitResult:
    """The :class:`FitResult` of one param record of results.json (the run's own b and
    w, stored as exact float64 JSON numbers): predictions from it are the run's."""
    if not isinstance(p.status, str) or p.status not in Status.__members__:
        raise ValueError(f"results.json: a {p.method} fit's status {p.status!r} is no solver "
                         f"status ({', '.join(Status.__members__)}); rerun the run's `sc-jax run` "
                         "command with the same --out to rewrite it")
    nan = float("nan")
    return FitResult(b=np.asarray(p.b, np.float64), w=np.asarray(p.w, np.float64),
                     status=Status[p.status], iterations=0,
                     outer_iterations=0, objective=p.objective, constraint=nan,
                     violation=nan, tau=p.tau, lambda_inv=p.lambda_inv,
                     solver=solver, sc_star=_sc_star(p.method) or bool(p.guarded),
                     num_rows=int(p.rows), base_accuracy=p.base_accuracy, guarded=bool(p.guarded))


def _found(file: str, recorded: dict) -> str:
    """A task file as the run gave it where that path is found from here, else where the
    run resolved it (run_tasks.json: a relative path given in another directory)."""
    if Path(file).expanduser().is_file():
        return file
    resolved = [r.get("resolved") for r in recorded.values() if isinstance(r, dict) and r.get("file") == file]
    return next((r for r in resolved if isinstance(r, str) and Path(r).is_file()), file)


def _drawn_splits(results: RunResults, run_dir: Path) -> tuple[dict, str | None]:
    """(dataset, k, seed) -> (dataset, Split) as the run drew them, checked against the
    test-set hashes in results.json; ``({}, why)`` when the data cannot be had here.
    Task files are found as the run's resume finds them: by the path given, else where
    the run resolved it, and must be the run's tasks by content."""
    recorded = recorded_tasks(Path(run_dir)) or {}
    config = dict(results.config)
    config["task_files"] = [_found(f, recorded) for f in config.get("task_files") or ()]
    known = {f.name for f in dataclasses.fields(RunConfig)}

    def frozen(v):  # JSON lists back to the tuples RunConfig holds
        return tuple(frozen(x) for x in v) if isinstance(v, list) else v

    try:
        cfg = RunConfig(**{k: frozen(v) for k, v in config.items() if k in known})
        datasets = load_datasets(cfg)
    except (DataUnavailableError, OSError, ValueError, TypeError) as e:
        return {}, f"the run's data could not be loaded here ({type(e).__name__}: {e})"
    differs = task_difference(recorded, task_file_records(cfg, datasets))
    if differs:
        file, task, what = differs
        raise ValueError(f"task file {file} is not the task {task!r} the run read: {what}; restore "
                         "it, or run the experiment again")
    for name, recorded in (results.tasks or {}).items():
        sha = recorded.get("data_sha256")
        if name in datasets and sha and datasets[name].content_sha256 != sha:
            raise ValueError(f"{name}: the data here ({datasets[name].source or name}) are not the rows the "
                             f"run read (sha256 {datasets[name].content_sha256[:12]}..., the run's "
                             f"{sha[:12]}...): a text or label was edited since; restore the data, or run "
                             "the experiment again")
    out = {}
    for rec in results.splits:
        name, k, seed = rec.dataset, rec.shots, rec.seed
        split = draw_split(datasets[name], cfg, k, seed)
        if split.test_hash() != rec.test_hash:
            return {}, (f"{name} k={k} seed {seed}: the data here draw another test set than "
                        "the run's (its hash differs)")
        out[(name, k, seed)] = (datasets[name], split)
    return out, None


def _holds(s, needs) -> bool:
    """Whether a seed's score file holds what ``needs`` names (a run of Base and BC
    alone scored no surrogate or test-time prompt)."""
    have = {"surrogate": bool(s.surrogate), "test": bool(s.test), "hidden": bool(s.hidden)}
    return all(have.get(need, True) for need in needs)


def regenerate_samples(run_dir, *, with_texts: bool = True) -> tuple[Path, list[str]]:
    """Write the per-sample records (:mod:`sc_jax.experiment.reporting.samples`) of a finished run
    beside its results.json, from its score files (``DIR/scores/``) and the SC parameters its
    results.json holds: no model, no forward pass, no refit. Returns the file and notes.

    Baselines: every registered method (:mod:`sc_jax.calibration.methods`) its ``available`` allows, ``bc_reference``
    included for a run that predates it (its ``bc_batch``); Hidden Calibration where the
    score files hold its distances. SC methods: those with params in results.json. The records of the run's own methods reproduce its
    results.json rows (:func:`sc_jax.experiment.reporting.samples.check_samples`). Dataset rows and
    text hashes are filled in when ``with_texts`` and the run's data load here and draw the
    test sets the run recorded; otherwise they are null, and a note says why.
    """
    run_dir = Path(run_dir)
    results, runs = load_run_scores(run_dir)
    solver, bc_batch, weighting = results.solver, results.bc_batch, results.size_weighting
    fits = defaultdict(dict)  # (method, dataset, shots, seed) -> size -> FitResult
    for p in results.params:
        fits[(p.method, p.dataset, p.shots, p.seed)][p.size] = _fit_from_param(p, solver)
    drawn, why = _drawn_splits(results, Path(run_dir)) if with_texts else ({}, "texts not asked for")
    notes = [] if why is None else [f"no dataset rows or text hashes: {why}"]
    records = []
    for (name, k), per_seed in runs.items():
        for seed in sorted(per_seed):
            s = per_seed[seed]
            probs, per_size = {}, {}
            for m in registry.registered():
                method = m.name
                per = fits.get((method, name, k, seed)) if m.sc_fit is not None else None
                if m.sc_fit is not None and not per:
                    continue  # the run did not fit it
                if not _holds(s, m.needs) or (
                        m.available is not None and not m.available(s, tuple(results.config.get("methods", ())))):
                    continue  # its scores are not in the files (e.g. no hidden states), or it trains
                sizes = sorted(per) if per else []
                probs[method] = method_probs(method, s, per, sizes, bc_batch=bc_batch,
                                             size_weighting=weighting, shots=k)
                if per:
                    per_size[method] = sc_size_probs(s, per, sizes)
            ds, split = drawn.get((name, k, seed), (None, None))
            records += seed_records(
                name, k, seed, s.y_test, probs, per_size,
                rows=None if split is None else split.test_indices,
                texts=None if split is None else split.test_texts(ds))
    return write_samples(run_dir, records), notes
