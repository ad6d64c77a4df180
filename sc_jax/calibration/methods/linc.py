"""LinC, linear probe calibration (Abbas et al. 2024): a linear map of the label
probabilities fitted by SGD on the surrogate rows of every size (SC's training data),
started from the content-free inputs' scores (:mod:`sc_jax.calibration.linc`)."""

import numpy as np

from sc_jax.calibration.linc import linc_fit, linc_predict
from sc_jax.calibration.methods.protocol import Method, register


def linc_probs(s, p: np.ndarray) -> np.ndarray:
    """LinC fitted on the seed's surrogate rows and applied to ``p [T, n]``."""
    if not s.surrogate:
        raise ValueError("linc needs surrogate scores (k >= 2); drop it from --methods")
    sizes = sorted(s.surrogate)
    logp = np.concatenate([s.surrogate[i][0] for i in sizes]).astype(np.float64)
    labels = np.concatenate([s.surrogate[i][1] for i in sizes])
    fit = linc_fit(np.exp(logp), labels, np.exp(s.cc.astype(np.float64)))
    return linc_predict(fit, p)


def predict(s, fits, sizes, options) -> np.ndarray:
    return linc_probs(s, np.exp(s.base.astype(np.float64)))


METHOD = register(Method("linc", "LinC", "#e377c2", predict, needs={"k_shot", "content_free", "surrogate"},
                         added=True, doc=__doc__))
