"""SC against the 2024-25 calibration methods on the same scores: one table per metric
over the real-model runs, with intervals over seeds.

The rows of the run directories (``sc-jax run``'s results.json) form one block per
(model, k), a block's tasks from one run or several. For
every method the per-seed average over the block's tasks is formed first (tasks every
listed method covers), then its mean and a 95% interval over seeds
(:func:`sc_jax.experiment.stats.seed_interval`: Student t below ten seeds, BCa
bootstrap from ten). "SC - X" is the same interval of the per-seed differences, paired
by seed; per task, SC "wins" against X where that task's interval lies above 0 and
"loses" where it lies below (win / tie / loss). Methods a run lacks are left blank.

  python benchmarks/real_eval/workbench_table.py benchmarks/real_eval/workbench/*/k4/* \\
      --out benchmarks/real_eval/workbench/table.md

Writes the Markdown (``--out``) and the numbers beside it as JSON (``.json``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from sc_jax.experiment.names import method_name  # noqa: E402
from sc_jax.experiment.results import load_results, model_label  # noqa: E402
from sc_jax.experiment.stats import seed_interval  # noqa: E402

METHODS = ("base", "bc", "sc_star", "sc", "looc", "linc", "surprise", "hidden")
AGAINST = ("bc", "looc", "linc", "surprise", "hidden")


def blocks(runs: list[Path], metric: str) -> list[dict]:
    """The runs' rows grouped into blocks, one per (model, k) (a block's tasks may come
    from several run directories): its label, shots, the tasks used, and per method the
    per-seed averages over those tasks (``{method: [value per seed]}``)."""
    grouped: dict[tuple, list] = {}
    for run in runs:
        res = load_results(run)
        for r in res.rows:
            if r.method in METHODS:
                grouped.setdefault((model_label(res), r.shots), []).append(r)
    return [_block(model, k, rows, metric) for (model, k), rows in grouped.items()]


def _block(model: str, k: int, rows: list, metric: str) -> dict:
    have = sorted({r.method for r in rows}, key=METHODS.index)
    tasks = sorted(set.intersection(*({r.dataset for r in rows if r.method == m} for m in have)))
    seeds = sorted({r.seed for r in rows})
    cell = {(r.method, r.dataset, r.seed): r.metric(metric) for r in rows}
    per_task = {m: {t: [cell[m, t, s] for s in seeds] for t in tasks} for m in have}
    per_seed = {m: [float(np.mean([cell[m, t, s] for t in tasks])) for s in seeds] for m in have}
    return {"model": model, "shots": [k], "tasks": tasks, "seeds": seeds,
            "per_seed": per_seed, "per_task": per_task}


def _interval(values) -> dict | None:
    iv = seed_interval(values)
    return None if iv is None else {"low": iv.low, "high": iv.high, "method": iv.method}


def summarise(b: dict, lower_is_better: bool) -> dict:
    """Means, paired SC differences with intervals, and per-task win / tie / loss."""
    out = {"mean": {m: float(np.mean(v)) for m, v in b["per_seed"].items()}, "diff": {},
           "record": {}}
    if "sc" not in b["per_seed"]:
        return out
    for m in AGAINST:
        if m not in b["per_seed"]:
            continue
        d = np.subtract(b["per_seed"]["sc"], b["per_seed"][m])
        out["diff"][m] = {"mean": float(d.mean()), "interval": _interval(d)}
        sign = -1 if lower_is_better else 1
        record = [0, 0, 0]
        for t in b["tasks"]:
            iv = seed_interval(np.subtract(b["per_task"]["sc"][t], b["per_task"][m][t]))
            better = iv is not None and sign * (iv.low if sign > 0 else iv.high) > 0
            worse = iv is not None and sign * (iv.high if sign > 0 else iv.low) < 0
            record[0 if better else 2 if worse else 1] += 1
        out["record"][m] = record
    return out


def _fmt_diff(d: dict | None) -> str:
    if d is None:
        return ""
    iv = d["interval"]
    tail = "" if iv is None else f" [{100 * iv['low']:+.1f}, {100 * iv['high']:+.1f}]"
    return f"{100 * d['mean']:+.1f}{tail}"


def table(found: list[dict], metric: str) -> list[str]:
    lower = metric == "ece"
    cols = [m for m in METHODS if any(m in b["per_seed"] for b in found)]
    against = [m for m in AGAINST if m in cols]
    head = (["block"] + [method_name(m) for m in cols]
            + [f"SC - {method_name(m)}" for m in against])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for b in found:
        s = b["summary"]
        best = (min if lower else max)(s["mean"].values())
        means = [("" if m not in s["mean"] else
                  (f"**{100 * s['mean'][m]:.1f}**" if s["mean"][m] == best else f"{100 * s['mean'][m]:.1f}"))
                 for m in cols]
        n = len(b["tasks"])
        name = f"{b['model']}, k = {', '.join(map(str, b['shots']))} ({n} task{'s' * (n != 1)})"
        lines.append("| " + " | ".join([name] + means + [_fmt_diff(s["diff"].get(m)) for m in against]) + " |")
    lines.append("")
    for b in found:
        rec = b["summary"]["record"]
        parts = [f"{method_name(m)} {w} / {t} / {lo}" for m, (w, t, lo) in rec.items()]
        if parts:
            lines.append(f"* {b['model']}, k = {', '.join(map(str, b['shots']))}: SC against each, "
                         f"win / tie / loss over tasks: {'; '.join(parts)}.")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run directories (results.json)")
    ap.add_argument("--metrics", nargs="+", default=["macro_f1", "ece"],
                    choices=["macro_f1", "accuracy", "ece"])
    ap.add_argument("--out", type=Path, help="Markdown file (JSON beside it)")
    args = ap.parse_args(argv)
    missing = [str(r) for r in args.runs if not (r / "results.json").is_file()]
    if missing:
        ap.error(f"no results.json in {', '.join(missing)}")
    text, numbers = [], {}
    for metric in args.metrics:
        found = blocks(args.runs, metric)
        for b in found:
            b["summary"] = summarise(b, metric == "ece")
        numbers[metric] = found
        how = sorted({d["interval"]["method"] for b in found for d in b["summary"]["diff"].values()
                      if d["interval"]})
        text += [f"{metric.replace('_', '-')} (%): mean over seeds of the average over each "
                 f"block's tasks; SC's paired margins with 95% intervals over seeds "
                 f"({', '.join(how) or 'none'})", ""]
        text += table(found, metric) + [""]
    print("\n".join(text))
    if args.out:
        args.out.write_text("\n".join(text))
        args.out.with_suffix(".json").write_text(json.dumps(numbers, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
