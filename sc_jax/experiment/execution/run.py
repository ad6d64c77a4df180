"""The paper's experiment (Section 4.1, Appendix A) end to end: data protocol, LLM
scoring (cached on disk), SC / SC* fits for all sizes and seeds in one vmapped solver
call, the baselines, metrics, and the output files.

``run_experiment(config, out_dir)`` is the whole run from Python; ``sc-jax run`` is a
thin wrapper over it. An interrupted run resumes from its score cache and recomputes
only what is missing; identical configurations give identical results (bitwise on
CPU).

Per (dataset, shots k, seed):

1. :func:`sc_jax.experiment.protocol.splits.split_protocol`: the test set (``test_size``) and k
   class-balanced demonstrations, the same for every method. By default the test
   set is drawn once per dataset (``test_seed``) and is the same for every seed,
   as in the paper; ``results.json`` records each seed's demonstration indices and
   a hash of its test set under ``splits``.
2. Scores, through the prefix-shared engine, each cached under a content key:
   the full k-shot context with every test query (Base, BC), with the content-free
   inputs (CC) and with 20 random in-domain strings (DC); for every size i in
   1..min(5, k-1) the surrogate data of Algorithm 1 (all of C(i), or a uniform sample
   above ``budget`` pairs) and the test queries under m_i sampled sub-contexts.
3. SC and SC* are fitted for every (seed, size) of a (dataset, k) in one batched
   solver call; predictions use the two-level ensemble of Algorithm 2.

When n_classes > k, some classes get no demonstration and the logistic regression has
no examples of them; like the paper (Appendix A) we skip that (dataset, k) with a
note in the results, for every method.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from pathlib import Path

import jax

from sc_jax.calibration.defaults import DEFAULT_LAMBDA_INV
from sc_jax.calibration.solvers import is_converged
from sc_jax.calibration import methods as calibration_methods
from sc_jax.experiment.evaluation import metrics
from sc_jax.experiment.evaluation.methods import fit_sc, method_probs, sc_size_probs
from sc_jax.experiment.evaluation.results import (
    CacheCounts,
    FitRecord,
    FitTiming,
    ResultRow,
    RunResults,
    RunTiming,
    SeedTiming,
    SkippedSetting,
    SplitRecord,
)
from sc_jax.experiment.evaluation.staging import Staging
from sc_jax.experiment.evaluation.store import (
    RUN_CONFIG_FILE,
    RUN_TASKS_FILE,
    config_tag,
    make_out_dir,
    package_versions,
    refuse_other_config,
    save_scores,
    score_meta,
    scores_path,
    write_json,
)
from sc_jax.experiment.execution.roofline import forward_estimate
from sc_jax.experiment.protocol.config import RunConfig, sc_fits
from sc_jax.experiment.protocol.jobs import SeedScores, score_seed, task_file_records
from sc_jax.experiment.protocol.runplan import RunPlan, build_plan, run_mesh
from sc_jax.experiment.reporting import figures, samples
from sc_jax.experiment.reporting.names import method_name
from sc_jax.experiment.reporting.report import report_files
from sc_jax.models import loading
from sc_jax.runtime.multihost import is_writer, on_writer
from sc_jax.runtime.progress import RunProgress
from sc_jax.runtime.runlock import run_lock
from sc_jax.runtime.timing import CompileMeter, Parts
from sc_jax.scoring.cache import KEY_FORMAT, ScoreCache
from sc_jax.scoring.engine import ScoringEngine
from sc_jax.scoring.results import EngineStats

log = logging.getLogger(__name__)











































# ------------------------------------------------------------------ the run
@dataclasses.dataclass
class Results:
    """A finished run: ``data`` is what results.json holds; ``files`` the outputs."""

    out_dir: Path
    data: RunResults
    files: dict[str, Path]

    @property
    def rows(self) -> tuple[ResultRow, ...]:
        return self.data.rows










def _split_record(name: str, k: int, seed: int, split) -> SplitRecord:
    """What results.json keeps of one seed's split: its demonstrations and a hash of its test set."""
    return SplitRecord(dataset=name, shots=k, seed=seed, demo_indices=split.demo_indices.tolist(),
                       test_size=int(split.test_indices.size), test_hash=split.test_hash())


def _score_seeds(plan: RunPlan, model, engine, cache, name: str, k: int, out: Path,
                 progress: bool, bar: RunProgress
                 ) -> tuple[dict[int, SeedScores], list[SplitRecord], list[SeedTiming]]:
    """Every seed's scores of one (dataset, k) of ``plan`` (its split and jobs as
    planned), each saved under ``out/scores``, each seed's split record, and each
    seed's timing record (:func:`_seed_timing`), each seed's line given to ``bar``."""
    config, work = plan.config, plan.seeds_of(name, k)
    # The schedules were planned on the configuration the source gave; one the weights
    # changed (a head untied on load) holds other bytes, and the engine plans anew.
    same = model.config == plan.model.parts.config
    scores: dict[int, SeedScores] = {}
    splits, timings = [], []
    for i, w in enumerate(work):
        if progress:
            log.info("%s scoring (seed %d of %d)", w.label, i + 1, len(work))
        t = time.perf_counter()
        splits.append(_split_record(name, k, w.seed, w.split))
        scores[w.seed], stats = score_seed(model, engine, cache, plan.datasets[name], w, config,
                                           label=w.label if progress else None,
                                           planned=w.planned if same else None)
        if is_writer():
            save_scores(scores_path(out, name, k, w.seed), scores[w.seed],
                        config_tag(json.loads(json.dumps(config.to_json()))),
                        score_meta(name, k, w.seed, w.split, model.identity))
        timings.append(_seed_timing(name, k, w.seed, time.perf_counter() - t, stats))
        bar.seed_done(f"{w.label} {_seed_line(timings[-1])}")
    return scores, splits, timings


def _seed_timing(name: str, k: int, seed: int, wall: float, st: EngineStats) -> SeedTiming:
    """Where one seed's scoring time went (:class:`SeedTiming`): the engine's compile
    and forward seconds, and the host's the rest of ``wall``; ``attention_trials`` is
    empty where nothing was timed (a CPU or an attention asked for)."""
    return SeedTiming(dataset=name, shots=k, seed=seed, wall_s=wall, compile_s=st.compile_s,
                      programs=st.compiled, model_programs=st.model_compiled,
                      cache_hits=st.cache_hits, forward_s=st.forward_s,
                      host_s=max(0.0, wall - st.compile_s - st.forward_s),
                      engine_host_s=st.plan_s + st.host_s, calls=st.calls, tokens=st.tokens,
                      executed_tokens=st.padded_tokens,
                      shape=None if st.shape is None else dataclasses.asdict(st.shape),
                      attention=st.attention, attention_trials=tuple(st.attention_trials),
                      attention_from_cache=st.attention_from_cache)


def _seed_line(t: SeedTiming) -> str:
    return (f"{t.wall_s:.1f} s: compile {t.compile_s:.1f} s ({t.programs} programs "
            f"compiled, {t.model_programs} of the model; {t.cache_hits} read from the "
            f"persistent cache), forward {t.forward_s:.1f} s, host {t.host_s:.1f} s "
            f"({t.calls} calls, {t.tokens} tokens){_attention_note(t)}")


def _attention_note(t: SeedTiming) -> str:
    """The seed line's attention: the one used, and what choosing it measured."""
    if not t.attention:
        return ""  # served from the score cache: no call ran
    timed = ", ".join(f"{r['name']} {r['seconds'] * 1e3:.2f} ms" if r["seconds"] is not None
                      else f"{r['name']} failed" for r in t.attention_trials)
    if timed:
        kept = "; decision kept from an earlier run" if t.attention_from_cache else ""
        timed = f" (per layer: {timed}{kept})"
    return f", attention {t.attention}{timed}"





#: A method whose predictions for one seed take longer than this logs its time.
SLOW_METHOD_S = 2.0


def _metric_rows(scores: dict[int, SeedScores], fits: dict, name: str, k: int, n: int,
                 config: RunConfig, drawn: dict | None = None,
                 dataset=None, progress: bool = False) -> tuple[list[ResultRow], list[dict]]:
    """One results row per (seed, method) of one (dataset, k): accuracy, macro-F1, ECE;
    and with ``drawn`` (seed -> Split) and ``dataset``, the per-sample records
    (:func:`sc_jax.experiment.reporting.samples.seed_records`), else none. With ``progress``, a
    start line where a method trains (Surprise), and a line per seed for each method
    slower than :data:`SLOW_METHOD_S`."""
    sizes = config.sizes(k)
    rows, records = [], []
    heavy = [m for m in map(calibration_methods.get, config.methods) if m.opt_in]
    if progress and heavy:  # opt-in methods are the slow ones (Surprise trains a network per seed)
        log.info("[%s k=%d] predicting %d methods for %d seed(s); %s train%s on each seed's scores "
                 "first", name, k, len(config.methods), len(config.seeds),
                 ", ".join(m.display for m in heavy), "s" * (len(heavy) == 1))
    for seed in config.seeds:
        s = scores[seed]
        probs, per_size = {}, {}
        for method in config.methods:
            per = {i: fits[method][(seed, i)] for i in sizes} if method in fits else None
            t = time.perf_counter()
            p = probs[method] = method_probs(method, s, per, sizes, bc_batch=config.bc_batch,
                                             size_weighting=config.size_weighting, shots=k)
            took = time.perf_counter() - t
            if progress and took > SLOW_METHOD_S:
                log.info("[%s k=%d seed=%d] %s: predicted in %.1f s", name, k, seed, method_name(method), took)
            if per is not None:
                per_size[method] = sc_size_probs(s, per, sizes)
            pred = p.argmax(-1)
            rows.append(ResultRow(dataset=name, model=config.model, shots=k, method=method,
                                  seed=seed, accuracy=metrics.accuracy(s.y_test, pred),
                                  macro_f1=metrics.macro_f1(s.y_test, pred, num_classes=n),
                                  ece=metrics.expected_calibration_error(p, s.y_test)))
        if drawn is not None:
            split = drawn[seed]
            records += samples.seed_records(name, k, seed, s.y_test, probs, per_size,
                                            rows=split.test_indices,
                                            texts=split.test_texts(dataset))
    return rows, records


def _skip_note(name: str, n: int, k: int) -> str:
    return (f"{name}, k={k}: skipped, {n} classes > {k} demonstrations "
            "(some classes would have no surrogate data; paper Appendix A)")


def _fit_notes(params: list[FitRecord]) -> list[str]:
    """Notes on the fits as a whole: where the guard acted, and fits that did not converge."""
    notes = []
    sc_fits = [p for p in params if p.method == calibration_methods.subject()]
    guarded = [p for p in sc_fits if p.guarded]
    if guarded:
        notes.append(f"SC: the guard fitted SC* at {len(guarded)} of {len(sc_fits)} (dataset, k, "
                     "seed, size), where the LLM scored its surrogate data below chance")
    failed = [p for p in params if not is_converged(p.status)]
    if failed:
        notes.append(f"{len(failed)} of {len(params)} fits did not report convergence "
                     f"({sorted({p.status for p in failed})}); see params in results.json")
    return notes












def run_experiment(config: RunConfig, out_dir, *, progress: bool = True,
                   overwrite: bool = False, log_samples: bool = True,
                   datasets: dict | None = None) -> Results:
    """Run the experiment and write results.json, results.csv, table.md and plots
    into ``out_dir``. LLM scores are cached in ``out_dir/cache``: a re-run after an
    interruption recomputes only what is missing. Each seed's assembled scores are
    also kept in ``out_dir/scores/`` (:func:`save_scores`), from which
    :func:`sc_jax.experiment.reporting.ablation.ablate` refits without the model.

    ``out_dir`` is locked for the run (:func:`run_lock`: a second run into it is
    refused), and a directory holding a run of another configuration is refused
    unless ``overwrite`` (the same configuration resumes or repeats).

    ``log_samples``: write the per-sample records (every test query's gold label,
    each method's probabilities and prediction, SC's per-size probabilities;
    :mod:`sc_jax.experiment.reporting.samples`) as ``samples.jsonl`` (or ``.jsonl.gz``) beside
    results.json; table.md's per-query tests and reliability.png are drawn from that
    file, so ``sc-jax report`` on the folder writes the same files. False: none of the
    three (records an earlier run of the same configuration left are read and checked).
    Not part of the configuration: a rerun with or without it is the same run.

    ``datasets``: name -> :class:`sc_jax.experiment.tasks.spec.Dataset` for every name of
    ``config.datasets``, data given from Python (``load_task(task, data=...)``) instead
    of read from the config's sources; ``sc-jax report --log-samples`` reads the data
    again from those sources, so it needs a task file or a data file there."""
    if datasets is not None and set(datasets) != set(config.datasets):
        raise ValueError(f"run_experiment: datasets= gives {sorted(datasets)}, but the config's "
                         f"datasets are {list(config.datasets)}: give one Dataset for each")
    out = Path(out_dir)
    with contextlib.ExitStack() as held:
        def prepare():
            made = make_out_dir(out_dir)  # as given: Path("") would read as "."
            held.enter_context(run_lock(made))
            if not overwrite:
                refuse_other_config(made, config, lambda: task_file_records(config))
                if not log_samples:
                    # Kept records are checked against the new rows at the end: an
                    # empty or unreadable log is refused now, not after the scoring.
                    samples.read_samples(made)
            elif not log_samples:
                # Records of the replaced run would be read (and fail the check) beside
                # the new results.
                for path in samples.sample_paths(made):
                    path.unlink(missing_ok=True)

        # Several processes: process 0 alone creates, locks and checks the directory
        # (and writes into it); an error there stops every process.
        on_writer(prepare)
        return _run_locked(config, out, progress, log_samples, datasets)


def _load_planned(plan: RunPlan, progress: bool) -> loading.LoadedModel:
    """The run's model, its weights read from the plan's located source once every
    (dataset, k, seed) passed the plan's checks, with the plan and its forward-pass
    estimate logged before (:func:`forward_estimate`: a warning where it is hours on a
    CPU)."""
    config = plan.config
    if progress:
        log.info("%s", plan.describe())
        seconds, line = forward_estimate(plan)
        cpu = plan.policy.platform == "cpu" or jax.default_backend() == "cpu"
        log.log(logging.WARNING if cpu and seconds > 3600 else logging.INFO, "%s", line)
        log.info("loading the model %s", config.model)
    return loading.load_model(config.model, dtype=config.dtype, mesh=plan.mesh, located=plan.model)


def _run_locked(config: RunConfig, out: Path, progress: bool, log_samples: bool,
                datasets: dict | None = None) -> Results:
    """:func:`run_experiment` once ``out`` is created, locked and checked."""
    t_start = time.perf_counter()
    parts = Parts()
    with parts("load"):
        # The model located (configuration and tokenizer, no weights), the data, every
        # seed's work checked, then the weights: a model missing from the hub cache, a
        # bad dataset name or file, or a prompt too long fails before the weights load.
        plan = build_plan(config, datasets=datasets, mesh=run_mesh(config))
        model = _load_planned(plan, progress)
        # What this directory now holds: a later run with another configuration is refused.
        if is_writer():
            write_json(out / RUN_CONFIG_FILE, config.to_json())
            write_json(out / RUN_TASKS_FILE, task_file_records(config, plan.datasets))
        engine = ScoringEngine(model, policy=plan.policy, progress=progress)
        cache = ScoreCache(out / "cache")
        if (line := cache.describe_format()):
            log.info("%s", line)
    if is_writer():
        figures.warm_up()  # the plots' imports beside the scoring, not after it
    lam = DEFAULT_LAMBDA_INV if config.lambda_inv is None else config.lambda_inv
    rows, params, splits, records, seed_times, fit_times = [], [], [], [], [], []
    notes = list(plan.notes) + [_skip_note(name, n, k) for name, k, n in plan.skipped]
    with RunProgress(len(plan.work), enabled=progress, logger=log) as bar:
        for name, k in plan.settings:
            ds = plan.datasets[name]
            with parts("scoring"):
                scores, seed_splits, times = _score_seeds(plan, model, engine, cache, name, k, out,
                                                          progress, bar)
            splits += seed_splits
            seed_times += times
            with parts("fitting"):
                fits, fit_params, fit_time = _timed_fit(scores, name, k, config, lam, progress)
            params += fit_params
            fit_times.append(fit_time)
            with parts("metrics"):
                # The per-query records feed the tables' per-query tests and the
                # reliability diagram, through samples.jsonl (log_samples).
                drawn = {w.seed: w.split for w in plan.seeds_of(name, k)}
                seed_rows, seed_records = _metric_rows(scores, fits, name, k, ds.n_classes, config,
                                                       drawn, ds, progress)
            rows += seed_rows
            records += seed_records
    if cache.migrated:
        log.info("score cache: %d entries of key format 1 served and rewritten under format %d",
                 cache.migrated, KEY_FORMAT)
    with parts("report"):
        notes += _fit_notes(params)
        data = _results_data(plan, model, lam, rows, params, splits, notes, cache)

    def timing():  # the run's time so far, in parts
        return run_timing(parts, seed_times, fit_times, time.perf_counter() - t_start)

    if not is_writer():
        return Results(out, data.replace(timing=timing()), {})  # process 0 writes them
    data, written = _write_outputs(out, data, records, log_samples, parts, timing, progress)
    return Results(out, data, written)


def _results_data(plan: RunPlan, model, lam: float, rows, params, splits, notes,
                  cache) -> RunResults:
    """results.json's contents but its ``timing``."""
    return RunResults(
        config=plan.config.to_json(), lambda_inv=lam, model_identity=model.identity,
        model_source=model.source,
        model_description=None if model.description is None else model.description.to_json(),
        versions=package_versions(), rows=tuple(rows),
        params=tuple(params), splits=tuple(splits),
        skipped=tuple(SkippedSetting(dataset=name, shots=k) for name, k, _ in plan.skipped),
        notes=tuple(notes), timing=RunTiming(), left_out_rows=plan.left_out_rows,
        cache=CacheCounts(hits=cache.hits, misses=cache.misses, corrupt=cache.corrupt),
        runtime={"processes": jax.process_count(), "devices": jax.device_count(),
                 "mesh": {"data": model.n_devices, "model": model.model_shards}},
        memory_policy=dataclasses.asdict(plan.policy),
        tasks={name: dict(ds.record(), chat_template=plan.config.chat_template)
               for name, ds in plan.datasets.items()})


def _timed_fit(scores: dict, name: str, k: int, config: RunConfig, lam: float, progress: bool):
    """:func:`fit_sc` for one (dataset, k): ``(fits, params, time record)``, compile
    time apart, with its progress line."""
    if progress and sc_fits(config.methods):
        log.info("[%s k=%d] fitting SC / SC* (%d seeds x %d sizes; a new problem shape compiles "
                 "first)", name, k, len(config.seeds), len(config.sizes(k)))
    with CompileMeter() as meter:
        t = time.perf_counter()
        fits, fit_params = fit_sc(scores, name, k, config, lam)
        wall = time.perf_counter() - t
    # The solvers compile in threads beside each other: their compile seconds can
    # exceed the wall time; the part of the wall they took is at most all of it.
    compile_s = min(meter.seconds, wall)
    record = FitTiming(dataset=name, shots=k, seeds=list(config.seeds), wall_s=wall,
                       compile_s=compile_s, solve_s=wall - compile_s, programs=meter.count()[0],
                       cache_hits=meter.count()[1], problems=len(fit_params))
    if progress and fit_params:
        log.info("[%s k=%d] fitted %d SC / SC* problems (%d seeds x %d sizes) in %.1f s "
                 "(compile %.1f s, %d programs; solve %.1f s)", name, k, len(fit_params),
                 len(config.seeds), len(config.sizes(k)), wall, compile_s, record.programs,
                 record.solve_s)
    return fits, fit_params, record


def _write_outputs(out: Path, data: RunResults, records: list, log_samples: bool, parts: Parts, timing,
                   progress: bool) -> tuple[RunResults, dict[str, Path]]:
    """Process 0's files, put in place together at the end or not at all
    (:class:`Staging`; an interrupt leaves the folder's earlier files as they were, and
    the score cache resumes the run): results.json, the per-sample records
    (``records``, written where ``log_samples``; the tables and the reliability diagram
    read the file), the tables and plots, with results.json's timing
    including the report's own time (``timing()``: the run's so far, a
    :class:`RunTiming`). Returns ``data`` with that timing, and the files."""
    t = time.perf_counter()
    if progress:
        log.info("writing the tables and plots into %s", out)
    plain, packed = samples.sample_paths(out)
    with Staging(out) as stage:
        if log_samples:
            sample_file = samples.write_samples(stage.dir, records)
            stage.remove.append((packed if sample_file.name == plain.name else plain).name)
        # The records the tables check and the reliability diagram draws: this run's
        # where logged, else any beside it; never records that no file holds, so that
        # table.md cites only what was written and `report` redraws what `run` drew.
        logged = samples.read_samples(stage.dir if log_samples else out) or None
        staged = report_files(data, stage.dir, logged, progress)
        parts.add("report", time.perf_counter() - t)
        data = data.replace(timing=timing())
        write_json(stage.dir / "results.json", data.to_json())
    written = {name: stage.final(path) for name, path in staged.items()}
    written["json"] = out / "results.json"
    if log_samples:
        written["samples"] = stage.final(sample_file)
    if progress:
        log.info("%s", timing_line(data.timing))
    return data, written


def run_timing(parts: Parts, seeds: list[SeedTiming], fits: list[FitTiming],
               total: float) -> RunTiming:
    """results.json's ``timing`` (:class:`RunTiming`): the run's wall time ``total``
    and its ``parts`` (``report``: tables, plots, records and results.json up to this
    point), the scoring split over the ``seeds``' records and the fitting over the
    ``fits``', and ``unaccounted_s`` the wall time outside the parts."""
    p = parts.seconds
    load, scoring, fitting = p.get("load", 0.0), p.get("scoring", 0.0), p.get("fitting", 0.0)
    metrics_s, report = p.get("metrics", 0.0), p.get("report", 0.0)
    return RunTiming(
        total_s=total, load_s=load, scoring_s=scoring,
        compile_s=sum(t.compile_s for t in seeds), forward_s=sum(t.forward_s for t in seeds),
        host_s=sum(t.host_s for t in seeds), fitting_s=fitting,
        fit_compile_s=sum(f.compile_s for f in fits), fit_solve_s=sum(f.solve_s for f in fits),
        metrics_s=metrics_s, report_s=report,
        unaccounted_s=total - (load + scoring + fitting + metrics_s + report),
        model_programs=sum(t.model_programs for t in seeds),
        programs=sum(t.programs for t in seeds), cache_hits=sum(t.cache_hits for t in seeds),
        seeds=tuple(seeds), fits=tuple(fits))


def compile_share(t: RunTiming) -> float | None:
    """The share of a run's wall time spent compiling: the scoring's compiles and the
    fits' (tracing, lowering, XLA and persistent-cache reads), over ``total_s``."""
    if not t.total_s or t.compile_s is None or t.fit_compile_s is None:
        return None
    return (t.compile_s + t.fit_compile_s) / t.total_s


def timing_line(t: RunTiming) -> str:
    """One line of where a run's time went (:func:`run_timing`), the share spent
    compiling first."""
    share = compile_share(t)
    head = "" if share is None else f" ({100 * share:.0f}% of it compiling)"
    return (f"time: {t.total_s:.1f} s{head} = load {t.load_s:.1f} + scoring {t.scoring_s:.1f} "
            f"(compile {t.compile_s:.1f}, {t.model_programs} model programs compiled, "
            f"{t.cache_hits} from the persistent cache; forward {t.forward_s:.1f}; host "
            f"{t.host_s:.1f}) + fitting {t.fitting_s:.1f} (compile {t.fit_compile_s:.1f}, "
            f"solve {t.fit_solve_s:.1f}) + metrics {t.metrics_s:.1f} + report "
            f"{t.report_s:.1f} + other {t.unaccounted_s:.1f}")
