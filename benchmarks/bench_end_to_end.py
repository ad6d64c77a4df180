"""One full Supervised Calibration run, stage by stage, against the same work done the
reference code's way, side by side on one machine and one model.

The run is SC on Rotten Tomatoes (the offline default data) for one seed and each k:
k class-balanced demonstrations, ``--test-size`` test queries, context sizes
i = 1..min(5, k-1).

  1. surrogate: Algorithm 1's (context, held-out demonstration) prompts, every ordered
     sub-context of each size (uniformly sampled above ``--budget`` pairs per size,
     as ``sc-jax run`` does);
  2. fit: the calibrator of every size;
  3. test: each test query under m_i sampled sub-contexts of each size, then the
     two-level ensemble of Algorithm 2.

Ours: the prefix-shared ``ScoringEngine`` for 1 and 3, ONE vmapped
augmented-Lagrangian call (float32) for 2. Timed cold, compilation included, as a user
meets them; the compile share is reported apart (second run of the fit; the engine's
compiles are counted).

The reference's way: 1 and 3 one prompt per forward pass at batch 1 with the context
recomputed, through our own JAX ``LoadedModel.last_logits`` (warmed: one prompt per
length bucket first) and, with ``--torch``, through HF transformers PyTorch as the
reference code runs it (float32 on CPU; the reference used float16 on GPU). Both time
a uniform random sample of each stage's prompts (``--sample``, at least
``--min-sample`` per size) and extrapolate per prompt: the table says so. 2 is a loop of
``scipy.optimize.minimize(method="trust-constr")`` solves, one per size, timed warm.
That loop uses exact JAX gradients and Hessians, so it is faster than the reference
code's finite-difference solver: the fit ratio is a lower bound.

A guard on the numbers: the largest |label log-prob| difference between the engine
and the batch-1 path on the sampled prompts, and the largest relative objective gap
between our fit and SciPy's.

  python benchmarks/bench_end_to_end.py --torch                     # CPU: default model, k = 4, 8
  python benchmarks/bench_end_to_end.py --model random:llama-2-7b --dtype bfloat16 \\
      --test-size 256 --budget 5000                                 # accelerator

Writes ``benchmarks/results/bench_end_to_end/<machine>.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _results  # noqa: E402


def _sample(rng, jobs, frac, minimum):
    """A uniform sample of each job's pairs: ``[(i, contexts, pairs_sample)]``."""
    out = []
    for i, ctx, pairs in jobs:
        m = min(len(pairs), max(minimum, int(round(len(pairs) * frac))))
        sel = np.sort(rng.choice(len(pairs), size=m, replace=False))
        out.append((i, ctx, pairs[sel]))
    return out


def _engine_rows(jobs, sample, engine_out):
    """The engine's rows for the sampled pairs, in the sample's order."""
    rows = []
    for (i, ctx, pairs), (_, _, sp), eo in zip(jobs, sample, engine_out):
        lookup = {(int(c), int(q)): r for r, (c, q) in enumerate(pairs)}
        rows.append(eo[[lookup[(int(c), int(q))] for c, q in sp]])
    return rows


def _time_plain(model, pieces, sample):
    """Batch-1 JAX path on the sample, after one warm-up prompt per length bucket."""
    from sc_jax.models.loading import bucket_length
    from sc_jax.scoring.engine import score_plain

    warmed = set()
    for _, ctx, sp in sample:
        for c, q in sp:
            b = bucket_length(len(pieces.prompt(ctx[c], q)))
            if b not in warmed:
                warmed.add(b)
                score_plain(model, pieces, ctx, np.asarray([[c, q]]))
    t = time.perf_counter()
    outs = [score_plain(model, pieces, ctx, sp) for _, ctx, sp in sample]
    return time.perf_counter() - t, outs


def _time_torch(hf, pieces, sample):
    import torch

    first = [lab[0] for lab in pieces.labels]
    prompts = [pieces.prompt(ctx[c], q) for _, ctx, sp in sample for c, q in sp]
    with torch.no_grad():
        hf(torch.tensor([prompts[0]]))
        t = time.perf_counter()
        for ids in prompts:
            hf(torch.tensor([ids])).logits[0, -1, first]
        return time.perf_counter() - t


def run_case(model, ds, k, args, hf):
    from sc_jax.scoring import engine as scoring
    from sc_jax.calibration.defaults import DEFAULT_LAMBDA_INV
    from sc_jax.calibration.numpy_fit import fit_batch
    from sc_jax.calibration.numpy_predict import predict_proba
    from sc_jax.experiment.data import split_protocol
    from sc_jax.scoring.enumeration import default_m, sample_contexts, surrogate_contexts, surrogate_pairs
    from sc_jax.experiment.metrics import accuracy, macro_f1
    from sc_jax.scoring.prompts import build_pieces
    from sc_jax import ScoringEngine, log_odds

    rng = np.random.default_rng(args.seed)
    split = split_protocol(ds, k=k, test_size=args.test_size, seed=args.seed)
    demos = split.demonstrations(ds)
    tests = list(split.test_texts(ds))
    T = len(tests)
    pieces = build_pieces(model.tokenizer, ds.template, demos, [t for t, _ in demos] + tests)
    labels = np.asarray(split.demo_labels)
    sizes = list(range(1, min(5, k - 1) + 1))
    q_test = np.arange(k, k + T)

    sur_jobs = []
    for i in sizes:
        ctx = surrogate_contexts(k, i, args.budget, seed=args.seed * 1000 + i)
        sur_jobs.append((i, ctx, surrogate_pairs(ctx, k)))
    test_jobs = []
    for i, _, pairs in sur_jobs:
        m = default_m(len(pairs), k, i, cap=args.m_cap)
        tctx = sample_contexts(k, i, m, seed=args.seed * 1000 + 500 + i)
        tpairs = np.stack([np.repeat(np.arange(m), T), np.tile(q_test, m)], axis=1)
        test_jobs.append((i, tctx, tpairs))

    res = {"k": k, "sizes": sizes, "test_size": T, "budget": args.budget}
    engine = ScoringEngine(model, max_tokens_per_batch=args.max_tokens_per_batch, progress=False)
    compiles0 = sum(scoring.COMPILES.values())

    # ---- ours, cold
    t = time.perf_counter()
    sur_out = [engine.score(pieces, ctx, pairs) for _, ctx, pairs in sur_jobs]
    res["surrogate_s"] = time.perf_counter() - t
    problems = [(log_odds(lp), labels[pairs[:, 1]], pairs[:, 1].copy())
                for lp, (_, _, pairs) in zip(sur_out, sur_jobs)]
    t = time.perf_counter()
    fits = fit_batch(problems, lambda_inv=DEFAULT_LAMBDA_INV)
    res["fit_s"] = time.perf_counter() - t
    t = time.perf_counter()
    fit_batch(problems, lambda_inv=DEFAULT_LAMBDA_INV)
    res["fit_warm_s"] = time.perf_counter() - t
    t = time.perf_counter()
    test_out = [engine.score(pieces, ctx, pairs) for _, ctx, pairs in test_jobs]
    proba = predict_proba(fits, [log_odds(o.reshape(len(ctx), T, -1))
                                 for o, (_, ctx, _) in zip(test_out, test_jobs)])
    res["test_s"] = time.perf_counter() - t
    res["engine_compiles"] = sum(scoring.COMPILES.values()) - compiles0
    res["ours_total_s"] = res["surrogate_s"] + res["fit_s"] + res["test_s"]
    y = np.asarray(split.test_labels(ds))
    res["sc_accuracy"] = accuracy(y, proba.argmax(1))
    res["sc_macro_f1"] = macro_f1(y, proba.argmax(1), num_classes=ds.n_classes)
    res["fits_converged"] = sum(f.converged for f in fits)
    res["surrogate_prompts"] = int(sum(len(p) for _, _, p in sur_jobs))
    res["test_prompts"] = int(sum(len(p) for _, _, p in test_jobs))
    res["test_contexts"] = [len(ctx) for _, ctx, _ in test_jobs]
    res["surrogate_rows"] = [len(p) for _, _, p in sur_jobs]
    print(f"[k={k}] ours: surrogate {res['surrogate_s']:.1f}s, fit {res['fit_s']:.1f}s "
          f"(warm {res['fit_warm_s']:.2f}s), test {res['test_s']:.1f}s", file=sys.stderr, flush=True)

    # ---- the reference's way
    err = 0.0
    for stage, jobs, outs in (("surrogate", sur_jobs, sur_out), ("test", test_jobs, test_out)):
        smp = _sample(rng, jobs, args.sample, args.min_sample)
        n_all = sum(len(p) for _, _, p in jobs)
        n_smp = sum(len(p) for _, _, p in smp)
        secs, plain = _time_plain(model, pieces, smp)
        res[f"ref_{stage}_s"] = secs * n_all / n_smp
        res[f"ref_{stage}_sampled_prompts"] = n_smp
        for a, b in zip(_engine_rows(jobs, smp, outs), plain):
            err = max(err, float(np.abs(a - b).max()))
        if hf is not None:
            res[f"torch_{stage}_s"] = _time_torch(hf, pieces, smp) * n_all / n_smp
        print(f"[k={k}] reference {stage}: {n_smp} of {n_all} prompts timed", file=sys.stderr,
              flush=True)
    res["max_abs_diff_engine_vs_plain"] = err
    taus = [f.tau for f in fits]
    fit_batch(problems, lambda_inv=DEFAULT_LAMBDA_INV, tau=taus, solver="scipy")  # compiles
    t = time.perf_counter()
    refs = fit_batch(problems, lambda_inv=DEFAULT_LAMBDA_INV, tau=taus, solver="scipy")
    res["ref_fit_s"] = time.perf_counter() - t
    res["fit_max_rel_gap"] = max(abs(f.objective - r.objective) / abs(r.objective)
                                 for f, r in zip(fits, refs))
    res["ref_total_s"] = res["ref_surrogate_s"] + res["ref_fit_s"] + res["ref_test_s"]
    if hf is not None:
        res["torch_total_s"] = res["torch_surrogate_s"] + res["ref_fit_s"] + res["torch_test_s"]
    return res


def print_table(rows, meta):
    print(f"\nEnd-to-end SC run on {meta['device']} ({meta['cpu_count']} cores), model "
          f"{meta['model']} ({meta['dtype']}), Rotten Tomatoes, 1 seed")
    print(f"Ours timed cold (compiles included). Reference batch-1 scoring timed on a "
          f"{meta['sample']:.0%} sample (>= {meta['min_sample']} prompts per size) and "
          "extrapolated per prompt; reference fit = SciPy trust-constr loop, warm.")
    torch = any("torch_total_s" in r for r in rows)
    hdr = ["k", "stage", "work", "ours s", "ref JAX b1 s", "ratio"]
    if torch:
        hdr += ["ref torch b1 s", "ratio"]
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    for r in rows:
        stages = [
            ("surrogate", f"{r['surrogate_prompts']} prompts", r["surrogate_s"],
             r["ref_surrogate_s"], r.get("torch_surrogate_s")),
            ("fit", f"{len(r['sizes'])} sizes, {sum(r['surrogate_rows'])} rows", r["fit_s"],
             r["ref_fit_s"], r["ref_fit_s"] if torch else None),
            ("test", f"{r['test_prompts']} prompts", r["test_s"], r["ref_test_s"],
             r.get("torch_test_s")),
            ("total", "", r["ours_total_s"], r["ref_total_s"], r.get("torch_total_s")),
        ]
        for name, work, ours, ref, tor in stages:
            cells = [str(r["k"]), name, work, f"{ours:.1f}", f"{ref:.1f}", f"{ref / ours:.1f}x"]
            if torch:
                cells += [f"{tor:.1f}", f"{tor / ours:.1f}x"] if tor is not None else ["-", "-"]
            print("| " + " | ".join(cells) + " |")
    for r in rows:
        print(f"k={r['k']}: fit warm {r['fit_warm_s']:.2f}s (compile {r['fit_s'] - r['fit_warm_s']:.1f}s), "
              f"{r['engine_compiles']} engine compiles, engine vs batch-1 max |d log p| "
              f"{r['max_abs_diff_engine_vs_plain']:.1e}, fit vs SciPy max rel objective gap "
              f"{r['fit_max_rel_gap']:.1e}, {r['fits_converged']}/{len(r['sizes'])} fits converged, "
              f"SC accuracy {r['sc_accuracy']:.3f} / macro-F1 {r['sc_macro_f1']:.3f}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--k", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--test-size", type=int, default=64)
    ap.add_argument("--budget", type=int, default=1000,
                    help="surrogate pairs per size above which contexts are sampled (sc-jax run: 5000)")
    ap.add_argument("--m-cap", type=int, default=24, help="cap on test-time sub-contexts per size")
    ap.add_argument("--sample", type=float, default=0.03,
                    help="fraction of each stage's prompts timed the reference's way")
    ap.add_argument("--min-sample", type=int, default=8)
    ap.add_argument("--max-tokens-per-batch", type=int, default=16384)
    ap.add_argument("--torch", action="store_true",
                    help="also time HF transformers PyTorch batch-1 (HF-dir or default model)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, type=_results.result_file,
                    help="JSON file (default: benchmarks/results/bench_end_to_end/<machine>.json)")
    args = ap.parse_args(argv)
    if not 0 < args.sample <= 1:
        ap.error("--sample must be in (0, 1]")

    import jax

    import sc_jax
    from sc_jax.experiment.data import load_task

    ds = load_task("rotten_tomatoes")
    model = sc_jax.load_model(args.model, dtype=args.dtype)
    hf = None
    if args.torch:
        if args.model.startswith("random:"):
            print("--torch: a random: model has no HF checkpoint; skipping PyTorch", file=sys.stderr)
        else:
            try:
                from transformers import AutoModelForCausalLM

                hf = AutoModelForCausalLM.from_pretrained(model.source, dtype="float32").eval()
            except ImportError:
                print("torch/transformers not installed: skipping PyTorch", file=sys.stderr)
    rows = [run_case(model, ds, k, args, hf) for k in args.k]
    meta = {"device": str(jax.devices()[0].device_kind), "platform": platform.platform(),
            "cpu_count": os.cpu_count(), "model": args.model,
            "dtype": args.dtype, "sample": args.sample, "min_sample": args.min_sample,
            "note": "ours cold incl. compiles; reference batch-1 scoring sampled and "
                    "extrapolated per prompt; reference fit = SciPy trust-constr loop (warm)"}
    machine = _results.jax_machine()
    out = _results.write_json(
        args.out or _results.default_path("bench_end_to_end", machine["id"]),
        {"header": _results.header(machine, command=_results.command(__file__, argv),
                                   dtype=args.dtype), "meta": meta, "results": rows})
    print_table(rows, meta)
    print(f"\nJSON: {out}")


if __name__ == "__main__":
    main()
