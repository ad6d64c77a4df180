"""Scoring throughput: the same (context, query) pairs of Algorithm 1 (all sizes
1..min(5, k-1), full enumeration) scored three ways, side by side on one machine:

  (a) plain: one prompt per forward pass, batch 1, context recomputed (the reference
      code's way), through ``LoadedModel.last_logits``;
  (b) flat: full prompts in batches, no prefix sharing;
  (c) engine: the prefix-shared trie (``ScoringEngine``).

(a) and (b) may time a uniform random sample of the prompts (``--sample-a``,
``--sample-b``) and extrapolate per prompt; the table says so. Every path is
warmed up first (compiles are timed separately); times are medians over
``--repeats`` runs (``_timing``). The floor is 2 x (non-embedding parameters) x (unique tokens
computed by the engine) / (measured matmul peak of this machine).

The engine against Hugging Face transformers (PyTorch) is ``bench_peer.py``'s: the same
prompts and weights on both sides.

Writes ``benchmarks/results/bench_scoring/<machine>.json`` (``--out``).

Examples:
  python benchmarks/bench_scoring.py                      # CPU: default k=4,6 + small preset k=8
  python benchmarks/bench_scoring.py --model random:llama-2-7b --dtype bfloat16 --k 8
"""

from __future__ import annotations

import argparse
import os
import platform
import sys

import numpy as np

import _results
import _timing

WORDS = ("the film is a great fun boring plot with some moments of real charm but too long "
         "and actors seem lost in it story never quite works yet its heart shows").split()


def texts(rng, n, words):
    return [" ".join(rng.choice(WORDS, words)) for _ in range(n)]


def matmul_peak(dtype) -> float:
    """Measured FLOP/s of a large matrix product on the default device (2048-square on
    a CPU; on an accelerator, sizes and back-to-back products large enough that the
    time is the arithmetic's, not the dispatch's: ``devices.measured_matmul_flops``)."""
    from sc_jax.runtime.devices import measured_matmul_flops

    return measured_matmul_flops(dtype, n=2048)


def bench_case(model, k, words, sample_a, sample_b, repeats, seed, *, max_size=5,
               on_phase=None):
    """Scoring of every surrogate pair of context sizes 1..min(max_size, k - 1) at k:
    (c) the engine, (b) flat batches, (a) batch 1 ((a) and (b) on samples of the
    prompts, extrapolated per prompt). ``on_phase(name, res)``, if given, is called
    after each phase with the numbers so far, so a caller can report progress and keep
    them if a later phase does not finish."""
    from sc_jax.scoring.enumeration import all_contexts, surrogate_pairs
    from sc_jax.scoring.prompts import TEMPLATES, build_pieces
    from sc_jax.scoring.engine import ScoringEngine
    from sc_jax.scoring.reference import score_flat, score_plain

    rng = np.random.default_rng(seed)
    demos = list(zip(texts(rng, k, words), [j % 2 for j in range(k)]))
    pieces = build_pieces(model.tokenizer, TEMPLATES["rotten_tomatoes"], demos, [t for t, _ in demos])
    sizes = list(range(1, min(max_size, k - 1) + 1))
    jobs = []
    for i in sizes:
        ctx = all_contexts(k, i)
        jobs.append((i, ctx, surrogate_pairs(ctx, k)))
    n_prompts = sum(len(p) for _, _, p in jobs)
    prompt_tokens = sum(len(pieces.prompt(c[pc], q)) for _, c, p in jobs for pc, q in p)

    def sample(frac):
        out = []
        for i, ctx, pairs in jobs:
            m = max(1, int(round(len(pairs) * frac)))
            sel = np.sort(rng.choice(len(pairs), size=m, replace=False))
            out.append((i, ctx, pairs[sel]))
        return out

    res = {"k": k, "sizes": sizes, "prompts": n_prompts, "prompt_tokens": prompt_tokens,
           "words_per_text": words}
    # (c) engine: warm-up run compiles; then timed repeats.
    eng = ScoringEngine(model, progress=False)
    res["c_first_run_s"], _ = _timing.once(lambda: [eng.score(pieces, ctx, pairs)
                                                    for i, ctx, pairs in jobs])
    phase = on_phase or (lambda name, res: None)
    phase("engine, first run (compiles)", res)
    unique = [0]

    def run_engine():
        unique[0] = 0
        outs = []
        for i, ctx, pairs in jobs:
            result = eng.score_jobs(pieces, {"job": (ctx, pairs)})
            outs.append(result.scores["job"])
            unique[0] += result.stats.tokens
        return outs

    engine_run = _timing.timed(run_engine, repeats)
    res["c_s"], engine_out = engine_run.median_s, engine_run.out
    res["unique_tokens"] = unique[0]
    phase("engine, timed", res)

    # (b) flat batches (sampled).
    sb = sample(sample_b)
    nb = sum(len(p) for _, _, p in sb)
    for i, ctx, pairs in sb:  # warm-up / compile
        score_flat(model, pieces, ctx, pairs)
    flat = _timing.timed(lambda: [score_flat(model, pieces, c, p) for _, c, p in sb], repeats)
    res["b_s"] = flat.median_s * n_prompts / nb
    res["b_sampled_prompts"] = nb
    phase("flat batches", res)

    # (a) plain, batch 1 (sampled); warm the length buckets first.
    sa = sample(sample_a)
    na = sum(len(p) for _, _, p in sa)
    for i, ctx, pairs in sa:
        score_plain(model, pieces, ctx, pairs[:1])
    plain = _timing.timed(lambda: [score_plain(model, pieces, c, p) for _, c, p in sa], 1)
    res["a_s"], plain_out = plain.median_s * n_prompts / na, plain.out
    res["a_sampled_prompts"] = na
    phase("batch 1", res)

    # Exactness on the sampled pairs, as a guard on the numbers.
    err = 0.0
    for (i, ctx, pairs), (_, _, sp), po in zip(jobs, sa, plain_out):
        lookup = {(int(c), int(q)): r for r, (c, q) in enumerate(pairs)}
        eo = engine_out[sizes.index(i)]
        err = max(err, float(np.abs(eo[[lookup[(int(c), int(q))] for c, q in sp]] - po).max()))
    res["max_abs_diff_engine_vs_plain"] = err

    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model source (default: the CPU suite)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--k", type=int, nargs="*", default=None)
    ap.add_argument("--words", type=int, default=10, help="words per synthetic review text")
    ap.add_argument("--sample-a", type=float, default=0.03, help="fraction of prompts timed for (a)")
    ap.add_argument("--sample-b", type=float, default=0.1, help="fraction of prompts timed for (b)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, type=_results.result_file,
                    help="JSON file (default: benchmarks/results/bench_scoring/<machine>.json)")
    args = ap.parse_args(argv)

    import jax
    import jax.numpy as jnp

    import sc_jax

    suite = ([(args.model, args.k or [8])] if args.model else
             [("default", args.k or [4, 6]), ("random:small-llama", [8])])
    peak = matmul_peak(jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32)
    rows = []
    for source, ks in suite:
        load_s, model = _timing.once(lambda: sc_jax.load_model(source, dtype=args.dtype))
        c = model.config
        nonembed = c.num_params() - c.vocab_size * c.hidden_size * (1 if c.tie_word_embeddings else 2)
        for k in ks:
            r = bench_case(model, k, args.words, args.sample_a, args.sample_b, args.repeats,
                           args.seed)
            r.update(model=source, dtype=args.dtype, load_s=load_s,
                     floor_s=2 * nonembed * r["unique_tokens"] / peak)
            r["a_over_c"] = r["a_s"] / r["c_s"]
            r["b_over_c"] = r["b_s"] / r["c_s"]
            rows.append(r)
            print(f"done {source} k={k}: c={r['c_s']:.1f}s", file=sys.stderr, flush=True)

    meta = {"device": str(jax.devices()[0].device_kind), "platform": platform.platform(),
            "cpu_count": os.cpu_count(), "peak_flops_measured": peak,
            "note": "(a) and (b) time a uniform sample of prompts and extrapolate per prompt"}
    machine = _results.jax_machine()
    out = _results.write_json(
        args.out or _results.default_path("bench_scoring", machine["id"]),
        {"header": _results.header(machine, command=_results.command(__file__, argv),
                                   dtype=args.dtype), "meta": meta, "results": rows})

    print(f"\nScoring benchmark on {meta['device']} ({meta['cpu_count']} cores), "
          f"measured peak {peak / 1e9:.0f} GFLOP/s; medians of {args.repeats} run(s)")
    print(f"(a) sampled {args.sample_a:.0%} and (b) {args.sample_b:.0%} of prompts, extrapolated per prompt")
    hdr = ("model", "k", "prompts", "tokens", "unique", "(a) s", "(b) s", "(c) s", "floor s",
           "c prompt/s", "c tok/s", "a/c", "b/c", "max|d|")
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    for r in rows:
        a = f"{r['a_s']:.1f}"
        print(f"| {r['model']} | {r['k']} | {r['prompts']} | {r['prompt_tokens']} | {r['unique_tokens']} "
              f"| {a} | {r['b_s']:.1f} | {r['c_s']:.1f} | {r['floor_s']:.1f} "
              f"| {r['prompts'] / r['c_s']:.1f} | {r['prompt_tokens'] / r['c_s']:.0f} "
              f"| {r['a_over_c']:.1f}x | {r['b_over_c']:.1f}x | {r['max_abs_diff_engine_vs_plain']:.1e} |")
    print(f"\nJSON: {out}")


if __name__ == "__main__":
    main()
