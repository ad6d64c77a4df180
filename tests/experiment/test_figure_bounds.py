"""No figure cuts its text: every title, label, tick label and legend entry of every
report figure lies on the canvas, for a 1-, 3- and 9-task run with every method and
a long model name (the README main job's run is the 1-task case)."""

import numpy as np
import pytest

from sc_jax.experiment.evaluation.results import METHOD_NAMES, RunResults
from sc_jax.experiment.reporting.figures import (drawn_texts, f1_bars_figure, fit_canvas,
                                                 params_figure, reliability_figure)
from sc_jax.experiment.tasks.spec import BUILTIN_TASKS

NINE = sorted(BUILTIN_TASKS)[:9]


def _results(tasks, seeds=2):
    rng = np.random.default_rng(0)
    # Every method's legend entry under one panel; four methods across nine panels
    # (the panels' text is what grows there, and a figure's draw time with them).
    methods = list(METHOD_NAMES) if len(tasks) == 1 else ["sc", "base", "bc", "sc_star_free"]
    rows = [dict(dataset=d, model="gemma3-270m", shots=k, method=m, seed=s, accuracy=float(rng.uniform(0.4, 0.9)),
                 macro_f1=float(rng.uniform(0.3, 0.9)), ece=0.1)
            for d in tasks for k in (4,) for m in methods for s in range(seeds)]
    params = [dict(dataset=d, shots=4, seed=s, size=i, method="sc", b=[0.1 * i, -0.2], w=[1.0, 0.5 - 0.1 * s],
                   status="CONVERGED") for d in tasks for s in range(seeds) for i in (1, 2, 3)]
    description = {"name": "Gemma-3-270M-Instruct-with-a-rather-long-name", "variant": "Instruct",
                   "quantisation": "Q4_K_M", "dtype": "float32", "source": "4 PyPI wheels",
                   "upstream": "google/gemma-3-270m-it", "licence": "Gemma"}
    return RunResults.from_json({"config": {"model": "gemma3-270m", "seeds": list(range(seeds)), "test_size": 64,
                                            "mode": "first_token", "solver": "augmented_lagrangian"},
                                 "rows": rows, "params": params, "model_description": description})


def _records(tasks):
    rng = np.random.default_rng(1)
    out = []
    for d in tasks:
        for q in range(20):
            probs = {m: list(rng.dirichlet([1, 1])) for m in METHOD_NAMES}
            out.append({"dataset": d, "shots": 4, "seed": 0, "gold": int(q % 2), "probs": probs})
    return out


def _off_canvas(fig):
    W, H = fig.bbox.width, fig.bbox.height
    return [(t.get_text()[:40], tuple(round(v) for v in b.extents)) for t, b in drawn_texts(fig)
            if b.x0 < -0.5 or b.y0 < -0.5 or b.x1 > W + 0.5 or b.y1 > H + 0.5]


@pytest.mark.parametrize("n_tasks", [1, 3, 9])
def test_every_text_on_the_canvas(n_tasks):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    tasks = NINE[:n_tasks]
    res = _results(tasks)
    figures = {"f1_bars": f1_bars_figure(res), "sc_params": params_figure(res)}
    if n_tasks == 1:  # its panels are methods, every task pooled: one size of it
        figures["reliability"] = reliability_figure(_records(tasks), model="Gemma-3-270M-Instruct Q4_K_M GGUF")
    cut_before = 0
    for name, fig in figures.items():
        FigureCanvasAgg(fig)
        cut_before += bool(_off_canvas(fig))
        fit_canvas(fig)  # what save_figure does before writing
        assert _off_canvas(fig) == [], name
    if n_tasks == 1:
        # The case the check exists for: without fit_canvas, this 1-task figure's title
        # (a model name longer than any named model's) runs off both sides.
        assert cut_before >= 1
