"""SC's two-level ensemble (Algorithm 2), shared by the SC-family methods."""

from __future__ import annotations

import contextlib
import warnings

import numpy as np

from sc_jax.calibration.numpy_predict import predict_proba
from sc_jax.calibration.objective import log_odds


@contextlib.contextmanager
def fits_noted():
    """Silence the API's warning on fits that did not converge: a run counts them once
    in its notes and ablate in its tables, instead of warning at every prediction."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*not CONVERGED", category=RuntimeWarning)
        yield


def sc_ensemble(s, fits: dict, sizes, options) -> np.ndarray:
    """``[T, n]``: (1/|I|) sum_i (1/m_i) sum_j f(m(x; C_i^(j)); theta_i) over the sizes
    (uniform, the paper's; or the reference code's weights), from the fits of every
    size and the test-time scores ``s.test[i] [m_i, T, n]``."""
    with fits_noted():
        return predict_proba([fits[i] for i in sizes], [log_odds(s.test[i]) for i in sizes],
                             size_weights="uniform" if options.size_weighting == "uniform" else "reference",
                             shots=options.shots, sizes=sizes)
