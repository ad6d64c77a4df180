"""The public pure-JAX functions under JAX's transformations: ``log_odds``,
``calibrated_log_probs``, ``ensemble_proba`` and ``tau_schedule`` under ``jit``, ``vmap``
and ``grad``; ``calibrate`` under forward mode (``jacfwd``, ``hessian``) and reverse
mode, by implicit differentiation of its KKT conditions (a ``custom_jvp`` rule).

float64 throughout (the ``x64`` fixture). Tolerances:
* jit against eager, vmap against a loop: the same float64 operations, fused
  differently by XLA: relative 1e-12.
* The helpers' gradients against central differences with step h = 1e-6: truncation
  O(h^2) ~ 1e-12 times third derivatives of O(1), rounding eps / h ~ 2e-10: relative
  1e-7 of max(|fd|, 1).
* calibrate's derivatives against central differences with step 1e-5 of the float64
  solve: as in test_jax_calibrate.py, the solve stops within 1e-9 of its KKT point, so
  each difference carries up to 1e-9 / h ~ 1e-4 relative error: relative 1e-4 of
  max(|fd|, 1e-3). The Hessian is checked the same way, by differences of the
  (implicit) first derivatives.
* Implicit reverse mode against jaxopt's ``custom_root``, the earlier path: the same
  KKT system solved by LU, once transposed, at the same KKT point: relative 1e-9.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sc_jax
from sc_jax.calibration import jax_calibrate, synthetic
from sc_jax.calibration.solvers import SolverOptions, Status

EXACT = 1e-12


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def _fd_close(analytic, f, x, direction, h=1e-6, rtol=1e-7):
    """d/ds f(x + s direction) at 0: ``analytic`` against central differences."""
    fd = (f(x + h * direction) - f(x - h * direction)) / (2 * h)
    scale = np.maximum(np.abs(fd), 1.0)
    assert np.all(np.abs(np.asarray(analytic) - fd) <= rtol * scale), (analytic, fd)


def _grad_close(loss, point, rng):
    """jax.grad of ``loss`` at the tuple of arrays ``point``, along a random direction,
    against central differences (:func:`_fd_close`)."""
    direction = tuple(jnp.asarray(rng.normal(size=a.shape)) for a in point)
    grads = jax.grad(loss)(point)
    analytic = sum(jnp.sum(g * d) for g, d in zip(grads, direction))
    shifted = lambda s: loss(tuple(a + s * d for a, d in zip(point, direction)))  # noqa: E731
    _fd_close(analytic, shifted, 0.0, 1.0)


# ---------------------------------------------------------------------------------
# The helpers beside calibrate.


def test_log_odds_under_jit_vmap_grad(x64):
    rng = np.random.default_rng(0)
    lp = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(5, 4, 3))))  # [B, N, n]
    eager = sc_jax.log_odds(lp)
    assert isinstance(eager, jax.Array) and eager.shape == (5, 4, 2)
    # NumPy in, NumPy out: the NumPy fits' callers keep their host arrays.
    assert type(sc_jax.log_odds(np.asarray(lp))) is np.ndarray
    np.testing.assert_allclose(jax.jit(sc_jax.log_odds)(lp), eager, rtol=EXACT)
    np.testing.assert_allclose(jax.vmap(sc_jax.log_odds)(lp),
                               np.stack([sc_jax.log_odds(a) for a in lp]), rtol=EXACT)
    weights = jnp.asarray(rng.normal(size=(5, 4, 2)))
    loss = lambda a: jnp.sum(sc_jax.log_odds(a) * weights)  # noqa: E731
    direction = jnp.asarray(rng.normal(size=lp.shape))
    _fd_close(jnp.sum(jax.grad(loss)(lp) * direction), loss, lp, direction)
    # A traced NaN cannot be read: NaN features, as jnp would give; concrete ones raise.
    assert bool(jnp.isnan(jax.jit(sc_jax.log_odds)(lp.at[0, 0, 1].set(jnp.nan))[0, 0, 0]))
    with pytest.raises(ValueError, match="logprobs hold 1 NaN"):
        sc_jax.log_odds(lp.at[0, 0, 1].set(jnp.nan))


def test_calibrated_log_probs_under_jit_vmap_grad(x64):
    rng = np.random.default_rng(1)
    b, w = (jnp.asarray(rng.normal(size=(4, 2))) for _ in range(2))  # [B, n-1]
    feats = jnp.asarray(rng.normal(size=(6, 2)))  # [T, n-1]
    one = lambda b, w, f: sc_jax.calibrated_log_probs(b, w, f)  # noqa: E731
    eager = one(b[0], w[0], feats)
    np.testing.assert_allclose(jax.jit(one)(b[0], w[0], feats), eager, rtol=EXACT)
    np.testing.assert_allclose(jax.vmap(one, (0, 0, None))(b, w, feats),
                               np.stack([one(b[i], w[i], feats) for i in range(4)]), rtol=EXACT)
    weights = jnp.asarray(rng.normal(size=(6, 3)))
    loss = lambda bwf: jnp.sum(one(*bwf) * weights)  # noqa: E731
    point = (b[0], w[0], feats)
    _grad_close(loss, point, rng)


def test_ensemble_proba_under_jit_vmap_grad(x64):
    rng = np.random.default_rng(2)
    b, w = (jnp.asarray(rng.normal(size=(3, 2, 2))) for _ in range(2))  # [B, S, n-1]
    feats = [jnp.asarray(rng.normal(size=(m, 5, 2))) for m in (3, 4)]  # [m_i, T, n-1]
    weights = jnp.asarray([0.3, 0.7])
    one = lambda b, w, a: sc_jax.ensemble_proba(b, w, feats, a)  # noqa: E731
    eager = one(b[0], w[0], weights)
    np.testing.assert_allclose(jax.jit(one)(b[0], w[0], weights), eager, rtol=EXACT)
    np.testing.assert_allclose(jax.vmap(one, (0, 0, None))(b, w, weights),
                               np.stack([one(b[i], w[i], weights) for i in range(3)]),
                               rtol=EXACT)
    probe = jnp.asarray(rng.normal(size=(5, 3)))
    loss = lambda p: jnp.sum(one(*p) * probe)  # noqa: E731
    point = (b[0], w[0], weights)
    _grad_close(loss, point, rng)


def test_tau_schedule_under_jit_vmap_grad(x64):
    acc = jnp.asarray([0.3, 0.55, 0.8, 0.95])  # one per level of the schedule
    eager = sc_jax.tau_schedule(acc, 3)
    assert len(set(np.asarray(eager).tolist())) == 4
    np.testing.assert_allclose(jax.jit(sc_jax.tau_schedule, static_argnums=1)(acc, 3), eager,
                               rtol=EXACT)
    np.testing.assert_allclose(jax.vmap(sc_jax.tau_schedule, (0, None))(acc, 3),
                               [float(sc_jax.tau_schedule(float(a), 3)) for a in acc], rtol=EXACT)
    # A step function of the accuracy: its derivative is 0 between the thresholds, as
    # central differences (all four points lie >= 0.05 from a threshold) say.
    grads = jax.vmap(jax.grad(sc_jax.tau_schedule), (0, None))(acc, 3)
    _fd_close(grads, lambda a: sc_jax.tau_schedule(a, 3), acc, jnp.ones_like(acc))


# ---------------------------------------------------------------------------------
# calibrate: forward mode through the solve, and reverse mode as before.

# Follow-up phases off: a smaller solver program (each phase is one more copy of the
# evaluation to compile); this problem's solve ends in the first phase either way.
OPTIONS = SolverOptions(follow_runoffs=False, follow_apex=False)


@pytest.fixture(scope="module")
def problem():
    # test_jax_calibrate.py's problem 0: 30 rows over 6 queries, 3 classes, no class
    # separable. At tau = 0.999 the constraint binds (multiplier > 0).
    world = synthetic.World(3, (1.0, -0.4), beta=(0.3, -0.2), row_sd=1.5, seed=0)
    x, y, g = world.surrogate(6, (1,))[1]
    direction = np.random.default_rng(3).normal(size=x.shape)
    return x, y, g, direction


def _solution(problem):
    """(s, lambda_inv, tau) -> [b, w] of calibrate at features x + s direction."""
    x, y, g, direction = problem

    def bw(s, lam, tau):
        cal = sc_jax.calibrate(x + s * direction, y, g, lambda_inv=lam, tau=tau,
                               num_queries=6, options=OPTIONS)
        return jnp.concatenate([cal.b, cal.w])

    return bw


def test_jacfwd_and_hessian_of_calibrate_match_finite_differences(x64, problem):
    bw = _solution(problem)
    x, y, g, _ = problem
    at = (0.0, 0.1, 0.999)
    cal = sc_jax.calibrate(x, y, g, lambda_inv=at[1], tau=at[2], options=OPTIONS)
    assert int(cal.status) == Status.CONVERGED and float(cal.multiplier) > 0

    @jax.jit  # one compile for the three points the Hessian's differences need
    def derivatives(s, lam, tau):
        jac = jax.jacfwd(bw, argnums=(0, 1, 2))(s, lam, tau)  # 3 x [2 (n-1)]
        hess = jax.hessian(lambda lam: bw(s, lam, tau)[0])(lam)  # d^2 b_1 / d lambda_inv^2
        return jnp.stack(jac), hess

    jac, hess = derivatives(*at)
    values = jax.jit(bw)  # one compile for the six solves of the differences
    h = 1e-5
    for arg in range(3):
        step = np.eye(3)[arg] * h
        fd = (values(*(np.add(at, step))) - values(*(np.subtract(at, step)))) / (2 * h)
        close = np.abs(jac[arg] - fd) <= 1e-4 * np.maximum(np.abs(fd), 1e-3)
        assert np.all(close), (arg, jac[arg], fd)
    up, down = derivatives(at[0], at[1] + h, at[2])[0], derivatives(at[0], at[1] - h, at[2])[0]
    fd = float(up[1, 0] - down[1, 0]) / (2 * h)
    assert abs(float(hess) - fd) <= 1e-4 * max(abs(fd), 1e-3), (hess, fd)


def _jaxopt_solve(features, labels1h, groups, lambda_inv, tau, *, sc_star, options):
    """The earlier implicit derivative: jaxopt's ``custom_root`` on the same KKT
    residual and the same solver. A ``custom_vjp``: reverse mode only (``jacfwd``
    through it raises "can't apply forward-mode autodiff (jvp) to a custom_vjp
    function")."""
    from jaxopt import implicit_diff, linear_solve  # deprecated, warns on import

    def optimality(z, *data):
        return jax_calibrate._kkt(z, *data, sc_star)

    @implicit_diff.custom_root(optimality, has_aux=True, solve=linear_solve.solve_lu)
    def solve(init, *data):
        x, sol = jax_calibrate._solve_single(*data, sc_star=sc_star, options=options)
        return jnp.concatenate([x, sol.multiplier[None]]), sol

    init = jnp.zeros(2 * features.shape[-1] + 1, features.dtype)
    return solve(init, features, labels1h, groups, lambda_inv, tau)


def test_reverse_mode_of_calibrate_is_what_jaxopt_gave(x64, problem, monkeypatch):
    bw = _solution(problem)
    probe = jnp.asarray(np.random.default_rng(4).normal(size=4))
    loss = lambda *args: jnp.dot(bw(*args), probe)  # noqa: E731
    at = (0.0, 0.1, 0.999)
    ours = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(*at)
    # The calibrate program is cached across calls: dropped before and after, so that
    # the jaxopt path is traced, and later tests trace the current one again.
    monkeypatch.setattr(jax_calibrate, "_solve_differentiably", _jaxopt_solve)
    jax_calibrate._program.cache_clear()
    try:
        before = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(*at)
    finally:
        jax_calibrate._program.cache_clear()
    for a, b in zip(ours, before):
        assert abs(float(a) - float(b)) <= 1e-9 * max(abs(float(b)), 1.0), (ours, before)
