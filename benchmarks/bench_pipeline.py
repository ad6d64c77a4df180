"""Host overhead of the scoring engine: wall time per forward call against the
device's own time per call, for this checkout's engine and (with ``--before DIR``)
an older one, side by side in one process on the same inputs.

The device's time is measured by replay: every jitted program the engine runs
(forward passes, and the model-free gathers, in-place writes and level allocations
where the engine has them) is recorded with its device arguments during a timed run,
then re-issued back to back with no host work between them and one
``block_until_ready`` at the end. Wall minus replay is what the host adds: packing
batches in Python and waiting on each result before preparing the next.

Workload: the surrogate data of Algorithm 1 (all sizes 1..min(5, k-1), full
enumeration) and a test-time stage (m sub-contexts of size 2, every test query
under each), synthetic review texts, the Rotten Tomatoes template.

``--before DIR``: a directory holding an older copy of the package renamed, e.g.
  git archive <commit> sc_jax | tar -x -C /tmp/before && mv /tmp/before/sc_jax /tmp/before/sc_jax_before
  python benchmarks/bench_pipeline.py --before /tmp/before/sc_jax_before

Writes ``benchmarks/results/bench_pipeline/<machine>.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import importlib
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _results  # noqa: E402

WORDS = ("the film is a great fun boring plot with some moments of real charm but too long "
         "and actors seem lost in it story never quite works yet its heart shows").split()


def _package(path: str | None):
    if path is None:
        return importlib.import_module("sc_jax")
    p = Path(path).resolve()
    sys.path.insert(0, str(p.parent))
    return importlib.import_module(p.name)


def _workload(pkg, model, k: int, n_test: int, seed: int):
    enum = importlib.import_module(pkg.__name__ + ".enumeration")
    prompts = importlib.import_module(pkg.__name__ + ".prompts")
    rng = np.random.default_rng(seed)
    text = lambda: " ".join(rng.choice(WORDS, 10))  # noqa: E731
    demos = [(text(), j % 2) for j in range(k)]
    tests = [text() for _ in range(n_test)]
    pieces = prompts.build_pieces(model.tokenizer, prompts.TEMPLATES["rotten_tomatoes"], demos,
                                  [t for t, _ in demos] + tests)
    jobs = []
    for i in range(1, min(5, k - 1) + 1):
        ctx = enum.all_contexts(k, i)
        jobs.append((f"surrogate i={i}", ctx, enum.surrogate_pairs(ctx, k)))
    ctx = enum.sample_contexts(k, 2, 8, seed=seed)
    q = np.arange(k, k + n_test)
    jobs.append(("test i=2, m=8", ctx, np.stack([np.repeat(np.arange(8), n_test), np.tile(q, 8)], 1)))
    return pieces, jobs


#: The engine's model programs: the packed engine's one, and the older engines' two
#: (growth and query calls), for ``--before``.
PROGRAMS = ("_packed", "_grow", "_score_cached")


class _Recorder:
    """Wraps the engine module's jitted functions; records each call's arguments."""

    def __init__(self, scoring, names):
        self.scoring, self.names, self.calls, self.orig = scoring, names, [], {}

    def __enter__(self):
        for name in self.names:
            if not hasattr(self.scoring, name):
                continue
            f = self.orig[name] = getattr(self.scoring, name)

            def wrapped(*a, _f=f, **kw):
                out = _f(*a, **kw)
                self.calls.append((_f, a, kw, out))
                return out

            setattr(self.scoring, name, wrapped)
        return self

    def __exit__(self, *exc):
        for name, f in self.orig.items():
            setattr(self.scoring, name, f)


def _replay(calls) -> float:
    """Re-issue the recorded calls back to back. An argument that was the output of
    an earlier recorded call is replaced by that call's replayed output, so donated
    buffers (the engine's level buffers) are never reused."""
    import jax

    t = time.perf_counter()
    fresh, outs = {}, []
    for f, a, kw, rec_out in calls:
        out = f(*[fresh.get(id(x), x) for x in a], **kw)
        fresh[id(rec_out)] = out
        outs.append(out)
    # Donated outputs were consumed by a later call, which depends on them.
    jax.block_until_ready([o for o in outs if not any(x.is_deleted() for x in jax.tree.leaves(o))])
    return time.perf_counter() - t


def measure(pkg, source: str, dtype: str, k: int, n_test: int, repeats: int, seed: int,
            max_tokens: int = 16384):
    import jax

    scoring = importlib.import_module(pkg.__name__ + ".scoring")
    model = pkg.load_model(source, dtype=dtype)
    pieces, jobs = _workload(pkg, model, k, n_test, seed)
    eng = scoring.ScoringEngine(model, progress=False, max_tokens_per_batch=max_tokens)
    t = time.perf_counter()
    for _, ctx, pairs in jobs:
        eng.score(pieces, ctx, pairs)
    compile_s = time.perf_counter() - t
    walls, devs, calls = [], [], 0
    outs = None
    for _ in range(repeats):
        with _Recorder(scoring, PROGRAMS + ("_empty_level", "_gather_rows", "_write_rows",
                                            "_gather_slots", "_write_children")) as rec:
            t = time.perf_counter()
            outs = [eng.score(pieces, ctx, pairs) for _, ctx, pairs in jobs]
            walls.append(time.perf_counter() - t)
        # Forward calls: the model programs (gathers, writes and level allocations,
        # where the engine has them, are replayed too but not counted).
        model_programs = {rec.orig[n] for n in PROGRAMS if n in rec.orig}
        calls = sum(1 for c in rec.calls if c[0] in model_programs)
        devs.append(min(_replay(rec.calls) for _ in range(2)))
        del rec
    wall, dev = statistics.median(walls), statistics.median(devs)
    return dict(package=pkg.__name__, model=source, dtype=dtype, k=k, n_test=n_test,
                max_tokens_per_batch=max_tokens,
                prompts=int(sum(len(p) for _, _, p in jobs)), calls=calls,
                first_run_s=compile_s, wall_s=wall, device_s=dev,
                wall_per_call_ms=1e3 * wall / calls, device_per_call_ms=1e3 * dev / calls,
                host_overhead=wall / dev - 1.0, walls=walls, devices=devs), outs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", nargs="*", default=["random:small-llama", "default"])
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--k", type=int, nargs="*", default=[6, 5], help="one k per model")
    ap.add_argument("--tests", type=int, default=64, help="test queries of the test-time stage")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens-per-batch", type=int, nargs="*", default=[16384],
                    help="one per model (or one for all): small budgets mean many small calls, "
                         "where host overhead shows (an accelerator's regime)")
    ap.add_argument("--before", default=None, help="an older copy of the package (see above)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, type=_results.result_file,
                    help="JSON file (default: benchmarks/results/bench_pipeline/<machine>.json)")
    args = ap.parse_args(argv)
    if len(args.k) != len(args.model):
        ap.error("give one --k per --model")
    budgets = args.max_tokens_per_batch * (len(args.model) if len(args.max_tokens_per_batch) == 1 else 1)
    if len(budgets) != len(args.model):
        ap.error("give one --max-tokens-per-batch per --model, or one for all")

    pkgs = [_package(None)] + ([_package(args.before)] if args.before else [])
    rows = []
    for source, k, budget in zip(args.model, args.k, budgets):
        outs = []
        for pkg in pkgs:
            r, o = measure(pkg, source, args.dtype, k, args.tests, args.repeats, args.seed, budget)
            rows.append(r)
            outs.append(o)
            print(f"{source} k={k} {r['package']}: wall {r['wall_s']:.2f}s, device {r['device_s']:.2f}s "
                  f"over {r['calls']} calls", file=sys.stderr, flush=True)
        if len(outs) == 2:  # the two engines must agree
            rows[-1]["max_abs_diff_vs_after"] = float(max(np.abs(a - b).max() for a, b in zip(*outs)))

    import jax

    machine = _results.jax_machine()
    meta = dict(platform=platform.platform(), device=str(jax.devices()[0]), args=vars(args))
    out = _results.write_json(
        args.out or _results.default_path("bench_pipeline", machine["id"]),
        dict(header=_results.header(machine, command=_results.command(__file__, argv),
                                    dtype=args.dtype), meta=meta, rows=rows))
    print("| engine | model | k | tokens/batch | prompts | calls | first run s | wall s | device s | "
          "wall/call ms | device/call ms | host overhead |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        name = "before" if r["package"] != "sc_jax" else "after"
        print(f"| {name} | {r['model']} | {r['k']} | {r['max_tokens_per_batch']} | {r['prompts']:,} | "
              f"{r['calls']} | {r['first_run_s']:.1f} | "
              f"{r['wall_s']:.2f} | {r['device_s']:.2f} | {r['wall_per_call_ms']:.1f} | "
              f"{r['device_per_call_ms']:.1f} | {100 * r['host_overhead']:+.0f}% |")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
