"""Where the sweep's misses at lambda_inv >= 1 stand among SciPy's own starts.

The SC objective is not convex once the invariance term weighs (lambda_inv >= 1): on
these instances several KKT points exist, and the reference of ``sweep_solver.py`` is
the best of five SciPy trust-constr starts (the identity, slopes 3 and 0.3, two random
points). This script solves each missed instance with SciPy from every one of those
starts separately and prints where the JAX augmented Lagrangian's objective (from the
sweep's records: one start, and optionally four) ranks among them, so that a miss can
be read as "a worse KKT point than SciPy's best start, but as good as SciPy from the
same start" or not.

  python benchmarks/local_optima.py --sweep one_start.jsonl [--starts4 four.jsonl]

writes ``benchmarks/results/local_optima/<machine>.json`` (``--out``): the common
header (``_results``) and one record per instance.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from sc_jax.calibration import solvers  # noqa: E402
from sc_jax.calibration.synthetic import solver_instance  # noqa: E402
from bench_solver import _sp_problem  # noqa: E402
import _results  # noqa: E402

FEAS = 1e-9


def _read(path):
    return {(r["family"], r["seed"]): r for r in _results.read_jsonl(path)[1] if "family" in r}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sweep", required=True, help="sweep_solver.py output (one start)")
    p.add_argument("--starts4", help="the same sweep with --num-starts 4")
    p.add_argument("--min-lambda", type=float, default=1.0)
    p.add_argument("--out", default=None, type=_results.result_file,
                   help="JSON file (default: benchmarks/results/local_optima/<machine>.json)")
    args = p.parse_args(argv)
    for path in filter(None, (args.sweep, args.starts4)):
        if not Path(path).is_file():
            p.error(f"no such file: {path}")
    one = _read(args.sweep)
    four = _read(args.starts4) if args.starts4 else {}
    misses = [k for k, r in one.items()
              if r["lambda_inv"] >= args.min_lambda and not (r["ok64"] and r["ok32"])]
    print(f"{len(misses)} misses at lambda_inv >= {args.min_lambda} in {args.sweep}", flush=True)
    records = []
    for key in misses:
        x, y, g, lam, tau = solver_instance(*key)
        prob = _sp_problem(x, y, g)
        t = time.perf_counter()
        ends = []
        for x0 in solvers.scipy_starts(x.shape[1] + 1, key[1]):
            s = solvers.scipy(prob, lam, tau, x0=x0)
            ok = float(s.violation) <= FEAS
            ends.append(float(s.objective) if ok else None)
        feas = sorted(f for f in ends if f is not None)
        f1 = one[key]["f64"]
        f4 = four.get(key, {}).get("f64")

        def beaten(f):
            # SciPy starts whose feasible end is more than 1e-7 relative below f.
            return sum(e < f - 1e-7 * max(abs(e), 1e-300) for e in feas)

        rec = dict(family=key[0], seed=key[1], n=one[key]["n"], rows=one[key]["rows"],
                   lambda_inv=lam, tau=tau, scipy_ends=ends, scipy_s=time.perf_counter() - t,
                   distinct=len({round(e, 6) for e in feas}), jax1=f1, jax4=f4,
                   scipy_identity=ends[0], feasible=len(feas),
                   identity_misses=bool(ends[0] is None or beaten(ends[0]) > 0),
                   below_jax1=beaten(f1),
                   below_jax4=None if f4 is None else beaten(f4))
        records.append(rec)
        print(f"{key[0]:15s} {key[1]:3d} n={rec['n']} N={rec['rows']:6d} lam={lam:<4g} "
              f"tau={tau:+.4f} SciPy ends {['inf' if e is None else f'{e:.4g}' for e in ends]} "
              f"JAX 1 start {f1:.4g} ({rec['below_jax1']}/{len(feas)} SciPy starts below)"
              + ("" if f4 is None else f", 4 starts {f4:.4g} ({rec['below_jax4']} below)"),
              flush=True)
    machine = _results.jax_machine()
    out = _results.write_json(
        args.out or _results.default_path("local_optima", machine["id"]),
        dict(header=_results.header(machine, command=_results.command(__file__, argv),
                                    dtype="float64"), records=records))
    n = len(records)
    if n:
        ident = sum(r["identity_misses"] for r in records)
        half = sum(r["below_jax1"] <= r["feasible"] // 2 for r in records)
        print(f"\n{n} instances: SciPy's identity start misses SciPy's best start on {ident}; "
              f"median distinct SciPy end points {np.median([r['distinct'] for r in records]):g}; "
              f"JAX (1 start) ties or beats at least half of SciPy's starts on {half}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
