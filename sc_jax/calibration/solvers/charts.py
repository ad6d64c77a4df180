"""The solver's coordinates z: x = (b, w) itself, or x with some classes re-charted.

A phase of :mod:`.multistart` works in one :class:`Chart`:

* the plain chart, z = x (every first phase);
* one class in polar form, (b_c, w_c) = e^s (sin phi, cos phi), held as z[c] = phi
  and z[n1 + c] = s = log ||theta_c|| (the follow-up of a run-off). Along a run-off
  ||theta_c|| grows by orders of magnitude while f falls by amounts that, per unit of
  ||theta_c||, are far below float32's stationarity tolerance (slopes of 5e-9 at
  ||theta_c|| = 200); per unit of s the same fall is ||theta_c|| times larger, and
  the class's cosine depends on phi alone, so Newton's steps in (phi, s) keep walking
  where those in (b_c, w_c) stop;
* some classes in cosine form, (b_c, t_c) with t_c = cos_c itself (the follow-up of
  a first phase that stopped unconverged near those classes' apex, theta_c = 0):
  w_c = t_c sqrt(b_c^2 + eps^2) / sqrt(1 - t_c^2). Within a few COSINE_EPS of the
  apex the smoothed cosine w_c / sqrt(b_c^2 + w_c^2 + eps^2) bends on the scale eps
  (its Hessian is of order 1 / eps^2) while f is nearly linear there; where the
  constraint binds, the boundary curves away from every straight step, the penalty
  term's error grows like rho (d^2 / eps)^2 in a step of length d, and the trust
  region shrinks until that error is below f's own gain along the boundary, which is
  tiny: the solve crawls along the boundary in steps of 1e-6 to 1e-12 while rho grows
  on the stalled constraint measure. In (b_c, t_c) the constraint is linear; the
  boundary's curvature moves into f's Hessian, where it is weighted by f's gradient
  instead of by rho.

Gradients and Hessians are taken in x (f's by :func:`sc_jax.calibration.objective.value_grad_hess`,
the mean cosine's by :func:`.geometry.mean_cosine_derivatives`) and carried to z by
the chain rule (:func:`carry`), in closed form.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from sc_jax.calibration.objective import COSINE_EPS
from sc_jax.calibration.solvers.geometry import cosine_margin

Array = jax.Array

# Classes within this many COSINE_EPS of their apex at the end of an unconverged first
# phase are held in cosine form by the follow-up. Solves stopped by the crawl ended at
# ||theta_c|| from 1e-5 to 0.02; further out the cosine is a function of the angle
# alone and (b_c, w_c) serve, and t_c near 1 (a class near the identity direction)
# would make w_c's dependence on t_c steep.
APEX_RADIUS = 100.0


class Chart(NamedTuple):
    """Which classes a phase re-charts: ``cls`` (int32 scalar) the class in polar
    form, -1 for none; ``apex`` (``[n1]`` bool) the classes in cosine form. A phase
    uses at most one of the two."""

    cls: Array
    apex: Array


def plain(n1: int) -> Chart:
    """The chart z = x."""
    return Chart(jnp.asarray(-1, jnp.int32), jnp.zeros(n1, bool))


def cosine(apex: Array) -> Chart:
    """The classes of the mask ``apex`` in cosine form."""
    return Chart(jnp.asarray(-1, jnp.int32), apex)


def is_plain(chart: Chart) -> Array:
    return (chart.cls < 0) & ~jnp.any(chart.apex)


def to_x(z: Array, chart: Chart, n1: int) -> Array:
    """Solver coordinates z -> x = (b, w), ``[2 (n - 1)]``."""
    return from_cosine(from_polar(z, chart.cls, n1), chart.apex, n1)


def from_x(x: Array, chart: Chart, n1: int) -> Array:
    """x = (b, w) -> the solver coordinates of ``chart``."""
    return to_cosine(to_polar(x, chart.cls, n1), chart.apex, n1)


def margin(z: Array, chart: Chart, tau: Array, n1: int) -> Array:
    """The mean cosine's margin over tau at z (:func:`.geometry.cosine_margin`), with
    the cosines of the classes in cosine form read from z as they are (exactly linear
    there)."""
    return cosine_margin(to_x(z, chart, n1), tau, exact=chart.apex, cos=z[n1:])


def carry(z: Array, chart: Chart, n1: int, g: Array, h: Array, gm: Array, hm: Array):
    """f's gradient g and Hessian h and the mean cosine's gm, hm, all in x, carried to
    z: unchanged in the plain chart, by :func:`polar_chain` or by :func:`cosine_chain`
    and :func:`cosine_constraint_chain`. One switch: on CPU only its branch runs
    (computing every chain on every pass made small problems measurably slower)."""
    branch = jnp.where(chart.cls >= 0, 1, jnp.where(jnp.any(chart.apex), 2, 0))
    return jax.lax.switch(branch, [
        lambda: (g, h, gm, hm),
        lambda: (*(polar := _polar_carry(z, chart.cls, n1))(g, h), *polar(gm, hm)),
        lambda: (*cosine_chain(z, chart.apex, n1, g, h),
                 *cosine_constraint_chain(gm, hm, chart.apex, n1)),
    ])


# ---------------------------------------------------------------------------------
# Polar form for one class.


def _polar_mask(cls: Array, n1: int) -> Array:
    """``[n1]`` bool, True at class ``cls`` (all False for cls < 0). The polar chart
    is written with this mask and elementwise selects, not with scatters at a traced
    index: the same numbers in a much smaller program (each ``.at[c].set`` was a
    scatter of its own in the solver's loop)."""
    return jnp.arange(n1) == cls


def from_polar(z: Array, cls: Array, n1: int) -> Array:
    """Solver coordinates z -> x = (b, w) (``[2 (n - 1)]``); x = z where cls < 0."""
    on = _polar_mask(cls, n1)
    phi, s = z[:n1], z[n1:]
    r = jnp.exp(jnp.where(on, s, 0.0))
    return jnp.concatenate([jnp.where(on, r * jnp.sin(phi), phi),
                            jnp.where(on, r * jnp.cos(phi), s)])


def to_polar(x: Array, cls: Array, n1: int) -> Array:
    """x = (b, w) -> solver coordinates with class ``cls`` in polar form (z = x where
    cls < 0). theta_c = 0 has no polar form; the follow-up phase starts only from a
    run-off, where ||theta_c|| is large."""
    on = _polar_mask(cls, n1)
    b, w = x[:n1], x[n1:]
    radius = jnp.where(on, jnp.hypot(b, w), 1.0)
    return jnp.concatenate([jnp.where(on, jnp.arctan2(b, w), b),
                            jnp.where(on, jnp.log(radius), w)])


def _diag_blocks(a, b, c, d) -> Array:
    """The ``[2 n1, 2 n1]`` matrix [[diag a, diag b], [diag c, diag d]]."""
    return jnp.block([[jnp.diag(a), jnp.diag(b)], [jnp.diag(c), jnp.diag(d)]])


def polar_chain(z: Array, cls: Array, n1: int, g: Array, H: Array):
    """Gradient and Hessian in z from those in x (chain rule through
    :func:`from_polar`): J^T g and J^T H J + sum_i g_i hess(x_i), where J differs
    from the identity in class c's 2 x 2 block. For cls < 0, (g, H) unchanged."""
    return _polar_carry(z, cls, n1)(g, H)


def _polar_carry(z: Array, cls: Array, n1: int):
    """``(g, H) -> (J^T g, J^T H J + sum_i g_i hess(x_i))`` at z (:func:`polar_chain`),
    J formed once for every gradient and Hessian carried at z."""
    on = _polar_mask(cls, n1)
    x = from_polar(z, cls, n1)
    b, w = x[:n1], x[n1:]
    zero = jnp.zeros_like(b)
    # Class c's block: d(b, w)/d(phi, s) = [[w, b], [-b, w]].
    J = _diag_blocks(jnp.where(on, w, 1.0), jnp.where(on, b, zero),
                     jnp.where(on, -b, zero), jnp.where(on, w, 1.0))
    active = cls >= 0

    def carry_one(g, H):
        gb, gw = g[:n1], g[n1:]
        # hess(b) = [[-b, w], [w, b]], hess(w) = [[-w, -b], [-b, w]] in (phi, s).
        off = jnp.where(on, gb * w - gw * b, zero)
        extra = _diag_blocks(jnp.where(on, -gb * b - gw * w, zero), off, off,
                             jnp.where(on, gb * b + gw * w, zero))
        return jnp.where(active, J.T @ g, g), jnp.where(active, J.T @ H @ J + extra, H)

    return carry_one


# ---------------------------------------------------------------------------------
# Cosine form for the classes near their apex.


def from_cosine(z: Array, apex: Array, n1: int) -> Array:
    """Solver coordinates z -> x = (b, w) (``[2 (n - 1)]``); x = z where apex is
    False. |t_c| >= 1 has no x (f there is not finite, so a step to it is
    rejected)."""
    b, t = z[:n1], z[n1:]
    e2 = jnp.asarray(COSINE_EPS**2, z.dtype)
    w = t * jnp.sqrt(b * b + e2) / jnp.sqrt(jnp.where(apex, 1.0 - t * t, 1.0))
    return jnp.concatenate([b, jnp.where(apex, w, t)])


def to_cosine(x: Array, apex: Array, n1: int) -> Array:
    """x = (b, w) -> solver coordinates with the classes of ``apex`` in cosine form."""
    b, w = x[:n1], x[n1:]
    t = w * jax.lax.rsqrt(b * b + w * w + jnp.asarray(COSINE_EPS**2, x.dtype))
    return jnp.concatenate([b, jnp.where(apex, t, w)])


def cosine_chain(z: Array, apex: Array, n1: int, g: Array, H: Array):
    """Gradient and Hessian in z from those in x (chain rule through
    :func:`from_cosine`): J^T g and J^T H J + sum_c g_{w_c} hess(w_c), where J differs
    from the identity in the rows of the apex classes' w_c. With w = k R,
    k = t / sqrt(1 - t^2), R = sqrt(b^2 + eps^2): dw/db = k b / R,
    dw/dt = R (1 - t^2)^-1.5, d2w/db2 = k eps^2 / R^3, d2w/db dt = b (1 - t^2)^-1.5 / R,
    d2w/dt2 = 3 t R (1 - t^2)^-2.5."""
    b, t = z[:n1], z[n1:]
    e2 = jnp.asarray(COSINE_EPS**2, z.dtype)
    R = jnp.sqrt(b * b + e2)
    r1 = jax.lax.rsqrt(jnp.where(apex, 1.0 - t * t, 1.0))
    k = t * r1
    r3 = r1 * r1 * r1
    zero = jnp.zeros_like(b)
    dwdb = jnp.where(apex, k * b / R, zero)
    dwdt = jnp.where(apex, R * r3, 1.0)
    gw = g[n1:]
    hbb = jnp.where(apex, gw * k * e2 / (R * R * R), zero)
    hbt = jnp.where(apex, gw * b * r3 / R, zero)
    htt = jnp.where(apex, gw * 3.0 * t * R * r3 * r1 * r1, zero)
    J = _diag_blocks(jnp.ones_like(b), zero, dwdb, dwdt)
    extra = _diag_blocks(hbb, hbt, hbt, htt)
    return J.T @ g, J.T @ H @ J + extra


def cosine_constraint_chain(gm: Array, hm: Array, apex: Array, n1: int):
    """The mean cosine's gradient and Hessian in cosine form: exactly 1 / n1 along the
    t_c of a class in cosine form, 0 along its b_c, and no curvature, instead of the
    chain rule's difference of terms of order 1 / eps. (The mean cosine's Hessian is
    block-diagonal per class, so zeroing those rows and columns is exact.)"""
    both = jnp.concatenate([apex, apex])
    gm = jnp.where(both, jnp.concatenate([jnp.zeros(n1, gm.dtype),
                                          jnp.full(n1, 1.0 / n1, gm.dtype)]), gm)
    hm = jnp.where(both[:, None] | both[None, :], 0.0, hm)
    return gm, hm
