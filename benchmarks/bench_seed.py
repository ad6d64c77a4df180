"""One seed of the paper's protocol, end to end, cold and again in a second process:
where the time goes (the breakdown ``sc-jax run`` records in results.json).

Each phase is a fresh Python process running ``sc-jax run`` for one seed into a fresh
``--out``; both share one persistent compilation cache (``$SC_JAX_XLA_CACHE``), empty
before the first:

  cold    seed ``--seeds[0]``: imports, model, data, every compile, scoring, fits, report;
  second  seed ``--seeds[1]``: what a later run on the same machine pays (the model
          programs come from the persistent cache: ``programs`` and ``model_programs``
          should be 0).

Default workload (the 7B-seed issue's): ``random:qwen2-7b`` in bfloat16 with Qwen2's real
tokenizer, Rotten Tomatoes from ``--data-dir``, k = 8, 256 test queries, m_i cap 24,
budget 5000, methods base,cc,dc,bc,sc. It needs an accelerator (an H100 takes a few
minutes; a CPU, hours). ``--smoke`` runs a tiny random model on a synthetic CSV on CPU in
about a minute and checks that the second process compiled no scoring program (CI runs it).

On a bare GPU machine (the device tool's image: jax with CUDA, flax, optax, transformers)
it needs three things the image lacks; ``--prepare DIR`` gathers them here (with
network) into an ignored folder of the checkout to carry:
  * the jaxopt and gguf wheels for Python 3.12 (``DIR/wheels``);
  * Qwen2's tokenizer.json (11 MB; ``sc_jax.models.named_models.tokenizer_file("qwen2.5-0.5b")``),
    laid out as the cache folder the preset looks in (``DIR/sc_jax_cache``);
  * ``rotten_tomatoes.jsonl`` from ``--data-dir`` (``DIR/datasets``).
Then, there, one device command runs both phases (an H100 about a few minutes):
  pip install -q --no-index --no-deps --target /tmp/site DIR/wheels/*.whl
  PYTHONPATH=/tmp/site:. SC_JAX_CACHE=DIR/sc_jax_cache \
      python benchmarks/bench_seed.py --data-dir DIR/datasets --out $OUT/seed.json

Each phase has a deadline: ``--timeout`` seconds, and no more than what is left of
``--budget-s`` (540: a device command may run 600 s); a phase past its deadline is killed
with its process group and recorded as ``timeout``, one whose ``sc-jax run`` exits
nonzero (or crashes) as ``failed`` with its exit code and the tail of its stderr, and the
other phase still runs; the exit status is 1 unless both are ``ok``. The JSON is written
after each phase, so a command killed mid-way keeps the phases it finished.
``benchmarks/gpu_check.py`` runs both phases as two of its own, and
``benchmarks/accelerator_suite.py``'s third section one cold phase on its own settings:
this is the one timing of a seed end to end.

Writes ``benchmarks/results/bench_seed/<machine>.json`` (``<machine>_smoke.json`` for
``--smoke``; ``--out``) and prints a table.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _results

ROOT = Path(__file__).resolve().parents[1]
MARK = "BENCH_SEED "

#: The 7B-seed protocol (sc-jax run arguments besides the seed, data and --out).
PROTOCOL = ["--model", "random:qwen2-7b", "--dtype", "bfloat16", "--dataset", "rotten_tomatoes",
            "--shots", "8", "--test-size", "256", "--m-cap", "24", "--budget", "5000",
            "--methods", "base,cc,dc,bc,sc"]
SMOKE = ["--model", "random:tiny-llama", "--dtype", "float32", "--dataset", "rotten_tomatoes",
         "--shots", "4", "--test-size", "8", "--m-cap", "2", "--budget", "30", "--max-size", "2",
         "--methods", "base,cc,dc,bc,sc"]
#: What each phase reports, from results.json's timing (seconds unless named).
PARTS = ("load_s", "compile_s", "forward_s", "host_s", "fitting_s", "fit_compile_s", "fit_solve_s",
         "metrics_s", "report_s", "unaccounted_s")

CHILD = """
import json, sys, time
sys.path[:0] = [{root!r}, {bench!r}]
from sc_jax.cli import main
rc = main({argv!r})
import _results
print({mark!r} + json.dumps({{"rc": rc, "machine": _results.jax_machine()}}), flush=True)
sys.exit(rc)
"""
#: Characters of a failed child's stderr kept in its phase's record.
TAIL = 3000


def smoke_csv(path: Path, rows: int = 60, words: tuple[int, int] = (3, 9)) -> Path:
    """``rows`` short reviews of ``words`` (fewest, most) random words with alternating
    labels (Rotten Tomatoes' columns)."""
    import random

    rng = random.Random(0)
    vocab = "good bad fine dull fun great poor plot cast".split()
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        for j in range(rows):
            w.writerow([" ".join(rng.choice(vocab) for _ in range(rng.randint(*words))), j % 2])
    return path


def protocol_args(smoke: bool, data_dir: str, tmp: Path) -> list[str]:
    """``sc-jax run``'s arguments besides the seed and --out: :data:`PROTOCOL` on
    ``data_dir``, or :data:`SMOKE` on a synthetic CSV written into ``tmp``."""
    if smoke:
        return SMOKE + ["--data-file", f"rotten_tomatoes={smoke_csv(tmp / 'rt.csv')}"]
    return PROTOCOL + ["--data-dir", data_dir]


def prepare(folder: Path, data_dir: str) -> None:
    """Gather what a bare GPU machine lacks into ``folder`` (see the module docstring)."""
    import shutil

    data = Path(data_dir) / "rotten_tomatoes.jsonl"
    if not data.is_file():  # before any download
        print(f"bench_seed: no {data}; give --data-dir the folder that holds it", file=sys.stderr)
        raise SystemExit(2)

    sys.path.insert(0, str(ROOT))
    from sc_jax.models.named_models import tokenizer_file  # noqa: PLC0415

    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", "--platform",
                    "manylinux2014_x86_64", "-d", str(folder / "wheels"), "jaxopt==0.8.5",
                    "gguf==0.19.0"], check=True)
    tok = tokenizer_file("qwen2.5-0.5b")
    # The folder it is in, by name, is where the preset looks under $SC_JAX_CACHE.
    dest = folder / "sc_jax_cache" / tok.parent.name
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(tok, dest / "tokenizer.json")
    (folder / "datasets").mkdir(parents=True, exist_ok=True)
    shutil.copy(data, folder / "datasets")
    print(f"bench_seed: {folder} holds the wheels, the tokenizer and the data to carry")


def run_child(cmd: list[str], timeout: float, **popen) -> tuple[dict, str]:
    """Run ``cmd`` in a process group of its own until it exits or ``timeout`` seconds
    pass, then kill the whole group (a compile's helper processes too). Returns its
    record, ``{"status": "ok" | "failed" | "timeout", "seconds": ...}`` (a failure with
    ``exit_code`` and ``stderr_tail``), and its stdout."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, **popen)
    try:
        out, err = p.communicate(timeout=max(timeout, 0.001))
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return {"status": "timeout", "seconds": time.perf_counter() - t,
                "deadline_s": timeout, "stderr_tail": err[-TAIL:]}, out
    rec = {"status": "ok" if p.returncode == 0 else "failed", "seconds": time.perf_counter() - t}
    if p.returncode:
        rec.update(exit_code=p.returncode, stderr_tail=err[-TAIL:])
    return rec, out


def phase(name: str, seed: int, run_args: list[str], out: Path, xla_cache: Path, timeout: float,
          xla_flags: str | None = None) -> dict:
    """One ``sc-jax run`` of one seed in a fresh process, killed after ``timeout`` s: its
    status (:func:`run_child`), wall time and results.json's timing, tokens, compile
    counts and attention. ``xla_flags``: added to the child's XLA_FLAGS."""
    argv = ["run", *run_args, "--seed-list", str(seed), "--out", str(out), "--quiet"]
    env = dict(os.environ, SC_JAX_XLA_CACHE=str(xla_cache),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    if xla_flags:
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {xla_flags}".strip()
    code = CHILD.format(root=str(ROOT), bench=str(ROOT / "benchmarks"), argv=argv, mark=MARK)
    rec, stdout = run_child([sys.executable, "-c", code], timeout, env=env)
    rec = {"phase": name, "seed": seed, **rec}
    line = next((x for x in stdout.splitlines() if x.startswith(MARK)), None)
    if line is not None:
        rec["machine"] = json.loads(line[len(MARK):])["machine"]
    if rec["status"] != "ok":
        return rec
    t = json.loads((out / "results.json").read_text())["timing"]
    seeds = t["seeds"]
    return {**rec, "process_wall_s": rec["seconds"], "run_total_s": t["total_s"],
            "startup_s": rec["seconds"] - t["total_s"], **{key: t[key] for key in PARTS},
            "model_programs": t["model_programs"], "programs": t["programs"],
            "cache_hits": t["cache_hits"], "calls": sum(s["calls"] for s in seeds),
            "unique_tokens": sum(s["tokens"] for s in seeds),
            "executed_tokens": sum(s["executed_tokens"] for s in seeds),
            "shape": seeds[0]["shape"] if seeds else None,
            # .get: results.json records the attention chosen (and what it timed) from
            # the engine's attention choice on.
            "attention": seeds[0].get("attention") if seeds else None,
            "attention_trials": seeds[0].get("attention_trials") if seeds else None,
            "attention_from_cache": seeds[0].get("attention_from_cache") if seeds else None}


def check_smoke(rows: list[dict]) -> None:
    """The checks CI makes of the two phases of ``--smoke``: both ran, their timing adds
    up and the second process compiled no scoring program, the model's or another (all
    read from the persistent cache)."""
    for r in rows:
        assert r["status"] == "ok", r
        assert abs(r["unaccounted_s"]) <= 0.05 * r["run_total_s"], r
    assert rows[1]["model_programs"] == 0 and rows[1]["programs"] == 0, rows[1]


def table(rows: list[dict]) -> str:
    cols = ["phase", "seed", "status", "process_wall_s", "startup_s", *PARTS, "model_programs", "cache_hits",
            "calls", "unique_tokens", "executed_tokens"]
    out = ["| " + " | ".join(c.replace("_s", " s").replace("_", " ") for c in cols) + " |",
           "|" + "---|" * len(cols)]
    for r in rows:
        cells = (r.get(c, "–") for c in cols)
        out.append("| " + " | ".join(f"{v:.1f}" if isinstance(v, float) else f"{v:,}"
                                     if isinstance(v, int) else str(v) for v in cells) + " |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="a tiny random model on a synthetic CSV (CPU)")
    ap.add_argument("--data-dir", default="/work/shared/datasets",
                    help="folder holding rotten_tomatoes.jsonl (not used by --smoke)")
    ap.add_argument("--seeds", type=int, nargs=2, default=[0, 1], help="the cold and the second seed")
    ap.add_argument("--xla-cache", default=None,
                    help="persistent compilation cache to use (default: a new empty folder)")
    ap.add_argument("--timeout", type=float, default=540, help="seconds per phase at most")
    ap.add_argument("--budget-s", type=float, default=540,
                    help="seconds for both phases together; a phase gets what is left, at most "
                         "--timeout")
    ap.add_argument("--xla-flags", default=None,
                    help="XLA flags for both phases, to compare compiler settings, e.g. "
                         "'--xla_gpu_autotune_level=1' (recorded in the result)")
    ap.add_argument("--out", default=None, type=_results.result_file, help="JSON result (default: results/bench_seed/<machine>.json)")
    ap.add_argument("--prepare", default=None, metavar="DIR",
                    help="gather the wheels, tokenizer and data a bare GPU machine lacks, and stop")
    args = ap.parse_args(argv)
    if args.prepare:
        prepare(Path(args.prepare), args.data_dir)
        return 0
    t0 = time.perf_counter()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench_seed_") as tmp:
        tmp = Path(tmp)
        run_args = protocol_args(args.smoke, args.data_dir, tmp)
        xla = Path(args.xla_cache) if args.xla_cache else tmp / "xla"
        for name, seed in zip(("cold", "second"), args.seeds):
            left = args.budget_s - (time.perf_counter() - t0)
            rows.append(phase(name, seed, run_args, tmp / name, xla, min(args.timeout, left),
                              args.xla_flags))
            print(f"bench_seed: {name} (seed {seed}): {rows[-1]['status']} in "
                  f"{rows[-1]['seconds']:.1f} s", flush=True)
            path = save(args, argv, run_args, rows)
    print(table(rows))
    print(f"wrote {path}")
    if any(r["status"] != "ok" for r in rows):
        for r in rows:
            if r["status"] != "ok":
                print(f"bench_seed: the {r['phase']} phase: {r['status']} (exit "
                      f"{r.get('exit_code')}):\n{r['stderr_tail']}", file=sys.stderr)
        return 1
    if args.smoke:
        check_smoke(rows)
        print("bench_seed smoke: timing adds up; the second process compiled no scoring program")
    return 0


def save(args, argv, run_args: list[str], rows: list[dict]) -> Path:
    """Write the phases so far; the machine is the one the children reported."""
    machine = next((r["machine"] for r in rows if "machine" in r), _results.UNREPORTED)
    data = {"header": _results.header(machine, command=_results.command(__file__, argv),
                                      dtype="float32" if args.smoke else "bfloat16",
                                      note="each phase a fresh process; one persistent compilation "
                                           "cache, empty before the cold phase"),
            "smoke": args.smoke, "run_args": run_args, "xla_flags": args.xla_flags,
            "phases": [{k: v for k, v in r.items() if k != "machine"} for r in rows]}
    path = args.out or _results.default_path("bench_seed", machine["id"] + ("_smoke" if args.smoke else ""))
    return _results.write_json(path, data)

if __name__ == "__main__":
    sys.exit(main())
