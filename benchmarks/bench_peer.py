"""The engine against its peer, Hugging Face transformers (PyTorch), in one run: the same
prompts, the same model configuration and the same weights.

Workload: Algorithm 1's surrogate prompts of one seed as ``sc-jax run`` builds them
(:func:`sc_jax.experiment.protocol.jobs.seed_jobs`, the ``surrogate<i>`` jobs): k = 8
demonstrations of Rotten Tomatoes (``--data-dir``), every ordered sub-context of sizes 1..4 of the others,
the held-out demonstration as the query (seed 0: 8,792 prompts, 1.23 M prompt tokens
with Qwen2's tokenizer; ``--budget`` samples as ``sc-jax run --budget`` does),
first_token mode, on ``random:qwen2-7b`` in bfloat16 (random weights, Qwen2's real
tokenizer).

* Engine: ``ScoringEngine.score_jobs`` of every size in one call; a first (compiling)
  run, then the median of ``--repeats`` runs (``_timing``); the stats of both; once per
  attention implementation of ``--attention`` (:mod:`sc_jax.models.attention`; default the
  engine's own choice).
* HF: ``AutoModelForCausalLM`` built from the same config.json, its weights the JAX
  model's (each tensor of :func:`sc_jax.models.checkpoint.key_map` inverted, and checked against
  key_map's own conversion), scored the way a careful user batches: prompts sorted by
  length, left-padded batches of at most ``--hf-batch-tokens`` padded tokens, sdpa
  attention, position ids from the mask, only the last position's logits, no KV cache,
  under ``torch.inference_mode``; one warm-up batch timed apart, then the median of
  ``--repeats`` full passes. The label rows of the last logits, renormalised over the
  labels as the engine does, are compared with the engine's: the largest absolute
  difference (``--smoke``, float32 on CPU: at most 1e-3, else exit 1).
* FLOPs: 2 x non-embedding parameters per token (``CostModel.of(config).token``; attention
  not counted), on the engine's unique tokens and on HF's prompt tokens; "equivalent" is
  HF's prompt tokens over the engine's time. MFU against one peak: ``--peak-tflops``, else
  a JAX matmul measured here (:func:`sc_jax.runtime.devices.measured_matmul_flops`: bf16 8192^3, 10
  back to back, on a GPU); torch's matmul, measured the same way, is recorded beside it.

HF runs before the engine: JAX's allocator keeps what it takes, torch's gives it back
(``empty_cache``), so on a GPU JAX is started without preallocation
(``XLA_PYTHON_CLIENT_PREALLOCATE=false`` unless set) and holds only the weights while
HF runs; the engine then plans for the device's full ``bytes_limit`` as usual.

``--smoke``: ``random:tiny-qwen2`` (Qwen2's q/k/v biases, byte tokenizer) in float32 on
CPU, k = 4, sizes 1..3, on bench_seed's synthetic CSV, in well under a minute
(tests/legs.sh, leg oldest, runs it).

On a bare GPU machine (Python 3.12, jax with CUDA, flax, optax, torch, transformers; no
network): here, ``python benchmarks/bench_seed.py --prepare bench_out/prep`` gathers the
wheels, Qwen2's tokenizer and the data (see bench_seed); carry ``bench_out/prep``; there,
one command (an H100, from earlier timings of each side: about 4 minutes):
  pip install -q --no-index --no-deps --target /tmp/site bench_out/prep/wheels/*.whl && \
  PYTHONPATH=/tmp/site:. SC_JAX_CACHE=bench_out/prep/sc_jax_cache python \
      benchmarks/bench_peer.py --data-dir bench_out/prep/datasets --out $OUT/peer.json \
      --attention auto blocked dense
(``auto`` is what the engine keeps after timing the candidates there: its record names
it and the trials; ``dense`` is the engine's attention before the block-sparse and fused
paths existed, so one lease measures before and after.) HF's two
passes, three compiles and three timed engines can take 450-700 s: near a command's 600 s
limit, which is why the JSON is written as each section ends. ``benchmarks/gpu_check.py``
runs one repeat of the chosen attention within its own budget.

Writes ``benchmarks/results/bench_peer/<machine>.json`` (``<machine>_smoke.json`` for
``--smoke``; ``--out``) and prints a table. The JSON is written after each timed section
(HF's passes, then each attention's engine), with ``unfinished`` until the last, so a
command stopped at its limit keeps the sections it finished.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import inspect
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # sc_jax from the checkout, installed or not

import _results  # noqa: E402
import _timing  # noqa: E402
from bench_seed import smoke_csv  # noqa: E402

FULL = dict(model="random:qwen2-7b", dtype="bfloat16", k=8, max_size=4, test_size=256,
            repeats=2, hf_batch_tokens=32768)
SMOKE = dict(model="random:tiny-qwen2", dtype="float32", k=4, max_size=3, test_size=8,
             repeats=2, hf_batch_tokens=1024)
SMOKE_TOLERANCE = 1e-3
#: ``--attention``'s choices: the engine's own choice, or one implementation.
ATTENTION = ("auto", "dense", "blocked", "cudnn", "pallas")
#: Parameters Hugging Face stores in our layout; key_map transposes or splits the others.
AS_IS = ("embed", "lm_head")


def say(msg: str) -> None:
    print(f"bench_peer: {msg}", file=sys.stderr, flush=True)


def workload(tokenizer, args, data_file: Path | None):
    """(pieces, surrogate jobs, mode) of one seed, as ``sc-jax run`` builds them."""
    from sc_jax.experiment.protocol.config import RunConfig
    from sc_jax.experiment.protocol.jobs import draw_split, load_datasets, seed_jobs

    config = RunConfig(model=args.model, dtype=args.dtype, shots=(args.k,), seeds=(args.seed,),
                       data_dir=args.data_dir, test_size=args.test_size, max_size=args.max_size,
                       budget=args.budget,
                       data_files=(("rotten_tomatoes", str(data_file)),) if data_file else ())
    ds = load_datasets(config)["rotten_tomatoes"]
    sj = seed_jobs(tokenizer, ds, draw_split(ds, config, args.k, args.seed), config, args.k)
    return sj.pieces, {t: v for t, v in sj.jobs.items() if t.startswith("surrogate")}, config.mode


def torch_matmul_flops(dtype, device: str, repeats: int = 5) -> float:
    """:func:`sc_jax.runtime.devices.measured_matmul_flops` in torch: the best over sizes of the median
    of ``repeats`` timings (CPU: one 1024-square product; GPU: 4096 and 8192, 10 back to back)."""
    import torch

    sizes, per_timing = ((1024,), 1) if device == "cpu" else ((4096, 8192), 10)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    best = 0.0
    with torch.inference_mode():
        for n in sizes:
            a = torch.full((n, n), 0.5, dtype=dtype, device=device)

            def products(a=a):
                for _ in range(per_timing):
                    a @ a
                sync()

            seconds = _timing.first_and_timed(products, repeats).median_s / per_timing
            best = max(best, 2 * n ** 3 / seconds)
    return best


def hf_model(model, device: str, dtype):
    """transformers' model of ``model``'s config.json holding ``model``'s weights (read
    from the device through DLPack, no host copy)."""
    import torch
    import transformers

    from sc_jax.models.checkpoint import key_map
    from sc_jax.models.config import ModelConfig, preset_hf_config
    from sc_jax.models.model import LAYER_PARAMS

    src = model.source
    cfg = dict(preset_hf_config(src.split(":", 1)[1]) if src.startswith("random:")
               else json.loads((Path(src) / "config.json").read_text()))
    hf_config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    if ModelConfig.from_hf(hf_config.to_dict()) != model.config:
        raise SystemExit(f"bench_peer: transformers reads {src}'s config otherwise than sc_jax")
    with torch.device(device):
        hf = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=dtype,
                                                           attn_implementation="sdpa").eval()
    params = dict(hf.named_parameters())
    kmap = key_map(model.config)
    if set(params) != set(kmap):
        raise SystemExit(f"bench_peer: transformers' parameters differ from key_map's: "
                         f"{sorted(set(params) ^ set(kmap))[:8]}")
    ours = {}
    with torch.no_grad():
        for key, rule in kmap.items():
            if rule.target not in ours:
                owner = model.module.layers if rule.target in LAYER_PARAMS else model.module
                ours[rule.target] = torch.from_dlpack(getattr(owner, rule.target).get_value())
            x = ours[rule.target] if rule.layer is None else ours[rule.target][rule.layer]
            if rule.target in AS_IS or len(rule.hf_shape) == 1:
                w = x.reshape(rule.hf_shape)
            else:
                w = x.reshape(rule.hf_shape[::-1]).T
            if not torch.equal(rule.convert(w), x):
                raise SystemExit(f"bench_peer: {key} does not convert back to sc_jax's {rule.target}")
            params[key].copy_(w)
    return hf


def hf_batches(lengths: np.ndarray, budget: int) -> list[np.ndarray]:
    """Prompt indices sorted by length, cut into batches of at most ``budget`` padded tokens."""
    order, batches, start = np.argsort(lengths, kind="stable"), [], 0
    for end in range(1, len(order) + 1):
        if end == len(order) or (end + 1 - start) * lengths[order[end]] > budget:
            batches.append(order[start:end])
            start = end
    return batches


def hf_pass(hf, prompts, batches, first, device: str) -> np.ndarray:
    """Label log-probs ``[N, n_classes]`` of the prompts of ``batches`` (other rows NaN):
    left-padded, position ids from the mask, last position only, renormalised over labels."""
    import torch

    params = inspect.signature(hf.forward).parameters
    keep = next(({k: 1} for k in ("logits_to_keep", "num_logits_to_keep") if k in params), {})
    out = []
    with torch.inference_mode():
        for b in batches:
            T = len(prompts[b[-1]])
            ids, mask = np.zeros((len(b), T), np.int64), np.zeros((len(b), T), np.int64)
            for r, i in enumerate(b):
                ids[r, T - len(prompts[i]):], mask[r, T - len(prompts[i]):] = prompts[i], 1
            ids, mask = torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device)
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            logits = hf(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False,
                        **keep).logits
            out.append(logits[:, -1, first])
        scores = torch.log_softmax(torch.cat(out).float(), -1).cpu().numpy()  # waits for the device
    res = np.full((len(prompts), len(first)), np.nan, np.float32)
    res[np.concatenate(batches)] = scores
    return res


def table(res: dict) -> str:
    h = res["hf"]
    rows = [(f"engine ({e['attention']} attention)", e["first_s"], e["first_stats"]["compile_s"],
             e["steady_s"], e["tokens"], e["tflops"], e["mfu"]) for e in res["engines"].values()]
    rows += [("HF transformers", h["warmup_batch_s"], None, h["steady_s"], h["prompt_tokens"],
             h["tflops"], h["mfu"]),
            ("HF tokens at engine speed", None, None, res["engine"]["steady_s"], h["prompt_tokens"],
             res["equivalent_tflops"], res["equivalent_mfu"])]
    if len(res["engines"]) > 1:
        out_speed = ", ".join(f"{e['attention']} {e['speedup']:.2f}x" for e in res["engines"].values())
    else:
        out_speed = f"{res['speedup']:.2f}x"
    out = ["| | first s | compile s | steady s | tokens | TFLOP/s | MFU |", "|---|---|---|---|---|---|---|"]
    for name, *vals in rows:
        cells = ["–" if v is None else f"{v:,}" if isinstance(v, int) else f"{v:.1%}" if j == 5
                 else f"{v:.3g}" if j == 4 else f"{v:.2f}" for j, v in enumerate(vals)]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    out.append(f"engine speed-up over HF (steady): {out_speed}; engine first run "
               "includes its compiles, HF's first is its warm-up batch; max |label log-prob "
               f"difference| {res['max_abs_diff']:.2e}; peak {res['peak']['flops'] / 1e12:.1f} "
               f"TFLOP/s ({res['peak']['source']})")
    return "\n".join(out)


def parse_args(argv=None) -> argparse.Namespace:
    """The command line, with the unset options filled from SMOKE or FULL."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="a tiny model on a synthetic CSV, on CPU")
    ap.add_argument("--model", help=f"a load_model source (default {FULL['model']})")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"))
    ap.add_argument("--k", type=int, help="demonstrations (default 8)")
    ap.add_argument("--max-size", type=int, help="sub-context sizes 1..this (default 4)")
    ap.add_argument("--budget", type=int, default=None,
                    help="surrogate pairs per size, sampled as sc-jax run does (default: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--test-size", type=int, help="the seed's test set (it decides the demonstrations)")
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "datasets"),
                    help="folder holding rotten_tomatoes.jsonl (not used by --smoke)")
    ap.add_argument("--attention", nargs="+", default=["auto"],
                    choices=ATTENTION,
                    help="the engine's attention (sc_jax.models.attention), each timed in turn; the "
                         "first is the engine of the headline figures (default: auto)")
    ap.add_argument("--repeats", type=int, help="timed runs of each side (default 2)")
    ap.add_argument("--hf-batch-tokens", type=int, help="padded tokens per HF batch (default 32768)")
    ap.add_argument("--peak-tflops", type=float, default=None, help="peak for the MFU (default: measured)")
    ap.add_argument("--out", default=None, type=_results.result_file, help="JSON result (default: results/bench_peer/<machine>.json)")
    args = ap.parse_args(argv)
    for key, val in (SMOKE if args.smoke else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, val)
    return args


def peak_flops(args, jdtype, tdtype, device: str) -> dict:
    """The MFU's peak: ``--peak-tflops``, else a JAX matmul measured here (torch's
    measured beside it, for the JSON)."""
    from sc_jax.runtime.devices import measured_matmul_flops

    jax_peak, torch_peak = measured_matmul_flops(jdtype), torch_matmul_flops(tdtype, device)
    return {"flops": args.peak_tflops * 1e12 if args.peak_tflops else jax_peak,
            "source": "--peak-tflops" if args.peak_tflops else f"JAX {args.dtype} matmul, measured",
            "jax_matmul_flops": jax_peak, "torch_matmul_flops": torch_peak}


def run_hf(model, args, device: str, tdtype, prompts, lengths, first, token_flops,
           peak) -> tuple[dict, np.ndarray]:
    """transformers on the same prompts and weights: built, one warm-up batch, then
    ``args.repeats`` timed passes. Its record for the JSON and its label log-probs
    (the model is freed on return)."""
    build_s, hf = _timing.once(lambda: hf_model(model, device, tdtype))
    batches = hf_batches(lengths, args.hf_batch_tokens)
    warm_s, _ = _timing.once(lambda: hf_pass(hf, prompts, batches[:1], first, device))
    hf_timing = _timing.timed(lambda: hf_pass(hf, prompts, batches, first, device), args.repeats)
    hf_s, hf_runs, hf_out = hf_timing.median_s, hf_timing.runs_s, hf_timing.out
    say(f"HF: built in {build_s:.1f} s, warm-up batch {warm_s:.1f} s, passes {hf_runs}")
    record = {"build_s": build_s, "warmup_batch_s": warm_s, "steady_s": hf_s, "runs_s": hf_runs,
              "batches": len(batches), "prompt_tokens": int(lengths.sum()),
              "padded_tokens": int(sum(len(b) * lengths[b[-1]] for b in batches)),
              "attn_implementation": "sdpa", "device": device,
              "tflops": token_flops * lengths.sum() / hf_s / 1e12,
              "mfu": token_flops * lengths.sum() / hf_s / peak["flops"]}
    return record, hf_out


def run_engines(model, args, workload, token_flops, peak, hf_s, hf_out, engines: dict, save) -> None:
    """The engine on ``workload`` (pieces, jobs, mode) with each attention of
    ``args.attention`` in turn: a first (compiling) run, then ``args.repeats`` timed
    ones; each one's record goes into ``engines`` and is saved at once."""
    from sc_jax.scoring.engine import ScoringEngine

    pieces, jobs, mode = workload
    for impl in args.attention:
        engine = ScoringEngine(model, attention=impl, progress=False)
        first_s, first = _timing.once(lambda: engine.score_jobs(pieces, jobs, mode))
        first_stats = dataclasses.asdict(first.stats)
        eng = _timing.timed(lambda: engine.score_jobs(pieces, jobs, mode), args.repeats)
        eng_s, eng_runs, out = eng.median_s, eng.runs_s, eng.out
        say(f"engine ({out.stats.attention} attention): first run {first_s:.1f} s, runs {eng_runs}")
        eng_out = np.concatenate([out.scores[t] for t in jobs])
        tokens = out.stats.tokens
        engines[impl] = {
            "attention": out.stats.attention, "asked": impl, "first_s": first_s,
            "steady_s": eng_s, "runs_s": eng_runs,
            "tokens": tokens, "first_stats": first_stats, "stats": dataclasses.asdict(out.stats),
            "tflops": token_flops * tokens / eng_s / 1e12,
            "mfu": token_flops * tokens / eng_s / peak["flops"],
            "speedup": hf_s / eng_s, "max_abs_diff": float(np.abs(eng_out - hf_out).max())}
        save()


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        import torch
        import transformers
    except ImportError as e:
        print(f"bench_peer: needs torch and transformers ({e.name} is missing): "
              "pip install torch transformers", file=sys.stderr)
        return 2
    if args.smoke:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # see the module docstring
    import jax
    import jax.numpy as jnp

    import sc_jax
    from sc_jax.scoring.costs import CostModel

    device = "cuda" if jax.default_backend() == "gpu" else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        print("bench_peer: jax sees a GPU, torch does not: install torch's CUDA build", file=sys.stderr)
        return 2
    load_s, model = _timing.once(lambda: sc_jax.load_model(args.model, dtype=args.dtype))
    say(f"{args.model} ({args.dtype}) loaded in {load_s:.1f} s")
    with tempfile.TemporaryDirectory(prefix="bench_peer_") as tmp:
        pieces, jobs, mode = workload(model.tokenizer, args, smoke_csv(Path(tmp) / "rt.csv")
                                      if args.smoke else None)
    prompts = [pieces.prompt(ctx[c], q) for ctx, pairs in jobs.values() for c, q in pairs]
    lengths = np.asarray([len(p) for p in prompts])
    first = [ids[0] for ids in pieces.labels]
    token_flops = CostModel.of(model.config).token
    say(f"{len(prompts):,} prompts, {lengths.sum():,} prompt tokens")

    jdtype, tdtype = (jnp.bfloat16, torch.bfloat16) if args.dtype == "bfloat16" else (jnp.float32, torch.float32)
    peak = peak_flops(args, jdtype, tdtype, device)

    machine = _results.jax_machine()
    head = _results.header(machine, command=_results.command(__file__, argv), dtype=args.dtype,
                           torch=torch.__version__, transformers=transformers.__version__,
                           note="HF first, then the engine; XLA_PYTHON_CLIENT_PREALLOCATE="
                                + os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"])
    path = args.out or _results.default_path("bench_peer", machine["id"] + ("_smoke" if args.smoke else ""))
    res = {
        "smoke": args.smoke, "args": vars(args), "device": str(jax.devices()[0]), "mode": mode,
        "workload": {"jobs": {t: len(p) for t, (_, p) in jobs.items()}, "prompts": len(prompts),
                     "prompt_tokens": int(lengths.sum()), "longest_prompt": int(lengths.max())},
        "flops_per_token": token_flops, "peak": peak, "unfinished": True, "engines": {}}

    def save():
        _results.write_json(path, {"header": head, **res})

    res["hf"], hf_out = run_hf(model, args, device, tdtype, prompts, lengths, first, token_flops, peak)
    hf_s = res["hf"]["steady_s"]
    save()
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()

    engines = res["engines"]
    run_engines(model, args, (pieces, jobs, mode), token_flops, peak, hf_s, hf_out, engines, save)
    main_engine = engines[args.attention[0]]
    eng_s, diff = main_engine["steady_s"], max(e["max_abs_diff"] for e in engines.values())

    del res["unfinished"]
    res.update(engine=main_engine,
               equivalent_tflops=token_flops * lengths.sum() / eng_s / 1e12,
               equivalent_mfu=token_flops * lengths.sum() / eng_s / peak["flops"],
               speedup=hf_s / eng_s, max_abs_diff=diff)
    save()
    print(table(res))
    print(f"wrote {path}")
    if args.smoke and args.dtype == "float32" and not diff <= SMOKE_TOLERANCE:
        print(f"bench_peer smoke: engine and HF differ by {diff:.2e} > {SMOKE_TOLERANCE}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
