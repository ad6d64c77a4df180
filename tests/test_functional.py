"""sc_jax.calibrate and the other pure-JAX functions: batching, differentiation by
implicit differentiation, no host callbacks, and agreement with the NumPy layer.

float64 (the ``x64`` fixture) wherever exactness is checked. Tolerances:
* jit(vmap(calibrate)) against one-by-one solves: both stop at the same KKT point to
  the solver's tolerance (gradient 1e-9, cosine 1e-9), so parameters agree to 1e-6
  (the Hessian's smallest eigenvalue here is > 1e-3) and objectives to 1e-10.
* Gradients against central finite differences of the float64 solve with step 1e-5:
  the FD truncation error is O(h^2) ~ 1e-10 times third derivatives and the solve's
  own error ~ 1e-9 / h ~ 1e-4 relative in the worst case: relative 1e-4.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sc_jax
from sc_jax import calibrators, synthetic
from sc_jax.solvers import Status


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def _problem(seed, sizes=(1,), k=6):
    # Noisy enough that no class is separable: every optimum is finite.
    world = synthetic.World(3, (1.0, -0.4), beta=(0.3, -0.2), row_sd=1.5, seed=seed)
    return world.surrogate(k, sizes)


def test_jit_vmap_equals_one_by_one(x64):
    probs = [_problem(s)[1] for s in range(3)]
    feats = jnp.stack([jnp.asarray(p[0]) for p in probs])
    labels = jnp.stack([jnp.asarray(p[1]) for p in probs])
    qids = jnp.stack([jnp.asarray(p[2]) for p in probs])
    taus = jnp.asarray([-1.0, 0.999, 0.95])
    batched = jax.jit(jax.vmap(lambda f, y, g, t: sc_jax.calibrate(f, y, g, tau=t,
                                                                   num_queries=6)))(
        feats, labels, qids, taus)
    leading = sc_jax.calibrate(feats, labels, qids, tau=taus)  # leading axes, too
    # One compiled single-problem solve (tau traced), called per problem.
    single = jax.jit(lambda f, y, g, t: sc_jax.calibrate(f, y, g, tau=t, num_queries=6))
    for k, (x, y, g) in enumerate(probs):
        one = single(x, y, g, taus[k])
        ref = calibrators.fit(x, y, g, tau=float(taus[k]), dtype="float64")
        assert int(one.status) == Status.CONVERGED == ref.status
        for other in (batched, leading):
            assert int(other.status[k]) == Status.CONVERGED
            np.testing.assert_allclose(other.b[k], one.b, atol=1e-6)
            np.testing.assert_allclose(other.w[k], one.w, atol=1e-6)
            assert abs(float(other.objective[k] - one.objective)) <= 1e-10
        assert abs(float(one.objective) - ref.objective) <= 1e-10 * ref.objective


@pytest.mark.parametrize("tau", [-1.0, 0.999])  # trust region inactive, active
def test_grad_matches_finite_differences(x64, tau):
    x, y, g = _problem(0)[1]
    test = jnp.asarray(np.random.default_rng(1).normal(size=(5, 2)))

    @jax.jit  # one compile for the finite differences' eight calls
    def downstream(features, lam, t):
        cal = sc_jax.calibrate(features, y, g, tau=t, lambda_inv=lam, num_queries=6)
        return jnp.sum(sc_jax.calibrated_log_probs(cal.b, cal.w, test)[:, 1]) + cal.w[0] ** 2

    cal = sc_jax.calibrate(x, y, g, tau=tau)
    assert int(cal.status) == Status.CONVERGED
    assert (float(cal.multiplier) > 0) == (tau > 0)  # the constraint binds at 0.999
    grads = jax.grad(downstream, argnums=(0, 1, 2))(jnp.asarray(x), 0.1, tau)
    direction = np.random.default_rng(3).normal(size=x.shape)
    h = 1e-5
    checks = [
        (jnp.sum(grads[0] * direction),
         (downstream(x + h * direction, 0.1, tau) - downstream(x - h * direction, 0.1, tau))),
        (grads[1], downstream(x, 0.1 + h, tau) - downstream(x, 0.1 - h, tau)),
    ]
    if tau > 0:  # tau has no effect where the constraint is inactive
        checks.append((grads[2], downstream(x, 0.1, tau + h) - downstream(x, 0.1, tau - h)))
    else:
        assert float(grads[2]) == 0.0
    for analytic, diff in checks:
        fd = float(diff) / (2 * h)
        assert abs(float(analytic) - fd) <= 1e-4 * max(abs(fd), 1e-3), (analytic, fd)


def test_no_host_callback_in_the_graph():
    x, y, g = _problem(0)[1]
    jaxpr = str(jax.make_jaxpr(
        lambda f: sc_jax.calibrate(f, y, g, num_queries=6).b)(jnp.asarray(x, jnp.float32)))
    assert "callback" not in jaxpr
    assert "while" in jaxpr  # the solve is in the graph, not on the host


def test_tau_schedule_and_ensemble_match_the_numpy_layer():
    for acc in (0.2, 0.5, 0.69, 0.7, 0.95):
        for n in (2, 3, 6):
            assert abs(float(sc_jax.tau_schedule(acc, n))
                       - calibrators.tau_from_accuracy(acc, n)) <= 1e-6
    rng = np.random.default_rng(0)
    fits = [calibrators.FitResult(b=rng.normal(size=2), w=rng.normal(size=2), status=Status(0),
                                  iterations=0, outer_iterations=0, objective=0.0,
                                  constraint=0.0, violation=0.0, tau=0.0, lambda_inv=0.0,
                                  solver="x", sc_star=False, num_rows=10, base_accuracy=0.5)
            for _ in range(2)]
    feats = [rng.normal(size=(m, 7, 2)) for m in (3, 5)]
    p = calibrators.predict_proba(fits, feats)
    manual = np.mean([np.mean([f.predict_proba(x) for x in fx], 0)
                      for f, fx in zip(fits, feats)], 0)
    np.testing.assert_allclose(p, manual, atol=1e-12)


def test_float64_needs_x64():
    x, y, g = _problem(0)[1]
    if jax.config.jax_enable_x64:
        pytest.skip("x64 is on process-wide")
    with pytest.raises(ValueError, match="jax_enable_x64"):
        sc_jax.calibrate(x, y, g, dtype="float64")
    # The NumPy layer enables it for the solve instead: float64 precision, not float32.
    # (SciPy stops at its iteration limit on this instance, above our optimum.)
    fit = calibrators.fit(x, y, g, tau=0.999, dtype="float64")
    ref = calibrators.fit(x, y, g, tau=0.999, solver="scipy")
    assert fit.status == Status.CONVERGED and fit.violation <= 1e-9
    assert fit.objective <= ref.objective * (1 + 1e-7)


def test_fit_batch_groups_mixed_class_counts():
    w2 = synthetic.World(2, (1.0,), seed=0).surrogate(6, (1,))[1]
    w3 = synthetic.World(3, (1.0, 1.0), seed=1).surrogate(6, (1,))[1]
    fits = calibrators.fit_batch([w3, w2, w3])
    assert [f.num_classes for f in fits] == [3, 2, 3]
    for f, (x, y, _) in zip(fits, [w3, w2, w3]):
        expected = calibrators.tau_from_accuracy(calibrators.base_accuracy(x, y), f.num_classes)
        assert f.tau == pytest.approx(expected)
