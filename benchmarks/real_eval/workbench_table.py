"""SC against the 2024-25 calibration methods on the same scores: one table per metric
over the real-model runs, with intervals over seeds, and where SC wins and loses.

The rows of the run directories (``sc-jax run``'s results.json) form one block per
(model, k), a block's tasks from one run or several. For every method the per-seed
average over the block's tasks is formed first (the tasks every method the block
holds covers), then its mean; "SC (guard) - X" is the mean of the per-seed differences
with a 95% interval over seeds (:func:`sc_jax.experiment.reporting.stats.seed_interval`:
Student t from 3 seeds, BCa bootstrap from ten; none below 3), paired by seed. Per
task, SC (guard) wins against X where that task's interval lies above 0 and loses
where it lies below. A method a block's runs did not score (Hidden Calibration needs
hidden states that the committed caches of the first runs do not hold) is "not
scored". SC (guard) is the package's default fit: a size whose surrogate accuracy is
below chance is fitted as SC*; SC (paper) is the paper's fit, beside it.

  python benchmarks/real_eval/workbench_table.py --committed \\
      --out benchmarks/real_eval/workbench/table.md --readme README.md

(``--committed``: every run under ``benchmarks/real_eval/workbench/`` with a
results.json, :func:`committed_runs`; or name run directories.)

Writes the Markdown (``--out``), the numbers beside it as JSON (``.json``), and with
``--readme`` the macro-F1 table into README.md between its ``workbench-table`` markers
(``tests/benchmarks/test_workbench_table.py`` checks that the README's copy is this
script's output on the committed runs).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from sc_jax.experiment.evaluation.results import load_results, model_label  # noqa: E402
from sc_jax.experiment.reporting.names import dataset_name, method_name  # noqa: E402
from sc_jax.experiment.reporting.stats import seed_interval  # noqa: E402

METHODS = ("base", "cc", "dc", "bc", "sc_star", "sc", "sc_paper", "looc", "linc", "surprise", "hidden")
AGAINST = ("bc", "sc_paper", "looc", "linc", "surprise", "hidden")
# The guarded fit is named for what it is in every table, as sc_jax's display names do.
LABELS = {"sc": "SC (guard)", "sc_paper": "SC (paper)"}
README_START, README_END = "<!-- workbench-table:start -->", "<!-- workbench-table:end -->"
SURPRISE_CAVEAT = ("Surprise Calibration's network (the authors' 5.5M-parameter defaults) is trained "
                   "here on the k demonstrations' surrogate rows alone (about 60 rows at k = 4, "
                   "contexts of 1 to k - 1 demonstrations) and applied to the k-shot context: far "
                   "less data than its paper trains on, and it often predicts a single class; read "
                   "its column, and SC's margin over it, with that in mind.")


WORKBENCH = Path(__file__).resolve().parent / "workbench"


def committed_runs() -> list[Path]:
    """Every finished run under workbench/ (a directory holding results.json), sorted."""
    return sorted(p.parent for p in WORKBENCH.rglob("results.json"))


def label(method: str) -> str:
    return LABELS.get(method, method_name(method))


def blocks(runs: list[Path], metric: str) -> list[dict]:
    """The runs' rows grouped into blocks, one per (model, k) (a block's tasks may come
    from several run directories): its label, shots, the tasks used, and per method the
    per-seed averages over those tasks (``{method: [value per seed]}``)."""
    grouped: dict[tuple, list] = {}
    for run in runs:
        res = load_results(run)
        for r in res.rows:
            if r.method in METHODS:  # runs of other test sets are other blocks, never mixed
                grouped.setdefault((model_label(res), r.shots, res.test_size), []).append(r)
    return [_block(model, k, rows, metric, queries)
            for (model, k, queries), rows in sorted(grouped.items(), key=lambda kv: (kv[0][1], kv[0][0]))]


def _block(model: str, k: int, rows: list, metric: str, queries: int | None = None) -> dict:
    have = sorted({r.method for r in rows}, key=METHODS.index)
    tasks = sorted(set.intersection(*({r.dataset for r in rows if r.method == m} for m in have)))
    seeds = sorted(set.intersection(*({r.seed for r in rows if r.method == m} for m in have)))
    cell = {(r.method, r.dataset, r.seed): r.metric(metric) for r in rows}
    per_task = {m: {t: [cell[m, t, s] for s in seeds] for t in tasks} for m in have}
    per_seed = {m: [float(np.mean([cell[m, t, s] for t in tasks])) for s in seeds] for m in have}
    return {"model": model, "shots": [k], "tasks": tasks, "seeds": seeds, "queries": queries,
            "per_seed": per_seed, "per_task": per_task}


def _interval(values) -> dict | None:
    iv = seed_interval(values)
    return None if iv is None else {"low": iv.low, "high": iv.high, "method": iv.method}


def summarise(b: dict, lower_is_better: bool) -> dict:
    """Means, paired SC (guard) differences with intervals, and per task where SC wins,
    ties and loses against each method (``outcomes[m] = {"win": [...], "tie": [...],
    "loss": [...]}``)."""
    out = {"mean": {m: float(np.mean(v)) for m, v in b["per_seed"].items()}, "diff": {}, "outcomes": {}}
    if "sc" not in b["per_seed"]:
        return out
    sign = -1 if lower_is_better else 1
    for m in AGAINST:
        if m not in b["per_seed"]:
            continue
        d = np.subtract(b["per_seed"]["sc"], b["per_seed"][m])
        out["diff"][m] = {"mean": float(d.mean()), "interval": _interval(d)}
        seen = {"win": [], "tie": [], "loss": []}
        for t in b["tasks"]:
            iv = seed_interval(np.subtract(b["per_task"]["sc"][t], b["per_task"][m][t]))
            if iv is None:
                seen["tie"].append(t)
                continue
            low, high = sign * iv.low, sign * iv.high
            seen["win" if min(low, high) > 0 else "loss" if max(low, high) < 0 else "tie"].append(t)
        out["outcomes"][m] = seen
    return out


def _fmt_diff(d: dict | None) -> str:
    if d is None:
        return "not scored"
    iv = d["interval"]
    tail = " (n/a)" if iv is None else f" [{100 * iv['low']:+.1f}, {100 * iv['high']:+.1f}]"
    return f"{100 * d['mean']:+.1f}{tail}"


def table(found: list[dict], metric: str) -> list[str]:
    lower = metric == "ece"
    cols = [m for m in METHODS if any(m in b["per_seed"] for b in found)]
    against = [m for m in AGAINST if m in cols]
    head = ["block"] + [label(m) for m in cols] + [f"SC (guard) - {label(m)}" for m in against]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for b in found:
        s = b["summary"]
        best = (min if lower else max)(s["mean"].values())
        means = [("not scored" if m not in s["mean"] else
                  (f"**{100 * s['mean'][m]:.1f}**" if s["mean"][m] == best else f"{100 * s['mean'][m]:.1f}"))
                 for m in cols]
        n = len(b["tasks"])
        name = (f"{b['model']}, k = {', '.join(map(str, b['shots']))} ({n} task{'s' * (n != 1)}, "
                f"{len(b['seeds'])} seeds" + (f", {b['queries']} queries" if b.get("queries") else "") + ")")
        lines.append("| " + " | ".join([name] + means + [_fmt_diff(s["diff"].get(m)) for m in against]) + " |")
    return lines + [""]


def plainly(found: list[dict], metric: str) -> list[str]:
    """Per block, where SC (guard) wins and loses against each method, by task."""
    lines = []
    lower = metric == "ece"
    for b in found:
        above, below, tied = [], [], []
        for m, d in b["summary"]["diff"].items():
            iv = d["interval"]
            better = iv is not None and (iv["high"] < 0 if lower else iv["low"] > 0)
            worse = iv is not None and (iv["low"] > 0 if lower else iv["high"] < 0)
            (above if better else below if worse else tied).append(label(m))
        if b["summary"]["diff"]:
            lines.append(f"* {b['model']}, k = {', '.join(map(str, b['shots']))}, averaged over its "
                         f"{len(b['tasks'])} task(s): SC (guard) is better than {', '.join(above) or 'none'}; worse "
                         f"than {', '.join(below) or 'none'}; not told apart (the interval holds 0) from "
                         f"{', '.join(tied) or 'none'}.")
    for b in found:
        parts = []
        for m, seen in b["summary"]["outcomes"].items():
            won = ", ".join(map(dataset_name, seen["win"])) or "none"
            lost = ", ".join(map(dataset_name, seen["loss"])) or "none"
            parts.append(f"{label(m)}: wins on {won}; loses on {lost}; ties on {len(seen['tie'])}")
        if parts:
            lines.append(f"* {b['model']}, k = {', '.join(map(str, b['shots']))}, {metric.replace('_', '-')}, "
                         f"SC (guard) against {'; '.join(parts)}.")
    return lines + [""]


def render(runs: list[Path], metrics) -> tuple[list[str], dict, list[str]]:
    """(the Markdown lines, the numbers, the README's macro-F1 block)."""
    text, numbers, readme = [], {}, []
    for metric in metrics:
        found = blocks(runs, metric)
        for b in found:
            b["summary"] = summarise(b, metric == "ece")
        numbers[metric] = found
        how = sorted({d["interval"]["method"] for b in found for d in b["summary"]["diff"].values()
                      if d["interval"]})
        head = [f"{metric.replace('_', '-')} (%{', lower is better' if metric == 'ece' else ''}): mean over "
                f"seeds of the average over each block's tasks; SC (guard)'s paired margins with 95% "
                f"intervals over seeds ({', '.join(how) or 'none'})", ""]
        body = table(found, metric) + plainly(found, metric)
        text += head + body
        if metric == "macro_f1":
            readme = head + body
    if any("surprise" in b["per_seed"] for found in numbers.values() for b in found):
        text += [f"Surprise: {SURPRISE_CAVEAT}", ""]
        readme += [f"Surprise: {SURPRISE_CAVEAT}", ""]
    return text, numbers, readme


def replace_block(readme: str, block: list[str]) -> str:
    """``readme`` with the text between its workbench-table markers replaced."""
    start, end = readme.index(README_START), readme.index(README_END)
    return readme[:start + len(README_START)] + "\n" + "\n".join(block) + readme[end:]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="*", type=Path, help="run directories (results.json)")
    ap.add_argument("--committed", action="store_true", help="every finished run under workbench/")
    ap.add_argument("--metrics", nargs="+", default=["macro_f1", "ece"],
                    choices=["macro_f1", "accuracy", "ece"])
    ap.add_argument("--out", type=Path, help="Markdown file (JSON beside it)")
    ap.add_argument("--readme", type=Path, help="README.md whose workbench-table block to rewrite")
    args = ap.parse_args(argv)
    if args.committed:
        args.runs = args.runs + committed_runs()
    if not args.runs:
        ap.error("name run directories, or --committed")
    missing = [str(r) for r in args.runs if not (r / "results.json").is_file()]
    if missing:
        ap.error(f"no results.json in {', '.join(missing)}")
    text, numbers, readme = render(args.runs, args.metrics)
    print("\n".join(text))
    if args.out:
        args.out.write_text("\n".join(text))
        args.out.with_suffix(".json").write_text(json.dumps(numbers, indent=1) + "\n")
    if args.readme:
        args.readme.write_text(replace_block(args.readme.read_text(), readme))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
