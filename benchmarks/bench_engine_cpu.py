"""Scoring-engine time on the CPU for one real seed of ``sc-jax run``: this checkout's
engine ("after") against an older copy of the package ("before"), in one process on
the same jobs, run by run interleaved (before, after, before, after, ...) so machine
noise hits both.

Workload: the default model (``smollm2-135m``, float32, loaded as ``sc-jax run`` loads
it) and Rotten Tomatoes from ``--data-dir``, one seed, for each k of ``--shots``, with
the README's main job settings (``--test-size 64 --m-cap 8``, the default budget of
5000 surrogate pairs per size). The jobs are those of
:func:`sc_jax.experiment.jobs.seed_jobs` (tags base, cc, dc, surrogate<i>, test<i>), built
once with this checkout's package and given to both engines.

Stages: "surrogate" (every surrogate<i> job), "test" (every test<i> job), "baselines"
(base, cc, dc) and "seed" (all of them). An engine with ``score_jobs(pieces, jobs,
mode)`` scores a stage in one call; otherwise ``score(pieces, contexts, pairs, mode)``
is called per job. Mode first_token. Each (k, stage): jax's caches are cleared
(``--keep-caches``: not), then one first (compiling) run per engine, timed apart, then
``--repeats`` timed runs per engine; medians are reported. The engines fetch their
results to the host, so ``time.perf_counter`` around the call times the work.

Reported per (k, stage): prompts ((context, query) pairs), each engine's first-run and
median seconds, forward calls, real and padded tokens (``eng.stats``: summed over the
per-job calls, or the stats of the one ``score_jobs`` call), before/after of the
median seconds, and the largest absolute difference between the two engines' label
log-probs over every run (float32: they must agree to ~1e-4).

``--before DIR``: a directory holding an older copy of the package renamed, e.g.
  git archive <commit> sc_jax | tar -x -C /tmp/before && mv /tmp/before/sc_jax /tmp/before/sc_jax_before
  python benchmarks/bench_engine_cpu.py --before /tmp/before/sc_jax_before

A cheap check of the script itself (seconds):
  python benchmarks/bench_engine_cpu.py --model random:tiny-llama --shots 4 --test-size 16 \\
      --repeats 1 --before /tmp/before/sc_jax_before --out /tmp/bench_engine_cpu.json

Writes ``benchmarks/results/bench_engine_cpu/<machine>.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _results

STAGES = ("surrogate", "test", "baselines", "seed")
BASELINES = ("base", "cc", "dc")


def _package(path: str | None):
    if path is None:
        return importlib.import_module("sc_jax")
    p = Path(path).resolve()
    sys.path.insert(0, str(p.parent))
    return importlib.import_module(p.name)


def _module(pkg, *names: str):
    """The first of ``names`` (``"scoring.prompts"``, then the flat layout's ``"prompts"``
    of older copies) that ``pkg`` has. Not ``pkg.load_model``: the package's lazy
    top-level names import "sc_jax.<module>" by absolute name, which in the renamed
    copy is this checkout's module."""
    for name in names:
        try:
            return importlib.import_module(f"{pkg.__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{pkg.__name__}.{name}" and not f"{pkg.__name__}.{name}".startswith(f"{e.name}."):
                raise
    raise ModuleNotFoundError(f"{pkg.__name__} has none of {names}")


def stage_jobs(jobs: dict, stage: str) -> dict:
    """The jobs (tag -> (contexts, pairs)) of one stage, in seed_jobs' order."""
    if stage == "seed":
        return dict(jobs)
    if stage == "baselines":
        return {t: v for t, v in jobs.items() if t in BASELINES}
    return {t: v for t, v in jobs.items() if t.startswith(stage)}


def _own_pieces(pieces, prompts):
    """``pieces`` as the package's own PromptPieces (same token ids), where it has one
    that takes the same fields; else ``pieces`` unchanged (the engines duck-type it)."""
    cls = getattr(prompts, "PromptPieces", None)
    if cls is None or isinstance(pieces, cls) or not dataclasses.is_dataclass(cls):
        return pieces
    try:
        return cls(**{f.name: getattr(pieces, f.name) for f in dataclasses.fields(cls) if f.init})
    except (AttributeError, TypeError):
        return pieces


class Engine:
    """One package's model and ScoringEngine."""

    def __init__(self, name: str, pkg, source: str, dtype: str, max_tokens: int | None):
        self.name, self.package = name, pkg.__name__
        self.prompts = _module(pkg, "scoring.prompts", "prompts")
        # As `sc-jax run` loads it (sc_jax.experiment.run's loading, no mesh).
        self.model = _module(pkg, "models.loading", "loading").load_model(source, dtype=dtype)
        self.engine = _module(pkg, "scoring.engine", "scoring").ScoringEngine(
            self.model, max_tokens_per_batch=max_tokens, progress=False)
        self.batched = callable(getattr(self.engine, "score_jobs", None))

    def run(self, pieces, jobs: dict, mode: str):
        """(seconds, tag -> label log-probs, stats) of one run of ``jobs``."""
        pieces = _own_pieces(pieces, self.prompts)
        eng = self.engine
        if self.batched:
            t = time.perf_counter()
            result = eng.score_jobs(pieces, jobs, mode)
            seconds = time.perf_counter() - t
            # A ScoreResult (scores, stats, plan); older engines returned the scores and
            # kept the stats on the engine.
            outs = getattr(result, "scores", result)
            stats = [getattr(result, "stats", None) or getattr(eng, "stats", None)]
        else:
            outs, stats, seconds = {}, [], 0.0
            for tag, (ctx, pairs) in jobs.items():
                t = time.perf_counter()
                outs[tag] = eng.score(pieces, ctx, pairs, mode)
                seconds += time.perf_counter() - t
                stats.append(getattr(eng, "stats", None))
        summed = {}
        for field in ("calls", "tokens", "padded_tokens"):
            values = [getattr(s, field, None) for s in stats]
            summed[field] = None if any(v is None for v in values) else int(sum(values))
        return seconds, {t: np.asarray(outs[t]) for t in jobs}, summed


def _max_diff(a: dict, b: dict) -> float:
    worst = 0.0
    for tag, x in a.items():
        y = b[tag]
        if x.shape != y.shape:
            raise ValueError(f"{tag}: shapes {x.shape} and {y.shape} differ")
        if x.size:
            worst = max(worst, float(np.abs(x - y).max()))
    return worst


def measure_stage(engines, pieces, jobs: dict, mode: str, repeats: int, clear: bool) -> dict:
    import jax

    if clear:
        jax.clear_caches()
    runs = {e.name: [] for e in engines}
    first, stats, diff = {}, {}, 0.0

    def one(timed: bool):
        nonlocal diff
        outs = {}
        for e in engines:
            seconds, outs[e.name], stats[e.name] = e.run(pieces, jobs, mode)
            if timed:
                runs[e.name].append(seconds)
            else:
                first[e.name] = seconds
        if len(engines) == 2:
            diff = max(diff, _max_diff(outs["before"], outs["after"]))

    one(timed=False)
    for _ in range(repeats):
        one(timed=True)
    res = {}
    for e in engines:
        res[e.name] = dict(package=e.package, batched=e.batched, first_run_s=first[e.name],
                           median_s=statistics.median(runs[e.name]), runs_s=runs[e.name],
                           **stats[e.name],
                           max_tokens_per_batch=getattr(e.engine, "max_tokens_per_batch", None),
                           max_cache_tokens=getattr(e.engine, "max_cache_tokens", None))
    out = {"engines": res}
    if len(engines) == 2:
        out["before_over_after"] = res["before"]["median_s"] / res["after"]["median_s"]
        out["max_abs_diff"] = diff
    return out


def _fmt(x, spec: str) -> str:
    return "–" if x is None else format(x, spec)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m",
                    help="a load_model source (default: the default model of `sc-jax run`)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--dataset", default="rotten_tomatoes")
    ap.add_argument("--data-dir", default="/work/shared/datasets",
                    help="DIR/<dataset>.jsonl, as `sc-jax run --data-dir`")
    ap.add_argument("--shots", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--test-size", type=int, default=64)
    ap.add_argument("--m-cap", type=int, default=8)
    ap.add_argument("--budget", type=int, default=None,
                    help="surrogate pairs per size (default: RunConfig's, as `sc-jax run`)")
    ap.add_argument("--stages", nargs="+", default=list(STAGES), choices=STAGES)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens-per-batch", type=int, default=None,
                    help="default: planned from the memory, as `sc-jax run`")
    ap.add_argument("--keep-caches", action="store_true",
                    help="do not clear jax's caches before each (k, stage)")
    ap.add_argument("--before", default=None, help="an older copy of the package (see above)")
    ap.add_argument("--out", default=None, type=_results.result_file,
                    help="JSON file (default: benchmarks/results/bench_engine_cpu/<machine>.json)")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")

    import jax

    after = _package(None)
    config_mod, jobs_mod = _module(after, "experiment.config"), _module(after, "experiment.jobs")
    extra = {} if args.budget is None else {"budget": args.budget}
    config = config_mod.RunConfig(model=args.model, dtype=args.dtype, datasets=(args.dataset,),
                                data_dir=args.data_dir, shots=tuple(args.shots),
                                seeds=(args.seed,), test_size=args.test_size,
                                m_cap=args.m_cap, **extra)
    ds = jobs_mod.load_datasets(config)[args.dataset]
    mode = config.mode

    t = time.perf_counter()
    engines = []
    if args.before:
        engines.append(Engine("before", _package(args.before), args.model, args.dtype,
                              args.max_tokens_per_batch))
    engines.append(Engine("after", after, args.model, args.dtype, args.max_tokens_per_batch))
    print(f"loaded {args.model} ({args.dtype}) for {', '.join(e.package for e in engines)} in "
          f"{time.perf_counter() - t:.1f}s; batched (score_jobs): "
          + ", ".join(f"{e.name} {e.batched}" for e in engines), file=sys.stderr, flush=True)
    tokenizer = engines[-1].model.tokenizer
    window = engines[-1].model.config.max_position_embeddings

    # Every k's jobs, checked against the context window up front (as `sc-jax run`
    # does, sc_jax.experiment.jobs.check_run), before anything is timed.
    seeds, workload = {}, {}
    for k in args.shots:
        sj = seeds[k] = jobs_mod.seed_jobs(tokenizer, ds, jobs_mod.draw_split(ds, config, k, args.seed),
                                           config, k)
        longest = {t: int(sj.pieces.prompt_lengths(c, p, mode).max()) for t, (c, p) in sj.jobs.items()}
        workload[k] = {"n_test": sj.n_test, "m": sj.m,
                       "jobs": {t: {"contexts": list(c.shape), "pairs": len(p), "longest_prompt": longest[t]}
                                for t, (c, p) in sj.jobs.items()}}
        needed = {t for stage in args.stages for t in stage_jobs(sj.jobs, stage)}
        over = {t: n for t, n in longest.items() if t in needed and n > window}
        if over:
            sys.exit(f"k={k}, seed {args.seed}: prompts longer than the context window of {window} "
                     f"tokens of {args.model} in {over}: take a model with a longer window, "
                     "another --seed, or leave those --stages out")

    rows = []
    for k, sj in seeds.items():
        for stage in args.stages:
            jobs = stage_jobs(sj.jobs, stage)
            r = {"k": k, "stage": stage, "tags": list(jobs),
                 "prompts": int(sum(len(p) for _, p in jobs.values())),
                 **measure_stage(engines, sj.pieces, jobs, mode, args.repeats, not args.keep_caches)}
            rows.append(r)
            print(f"k={k} {stage}: {r['prompts']} prompts, " + ", ".join(
                f"{n} first {e['first_run_s']:.2f}s median {e['median_s']:.2f}s"
                for n, e in r["engines"].items())
                + (f", before/after {r['before_over_after']:.2f}, max |diff| {r['max_abs_diff']:.1e}"
                   if "max_abs_diff" in r else ""), file=sys.stderr, flush=True)

    machine = _results.jax_machine()
    meta = {"platform": platform.platform(), "device": str(jax.devices()[0]), "args": vars(args),
            "mode": mode, "run_config": config.to_json(), "workload": workload,
            "engines": {e.name: {"package": e.package, "batched": e.batched} for e in engines}}
    out = _results.write_json(
        args.out or _results.default_path("bench_engine_cpu", machine["id"]),
        {"header": _results.header(machine, command=_results.command(__file__, argv),
                                   dtype=args.dtype), "meta": meta, "rows": rows})

    def pair(r, key, spec):
        e = r["engines"]
        return " / ".join(_fmt(e[n][key], spec) if n in e else "–" for n in ("before", "after"))

    print("| k | stage | prompts | first run s (before / after) | median s before | median s after | "
          "before/after | calls (b / a) | tokens (b / a) | padded tokens (b / a) | max abs diff |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        e = r["engines"]
        b = e.get("before", {}).get("median_s")
        print(f"| {r['k']} | {r['stage']} | {r['prompts']:,} | {pair(r, 'first_run_s', '.2f')} | "
              f"{_fmt(b, '.2f')} | {e['after']['median_s']:.2f} | "
              f"{_fmt(r.get('before_over_after'), '.2f')} | {pair(r, 'calls', ',')} | "
              f"{pair(r, 'tokens', ',')} | {pair(r, 'padded_tokens', ',')} | "
              f"{_fmt(r.get('max_abs_diff'), '.1e')} |")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
