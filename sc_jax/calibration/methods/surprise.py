"""Surprise Calibration (Tan et al. 2025): a GRU over the demonstrations' label
surprises predicts a prior the test log-probs are divided by, trained on the seed's
surrogate rows (:mod:`sc_jax.calibration.surprise`). Opt-in: it trains a network per
seed (about 60 rows at k = 4, far less than its paper's, and it often predicts a single
class: read its results with that in mind)."""

import numpy as np

from sc_jax.calibration import surprise
from sc_jax.calibration.methods.protocol import Method, register

# The network and its training: the authors' released defaults.
SETTINGS = surprise.SurpriseSettings()


def surprise_method_probs(s, settings=None) -> np.ndarray:
    """Surprise Calibration's ``[T, n]`` test probabilities: its network trained on the
    seed's surrogate rows (each held-out demonstration under a sub-context of the
    others, every size), then applied to the k-shot context's demonstrations."""
    if s.demo_labels is None or s.surrogate_contexts is None:
        raise ValueError("these scores predate Surprise Calibration (no demonstration labels "
                         "or surrogate contexts): rerun `sc-jax run` with the same --out to "
                         "rewrite them from the score cache")
    labels = np.asarray(s.demo_labels)
    train = [(labels[s.surrogate_contexts[i]], lp, y) for i, (lp, y, _) in sorted(s.surrogate.items())]
    return surprise.surprise_probs(s.base.astype(np.float64), s.demo_labels, train,
                                   n=s.base.shape[-1], settings=SETTINGS if settings is None else settings)


def predict(s, fits, sizes, options) -> np.ndarray:
    return surprise_method_probs(s)


METHOD = register(Method(
    "surprise", "Surprise", "#bcbd22", predict, needs={"k_shot", "surrogate"}, opt_in=True, added=True,
    # A score file written before it, or a run without it (it trains): not computed again.
    available=lambda s, run_methods: s.surrogate_contexts is not None and "surprise" in run_methods,
    doc=__doc__))
