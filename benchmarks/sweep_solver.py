"""Randomised parity and robustness sweep of the JAX solvers against SciPy.

Draws ``--per-family`` instances of every family of
:func:`sc_jax.calibration.synthetic.solver_instance` (informative, partly flipped, apex =
uninformative with strong invariance, near-separable, tight tau at K = 5 and 6, no
trust region, strong invariance at n = 2, near the apex, multi-class with lambda_inv
10, and normal mixtures with heavy-tailed query shifts; lambda_inv in {0, 0.1, 0.5, 1,
2, 10}; N from 12 to 20,160 rows) and solves each

  * with the augmented Lagrangian in float64 and float32 (``numpy_fit.fit_batch``:
    one compiled call per class count and dtype; by default one start where
    lambda_inv < 0.5 and 96 where lambda_inv >= 0.5, as fit_batch does; or, with
    ``--api calibrate``, ``sc_jax.calibrate`` per instance, with its defaults), and
  * with SciPy trust-constr (float64) from several starts: the identity, slopes 3
    and 0.3, and two random points; the best feasible end point is the reference
    (``solvers.scipy_best``).

Checks, per instance (issue 11):
  * float64: status CONVERGED (or UNBOUNDED), violation <= 1e-9, and objective at most
    1e-7 relative above the best SciPy start (below it is fine);
  * float32: objective of the float32 parameters (evaluated in float64) at most 1e-4
    relative above the float64 solution's;
  * UNBOUNDED (an infimum that is not attained): the same objectives, to 1e-7 and
    1e-4 times max(1, |f|) (see ``checks``).

The JSON-lines output (``--out``, default ``benchmarks/results/sweep_solver/
<machine>.jsonl``) starts with the common header line (``_results``), then holds one
``fit_time`` line per JAX batch (fits, seconds, compile included) and one line per
instance, appended as it finishes, so an interrupted run resumes where it stopped
(delete the file to start over). Prints a table per family and every instance that
misses a check.

  python benchmarks/sweep_solver.py                      # 36 per family (360 instances)
  python benchmarks/sweep_solver.py --families mixture near_apex --api calibrate
  python benchmarks/sweep_solver.py --per-family 4 --families apex flipped
  python benchmarks/sweep_solver.py --reference old.jsonl --out new.jsonl  # rerun JAX only
  python benchmarks/sweep_solver.py --reference old.jsonl --instances apex:7 flipped:3
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import sc_jax  # noqa: E402
from sc_jax.calibration import numpy_fit  # noqa: E402
from sc_jax.calibration import solvers  # noqa: E402
from sc_jax.calibration.objective import Params, objective  # noqa: E402
from sc_jax.calibration.synthetic import FAMILIES, solver_instance  # noqa: E402
from bench_solver import _sp_problem  # noqa: E402  (NumPy float64 Problem, ids 0..G-1)
import _results  # noqa: E402
import _timing  # noqa: E402

GAP64 = 1e-7
GAP32 = 1e-4
FEAS = 1e-9


def f64_objective(b, w, x, y, g, lam) -> float:
    with jax.enable_x64(True):
        return float(objective(Params(jnp.asarray(b, jnp.float64), jnp.asarray(w, jnp.float64)),
                               _sp_problem(x, y, g), jnp.asarray(lam, jnp.float64)))


def _fmt(v, spec="+.1e"):
    return "none" if v is None else format(v, spec)


def instance_records(path) -> list[dict]:
    """The per-instance records of a sweep's JSON-lines file (without its header and
    ``fit_time`` lines)."""
    return [r for r in _results.read_jsonl(path)[1] if "family" in r]


def load_references(paths) -> dict:
    """(family, seed) -> record, from earlier sweeps' JSON-lines files: their best
    SciPy objectives are reused instead of recomputed (the instance generator is
    deterministic; each reuse is checked against the instance's n, N, lambda_inv and
    tau)."""
    return {(r["family"], r["seed"]): r for path in paths for r in instance_records(path)}


def checks(rec) -> dict:
    """The issue's checks of one record: ``ok64`` and ``ok32``.

    A finite optimum: float64 CONVERGED, violation <= FEAS, objective at most GAP64
    relative above the best SciPy start; float32 at most GAP32 relative above
    float64. An UNBOUNDED float64 status (an infimum that is not attained) must still
    have reached the best SciPy start's objective, to GAP64 x max(1, |f|) (SciPy
    stops somewhere on the same way down, near f = 0 for separable data, so a
    relative gap to 1e-11 says nothing), and float32 likewise the float64
    objective to GAP32 x max(1, |f64|): a run-off from a worse basin is a miss.
    """
    unb = rec["status64"] == "UNBOUNDED"
    ref, f64 = rec["scipy_best"], rec["f64"]
    if ref is None:
        close64 = True
    elif unb:
        close64 = f64 - ref <= GAP64 * max(1.0, abs(ref))
    else:
        close64 = rec["gap64"] <= GAP64
    ok64 = (rec["status64"] in ("CONVERGED", "UNBOUNDED") and rec["violation64"] <= FEAS
            and close64)
    if unb:
        ok32 = rec["f32"] - f64 <= GAP32 * max(1.0, abs(f64))
    else:
        ok32 = rec["gap32"] <= GAP32
    return {"ok64": bool(ok64), "ok32": bool(ok32)}


def calibrate_fit(instance, dtype: str, options):
    """One instance through ``sc_jax.calibrate`` (the pure-JAX API, eager: one
    compiled program per shape), as the fields of a ``FitResult`` the sweep reads."""
    x, y, g, lam, tau = instance
    with jax.enable_x64(dtype == "float64"):
        cal = sc_jax.calibrate(np.asarray(x, dtype), y, g, lambda_inv=lam, tau=tau, dtype=dtype,
                               options=options)
        return SimpleNamespace(b=np.asarray(cal.b, np.float64), w=np.asarray(cal.w, np.float64),
                               objective=float(cal.objective), status=solvers.Status(int(cal.status)),
                               violation=float(cal.violation), iterations=int(cal.iterations))


def run(families, per_family, out: Path, options, references=None, instances=None,
        api: str = "fit_batch"):
    """``instances``: (family, seed) pairs to solve instead of the first
    ``per_family`` seeds of every family. ``out`` exists, with its header line.
    ``api``: "fit_batch" (one compiled call per class count and dtype) or
    "calibrate" (``sc_jax.calibrate`` per instance)."""
    references = references or {}
    done = {(r["family"], r["seed"]): r for r in instance_records(out)}
    keys = instances or [(f, s) for f in families for s in range(per_family)]
    todo = [key for key in keys if key not in done]
    print(f"{len(keys) - len(todo)} instances already in {out}, {len(todo)} to solve", flush=True)
    if not todo:
        return [done[key] for key in keys]
    inst = {key: solver_instance(*key) for key in todo}
    fits, seconds = {}, {}
    for dtype in ("float64", "float32"):
        if api == "calibrate":
            seconds[dtype], res = _timing.once(
                lambda: [calibrate_fit(inst[k], dtype, options) for k in todo])
        else:
            seconds[dtype], res = _timing.once(lambda: numpy_fit.fit_batch(
                [inst[k][:3] for k in todo], lambda_inv=[inst[k][3] for k in todo],
                tau=[inst[k][4] for k in todo], dtype=dtype, options=options))
        print(f"JAX {dtype}: {len(todo)} fits in {seconds[dtype]:.1f}s "
              "(compile included)", flush=True)
        fits[dtype] = dict(zip(todo, res))
    with out.open("a") as fh:
        for dtype, secs in seconds.items():
            fh.write(json.dumps({"fit_time": {"dtype": dtype, "fits": len(todo), "seconds": secs}})
                     + "\n")
        for key in todo:
            x, y, g, lam, tau = inst[key]
            old = references.get(key)
            if old is not None and (old["n"], old["rows"], old["lambda_inv"], old["tau"]) == (
                    int(x.shape[1] + 1), int(len(y)), lam, tau):
                f_ref, sp_s = old["scipy_best"], old["scipy_s"]
            else:
                sp_s, ref = _timing.once(
                    lambda: solvers.scipy_best(_sp_problem(x, y, g), lam, tau, seed=key[1]))
                f_ref = None if ref is None else float(ref.objective)
            r64, r32 = fits["float64"][key], fits["float32"][key]
            f64 = float(r64.objective)
            f32 = f64_objective(r32.b, r32.w, x, y, g, lam)
            rec = dict(
                family=key[0], seed=key[1], n=int(x.shape[1] + 1), rows=int(len(y)),
                lambda_inv=lam, tau=tau, scipy_best=f_ref, scipy_s=sp_s,
                f64=f64, status64=r64.status.name, violation64=float(r64.violation),
                iterations64=int(r64.iterations),
                gap64=None if f_ref is None else (f64 - f_ref) / max(abs(f_ref), 1e-300),
                f32=f32, status32=r32.status.name, violation32=float(r32.violation),
                gap32=(f32 - f64) / max(abs(f64), 1e-300),
            )
            rec.update(checks(rec))
            fh.write(json.dumps(rec) + "\n")
            fh.flush()
            done[key] = rec
            flag = "" if rec["ok64"] and rec["ok32"] else "   <-- MISS"
            print(f"{key[0]:16s} {key[1]:3d} n={rec['n']} N={rec['rows']:6d} "
                  f"lam={lam:<4g} tau={tau:+.5f} {rec['status64']:10s} it={rec['iterations64']:3d} "
                  f"f64={f64:.10f} scipy={_fmt(f_ref, '.10f')} gap64={_fmt(rec['gap64'])} "
                  f"gap32={rec['gap32']:+.1e}{flag}", flush=True)
    return [done[key] for key in keys]


def table(records):
    records = [{**r, **checks(r)} for r in records]  # older files: today's checks
    print(f"\n{'family':16s} {'count':>5} {'N range':>13} {'worst gap64':>11} "
          f"{'worst gap32':>11} {'statuses (float64)':30s} {'misses':>6}")
    for fam in dict.fromkeys(r["family"] for r in records):
        rs = [r for r in records if r["family"] == fam]
        g64 = [r["gap64"] for r in rs if r["gap64"] is not None and r["status64"] != "UNBOUNDED"]
        g32 = [r["gap32"] for r in rs if r["status64"] != "UNBOUNDED"]
        st = {}
        for r in rs:
            st[r["status64"]] = st.get(r["status64"], 0) + 1
        misses = sum(not (r["ok64"] and r["ok32"]) for r in rs)
        print(f"{fam:16s} {len(rs):>5} {min(r['rows'] for r in rs):>6}-{max(r['rows'] for r in rs):<6} "
              f"{max(g64, default=float('nan')):>11.1e} {max(g32, default=float('nan')):>11.1e} "
              f"{', '.join(f'{k} {v}' for k, v in st.items()):30s} {misses:>6}")
    bad = [r for r in records if not (r["ok64"] and r["ok32"])]
    print(f"\n{len(records)} instances, {len(bad)} miss a check")
    for r in bad:
        print(f"  {r['family']} seed {r['seed']}: n={r['n']} N={r['rows']} lam={r['lambda_inv']} "
              f"tau={r['tau']:.5f} {r['status64']} f64={r['f64']:.10g} scipy={r['scipy_best']} "
              f"gap64={r['gap64']} gap32={r['gap32']:.1e}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--per-family", type=int, default=36)
    p.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    p.add_argument("--num-starts", type=int, default=None,
                   help="augmented-Lagrangian starts (SolverOptions.num_starts); default: "
                        "fit_batch's, 1 where lambda_inv < NONCONVEX_LAMBDA (0.5) and "
                        "NONCONVEX_STARTS (96) above")
    p.add_argument("--api", choices=["fit_batch", "calibrate"], default="fit_batch",
                   help="fit_batch: one compiled call per class count and dtype; calibrate: "
                        "sc_jax.calibrate per instance, with its own default starts unless "
                        "--num-starts is given")
    p.add_argument("--out", default=None, type=_results.result_file,
                   help="JSON-lines file, resumed if it exists (default: "
                        "benchmarks/results/sweep_solver/<machine>.jsonl)")
    p.add_argument("--reference", nargs="*", default=[], metavar="JSONL",
                   help="earlier sweeps' output: reuse their best SciPy objective for the "
                        "instances they hold (only the JAX solvers are rerun)")
    p.add_argument("--instances", nargs="+", metavar="FAMILY:SEED",
                   help="solve only these instances (for instance the misses of an earlier "
                        "sweep) instead of --per-family seeds of every family")
    args = p.parse_args(argv)
    instances = None
    if args.instances:
        instances = []
        for item in args.instances:
            fam, _, seed = item.partition(":")
            if fam not in FAMILIES or not seed.isdigit():
                p.error(f"--instances: {item!r} is not FAMILY:SEED with FAMILY one of "
                        f"{', '.join(FAMILIES)}")
            instances.append((fam, int(seed)))
    missing = [r for r in args.reference if not Path(r).is_file()]
    if missing:
        p.error(f"--reference: no such file: {', '.join(missing)}")
    machine = _results.jax_machine()
    out = _results.start_jsonl(
        args.out or _results.default_path("sweep_solver", machine["id"], ".jsonl"),
        _results.header(machine, command=_results.command(__file__, argv),
                        dtype=["float64", "float32"]))
    print(f"jax {jax.__version__} on {jax.default_backend()}, {platform.machine()}", flush=True)
    records = run(args.families, args.per_family, out,
                  None if args.num_starts is None else
                  solvers.SolverOptions(num_starts=args.num_starts),
                  load_references(args.reference), instances, api=args.api)
    table(records)


if __name__ == "__main__":
    main()
