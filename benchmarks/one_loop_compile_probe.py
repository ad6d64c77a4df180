"""How small would a one-loop solver compile? A probe, not a solver.

The design in question: one loop whose body is a dense Newton/SQP step on the (b, w,
multiplier) system, with several starts as a batch axis. Before anyone writes that
solver, this measures what such a program costs to compile, against
``jax.jit(sc_jax.calibrate)`` on the same problem: one k = 8, size-1 problem of n classes
(bench_compile's ``calibrate-jit-n<n>`` problem), float32, a fresh process for each, the
persistent cache off, both run interleaved ``--repeats`` times.

The probe's body has the parts every step of such a solver needs: the exact Hessian of f
over the rows (``objective.value_grad_hess``), the mean-cosine constraint's gradient and
Hessian, one dense KKT solve of size 2(n-1)+1 after an eigenvalue shift, and a line
search over 8 step lengths evaluated as a batch. It runs five starts as a vmapped
axis. It has none of the status ladder, the ray test, the run-off follow-up or the
feasibility restoration, and it is not tuned to converge: a first run at tau = 0.9 ended
4 of 5 starts at its 300-iteration cap. Its compile time is therefore a floor for the
design, not a figure for a finished solver.

  python benchmarks/one_loop_compile_probe.py --classes 6 --repeats 3

JSON: ``benchmarks/results/one_loop_compile_probe/<machine>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import _results

ROOT = Path(__file__).resolve().parents[1]


def _probe(n: int):
    """The probe program: ``solve(x, y, g)`` -> (z [5, p], mu [5], iterations [5], done [5])."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    from sc_jax.calibration.objective import (  # noqa: PLC0415
        Problem, design, params_from_flat, trust_region, value, value_grad_hess)

    p = 2 * (n - 1)

    def solve(x, y, g):
        d = design(Problem(x, y, g, jnp.ones(x.shape[0], x.dtype), 8))
        lam, tau = jnp.float32(0.1), jnp.float32(0.9)

        def margin(z):
            return trust_region(params_from_flat(z)) - tau

        def body(s):
            z, mu, it, _ = s
            _, gr, H = value_grad_hess(z, d, lam)
            c, gc = jax.value_and_grad(margin)(z)
            W = H - mu * jax.hessian(margin)(z)
            shift = jnp.maximum(0.0, 1e-6 - jnp.linalg.eigvalsh(W)[0])
            K = jnp.block([[W + shift * jnp.eye(p), -gc[:, None]], [gc[None, :], jnp.zeros((1, 1))]])
            step = jnp.linalg.solve(K, -jnp.concatenate([gr - mu * gc, c[None]]))
            lengths = 0.5 ** jnp.arange(8.0)
            merit = jax.vmap(lambda a: value(z + a * step[:p], d, lam)
                             + 10.0 * jnp.maximum(0.0, -margin(z + a * step[:p])))(lengths)
            a = lengths[jnp.argmin(merit)]
            mu = jnp.maximum(0.0, mu + a * step[p])
            return z + a * step[:p], mu, it + 1, jnp.linalg.norm(gr - mu * gc) < 1e-5

        def one(z0):
            return jax.lax.while_loop(lambda s: (~s[3]) & (s[2] < 300), body,
                                      (z0, jnp.float32(0), 0, False))

        starts = jnp.stack([jnp.concatenate([jnp.zeros(n - 1), jnp.full(n - 1, s)])
                            for s in (1.0, 3.0, 0.3, 0.5, 2.0)]).astype(jnp.float32)
        return jax.vmap(one)(starts)

    return solve


def child(which: str, n: int) -> None:
    import jax  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    import sc_jax  # noqa: PLC0415
    from sc_jax.calibration.synthetic import World  # noqa: PLC0415

    from bench_compile import _Stages  # noqa: PLC0415 - JAX's stage timings, as bench_compile reads them

    x, y, g = World(n, (1.0,) * (n - 1), beta=(0.2,) * (n - 1), seed=0).surrogate(8, (1,))[1]
    args = (x.astype(np.float32), np.asarray(y, np.int32), np.asarray(g, np.int32))
    fn = (_probe(n) if which == "probe"
          else lambda a, b, c: sc_jax.calibrate(a, b, c, num_queries=8))
    with _Stages() as stages:
        t = time.perf_counter()
        jax.block_until_ready(jax.jit(fn)(*args))
        first = time.perf_counter() - t
    lines = jax.jit(fn).lower(*args).as_text().count("\n")
    seconds = {f"{k}_s": v for k, v in stages.seconds.items()}
    print(json.dumps(dict(which=which, first_s=first, stablehlo_lines=lines, **seconds,
                          machine=_results.jax_machine())))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--classes", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", choices=("probe", "calibrate"), help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, type=_results.result_file)
    args = ap.parse_args(argv)
    if args.child:
        return child(args.child, args.classes)
    if args.classes < 2 or args.repeats < 1:
        ap.error("--classes must be at least 2 and --repeats at least 1")
    env = dict(os.environ, JAX_ENABLE_COMPILATION_CACHE="false", JAX_PLATFORMS=os.environ.get(
        "JAX_PLATFORMS", "cpu"), PYTHONPATH=os.pathsep.join([str(ROOT), str(Path(__file__).parent)]))
    runs = {"calibrate": [], "probe": []}
    for _ in range(args.repeats):
        for which in runs:
            out = subprocess.run([sys.executable, __file__, "--child", which, "--classes",
                                  str(args.classes)], cwd=ROOT, env=env, capture_output=True, text=True)
            if out.returncode:
                sys.exit(f"one_loop_compile_probe: {which} failed: {_results.last_line(out.stderr)}")
            runs[which].append(json.loads(out.stdout.strip().splitlines()[-1]))
    machine = runs["calibrate"][0]["machine"]
    print(f"n = {args.classes}, medians of {args.repeats} fresh processes, persistent cache off")
    print(f"{'program':10s} {'first call':>10s} {'trace':>6s} {'lower':>6s} {'XLA':>6s} {'lines':>6s}")
    rows = []
    for which, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs)
               for k in ("first_s", "trace_s", "lower_s", "compile_s", "stablehlo_lines")}
        rows.append(dict(program=which, **med, runs=[{k: v for k, v in r.items() if k != "machine"}
                                                     for r in rs]))
        print(f"{which:10s} {med['first_s']:10.2f} {med['trace_s']:6.2f} {med['lower_s']:6.2f} "
              f"{med['compile_s']:6.2f} {med['stablehlo_lines']:6.0f}")
    out = _results.write_json(
        args.out or _results.default_path("one_loop_compile_probe", machine.get("id", "cpu")),
        dict(header=_results.header(machine, command=_results.command(__file__, argv),
                                    dtype="float32", classes=args.classes), rows=rows))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
