"""The paper's experiment (Section 4.1, Appendix A) end to end: data protocol, LLM
scoring (cached on disk), SC / SC* fits for all sizes and seeds in one vmapped solver
call, the baselines, metrics, and the output files.

``run_experiment(config, out_dir)`` is the whole run from Python; ``sc-jax run`` is a
thin wrapper over it. An interrupted run resumes from its score cache and recomputes
only what is missing; identical configurations give identical results (bitwise on
CPU).

Per (dataset, shots k, seed):

1. :func:`sc_jax.experiment.splits.split_protocol`: the test set (``test_size``) and k
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
from sc_jax.experiment import figures, metrics, samples
from sc_jax.experiment.config import RunConfig, run_policy
from sc_jax.experiment.jobs import SeedScores, draw_split, load_datasets, score_seed
from sc_jax.experiment.preflight import check_run
from sc_jax.experiment.methods import fit_sc, method_probs, sc_size_probs
from sc_jax.experiment.report import report_files
from sc_jax.experiment.results import (
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
from sc_jax.experiment.staging import Staging
from sc_jax.experiment.store import (
    RUN_CONFIG_FILE,
    config_tag,
    make_out_dir,
    package_versions,
    refuse_other_config,
    save_scores,
    score_meta,
    scores_path,
    write_json,
)
from sc_jax.models import loading, sources
from sc_jax.models.hub import HubModelNotCachedError
from sc_jax.runtime.multihost import is_multiprocess, is_writer, on_writer
from sc_jax.runtime.progress import RunProgress
from sc_jax.runtime.runlock import run_lock
from sc_jax.runtime.sharding import MODEL, axis_size, make_mesh, mesh_size
from sc_jax.runtime.timing import CompileMeter, Parts
from sc_jax.scoring.cache import ScoreCache
from sc_jax.scoring.engine import ScoringEngine
from sc_jax.scoring.memory import MemoryPolicy
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










def rows_passed_over(datasets: dict) -> tuple[list[str], dict[str, list[int]]]:
    """The notes on the rows of ``datasets`` (name -> Dataset) that no seed draws, and
    results.json's ``left_out_rows``: per dataset, the file's rows (1-based) left out
    for their blank text, with which the splits are reproducible from the file alone."""
    notes = [f"{name}: {ds.duplicate_rows} of {len(ds)} rows repeat an earlier text; each "
             "text is drawn once, so no test query is also a demonstration"
             for name, ds in datasets.items() if ds.duplicate_rows]
    notes += [f"{name}: {len(ds.blank_rows)} of {len(ds)} rows have an empty or whitespace-only "
              "text and are left out of every draw (left_out_rows)"
              for name, ds in datasets.items() if ds.blank_rows]
    return notes, {name: [i + 1 for i in ds.blank_rows] for name, ds in datasets.items() if ds.blank_rows}


def _split_record(name: str, k: int, seed: int, split) -> SplitRecord:
    """What results.json keeps of one seed's split: its demonstrations and a hash of its test set."""
    return SplitRecord(dataset=name, shots=k, seed=seed, demo_indices=split.demo_indices.tolist(),
                       test_size=int(split.test_indices.size), test_hash=split.test_hash())


def _score_seeds(model, engine, cache, ds, name: str, k: int, config: RunConfig, out: Path,
                 progress: bool, bar: RunProgress
                 ) -> tuple[dict[int, SeedScores], list[dict], dict, list[dict]]:
    """Every seed's scores of one (dataset, k), each saved under ``out/scores``, each
    seed's split record, seed -> its :class:`sc_jax.experiment.splits.Split`, and each seed's
    timing record (:func:`_seed_timing`), each seed's line given to ``bar``."""
    scores: dict[int, SeedScores] = {}
    splits, drawn, timings = [], {}, []
    for seed in config.seeds:
        label = f"[{name} k={k} seed={seed}]"
        if progress:
            log.info("%s scoring (seed %d of %d)", label, config.seeds.index(seed) + 1,
                     len(config.seeds))
        t = time.perf_counter()
        split = drawn[seed] = draw_split(ds, config, k, seed)
        splits.append(_split_record(name, k, seed, split))
        scores[seed], stats = score_seed(model, engine, cache, ds, split, config, k,
                                         label=label if progress else None)
        if is_writer():
            save_scores(scores_path(out, name, k, seed), scores[seed],
                        config_tag(json.loads(json.dumps(config.to_json()))),
                        score_meta(name, k, seed, split, model.identity))
        timings.append(_seed_timing(name, k, seed, time.perf_counter() - t, stats))
        bar.seed_done(f"{label} {_seed_line(timings[-1])}")
    return scores, splits, drawn, timings


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





def _metric_rows(scores: dict[int, SeedScores], fits: dict, name: str, k: int, n: int,
                 config: RunConfig, drawn: dict | None = None,
                 dataset=None) -> tuple[list[ResultRow], list[dict]]:
    """One results row per (seed, method) of one (dataset, k): accuracy, macro-F1, ECE;
    and with ``drawn`` (seed -> Split) and ``dataset``, the per-sample records
    (:func:`sc_jax.experiment.samples.seed_records`), else none."""
    sizes = config.sizes(k)
    rows, records = [], []
    for seed in config.seeds:
        s = scores[seed]
        probs, per_size = {}, {}
        for method in config.methods:
            per = {i: fits[method][(seed, i)] for i in sizes} if method in fits else None
            p = probs[method] = method_probs(method, s, per, sizes, bc_batch=config.bc_batch,
                                             size_weighting=config.size_weighting, shots=k)
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
    sc_fits = [p for p in params if p.method == "sc"]
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
                   overwrite: bool = False, log_samples: bool = False) -> Results:
    """Run the experiment and write results.json, results.csv, table.md and plots
    into ``out_dir``. LLM scores are cached in ``out_dir/cache``: a re-run after an
    interruption recomputes only what is missing. Each seed's assembled scores are
    also kept in ``out_dir/scores/`` (:func:`save_scores`), from which
    :func:`sc_jax.experiment.ablation.ablate` refits without the model.

    ``out_dir`` is locked for the run (:func:`run_lock`: a second run into it is
    refused), and a directory holding a run of another configuration is refused
    unless ``overwrite`` (the same configuration resumes or repeats).

    ``log_samples``: also write the per-sample records (every test query's gold label,
    each method's probabilities and prediction, SC's per-size probabilities;
    :mod:`sc_jax.experiment.samples`) as ``samples.jsonl`` (or ``.jsonl.gz``) beside results.json.
    Not part of the configuration: a rerun with or without it is the same run."""
    out = Path(out_dir)
    with contextlib.ExitStack() as held:
        def prepare():
            made = make_out_dir(out_dir)  # as given: Path("") would read as "."
            held.enter_context(run_lock(made))
            if not overwrite:
                refuse_other_config(made, config)
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
        return _run_locked(config, out, progress, log_samples)


def _config_and_tokenizer(config: RunConfig):
    """``(ModelConfig, tokenizer)`` of the run's model without its weights, or None
    where they cannot be had yet (a named model not converted has no tokenizer until
    load_model converts it). A model by Hugging Face id that neither the local hub
    cache nor the hub gives fails here, before any dataset is fetched."""
    try:
        return sources.load_config_and_tokenizer(config.model)
    except HubModelNotCachedError:
        raise
    except FileNotFoundError:
        return None


def _load_checked(config: RunConfig, datasets: dict, preview,
                  progress: bool) -> tuple[loading.LoadedModel, MemoryPolicy]:
    """The run's model and memory policy (:func:`run_policy` on the run's mesh), the
    model loaded after :func:`check_run` passed on every (dataset, k, seed) under that
    policy (before the weights load where ``preview``, the model's configuration and
    tokenizer, could be had without them)."""
    # Several processes and no --mesh: every process's devices on the data axis (a
    # model that one device holds; with no mesh each process would score alone).
    mesh = (make_mesh(config.mesh_devices, model=config.mesh_model)
            if config.mesh_devices or config.mesh_model > 1 or is_multiprocess() else None)
    policy = run_policy(config, n_devices=mesh_size(mesh), model_shards=axis_size(mesh, MODEL))
    # Every seed's prompts against the context window before the weights load (a
    # late failure would come after minutes of scoring).
    checked = None if preview is None else check_run(config, *preview, datasets, policy=policy)
    if progress:
        log.info("loading the model %s", config.model)
    model = loading.load_model(config.model, dtype=config.dtype, mesh=mesh)
    if checked is None:
        checked = check_run(config, model.config, model.tokenizer, datasets, policy=policy)
    if progress:
        ran = [c for c in checked if not c["skipped"]]
        w = max(ran, key=lambda c: c["longest_prompt"])
        log.info("checked %d (dataset, k) x %d seeds: the longest prompt has %d tokens (%s k=%d "
                 "seed %d), the context window %d", len(ran), len(config.seeds),
                 w["longest_prompt"], w["dataset"], w["k"], w["longest_seed"], w["context_window"])
    return model, policy


def _run_locked(config: RunConfig, out: Path, progress: bool, log_samples: bool) -> Results:
    """:func:`run_experiment` once ``out`` is created, locked and checked."""
    t_start = time.perf_counter()
    parts = Parts()
    with parts("load"):
        # The model's configuration and tokenizer (no weights), then the data, then the
        # weights: a model missing from the hub cache, or a bad dataset name or file,
        # fails before the weights load.
        preview = _config_and_tokenizer(config)
        datasets = load_datasets(config)
        model, policy = _load_checked(config, datasets, preview, progress)
        # What this directory now holds: a later run with another configuration is refused.
        if is_writer():
            write_json(out / RUN_CONFIG_FILE, config.to_json())
        engine = ScoringEngine(model, policy=policy, progress=progress)
        cache = ScoreCache(out / "cache")
    if is_writer():
        figures.warm_up()  # the plots' imports beside the scoring, not after it
    lam = DEFAULT_LAMBDA_INV if config.lambda_inv is None else config.lambda_inv
    rows, params, notes, splits, skipped, records = [], [], [], [], [], []
    passed_over, left_out = rows_passed_over(datasets)
    notes += passed_over
    seed_times, fit_times = [], []
    total = sum(len(config.seeds) for ds in datasets.values() for k in config.shots
                if ds.n_classes <= k)
    with RunProgress(total, enabled=progress, logger=log) as bar:
        for name, ds in datasets.items():
            n = ds.n_classes
            for k in config.shots:
                if n > k:
                    skipped.append(SkippedSetting(dataset=name, shots=k))
                    notes.append(_skip_note(name, n, k))
                    continue
                with parts("scoring"):
                    scores, seed_splits, drawn, times = _score_seeds(
                        model, engine, cache, ds, name, k, config, out, progress, bar)
                splits += seed_splits
                seed_times += times
                with parts("fitting"):
                    fits, fit_params, fit_time = _timed_fit(scores, name, k, config, lam, progress)
                params += fit_params
                fit_times.append(fit_time)
                with parts("metrics"):
                    seed_rows, seed_records = _metric_rows(scores, fits, name, k, n, config,
                                                           drawn if log_samples else None, ds)
                rows += seed_rows
                records += seed_records
    with parts("report"):
        notes += _fit_notes(params)
        data = RunResults(
            config=config.to_json(), lambda_inv=lam, model_identity=model.identity,
            model_source=model.source, versions=package_versions(), rows=tuple(rows),
            params=tuple(params), splits=tuple(splits), skipped=tuple(skipped), notes=tuple(notes),
            timing=RunTiming(), left_out_rows=left_out,
            cache=CacheCounts(hits=cache.hits, misses=cache.misses, corrupt=cache.corrupt),
            runtime={"processes": jax.process_count(), "devices": jax.device_count(),
                     "mesh": {"data": model.n_devices, "model": model.model_shards}},
            memory_policy=dataclasses.asdict(policy))
    def timing():  # the run's time so far, in parts
        return run_timing(parts, seed_times, fit_times, time.perf_counter() - t_start)

    if not is_writer():
        return Results(out, data.replace(timing=timing()), {})  # process 0 writes them
    data, written = _write_outputs(out, data, records if log_samples else None, parts, timing,
                                   progress)
    return Results(out, data, written)


def _timed_fit(scores: dict, name: str, k: int, config: RunConfig, lam: float, progress: bool):
    """:func:`fit_sc` for one (dataset, k): ``(fits, params, time record)``, compile
    time apart, with its progress line."""
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


def _write_outputs(out: Path, data: RunResults, records: list | None, parts: Parts, timing,
                   progress: bool) -> tuple[RunResults, dict[str, Path]]:
    """Process 0's files, put in place together at the end or not at all
    (:class:`Staging`; an interrupt leaves the folder's earlier files as they were, and
    the score cache resumes the run): results.json, the per-sample records
    (``records``, where logged), the tables and plots, with results.json's timing
    including the report's own time (``timing()``: the run's so far, a
    :class:`RunTiming`). Returns ``data`` with that timing, and the files."""
    t = time.perf_counter()
    if progress:
        log.info("writing the tables and plots into %s", out)
    plain, packed = samples.sample_paths(out)
    with Staging(out) as stage:
        if records is not None:
            sample_file = samples.write_samples(stage.dir, records)
            stage.remove.append((packed if sample_file.name == plain.name else plain).name)
        # The records the tables check: this run's where logged, else any beside it.
        logged = samples.read_samples(stage.dir if records is not None else out)
        staged = report_files(data, stage.dir, logged)
        parts.add("report", time.perf_counter() - t)
        data = data.replace(timing=timing())
        write_json(stage.dir / "results.json", data.to_json())
    written = {name: stage.final(path) for name, path in staged.items()}
    written["json"] = out / "results.json"
    if records is not None:
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


def timing_line(t: RunTiming) -> str:
    """One line of where a run's time went (:func:`run_timing`)."""
    return (f"time: {t.total_s:.1f} s = load {t.load_s:.1f} + scoring {t.scoring_s:.1f} "
            f"(compile {t.compile_s:.1f}, {t.model_programs} model programs compiled, "
            f"{t.cache_hits} from the persistent cache; forward {t.forward_s:.1f}; host "
            f"{t.host_s:.1f}) + fitting {t.fitting_s:.1f} (compile {t.fit_compile_s:.1f}, "
            f"solve {t.fit_solve_s:.1f}) + metrics {t.metrics_s:.1f} + report "
            f"{t.report_s:.1f} + other {t.unaccounted_s:.1f}")
