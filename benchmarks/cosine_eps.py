"""The trust region's smoothing, measured: SC refitted on finished runs' scores with
other values of ``COSINE_EPS`` (docs/calibration.md, "The trust region's smoothing").

The mean cosine of the trust region is computed with ``w_c / sqrt(b_c^2 + w_c^2 +
eps^2)``, eps = ``sc_jax.calibration.objective.COSINE_EPS`` (1e-3). For each run
directory and each eps, a fresh process patches the constant (in the modules that
read it when the solver is traced) and runs ``sc-jax ablate DIR --lambda-inv run
--guard none`` (no model: the run's saved scores), which refits the paper's SC (no
guard, the run's lambda_inv and tau) for every (dataset, seed, size) and scores the
test queries. Against eps = 1e-3, per run and eps:

* the SC rows' macro-F1 (the ``lambda_trust`` study's "trust region on" row, the
  paper's SC at the run's lambda_inv), their largest and mean absolute change, and
  the (dataset, seed) pairs whose macro-F1 moved;
* the fits' statuses that changed, and the largest change of a fit's mean w among
  the fits CONVERGED with both values (``diagnostics.csv``).

No persistent compilation cache or exported program is used (they are keyed by the
sources, not by the patched constant). Writes
``benchmarks/results/cosine_eps/<machine>.json`` and prints the table.

  python benchmarks/cosine_eps.py benchmarks/real_eval/workbench/smollm2-135m_k4 \\
      benchmarks/real_eval/workbench/qwen2.5-0.5b_k4
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import _results

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = 1e-3
SC_ROW = ("lambda_trust", "trust region on")
# The modules that read COSINE_EPS when the solver is traced (each imports the name).
_READERS = ("sc_jax.calibration.objective", "sc_jax.calibration.solvers.geometry",
            "sc_jax.calibration.solvers.charts", "sc_jax.calibration.solvers.multistart")
_CHILD = """
import importlib, sys
sys.path.insert(0, {root!r})
eps = {eps!r}
for name in {readers!r}:
    importlib.import_module(name).COSINE_EPS = eps
from sc_jax.cli import main
sys.exit(main(["ablate", {run!r}, "--lambda-inv", "run", "--guard", "none", "--out", {out!r},
               "--quiet", "--overwrite"]))
"""


def ablate(run: Path, eps: float, out: Path) -> tuple[dict, dict]:
    """``(macro-F1 per (dataset, seed) of the paper's SC, (status, mean w) per (dataset,
    seed, size))`` of ``sc-jax ablate`` on ``run`` with COSINE_EPS = eps."""
    code = _CHILD.format(root=str(ROOT), eps=eps, readers=_READERS, run=str(run), out=str(out))
    env = dict(os.environ, SC_JAX_XLA_CACHE="")
    subprocess.run([sys.executable, "-c", code], check=True, env=env, stdout=subprocess.DEVNULL)
    with open(out / "ablation.csv") as f:
        f1 = {(r["dataset"], int(r["seed"])): float(r["macro_f1"]) for r in csv.DictReader(f)
              if r["study"] == SC_ROW[0] and r["setting"].endswith(SC_ROW[1])}
    with open(out / "diagnostics.csv") as f:
        fits = {(r["dataset"], int(r["seed"]), int(r["size"])): (r["status"], float(r["mean_w"] or "nan"))
                for r in csv.DictReader(f)}
    return f1, fits


def compare(base: tuple[dict, dict], other: tuple[dict, dict]) -> dict:
    """The changes of ``other`` against ``base`` (each :func:`ablate`'s pair)."""
    (f1_a, fits_a), (f1_b, fits_b) = base, other
    diffs = {key: 100.0 * (f1_b[key] - f1_a[key]) for key in f1_a}
    moved = sorted(f"{d} seed {s}: {v:+.2f}" for (d, s), v in diffs.items() if abs(v) > 1e-9)
    status = [f"{d} seed {s} size {n}: {fits_a[k][0]} -> {fits_b[k][0]}"
              for k in sorted(fits_a) if fits_a[k][0] != fits_b[k][0] for d, s, n in [k]]
    # Over the fits CONVERGED with both values: an UNBOUNDED fit's end point is any point
    # far enough along its run-off.
    dw = [abs(fits_b[k][1] - fits_a[k][1]) for k in fits_a
          if fits_a[k][0] == fits_b[k][0] == "CONVERGED"] or [0.0]
    return dict(settings=len(diffs), max_abs_f1=max(map(abs, diffs.values())),
                mean_abs_f1=sum(map(abs, diffs.values())) / len(diffs), moved=moved,
                fits=len(fits_a), status_changes=status, max_abs_mean_w=max(dw))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="directories of finished sc-jax runs")
    p.add_argument("--eps", nargs="+", type=float, default=[1e-2, 1e-4, 1e-5],
                   help=f"values compared with {DEFAULT:g} (default: 1e-2 1e-4 1e-5)")
    p.add_argument("--out", help="the JSON (default: results/cosine_eps/<machine>.json)")
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for run in args.runs:
            base = ablate(run, DEFAULT, Path(tmp) / f"{run.name}_base")
            for eps in args.eps:
                rows.append(dict(run=str(run.relative_to(ROOT) if run.is_absolute() else run), eps=eps,
                                 **compare(base, ablate(run, eps, Path(tmp) / f"{run.name}_{eps:g}"))))
    print("| run | eps | settings | macro-F1 change, max / mean (points) | settings moved | "
          "fits | status changes | max change of mean w (converged fits) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {Path(r['run']).name} | {r['eps']:g} | {r['settings']} | {r['max_abs_f1']:.2f} / "
              f"{r['mean_abs_f1']:.2f} | {len(r['moved'])} | {r['fits']} | {len(r['status_changes'])} | "
              f"{r['max_abs_mean_w']:.2g} |")
    machine = _results.machine("cpu")
    out = _results.write_json(
        args.out or _results.default_path("cosine_eps", machine["id"]),
        dict(header=_results.header(machine, command=_results.command(__file__, argv), dtype="the run's"),
             default=DEFAULT, rows=rows))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
