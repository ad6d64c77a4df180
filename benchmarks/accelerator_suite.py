"""One command for the day a GPU (or TPU) is available: scoring, solvers and one
end-to-end SC seed, JSON plus tables, sized for a lease of 15 minutes of device time.

1. Scoring (``bench_scoring.bench_case``): k = 8, every surrogate pair of sizes 1..4
   (full enumeration), ``random:llama-2-7b`` in bfloat16, through the engine (every
   prompt; one compiling run, one timed), flat batches and batch 1 (uniform samples of
   the prompts, extrapolated per prompt: the table says so); unique tokens; MFU of the
   engine = 2 x non-embedding parameters x unique tokens / engine time / the measured
   bf16 matmul peak; the memory plan's peak against the device's ``peak_bytes_in_use``.
2. Solvers (``bench_solver.bench_timing``): 5 sizes x 5 seeds per n = 2..4 in one
   compiled call per n with whole-bucket vmap on the device, float32, augmented
   Lagrangian and projected, against the SciPy trust-constr loop on the host (one
   seed timed, extrapolated to five: said so in the JSON).
3. One SC seed end to end with random weights, cold: ``bench_seed.phase`` (a fresh
   ``sc-jax run`` process on an empty persistent compilation cache, killed after
   ``--e2e-timeout`` s) on a synthetic CSV: k = 8, 128 test queries, m_i cap 24 (the
   paper's), sizes 1..4, surrogate budget 2000 pairs per size; bench_seed's breakdown
   (process wall, compile, forward, fitting, ...).

``--full`` is the first design (sizes 1..5 with two timed engine runs, n = 2..6, 256
test queries, budget 5000). On an NVIDIA H200 it did not fit a lease: its scoring
section was still in the engine after 300 s, its solver section had finished n = 2
only after 110 s, its SC seed had not finished after 150 s (benchmarks/RESULTS.md).
By the memory plan, sizes 1..5 are 2.3 M unique tokens and 3.8e16 FLOP per engine
pass (sizes 1..4: 0.63 M and 1.0e16). The default sizes took 125, 156 and 89 s for
the three sections on an H200.

Each section prints its progress on stderr and keeps what it finished in the JSON as
it goes (scoring: each phase, marked ``unfinished`` until the last; solvers: each
row), so a section stopped by a timeout still reports. On a lease, run the sections as
three processes with a ``timeout`` each (``--skip`` the other two, ``--out`` a folder
each): one that overruns then costs only itself.

``--smoke`` runs the same code paths on CPU with a tiny preset in under a minute; it
is part of the test suite (tests/benchmarks/test_accelerator_suite.py), so the suite cannot rot.

On a GPU machine that has jax with CUDA but not this package's other dependencies:
copy the checkout and the wheels of jaxopt and gguf (``pip download jaxopt gguf
--no-deps -d wheels``), then ``pip install --no-deps wheels/*.whl`` and run
``PYTHONPATH=. python benchmarks/accelerator_suite.py --out bench_out/suite``.

It writes ``suite.json`` (with the common header of ``_results``) and ``suite.md``
into ``--out``; without it, ``benchmarks/results/accelerator_suite/<machine>.json``
and ``.md`` beside it (``--smoke``: ``bench_out/accelerator_suite_smoke/``).
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import _results  # noqa: E402
import _timing  # noqa: E402
import bench_seed  # noqa: E402


def _device() -> dict:
    import jax

    d = jax.devices()[0]
    return dict(backend=jax.default_backend(), device=str(d), kind=getattr(d, "device_kind", ""),
                count=jax.device_count(), jax=jax.__version__, host=platform.node(),
                python=platform.python_version())


def _peak_in_use() -> int | None:
    import jax

    try:
        stats = jax.devices()[0].memory_stats()
    except Exception:
        return None
    return int(stats["peak_bytes_in_use"]) if stats and "peak_bytes_in_use" in stats else None


def _say(msg: str) -> None:
    print(f"[suite] {msg}", file=sys.stderr, flush=True)


def section_scoring(args, keep) -> dict:
    import jax.numpy as jnp

    import bench_scoring
    import sc_jax
    dtype = jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32
    t0 = time.perf_counter()
    peak = bench_scoring.matmul_peak(dtype)
    load_s, model = _timing.once(lambda: sc_jax.load_model(args.model, dtype=args.dtype))
    _say(f"scoring: matmul peak {peak / 1e12:.0f} TFLOP/s, {args.model} loaded in {load_s:.1f}s")

    def phase(name, res):
        _say(f"scoring: {name} done at {time.perf_counter() - t0:.1f}s")
        keep(dict(res, model=args.model, dtype=args.dtype, load_s=load_s, matmul_peak_flops=peak,
                  unfinished=True))

    r = bench_scoring.bench_case(model, args.k, args.words, args.sample_a, args.sample_b,
                                 args.score_repeats, 0, max_size=args.score_max_size,
                                 on_phase=phase)
    c = model.config
    nonembed = c.num_params() - c.vocab_size * c.hidden_size * (1 if c.tie_word_embeddings else 2)
    r.update(model=args.model, dtype=args.dtype, load_s=load_s, matmul_peak_flops=peak,
             engine_compile_s=r["c_first_run_s"] - r["c_s"],
             engine_mfu=2 * nonembed * r["unique_tokens"] / r["c_s"] / peak,
             a_over_c=r["a_s"] / r["c_s"], b_over_c=r["b_s"] / r["c_s"],
             a_and_b_extrapolated=True, peak_bytes_in_use=_peak_in_use())
    # The memory plan the engine made for the largest size (bench_case scores one size
    # per engine call, the largest last, on these prompts), against what the device saw.
    from sc_jax.scoring.enumeration import all_contexts, surrogate_pairs
    from sc_jax.scoring.costs import replay
    from sc_jax.scoring.memory import MemoryPolicy
    from sc_jax.scoring.prompts import TEMPLATES, build_pieces

    demos = list(zip(bench_scoring.texts(np.random.default_rng(0), args.k, args.words),
                     [j % 2 for j in range(args.k)]))
    pieces = build_pieces(model.tokenizer, TEMPLATES["rotten_tomatoes"], demos, [t for t, _ in demos])
    ctx = all_contexts(args.k, min(args.score_max_size, args.k - 1))
    policy = MemoryPolicy.resolve(n_devices=model.n_devices, model_shards=model.model_shards)
    planned = policy.plan(c, model.dtype, pieces, [(ctx, surrogate_pairs(ctx, args.k))], "first_token")
    b, sh = planned.budgets, planned.schedule.shape
    r.update(planned_peak_bytes=b.peak_bytes, max_tokens_per_batch=b.max_tokens_per_batch,
             max_cache_tokens=b.max_cache_tokens, call_shape=dataclasses.asdict(sh),
             planned_calls=replay(planned.schedule, c)["calls"])
    return r


def section_solvers(args, keep) -> list[dict]:
    import bench_solver

    if args.smoke:  # one size (one row bucket, two compiles) keeps the smoke run short
        bench_solver.SIZES = (1,)
    # Every finished row is kept at once: a lease that ends mid-section keeps them.
    rows = bench_solver.bench_timing(args.classes, args.solver_seeds, args.repeats, args.scipy_seeds,
                                     ("float32",), ("bucketed",), (None,),
                                     (bench_solver.solvers.resolve_threads(None),),
                                     lambda rows: keep([dict(r) for r in rows]))
    for r in rows:
        r["scipy_extrapolated_from_seeds"] = min(args.scipy_seeds, args.solver_seeds)
    return rows


def section_end_to_end(args, keep) -> dict:
    """One cold SC seed through bench_seed's phase (a fresh ``sc-jax run`` process on an
    empty persistent compilation cache), on the suite's model and a synthetic CSV."""
    with tempfile.TemporaryDirectory(prefix="suite_seed_") as tmp:
        tmp = Path(tmp)
        data = bench_seed.smoke_csv(tmp / "rt.csv", rows=max(400, 2 * args.e2e_tests),
                                    words=(args.words, args.words))
        run_args = ["--model", args.model, "--dtype", args.dtype, "--dataset", "rotten_tomatoes",
                    "--shots", str(args.k), "--test-size", str(args.e2e_tests),
                    "--m-cap", str(args.m_cap), "--budget", str(args.budget),
                    "--max-size", str(args.max_size), "--methods", ",".join(args.methods),
                    "--data-file", f"rotten_tomatoes={data}"]
        rec = bench_seed.phase("cold", 0, run_args, tmp / "run", tmp / "xla", args.e2e_timeout)
        rec.pop("machine", None)
        if rec["status"] == "ok":
            # Imported here, beside jax.
            from sc_jax.experiment.evaluation.results import load_results  # noqa: PLC0415

            res = load_results(tmp / "run")
            rec.update(sc_macro_f1=[r.macro_f1 for r in res.rows if r.method == "sc"],
                       statuses=sorted({p.status for p in res.params}))
    return dict(model=args.model, dtype=args.dtype, k=args.k, test_size=args.e2e_tests,
                max_size=args.max_size, m_cap=args.m_cap, budget=args.budget, **rec)


def tables(out: dict) -> str:
    lines = [f"device: {out['device']['kind'] or out['device']['device']} ({out['device']['backend']}), "
             f"jax {out['device']['jax']}{' (smoke)' if out['smoke'] else ''}", ""]
    s = out.get("scoring")
    if s:
        gib = 2 ** 30
        lines += ["| model | k (sizes) | prompts | unique tokens | engine s | compile s | flat s* | batch-1 s* | "
                  "batch-1/engine | flat/engine | MFU | peak GiB plan / used |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|",
                  f"| {s['model']} {s['dtype']} | {s['k']} (1..{max(s['sizes'])}) | {s['prompts']:,} | {s['unique_tokens']:,} | "
                  f"{s['c_s']:.2f} | {s['engine_compile_s']:.1f} | {s['b_s']:.2f} | {s['a_s']:.2f} | "
                  f"{s['a_over_c']:.1f}x | {s['b_over_c']:.1f}x | {100 * s['engine_mfu']:.1f}% | "
                  f"{s.get('planned_peak_bytes', 0) / gib:.2f} / "
                  f"{(s['peak_bytes_in_use'] or 0) / gib:.2f} |",
                  "", "\\* flat and batch 1 timed on uniform samples of the prompts, extrapolated "
                  "per prompt.", ""]
    if out.get("solvers"):
        lines += ["| n | solver | problems | compile s | run s | SciPy s** | ratio | max rel gap | statuses |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in out["solvers"]:
            lines.append(f"| {r['n']} | {r['solver']} | {r['problems']} | {r['jax_compile_s']:.1f} | "
                         f"{r['jax_run_s']:.4f} | {r['scipy_run_s']:.2f} | {r['ratio']:.0f}x | "
                         f"{r['max_rel_gap']:.1e} | {r['jax_status_counts']} |")
        lines += ["", "\\*\\* SciPy on the host, timed on the first seed's problems and "
                  "extrapolated per problem.", ""]
    e = out.get("end_to_end")
    if e:
        times = (" | ".join(f"{e[key]:.1f}" for key in ("process_wall_s", "compile_s", "forward_s",
                                                         "fitting_s", "run_total_s"))
                 if e["status"] == "ok" else f"{e['status']} after {e['seconds']:.1f} s | | | |")
        lines += ["| SC seed (bench_seed, cold) | k (sizes) | test queries | m_i cap | budget | "
                  "process s | compile s | forward s | fitting s | run s |",
                  "|---|---|---|---|---|---|---|---|---|---|",
                  f"| {e['model']} {e['dtype']} | {e['k']} (1..{e['max_size']}) | {e['test_size']} | "
                  f"{e['m_cap']} | {e['budget']} | {times} |"]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny preset on CPU, under a minute")
    ap.add_argument("--out", default=None, type=_results.result_dir,
                    help="directory for suite.json and suite.md (default: "
                         "benchmarks/results/accelerator_suite/<machine>.json and .md)")
    ap.add_argument("--skip", nargs="*", default=[], choices=["scoring", "solvers", "end_to_end"])
    ap.add_argument("--e2e-timeout", type=float, default=540,
                    help="seconds the SC seed's process may run before it is killed (default 540)")
    ap.add_argument("--full", action="store_true",
                    help="the first design's sizes (sizes 1..5, n = 2..6, 256 test queries, budget "
                         "5000); on an H200 it did not fit a lease (benchmarks/RESULTS.md)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.__dict__.update(model="random:tiny-llama", dtype="float32", k=3, words=4, sample_a=0.2,
                             sample_b=0.5, repeats=1, score_repeats=1, score_max_size=5,
                             classes=[2], solver_seeds=1, scipy_seeds=1, e2e_tests=16, m_cap=2,
                             budget=40, max_size=2, methods=("base", "bc", "sc"))
    else:
        # Sized for a 15-minute lease (module docstring); --full is the first design.
        full = args.full
        args.__dict__.update(model="random:llama-2-7b", dtype="bfloat16", k=8, words=10,
                             sample_a=0.002, sample_b=0.02, repeats=2,
                             score_repeats=2 if full else 1, score_max_size=5 if full else 4,
                             classes=[2, 3, 4, 5, 6] if full else [2, 3, 4],
                             solver_seeds=5, scipy_seeds=1, e2e_tests=256 if full else 128,
                             m_cap=24, budget=5000 if full else 2000, max_size=5 if full else 4,
                             methods=("base", "cc", "dc", "bc", "sc_star", "sc"))
    machine = _results.jax_machine()
    if args.out or args.smoke:
        outdir = Path(args.out or "bench_out/accelerator_suite_smoke")
        json_path, md_path = outdir / "suite.json", outdir / "suite.md"
    else:
        json_path = _results.default_path("accelerator_suite", machine["id"])
        md_path = json_path.with_suffix(".md")
    head = _results.header(machine, command=_results.command(__file__, argv),
                           dtype={"scoring": args.dtype, "solvers": "float32",
                                  "end_to_end": args.dtype})
    out = dict(header=head, device=_device(), smoke=args.smoke,
               settings={k: v for k, v in vars(args).items() if k not in ("out", "skip")})
    t0 = time.perf_counter()

    def save():
        out["wall_s"] = time.perf_counter() - t0
        _results.write_json(json_path, out)

    for name, fn in (("scoring", section_scoring), ("solvers", section_solvers),
                     ("end_to_end", section_end_to_end)):
        if name in args.skip:
            continue
        t = time.perf_counter()
        _say(f"{name} ...")

        def keep(partial, name=name, t=t):
            out[name] = partial
            out[f"{name}_wall_s"] = time.perf_counter() - t
            save()

        # An interrupted suite keeps every finished section, and each section keeps
        # its finished phases (scoring) or rows (solvers) as it goes.
        keep(fn(args, keep))
        _say(f"{name} done in {out[f'{name}_wall_s']:.1f}s")
    save()
    text = tables(out)
    md_path.write_text(text + "\n")
    print(text)
    print(f"\nwall {out['wall_s']:.1f}s; wrote {json_path} and {md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
