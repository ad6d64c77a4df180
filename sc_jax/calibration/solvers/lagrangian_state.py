"""What the augmented-Lagrangian loop (:mod:`.lagrangian`) keeps fixed, what it
carries from pass to pass, and the functions it evaluates in the solver's
coordinates: f, the scaled constraint c and the augmented Lagrangian L_A.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from sc_jax.calibration.solvers import charts, parameters
from sc_jax.calibration.solvers.charts import Chart
from sc_jax.calibration.solvers.geometry import (
    cosine_margin,
    mean_cosine_derivatives,
    scale_constraint,
)
from sc_jax.calibration.solvers.levels import Rows
from sc_jax.calibration.solvers.types import SolverOptions

Array = jax.Array


# ---------------------------------------------------------------------------------
# Static setup and the grouped state.


class Setup(NamedTuple):
    """What stays fixed during one instance's solve (Python values and traced
    scalars; a closure of the loop, never a loop carry)."""

    rows: Rows
    n1: int
    sc_star: bool
    options: SolverOptions
    tau: Array
    tol: float
    feas_tol: float
    coarse_tol: float
    coarse_feas: float
    coarse_budget: int | Array
    rho_max: float
    # rho grows only on a violation above 10x this (and 10 feas_tol): float32's
    # rounding noise in the constraint measure along a run-off reaches 1e-6 (scaled
    # by sqrt(1 + ||z||^2)), and rho grown on that noise made such solves crawl.
    rho_floor: float


def setup(rows: Rows, n1: int, dtype, tau, *, sc_star: bool, options: SolverOptions) -> Setup:
    """The :class:`Setup` of one instance (tolerances by dtype:
    :meth:`SolverOptions.tolerances`)."""
    tol, feas_tol = options.tolerances(dtype)
    f64 = jnp.dtype(dtype) == jnp.float64
    levels = rows.levels
    # Every subsample level hands over before its budget ends, so every solve ends on
    # all rows (its final f, gradient and status are the full problem's).
    if isinstance(levels, int):
        budget = max(min(options.max_coarse_iter, (options.max_iter - 1) // max(levels, 1)), 1)
    else:
        budget = jnp.maximum(jnp.minimum(
            options.max_coarse_iter, (options.max_iter - 1) // jnp.maximum(levels, 1)), 1)
    return Setup(rows, n1, sc_star, options, jnp.asarray(tau, dtype), tol, feas_tol,
                 max(options.coarse_tol, tol), max(options.coarse_tol, feas_tol), budget,
                 options.rho_max if options.rho_max is not None else (1e8 if f64 else 1e4),
                 1e-9 if f64 else 1e-6)


class Point(NamedTuple):
    """The accepted point z; f, the scaled constraint c and their derivatives there."""

    z: Array
    f: Array
    grad: Array
    hess: Array
    c: Array
    gc: Array
    hc: Array


class Trial(NamedTuple):
    """The pending step, evaluated at the top of the next pass."""

    z: Array  # its end point
    La: Array  # L_A at the accepted point, for the subproblem the step was made on
    pred: Array  # its predicted decrease of L_A
    interior: Array  # a Newton step strictly inside the trust region
    fresh: Array  # a start point: accept it unconditionally
    gsub: Array  # max |grad L_A| at the accepted point, for that subproblem
    radius: Array  # trust-region radius


class Dual(NamedTuple):
    """The outer iteration: multiplier, penalty and progress."""

    mu: Array  # multiplier estimate, >= 0
    rho: Array  # penalty parameter
    measure: Array  # |min(g, mu/rho)| at the last outer update
    outer: Array  # outer updates
    inner: Array  # steps on the current subproblem


class PrimalDual(NamedTuple):
    """The joint primal-dual (SQP) mode."""

    on: Array  # the pending trial is a primal-dual step
    mu: Array  # the multiplier that goes with that trial
    frac: Array  # the fraction of the Newton step it takes (backtracking)
    residual: Array  # KKT residual at the accepted point, which the trial must lower
    entries: Array  # modes begun at a multiplier update


class Coarse(NamedTuple):
    """Where the loop is on the coarse-to-fine levels of rows (:mod:`.levels`):
    ``level`` indexes the subsample sizes; their count means all rows."""

    level: Array
    since: Array  # ``it`` when the level began
    start: Array  # the start point (the all-rows solve's, if a subsample level fails)


class State(NamedTuple):
    point: Point
    trial: Trial
    dual: Dual
    pd: PrimalDual
    coarse: Coarse
    it: Array  # evaluations of f (one per pass)
    done: Array
    chart: Chart  # the solver's coordinates (see .charts)


# ---------------------------------------------------------------------------------
# f, the constraint and the augmented Lagrangian in the solver's coordinates.


def derivatives(su: Setup, z: Array, level, chart: Chart) -> tuple:
    """(f, grad f, hess f, c, grad c, hess c) at z on the rows of level ``level``.

    f's and the mean cosine's derivatives are taken in x and carried to z: for SC* by
    :func:`.parameters.restrict`, otherwise by :func:`.charts.carry`.
    """
    x = to_x(su, z, chart)
    f, g, h = su.rows.evaluate(x, level)
    _, gm, hm = mean_cosine_derivatives(x)
    if su.sc_star:
        g, h = parameters.restrict(g, h, True)
        gm, hm = parameters.restrict(gm, hm, True)
    else:
        g, h, gm, hm = charts.carry(z, chart, su.n1, g, h, gm, hm)
    return (f, g, h, *scale_constraint(margin(su, z, chart), gm, hm, z))


def to_x(su: Setup, z: Array, chart: Chart) -> Array:
    """Solver coordinates -> the full flat x = (b, w)."""
    return parameters.expand(z, True) if su.sc_star else charts.to_x(z, chart, su.n1)


def margin(su: Setup, z: Array, chart: Chart) -> Array:
    """The mean cosine minus tau at z (:func:`.charts.margin`); >= 0 is feasible."""
    if su.sc_star:
        return cosine_margin(parameters.expand(z, True), su.tau)
    return charts.margin(z, chart, su.tau, su.n1)


def constraint(su: Setup, z: Array, chart: Chart) -> Array:
    """The scaled constraint c(z) = (m(x) - tau) sqrt(1 + ||z||^2); >= 0 is feasible."""
    return margin(su, z, chart) * jnp.sqrt(1.0 + jnp.dot(z, z))


def constraint_measure(z: Array, c: Array, mu: Array, rho: Array) -> Array:
    """|min(g, mu / rho)| with the PHR shift, in cosine units (c carries the factor
    sqrt(1 + ||z||^2)): 0 exactly at a feasible, complementary point."""
    shifted = jnp.maximum(mu - rho * c, 0.0)
    return jnp.abs(jnp.minimum(c, shifted / rho)) * jax.lax.rsqrt(1.0 + jnp.dot(z, z))


def lagrangian(p: Point, mu: Array, rho: Array):
    """L_A, its gradient and (generalised) Hessian at the point, and the shifted
    multiplier max(0, mu - rho c)."""
    shifted = jnp.maximum(mu - rho * p.c, 0.0)
    value_ = p.f + (shifted**2 - mu**2) / (2.0 * rho)
    grad = p.grad - shifted * p.gc
    hess = p.hess - shifted * p.hc + jnp.where(mu - rho * p.c > 0, rho, 0.0) * jnp.outer(p.gc, p.gc)
    return value_, grad, hess, shifted

