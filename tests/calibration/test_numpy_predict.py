"""The NumPy predictions (:mod:`sc_jax.calibration.numpy_predict`) against the pure-JAX
ones they mirror (:mod:`sc_jax.calibration.jax_predict`), in float64, and the reason
they are NumPy: no program is compiled, whatever the shapes."""

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sc_jax.calibration.jax_predict import calibrated_log_probs, ensemble_proba
from sc_jax.calibration.numpy_predict import (
    FitResult, calibrated_proba, predict_proba, reference_size_weights)
from sc_jax.calibration.solvers import Status
from sc_jax.runtime.timing import CompileMeter

# Both sides compute the same float64 expressions; they may differ by how XLA fuses the
# affine map (an FMA), evaluates exp and orders its sums: a few ulps of each term, and an
# error of |z| ulps in exp(z). The log-odds here stay below ~100 in magnitude (the
# smallest probability compared is ~1e-23, far from underflow), so a relative tolerance
# of ~1e4 ulps holds for every entry, small ones included (measured: <= 4e-16).
RTOL = 1e-12


def _fit(rng, n1, *, status=Status.CONVERGED, sc_star=False, guarded=False):
    w = np.ones(n1) if sc_star else rng.normal(1.0, 1.0, n1)
    return FitResult(b=rng.normal(0.0, 2.0, n1), w=w, status=status, iterations=3,
                     outer_iterations=1, objective=0.5, constraint=1.0, violation=0.0,
                     tau=0.9, lambda_inv=0.1, solver="augmented_lagrangian", sc_star=sc_star,
                     num_rows=56, base_accuracy=0.4 if guarded else 0.7, guarded=guarded)


def _jax_ensemble(fits, feats, weights):
    with jax.enable_x64(True):  # jitted: one program, where eager ops compiled one each
        return np.asarray(jax.jit(ensemble_proba)(jnp.asarray(np.stack([f.b for f in fits])),
                                         jnp.asarray(np.stack([f.w for f in fits])),
                                         [jnp.asarray(f) for f in feats], jnp.asarray(weights)))


@pytest.mark.parametrize("n1, sizes, m, T, scale", [
    (1, [1, 2, 3], [2, 2, 1], 16, 1.0),       # binary, the run's smallest shape
    (2, [1, 5], [3, 7], 11, 5.0),             # m_i differ between sizes
    (4, [1, 2, 3, 4], [1, 4, 2, 6], 9, 15.0),  # 5 classes, saturated log-odds
])
def test_predict_proba_is_jax_ensemble_proba(n1, sizes, m, T, scale):
    """Random fits, among them a status that is not CONVERGED, a guarded fit and an SC*
    (w = 1) one, and both size weightings."""
    rng = np.random.default_rng(n1)
    kinds = [{}, {"status": Status.MAX_ITERATIONS}, {"sc_star": True, "guarded": True},
             {"sc_star": True}]
    fits = [_fit(rng, n1, **kinds[i % len(kinds)]) for i in range(len(sizes))]
    feats = [rng.normal(0.0, scale, (m_i, T, n1)) for m_i in m]
    k = max(sizes) + 1
    for how, weights in (("uniform", np.ones(len(sizes))),
                         ("reference", reference_size_weights(k, sizes))):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*not CONVERGED", category=RuntimeWarning)
            got = predict_proba(fits, feats, size_weights=how, shots=k, sizes=sizes)
        want = _jax_ensemble(fits, feats, weights)
        assert got.dtype == np.float64 and got.shape == (T, n1 + 1)
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=0)
        np.testing.assert_allclose(got.sum(-1), 1.0, rtol=1e-14)
    # m_i = 1 given as [T, n-1]: the same as [1, T, n-1].
    flat = [f[0] for f in feats]
    np.testing.assert_allclose(predict_proba(fits[:1], flat[:1]),
                               _jax_ensemble(fits[:1], [flat[0][None]], np.ones(1)),
                               rtol=RTOL, atol=0)


def test_calibrated_proba_is_jax_calibrated_log_probs():
    """One map, with b, w broadcast against the features' leading axes, and a fit's
    predict_proba, which warns on a status other than CONVERGED."""
    rng = np.random.default_rng(7)
    b, w = rng.normal(0.0, 2.0, (3, 1, 2)), rng.normal(0.0, 3.0, (3, 1, 2))
    x = rng.normal(0.0, 10.0, (3, 5, 2))
    with jax.enable_x64(True):
        want = np.asarray(jnp.exp(calibrated_log_probs(*(jnp.asarray(a) for a in (b, w, x)))))
    np.testing.assert_allclose(calibrated_proba(b, w, x), want, rtol=RTOL, atol=0)
    fit = dataclasses.replace(_fit(rng, 2), status=Status.UNBOUNDED)
    with pytest.warns(RuntimeWarning, match="UNBOUNDED, not CONVERGED"):
        got = fit.predict_proba(x)
    np.testing.assert_allclose(got, calibrated_proba(fit.b, fit.w, x), rtol=0, atol=0)
    with pytest.raises(ValueError, match="are for 3 classes"):
        calibrated_proba(b, w, rng.normal(size=(5, 3)))


def test_predictions_compile_nothing():
    """A run's metrics called these for each (dataset, k, seed); run eagerly in JAX, each
    new class count, test size or m_i compiled about 17 small programs."""
    rng = np.random.default_rng(3)
    fits = [_fit(rng, 3), _fit(rng, 3, sc_star=True)]
    feats = [rng.normal(size=(5, 23, 3)), rng.normal(size=(2, 23, 3))]  # shapes no other test uses
    with CompileMeter() as meter:
        predict_proba(fits, feats, size_weights="reference", shots=7, sizes=[1, 4])
        fits[0].predict_proba(feats[0])
        calibrated_proba(fits[1].b, fits[1].w, feats[1])
    assert sum(meter.count()) == 0, dict(meter.compiled)
    # The meter sees an eager JAX operation of a new shape (it would see the old path's).
    with CompileMeter() as meter:
        jnp.exp(jnp.ones((23, 5, 3, 2)))
    assert sum(meter.count()) >= 1
