"""Hidden Calibration (Cho et al. 2025): the nearest class centroid of the last hidden
states, SC's surrogate prompts as the calibration set and its ensemble over sizes and
sub-contexts (:mod:`sc_jax.calibration.hidden`)."""

import numpy as np

from sc_jax.calibration.hidden import hidden_calibration
from sc_jax.calibration.methods.protocol import Method, register


def hidden_probs(s, sizes) -> np.ndarray:
    """Hidden Calibration's ``[T, n]`` from the seed's centroid distances of every size."""
    missing = [i for i in sizes if i not in s.hidden]
    if missing:
        raise ValueError(f"method hidden: these scores hold no hidden-state distances of sizes "
                         f"{missing} (scored without it); rerun `sc-jax run` with hidden in "
                         "--methods")
    return hidden_calibration([s.hidden[i] for i in sizes])


def predict(s, fits, sizes, options) -> np.ndarray:
    return hidden_probs(s, list(sizes) or sorted(s.hidden))


METHOD = register(Method("hidden", "Hidden Calibration", "#17becf", predict, needs={"surrogate", "test", "hidden"},
                         added=True, available=lambda s, run_methods: bool(s.hidden), doc=__doc__))
