"""The 2024-25 families on one device command: for each preset, the attention candidates
for one layer at the 7B call shape (gpu_check's attention phase with that preset's
geometry: Gemma 3's head_dim 256 and windows, Qwen3's and Llama 3.1's 8 key/value
heads), then one cold seed of bench_seed's protocol with ``random:<preset>`` in place of
``random:qwen2-7b``, each step a fresh process with a deadline, the JSON written after
every step (a kill keeps what finished).

  here:  python benchmarks/families_gpu.py --prepare bench_out/fam
         (bench_seed's --prepare, plus the tokenizer folder of every preset's tokenizer;
         prints the device command)
  there: that command, ``carry`` ["bench_out/fam"], timeout_s 600.

``--smoke``: the tiny presets on CPU (CI does not run it; tests/benchmarks/test_gpu_check.py runs
gpu_check's smoke, whose code this reuses).

Writes ``benchmarks/results/families_gpu/<machine>.json`` unless ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

import _results  # noqa: E402
import bench_seed  # noqa: E402
import gpu_check  # noqa: E402

PRESETS = ("qwen3-8b", "gemma-3-4b", "llama-3.1-8b", "gemma-3-12b")
SMOKE_PRESETS = ("tiny-qwen3", "tiny-gemma3")


def say(msg: str) -> None:
    print(f"families_gpu: {msg}", file=sys.stderr, flush=True)


def prepare(folder: Path, data_dir: str, presets) -> None:
    from sc_jax.models.vocabulary import PRESET_TOKENIZERS  # noqa: PLC0415
    from sc_jax.models.named_models import tokenizer_file  # noqa: PLC0415

    bench_seed.prepare(folder, data_dir)
    for p in presets:
        name = PRESET_TOKENIZERS.get(p)
        if name is None:
            continue
        tok = tokenizer_file(name)
        dest = folder / "sc_jax_cache" / tok.parent.name
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy(tok, dest / "tokenizer.json")
    # Gemma 3's tokenizer.json is 33 MB: with the checkout, over a carry's 64 MiB
    # unless compressed (to about a fifth); the command unpacks it there.
    import gzip  # noqa: PLC0415

    for tok in (folder / "sc_jax_cache").glob("*/tokenizer.json"):
        with open(tok, "rb") as src, gzip.open(f"{tok}.gz", "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst)
        tok.unlink()
    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    rel = folder.resolve().relative_to(ROOT)
    print(f"families_gpu: {folder} holds {size / 2**20:.1f} MiB (with the checkout, at most 64 MiB); "
          f"the device command (carry [{str(rel)!r}], timeout_s 600):\n"
          f"set -o pipefail; gunzip {rel}/sc_jax_cache/*/tokenizer.json.gz && python3 -m pip install -q --no-index --no-deps --no-compile --target "
          f"/tmp/site {rel}/wheels/*.whl && PYTHONPATH=/tmp/site:. SC_JAX_CACHE={rel}/sc_jax_cache "
          f"PYTHONUNBUFFERED=1 python3 benchmarks/families_gpu.py --data-dir {rel}/datasets "
          f"--out $OUT/families.json 2>&1 | tee $OUT/families.log")


def run_step(kind: str, preset: str, args, tmp: Path, env: dict, timeout: float) -> dict:
    """One step in a fresh process with a deadline: gpu_check's attention phase with the
    preset's geometry (``kind`` "attention"), or bench_seed's cold seed with
    ``random:<preset>`` ("cold"). Its record: status, seconds and what it measured."""
    if kind == "attention":
        cmd = [sys.executable, gpu_check.__file__, "--child", "attention", "--attention-model", preset,
               "--child-out", str(tmp / f"att_{preset}.json")] + (["--smoke"] if args.smoke else [])
        rec, _ = bench_seed.run_child(cmd, timeout, env=env)
        if rec["status"] == "ok":
            rec.update(json.loads((tmp / f"att_{preset}.json").read_text()))
        return rec
    run_args = bench_seed.protocol_args(args.smoke, args.data_dir, tmp)
    run_args[run_args.index("--model") + 1] = f"random:{preset}"
    return bench_seed.phase("cold", 0, run_args, tmp / f"cold_{preset}", tmp / f"xla_{preset}", timeout)


def table(result: dict, presets) -> str:
    """The Markdown table: one row per preset, its attention trials and its cold seed."""
    rows = []
    for p in presets:
        a, c = result["attention"].get(p, {}), result["cold"].get(p, {})
        trials = "; ".join(f"{t['name']} {t['seconds'] * 1e3:.2f} ms (diff {t['max_diff']:.1e})"
                           if t["ran"] and not t["error"] else f"{t['name']} failed"
                           for t in a.get("trials", [])) or a.get("status", "–")
        seed = (f"{c['process_wall_s']:.1f} s (compile {c['compile_s']:.1f}, forward {c['forward_s']:.1f}, "
                f"fitting {c['fitting_s']:.1f}); attention {c['attention']}" if c.get("status") == "ok"
                else f"{c.get('status', '–')} {c.get('stderr_tail', c.get('why', ''))[-300:]}")
        rows.append(f"| {p} | {trials} | {seed} |")
    return "| preset | attention, one layer | cold seed |\n|---|---|---|\n" + "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="the tiny presets on CPU")
    ap.add_argument("--presets", nargs="+", default=None, help=f"default {' '.join(PRESETS)}")
    ap.add_argument("--budget-s", type=float, default=520, help="seconds for every step together")
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "datasets"))
    ap.add_argument("--out", default=None, type=_results.result_file)
    ap.add_argument("--prepare", default=None, metavar="DIR")
    args = ap.parse_args(argv)
    presets = args.presets or (SMOKE_PRESETS if args.smoke else PRESETS)
    if args.prepare:
        prepare(Path(args.prepare), args.data_dir, presets)
        return 0
    t0 = time.perf_counter()
    result = {"smoke": args.smoke, "budget_s": args.budget_s, "attention": {}, "cold": {}}
    out = Path(args.out) if args.out else None

    def save():
        nonlocal out
        machine = next((r["machine"] for part in ("attention", "cold") for r in result[part].values()
                        if "machine" in r), _results.UNREPORTED)
        if out is None:
            if machine is _results.UNREPORTED:
                return
            out = _results.default_path("families_gpu", machine["id"] + ("_smoke" if args.smoke else ""))
        head = _results.header(machine, command=_results.command(__file__, argv),
                               dtype={"attention": "float32" if args.smoke else "bfloat16",
                                      "seed": "float32" if args.smoke else "bfloat16"},
                               note="each step a fresh process with a deadline; written after every step")
        strip = lambda part: {p: {k: v for k, v in r.items() if k != "machine"}  # noqa: E731
                              for p, r in result[part].items()}
        _results.write_json(out, {"header": head, **result, "attention": strip("attention"),
                                  "cold": strip("cold"), "wall_s": time.perf_counter() - t0})

    # Attention first, for every preset (seconds each), then the seeds (a minute or more).
    steps = [("attention", p) for p in presets] + [("cold", p) for p in presets]
    with tempfile.TemporaryDirectory(prefix="families_") as tmp:
        tmp = Path(tmp)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        for j, (kind, p) in enumerate(steps):
            left = args.budget_s - (time.perf_counter() - t0)
            later = len(steps) - j - 1
            timeout = min(left - 15 * later, 60 if kind == "attention" else 200)
            if timeout < 15:
                result[kind][p] = {"status": "skipped", "why": f"{left:.0f} s left"}
                continue
            say(f"{kind} {p}: up to {timeout:.0f} s")
            rec = run_step(kind, p, args, tmp, env, timeout)
            result[kind][p] = rec
            say(f"{kind} {p}: {rec['status']} in {rec['seconds']:.1f} s")
            save()
    print(table(result, presets))
    print(f"wrote {out}")
    return 0 if all(r.get("status") == "ok" for part in ("attention", "cold")
                    for r in result[part].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
