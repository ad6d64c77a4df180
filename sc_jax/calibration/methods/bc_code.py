"""BC (code): batch calibration as the reference code computes it, softmax(p - mean p),
reported beside the paper's p / mean p."""

import numpy as np

from sc_jax.calibration import baselines
from sc_jax.calibration.methods.protocol import Method, register


def predict(s, fits, sizes, options) -> np.ndarray:
    return baselines.batch_calibration_reference(np.exp(s.base.astype(np.float64)), options.bc_batch)


METHOD = register(Method("bc_reference", "BC (code)", "#98df8a", predict, needs={"k_shot"}, added=True, paired=True,
                         doc=__doc__))
