"""``sc-jax demo``: a run in miniature, over twenty built-in sentences held in memory.

The demo is a preset :class:`RunConfig` (:func:`demo_config`) over an in-memory
dataset (:func:`demo_dataset`), and goes the run's way: one plan
(:func:`sc_jax.experiment.protocol.runplan.build_plan`), the weights loaded from the plan's
located model, the seed scored from its planned work
(:func:`sc_jax.experiment.protocol.jobs.score_seed`, no score cache), SC fitted as the run fits
it (:func:`sc_jax.experiment.evaluation.methods.fit_sc`) and every method's probabilities as the
run computes them (:func:`sc_jax.experiment.evaluation.methods.method_probs`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from sc_jax.calibration import methods as calibration_methods
from sc_jax.calibration.defaults import DEFAULT_LAMBDA_INV
from sc_jax.experiment.evaluation.methods import fit_sc, method_probs
from sc_jax.experiment.evaluation.results import FitRecord
from sc_jax.experiment.protocol.config import RunConfig
from sc_jax.experiment.protocol.jobs import score_seed
from sc_jax.experiment.protocol.runplan import RunPlan, build_plan
from sc_jax.experiment.tasks.spec import TASKS, Dataset
from sc_jax.models import loading
from sc_jax.scoring.engine import ScoringEngine

__all__ = ["DEMO_REVIEWS", "DemoResult", "demo_config", "demo_dataset", "run_demo"]

# A tiny labelled set for the demonstration (0 = negative, 1 = positive). Written
# for this demo; the experiment pipeline uses real datasets.
DEMO_REVIEWS = [
    ("a gorgeous, witty and deeply moving film", 1),
    ("the plot is a mess and the jokes never land", 0),
    ("one of the most charming comedies of the year", 1),
    ("tedious, overlong and utterly forgettable", 0),
    ("the cast is superb and the script sparkles", 1),
    ("a dull, lifeless retread of better movies", 0),
    ("funny, warm and surprisingly wise", 1),
    ("i wanted my two hours back", 0),
    ("an exhilarating ride from start to finish", 1),
    ("clumsy direction sinks an already thin story", 0),
    ("the performances are tender and true", 1),
    ("a joyless slog with nothing to say", 0),
    ("smart, stylish and endlessly entertaining", 1),
    ("the characters are flat and the ending is absurd", 0),
    ("a small triumph of honest storytelling", 1),
    ("badly acted, badly written, badly edited", 0),
    ("it will make you laugh and cry", 1),
    ("a boring film that mistakes noise for drama", 0),
    ("beautifully shot and wonderfully acted", 1),
    ("the worst kind of lazy sequel", 0),
]

#: The demo's dataset name, prompted as Rotten Tomatoes is.
DEMO_DATASET = "demo"

# The demo's share of a run's settings: sizes i = 1..min(5, k-1) as the paper's, but
# fewer surrogate pairs, test-time sub-contexts and DC strings than a run's 5000, 24
# and 20, so that it ends in seconds on a CPU with the default model. Half the
# sentences are the test set: the run's fixed test set (test seed 12345) holds five of
# each class, which leaves five of each for up to 8 class-balanced demonstrations.
DEMO_SETTINGS = dict(test_size=10, max_size=5, budget=200, m_cap=2, dc_strings=8,
                     methods=("base", "cc", "dc", "bc", "sc"))


def demo_config(model: str = "default", *, dtype: str = "float32", k: int = 4,
                seed: int = 0) -> RunConfig:
    """The demo's :class:`RunConfig`: one seed of k shots on :func:`demo_dataset`."""
    return RunConfig(model=model, dtype=dtype, datasets=(DEMO_DATASET,), shots=(k,), seeds=(seed,),
                     **DEMO_SETTINGS)


def demo_dataset() -> Dataset:
    """:data:`DEMO_REVIEWS` as a dataset in memory, with Rotten Tomatoes' template."""
    return Dataset([t for t, _ in DEMO_REVIEWS], [y for _, y in DEMO_REVIEWS],
                   TASKS["rotten_tomatoes"], source="the demo's built-in sentences")


@dataclasses.dataclass(frozen=True)
class DemoResult:
    """One demo: its ``plan``, the ``model``, the test sentences (``texts``, ``labels``
    ``[T]``), each method's probabilities ``[T, 2]`` (``probs``), and SC's fit record
    per size (``params``, :class:`sc_jax.experiment.evaluation.results.FitRecord`) with its test-time sub-contexts
    (``m``: size -> m_i)."""

    plan: RunPlan
    model: loading.LoadedModel
    texts: tuple[str, ...]
    labels: np.ndarray
    probs: dict[str, np.ndarray]
    params: list[FitRecord]
    m: dict[int, int]


def run_demo(config: RunConfig, *, progress: bool = False, model=None) -> DemoResult:
    """:func:`demo_config`'s run over :func:`demo_dataset`, in memory: planned, scored
    and fitted as ``sc-jax run`` does, nothing written. ``model``: one already loaded
    (else the plan's, loaded here)."""
    ds = demo_dataset()
    plan = build_plan(config, datasets={DEMO_DATASET: ds})
    if model is None:
        model = loading.load_model(config.model, dtype=config.dtype, located=plan.model)
    engine = ScoringEngine(model, policy=plan.policy, progress=progress)
    work = plan.work[0]
    same = model.config == plan.model.parts.config
    scores, _ = score_seed(model, engine, None, ds, work, config,
                           planned=work.planned if same else None)
    lam = DEFAULT_LAMBDA_INV if config.lambda_inv is None else config.lambda_inv
    fits, params = fit_sc({work.seed: scores}, DEMO_DATASET, work.k, config, lam)
    sizes = config.sizes(work.k)
    probs = {}
    for method in config.methods:
        per = {i: fits[method][(work.seed, i)] for i in sizes} if method in fits else None
        probs[method] = method_probs(method, scores, per, sizes, bc_batch=config.bc_batch,
                                     size_weighting=config.size_weighting, shots=work.k)
    return DemoResult(plan, model, work.split.test_texts(ds), scores.y_test, probs,
                      [p for p in params if p.method == calibration_methods.subject()], dict(work.jobs.m))
