"""Geometry of the trust-region constraint (paper Eq. final_opt_problem's
mean_c cos(theta_c, v) >= tau, v = (0, 1)), in the full flat x = (b, w):

* the mean smoothed cosine's margin over tau and its derivatives in closed form, and
  the scaled constraint c(z) = (m(x) - tau) sqrt(1 + ||z||^2) the augmented
  Lagrangian works with;
* a polar chart for one class, (b_c, w_c) = e^s (sin phi, cos phi), for the
  follow-up of a run-off;
* moving an end point back onto the constraint;
* the exact projection onto the per-class cones (the projected solver's set).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sc_jax.objective import COSINE_EPS, Params

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
    (:func:`sc_jax.objective.trust_region`) at x = (b, w) ``[2 (n-1)]``, in closed
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


def cosine_margin(x: Array, tau: Array) -> Array:
    """m(x) - tau, the mean smoothed cosine's margin over tau at x = (b, w).

    For tau >= 0.5 it is summed as (1 - tau) - mean_c (1 - cos_c), with
    1 - cos = (b^2 + eps^2) / (sqrt(q) (sqrt(q) + w)) where w >= 0: formed as m - tau,
    a cosine within a few eps of 1 (a class near the identity direction, as tau near
    1 requires) keeps only an absolute eps of its distance from 1, and in float32 an
    active constraint then moves in steps of 1.2e-7 on which the solve stalls. 1 - tau
    is exact in floating point for tau in [0.5, 1]. Below 0.5 the plain difference
    is used: near tau = 0, where the cosines are near 0, it keeps the digits that
    1 - (1 - cos) loses.
    """
    n1 = x.shape[0] // 2
    b, w = x[:n1], x[n1:]
    e2 = jnp.asarray(COSINE_EPS**2, x.dtype)
    root = jnp.sqrt(b * b + w * w + e2)
    gap = jnp.where(w >= 0, (b * b + e2) / (root * (root + jnp.maximum(w, 0.0))),
                    1.0 - w / root)
    # Near tau = 0 (cosines near 0, the apex) the plain difference is the precise one.
    return jnp.where(tau >= 0.5, (1.0 - tau) - jnp.mean(gap), jnp.mean(w / root) - tau)


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


# ---------------------------------------------------------------------------------
# Polar coordinates for one class, for the follow-up phase of a run-off.
#
# The solver's coordinates z equal x except for one class c (``cls``; -1: none),
# whose (b_c, w_c) = e^s (sin phi, cos phi) is held as z[c] = phi and
# z[n1 + c] = s = log ||theta_c||. Along a run-off ||theta_c|| grows by orders of
# magnitude while f falls by amounts that, per unit of ||theta_c||, are far below
# float32's stationarity tolerance (slopes of 5e-9 at ||theta_c|| = 200); per unit
# of s the same fall is ||theta_c|| times larger, and the class's cosine depends on phi alone, so Newton's steps in (phi, s) keep walking
# where those in (b_c, w_c) stop.

def from_polar(z: Array, cls: Array, n1: int) -> Array:
    """Solver coordinates z -> x = (b, w) (``[2 (n - 1)]``); x = z where cls < 0."""
    c = jnp.maximum(cls, 0)
    r = jnp.exp(z[n1 + c])
    x = z.at[c].set(r * jnp.sin(z[c])).at[n1 + c].set(r * jnp.cos(z[c]))
    return jnp.where(cls >= 0, x, z)


def to_polar(x: Array, cls: Array, n1: int) -> Array:
    """x = (b, w) -> solver coordinates with class ``cls`` in polar form (z = x where
    cls < 0). theta_c = 0 has no polar form; the follow-up phase starts only from a
    run-off, where ||theta_c|| is large."""
    c = jnp.maximum(cls, 0)
    b, w = x[c], x[n1 + c]
    z = x.at[c].set(jnp.arctan2(b, w)).at[n1 + c].set(jnp.log(jnp.hypot(b, w)))
    return jnp.where(cls >= 0, z, x)


def polar_chain(z: Array, cls: Array, n1: int, g: Array, H: Array):
    """Gradient and Hessian in z from those in x (chain rule through
    :func:`from_polar`): J^T g and J^T H J + sum_i g_i hess(x_i), where J differs
    from the identity in class c's 2 x 2 block. For cls < 0, (g, H) unchanged."""
    c = jnp.maximum(cls, 0)
    x = from_polar(z, cls, n1)
    b, w = x[c], x[n1 + c]
    i, j = c, n1 + c
    eye = jnp.eye(z.shape[0], dtype=z.dtype)
    J = eye.at[i, i].set(w).at[i, j].set(b).at[j, i].set(-b).at[j, j].set(w)
    gb, gw = g[i], g[j]
    # hess(b) = [[-b, w], [w, b]], hess(w) = [[-w, -b], [-b, w]] in (phi, s).
    extra = (jnp.zeros_like(H).at[i, i].set(-gb * b - gw * w)
             .at[i, j].set(gb * w - gw * b).at[j, i].set(gb * w - gw * b)
             .at[j, j].set(gb * b + gw * w))
    on = cls >= 0
    return jnp.where(on, J.T @ g, g), jnp.where(on, J.T @ H @ J + extra, H)



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
