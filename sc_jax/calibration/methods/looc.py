"""LOOC, leave-one-out calibration (Reif & Schwartz 2024): the test probabilities
divided by the prior of each demonstration's probabilities under the other k - 1
(:mod:`sc_jax.calibration.looc`). Its prompts are SC's surrogate prompts of size k - 1,
or, where the run's sizes stop below it, its own leave-one-out job."""

import numpy as np

from sc_jax.calibration.looc import leave_one_out_calibration
from sc_jax.calibration.methods.protocol import Method, register


def looc_scored(s) -> bool:
    """Whether ``s`` holds LOOC's prompts: its own leave-one-out job, or surrogate
    prompts of size k - 1 (a score file that predates the demonstrations' labels is
    taken at its word: such runs scored every size)."""
    if s.loo is not None:
        return True
    if not s.surrogate:
        return False
    return s.demo_labels is None or max(s.surrogate) == len(s.demo_labels) - 1


def looc_probs(s, p: np.ndarray) -> np.ndarray:
    """LOOC of the test probabilities ``p [T, n]``, its prior from the leave-one-out
    prompts: the run's own ``loo`` job where its sizes stop below k - 1, else the
    surrogate prompts of size k - 1 (the same prompts, under every ordering the budget
    scored)."""
    if s.loo is not None:
        logp, labels, queries = s.loo
    elif s.surrogate:
        if not looc_scored(s):
            k = len(s.demo_labels)
            raise ValueError(f"method looc needs each demonstration under the other k - 1 = {k - 1}; these "
                             f"scores stop at size {max(s.surrogate)} (--max-size) and hold no leave-one-out "
                             "prompts: rerun `sc-jax run` with looc in --methods (it scores them)")
        logp, labels, queries = s.surrogate[max(s.surrogate)]
    else:
        raise ValueError("looc needs surrogate scores (k >= 2); drop it from --methods")
    return leave_one_out_calibration(p, np.exp(logp.astype(np.float64)), labels, queries)


def predict(s, fits, sizes, options) -> np.ndarray:
    return looc_probs(s, np.exp(s.base.astype(np.float64)))


METHOD = register(Method("looc", "LOOC", "#8c564b", predict, needs={"k_shot", "surrogate", "loo"}, added=True,
                         available=lambda s, run_methods: looc_scored(s), doc=__doc__))
