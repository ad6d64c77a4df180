"""CC, contextual calibration (Zhao et al. 2021): divided by the content-free inputs'
mean probabilities under the same k-shot context."""

import numpy as np

from sc_jax.calibration import baselines
from sc_jax.calibration.methods.protocol import Method, register


def predict(s, fits, sizes, options) -> np.ndarray:
    return baselines.contextual_calibration(np.exp(s.base.astype(np.float64)), np.exp(s.cc.astype(np.float64)))


METHOD = register(Method("cc", "CC", "#1f77b4", predict, needs={"k_shot", "content_free"}, paper_baseline=True,
                         doc=__doc__))
