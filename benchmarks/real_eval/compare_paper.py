"""This project's runs beside the paper's 7B tables, in the paper's shape.

One block of rows per model: Base, CC, DC, BC, BC (code) (ours only), SC* and SC* (no
TR) (ours only; the paper's main tables have no SC* row; SC* keeps the trust region,
SC* (no TR) is the unconstrained bias-only fit), SC (the run's, with its guard) and SC
(paper) (ours only: the paper's fit, no guard), as mean ± s.d. over seeds in %, one
column per task in the paper's order, and Avg over the columns shown. BC is the paper's
p / mean p; BC (code) is softmax(p - mean p), what the reference code computes
(sc_jax.calibration.baselines.batch_calibration_reference). Each block ends with SC's margin over
both, "SC - BC" and "SC - BC (code)": the difference of the means per task and Avg,
and for our runs its 95% interval over seeds of the paired differences in brackets
(sc_jax.experiment.reporting.stats.seed_interval, as `sc-jax report` uses: a Student t interval
below 10 seeds, BCa bootstrap from 10; per task: the per-seed differences; Avg: the
per-seed differences averaged over the tasks). Cells are mean ± s.d. (ddof = 1). The paper's blocks
have only the first margin and no interval (the paper gives means and s.d. only). The
margins are not candidates for bold. A run whose results.json predates bc_reference
(or SC* without trust region, or SC (paper)) gets them from its per-sample records when
they are there (`sc-jax report DIR --log-samples` writes them from its score files). The paper's blocks are recomputed from
its cells over the same tasks, so that every Avg in the table averages the same
columns (`paper_tables.py` lists where the paper's own Avg differs from its cells).
The best method of each block and column is in bold.

  python benchmarks/real_eval/compare_paper.py benchmarks/real_eval/smollm2-135m/k4 \\
      benchmarks/real_eval/qwen2.5-0.5b/k4 --shots 4 --out comparison_k4.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # paper_tables, beside this file

from paper_tables import PAPER_MODELS  # noqa: E402
from sc_jax.models.named_models import display_name  # noqa: E402
from sc_jax.experiment.evaluation.results import load_results, model_description  # noqa: E402
from sc_jax.experiment.reporting.names import dataset_name  # noqa: E402
from sc_jax.experiment.reporting.report import paired_diffs, summarize  # noqa: E402
from sc_jax.experiment.reporting.samples import read_samples, rows_from_samples
from sc_jax.experiment.reporting.stats import seed_interval  # noqa: E402

HERE = Path(__file__).resolve().parent
OURS = ("base", "cc", "dc", "bc", "bc_reference", "sc_star", "sc_star_free", "sc", "sc_paper")
LABELS = {"base": "Base", "cc": "CC", "dc": "DC", "bc": "BC", "bc_reference": "BC (code)",
          "sc_star": "SC*", "sc_star_free": "SC* (no TR)", "sc": "SC (guard)", "sc_paper": "SC (paper)"}
MARGINS = ("bc", "bc_reference")  # SC minus each, per task


def margin(cells: dict, baseline: str, tasks) -> list:
    """SC's mean minus ``baseline``'s mean per task (None where either is missing)."""
    sc, other = cells.get("sc", {}), cells.get(baseline, {})
    return [sc[t][0] - other[t][0] if t in sc and t in other else None for t in tasks]


def margin_intervals(seeds: dict, baseline: str, tasks, *, seed: int = 0) -> dict | None:
    """95% intervals over seeds of SC minus ``baseline`` (paired by seed), in %:
    {task: Interval} and "avg": the interval of the per-seed difference averaged over
    ``tasks`` (the seeds every task has); each a
    :class:`sc_jax.experiment.reporting.stats.Interval` naming its method. None unless every
    task has both methods on at least three common seeds (stats.MIN_INTERVAL_SEEDS). ``seeds``: method -> task ->
    {seed: value in %}."""
    diffs = {}
    for t in tasks:
        a, b = seeds.get("sc", {}).get(t), seeds.get(baseline, {}).get(t)
        if not a or not b:
            return None
        diffs[t] = dict(zip(sorted(set(a) & set(b)), paired_diffs(a, b)))
    common = sorted(set.intersection(*(set(d) for d in diffs.values())))
    out = {t: seed_interval(list(d.values()), seed=seed) for t, d in diffs.items()}
    out["avg"] = seed_interval([np.mean([diffs[t][s] for t in tasks]) for s in common], seed=seed)
    return None if any(ci is None for ci in out.values()) else out


def blocks(run_dirs, paper: dict, shots: int, metric: str):
    """([task], [(model, {method: {task: (mean, sd or None)}}, info)]) for the runs,
    then the paper's models, over the paper's tasks (in its order) that some run has.
    ``info`` (None for the paper's blocks): ``seeds`` (method -> task -> {seed: value
    in %}, for the margins' intervals), and ``guarded`` of the run's ``fits`` SC fits."""
    ours = []
    for run in run_dirs:
        res = load_results(run)
        rows = list(res.rows)
        # A run made before bc_reference (or SC* without trust region) existed: those
        # rows from its per-sample records where `sc-jax report DIR --log-samples`
        # wrote them (from its score files, no model).
        records = read_samples(run)
        have = {r.method for r in rows}
        if records:
            rows = rows + rows_from_samples(records, [m for m in OURS if m not in have])
        summary = summarize(rows)
        described = model_description(res)
        model = display_name(str(res.model)) if described is None else described.short
        cells = {}
        for (task, k, method), stats in summary.items():
            if k == shots:
                mean, sd, _ = stats[metric]
                cells.setdefault(method, {})[task] = (100 * mean, 100 * sd)
        if not cells:
            raise ValueError(f"{run}: no results at k = {shots}")
        seeds = {}  # method -> task -> {seed: value in %}, for the margins' intervals
        for r in rows:
            if r.shots == shots:
                seeds.setdefault(r.method, {}).setdefault(r.dataset, {})[r.seed] = 100 * r.metric(metric)
        fits = [q for q in res.params if q.method == "sc" and q.shots == shots]
        info = {"seeds": seeds, "guarded": sum(bool(q.guarded) for q in fits),
                "fits": len(fits)}
        ours.append((f"{model} ({Path(run).name})", cells, info))
    key = f"{metric}_k{shots}"
    if key not in paper:
        raise ValueError(f"the paper has no {metric} table at k = {shots} "
                         f"(it has {', '.join(paper)})")
    paper_order = list(next(iter(paper[key].values()))["sc"])
    present = {t for _, cells, _ in ours for v in cells.values() for t in v}
    tasks = [t for t in paper_order if t in present]
    theirs = [(f"{PAPER_MODELS.get(model, model)} (paper)",
               {m: {t: (v["mean"], v["sd"]) for t, v in per_task.items()}
                for m, per_task in methods.items()}, None)
              for model, methods in paper[key].items()]
    return tasks, ours + theirs


def markdown(tasks, rows, metric: str, shots: int) -> str:
    head = f"| Model | Method | Avg | {' | '.join(dataset_name(t) for t in tasks)} |"
    out = [f"{metric.replace('_', '-')} (%), k = {shots}: mean ± s.d. over seeds (ours: "
           "ddof = 1); SC's margins with 95% intervals over seeds of the paired differences, "
           "the method after each (t: Student t, scipy.stats.t.interval; BCa: "
           "scipy.stats.bootstrap)", "", head,
           "|" + "---|" * (len(tasks) + 3)]
    notes = []
    for model, cells, info in rows:
        methods = [m for m in OURS if m in cells]
        best = {t: max((cells[m][t][0] for m in methods if t in cells[m]), default=None)
                for t in tasks}
        for m in methods:
            vals = [cells[m].get(t) for t in tasks]
            shown = [v[0] for v in vals if v is not None]
            avg = f"{statistics.mean(shown):.1f}" if len(shown) == len(tasks) else "-"
            strs = []
            for t, v in zip(tasks, vals):
                if v is None:
                    strs.append("-")
                    continue
                s = f"{v[0]:.1f}" + ("" if v[1] is None else f" ± {v[1]:.1f}")
                strs.append(f"**{s}**" if v[0] == best[t] else s)
            out.append(f"| {model} | {LABELS[m]} | {avg} | {' | '.join(strs)} |")
        intervals = {}
        for b in MARGINS:
            diffs = margin(cells, b, tasks)
            if all(d is None for d in diffs):
                continue
            ci = None if info is None else margin_intervals(info["seeds"], b, tasks)
            shown = [d for d in diffs if d is not None]
            avg = f"{statistics.mean(shown):+.1f}" if len(shown) == len(tasks) else "-"
            strs = ["-" if d is None else f"{d:+.1f}" for d in diffs]
            if ci is not None:
                avg += _ci(ci["avg"])
                strs = [v + _ci(ci[t]) for v, t in zip(strs, tasks)]
                intervals[b] = ci
            out.append(f"| {model} | SC - {LABELS[b]} | {avg} | {' | '.join(strs)} |")
        if info is not None:
            notes.append(block_note(model, info, intervals, tasks))
    return "\n".join(out + ([""] + notes if notes else [])) + "\n"


def _ci(ci) -> str:
    """An interval cell's bracket: " [low, high] (method)"."""
    method = "BCa" if ci.method.startswith("BCa") else ci.method
    return f" [{ci.low:+.1f}, {ci.high:+.1f}] ({method})"


def block_note(model: str, info: dict, intervals: dict, tasks) -> str:
    """One line per run: how many of its SC fits the guard made SC*, and SC against
    each baseline of ``intervals`` (baseline -> :func:`margin_intervals`) per task as
    win / tie / loss (the 95% interval over seeds above 0 / containing 0 / below 0)."""
    parts = [(f"* {model}: the guard fitted SC* at {info['guarded']} of {info['fits']} SC fits "
              "(task, seed, size)")]
    for b, ci in intervals.items():
        got = ["win" if ci[t].low > 0 else "loss" if ci[t].high < 0 else "tie" for t in tasks]
        parts.append(f"SC against {LABELS[b]}, win / tie / loss: {got.count('win')} / "
                     f"{got.count('tie')} / {got.count('loss')} of {len(tasks)} tasks")
    return "; ".join(parts) + "."


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", help="output directories of `sc-jax run`")
    p.add_argument("--shots", type=int, default=4)
    p.add_argument("--metric", choices=("macro_f1", "accuracy"), default="macro_f1")
    p.add_argument("--paper", default=str(HERE / "paper_7b_tables.json"))
    p.add_argument("--out", help="also write the table to this Markdown file")
    p.add_argument("--runs-only", action="store_true",
                   help="the runs' blocks alone, without the paper's (the task columns "
                        "are still the paper's tasks, in its order)")
    args = p.parse_args(argv)
    try:
        paper = json.loads(Path(args.paper).read_text())
        tasks, rows = blocks(args.runs, paper, args.shots, args.metric)
    except (FileNotFoundError, ValueError) as err:
        p.error(str(err))
    if args.runs_only:
        rows = rows[:len(args.runs)]
    text = markdown(tasks, rows, args.metric, args.shots)
    if args.out:  # first: a closed stdout (| head) must not lose the file
        Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
