"""What a user waits for the compiler: each entry point's first call in a fresh process.

For every entry point, in fresh Python processes (JAX's in-memory caches empty):

* ``first_s``: the first call's wall time with the persistent compilation cache off,
  split into JAX's own stage timings (``jax.monitoring``: ``trace_s``, ``lower_s``,
  ``compile_s``, summed over every program the call compiled) and the programs
  compiled; median over ``--repeats`` processes;
* ``cached_s``: the first call in a second process served by a persistent cache that
  one process before it filled (its stages and cache hits beside it);
* ``stablehlo_lines``: the size of the program (a ``calibrate`` entry's; the eager
  call's is its jitted body, the same program).

The entry points:

* ``calibrate-{eager,jit,vmap,grad,jacfwd}-n{2,4,6}``: ``sc_jax.calibrate`` on one
  k = 8, size-1 problem (56 rows; 8 problems of it under ``vmap``), float32 (the
  derivatives in float64, as a user checking gradients would), default settings;
* ``calibrate-vmap-25`` and ``scipy-loop-25``: ``jit(vmap(calibrate))`` on
  bench_cold_call's 25 problems (n = 4, 336 rows each), and the SciPy trust-constr loop
  on them (``numpy_fit.fit(solver="scipy")``, float64), each cold;
* ``fit_batch``: ``numpy_fit.fit_batch`` on the experiment's default batch (two
  classes, k = 8, sizes 1..5 x 5 seeds); ``fit_batch-96``: the same batch at
  lambda_inv = 1, where each problem is solved from NONCONVEX_STARTS (96) starts;
* ``run``: ``sc-jax run`` on ``random:tiny-llama`` (k = 4, 1 seed, 16 test queries,
  a 40-row data file made here): its fits' compile seconds and programs
  (``fit_compile_s``) and the engine's (``compile_s``, ``model_programs``), from
  results.json's timing.

``--baseline REV`` measures a git revision beside the working tree in the same run,
interleaved (base, then this tree, per entry and repeat), from a worktree made under
the system's temporary folder: "before" and "after" on one idle machine.

  python benchmarks/bench_compile.py                      # results/bench_compile/<machine>.json
  python benchmarks/bench_compile.py --baseline HEAD~3 --repeats 3
  python benchmarks/bench_compile.py --entries calibrate-jit-n2 fit_batch --repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _results

ROOT = Path(__file__).resolve().parents[1]
MODES = ("eager", "jit", "vmap", "grad", "jacfwd")
CLASSES = (2, 4, 6)
ENTRIES = tuple(f"calibrate-{m}-n{n}" for n in CLASSES for m in MODES) + (
    "calibrate-vmap-25", "scipy-loop-25", "fit_batch", "fit_batch-96", "run")


# ----------------------------------------------------------------- the child process


def _calibrate_call(mode: str, n: int):
    """``(call, lower)``: the entry's first call, and a function giving its StableHLO."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    import sc_jax  # noqa: PLC0415
    from sc_jax.calibration.synthetic import World  # noqa: PLC0415

    if mode in ("grad", "jacfwd"):
        jax.config.update("jax_enable_x64", True)
    dtype = np.float64 if mode in ("grad", "jacfwd") else np.float32

    def problem(seed):
        world = World(n, (1.0,) * (n - 1), beta=(0.2,) * (n - 1), seed=seed)
        x, y, g = world.surrogate(8, (1,))[1]
        return x.astype(dtype), y, g

    x, y, g = problem(0)
    cal = lambda a, b, c: sc_jax.calibrate(a, b, c, num_queries=8)  # noqa: E731
    if mode == "eager":
        fn, args = None, (x, y, g)
    elif mode == "jit":
        fn, args = cal, (x, y, g)
    elif mode == "vmap":
        stacked = [problem(s) for s in range(8)]
        fn, args = jax.vmap(cal), tuple(np.stack([p[j] for p in stacked]) for j in range(3))
    else:
        def loss(a):
            fit = cal(a, y, g)
            return jnp.sum(fit.b) + jnp.sum(fit.w)
        fn, args = (jax.grad if mode == "grad" else jax.jacfwd)(loss), (x,)

    def call():
        out = cal(*args) if fn is None else jax.jit(fn)(*args)
        return jax.block_until_ready(out)

    def lower():  # the eager call's program is calibrate's jitted body: the jit entry's
        return jax.jit(fn or cal).lower(*args).as_text()

    return call, lower


def _batch25_call(scipy: bool):
    """bench_cold_call's calibrate case: 25 problems of n = 4 classes, 336 rows each
    (k = 8, size 2, 25 seeds), float32, under ``jit(vmap(calibrate))``; or the SciPy
    trust-constr loop on them (``scipy``), its JAX derivatives compiled in the process."""
    import jax  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    import sc_jax  # noqa: PLC0415
    from sc_jax.calibration import numpy_fit  # noqa: PLC0415
    from sc_jax.calibration.synthetic import World  # noqa: PLC0415

    probs = [World(4, (1.0, 0.8, 1.2), beta=(0.3, -0.2, 0.1), seed=seed).surrogate(8, (2,))[2]
             for seed in range(25)]
    if scipy:
        return lambda: [int(numpy_fit.fit(*p, solver="scipy").status) for p in probs], None
    x, y, g = (np.stack([p[j] for p in probs]) for j in range(3))
    fn = jax.vmap(lambda a, b, c: sc_jax.calibrate(a, b, c, num_queries=8))
    args = (x.astype(np.float32), y, g)
    return (lambda: jax.block_until_ready(jax.jit(fn)(*args)),
            lambda: jax.jit(fn).lower(*args).as_text())


def _fit_batch_call(multistart: bool = False):
    """fit_batch on 25 problems (n = 2, k = 8, sizes 1-5, 5 seeds), float32; with
    ``multistart`` at lambda_inv = 1, where fit_batch solves each from
    NONCONVEX_STARTS (96) starts."""
    from sc_jax.calibration import numpy_fit  # noqa: PLC0415
    from sc_jax.calibration.synthetic import World  # noqa: PLC0415

    probs = []
    for seed in range(5):
        sur = World(2, (1.0,), beta=(0.3,), seed=seed).surrogate(8, range(1, 6))
        probs += [sur[i] for i in range(1, 6)]
    kwargs = {"lambda_inv": 1.0} if multistart else {}
    return lambda: [int(f.status) for f in numpy_fit.fit_batch(probs, **kwargs)], None


class _Stages:
    """JAX's compile stages while active, from ``jax.monitoring`` (here, not
    sc_jax's meter: the baseline tree measured may predate it): seconds per stage,
    programs compiled, persistent-cache hits."""

    NAMES = {"/jax/core/compile/jaxpr_trace_duration": "trace",
             "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
             "/jax/core/compile/backend_compile_duration": "compile"}

    def __init__(self):
        self.seconds = dict.fromkeys(self.NAMES.values(), 0.0)
        self.programs = self.hits = 0

    def _event(self, name, **_):
        self.hits += name == "/jax/compilation_cache/cache_hits"

    def _duration(self, name, secs, **_):
        if name in self.NAMES:
            self.seconds[self.NAMES[name]] += secs
            self.programs += self.NAMES[name] == "compile"

    def __enter__(self):
        import jax  # noqa: PLC0415

        jax.monitoring.register_event_listener(self._event)
        jax.monitoring.register_event_duration_secs_listener(self._duration)
        return self

    def __exit__(self, *exc):
        import jax  # noqa: PLC0415

        jax.monitoring.unregister_event_listener(self._event)
        jax.monitoring.unregister_event_duration_listener(self._duration)


def child(entry: str) -> None:
    sys.path.insert(0, str(Path.cwd()))  # the tree measured: this one or the baseline's
    from sc_jax.cli.process import enable_compilation_cache  # noqa: PLC0415

    enable_compilation_cache()  # SC_JAX_XLA_CACHE: "" off, else the cache to use
    if entry.endswith("-25"):
        call, lower = _batch25_call(entry.startswith("scipy"))
    elif entry.startswith("calibrate-"):
        _, mode, n = entry.split("-")
        call, lower = _calibrate_call(mode, int(n[1:]))
    else:
        call, lower = _fit_batch_call(entry == "fit_batch-96")
    with _Stages() as meter:
        t = time.perf_counter()
        out = call()
        first = time.perf_counter() - t
    status = getattr(out, "status", out)
    import numpy as np  # noqa: PLC0415

    derivative = "-grad-" in entry or "-jacfwd-" in entry
    row = dict(first_s=first, **{f"{k}_s": v for k, v in meter.seconds.items()},
               programs=meter.programs - meter.hits, cache_hits=meter.hits,
               statuses=None if derivative else sorted({int(s) for s in np.ravel(np.asarray(status))}))
    if lower is not None:
        row["stablehlo_lines"] = lower().count("\n")
    import _results as res  # noqa: PLC0415

    row["machine"] = res.jax_machine()
    print(json.dumps(row))


def run_entry(tree: Path, cache: str) -> dict:
    """``sc-jax run`` on random:tiny-llama in ``tree``: its timing from results.json."""
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "films.jsonl"
        data.write_text("".join(json.dumps({"text": f"a fine film number {j}", "label": j % 2})
                                + "\n" for j in range(40)))
        env = dict(os.environ, SC_JAX_XLA_CACHE=cache, PYTHONPATH=str(tree))
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "sc_jax.cli", "run", "--model", "random:tiny-llama",
                        "--shots", "4", "--seeds", "1", "--test-size", "16", "--data-file",
                        str(data), "--out", str(Path(tmp) / "out"), "--quiet"],
                       cwd=tree, env=env, check=True, capture_output=True, text=True)
        wall = time.perf_counter() - t
        timing = json.loads((Path(tmp) / "out" / "results.json").read_text())["timing"]
    return dict(first_s=wall, fit_compile_s=timing["fit_compile_s"],
                engine_compile_s=timing["compile_s"], model_programs=timing["model_programs"],
                engine_programs=timing["programs"], engine_cache_hits=timing["cache_hits"],
                total_s=timing["total_s"])


# ----------------------------------------------------------------- the parent


def measure(entry: str, tree: Path, cache: str) -> dict:
    if entry == "run":
        return run_entry(tree, cache)
    env = dict(os.environ, SC_JAX_XLA_CACHE=cache, JAX_PLATFORMS=os.environ.get(
        "JAX_PLATFORMS", "cpu"), PYTHONPATH=os.pathsep.join([str(tree), str(Path(__file__).parent)]))
    out = subprocess.run([sys.executable, __file__, "--child", entry], cwd=tree, env=env,
                         capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{entry} in {tree} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _median(rows: list[dict]) -> dict:
    keys = [k for k, v in rows[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    med = {k: statistics.median(r[k] for r in rows) for k in keys}
    med["runs_first_s"] = [r["first_s"] for r in rows]
    for k, v in rows[0].items():
        med.setdefault(k, v)
    return med


def worktree(rev: str) -> Path:
    sha = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.strip()
    path = Path(tempfile.gettempdir()) / f"sc_jax_bench_compile_{sha}"
    if not path.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(path), sha], cwd=ROOT,
                       check=True, capture_output=True)
    return path


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--child", choices=ENTRIES, help=argparse.SUPPRESS)
    p.add_argument("--entries", nargs="+", choices=ENTRIES, default=list(ENTRIES))
    p.add_argument("--repeats", type=int, default=3,
                   help="fresh processes per entry (cache off); the median is reported")
    p.add_argument("--baseline", default=None,
                   help="a git revision measured beside the working tree, interleaved")
    p.add_argument("--no-cached", action="store_true",
                   help="skip the second-process (persistent cache) measurement")
    p.add_argument("--out", default=None, type=_results.result_file,
                   help="JSON file (default: benchmarks/results/bench_compile/<machine>.json)")
    args = p.parse_args(argv)
    if args.child:
        return child(args.child)
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    trees = {"after": ROOT}
    if args.baseline:
        trees = {"before": worktree(args.baseline), "after": ROOT}
    rows, machine = [], None
    print(f"{'entry':24s}" + "".join(f" {s:>7s} first  trace  lower compile  progs  cached lines"
                                     for s in trees), flush=True)
    for entry in args.entries:
        got = {side: [] for side in trees}
        for _ in range(args.repeats):
            for side, tree in trees.items():
                got[side].append(measure(entry, tree, ""))
        row = dict(entry=entry)
        line = f"{entry:24s}"
        for side, tree in trees.items():
            med = _median(got[side])
            if not args.no_cached:
                with tempfile.TemporaryDirectory() as cache:
                    measure(entry, tree, cache)
                    warm = measure(entry, tree, cache)
                med["cached"] = warm
            machine = machine or med.pop("machine", None)
            med.pop("machine", None)
            row[side] = med
            c = med.get("cached", {})
            line += (f" {side:>7s} {med['first_s']:5.2f} {med.get('trace_s', 0):6.2f} "
                     f"{med.get('lower_s', 0):6.2f} {med.get('compile_s', med.get('fit_compile_s', 0)):7.2f} "
                     f"{med.get('programs', med.get('engine_programs', 0)):6.0f} "
                     f"{c.get('first_s', float('nan')):7.2f} {med.get('stablehlo_lines', 0):5.0f}")
        rows.append(row)
        print(line, flush=True)
    # The run entry's child is sc-jax itself, which reports no machine: this process's.
    machine = machine or _results.jax_machine()
    out = _results.write_json(
        args.out or _results.default_path("bench_compile", machine.get("id", "cpu")),
        dict(header=_results.header(machine, command=_results.command(__file__, argv),
                                    dtype="float32 (grad, jacfwd: float64)",
                                    baseline=args.baseline),
             rows=rows))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
