"""Geometry of the trust-region constraint (paper Eq. final_opt_problem's
mean_c cos(theta_c, v) >= tau, v = (0, 1)), in the full flat x = (b, w):

* the mean smoothed cosine's margin over tau and its derivatives in closed form, and
  the scaled constraint c(z) = (m(x) - tau) sqrt(1 + ||z||^2) the augmented
  Lagrangian works with;
* moving an end point back onto the constraint;
* the exact projection onto the per-class cones (the projected solver's set).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sc_jax.calibration.objective import COSINE_EPS, Params

Array = jax.Array


def restore_feasibility(x: Array, f: Array, h, fun, feas_tol: float, steps: int = 4):
    """An end point outside the constraint h(x) >= 0 by more than ``feas_tol``, moved
    onto it; (x, f) unchanged otherwise.

    Where one class runs off along a separable direction while the constraint binds,
    no iterate is a KKT point and the last one can sit 1e-9 to 1e-7 outside the
    constraint; an end point reported INFEASIBLE says less than a feasible one
    reported MAX_ITERATIONS (or UNBOUNDED, which the ray test can then certify).
    Gauss-Newton steps on h alone, x + max(0, -h) grad h / ||grad h||^2 (the mean
    cosine involves no data; f is evaluated once, at the end, on CPU only where the
    correction is taken). Every tau < 1 admits the identity, so h can be raised.
    """
    def step(z, _):
        v, gv = jax.value_and_grad(h)(z)
        scale = jnp.maximum(-v, 0.0) / jnp.maximum(jnp.dot(gv, gv), jnp.finfo(z.dtype).tiny)
        return z + scale * gv, None

    z = jax.lax.scan(step, x, None, length=steps)[0]
    use = (h(x) < -feas_tol) & (h(z) >= -feas_tol) & jnp.all(jnp.isfinite(z))
    fz = jax.lax.cond(use, lambda: fun(z), lambda: f)
    return jnp.where(use, z, x), fz


def mean_cosine_derivatives(x: Array):
    """(m, grad m, hess m) of the mean smoothed cosine m(x)
    (:func:`sc_jax.calibration.objective.trust_region`) at x = (b, w) ``[2 (n-1)]``, in closed
    form: the cosine of each class depends on its (b_c, w_c) alone, so m's Hessian is
    a 2 x 2 block per class.

    Per class, with q = b^2 + w^2 + eps^2 and cos = w / sqrt(q):
    d cos/db = -w b / q^1.5, d cos/dw = (b^2 + eps^2) / q^1.5,
    d2/db2 = w (3 b^2 - q) / q^2.5, d2/db dw = b (3 w^2 - q) / q^2.5,
    d2/dw2 = -3 w (b^2 + eps^2) / q^2.5.
    """
    n1 = x.shape[0] // 2
    b, w = x[:n1], x[n1:]
    e2 = jnp.asarray(COSINE_EPS**2, x.dtype)
    q = b * b + w * w + e2
    rq = jax.lax.rsqrt(q)
    r3 = rq / q  # q^-1.5
    r5 = r3 / q  # q^-2.5
    m = jnp.mean(w * rq)
    db, dw = -w * b * r3, (b * b + e2) * r3
    dbb = w * (3.0 * b * b - q) * r5
    dbw = b * (3.0 * w * w - q) * r5
    dww = -3.0 * w * (b * b + e2) * r5
    gm = jnp.concatenate([db, dw]) / n1
    hm = jnp.block([[jnp.diag(dbb), jnp.diag(dbw)], [jnp.diag(dbw), jnp.diag(dww)]]) / n1
    return m, gm, hm


def cosine_margin(x: Array, tau: Array, exact: Array | None = None,
                  cos: Array | None = None) -> Array:
    """m(x) - tau, the mean smoothed cosine's margin over tau at x = (b, w).

    For tau >= 0.5 it is summed as (1 - tau) - mean_c (1 - cos_c), with
    1 - cos = (b^2 + eps^2) / (sqrt(q) (sqrt(q) + w)) where w >= 0: formed as m - tau,
    a cosine within a few eps of 1 (a class near the identity direction, as tau near
    1 requires) keeps only an absolute eps of its distance from 1, and in float32 an
    active constraint then moves in steps of 1.2e-7 on which the solve stalls. 1 - tau
    is exact in floating point for tau in [0.5, 1]. Below 0.5 the plain difference
    is used: near tau = 0, where the cosines are near 0, it keeps the digits that
    1 - (1 - cos) loses.

    exact, cos: ``[n1]`` the classes whose cosine is known exactly, and those
    cosines (the classes a chart holds in cosine form, :mod:`.charts`), used as
    they are.
    """
    n1 = x.shape[0] // 2
    b, w = x[:n1], x[n1:]
    e2 = jnp.asarray(COSINE_EPS**2, x.dtype)
    root = jnp.sqrt(b * b + w * w + e2)
    gap = jnp.where(w >= 0, (b * b + e2) / (root * (root + jnp.maximum(w, 0.0))),
                    1.0 - w / root)
    cosines = w / root
    if exact is not None:
        gap, cosines = jnp.where(exact, 1.0 - cos, gap), jnp.where(exact, cos, cosines)
    # Near tau = 0 (cosines near 0, the apex) the plain difference is the precise one.
    return jnp.where(tau >= 0.5, (1.0 - tau) - jnp.mean(gap), jnp.mean(cosines) - tau)


def scale_constraint(g: Array, gm: Array, hm: Array, z: Array):
    """(c, grad c, hess c) of c(z) = g(z) s(z), s = sqrt(1 + ||z||^2), from g's value,
    gradient and Hessian in the solver's coordinates z."""
    sc = jnp.sqrt(1.0 + jnp.dot(z, z))
    c = g * sc
    gc = sc * gm + g * z / sc
    cross = jnp.outer(gm, z)
    hc = (sc * hm + (cross + cross.T) / sc
          + g * (jnp.eye(z.shape[0], dtype=z.dtype) / sc - jnp.outer(z, z) / (sc * sc * sc)))
    return c, gc, hc


def project_cone(params: Params, tau) -> Params:
    """Euclidean projection of each (b_c, w_c) onto K_tau = { w >= tau ||(b, w)|| }.

    K_tau is the 2-D cone of half-angle alpha = arccos(tau) around v = (0, 1): convex
    for tau >= 0, the complement of an open convex cone around -v for tau < 0. A point
    outside K_tau is nearest to the boundary ray on its own side of the w axis,
    u = (sign(b) sin alpha, cos alpha), and its projection is max(<p, u>, 0) u:

        t = max(|b| sqrt(1 - tau^2) + w tau, 0),   P(b, w) = t (sign(b) sqrt(1 - tau^2), tau).

    For tau >= 0 the clamp at 0 sends the polar cone to the apex. For tau < 0 an
    outside point makes an angle below 90 degrees with that ray, so t > 0 and the
    projection is on the boundary; at b = 0 (on the axis -v) both rays are nearest and
    the b >= 0 one is taken. tau = 1 projects onto the ray b = 0, w >= 0; tau = -1 is
    the identity. Exact (closed form) and elementwise over classes.
    """
    b, w = params
    tau = jnp.asarray(tau, b.dtype)
    sin_a = jnp.sqrt(jnp.maximum(1.0 - tau * tau, 0.0))
    inside = w >= tau * jnp.sqrt(b * b + w * w)
    t = jnp.maximum(jnp.abs(b) * sin_a + w * tau, 0.0)
    sign = jnp.where(b >= 0, 1.0, -1.0).astype(b.dtype)
    return Params(jnp.where(inside, b, t * sign * sin_a), jnp.where(inside, w, t * tau))
