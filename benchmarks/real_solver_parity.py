"""Solver parity on real surrogate problems: every (dataset, k, seed, size) fit of a
finished ``sc-jax run``, refitted from its saved scores (no model, no forward pass).

For each problem: the augmented Lagrangian in float32 and float64 (``fit_batch``, the
paper's SC: no guard, the Appendix A tau), and SciPy trust-constr from several starts
(``solvers.scipy_best``, float64). Reports the statuses and the worst gaps:

  gap64 = (f64 - scipy_best) / scipy_best     (target <= 1e-7; below 0 is fine)
  gap32 = (f32 - f64) / f64                    (target <= 1e-4)

where f32 is the float32 fit's objective as the solver reports it. Where float64
reports UNBOUNDED (an infimum that is not attained: f can fall to 0), both gaps are
divided by max(1, |f|) instead, as in ``sweep_solver.py``. Writes the common header
(``_results``), the solvers' times and one record per problem to
``benchmarks/results/real_solver_parity/<machine>_<model>_<run>.json`` (``--out``; model
and run are the run directory's last two names), and prints every problem that misses a
target or does not end CONVERGED. The run needs its ``scores/`` (``sc-jax run`` writes
them; no model is loaded).

  python benchmarks/real_solver_parity.py benchmarks/real_eval/qwen2.5-0.5b/k4
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from sc_jax.calibration import defaults, numpy_fit

from sc_jax.calibration import solvers  # noqa: E402
from sc_jax.experiment.evaluation.store import load_run_scores  # noqa: E402
from sc_jax.experiment.reporting.ablation import surrogate_problems  # noqa: E402
from sweep_solver import GAP32, GAP64  # noqa: E402
import _timing  # noqa: E402
from bench_solver import _sp_problem  # noqa: E402
import _results  # noqa: E402


def problems_of_run(run_dir):
    """[(key, (features, labels, query_ids))] for every surrogate problem of the run;
    key = (dataset, k, seed, size)."""
    _, runs = load_run_scores(Path(run_dir))
    out = []
    for (name, k), per_seed in runs.items():
        keys, problems = surrogate_problems(per_seed)
        out += [((name, k, seed, size), tuple(np.asarray(a) for a in prob))
                for (seed, size), prob in zip(keys, problems)]
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run_dir")
    p.add_argument("--lambda-inv", type=float, default=defaults.DEFAULT_LAMBDA_INV)
    p.add_argument("--out", default=None, type=_results.result_file,
                   help="JSON file (default: benchmarks/results/real_solver_parity/"
                        "<machine>_<model>_<run>.json)")
    args = p.parse_args(argv)
    try:
        items = problems_of_run(args.run_dir)
    except (FileNotFoundError, ValueError) as err:
        p.error(str(err))
    keys, probs = [k for k, _ in items], [p for _, p in items]
    print(f"jax {jax.__version__} on {jax.default_backend()}, {platform.machine()}; "
          f"{len(probs)} problems from {args.run_dir}", flush=True)
    fits, seconds = {}, {}
    for dtype in ("float32", "float64"):
        seconds[f"jax_{dtype}"], fits[dtype] = _timing.once(
            lambda: numpy_fit.fit_batch(probs, lambda_inv=args.lambda_inv, dtype=dtype))
        print(f"JAX {dtype}: {seconds[f'jax_{dtype}']:.1f} s (compile included)", flush=True)
    records = []
    t = time.perf_counter()
    for key, (x, y, g), r32, r64 in zip(keys, probs, fits["float32"], fits["float64"]):
        ref = solvers.scipy_best(_sp_problem(x, y, g), args.lambda_inv, r64.tau)
        f_ref = None if ref is None else float(ref.objective)
        # An infimum that is not attained (float64 UNBOUNDED: separable rows, f can
        # reach 0): gaps in units of max(1, |f|), as in sweep_solver.py, since both
        # solvers stop somewhere on the way down and a relative gap says nothing.
        unb = r64.status.name == "UNBOUNDED"

        def gap(f, ref_f):
            return (f - ref_f) / (max(1.0, abs(ref_f)) if unb else abs(ref_f))

        rec = dict(dataset=key[0], shots=key[1], seed=key[2], size=key[3], rows=len(y),
                   n=int(x.shape[1] + 1), tau=r64.tau, lambda_inv=args.lambda_inv,
                   scipy_best=f_ref, f64=r64.objective, status64=r64.status.name,
                   violation64=r64.violation, f32=r32.objective, status32=r32.status.name,
                   violation32=r32.violation,
                   gap64=None if f_ref is None else gap(r64.objective, f_ref),
                   gap32=gap(r32.objective, r64.objective))
        records.append(rec)
    seconds["scipy"] = time.perf_counter() - t
    print(f"SciPy (5 starts each): {seconds['scipy']:.1f} s", flush=True)
    machine = _results.jax_machine()
    run = Path(args.run_dir).resolve()
    out = _results.write_json(
        args.out or _results.default_path("real_solver_parity",
                                          f"{machine['id']}_{run.parent.name}_{run.name}"),
        dict(header=_results.header(machine, command=_results.command(__file__, argv),
                                    dtype=["float32", "float64"]),
             run=args.run_dir, seconds=seconds, records=records))
    for dtype in ("32", "64"):
        st = {}
        for r in records:
            st[r["status" + dtype]] = st.get(r["status" + dtype], 0) + 1
        print(f"float{dtype} statuses: {st}")
    print(f"worst gap64 {max(r['gap64'] for r in records if r['gap64'] is not None):.1e} "
          f"(target {GAP64:g}), worst gap32 {max(r['gap32'] for r in records):.1e} "
          f"(target {GAP32:g})")
    for r in records:
        if (r["status32"] != "CONVERGED" or r["status64"] != "CONVERGED"
                or (r["gap64"] or 0) > GAP64 or r["gap32"] > GAP32):
            print(f"  {r['dataset']} k={r['shots']} seed {r['seed']} size {r['size']}: "
                  f"{r['rows']} rows, tau {r['tau']:.3g}, float32 {r['status32']}, float64 "
                  f"{r['status64']}, gap64 {r['gap64']:.1e}, gap32 {r['gap32']:.1e}")
    print(f"JSON: {out}")


if __name__ == "__main__":
    main()
