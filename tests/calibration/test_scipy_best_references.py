"""The stored SciPy references are used only for the problem they were computed on."""

import numpy as np
import pytest

import scipy_best_references
from sc_jax.calibration import synthetic
from test_solvers import _problem64


@pytest.mark.skipif(scipy_best_references.MODE != "stored",
                    reason="SC_JAX_SCIPY_REFERENCES computes the references live")
def test_a_reference_is_served_only_for_its_own_problem():
    x, y, g, lam, tau = synthetic.solver_instance("apex", 33)
    ref = scipy_best_references.scipy_best("apex-33", _problem64(x, y, g), lam, tau, seed=33)
    # The stored value is SciPy's best start on this instance (the test that uses it
    # names the two optima): b = -5.39, f = 3.2711132.
    assert abs(ref.objective - 3.2711132) < 1e-7 and ref.status == 0
    moved = x.copy()
    moved[0] += 1e-6  # one feature: f at the identity moves by far more than 1e-10
    for problem, lam_, seed, name in [
            (_problem64(moved, y, g), lam, 33, "apex-33"),  # other features
            (_problem64(x, np.roll(y, 1), g), lam, 33, "apex-33"),  # other labels
            (_problem64(x, y, g), lam / 2, 33, "apex-33"),  # another lambda_inv
            (_problem64(x, y, g), lam, 0, "apex-33"),  # other starts
            (_problem64(x, y, g), lam, 33, "apex-34")]:  # no such entry
        with pytest.raises(pytest.fail.Exception, match="regenerate it"):
            scipy_best_references.scipy_best(name, problem, lam_, tau, seed=seed)
