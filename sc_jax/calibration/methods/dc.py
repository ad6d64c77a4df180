"""DC, domain-context calibration (Fei et al. 2023): divided by the mean probabilities
of random in-domain word strings under the same k-shot context."""

import numpy as np

from sc_jax.calibration import baselines
from sc_jax.calibration.methods.protocol import Method, register


def predict(s, fits, sizes, options) -> np.ndarray:
    return baselines.domain_context_calibration(np.exp(s.base.astype(np.float64)), np.exp(s.dc.astype(np.float64)))


METHOD = register(Method("dc", "DC", "#ff7f0e", predict, needs={"k_shot", "domain"}, paper_baseline=True,
                         doc=__doc__))
