"""Base: the uncalibrated model, its label probabilities renormalised over the labels."""

import numpy as np

from sc_jax.calibration import baselines
from sc_jax.calibration.methods.protocol import Method, register


def predict(s, fits, sizes, options) -> np.ndarray:
    return baselines.base(np.exp(s.base.astype(np.float64)))


METHOD = register(Method("base", "Base", "#7f7f7f", predict, needs={"k_shot"}, paper_baseline=True, doc=__doc__))
