"""Does XLA compile the engine's programs in parallel from host threads?

A run's engine compiles one program per call size (``packed_step``: gather, model and
pool write), one after another, before its first call. Would compiling them from
several host threads at once cut that wait (the GPU machines' host has 16 cores)?
This measures it on the programs a run compiles:

* in a fresh process (persistent compilation cache off), the model is loaded, the engine
  plans a synthetic job of every surrogate size 1..``--max-size`` at k = ``--shots``, and
  every call size's program is traced and lowered (on the main thread: both hold
  Python's lock);
* then the lowered programs are compiled, one after another (``--threads 1``) or from a
  pool of N threads; the phase's wall time, the process's CPU seconds in it (user +
  system: above the wall time, XLA itself compiled on several cores) and each program's
  own compile time are recorded;
* every thread count runs in ``--repeats`` processes, interleaved; the table gives
  medians and each count's wall time against one thread's.

  python benchmarks/bench_compile_threads.py                  # random:small-llama, CPU
  python benchmarks/bench_compile_threads.py --model random:qwen2-7b --threads 1 2 4 8

JSON: ``benchmarks/results/bench_compile_threads/<machine>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import _results

ROOT = Path(__file__).resolve().parents[1]


def child(model_name: str, shots: int, max_size: int, threads: int) -> None:
    """One process: lower every call size's program, compile them with ``threads``
    threads, print one JSON line."""
    import concurrent.futures  # noqa: PLC0415

    import numpy as np  # noqa: PLC0415

    import sc_jax  # noqa: PLC0415
    from sc_jax.scoring.engine import ScoringEngine  # noqa: PLC0415
    from sc_jax.scoring.enumeration import all_contexts, surrogate_pairs  # noqa: PLC0415
    from sc_jax.scoring.prompts import Template, build_pieces  # noqa: PLC0415
    from sc_jax.scoring.reference import check_inputs  # noqa: PLC0415

    model = sc_jax.load_model(model_name, seed=0)
    rng = np.random.default_rng(0)
    words = "a the good bad fine dull fun great poor film plot actors story".split()
    texts = [" ".join(rng.choice(words, int(rng.integers(6, 40)))) for _ in range(shots + 8)]
    demos = list(zip(texts[:shots], (np.arange(shots) % 2).tolist()))
    pieces = build_pieces(model.tokenizer, Template("review:", "sentiment:", ("negative", "positive")),
                          demos, texts)
    jobs = {}
    for i in range(1, max_size + 1):
        ctx = all_contexts(shots, i) if i <= 2 else all_contexts(shots, i)[:64]
        jobs[i] = (ctx, surrogate_pairs(ctx, shots))
    eng = ScoringEngine(model, progress=False)
    checked = [check_inputs(model, pieces, c, q, "first_token") for c, q in jobs.values()]
    sched = eng.plan(pieces, checked, "first_token").schedule
    pool = eng._pool_of(sched.pool)
    attention = eng.choice(sched.shape)[0]
    t = time.perf_counter()
    lowered = [eng._lowered(sh, pool, False, False, attention) for sh in sched.shapes]
    lower_s = time.perf_counter() - t

    def one(lo):
        t0 = time.perf_counter()
        lo.compile()
        return time.perf_counter() - t0

    cpu0, t = os.times(), time.perf_counter()
    if threads == 1:
        each = [one(lo) for lo in lowered]
    else:
        with concurrent.futures.ThreadPoolExecutor(threads) as ex:
            each = list(ex.map(one, lowered))
    wall = time.perf_counter() - t
    cpu1 = os.times()
    print(json.dumps(dict(
        threads=threads, programs=len(lowered), compile_wall_s=wall,
        compile_cpu_s=(cpu1.user - cpu0.user) + (cpu1.system - cpu0.system),
        program_compile_s=each, lower_s=lower_s, attention=attention,
        shapes=[[sh.B, sh.W, sh.cache] for sh in sched.shapes], dtype=str(np.dtype(model.dtype)),
        machine=_results.jax_machine())))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="random:small-llama")
    p.add_argument("--shots", type=int, default=8, help="k of the synthetic job")
    p.add_argument("--max-size", type=int, default=4, help="surrogate sizes 1..this")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--repeats", type=int, default=3, help="processes per thread count")
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, type=_results.result_file,
                   help="JSON file (default: benchmarks/results/bench_compile_threads/<machine>.json)")
    args = p.parse_args(argv)
    if args.child is not None:
        return child(args.model, args.shots, args.max_size, args.child)
    if 1 not in args.threads or min(args.threads) < 1 or args.repeats < 1:
        p.error("--threads must include 1 (the baseline) and be at least 1; --repeats at least 1")
    env = dict(os.environ, SC_JAX_XLA_CACHE="", JAX_ENABLE_COMPILATION_CACHE="false",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(Path(__file__).parent)]))
    runs = {n: [] for n in args.threads}
    for r in range(args.repeats):
        for n in args.threads:
            out = subprocess.run([sys.executable, __file__, "--child", str(n), "--model", args.model,
                                  "--shots", str(args.shots), "--max-size", str(args.max_size)],
                                 cwd=ROOT, env=env, capture_output=True, text=True)
            if out.returncode:
                sys.exit(f"bench_compile_threads: the {n}-thread process failed: {_results.last_line(out.stderr)}")
            runs[n].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"  repeat {r + 1}, {n} thread(s): {runs[n][-1]['compile_wall_s']:.2f} s", flush=True)
    machine = runs[1][0].pop("machine")
    rows = []
    base = statistics.median(x["compile_wall_s"] for x in runs[1])
    print(f"{runs[1][0]['programs']} programs ({args.model}, attention {runs[1][0]['attention']}, "
          f"call shapes B x W x cache {runs[1][0]['shapes']})")
    print(f"{'threads':>7s} {'wall s':>7s} {'cpu s':>7s} {'cpu/wall':>8s} {'sum of programs s':>18s} "
          f"{'vs 1 thread':>11s}")
    for n, rs in runs.items():
        for x in rs:
            x.pop("machine", None)
        wall = statistics.median(x["compile_wall_s"] for x in rs)
        cpu = statistics.median(x["compile_cpu_s"] for x in rs)
        each = statistics.median(sum(x["program_compile_s"]) for x in rs)
        rows.append(dict(threads=n, compile_wall_s=wall, compile_cpu_s=cpu, programs_sum_s=each,
                         wall_vs_one_thread=wall / base, runs=rs))
        print(f"{n:7d} {wall:7.2f} {cpu:7.2f} {cpu / wall:8.2f} {each:18.2f} {wall / base:11.2f}")
    out = _results.write_json(
        args.out or _results.default_path("bench_compile_threads", machine.get("id", "cpu")),
        dict(header=_results.header(machine, command=_results.command(__file__, argv),
                                    dtype=runs[1][0]["dtype"],
                                    model=args.model, shots=args.shots, max_size=args.max_size),
             rows=rows))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
