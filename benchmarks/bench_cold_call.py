"""Cold calls: a fresh process's first ``fit_batch`` against its first SciPy loop.

A user's first fit pays the solver's compilation; ``sc-jax`` keeps JAX's persistent
compilation cache (``sc_jax.cli.process.enable_compilation_cache``), so only the first process
on a machine should. For the experiment's default batch (a two-class task, 5 seeds,
k = 4 with sizes 1..3 and k = 8 with sizes 1..5, tau from Appendix A, lambda_inv 0.1,
float32) this times, each in a fresh Python process:

  (a) ``fit_batch`` with an empty compilation cache (compile + run),
  (b) ``fit_batch`` again, the cache now filled by (a) (load + run),
  (c) the SciPy trust-constr loop on the same problems (its JAX derivative functions
      compiled in the process, as a user's first SciPy fit would).

``--calibrate`` adds the pure-JAX API's case: ``sc_jax.calibrate`` on 25 problems of
n = 4 classes with 336 rows each (k = 8, size 2, 25 seeds) as one array call with a
leading batch axis, float32: (a) and (b) as above, the same call again in the same
process (warm), and (c). Every JAX row reports its compile seconds apart
(``sc_jax.runtime.timing.CompileMeter``: tracing, lowering and XLA) and the programs
compiled.

  python benchmarks/bench_cold_call.py               # results/bench_cold_call/<machine>.json
  python benchmarks/bench_cold_call.py --k --calibrate    # the calibrate case alone
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import _results
import _timing

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


def calibrate_problems():
    """The calibrate case: 25 seeds of k = 8, size 2 (336 rows), n = 4 classes."""
    sys.path.insert(0, str(ROOT))
    from sc_jax.calibration.synthetic import World  # noqa: PLC0415

    return [World(4, (1.0, 0.8, 1.2), beta=(0.3, -0.2, 0.1), seed=seed).surrogate(8, (2,))[2]
            for seed in range(25)]


def child(kind, k):
    sys.path.insert(0, str(ROOT))
    import numpy as np  # noqa: PLC0415

    import sc_jax  # noqa: PLC0415
    from sc_jax.calibration import numpy_fit  # noqa: PLC0415
    from sc_jax.cli.process import enable_compilation_cache  # noqa: PLC0415
    from sc_jax.runtime.timing import CompileMeter  # noqa: PLC0415

    probs = calibrate_problems() if k == "calibrate" else problems(k)
    if k == "calibrate":
        x, y, g = (np.stack([p[j] for p in probs]) for j in range(3))
        x = x.astype(np.float32)
    extra = {}
    def fit():
        if kind == "jax" and k == "calibrate":
            enable_compilation_cache()
            return np.asarray(sc_jax.calibrate(x, y, g, num_queries=8).status).tolist()
        if kind == "jax":
            enable_compilation_cache()
            return [int(f.status) for f in numpy_fit.fit_batch(probs)]
        return [int(numpy_fit.fit(*p, solver="scipy").status) for p in probs]

    with CompileMeter() as meter:  # after imports and data: the fit alone
        seconds, statuses = _timing.once(fit)
    if kind == "jax" and k == "calibrate":
        extra["warm_s"], _ = _timing.once(
            lambda: np.asarray(sc_jax.calibrate(x, y, g, num_queries=8).b))
    print(json.dumps(dict(seconds=seconds, compile_s=meter.seconds, programs=meter.count()[0],
                          problems=len(probs), statuses=statuses, machine=_results.jax_machine(),
                          **extra)))


def run_child(kind, k, cache):
    env = dict(os.environ, SC_JAX_XLA_CACHE=cache)
    ks = [] if k == "calibrate" else [str(k)]  # no k: the calibrate case
    out = subprocess.run([sys.executable, __file__, "--child", kind, "--k", *ks],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--child", choices=["jax", "scipy"])
    p.add_argument("--k", type=int, nargs="*", default=[4, 8],
                   help="fit_batch cases: the experiment's batch at these k (none: skip them)")
    p.add_argument("--calibrate", action="store_true",
                   help="also the sc_jax.calibrate case (n = 4, 25 x 336 rows)")
    p.add_argument("--out", default=None, type=_results.result_file,
                   help="JSON file (default: benchmarks/results/bench_cold_call/<machine>.json)")
    args = p.parse_args(argv)
    if args.child:
        return child(args.child, args.k[0] if args.k else "calibrate")
    rows = []
    for k in list(args.k) + (["calibrate"] if args.calibrate else []):
        with tempfile.TemporaryDirectory() as cache:
            cold = run_child("jax", k, cache)
            warm = run_child("jax", k, cache)
        sp = run_child("scipy", k, "")
        rows.append(dict(k=k, api="calibrate" if k == "calibrate" else "fit_batch",
                         problems=cold["problems"], jax_empty_cache_s=cold["seconds"],
                         jax_empty_cache_compile_s=cold["compile_s"],
                         jax_programs=cold["programs"], jax_filled_cache_s=warm["seconds"],
                         jax_filled_cache_compile_s=warm["compile_s"],
                         jax_warm_s=cold.get("warm_s"), scipy_s=sp["seconds"],
                         jax_statuses=cold["statuses"], scipy_statuses=sp["statuses"]))
        r = rows[-1]
        print(f"{r['api']} k={k}: {r['problems']} problems  empty cache {r['jax_empty_cache_s']:.2f}s "
              f"(compile {r['jax_empty_cache_compile_s']:.2f}s, {r['jax_programs']} programs)  "
              f"filled cache {r['jax_filled_cache_s']:.2f}s"
              + ("" if r["jax_warm_s"] is None else f"  warm {r['jax_warm_s']:.3f}s")
              + f"  SciPy loop {r['scipy_s']:.2f}s", flush=True)
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
