"""The figures of a run's report (no model needed), each written as PNG, PDF and SVG
(:func:`save_figure`):

* ``f1_bars.png``: macro-F1 per method, one panel per dataset and one averaged over
  datasets, one group per shot count, error bars = std over seeds (the paper's
  Figure 3; :func:`f1_bars_figure`).
* ``sc_params.png``: the learned (w_c, b_c) of SC for every class, size and seed (the
  paper's Figure 4; :func:`params_figure`); the base model is (1, 0).

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

from sc_jax.calibration.solvers import is_converged
from sc_jax.experiment.results import METHOD_NAMES, ResultRow, RunResults, model_label

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


def save_figure(fig, path: Path) -> dict[str, Path]:
    """Write ``fig`` as ``path`` (a .png) and beside it as .pdf and .svg; returns
    ``{format: path}``. A figure with a layout engine (constrained layout) is laid out
    once, for the PNG, and the PDF and SVG keep that layout: each layout pass measures
    every label again, about a fifth of a figure's time."""
    out = {}
    for ext in FIGURE_FORMATS:
        out[ext] = Path(path).with_suffix(f".{ext}")
        fig.savefig(out[ext], dpi=130)
        fig.set_layout_engine("none")
    return out


def method_label(method: str, width: int = 11) -> str:
    """A method's name as a tick label, wrapped at ``width`` characters (the paper's
    long names, "SC* (no trust region)", otherwise run into their neighbours)."""

    return "\n".join(textwrap.wrap(METHOD_NAMES[method], width)) or method


def _bar_values(rows: tuple[ResultRow, ...], dataset: str | None, k: int,
                method: str) -> tuple[float, float]:
    """(mean, std) in % over seeds of macro-F1 of one dataset, or with ``dataset`` None of
    the per-seed average over datasets."""
    per_seed = defaultdict(list)
    for r in rows:
        if r.shots == k and r.method == method and dataset in (None, r.dataset):
            per_seed[r.seed].append(r.macro_f1)
    vals = [np.mean(v) for v in per_seed.values()]
    return (100 * np.mean(vals), 100 * np.std(vals)) if vals else (np.nan, 0.0)


def f1_bars_figure(results: RunResults):
    """The figure of :func:`plot_f1_bars`: one panel per dataset and one for their
    average (the paper's Figure 3), bars per method grouped by shot count, error bars
    the std over seeds (ddof = 0); method names wrapped and turned 45 degrees."""
    rows = results.rows
    shots = sorted({r.shots for r in rows})
    methods = [m for m in METHOD_NAMES if any(r.method == m for r in rows)]
    datasets = sorted({r.dataset for r in rows})
    panels = datasets + [None] if len(datasets) > 1 else [None]
    # matplotlib loads on first plot: it takes about 0.5 s to import, which every
    # `sc-jax` command (and `import sc_jax.experiment.run`) would otherwise pay.
    from matplotlib.figure import Figure  # noqa: PLC0415

    cols = min(len(panels), 4)
    nrows = -(-len(panels) // cols)
    panel_w = 1.0 + 0.4 * len(methods) * max(len(shots), 1) ** 0.5
    # A bare Figure, not pyplot: no backend switch or global figure registry in the
    # caller's process.
    fig = Figure(figsize=(panel_w * cols, 3.4 * nrows), layout="constrained")
    axes = fig.subplots(nrows, cols, squeeze=False).ravel()
    width = 0.8 / max(len(shots), 1)
    for ax, d in zip(axes, panels):
        for j, k in enumerate(shots):
            means, stds = zip(*(_bar_values(rows, d, k, m) for m in methods))
            x = np.arange(len(methods)) + (j - (len(shots) - 1) / 2) * width
            ax.bar(x, means, width, yerr=stds, capsize=2, label=f"{k}-shot")
        ax.set_xticks(np.arange(len(methods)), [method_label(m) for m in methods], rotation=45,
                      ha="right", rotation_mode="anchor", fontsize=7)
        ax.set_title("Average over datasets" if d is None else d, fontsize=9)
        ax.set_ylabel("macro-F1 (%)", fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
        ax.grid(axis="y", alpha=0.3)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{model_label(results)}: macro-F1, mean ± std over "
                 "seeds", fontsize=10)
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
    params = [p for p in results.params if p.method == "sc"]
    if not params:
        return None
    panels = sorted({(p.dataset, p.shots) for p in params})
    # matplotlib loads on first plot (about 0.5 s to import; see plot_f1_bars).
    import matplotlib  # noqa: PLC0415  (plotting only)
    from matplotlib.figure import Figure  # noqa: PLC0415  (plotting only)

    fig = Figure(figsize=(3.6 * len(panels), 3.8))
    fig.suptitle(f"SC parameters, {model_label(results)}", fontsize=10)
    axes = fig.subplots(1, len(panels), squeeze=False)
    for ax, (d, k) in zip(axes[0], panels):
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
        ax.set_title(f"{d}, {k}-shot" + (f" ({hidden} fit{'s' * (hidden > 1)} not converged, "
                                            "not shown)" if hidden else ""), fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
