"""BC, batch calibration (Zhou et al. 2024) as the paper computes it: p / mean p over
the test batch. The baseline SC is compared with."""

import numpy as np

from sc_jax.calibration import baselines
from sc_jax.calibration.methods.protocol import Method, register


def predict(s, fits, sizes, options) -> np.ndarray:
    return baselines.batch_calibration(np.exp(s.base.astype(np.float64)), options.bc_batch)


METHOD = register(Method("bc", "BC", "#2ca02c", predict, needs={"k_shot"}, paper_baseline=True, paired=True,
                         doc=__doc__))
