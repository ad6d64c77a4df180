"""The figures of a run's report (no model needed), each written as PNG, PDF and SVG
(:func:`save_figure`):

* ``f1_bars.png``: macro-F1 per method, one panel per dataset and one averaged over
  datasets, one group per shot count, error bars = sample s.d. over seeds (ddof = 1;
  the paper's Figure 3; :func:`f1_bars_figure`).
* ``sc_params.png``: the learned (w_c, b_c) of SC for every class, size and seed (the
  paper's Figure 4; :func:`params_figure`); the base model is (1, 0).
* ``reliability.png``: a reliability diagram per method from the per-sample records,
  every dataset's and seed's test queries pooled, a line per shot count, in the bins of
  :func:`sc_jax.experiment.evaluation.metrics.calibration_bins` (:func:`reliability_figure`).

Each method has one colour in every figure
(:func:`sc_jax.experiment.reporting.names.method_colour`); SC's bars have a heavy black edge and a hatch, and SC comes first in the legends.

matplotlib is optional (:func:`can_plot`) and loads on the first plot.
"""

from __future__ import annotations

import contextlib
import logging
import textwrap
import threading
from collections import defaultdict
from pathlib import Path

import numpy as np

from sc_jax.calibration import methods as calibration_methods
from sc_jax.calibration.solvers import is_converged
from sc_jax.experiment.evaluation.metrics import calibration_bins
from sc_jax.experiment.evaluation.results import ResultRow, RunResults, model_label
from sc_jax.experiment.reporting.names import (dataset_name, method_colour, method_name,
                                               order_methods)

log = logging.getLogger(__name__)


_warming: threading.Thread | None = None


def warm_up() -> None:
    """Import matplotlib and its PNG, PDF and SVG writers and load its font, in a
    background thread, so that a run's report does not pay for them at its end (about
    half a second on a fast core, more on a busy one): a run calls this once its model
    is loaded, and the import overlaps its scoring. :func:`can_plot` waits for it.
    Without matplotlib it does nothing (:func:`can_plot` says so)."""
    global _warming
    if _warming is None:
        _warming = threading.Thread(target=_warm, name="sc_jax-plot-warm-up", daemon=True)
        _warming.start()


def _warm() -> None:
    # Any failure here is the plots' own, and they raise it where they are drawn.
    with contextlib.suppress(Exception):
        import matplotlib.backends.backend_pdf  # noqa: F401, PLC0415  (plotting only)
        import matplotlib.backends.backend_svg  # noqa: F401, PLC0415  (plotting only)
        from matplotlib.backends import backend_agg  # noqa: PLC0415  (plotting only)
        from matplotlib.figure import Figure  # noqa: PLC0415  (plotting only)

        fig = Figure(figsize=(1, 1))
        fig.text(0.5, 0.5, "0")
        backend_agg.FigureCanvasAgg(fig).draw()  # loads the font the figures' text is set in


def can_plot() -> bool:
    """Whether matplotlib imports. The plots are extras: a machine without it (a bare GPU
    image) still gets its tables and results, and one log line says how to get them."""
    if _warming is not None:
        _warming.join()  # one thread draws at a time
    try:
        import matplotlib  # noqa: F401, PLC0415  (plotting only, optional)
    except ImportError:
        log.warning("plots skipped: matplotlib is not installed (pip install matplotlib)")
        return False
    return True


#: The formats every figure is written in, beside each other: PNG to look at, PDF and
#: SVG (vector) for a paper.
FIGURE_FORMATS = ("png", "pdf", "svg")


def drawn_texts(fig) -> list:
    """Every text the figure draws, as ``(text, window extent)`` in display pixels after
    a draw: the suptitle and other figure texts, figure legends, and per visible axes
    its title, axis labels, legend, and the tick labels inside its view limits (the
    locator's ticks beyond them are built but not drawn)."""
    if not hasattr(fig.canvas, "get_renderer"):  # a bare Figure: measured as the PNG draws it
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415  (plotting only)

        FigureCanvasAgg(fig)
    renderer = fig.canvas.get_renderer()
    fig.draw_without_rendering()
    texts = list(fig.texts)
    for leg in fig.legends:
        texts += [leg.get_title(), *leg.get_texts()]
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        texts += [ax.title, ax.xaxis.label, ax.yaxis.label]
        if ax.get_legend() is not None:
            texts += [ax.get_legend().get_title(), *ax.get_legend().get_texts()]
        for axis, lim, i in ((ax.xaxis, ax.get_xlim(), 0), (ax.yaxis, ax.get_ylim(), 1)):
            lo, hi = sorted(lim)
            span = (hi - lo) * 1e-9
            texts += [t for t in axis.get_ticklabels() if lo - span <= t.get_position()[i] <= hi + span]
    return [(t, t.get_window_extent(renderer)) for t in texts if t.get_visible() and t.get_text().strip()]


def fit_canvas(fig, pad: float = 0.06) -> None:
    """Grow ``fig`` until every text it draws lies on its canvas, ``pad`` inches from
    the edge: a long model name in the title, or a legend of twelve methods under one
    panel, widens the figure instead of being cut at both sides. A figure without a
    layout engine is laid out again (``tight_layout``) at its new size."""
    for _ in range(4):
        boxes = [b for _, b in drawn_texts(fig)]
        if not boxes:
            return
        x0, y0 = min(b.x0 for b in boxes), min(b.y0 for b in boxes)
        x1, y1 = max(b.x1 for b in boxes), max(b.y1 for b in boxes)
        margin = pad * fig.dpi
        W, H = fig.bbox.width, fig.bbox.height
        grow_x = max(0.0, margin - x0) + max(0.0, x1 - (W - margin))
        grow_y = max(0.0, margin - y0) + max(0.0, y1 - (H - margin))
        if grow_x < 0.5 and grow_y < 0.5:
            return
        w, h = fig.get_size_inches()
        # Centred texts (the suptitle, an outside legend) grow on both sides: twice.
        fig.set_size_inches(w + 2 * grow_x / fig.dpi, h + 2 * grow_y / fig.dpi)
        if fig.get_layout_engine() is None:
            fig.tight_layout()


def save_figure(fig, path: Path) -> dict[str, Path]:
    """Write ``fig`` as ``path`` (a .png) and beside it as .pdf and .svg, grown first
    so that no text is cut (:func:`fit_canvas`); returns ``{format: path}``. A figure
    with a layout engine (constrained layout) is laid out once, for the PNG, and the
    PDF and SVG keep that layout: each layout pass measures every label again, about a
    fifth of a figure's time."""
    fit_canvas(fig)
    out = {}
    for ext in FIGURE_FORMATS:
        out[ext] = Path(path).with_suffix(f".{ext}")
        fig.savefig(out[ext], dpi=130)
        fig.set_layout_engine("none")
    return out


def method_label(method: str, width: int = 11) -> str:
    """A method's name as a tick label, wrapped at ``width`` characters (the paper's
    long names, "SC* (no trust region)", otherwise run into their neighbours)."""

    return "\n".join(textwrap.wrap(method_name(method), width)) or method


#: How SC's bars are marked beside its colour (legible in greyscale too).
SC_STYLE = {"edgecolor": "black", "linewidth": 1.6, "hatch": "//"}


def _bar_style(method: str) -> dict:
    """Keyword arguments of ``ax.bar`` for ``method``: its colour, and for SC the
    :data:`SC_STYLE` marks."""
    return {"color": method_colour(method), **(SC_STYLE if method == calibration_methods.subject() else {})}


def _bar_values(rows: tuple[ResultRow, ...], dataset: str | None, k: int,
                method: str) -> tuple[float, float]:
    """(mean, s.d.) in % over seeds of macro-F1 of one dataset, or with ``dataset`` None
    of the per-seed average over datasets; s.d. the sample one (ddof = 1), 0 for a
    single seed (no error bar)."""
    per_seed = defaultdict(list)
    for r in rows:
        if r.shots == k and r.method == method and dataset in (None, r.dataset):
            per_seed[r.seed].append(r.macro_f1)
    vals = [np.mean(v) for v in per_seed.values()]
    if not vals:
        return np.nan, 0.0
    return 100 * np.mean(vals), 100 * np.std(vals, ddof=1) if len(vals) > 1 else 0.0


def f1_bars_figure(results: RunResults):
    """The figure of :func:`plot_f1_bars`: one panel per dataset and one for their
    average (the paper's Figure 3), one group per shot count, a bar per method in its
    colour (SC marked, first), error bars the sample s.d. over seeds (ddof = 1); one
    legend of the methods."""
    rows = results.rows
    shots = sorted({r.shots for r in rows})
    methods = order_methods((r.method for r in rows), sc_first=True)
    datasets = sorted({r.dataset for r in rows})
    panels = datasets + [None] if len(datasets) > 1 else [None]
    # matplotlib loads on first plot: it takes about 0.5 s to import, which every
    # `sc-jax` command (and `import sc_jax.experiment.execution.run`) would otherwise pay.
    from matplotlib.figure import Figure  # noqa: PLC0415

    cols = min(len(panels), 4)
    nrows = -(-len(panels) // cols)
    panel_w = 1.0 + 0.25 * len(methods) * max(len(shots), 1)
    # A bare Figure, not pyplot: no backend switch or global figure registry in the
    # caller's process.
    fig = Figure(figsize=(panel_w * cols, 3.0 * nrows + 0.6), layout="constrained")
    axes = fig.subplots(nrows, cols, squeeze=False).ravel()
    width = 0.8 / max(len(methods), 1)
    for ax, d in zip(axes, panels):
        for j, m in enumerate(methods):
            means, sds = zip(*(_bar_values(rows, d, k, m) for k in shots))
            x = np.arange(len(shots)) + (j - (len(methods) - 1) / 2) * width
            ax.bar(x, means, width, yerr=sds, capsize=1.5, error_kw={"lw": 0.8},
                   label=method_name(m), **_bar_style(m))
        ax.set_xticks(np.arange(len(shots)), [f"{k}-shot" for k in shots], fontsize=8)
        ax.set_title("Average over datasets" if d is None else dataset_name(d), fontsize=9)
        ax.set_ylabel("macro-F1 (%)", fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
        ax.grid(axis="y", alpha=0.3)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    handles, labels = axes[0].get_legend_handles_labels()
    # About 1.5 in per legend column ("SC* (no trust region)" at 7 pt): as many as the
    # figure's width holds, so that a one-panel figure's legend wraps into rows.
    fig.legend(handles, labels, loc="outside lower center", fontsize=7,
               ncols=max(2, min(len(methods), 7, int(panel_w * cols // 1.5))))
    n_seeds = len({r.seed for r in rows})
    # The model on a line of its own: a long name does not push the figure wider.
    fig.suptitle(f"{model_label(results)}\nmacro-F1, mean ± s.d. (ddof=1) over "
                 f"{n_seeds} seed{'s' * (n_seeds != 1)}", fontsize=10)
    return fig


def plot_f1_bars(results: RunResults, path: Path) -> dict[str, Path]:
    """:func:`f1_bars_figure` as ``path`` (PNG), PDF and SVG."""
    return save_figure(f1_bars_figure(results), path)


def plot_params(results: RunResults, path: Path) -> dict[str, Path]:
    """Learned SC parameters as ``path`` (PNG), PDF and SVG; returns ``{format: path}``,
    empty (and writes nothing) if there are none."""
    fig = params_figure(results)
    return {} if fig is None else save_figure(fig, path)


def params_figure(results: RunResults):
    """The figure of :func:`plot_params` (a ``matplotlib.figure.Figure``), or None when
    the results hold no SC parameters. Only converged fits are plotted
    (:func:`sc_jax.calibration.solvers.is_converged`): any other's (w, b) is where its
    solver stopped, not a minimum (an UNBOUNDED fit's lies along a ray, orders of
    magnitude beyond the others). They are left out of the scatter and counted in
    their panel's title, so the rest stays readable."""
    params = [p for p in results.params if p.method == calibration_methods.subject()]
    if not params:
        return None
    panels = sorted({(p.dataset, p.shots) for p in params})
    # matplotlib loads on first plot (about 0.5 s to import; see plot_f1_bars).
    import matplotlib  # noqa: PLC0415  (plotting only)
    from matplotlib.figure import Figure  # noqa: PLC0415  (plotting only)

    cols = min(len(panels), 4)  # nine tasks in three rows, not one 32-inch row
    nrows = -(-len(panels) // cols)
    fig = Figure(figsize=(3.6 * cols, 3.4 * nrows + 0.4))
    fig.suptitle(f"SC parameters\n{model_label(results)}", fontsize=10)
    axes = fig.subplots(nrows, cols, squeeze=False).ravel()
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    for ax, (d, k) in zip(axes, panels):
        panel = [p for p in params if p.dataset == d and p.shots == k]
        ps = [p for p in panel if is_converged(p.status)
              and np.all(np.isfinite(p.w)) and np.all(np.isfinite(p.b))]
        hidden = len(panel) - len(ps)
        sizes = sorted({p.size for p in ps})
        cmap = matplotlib.colormaps["viridis"].resampled(max(len(sizes), 2))
        for si, i in enumerate(sizes):
            w = np.concatenate([p.w for p in ps if p.size == i])
            b = np.concatenate([p.b for p in ps if p.size == i])
            ax.scatter(w, b, s=14, color=cmap(si), label=f"i={i}", alpha=0.8)
        ax.scatter([1], [0], marker="*", s=120, color="red", label="base (1, 0)", zorder=3)
        ax.axvline(0, color="grey", lw=0.6)
        ax.axhline(0, color="grey", lw=0.6)
        ax.set_xlabel("w_c (slope)")
        ax.set_ylabel("b_c (bias)")
        ax.set_title(f"{dataset_name(d)}, {k}-shot" + (f" ({hidden} fit{'s' * (hidden > 1)} not converged, "
                                            "not shown)" if hidden else ""), fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


#: Line styles and markers of the shot counts in a reliability diagram.
_SHOT_STYLES = (("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"))


def reliability_figure(records, model: str | None = None, num_bins: int = 10):
    """A reliability diagram per method (panels, SC first) from the per-sample
    ``records`` (:mod:`sc_jax.experiment.reporting.samples`), every dataset's and seed's queries
    pooled: per shot count a line through (mean confidence, accuracy) of each non-empty
    bin of :func:`sc_jax.experiment.evaluation.metrics.calibration_bins`, in the method's colour
    (one line style per shot count), and the diagonal (perfect calibration); the title
    gives each shot count's pooled ECE. None without records."""
    if not records:
        return None
    methods = order_methods((m for r in records for m in r["probs"]), sc_first=True)
    shots = sorted({r["shots"] for r in records})
    from matplotlib.figure import Figure  # noqa: PLC0415  (plotting only; see plot_f1_bars)

    cols = min(len(methods), 4)
    nrows = -(-len(methods) // cols)
    fig = Figure(figsize=(2.7 * cols, 2.8 * nrows + 0.4), layout="constrained")
    axes = fig.subplots(nrows, cols, squeeze=False).ravel()
    subject = calibration_methods.subject()  # its lines marked
    for ax, m in zip(axes, methods):
        eces = []
        for j, k in enumerate(shots):
            have = [r for r in records if r["shots"] == k and m in r["probs"]]
            if not have:
                continue
            count, acc, conf = pooled_calibration_bins(have, m, num_bins)
            eces.append(f"{100 * np.nansum(count / count.sum() * np.abs(acc - conf)):.1f}")
            ls, marker = _SHOT_STYLES[j % len(_SHOT_STYLES)]
            ax.plot(conf[count > 0], acc[count > 0], ls=ls, marker=marker, ms=3.5,
                    color=method_colour(m), lw=2.2 if m == subject else 1.2,
                    markeredgecolor="black" if m == subject else method_colour(m), label=f"{k}-shot")
        ax.plot([0, 1], [0, 1], color="grey", lw=0.7, ls=(0, (2, 2)))
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_title(f"{method_name(m)}: ECE {' / '.join(eces)}%", fontsize=8)
        ax.set_xlabel("confidence", fontsize=7)
        ax.set_ylabel("accuracy", fontsize=7)
        ax.tick_params(labelsize=6)
        ax.legend(fontsize=6, loc="upper left")
    for ax in axes[len(methods):]:
        ax.set_visible(False)
    fig.suptitle(f"{model + ': ' if model else ''}reliability (all datasets "
                 f"and seeds pooled, {num_bins} equal-width bins; ECE per shot count "
                 f"{', '.join(map(str, shots))})", fontsize=9)
    return fig


def pooled_calibration_bins(records, method: str, num_bins: int = 10):
    """:func:`sc_jax.experiment.evaluation.metrics.calibration_bins` of ``method`` over ``records``
    of several datasets (their class counts may differ): each dataset's bins, their
    counts summed and their accuracy and confidence averaged weighted by count."""
    by_dataset = defaultdict(list)
    for r in records:
        by_dataset[r["dataset"]].append(r)
    count = np.zeros(num_bins, np.int64)
    hits, conf_sum = np.zeros(num_bins), np.zeros(num_bins)
    for recs in by_dataset.values():
        probs = np.array([r["probs"][method] for r in recs], np.float64)
        c, acc, conf = calibration_bins(probs, [r["gold"] for r in recs], num_bins)
        count += c
        hits += np.nan_to_num(acc) * c
        conf_sum += np.nan_to_num(conf) * c
    with np.errstate(invalid="ignore", divide="ignore"):  # empty bins: NaN
        return count, hits / count, conf_sum / count


def plot_reliability(records, path: Path, model: str | None = None) -> dict[str, Path]:
    """:func:`reliability_figure` as ``path`` (PNG), PDF and SVG; returns ``{format:
    path}``, empty (and writes nothing) without records."""
    fig = reliability_figure(records, model)
    return {} if fig is None else save_figure(fig, path)
