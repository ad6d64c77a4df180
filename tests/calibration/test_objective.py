"""The SC objective: O(N) invariance penalty against brute force, gradients against
finite differences, the trust-region cosine at the apex, and the exact cone projection.

float64 is switched on per test by the ``x64`` fixture (``jax.enable_x64`` is a
context manager scoped to the test, so it never leaks into other modules).
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sc_jax.calibration.objective import (
    COSINE_EPS,
    Params,
    Problem,
    affine_log_probs,
    class_cosines,
    cone_margins,
    cone_violation,
    invariance_penalty,
    mean_nll,
    objective,
    trust_region,
)
from sc_jax.calibration.solvers import project_bias_sc_star, project_cone


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def _problem(rng, n, rows, groups, pad=0):
    """Random problem with `pad` masked rows (garbage values) appended."""
    x = rng.normal(size=(rows + pad, n - 1)) * 2
    y = rng.integers(0, n, rows + pad)
    g = rng.integers(0, groups, rows + pad)
    mask = np.r_[np.ones(rows), np.zeros(pad)]
    return Problem(jnp.asarray(x), jnp.asarray(y, jnp.int32), jnp.asarray(g, jnp.int32),
                   jnp.asarray(mask), groups + 2)  # two empty segments


def _params(rng, n):
    return Params(jnp.asarray(rng.normal(size=n - 1)), jnp.asarray(rng.normal(size=n - 1)))


def _brute_force_penalty(params, prob):
    logp = np.asarray(affine_log_probs(params, prob.features))
    p = np.exp(logp)
    rows = np.flatnonzero(np.asarray(prob.mask) > 0)
    g = np.asarray(prob.query_ids)
    total, pairs = 0.0, 0
    for a, b in itertools.combinations(rows, 2):
        if g[a] == g[b]:
            total += -(p[a] @ logp[b] + p[b] @ logp[a])
            pairs += 1
    return total / pairs if pairs else 0.0


@pytest.mark.parametrize("n", [2, 3, 5])
def test_invariance_penalty_equals_brute_force_pair_mean(x64, n):
    rng = np.random.default_rng(n)
    prob = _problem(rng, n, rows=40, groups=6, pad=7)
    params = _params(rng, n)
    fast = float(invariance_penalty(params, prob))
    assert fast == pytest.approx(_brute_force_penalty(params, prob), rel=1e-12)
    # Padding rows (whatever they hold) do not count.
    assert fast > 0


def test_invariance_penalty_without_pairs_is_zero(x64):
    prob = Problem(jnp.ones((3, 1)), jnp.array([0, 1, 0]), jnp.array([0, 1, 2]),
                   jnp.ones(3), 4)
    assert float(invariance_penalty(Params(jnp.zeros(1), jnp.ones(1)), prob)) == 0.0
    assert np.isfinite(float(objective(Params(jnp.zeros(1), jnp.ones(1)), prob, 1.0)))


def test_mean_nll_matches_numpy(x64):
    rng = np.random.default_rng(0)
    prob = _problem(rng, 4, rows=30, groups=3, pad=5)
    params = _params(rng, 4)
    x, y = np.asarray(prob.features)[:30], np.asarray(prob.labels)[:30]
    z = np.concatenate([np.zeros((30, 1)), x * np.asarray(params.w) + np.asarray(params.b)], 1)
    logp = z - np.log(np.exp(z).sum(1, keepdims=True))
    assert float(mean_nll(params, prob)) == pytest.approx(-logp[np.arange(30), y].mean(),
                                                          rel=1e-12)


def _central_difference(f, x, h=1e-6):
    flat, unravel = jax.flatten_util.ravel_pytree(x)
    grads = []
    for k in range(flat.size):
        e = jnp.zeros_like(flat).at[k].set(h)
        grads.append((f(unravel(flat + e)) - f(unravel(flat - e))) / (2 * h))
    return np.array(grads)


@pytest.mark.parametrize("n", [2, 4])
def test_gradients_match_finite_differences(x64, n):
    import jax.flatten_util  # noqa: F401

    rng = np.random.default_rng(10 + n)
    prob = _problem(rng, n, rows=60, groups=5, pad=4)
    params = _params(rng, n)
    tau = 0.3
    for f in (lambda p: objective(p, prob, 0.7),
              lambda p: mean_nll(p, prob),
              lambda p: invariance_penalty(p, prob),
              trust_region,
              lambda p: jnp.sum(cone_margins(p, tau))):
        auto = jax.flatten_util.ravel_pytree(jax.grad(f)(params))[0]
        f = jax.jit(f)
        np.testing.assert_allclose(auto, _central_difference(f, params), rtol=1e-6, atol=1e-8)


def test_cosine_is_safe_at_the_apex(x64):
    at_apex = Params(jnp.array([0.0, 0.3]), jnp.array([0.0, 0.9]))
    cos = class_cosines(at_apex)
    assert float(cos[0]) == 0.0
    grad = jax.grad(trust_region)(at_apex)
    assert np.all(np.isfinite(np.asarray(grad.b))) and np.all(np.isfinite(np.asarray(grad.w)))
    grad_m = jax.grad(lambda p: jnp.sum(cone_margins(p, 0.5)))(at_apex)
    assert np.all(np.isfinite(np.asarray(grad_m.w)))
    # Away from the apex it is the paper's cosine up to eps^2 / (2 ||theta||^2).
    theta = Params(jnp.array([0.4, -2.0]), jnp.array([1.1, 0.5]))
    exact = np.asarray(theta.w) / np.hypot(np.asarray(theta.b), np.asarray(theta.w))
    rel = np.abs(np.asarray(class_cosines(theta)) / exact - 1)
    assert np.all(rel <= COSINE_EPS**2 / (2 * np.hypot(theta.b, theta.w) ** 2) * 1.01)
    assert np.all(rel > 0)
    # The per-class violation uses the exact cone, in which the apex is feasible.
    assert float(cone_violation(at_apex, 0.99)) == pytest.approx(
        0.99 - 0.9 / np.hypot(0.3, 0.9))


TAUS = [-1.0, -0.9, -0.3, 0.0, 0.4, 0.95, 1.0]


def _in_cone(b, w, tau, tol=1e-12):
    return w >= tau * np.hypot(b, w) - tol


@pytest.mark.parametrize("tau", TAUS)
def test_cone_projection_is_the_nearest_point(x64, tau):
    rng = np.random.default_rng(int((tau + 2) * 100))
    pts = rng.normal(size=(300, 2)) * 2
    proj = project_cone(Params(jnp.asarray(pts[:, 0]), jnp.asarray(pts[:, 1])), tau)
    pb, pw = np.asarray(proj.b), np.asarray(proj.w)
    assert np.all(_in_cone(pb, pw, tau, 1e-12))
    # Brute force: the nearest of many feasible candidates (the closed set sampled on a
    # fine polar grid, plus the apex) is never closer than the projection.
    r = np.linspace(0, 6, 301)
    ang = np.linspace(-np.pi, np.pi, 721)
    cb = (r[:, None] * np.sin(ang)).ravel()
    cw = (r[:, None] * np.cos(ang)).ravel()
    keep = _in_cone(cb, cw, tau, 0.0)
    cb, cw = cb[keep], cw[keep]
    for (b, w), qb, qw in zip(pts[:60], pb[:60], pw[:60]):
        d_proj = np.hypot(b - qb, w - qw)
        d_best = np.min(np.hypot(b - cb, w - cw))
        assert d_proj <= d_best + 1e-12
        if _in_cone(b, w, tau, 0.0):
            assert (qb, qw) == (b, w)
    # Idempotent, and jit / vmap over tau agree with the plain call.
    again = project_cone(proj, tau)
    np.testing.assert_allclose(np.asarray(again.b), pb, atol=1e-12)
    np.testing.assert_allclose(np.asarray(again.w), pw, atol=1e-12)
    batched = jax.jit(jax.vmap(project_cone, in_axes=(None, 0)))(
        Params(jnp.asarray(pts[:5, 0]), jnp.asarray(pts[:5, 1])), jnp.asarray(TAUS))
    np.testing.assert_allclose(np.asarray(batched.w[TAUS.index(tau)]), pw[:5], atol=1e-14)


def test_cone_projection_nonconvex_case_is_on_the_boundary(x64):
    # tau < 0: the excluded set is an open cone around -v; points inside it move to
    # the boundary ray on their own side, never to the apex.
    tau = -0.5
    proj = project_cone(Params(jnp.array([0.1, -0.1, 0.0]), jnp.array([-3.0, -3.0, -1.0])),
                        tau)
    b, w = np.asarray(proj.b), np.asarray(proj.w)
    np.testing.assert_allclose(w / np.hypot(b, w), tau, atol=1e-12)
    assert b[0] > 0 and b[1] < 0 and b[2] > 0


def test_sc_star_projection_is_the_cone_at_w_equal_1(x64):
    for tau in TAUS:
        b = jnp.linspace(-5, 5, 101)
        pb = np.asarray(project_bias_sc_star(b, tau))
        assert np.all(_in_cone(pb, np.ones_like(pb), tau, 1e-12))
        # The largest feasible |b| is kept: the box is exactly the cone's slice.
        feasible = _in_cone(np.asarray(b), np.ones(101), tau, 0.0)
        np.testing.assert_allclose(pb[feasible], np.asarray(b)[feasible], atol=1e-12)
        if tau > 0:  # and the bound is attained: |b| <= sqrt(1/tau^2 - 1)
            assert np.max(np.abs(pb)) == pytest.approx(np.sqrt(1 / tau**2 - 1), abs=1e-12)
