"""Cold calls: a fresh process's first ``fit_batch`` against its first SciPy loop.

A user's first fit pays the solver's compilation; ``sc-jax`` keeps JAX's persistent
compilation cache (``sc_jax.cli.enable_compilation_cache``), so only the first process
on a machine should. For the experiment's default batch (a two-class task, 5 seeds,
k = 4 with sizes 1..3 and k = 8 with sizes 1..5, tau from Appendix A, lambda_inv 0.1,
float32) this times, each in a fresh Python process:

  (a) ``fit_batch`` with an empty compilation cache (compile + run),
  (b) ``fit_batch`` again, the cache now filled by (a) (load + run),
  (c) the SciPy trust-constr loop on the same problems (its JAX derivative functions
      compiled in the process, as a user's first SciPy fit would).

  python benchmarks/bench_cold_call.py     # results/bench_cold_call/<machine>.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _results

ROOT = Path(__file__).resolve().parents[1]


def problems(k):
    sys.path.insert(0, str(ROOT))
    from sc_jax.calibration.synthetic import World  # noqa: PLC0415

    sizes = tuple(range(1, min(5, k - 1) + 1))
    out = []
    for seed in range(5):
        sur = World(2, (1.0,), beta=(0.3,), seed=seed).surrogate(k, sizes)
        out += [sur[i] for i in sizes]
    return out


def child(kind, k):
    sys.path.insert(0, str(ROOT))
    t = time.perf_counter()
    from sc_jax.calibration import calibrators  # noqa: PLC0415
    from sc_jax.cli import enable_compilation_cache  # noqa: PLC0415

    probs = problems(k)
    t = time.perf_counter()  # after imports and data: the fit alone
    if kind == "jax":
        enable_compilation_cache()
        fits = calibrators.fit_batch(probs)
    else:
        fits = [calibrators.fit(*p, solver="scipy") for p in probs]
    seconds = time.perf_counter() - t
    print(json.dumps(dict(seconds=seconds, problems=len(probs),
                          statuses=[int(f.status) for f in fits],
                          machine=_results.jax_machine())))


def run_child(kind, k, cache):
    env = dict(os.environ, SC_JAX_XLA_CACHE=cache)
    out = subprocess.run([sys.executable, __file__, "--child", kind, "--k", str(k)],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--child", choices=["jax", "scipy"])
    p.add_argument("--k", type=int, nargs="+", default=[4, 8])
    p.add_argument("--out", default=None,
                   help="JSON file (default: benchmarks/results/bench_cold_call/<machine>.json)")
    args = p.parse_args(argv)
    if args.child:
        return child(args.child, args.k[0])
    rows = []
    for k in args.k:
        with tempfile.TemporaryDirectory() as cache:
            cold = run_child("jax", k, cache)
            warm = run_child("jax", k, cache)
        sp = run_child("scipy", k, "")
        rows.append(dict(k=k, problems=cold["problems"], jax_empty_cache_s=cold["seconds"],
                         jax_filled_cache_s=warm["seconds"], scipy_s=sp["seconds"],
                         jax_statuses=cold["statuses"], scipy_statuses=sp["statuses"]))
        r = rows[-1]
        print(f"k={k}: {r['problems']} problems  fit_batch empty cache {r['jax_empty_cache_s']:.2f}s"
              f"  filled cache {r['jax_filled_cache_s']:.2f}s  SciPy loop {r['scipy_s']:.2f}s",
              flush=True)
    # The parent never imports jax (its children must be fresh): the machine is the
    # first child's.
    machine = cold["machine"]
    out = _results.write_json(
        args.out or _results.default_path("bench_cold_call", machine["id"]),
        dict(header=_results.header(machine, command=_results.command(__file__, argv),
                                    dtype="float32"), rows=rows))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
