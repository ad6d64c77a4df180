"""Tables and plots from a run's ``results.json`` (no model needed).

* ``table.md``: macro-F1, accuracy and ECE, mean ± sample standard deviation over
  seeds (ddof = 1; one seed: the value alone), one table per shot count, methods as
  rows and datasets (plus their average) as columns, like the paper's Tables 2-4;
  macro-F1 and accuracy again as means with 95% intervals over seeds; then SC against
  the best baseline, paired over seeds: a 95% interval of the per-seed differences and
  a win / tie / loss verdict with at least :data:`MIN_SEEDS_FOR_VERDICT` seeds, the
  per-seed differences and no verdict with fewer. Every interval and test is SciPy's
  (:mod:`sc_jax.experiment.reporting.stats`) and named in the table.
* ``results.tex``, ``results_accuracy.tex``, ``results_ece.tex``: the macro-F1,
  accuracy and ECE tables in LaTeX (booktabs), one ``tabular`` per shot count.
* ``results.csv``: one row per dataset x model x shots x method x seed; ``model`` is
  the model loaded, by its resolved name, and ``model_source`` what was read.
* ``f1_bars.png`` and ``sc_params.png`` (and ``.pdf``, ``.svg``): the paper's Figures
  3 and 4; with per-sample records, ``reliability.png``: a reliability diagram per
  method (:mod:`sc_jax.experiment.reporting.figures`).

``sc-jax report DIR`` calls :func:`write_report` on ``DIR/results.json``
(read and checked by :func:`sc_jax.experiment.evaluation.results.load_results`), which puts its
files in place all together or not at all (:mod:`sc_jax.experiment.evaluation.staging`).
:func:`mean_std_table` draws the mean ± s.d. tables, here and in the ablation report.
Datasets and methods appear under their display names (:mod:`sc_jax.experiment.reporting.names`).
"""

from __future__ import annotations

import csv
import logging
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from sc_jax.calibration import methods as calibration_methods
from sc_jax.experiment.evaluation.results import METHOD_NAMES, METRICS, ResultRow, RunResults, load_results, model_label
from sc_jax.experiment.evaluation.staging import Staging
from sc_jax.experiment.reporting.figures import (can_plot, plot_f1_bars, plot_params,
                                                 plot_reliability)
from sc_jax.experiment.reporting.names import dataset_name, method_name, order_methods
from sc_jax.experiment.reporting.samples import read_samples, rows_from_samples, samples_markdown
from sc_jax.experiment.reporting.stats import CONFIDENCE, MIN_INTERVAL_SEEDS, mean_sd, seed_interval
from sc_jax.models.named_models import display_name

log = logging.getLogger(__name__)

CSV_FIELDS = ("dataset", "model", "shots", "method", "seed", "accuracy", "macro_f1", "ece",
              "model_source")


def summarize(rows: Iterable[ResultRow]) -> dict[tuple, dict]:
    """``{(dataset, shots, method): {metric: (mean, sd, n_seeds)}}``, sd the sample
    standard deviation over seeds (ddof = 1; NaN for one seed; :func:`stats.mean_sd`)."""
    groups = defaultdict(list)
    for r in rows:
        groups[(r.dataset, r.shots, r.method)].append(r)
    return {key: {m: mean_sd([r.metric(m) for r in rs]) for m in METRICS}
            for key, rs in groups.items()}


# The baselines SC is compared with are the paper's (``Method.paper_baseline``). BC as
# the reference code computes it (bc_reference) is weaker on multi-class tasks and
# reported beside BC, but never chosen as the best baseline.


def _by_task(rows: Iterable[ResultRow], metric: str) -> dict:
    """(dataset, shots) -> method -> {seed: value}."""
    by = defaultdict(dict)
    for r in rows:
        by[(r.dataset, r.shots)].setdefault(r.method, {})[r.seed] = r.metric(metric)
    return by


def paired_diffs(a: dict, b: dict) -> np.ndarray:
    """d_s = a[s] - b[s] over the seeds both dicts ({seed: value}) have, in seed order."""
    return np.array([a[x] - b[x] for x in sorted(set(a) & set(b))], np.float64)


#: The fewest paired seeds with which the tables give a 95% interval and a win / tie /
#: loss verdict. With one seed there is no spread, and with two the t interval has one
#: degree of freedom (t = 12.7): such comparisons list the per-seed differences and no
#: verdict. With 3 to about 5 seeds the t interval is wide and rests on the
#: differences being roughly normal: read it as such.
MIN_SEEDS_FOR_VERDICT = 3


def _paired(a: dict, b: dict, seed: int) -> dict:
    """Mean of d_s = a_s - b_s over the seeds both have, the per-seed ``diffs``, and,
    with at least :data:`MIN_SEEDS_FOR_VERDICT` seeds, its 95% interval over seeds
    (:func:`stats.seed_interval`: ``ci_method`` names it) and outcome (see
    :func:`sc_against_best_baseline`); with fewer, ``ci_low``, ``ci_high``,
    ``ci_method`` and ``outcome`` are None."""
    diff = paired_diffs(a, b)
    out = dict(seeds=diff.size, diff=float(diff.mean()), diffs=[float(x) for x in diff],
               ci_low=None, ci_high=None, ci_method=None, outcome=None)
    if diff.size >= MIN_SEEDS_FOR_VERDICT:
        ci = seed_interval(diff, seed=seed)
        out.update(ci_low=ci.low, ci_high=ci.high, ci_method=ci.method,
                   outcome="win" if ci.low > 0 else ("loss" if ci.high < 0 else "tie"))
    return out


def _interval(p: dict) -> str:
    """A comparison's interval cell: the 95% interval and its method, or, with too few
    seeds for one, the per-seed differences (in %)."""
    if p["outcome"] is None:
        return "per seed " + ", ".join(f"{100 * d:+.1f}" for d in p["diffs"])
    return f"[{100 * p['ci_low']:+.1f}, {100 * p['ci_high']:+.1f}] ({p['ci_method']})"


def _no_verdict(p: dict) -> str:
    return f"none ({p['seeds']} seed{'s' * (p['seeds'] != 1)}; needs {MIN_SEEDS_FOR_VERDICT})"


def sc_against_best_baseline(rows, metric: str = "macro_f1", *, seed: int = 0) -> list[dict]:
    """SC minus the best baseline, per (dataset, shots), paired over seeds.

    The best baseline is the one of Base, CC, DC and BC (the paper's p / mean p;
    the methods registered with ``paper_baseline``, never BC as the reference code
    computes it) present with the
    highest mean ``metric`` over seeds on that (dataset, shots): chosen on the test
    results themselves, which favours the baseline. Per seed s, d_s = SC_s - best_s
    (the same test set and demonstrations); the 95% interval of the mean of d is
    :func:`stats.seed_interval`'s (a t interval below ten seeds, BCa bootstrap from ten,
    its resamples drawn from ``seed``; ``ci_method`` names it). The outcome is "win"
    if the interval lies above 0, "loss" if below, else "tie". With fewer than
    :data:`MIN_SEEDS_FOR_VERDICT` seeds there is no interval and no outcome (None):
    only the per-seed differences ``diffs``. Returns one dict per (dataset, shots) with
    both methods' seeds.
    """
    out, subject = [], calibration_methods.subject()
    for (d, k), methods in sorted(_by_task(rows, metric).items()):
        if subject not in methods:
            continue
        candidates = [m for m in calibration_methods.paper_baselines() if m in methods]
        if not candidates:
            continue
        best = max(candidates, key=lambda m: np.mean(list(methods[m].values())))
        out.append(dict(dataset=d, shots=k, best_baseline=best,
                        **_paired(methods[subject], methods[best], seed)))
    return out


def sc_against(rows, baseline: str, metric: str = "macro_f1", *, seed: int = 0) -> list[dict]:
    """SC minus one named ``baseline`` (e.g. "bc" and "bc_reference"), per (dataset,
    shots) where both ran, paired over seeds as in :func:`sc_against_best_baseline`."""
    subject = calibration_methods.subject()
    return [dict(dataset=d, shots=k, baseline=baseline,
                 **_paired(methods[subject], methods[baseline], seed))
            for (d, k), methods in sorted(_by_task(rows, metric).items())
            if subject in methods and baseline in methods]


def _best_baseline_table(rows) -> list[str]:
    """Markdown: :func:`sc_against_best_baseline` per (dataset, shots), and the win /
    tie / loss count per shot count; empty without SC and a baseline."""
    paired = sc_against_best_baseline(rows)
    if not paired:
        return []
    out = ["## SC minus the best baseline (macro-F1, paired over seeds)", "",
           ("The best of Base, CC, DC and BC (the paper's) by mean on the same test data; "
            "SC - best is the mean over seeds of the per-seed difference; its 95% interval "
            f"over seeds: {_CI_METHODS} Win / loss when it excludes 0. With fewer than "
            f"{MIN_SEEDS_FOR_VERDICT} seeds no interval or verdict is given, only the "
            "per-seed differences."), "",
           "| Dataset | k | best baseline | SC - best | 95% CI | outcome |",
           "|---|---|---|---|---|---|"]
    for p in paired:
        out.append(f"| {dataset_name(p['dataset'])} | {p['shots']} | "
                   f"{method_name(p['best_baseline'])} | "
                   f"{100 * p['diff']:+.1f} | {_interval(p)} | "
                   f"{p['outcome'] or _no_verdict(p)} |")
    for k in sorted({p["shots"] for p in paired}):
        got = [p["outcome"] for p in paired if p["shots"] == k]
        line = (f"\n{k}-shot win / tie / loss over datasets: {got.count('win')} / "
                f"{got.count('tie')} / {got.count('loss')}")
        if None in got:
            line += (f" ({got.count(None)} without a verdict: fewer than "
                     f"{MIN_SEEDS_FOR_VERDICT} seeds)")
        out.append(line)
    return out + [""]


def _margin_table(rows) -> list[str]:
    """Markdown: SC minus BC as the paper defines it and as its code computes it, per
    (dataset, shots); empty unless the rows hold SC and both forms of BC."""
    paired = calibration_methods.paired()  # BC and BC (code)
    pairs = {b: {(p["dataset"], p["shots"]): p for p in sc_against(rows, b)} for b in paired}
    keys = sorted(set.intersection(*(set(v) for v in pairs.values()))) if len(paired) == 2 else []
    if not keys:
        return []
    out = ["## SC minus BC, as the paper defines it and as its code computes it (macro-F1)", "",
           ("BC: p / mean p over the test batch (the paper; the best-baseline comparison "
            "above uses it). BC (code): softmax(p - mean p), the reference code's. Paired "
            f"over seeds, 95% interval ({_CI_METHODS} With fewer than "
            f"{MIN_SEEDS_FOR_VERDICT} seeds: the per-seed differences.)"), "",
           "| Dataset | k | SC - BC | 95% CI | SC - BC (code) | 95% CI |",
           "|---|---|---|---|---|---|"]
    for key in keys:
        a, b = (pairs[m][key] for m in paired)
        out.append(f"| {dataset_name(key[0])} | {key[1]} | {100 * a['diff']:+.1f} | "
                   f"{_interval(a)} | "
                   f"{100 * b['diff']:+.1f} | {_interval(b)} |")
    return out + [""]


def mean_std_table(label: str, columns: Sequence[str],
                   rows: Iterable[tuple[str, Mapping[str, tuple[float, float, int]]]], *,
                   missing: str = "–", lone_seed_alone: bool = True) -> list[str]:
    """Markdown lines of one table like the paper's Tables 2-4: a header
    ``| label | columns... | Average |``, then per ``(name, cells)`` of ``rows`` one
    line, ``cells`` mapping a column to its (mean, std, n_seeds) over seeds (fractions;
    shown in %, "mean ± sd"). A column without a cell shows ``missing``; Average is
    the mean of the row's means when every column has one, else ``missing``. With
    ``lone_seed_alone`` a single seed's value stands alone: it has no spread, and
    "± 0.0" would say it had; a NaN sd (one seed under ddof = 1) always does."""
    out = [f"| {label} | " + " | ".join(columns) + " | Average |",
           "|---|" + "---|" * (len(columns) + 1)]
    for name, cells in rows:
        shown, means = [], []
        for c in columns:
            if c not in cells:
                shown.append(missing)
                continue
            mean, std, n = cells[c]
            means.append(mean)
            alone = (lone_seed_alone and n <= 1) or not np.isfinite(std)
            shown.append(f"{100 * mean:.1f}" if alone else f"{100 * mean:.1f} ± {100 * std:.1f}")
        avg = f"{100 * np.mean(means):.1f}" if len(means) == len(columns) else missing
        out.append(f"| {name} | " + " | ".join(shown) + f" | {avg} |")
    return out


# What a cell of the main tables holds.
_CELLS = ("mean ± s.d. (ddof=1) over the seeds, in %: the sample standard deviation of the "
          "per-seed values, which spreads the seeds, not a confidence interval; a single "
          "seed's value stands alone. Average: the mean of the dataset means.")

# How the intervals over seeds are made (stats.seed_interval).
_CI_METHODS = ("Student t interval (scipy.stats.t.interval, standard error scipy.stats.sem) "
               "below 10 seeds, BCa bootstrap (scipy.stats.bootstrap, 9,999 resamples) from "
               "10; the heading names the method, or each cell where they differ.")

_METRIC_TITLES = {"macro_f1": "Macro-F1", "accuracy": "Accuracy",
                  "ece": "ECE (top-label, 10 bins; lower is better)"}


def _per_seed(rows, metric: str) -> dict:
    """(dataset, shots, method) -> {seed: value}; and (None, shots, method) -> {seed:
    the mean over datasets} for the seeds that have every dataset of that shot count."""
    out = defaultdict(dict)
    for r in rows:
        out[(r.dataset, r.shots, r.method)][r.seed] = r.metric(metric)
    datasets = defaultdict(set)
    for r in rows:
        datasets[r.shots].add(r.dataset)
    for (d, k, m) in list(out):
        seeds = set.intersection(*(set(out.get((e, k, m), {})) for e in datasets[k]))
        out[(None, k, m)] = {s: float(np.mean([out[(e, k, m)][s] for e in datasets[k]]))
                             for s in sorted(seeds)}
    return out


def interval_table(rows, metric: str, shots: int, methods, datasets) -> tuple[list[str], set]:
    """Markdown lines and the interval methods used: per method (rows) and dataset plus
    the per-seed average over datasets (columns), the mean over seeds in % and its 95%
    interval (:func:`stats.seed_interval`), each cell naming its interval's method
    unless every cell's is the same (the caller names it then); fewer than
    :data:`stats.MIN_INTERVAL_SEEDS` seeds: the mean ± s.d. (ddof = 1) and "interval
    n/a (2 seeds)", or one seed's value alone."""
    per_seed = _per_seed(rows, metric)
    cols = list(datasets) + [None]
    cells = {(m, d): list(per_seed.get((d, shots, m), {}).values()) for m in methods for d in cols}
    cis = {key: seed_interval(vals) for key, vals in cells.items() if vals}
    used = {ci.method for ci in cis.values() if ci is not None}
    out = ["| Method | " + " | ".join(dataset_name(d) for d in datasets) + " | Average |",
           "|---|" + "---|" * len(cols)]
    for m in methods:
        shown = []
        for d in cols:
            if not cells[m, d]:
                shown.append("–")
                continue
            vals = cells[m, d]
            mean, ci = 100 * float(np.mean(vals)), cis[m, d]
            tag = f" ({ci.method})" if ci is not None and len(used) > 1 else ""
            if ci is not None:
                shown.append(f"{mean:.1f} [{100 * ci.low:.1f}, {100 * ci.high:.1f}]{tag}")
            elif len(vals) > 1:  # too few seeds for an interval: their spread instead
                shown.append(f"{mean:.1f} ± {100 * float(np.std(vals, ddof=1)):.1f} s.d., "
                             f"interval n/a ({len(vals)} seeds)")
            else:
                shown.append(f"{mean:.1f}")
        out.append(f"| {method_name(m)} | " + " | ".join(shown) + " |")
    return out, used


def markdown_tables(results: RunResults, records: list[dict] | None = None) -> str:
    """table.md: the tables of the module docstring; with the run's per-sample
    ``records`` (:mod:`sc_jax.experiment.reporting.samples`), also their check against the rows
    and SC against both forms of BC query by query. Methods the records hold and the rows
    do not (``bc_reference`` for a run that predates it) join the tables from them."""
    rows = list(results.rows)
    extra = []
    if records:
        have = {r.method for r in rows}
        extra = rows_from_samples(records, [m for m in METHOD_NAMES if m not in have])
        rows = rows + extra
    summ = summarize(rows)
    datasets = sorted({r.dataset for r in rows})
    shots = sorted({r.shots for r in rows})
    methods = order_methods(r.method for r in rows)
    out = [f"# Results: {model_label(results)}", "",
           f"Seeds {results.seeds}, test size {results.test_size}, mode {results.mode}, "
           f"solver {results.solver}, lambda_inv {results.config_lambda_inv}, "
           f"guard {results.guard}. "
           f"Cells: {_CELLS}", ""]
    n_seeds = len({r.seed for r in rows})
    for metric, title in _METRIC_TITLES.items():
        for k in shots:
            out += [f"## {title}, {k}-shot: mean ± s.d. (ddof=1) over {n_seeds} seeds", ""]
            out += mean_std_table("Method", [dataset_name(d) for d in datasets], (
                (method_name(m), {dataset_name(d): summ[(d, k, m)][metric] for d in datasets
                                  if (d, k, m) in summ})
                for m in methods))
            out.append("")
    for metric in ("macro_f1", "accuracy"):
        for k in shots:
            lines, used = interval_table(rows, metric, k, methods, datasets)
            if not used:  # too few seeds in every cell: the s.d. table above says it all
                out += [f"## {_METRIC_TITLES[metric]}, {k}-shot: {CONFIDENCE:.0%} interval over seeds", "",
                        f"n/a ({n_seeds} seed{'s' * (n_seeds != 1)}): an interval over seeds needs at "
                        f"least {MIN_INTERVAL_SEEDS}; the table above gives the mean ± s.d.", ""]
                continue
            name = f"{next(iter(used))} " if len(used) == 1 else ""
            out += [f"## {_METRIC_TITLES[metric]}, {k}-shot: mean and {CONFIDENCE:.0%} {name}"
                    f"interval over {n_seeds} seeds", "",
                    f"Interval: {_CI_METHODS} Average: the per-seed mean over datasets.", "",
                    *lines, ""]
    out += _best_baseline_table(rows)
    out += _margin_table(rows)
    if records:
        out += samples_markdown(records, results.rows)
        if extra:
            names = ", ".join(method_name(m) for m in sorted({r.method for r in extra}))
            out += [f"{names}: computed from the per-sample records (results.json predates it).",
                    ""]
    notes = results.notes
    if notes:
        out += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(out)


def write_csv(results: RunResults, path: Path) -> None:
    """results.csv: the rows, ``model`` the model actually loaded under its resolved name
    (a named model's own, "smollm2-135m" for "default"; any other source as given) and
    ``model_source`` what was read (results.json's ``model_source``: the directory,
    snapshot or file; empty for runs made before it was recorded)."""
    source = "" if "model_source" in results.absent else str(results.model_source)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in results.rows:
            model = results.model if "model" in r.absent else r.model
            w.writerow({**r.to_json(), "model": display_name(str(model)), "model_source": source})


_TEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
        "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\^{}"}


def _tex(text: str) -> str:
    """``text`` with LaTeX's special characters escaped."""
    return "".join(_TEX.get(c, c) for c in text)


#: The LaTeX files of the report: name -> metric.
LATEX_FILES = {"latex": ("results.tex", "macro_f1"),
               "latex_accuracy": ("results_accuracy.tex", "accuracy"),
               "latex_ece": ("results_ece.tex", "ece")}
_TEX_METRICS = {"macro_f1": "macro-F1 (\\%)", "accuracy": "accuracy (\\%)",
                "ece": "top-label ECE (\\%, 10 equal-width bins; lower is better)"}


def latex_table(results: RunResults, metric: str = "macro_f1") -> str:
    """The ``metric`` table (macro-F1, accuracy or ECE; one ``tabular`` per shot count)
    in booktabs style (``\\usepackage{booktabs}``): methods as rows, datasets (display
    names) and their average as columns, cells mean $\\pm$ s.d. (ddof = 1) over seeds in
    %, the best mean of each column (the lowest for ECE) in bold. Every name is escaped
    (:func:`_tex`)."""
    rows = results.rows
    summ = summarize(rows)
    datasets = sorted({r.dataset for r in rows})
    methods = order_methods(r.method for r in rows)
    pick = min if metric == "ece" else max
    model = _tex(model_label(results))
    n_seeds = len({r.seed for r in rows})
    out = [f"% sc-jax report: {model}, seeds {results.seeds}; needs "
           "\\usepackage{booktabs}"]
    for k in sorted({r.shots for r in rows}):
        cells = {}
        for m in methods:
            for d in datasets:
                s = summ.get((d, k, m))
                if s is not None:
                    cells[m, d] = s[metric]
            means = [cells[m, d][0] for d in datasets if (m, d) in cells]
            if len(means) == len(datasets):
                cells[m, None] = (float(np.mean(means)), None, 0)
        best = {d: pick((cells[m, d][0] for m in methods if (m, d) in cells), default=None)
                for d in datasets + [None]}
        out += ["\\begin{table}[t]", "\\centering", "\\small",
                f"\\begin{{tabular}}{{l{'c' * (len(datasets) + 1)}}}", "\\toprule",
                "Method & " + " & ".join(_tex(dataset_name(d)) for d in datasets)
                + " & Average \\\\", "\\midrule"]
        for m in methods:
            row = []
            for d in datasets + [None]:
                if (m, d) not in cells:
                    row.append("--")
                    continue
                mean, std, n = cells[m, d]
                text = f"{100 * mean:.1f}" + (f" $\\pm$ {100 * std:.1f}" if n > 1 else "")
                row.append(f"\\textbf{{{text}}}" if mean == best[d] else text)
            out.append(f"{_tex(method_name(m))} & " + " & ".join(row) + " \\\\")
        out += ["\\bottomrule", "\\end{tabular}",
                f"\\caption{{{model}, {k}-shot: {_TEX_METRICS[metric]}, mean $\\pm$ s.d. "
                f"(ddof = 1) over {n_seeds} seeds; best mean in bold.}}",
                f"\\label{{tab:sc-jax-{metric.replace('_', '-')}-k{k}}}", "\\end{table}", ""]
    return "\n".join(out)


def write_report(results: RunResults | str | Path,
                 out_dir: str | Path | None = None) -> dict[str, Path]:
    """Write table.md, results.csv, results.tex and the plots, all or none
    (:class:`~sc_jax.experiment.evaluation.staging.Staging`: an error or an interrupt leaves the
    folder's earlier files as they were). Returns ``{name: path}``. ``results``: a
    run's :class:`RunResults`, or its directory or results.json (read by
    :func:`load_results`). Per-sample records (``samples.jsonl[.gz]``) in the run's
    directory (``results`` when it is a path, else ``out_dir``) are checked against the
    rows and summarised in table.md."""
    if not isinstance(results, RunResults):
        src = Path(results)
        run_dir = src if src.is_dir() else src.parent
        out_dir = out_dir or run_dir
        results = load_results(src)
    else:
        run_dir = Path(out_dir)
    with Staging(out_dir) as stage:
        staged = report_files(results, stage.dir, read_samples(run_dir))
    return {name: stage.final(path) for name, path in staged.items()}


def report_files(results: RunResults, out: Path, records: list[dict] | None,
                 progress: bool = False) -> dict[str, Path]:
    """:func:`write_report`'s files written straight into the folder ``out``, with the
    per-sample ``records`` (or None); returns ``{name: path}``. ``progress``: a line per
    figure drawn, with its time (a nine-task figure takes seconds on a busy CPU)."""
    paths = {"table": out / "table.md", "csv": out / "results.csv"}
    paths["table"].write_text(markdown_tables(results, records))
    write_csv(results, paths["csv"])
    for name, (file, metric) in LATEX_FILES.items():
        paths[name] = out / file
        paths[name].write_text(latex_table(results, metric))
    plots = can_plot()
    figures = []
    if results.rows and plots:  # every (dataset, k) skipped: nothing to plot
        figures.append(("f1_bars", lambda path: plot_f1_bars(results, path)))
    if plots:
        figures.append(("sc_params", lambda path: plot_params(results, path)))
    if plots and records:
        figures.append(("reliability", lambda path: plot_reliability(records, path, model_label(results))))
    for name, draw in figures:
        t = time.perf_counter()
        drawn = draw(out / f"{name}.png")
        for ext, path in drawn.items():
            paths[name if ext == "png" else f"{name}_{ext}"] = path
        if progress and drawn:
            log.info("drew %s (%s) in %.1f s", name, ", ".join(ext.upper() for ext in drawn),
                     time.perf_counter() - t)
    return paths
