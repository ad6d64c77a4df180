"""What ``sc-jax ablate`` writes (:func:`write_ablation`): the studies of
:func:`sc_jax.experiment.reporting.ablation.ablate` as markdown tables (macro-F1, mean ± s.d.
(ddof = 1) over seeds; :func:`markdown`) and a CSV, the SC-N and m_i curves as figures
(:func:`curve_figure`), and :mod:`sc_jax.experiment.reporting.diagnostics`' table beside them;
and the check of its ``--out`` before any refit (:func:`check_ablation_out`).
"""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

import numpy as np

from sc_jax.experiment.evaluation.staging import Staging
from sc_jax.experiment.evaluation.store import make_out_dir, refuse_foreign_outputs
from sc_jax.experiment.reporting.ablation import ROW_FIELDS, STUDIES
from sc_jax.experiment.reporting.diagnostics import DIAGNOSTIC_FIELDS, diagnostics_markdown
from sc_jax.experiment.reporting.figures import can_plot, save_figure
from sc_jax.experiment.reporting.names import dataset_name
from sc_jax.experiment.reporting.report import mean_std_table
from sc_jax.experiment.reporting.stats import mean_sd
from sc_jax.models.identity import short_name


def summarize(rows) -> dict[tuple, dict]:
    """``{(study, setting, dataset, shots): {metric: (mean, sd, n_seeds)}}``, sd the
    sample standard deviation over seeds (ddof = 1; :func:`stats.mean_sd`)."""
    groups = defaultdict(list)
    for r in rows:
        groups[(r["study"], r["setting"], r["dataset"], r["shots"])].append(r)
    return {key: {m: mean_sd([r[m] for r in rs]) for m in ("accuracy", "macro_f1")}
            for key, rs in groups.items()}


_TITLES = {
    "lambda_trust": "Invariance weight x trust region (the paper's ablation table)",
    "sc_n": "SC-N: the ensemble over sizes 1..N (the paper's context-size figure)",
    "m_i": "Test-time sub-contexts per size m (the paper's m_i figure)",
    "single_size": "Each size alone (SC_i)",
    "guard": "Sizes the LLM scores below chance on the surrogate data: the guard",
}


def markdown(rows) -> str:
    """One macro-F1 table per study and shot count: settings as rows, datasets and
    their average as columns (display names), cells mean ± s.d. (ddof = 1) over seeds
    (in %)."""
    summ = summarize(rows)
    datasets = sorted({r["dataset"] for r in rows})
    out = ["# Ablations (refitted from saved scores; no forward pass)", "",
           "Cells: macro-F1, mean ± s.d. (ddof=1) over seeds (in %; the sample standard deviation; "
           "one seed: the value alone). lambda_inv=paper is the paper's "
           "summed-objective weight 10 on our mean scale (10 P / N per problem).", ""]
    for study in STUDIES:
        for k in sorted({r["shots"] for r in rows if r["study"] == study}):
            settings = list(dict.fromkeys(r["setting"] for r in rows
                                          if r["study"] == study and r["shots"] == k))
            out += [f"## {_TITLES[study]}, {k}-shot", ""]
            out += mean_std_table("Setting", [dataset_name(d) for d in datasets], (
                (setting, {dataset_name(d): summ[(study, setting, d, k)]["macro_f1"] for d in datasets
                           if (study, setting, d, k) in summ})
                for setting in settings), missing="-", lone_seed_alone=False)
            out.append("")
    return "\n".join(out)


def _plot_curve(rows, study: str, x_field: str, xlabel: str, path: Path,
                model: str | None = None) -> bool:
    """The curve of :func:`curve_figure` as ``path`` (PNG), PDF and SVG
    (:func:`sc_jax.experiment.reporting.figures.save_figure`); False when the study has no rows."""
    fig = curve_figure(rows, study, x_field, xlabel, model)
    if fig is None:
        return False
    save_figure(fig, path)
    return True


def curve_figure(rows, study: str, x_field: str, xlabel: str, model: str | None = None):
    """Macro-F1 (mean and s.d. (ddof = 1; none for one seed) over seeds) of ``study``'s rows against the integer
    ``x_field`` (N sizes, m sub-contexts), one line per (dataset, k): a
    ``matplotlib.figure.Figure``, or None when the study has no rows."""
    summ = summarize(rows)
    keys = sorted({(r["dataset"], r["shots"]) for r in rows if r["study"] == study})
    if not keys:
        return None
    # matplotlib loads on first plot (about 0.5 s to import; see figures.f1_bars_figure).
    from matplotlib.figure import Figure  # noqa: PLC0415
    from matplotlib.ticker import MaxNLocator  # plotting only, loaded on first plot

    fig = Figure(figsize=(6, 4))  # not pyplot: the caller's backend stays as it is
    ax = fig.subplots()
    # N sizes and m sub-contexts are counts: no tick at 2.5.
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if model is not None:
        ax.set_title(f"{short_name(str(model))}: macro-F1 against {xlabel}", fontsize=9)
    for d, k in keys:
        pts = sorted({(r[x_field], r["setting"]) for r in rows
                      if r["study"] == study and r["dataset"] == d and r["shots"] == k})
        xs = [x for x, _ in pts]
        ys = [100 * summ[(study, s, d, k)]["macro_f1"][0] for _, s in pts]
        es = [100 * np.nan_to_num(summ[(study, s, d, k)]["macro_f1"][1]) for _, s in pts]
        ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=f"{dataset_name(d)}, k={k}")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("macro-F1 (%)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


#: What ``sc-jax ablate`` writes into its --out (the plots also as PDF and SVG).
ABLATION_OUTPUTS = ("ablation.md", "ablation.csv", "diagnostics.md", "diagnostics.csv") + tuple(
    f"ablation_{name}.{ext}" for name in ("sc_n", "m") for ext in ("png", "pdf", "svg"))


def written_by_ablate(out_dir) -> bool:
    """Whether ``out_dir``'s files are sc-jax ablate's: its ablation.csv opens with the
    header every ablate writes (:data:`ROW_FIELDS`), which versions before this test
    wrote too, so their outputs are replaced by a rerun as before."""
    try:
        with open(Path(out_dir) / "ablation.csv") as f:
            return f.readline().rstrip("\r\n") == ",".join(ROW_FIELDS)
    except (OSError, UnicodeDecodeError):
        return False


def check_ablation_out(out_dir, overwrite: bool = False) -> Path:
    """``ablate --out``, checked before any refit: a directory (created if need be; a
    file there is refused, issue 64 case 9) that holds no user's file by the names
    ablate writes, unless ``overwrite`` (the rule of ``run --out``,
    :func:`sc_jax.experiment.evaluation.store.refuse_foreign_outputs`; issue 64 case 6)."""
    out = make_out_dir(out_dir, "--out")
    if not overwrite:
        refuse_foreign_outputs(out, ABLATION_OUTPUTS, written_by_ablate(out), command="ablate",
                               sign="no ablation.csv with its header")
    return out


def write_ablation(rows, out_dir, diagnostics=None, model: str | None = None) -> dict[str, Path]:
    """``ablation.md``, ``ablation.csv`` and the SC-N and m_i plots into ``out_dir``;
    with the rows of :func:`sc_jax.experiment.reporting.diagnostics.diagnose`, ``diagnostics.md``
    and ``diagnostics.csv``, all put in place together at the end or not at all
    (:class:`~sc_jax.experiment.evaluation.staging.Staging`).
    ``model`` (the run's ``--model``) titles the plots."""
    with Staging(out_dir) as stage:
        staged = _ablation_files(rows, stage.dir, diagnostics, model)
    return {name: stage.final(path) for name, path in staged.items()}


def _ablation_files(rows, out: Path, diagnostics, model: str | None) -> dict[str, Path]:
    """:func:`write_ablation`'s files written straight into the folder ``out``."""
    files = {"table": out / "ablation.md", "csv": out / "ablation.csv"}
    files["table"].write_text(markdown(rows))
    if diagnostics:
        files["diagnostics"] = out / "diagnostics.md"
        files["diagnostics"].write_text(diagnostics_markdown(diagnostics))
        files["diagnostics_csv"] = out / "diagnostics.csv"
        with open(files["diagnostics_csv"], "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=DIAGNOSTIC_FIELDS)
            w.writeheader()
            w.writerows(diagnostics)
    with open(files["csv"], "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=ROW_FIELDS)
        w.writeheader()
        w.writerows({k: r.get(k) for k in ROW_FIELDS} for r in rows)
    if not can_plot():
        return files
    if _plot_curve(rows, "sc_n", "sizes", "largest size N in the ensemble", out / "ablation_sc_n.png",
                   model):
        files["sc_n_plot"] = out / "ablation_sc_n.png"
    if _plot_curve(rows, "m_i", "m", "test-time sub-contexts per size m", out / "ablation_m.png",
                   model):
        files["m_plot"] = out / "ablation_m.png"
    return files
