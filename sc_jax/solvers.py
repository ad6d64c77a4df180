"""Solvers for Eq. final_opt_problem: min f(theta) s.t. mean_c cos(theta_c, v) >= tau.

Three solvers, all on the objective of :mod:`sc_jax.objective`:

* :func:`augmented_lagrangian`: a PHR augmented Lagrangian for the single
  inequality constraint, its subproblems minimised by trust-region Newton steps with
  the exact Hessian (at most 10 parameters: one eigendecomposition per step), in one
  bounded loop. Solves the paper's problem (the *mean* cosine constraint).
* :func:`projected`: ``jaxopt.ProjectedGradient`` (FISTA with backtracking) with the
  exact closed-form projection onto the per-class cones
  { (b_c, w_c) : w_c >= tau ||(b_c, w_c)|| }. Every class then satisfies the
  constraint, so the mean does too: this solves a *more conservative* problem than the
  paper's (a subset of its feasible set), and the two coincide when the constraint is
  inactive or n = 2.
* :func:`scipy`: ``scipy.optimize.minimize(method="trust-constr")`` in float64 with
  exact JAX gradients, Hessians and constraint Jacobians. The parity reference; it
  solves either constraint form (``per_class``).

The JAX solvers are pure functions of pytrees, without Python control flow on values,
so :func:`solve_batch` runs ``jit(vmap(.))`` over a batch of problems padded to one N
(on CPU by default ``jit(lax.map(.))``, one instance after another, called on one
part of the batch per core from host threads: see :func:`resolve_batch_size` and
:func:`resolve_threads`).
Each instance returns a :class:`Status` code instead of raising (optimistix-style).

jaxopt is imported inside the functions that use it: importing it prints a deprecation
warning, which ``import sc_jax`` must not.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from sc_jax.objective import (
    COSINE_EPS,
    Params,
    Problem,
    class_cosines,
    cone_margins,
    cone_violation,
    design,
    objective,
    trust_region,
    value,
    value_grad_hess,
)

Array = jax.Array

METHODS = ("augmented_lagrangian", "projected", "scipy")


class Status(enum.IntEnum):
    """Per-instance result code."""

    CONVERGED = 0
    MAX_ITERATIONS = 1  # stationarity tolerance not met within the iteration budget
    INFEASIBLE = 2  # trust-region constraint violated by more than feas_tol at the end
    NONFINITE = 3  # NaN or inf in the parameters or the objective
    # The infimum is not attained: the data are separable along a feasible
    # direction, f -> 0 as ||theta|| grows; params are the last (feasible) iterate.
    UNBOUNDED = 4
    # Input that breaks the problem's rules (sc_jax.validation), seen inside a traced
    # program where it cannot raise (sc_jax.calibrate under jit); no fit is returned.
    INVALID_INPUT = 5


class Solution(NamedTuple):
    """Result of one solve; under ``vmap`` every field has a leading ``[B]`` axis.

    params: fitted :class:`Params` (``w`` is all ones for SC*).
    status: int32 :class:`Status` code.
    iterations: int32 iterations in total (trust-region Newton steps, outer updates
        included; projected-gradient steps; trust-constr iterations).
    outer_iterations: int32 augmented-Lagrangian subproblems (1 for the others).
    objective: final f(theta), mean-NLL + lambda_inv * InvPenalty.
    constraint: final mean cosine, trust_region(params).
    violation: final violation of the constraint form that was solved: max(0, tau -
        mean cosine), or for the per-class form max_c max(0, tau - cos_c).
    multiplier: Lagrange multiplier of the mean-cosine constraint (augmented
        Lagrangian; 0 for the others).
    """

    params: Params
    status: Array
    iterations: Array
    outer_iterations: Array
    objective: Array
    constraint: Array
    violation: Array
    multiplier: Array


@dataclasses.dataclass(frozen=True)
class SolverOptions:
    """Static solver settings (hashable: part of the compilation key).

    tol: stationarity tolerance, the largest entry of the gradient of the augmented
        Lagrangian (of the gradient mapping for the projected solver). ``None``:
        1e-9 for float64 and 1e-5 for float32. The objective is a
        mean of O(1) terms, so these sit a little above each dtype's noise floor;
        near that floor a full Newton step whose predicted decrease is below the
        rounding of the value also counts as converged, if the gradient is below
        10 tol.
    feas_tol: allowed constraint violation, in units of the cosine. ``None``: 1e-9
        (float64); in float32 1e-7 for the augmented Lagrangian, whose margin is
        summed from 1 - cos terms near tau = 1 (:func:`_cosine_margin`), and 1e-6
        for the projected solver, whose cone projection rounds at eps. The
        tolerance also bounds the slack an active constraint may keep at the end,
        which costs the multiplier times that slack in f: with 1e-6, float32 stopped
        2.8e-4 above float64 on one sweep instance (near-separable 29; 1.4e-5 with
        1e-7). rho still grows only above float32's noise floor (see _al_solve).
    max_iter: evaluations of f, its gradient and Hessian in all (one pass over the
        rows each, and one trust-region Newton step), outer updates included. Under
        vmap the batch runs to its slowest instance's count, and never beyond this.
        A run-off's follow-up phase (``follow_runoffs``) has a budget of its own, so
        a solve that runs off makes at most twice this many.
    max_inner: steps on one subproblem before the multiplier and penalty are
        updated anyway (a subproblem whose infimum lies at infinity, along a
        separable but infeasible direction, is never solved).
    num_starts: augmented-Lagrangian starts (:func:`start_points`: the identity,
        slopes 3, 0.3 and -1, two collapsed calibrators, then fixed pseudo-random
        points), vmapped, each with its own run-off follow-up
        (``follow_runoffs``); the lowest feasible objective is kept, converged or not,
        so a start that runs off to an unattained infimum wins and is reported
        UNBOUNDED. The problem is not convex once the invariance term weighs
        (lambda_inv >= 1), and there one start often ends at a worse KKT point:
        :func:`sc_jax.calibrators.fit_batch` uses ``NONCONVEX_STARTS`` (96) there
        unless given options; the cost is that many solves per instance.
    rho_init, rho_growth, rho_max: PHR penalty parameter schedule. rho grows when the
        constraint measure did not shrink by ``progress`` in one outer step, up to
        rho_max (``None``: 1e8 in float64, 1e4 in float32, since the penalty's
        rounding noise grows with rho).
    radius_init, radius_max: trust-region radius in parameter units.
    max_pg_iter, pg_restart: projected-gradient iterations in all, and between
        momentum restarts.
    coarse_rows, coarse_tol, max_coarse_iter: subsample sizes (an int or a tuple;
        default 2,048). A problem of N rows is first solved on a fixed random
        subsample of each size m with N > 2 m, smallest first, each stage from the
        last one's end, to a stationarity and feasibility of ``coarse_tol`` (the
        sampling error is about 1/sqrt(m), so a tighter solve there buys nothing),
        in at most ``max_coarse_iter`` evaluations per stage; the solve then ends on
        all rows. The cheap stages absorb the slow start from the identity (Newton's
        steps on a logistic loss far from its minimiser lengthen w by about one per
        step); the later ones begin near their solution, where a few joint
        primal-dual Newton steps finish them. Every stage costs about 1 s of compile
        time per bucket (one more copy of the evaluation): (256, 2048) ran the n = 3
        float64 benchmark batch about 10% faster than 2048 alone and compiled 3.5 s
        longer at k = 8, so it is an option for very large N, not the default. If a
        subsample stage fails, the solve continues on all rows afresh. At most
        ``max_iter - 1`` evaluations go to the subsamples. 0 (or an empty tuple)
        disables.
    follow_runoffs: after a solve whose end point the ray test finds on a run-off
        (f falls when theta, or one class's part of it, is scaled up), solve again
        from the followed point with that class in polar coordinates (see
        :func:`augmented_lagrangian`). Off: the first phase's end point is reported.
        (SC* has no follow-up: its w is pinned.)
    """

    tol: float | None = None
    feas_tol: float | None = None
    max_iter: int = 200
    max_inner: int = 20
    num_starts: int = 1
    rho_init: float = 10.0
    rho_growth: float = 10.0
    rho_max: float | None = None
    progress: float = 0.25
    radius_init: float = 1.0
    radius_max: float = 1e3
    max_pg_iter: int = 10000
    pg_restart: int = 100
    coarse_rows: int | tuple[int, ...] = (2048,)
    coarse_tol: float = 1e-3
    max_coarse_iter: int = 60
    follow_runoffs: bool = True

    def __post_init__(self):
        # Bad subsample sizes fail here, not as a shape error deep inside a trace.
        sizes = (self.coarse_rows,) if not isinstance(self.coarse_rows, tuple) else self.coarse_rows
        if any(isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 0
               for m in sizes):
            raise ValueError("coarse_rows must be a non-negative int or a tuple of them "
                             f"(0 disables), got {self.coarse_rows!r}")

    def coarse_levels(self, num_rows: int) -> list[int]:
        """The subsample sizes a problem of ``num_rows`` rows is solved on before all
        rows, ascending: each ``coarse_rows`` entry m with num_rows > 2 m."""
        sizes = (self.coarse_rows,) if isinstance(self.coarse_rows, int) else self.coarse_rows
        if self.max_iter <= 1:
            return []
        return sorted({int(m) for m in sizes if 0 < m and num_rows > 2 * m})

    def tolerances(self, dtype, projected: bool = False) -> tuple[float, float]:
        f64 = jnp.dtype(dtype) == jnp.float64
        tol = self.tol if self.tol is not None else (1e-9 if f64 else 1e-5)
        feas = self.feas_tol if self.feas_tol is not None else (
            1e-9 if f64 else (1e-6 if projected else 1e-7))
        return tol, feas


# ---------------------------------------------------------------------------------
# Parameterisation shared by the solvers: full SC optimises (b, w); SC* optimises b
# alone with w pinned at 1 (the paper's SC*, a shift-only calibrator). The
# trust-region constraint is kept for SC*, evaluated at (b, 1).


def _to_params(x, sc_star: bool) -> Params:
    return Params(x, jnp.ones_like(x)) if sc_star else x


def _initial_x(problem: Problem, sc_star: bool):
    n1 = problem.num_classes - 1
    dtype = problem.features.dtype
    b = jnp.zeros(n1, dtype)
    return b if sc_star else Params(b, jnp.ones(n1, dtype))


def _flat_params(x: Array, sc_star: bool) -> Params:
    """Flat x (``[2(n-1)]``, or ``[n-1]`` for SC*) -> :class:`Params`."""
    if sc_star:
        return Params(x, jnp.ones_like(x))
    n1 = x.shape[0] // 2
    return Params(x[:n1], x[n1:])


def _finish(params: Params, problem: Problem, lambda_inv, tau, *, converged, violation,
            feas_tol, iterations, outer_iterations, unbounded=False,
            multiplier=None, objective_value=None) -> Solution:
    obj = objective(params, problem, lambda_inv) if objective_value is None \
        else objective_value
    finite = jnp.isfinite(obj) & jnp.all(jnp.isfinite(params.b)) & jnp.all(
        jnp.isfinite(params.w))
    status = jnp.where(
        ~finite, Status.NONFINITE,
        jnp.where(violation > feas_tol, Status.INFEASIBLE,
                  jnp.where(unbounded, Status.UNBOUNDED,
                            jnp.where(converged, Status.CONVERGED, Status.MAX_ITERATIONS))))
    dtype = obj.dtype
    return Solution(
        params=params,
        status=status.astype(jnp.int32),
        iterations=jnp.asarray(iterations, jnp.int32),
        outer_iterations=jnp.asarray(outer_iterations, jnp.int32),
        objective=obj,
        constraint=trust_region(params),
        violation=violation,
        multiplier=jnp.zeros((), dtype) if multiplier is None else jnp.asarray(multiplier, dtype),
    )


# ---------------------------------------------------------------------------------
# Trust-region subproblem, exact for p <= 10 parameters.


_SECULAR_STEPS = 60


def trust_region_step(g: Array, H: Array, radius: Array) -> tuple[Array, Array]:
    """argmin_s g.s + s.H.s / 2 subject to ||s|| <= radius, and its predicted decrease.

    g ``[p]``, H ``[p, p]`` symmetric (any inertia), radius > 0. Exact up to rounding
    (More & Sorensen 1983, via one eigendecomposition, affordable for p <= 10): the
    Newton step -H^-1 g when H is positive definite and the step fits; otherwise
    s(l) = -(H + l I)^-1 g with l > max(0, -lambda_min) solving ||s(l)|| = radius by
    safeguarded Newton on 1/||s(l)|| - 1/radius (a few steps, at most
    ``_SECULAR_STEPS``), plus a component along the lowest
    eigenvector in the "hard case" where g has none. Returns (s, -(g.s + s.H.s/2)).
    """
    dtype = g.dtype
    eps = jnp.finfo(dtype).eps
    lam, Qm = jnp.linalg.eigh(H)  # ascending
    gt = Qm.T @ g
    scale = jnp.maximum(jnp.max(jnp.abs(lam)), jnp.finfo(dtype).tiny)
    floor = 10.0 * eps * scale  # eigenvalues below this count as zero
    lo = jnp.maximum(0.0, -lam[0])
    gnorm = jnp.linalg.norm(g)

    def norms(l):
        den = jnp.maximum(lam + l, floor)
        s = -gt / den
        return s, jnp.linalg.norm(s), jnp.sum(gt * gt / den**3)

    s0, n0, _ = norms(0.0)
    newton = (lam[0] > floor) & (n0 <= radius)

    def boundary():
        # Secular equation on (lo, hi]: ||s(hi)|| <= ||g|| / (lam_min + hi) <= radius.
        hi = lo + gnorm / radius + floor
        rtol = 10.0 * eps

        # From the left of the root, where 1/||s(l)|| is concave, Newton's iterates
        # rise monotonically to it (More & Sorensen); the bracket guards against
        # rounding. A few steps usually; at most _SECULAR_STEPS.
        def cond(c):
            a, b, l, ns, k = c
            return (k < _SECULAR_STEPS) & (jnp.abs(ns - radius) > rtol * radius)

        def body(c):
            a, b, l, _, k = c
            _, ns, q = norms(l)
            a = jnp.where(ns > radius, l, a)
            b = jnp.where(ns > radius, b, l)
            # More-Sorensen: l += (||s|| / ||q||)^2 (||s|| - radius) / radius with
            # ||q||^2 = s.(H + l I)^-1 s = sum gt^2 / (lam + l)^3.
            step = (ns * ns / jnp.maximum(q, jnp.finfo(dtype).tiny)) * (ns - radius) / radius
            cand = l + step
            cand = jnp.where((cand > a) & (cand < b), cand, 0.5 * (a + b))
            # ns belongs to l: a converged l is kept (the bracket excludes it).
            l = jnp.where(jnp.abs(ns - radius) > rtol * radius, cand, l)
            return a, b, l, ns, k + 1

        inf = jnp.asarray(jnp.inf, dtype)
        _, _, l, _, _ = jax.lax.while_loop(
            cond, body, (lo, hi, lo + floor, inf, jnp.zeros((), jnp.int32)))
        s, ns, _ = norms(l)
        # Hard case: g (nearly) orthogonal to the lowest eigenvector of an indefinite
        # H, so ||s(l)|| < radius for every l > lo: move along that eigenvector to
        # the boundary (it lowers the model there), on the side where g does not rise.
        hard = (lam[0] < -floor) & (ns < radius * (1.0 - 1e-6))
        edge = jnp.sqrt(jnp.maximum(radius * radius - ns * ns + s[0] * s[0], 0.0))
        return s.at[0].set(jnp.where(hard, jnp.where(gt[0] > 0, -edge, edge), s[0]))

    # Interior Newton steps (most of them) skip the secular solve; under vmap the
    # cond becomes a select and both branches run.
    s = jax.lax.cond(newton, lambda: s0, boundary)
    pred = -(jnp.dot(gt, s) + 0.5 * jnp.dot(lam * s, s))
    return Qm @ s, pred


# ---------------------------------------------------------------------------------
# Augmented Lagrangian (PHR) with trust-region Newton inner steps.


def _not_attained(x: Array, f: Array, hess: Array, fun, feasible, n1: int, *,
                  converged: Array, tol: float, doublings: int = 12,
                  follow_rtol: float = 1e-6, one_site: bool = False,
                  force: Array | bool = False, with_class: bool = False):
    """Whether f decreases when theta (or one class's (b_c, w_c)) is scaled by 2, and
    does not rise again when it is scaled by 4; with the point to report.

    Returns ``(not_attained, x_out, f_out)``, and with ``with_class`` also the class
    whose ray fell furthest (the largest ||theta_c|| where the whole of theta's ray
    did) and, per ray ``[n]`` (all of theta, then each class), f at 2x (NaN where
    the test did not run or the point left the constraint). Where the infimum is not attained, the
    run-off is followed along the ray that fell furthest: the scale keeps doubling
    (up to 2^``doublings``) while each doubling lowers f by more than
    ``follow_rtol`` |f| and stays feasible, and the last such point is returned. A
    solve that stopped early in the slow valley of a run-off (in float32, where the
    Newton steps' predicted decreases fall below its rounding long before f is near
    its infimum) then reports a point whose f is as close to the infimum along the
    ray as float64's; falls below ``follow_rtol`` (a class that has saturated) move
    nothing. ``x_out, f_out = x, f`` otherwise.

    Scaling leaves every cosine unchanged (up to the O(eps^2) smoothing), so the rays
    are feasible. At a minimiser f rises along every ray (or, at theta_c = 0, stays
    exactly the same); where the data are separable along the ray, f keeps falling
    towards an infimum that no finite theta attains. In float32 the fall can be
    below the resolution of f, and the instance then reports CONVERGED or
    MAX_ITERATIONS instead.

    The 2 (n - 1 + 1) evaluations of f are made only where they can succeed: after a
    solve that did not converge, or where f's curvature along some ray, r^T H r /
    ||r||^2, is below sqrt(tol). Along a ray of separation f behaves like
    A exp(-kappa s), whose curvature is kappa times its slope, and the slope is below
    the stationarity tolerance where the solve stopped. (``lax.cond``: skipped on
    CPU, where instances run one by one; under vmap both branches run.)

    one_site: evaluate the 2 (n - 1 + 1) points one by one in the loop that follows
    the run-off, instead of as one vmapped batch: the same result (a test compares
    them) with one copy of f's code in the program instead of two, for the solver
    that runs instances one by one anyway (:func:`_solve_slots`). Under vmap (the
    accelerators' whole-bucket solves) the batch is one pass instead of 2 (n - 1 + 1).

    force: test whatever the curvature and convergence say (the polar follow-up
    phase, whose Hessian is not in x's coordinates).
    """
    p = x.shape[0]
    # Ray directions: all of x, then each class's parameters alone.
    cls = jnp.arange(p) % n1
    dirs = jnp.concatenate([jnp.ones((1, p), x.dtype),
                            (cls[None, :] == jnp.arange(n1)[:, None]).astype(x.dtype)])
    rays = dirs * x  # [R, p]
    norm2 = jnp.sum(rays * rays, axis=1)
    curv = jnp.einsum("rp,pq,rq->r", rays, hess, rays) / jnp.maximum(
        norm2, jnp.finfo(x.dtype).tiny)
    gate = force | ~converged | jnp.any((norm2 > 0) & (curv <= jnp.sqrt(tol)))
    # The class a follow-up phase puts in polar form, per ray (ray 0 scales all of x).
    ray_class = jnp.concatenate([
        jnp.argmax(jnp.square(x[:n1]) + jnp.square(x[n1:]) if p == 2 * n1 else jnp.abs(x))[None],
        jnp.arange(n1)]).astype(jnp.int32)

    def test():
        scaled = x + rays[:, None, :] * jnp.asarray([1.0, 3.0], x.dtype)[None, :, None]
        pts = scaled.reshape(-1, p)  # f at 2x and 4x along each ray
        m = pts.shape[0]
        # Only feasible rays count (for SC*, whose w is pinned, scaling b leaves the
        # cone), and only falls above the rounding of f (in float32 a flat ray
        # once passed on rounding alone).
        ok = jnp.all(jax.vmap(jax.vmap(feasible))(scaled), axis=1)
        # Each fall is measured against the rounding of the value it falls from (f
        # can shrink by hundreds of orders of magnitude along a ray, or underflow to
        # 0). After the first fall, a second that is below rounding counts too: f
        # tends to its infimum along the ray like exp(-kappa s), so once the class
        # that separates has saturated, f(4x) = f(2x) to the last digit (a bowl
        # whose minimum lies between 2x and 4x would need f(2x) = f(4x) to 100 eps
        # by coincidence).
        r = 100.0 * jnp.finfo(x.dtype).eps

        def judge(fs):  # whether a ray fell, which fell furthest, the chain's start
            fs = fs.reshape(-1, 2)
            falls = ok & (fs[:, 0] < f * (1.0 - r)) & (fs[:, 1] <= fs[:, 0] * (1.0 + r))
            flag = jnp.any(falls)
            k = jnp.argmin(jnp.where(falls, fs[:, 1], jnp.inf))
            # Without a run-off, the class whose ray fell furthest at 2x.
            k2 = jnp.argmin(jnp.where(ok, fs[:, 0], jnp.inf))
            # The chain starts at 2x (the first fall, known to be feasible); 4x is
            # evaluated again so that every step of it is judged the same way.
            alive0 = flag & (fs[k, 0] < f * (1.0 - follow_rtol))
            return (flag, rays[k], jnp.where(alive0, x + rays[k], x),
                    jnp.where(alive0, fs[k, 0], f), alive0,
                    jnp.where(flag, ray_class[k], ray_class[k2]))

        def at2x(fs):  # per ray: f at 2x, NaN where the ray left the constraint
            return jnp.where(ok, fs.reshape(-1, 2)[:, 0], jnp.nan)

        # One loop, one evaluation of f per pass: with one_site the rays' points one
        # by one (passes 0..m-1), then the chain's doublings. A while_loop, not a
        # scan: the chain ends at its first doubling that does not fall, so a ray
        # whose class saturates costs one evaluation of f, not ``doublings``.
        def body(c):
            i, fs, flag, ray, z, fz, alive, j, cl = c
            scan = i < m
            pt = jnp.where(scan, pts[jnp.minimum(i, m - 1)],
                           x + (2.0 ** j.astype(x.dtype) - 1.0) * ray)
            fp = fun(pt)
            fs = jnp.where(scan, fs.at[jnp.minimum(i, m - 1)].set(fp), fs)
            last = i == m - 1
            flag_n, ray_n, z0, f0, alive0, cl_n = judge(fs)
            grow = (fp < fz * (1.0 - follow_rtol)) & feasible(pt)
            return (i + 1, fs, jnp.where(last, flag_n, flag), jnp.where(last, ray_n, ray),
                    jnp.where(scan, jnp.where(last, z0, z), jnp.where(grow, pt, z)),
                    jnp.where(scan, jnp.where(last, f0, fz), jnp.where(grow, fp, fz)),
                    jnp.where(scan, last & alive0, grow), jnp.where(scan, 2, j + 1),
                    jnp.where(last, cl_n, cl))

        two = jnp.asarray(2, jnp.int32)
        if one_site:
            init = (jnp.asarray(0, jnp.int32), jnp.zeros(m, x.dtype), jnp.asarray(False),
                    jnp.zeros_like(x), x, f, jnp.asarray(False), two, ray_class[0])
        else:  # the rays' points as one vmapped batch; the loop is the chain's alone
            fs = jax.vmap(fun)(pts)
            flag0, ray0, z0, f0, alive0, cl0 = judge(fs)
            init = (jnp.asarray(m, jnp.int32), fs, flag0, ray0, z0, f0, alive0, two, cl0)
        out = jax.lax.while_loop(lambda c: (c[0] < m) | (c[6] & (c[7] <= doublings)),
                                 body, init)
        return out[2], out[4], out[5], out[8], at2x(out[1])

    out = jax.lax.cond(gate, test, lambda: (jnp.asarray(False), x, f, ray_class[0],
                                            jnp.full(n1 + 1, jnp.nan, x.dtype)))
    return out if with_class else out[:3]


def _restore_feasibility(x: Array, f: Array, h, fun, feas_tol: float, steps: int = 4):
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
        return z + jnp.maximum(-v, 0.0) / jnp.maximum(jnp.dot(gv, gv), jnp.finfo(z.dtype).tiny) * gv, None

    z = jax.lax.scan(step, x, None, length=steps)[0]
    use = (h(x) < -feas_tol) & (h(z) >= -feas_tol) & jnp.all(jnp.isfinite(z))
    fz = jax.lax.cond(use, lambda: fun(z), lambda: f)
    return jnp.where(use, z, x), fz


def _mean_cosine_derivatives(x: Array, sc_star: bool):
    """(m, grad m, hess m) of the mean smoothed cosine m(x)
    (:func:`sc_jax.objective.trust_region`) in closed form: the cosine of each class
    depends on its (b_c, w_c) alone, so m's Hessian is a 2 x 2 block per class.

    Per class, with q = b^2 + w^2 + eps^2 and cos = w / sqrt(q):
    d cos/db = -w b / q^1.5, d cos/dw = (b^2 + eps^2) / q^1.5,
    d2/db2 = w (3 b^2 - q) / q^2.5, d2/db dw = b (3 w^2 - q) / q^2.5,
    d2/dw2 = -3 w (b^2 + eps^2) / q^2.5. For SC* (x = b, w = 1) the b entries alone.
    """
    n1 = x.shape[0] if sc_star else x.shape[0] // 2
    b = x if sc_star else x[:n1]
    w = jnp.ones_like(b) if sc_star else x[n1:]
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
    if sc_star:
        return m, db / n1, jnp.diag(dbb) / n1
    gm = jnp.concatenate([db, dw]) / n1
    hm = jnp.block([[jnp.diag(dbb), jnp.diag(dbw)], [jnp.diag(dbw), jnp.diag(dww)]]) / n1
    return m, gm, hm


def _cosine_margin(x: Array, tau: Array, sc_star: bool) -> Array:
    """m(x) - tau, the mean smoothed cosine's margin over tau, summed as
    (1 - tau) - mean_c (1 - cos_c) with 1 - cos = (b^2 + eps^2) / (sqrt(q) (sqrt(q) + w))
    where w >= 0. Formed as m - tau, a cosine within a few eps of 1 (a class near
    the identity direction, as tau near 1 requires) keeps only an absolute eps of
    its distance from 1: in float32 the constraint then moved in steps of 1.2e-7
    (1.3e-5 once scaled by sqrt(1 + ||z||^2)) and a solve whose constraint was
    active stalled on that noise (sweep near-separable 29: MAX_ITERATIONS). 1 - tau
    is exact in floating point for tau in [0.5, 1]; below 0.5 the plain difference
    is used (near tau = 0, where cosines are near 0, it keeps the digits that
    1 - (1 - cos) loses: a float32 apex solve ended MAX_ITERATIONS)."""
    n1 = x.shape[0] if sc_star else x.shape[0] // 2
    b = x if sc_star else x[:n1]
    w = jnp.ones_like(b) if sc_star else x[n1:]
    e2 = jnp.asarray(COSINE_EPS**2, x.dtype)
    root = jnp.sqrt(b * b + w * w + e2)
    gap = jnp.where(w >= 0, (b * b + e2) / (root * (root + jnp.maximum(w, 0.0))),
                    1.0 - w / root)
    # Near tau = 0 (cosines near 0, the apex) the plain difference is the precise one.
    return jnp.where(tau >= 0.5, (1.0 - tau) - jnp.mean(gap), jnp.mean(w / root) - tau)


def _scale_constraint(g: Array, gm: Array, hm: Array, z: Array):
    """(c, grad c, hess c) of c(z) = g(z) s(z), s = sqrt(1 + ||z||^2), from g's value,
    gradient and Hessian in the solver's coordinates z."""
    sc = jnp.sqrt(1.0 + jnp.dot(z, z))
    c = g * sc
    gc = sc * gm + g * z / sc
    cross = jnp.outer(gm, z)
    hc = (sc * hm + (cross + cross.T) / sc
          + g * (jnp.eye(z.shape[0], dtype=z.dtype) / sc - jnp.outer(z, z) / (sc * sc * sc)))
    return c, gc, hc


def _scaled_cosine_derivatives(x: Array, tau: Array, sc_star: bool):
    """(c, grad c, hess c) of the scaled constraint c(x) = (m(x) - tau) s(x), with m the
    mean smoothed cosine and s = sqrt(1 + ||x||^2), in closed form
    (:func:`_mean_cosine_derivatives`). ``jax.hessian`` of the same function gave the
    same numbers (a test compares them) with about as many operations to compile as
    an evaluation of f itself."""
    _, gm, hm = _mean_cosine_derivatives(x, sc_star)
    return _scale_constraint(_cosine_margin(x, tau, sc_star), gm, hm, x)


# ---------------------------------------------------------------------------------
# Polar coordinates for one class, for the follow-up phase of a run-off.
#
# The solver's coordinates z equal x except for one class c (``cls``; -1: none),
# whose (b_c, w_c) = e^s (sin phi, cos phi) is held as z[c] = phi and
# z[n1 + c] = s = log ||theta_c||. Along a run-off ||theta_c|| grows by orders of
# magnitude while f falls by amounts that, per unit of ||theta_c||, are far below
# float32's stationarity tolerance (a slope of 5e-9 at ||theta_c|| = 200 on one
# sweep instance); per unit of s the same fall is ||theta_c|| times larger, and the
# class's cosine depends on phi alone, so Newton's steps in (phi, s) keep walking
# where those in (b_c, w_c) stop.


def _from_polar(z: Array, cls: Array, n1: int) -> Array:
    """Solver coordinates z -> x = (b, w) (``[2 (n - 1)]``); x = z where cls < 0."""
    c = jnp.maximum(cls, 0)
    r = jnp.exp(z[n1 + c])
    x = z.at[c].set(r * jnp.sin(z[c])).at[n1 + c].set(r * jnp.cos(z[c]))
    return jnp.where(cls >= 0, x, z)


def _to_polar(x: Array, cls: Array, n1: int) -> Array:
    """x = (b, w) -> solver coordinates with class ``cls`` in polar form (z = x where
    cls < 0). theta_c = 0 has no polar form; the follow-up phase starts only from a
    run-off, where ||theta_c|| is large."""
    c = jnp.maximum(cls, 0)
    b, w = x[c], x[n1 + c]
    z = x.at[c].set(jnp.arctan2(b, w)).at[n1 + c].set(jnp.log(jnp.hypot(b, w)))
    return jnp.where(cls >= 0, z, x)


def _polar_chain(z: Array, cls: Array, n1: int, g: Array, H: Array):
    """Gradient and Hessian in z from those in x (chain rule through
    :func:`_from_polar`): J^T g and J^T H J + sum_i g_i hess(x_i), where J differs
    from the identity in class c's 2 x 2 block. For cls < 0, (g, H) unchanged."""
    c = jnp.maximum(cls, 0)
    x = _from_polar(z, cls, n1)
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


def _kkt_residual(gf: Array, c: Array, gc: Array, mu: Array) -> Array:
    """||(grad f - mu grad c, c)||_2: the residual of the KKT conditions with the
    (scaled) constraint c active, whose Newton step :func:`_sqp_step` is. Newton's
    direction descends on it (its directional derivative is minus itself), so a
    backtracking line search on it always succeeds where the KKT matrix is regular."""
    return jnp.sqrt(jnp.sum((gf - mu * gc) ** 2) + c * c)


def _sqp_step(gf: Array, hf: Array, c: Array, gc: Array, hc: Array, mu: Array):
    """Newton's step on the KKT conditions grad f - mu grad c = 0, c = 0:

        [H_L  -gc] [dx    ]   [-grad f]
        [gc^T   0] [mu_new] = [  -c   ],   H_L = hess f - mu hess c.

    Returns (dx [p], mu_new, valid): valid where the solve is finite, mu_new > 0 (the
    constraint stays active) and the KKT matrix has the inertia (p, 1) of a strict
    local minimiser (H_L positive definite on the constraint's tangent space)."""
    p = gf.shape[0]
    kkt = jnp.block([[hf - mu * hc, -gc[:, None]], [gc[None, :], jnp.zeros((1, 1), gf.dtype)]])
    sol = jnp.linalg.solve(kkt, -jnp.concatenate([gf, c[None]]))
    # The symmetric form (last row negated) has the inertia of the KKT system.
    sym = kkt.at[p].multiply(-1.0)
    lam = jnp.linalg.eigvalsh(sym)
    floor = 1e3 * jnp.finfo(gf.dtype).eps * jnp.max(jnp.abs(lam))
    valid = (jnp.all(jnp.isfinite(sol)) & (sol[p] > 0)
             & (jnp.sum(lam < -floor) == 1) & (jnp.sum(lam > floor) == p))
    return sol[:p], sol[p], valid


# Primal-dual (SQP) modes begun at multiplier updates, per solve (augmented_lagrangian).
_SQP_ENTRIES = 3
# The terminal step (augmented_lagrangian) ends a solve where the residual that
# quadratic convergence predicts after the step is below this fraction of tol; 0
# turns it off (every solve then ends on an evaluated point).
_TERMINAL_FRACTION = 0.1


class _ALState(NamedTuple):
    x: Array  # [p] accepted point
    f: Array  # objective, gradient and Hessian at x
    grad: Array
    hess: Array
    c: Array  # scaled constraint, its gradient and Hessian at x
    gc: Array
    hc: Array
    La: Array  # L_A(x; mu, rho) for the subproblem the pending step was made on
    trial: Array  # [p] pending step's end point, evaluated at the top of the next pass
    pred: Array  # its predicted decrease of L_A
    interior: Array  # it is a Newton step strictly inside the trust region
    mu: Array  # multiplier estimate, >= 0
    rho: Array  # penalty parameter
    radius: Array  # trust-region radius
    measure: Array  # |min(g, mu/rho)| at the last outer update
    outer: Array
    inner: Array  # steps on the current subproblem
    it: Array  # objective evaluations (one per pass)
    done: Array
    fresh: Array  # the trial is a start point: accept it unconditionally
    level: Array  # the stage: index into the subsample sizes; their count = all rows
    stage_it: Array  # `it` when the stage began
    start: Array  # [p] the start point (the full solve's, if the coarse one fails)
    sqp: Array  # the pending trial is a joint primal-dual Newton step (all-rows stage)
    mu_trial: Array  # the multiplier that goes with that trial
    frac: Array  # the fraction of the Newton step that trial takes (backtracking)
    residual: Array  # KKT residual at x (with mu), which the trial must lower
    entries: Array  # primal-dual modes begun at a multiplier update
    gsub: Array  # max |grad L_A| at x for the subproblem the pending step was made on
    cls: Array  # the class held in polar coordinates (-1: none; see _from_polar)


def augmented_lagrangian(problem: Problem, lambda_inv, tau, *, sc_star: bool = False,
                         options: SolverOptions = SolverOptions()) -> Solution:
    """Solve Eq. final_opt_problem (mean-cosine constraint) for one problem.

    PHR augmented Lagrangian for the single constraint g(x) = mean_c cos_c - tau >= 0
    (scaled, see below),

        L_A(x; mu, rho) = f(x) + [max(0, mu - rho g(x))^2 - mu^2] / (2 rho),

    minimised by trust-region Newton steps with the exact Hessian (f's from
    :func:`sc_jax.objective.value_grad_hess`, the constraint's by autodiff of its
    n - 1 cosines; the generalised Hessian of the max term), every step solved
    exactly by :func:`trust_region_step`. A trust region cannot stall: a rejected
    step shrinks the radius until the quadratic model is accurate, and an accepted
    one lowers L_A. One flat loop of at most ``max_iter`` passes, each one
    evaluation of f, its gradient and Hessian (at the pending trial point), then one
    step. A subproblem counts as solved once its gradient is below a tenth of the
    constraint measure |min(g, mu/rho)| (below ``tol`` at the end); the multiplier
    then takes a Newton step on the dual function (quadratic convergence, where the
    first-order mu - rho g converges at the rate 1/rho), and rho grows by
    ``rho_growth`` if the measure did not shrink by ``progress``. The solve ends at a
    KKT point: gradient below ``tol`` and measure below ``feas_tol``. Starts from the
    identity (b = 0, w = 1), feasible for every tau. tau = -1 makes the constraint
    vacuous (the cosine is > -1): plain Newton on f.

    Large problems are first solved, by the same loop, on fixed random subsamples of
    their rows (``options.coarse_rows``: 2,048 rows by default, each size where N
    exceeds twice it) to a tolerance of ``options.coarse_tol``; each stage continues
    from the last one's point, multiplier and penalty. Where the constraint is active (or
    violated within that tolerance) at a stage's end, the next stage takes joint
    primal-dual Newton steps on the KKT conditions (SQP with the exact Hessian:
    :func:`_sqp_step`), (x, mu) together, backtracked on the KKT residual, while the
    KKT matrix has the inertia of a strict local minimiser and mu stays positive;
    otherwise, once a step fails three halvings, or once an accepted step does not
    halve the KKT residual, the trust-region loop takes over from the last accepted
    point. On the k = 8 benchmark batch (n = 3, float64) the 20,160-row problems
    took 6 to 8 all-row evaluations with multiplier updates after the 2,048-row
    stage, and take 4 to 5 with these steps; the batch went from 98 to 71 ms (one
    thread, the same run). The same mode begins at a multiplier update with mu > 0
    (at most ``_SQP_ENTRIES`` times per solve), which cut the 1,680-row problems
    from 13-20 evaluations to 10-15 and made the benchmark batches 1.06-1.22x faster
    (n = 2..4, both dtypes, side by side in one process).

    The last step is not evaluated where the steps before it show quadratic
    convergence (a residual cut by 100 or more, and the residual predicted after
    the step below ``_TERMINAL_FRACTION`` tol): the solve ends CONVERGED at its end
    point, with f from the quadratic model and the constraint evaluated. That pass
    over the rows would only have confirmed convergence; float64 batches of the
    benchmark ran 1.06-1.20x faster (n = 2..4), with objectives equal to 2e-13.

    An infimum that is not attained (data separable along a feasible direction: f
    tends to 0 as ||theta|| grows) ends ``UNBOUNDED``: the final point is feasible
    and f falls when theta (or one class's part of it) is doubled and doubled
    again, which no minimiser allows (checked where the curvature along those rays
    is small enough for it to be possible).

    Such a run-off is then followed by a second phase (``options.follow_runoffs``):
    the same loop, on all rows, from the point the ray test reached, with the class
    that ran off held in polar coordinates, (b_c, w_c) = e^s (sin phi, cos phi).
    In (b_c, w_c) the fall of f per unit of ||theta_c|| soon lies below the
    stationarity tolerance (float32's especially), while the other classes and the
    run-off's direction must still adjust to it (a binding mean cosine couples
    them); per unit of s it is ||theta_c|| times larger, and the class's cosine
    depends on phi alone. On 12 real rows (Qwen2.5-0.5B, Financial Phrasebank) the
    first phase stopped 1.5e-4 above SciPy's best in float64 and the second ends
    below it. The second phase's end point is kept if it is feasible and no higher;
    its own ray test gives the status (UNBOUNDED while f falls along a ray or stays
    flat to rounding when the class is doubled; a class that rises there has a
    minimiser far out, CONVERGED). Both phases run in one loop, so the program
    holds one copy of the solver; with several starts (``options.num_starts``) each
    start is followed up on its own run-off, vmapped, before the starts' end points
    are compared.

    problem: one unbatched :class:`Problem`; lambda_inv, tau: scalars (may be traced).
    """
    dtype = problem.features.dtype
    lambda_inv = jnp.asarray(lambda_inv, dtype)
    sizes = options.coarse_levels(problem.features.shape[0])
    designs = _stage_designs(problem, sizes)
    rows = _Rows(evaluate=_stage_evaluator(designs, lambda_inv),
                 value=lambda x: value(x, designs[-1], lambda_inv),
                 levels=len(sizes), has_rows=jnp.any(problem.mask > 0))
    return _al_solve(rows, problem.num_classes - 1, dtype, lambda_inv, tau,
                     sc_star=sc_star, options=options)


class _Rows(NamedTuple):
    """What the augmented Lagrangian reads of one instance's data: ``evaluate(x,
    level)`` gives f, its gradient and Hessian at the full (b, w) on the rows of
    stage ``level`` (subsamples first, ``levels`` = all rows), ``value(x)`` f on all
    rows; ``has_rows`` whether any row is real (a batch filler has none). A Python
    int ``levels`` is known at trace time; the solver of many buckets in one loop
    (:func:`_solve_slots`) passes the instance's own as a traced int."""

    evaluate: Callable
    value: Callable
    levels: int | Array
    has_rows: Array


def _stage_designs(problem: Problem, sizes: list) -> list:
    """The :class:`Design` of each stage of one unbatched problem: its fixed random
    subsample of each size in ``sizes`` (:func:`coarse_subsample`), then all rows."""
    num_rows = problem.features.shape[0]
    return [design(jax.tree.map(lambda a, r=coarse_subsample(num_rows, m): a[r], problem))
            for m in sizes] + [design(problem)]


def _stage_evaluator(designs: list, lambda_inv):
    """``evaluate(x, level)`` over a problem's stage designs (subsamples, then all
    rows): a switch where there are subsamples (on CPU only the branch taken runs)."""
    if len(designs) == 1:
        return lambda x, level: value_grad_hess(x, designs[0], lambda_inv)
    return lambda x, level: jax.lax.switch(
        level, [lambda dd=dd: value_grad_hess(x, dd, lambda_inv) for dd in designs])


def _al_solve(rows: _Rows, n1: int, dtype, lambda_inv, tau, *, sc_star: bool,
              options: SolverOptions, one_site: bool = False) -> Solution:
    """The loop of :func:`augmented_lagrangian` on one instance's :class:`_Rows`
    (``one_site``: see :func:`_not_attained`)."""
    tol, feas_tol = options.tolerances(dtype)
    eps = jnp.finfo(dtype).eps
    tiny_ = jnp.finfo(dtype).tiny
    rho_max = options.rho_max if options.rho_max is not None else (
        1e8 if jnp.dtype(dtype) == jnp.float64 else 1e4)
    # rho grows only on a violation above 10x this (and 10 feas_tol): float32's
    # rounding noise in the constraint measure along a run-off reaches 1e-6 (scaled
    # by sqrt(1 + ||z||^2)); with feas_tol 1e-7 rho grew on it and a run-off on 12
    # real rows crawled to MAX_ITERATIONS (test_float32_run_off_on_real_rows_...).
    rho_floor = 1e-9 if jnp.dtype(dtype) == jnp.float64 else 1e-6
    tau = jnp.asarray(tau, dtype)
    levels = rows.levels  # subsample stages; stage `levels` is all rows
    coarse = not isinstance(levels, int) or levels > 0
    # Every subsample stage hands over before its budget ends, so every solve ends on
    # all rows (its final f, gradient and status are the full problem's).
    if isinstance(levels, int):
        coarse_budget = max(min(options.max_coarse_iter,
                                (options.max_iter - 1) // max(levels, 1)), 1)
    else:
        coarse_budget = jnp.maximum(jnp.minimum(
            options.max_coarse_iter, (options.max_iter - 1) // jnp.maximum(levels, 1)), 1)
    coarse_tol = max(options.coarse_tol, tol)
    coarse_feas = max(options.coarse_tol, feas_tol)

    def full(x):
        return jnp.concatenate([x, jnp.ones_like(x)]) if sc_star else x

    # The loop works in the solver's coordinates z: x itself, or x with one class in
    # polar form (the follow-up phase of a run-off; never for SC*, whose w is
    # pinned). f's and the mean cosine's derivatives are taken in x and carried to z
    # by the chain rule under one cond (on CPU only its branch runs: computed on
    # every pass, the chain rule made the small benchmark problems 1.4x slower, and
    # one cond for each compiled 10% longer).
    #
    # The constraint is the mean cosine times sqrt(1 + ||z||^2): the same feasible
    # set and KKT points, but a penalty that grows along every infeasible ray. The
    # plain cosine is homogeneous of degree 0, so its penalty is bounded on rays,
    # while f's cost of turning away from a direction along which the data are
    # separable grows with ||x||: once an iterate runs off along such an infeasible
    # direction, no finite rho brings it back.
    def derivatives(z, level, cls):
        """f, grad f, hess f, c, grad c, hess c at z."""
        if sc_star:
            f, g, h = rows.evaluate(full(z), level)
            return (f, g[:n1], h[:n1, :n1], *_scaled_cosine_derivatives(z, tau, True))
        x = _from_polar(z, cls, n1)
        f, g, h = rows.evaluate(x, level)
        _, gm, hm = _mean_cosine_derivatives(x, False)
        g, h, gm, hm = jax.lax.cond(
            cls >= 0, lambda: (*_polar_chain(z, cls, n1, g, h), *_polar_chain(z, cls, n1, gm, hm)),
            lambda: (g, h, gm, hm))
        return (f, g, h, *_scale_constraint(_cosine_margin(x, tau, False), gm, hm, z))

    def con(z, cls):
        x = z if sc_star else _from_polar(z, cls, n1)
        return _cosine_margin(x, tau, sc_star) * jnp.sqrt(1.0 + jnp.dot(z, z))

    def constraint_measure(z, cz, mu, rho):
        # |min(g, mu / rho)| with the PHR shift, in cosine units (c carries the
        # factor sqrt(1 + ||x||^2)): 0 exactly at a feasible, complementary point.
        shifted = jnp.maximum(mu - rho * cz, 0.0)
        return jnp.abs(jnp.minimum(cz, shifted / rho)) * jax.lax.rsqrt(1.0 + jnp.dot(z, z))

    def lagrangian(f, gf, hf, c, gc, hc, mu, rho):
        shifted = jnp.maximum(mu - rho * c, 0.0)
        value_ = f + (shifted**2 - mu**2) / (2.0 * rho)
        grad = gf - shifted * gc
        hess = hf - shifted * hc + jnp.where(mu - rho * c > 0, rho, 0.0) * jnp.outer(gc, gc)
        return value_, grad, hess, shifted

    def body(s: _ALState) -> _ALState:
        first = s.fresh
        # 1. Evaluate the pending trial point (on the subsample or on all rows);
        # accept or reject it.
        fine = s.level == levels
        ft, gft, hft, ct, gct, hct = derivatives(s.trial, s.level, s.cls)
        if coarse:
            tol_s = jnp.where(fine, tol, coarse_tol)
            feas_s = jnp.where(fine, feas_tol, coarse_feas)
        else:
            tol_s, feas_s = tol, feas_tol
        Lt = ft + (jnp.maximum(s.mu - s.rho * ct, 0.0) ** 2 - s.mu**2) / (2.0 * s.rho)
        ared = s.La - Lt
        noise = 100.0 * eps * jnp.maximum(jnp.abs(s.La), 1.0)
        ratio = ared / jnp.maximum(s.pred, tiny_)
        finite = jnp.isfinite(Lt) & jnp.all(jnp.isfinite(gft)) & jnp.all(jnp.isfinite(hft))
        # Below the rounding of L_A the ratio is noise: accept a step the model
        # predicts to be that small (it cannot hurt by more than the noise).
        tiny = s.pred <= noise
        # A joint primal-dual step is judged by the KKT residual instead (Armijo's
        # test); one that fails it is halved, at most three times, and then dropped
        # together with the mode: the augmented Lagrangian takes over from x. The
        # mode also ends after an accepted step that did not halve the residual:
        # Newton's steps are in their quadratic region or they are not, and outside
        # it (a degenerate multiplier, a run-off) halved steps crawled, 8% of
        # residual per two passes, to the iteration limit (tight-tau instances of
        # the sweep, where the mode began at a multiplier update).
        sqp_step = s.sqp & ~first
        res_t = _kkt_residual(gft, ct, gct, s.mu_trial)
        sqp_ok = finite & (res_t <= (1.0 - 1e-4 * s.frac) * s.residual)
        backtrack = sqp_step & ~sqp_ok & (s.frac > 0.125)
        accept = first | jnp.where(
            sqp_step, sqp_ok, finite & ((ratio >= 0.1) | (tiny & (ared >= -noise))))
        mu_now = jnp.where(sqp_step & sqp_ok, s.mu_trial, s.mu)
        sqp = s.sqp & (first | (sqp_ok & (res_t <= 0.5 * s.residual)) | backtrack)
        snorm = jnp.linalg.norm(s.trial - s.x)
        radius = jnp.where(
            first | sqp_step, s.radius,
            # Every rejected step shrinks the radius (a step rejected below the
            # rounding threshold too: else the same trial comes back forever).
            jnp.where(~accept | (~tiny & (ratio < 0.25)), 0.25 * snorm,
                      jnp.where((ratio > 0.75) & ~s.interior,
                                jnp.minimum(2.0 * s.radius, options.radius_max), s.radius)))
        radius = jnp.maximum(radius, tiny_)
        pick = lambda new, old: jnp.where(accept, new, old)  # noqa: E731
        x, f, gf, hf = pick(s.trial, s.x), pick(ft, s.f), pick(gft, s.grad), pick(hft, s.hess)
        c, gc, hc = pick(ct, s.c), pick(gct, s.gc), pick(hct, s.hc)

        # 2. At the current point: converged, or time for a multiplier update?
        _, ga, ha, shifted = lagrangian(f, gf, hf, c, gc, hc, mu_now, s.rho)
        gmax = jnp.max(jnp.abs(ga))
        # A full Newton step whose decrease was below rounding: nothing left to gain
        # on this subproblem (a short step limited by the radius says nothing), if
        # the gradient is near the tolerance too. (Far from it, a tiny step means a
        # stiff penalty term, e.g. at the apex, where the cosine's curvature is
        # 1 / COSINE_EPS^2: float32 once stopped there 4% above the optimum.)
        flat = ~first & ~sqp_step & accept & tiny & s.interior & (gmax <= 10.0 * tol_s)
        solved = (gmax <= tol_s) | flat
        measure = constraint_measure(x, c, mu_now, s.rho)
        # Subproblems are solved only as well as the multiplier is known: to a
        # gradient below a fraction of the constraint measure (Newton's steps make
        # the last digits cheap once the measure is small).
        loose = solved | (gmax <= 0.1 * measure)
        # A subproblem gets at most max_inner steps: where the data are separable
        # along an infeasible direction its infimum lies at infinity (f -> 0 there,
        # and the penalty, a function of the cosines, is bounded on rays), so it
        # would never be solved; updating mu and rho anyway raises the penalty until
        # that direction no longer pays.
        kkt = solved & (measure <= feas_s)
        update = (loose | (s.inner >= options.max_inner)) & ~kkt & ~sqp
        stalled = measure > options.progress * s.measure
        # Newton step on the dual function psi(mu) = min_x L_A(x; mu, rho) instead of
        # the first-order step mu - rho g: at the subproblem's minimiser
        # psi'(mu) = -g and psi''(mu) = -gc^T H_A^-1 gc =: -t_A, so
        # mu - g / t_A = (mu - rho g) - g / t with t_A = t / (1 + rho t). Where the
        # constraint is inactive, or H_A is not positive definite (the inner budget
        # ran out), the first-order step stays.
        def dual_newton():  # only on the passes that update (a cond: see step 3)
            hg = jax.scipy.linalg.cho_solve((jnp.linalg.cholesky(ha), True), gc)
            t_a = jnp.dot(gc, hg)
            good = loose & jnp.all(jnp.isfinite(hg)) & (t_a > 0) & (mu_now - s.rho * c > 0)
            t_inv = jnp.where(good, 1.0 / jnp.where(good, t_a, 1.0) - s.rho, 0.0)
            newton_mu = jnp.maximum(shifted - c * jnp.maximum(t_inv, 0.0), 0.0)
            return jnp.where(good, newton_mu, shifted)

        mu = jax.lax.cond(update, dual_newton, lambda: mu_now)
        # rho grows only while the constraint is violated by more than 10 feas_tol:
        # near feas_tol a stalled measure is rounding noise (float32 at the apex, or
        # along a run-off), and a larger rho would only amplify that noise. At
        # feas_tol itself, a float32 run-off on 12 real rows (Qwen2.5-0.5B k = 4,
        # Financial Phrasebank) grew rho to 100 on noise and then crawled, ending at
        # the iteration limit 41% above float64's f.
        rho = jnp.where(update & stalled & (measure > 10.0 * jnp.maximum(feas_s, rho_floor)),
                        jnp.minimum(s.rho * options.rho_growth, rho_max), s.rho)

        # 3. The next step, on the (possibly updated) subproblem.
        La, ga, ha, _ = lagrangian(f, gf, hf, c, gc, hc, mu, rho)
        # In the joint primal-dual mode: Newton's step on the KKT conditions with the
        # constraint active (SQP), (x, mu) together, where the augmented Lagrangian
        # needs two steps per multiplier update. Taken only where it belongs: a
        # positive multiplier and the inertia of a local minimiser (a reduced Hessian
        # that is positive definite); otherwise the trust region resumes here. The
        # conds keep each pass to the one step it takes (on CPU, instance by
        # instance, only the branch taken runs).
        zero, one = jnp.zeros((), dtype), jnp.ones((), dtype)

        def primal_dual():
            def newton():
                dx, mu_new, valid = _sqp_step(gf, hf, c, gc, hc, mu)
                return dx, mu_new, valid, one

            def halve():  # s.trial - s.x is the rejected fraction of the step
                return (0.5 * (s.trial - s.x), s.mu + 0.5 * (s.mu_trial - s.mu),
                        jnp.asarray(True), 0.5 * s.frac)

            return jax.lax.cond(backtrack, halve, newton)

        # The mode also begins at a multiplier update that ends a subproblem solved
        # (loosely) with a positive multiplier: the dual Newton update has just
        # given mu to the accuracy of x, and the augmented Lagrangian's remaining
        # alternation of subproblem steps and updates (each update only as
        # accurate as the last subproblem) took 6 to 9 passes on the benchmark's
        # 1,680-row problems. At most _SQP_ENTRIES times per solve, so that a
        # problem where the steps keep failing the inertia or Armijo test does
        # not pay for them at every update.
        enter = update & loose & (mu > 0) & (s.entries < _SQP_ENTRIES)
        dx, mu_sqp, sqp, frac = jax.lax.cond(
            (sqp | enter) & ~kkt, primal_dual,
            lambda: (jnp.zeros_like(x), zero, jnp.asarray(False), one))
        # One trust-region solve in the program (it is the larger piece to compile),
        # run where no primal-dual step is taken.
        step, pred = jax.lax.cond(sqp, lambda: (dx, zero),
                                  lambda: trust_region_step(ga, ha, radius))
        # End of a subsample stage: continue on the next (more rows, all at the end)
        # from its KKT point, multiplier and penalty, or, if it did not get there, on
        # all rows afresh. From a KKT point with an active or (within coarse_tol)
        # violated constraint, the next stage's steps are joint primal-dual ones: the
        # subsample's solution is close to the next one (its sampling error is about
        # 1/sqrt(rows)), near the region of Newton's quadratic convergence, so two or
        # three steps finish it.
        switch = ~fine & (kkt | (s.it + 1 - s.stage_it >= coarse_budget))
        restart = switch & ~kkt
        # The last step, taken without another pass over the rows. Once Newton's
        # steps converge quadratically, a residual r reached from r' predicts the
        # next, about r (r / r')^2: the KKT residual for joint primal-dual steps, the
        # largest entry of L_A's gradient for trust-region steps that are full
        # Newton steps on an unchanged subproblem. Where the last step cut r by 100
        # or more and the prediction is below _TERMINAL_FRACTION tol, the step just
        # computed ends the solve: its end point's stationarity follows from the
        # steps already seen, its f is the quadratic model's (the error is third
        # order in a step of about r / ||H||), and its constraint measure is
        # evaluated exactly (it involves no data). All-rows stage only. It saves the
        # pass that would only confirm convergence: one of the 4 to 5 all-row
        # passes of a 20,160-row problem of the k = 8 benchmark batches.
        newton = jnp.where(sqp, sqp_step & sqp_ok,
                           ~first & ~sqp_step & accept & s.interior & (ratio >= 0.75)
                           & ~update & (jnp.linalg.norm(step) < 0.99 * radius))
        r_now = jnp.where(sqp_step, res_t, gmax)
        r_prev = jnp.maximum(jnp.where(sqp_step, s.residual, s.gsub), tiny_)
        x_fin = x + step
        mu_fin = jnp.where(sqp, mu_sqp, mu)
        c_fin = con(x_fin, s.cls)
        measure_fin = constraint_measure(x_fin, c_fin, mu_fin, rho)
        terminal = (fine & newton & ~kkt & (r_now <= 1e-2 * r_prev)
                    & (r_now * (r_now / r_prev) ** 2 <= _TERMINAL_FRACTION * tol_s)
                    & (measure_fin <= feas_s))
        fin = lambda new, old: jnp.where(terminal, new, old)  # noqa: E731
        f_fin = f + jnp.dot(gf, step) + 0.5 * jnp.dot(step, hf @ step)
        return _ALState(
            # After a terminal step grad, gc and hc stay x's: nothing reads them.
            x=fin(x_fin, x), f=fin(f_fin, f), grad=gf, hess=hf, c=fin(c_fin, c), gc=gc,
            hc=hc, La=La,
            trial=jnp.where(switch, jnp.where(kkt, x, s.start), x + step),
            pred=pred, interior=~sqp & (jnp.linalg.norm(step) < 0.99 * radius),
            mu=jnp.where(restart, 0.0, fin(mu_fin, mu)),
            rho=jnp.where(restart, options.rho_init, rho),
            radius=jnp.where(restart, options.radius_init, radius),
            measure=jnp.where(switch, jnp.inf, jnp.where(update, measure, s.measure)),
            outer=s.outer + update.astype(jnp.int32),
            inner=jnp.where(update | switch, 0, s.inner + 1),
            it=s.it + 1, done=(kkt & fine) | terminal, fresh=switch,
            # The next stage, or, after a failed subsample solve, all rows afresh.
            level=jnp.where(switch, jnp.where(kkt, s.level + 1, levels), s.level),
            stage_it=jnp.where(switch, s.it + 1, s.stage_it), start=s.start,
            sqp=jnp.where(switch, kkt & ((mu > 0) | (c <= 0)), sqp), mu_trial=mu_sqp,
            frac=frac, residual=_kkt_residual(gf, c, gc, mu), gsub=jnp.max(jnp.abs(ga)),
            entries=s.entries + enter.astype(jnp.int32), cls=s.cls)

    def cond(s: _ALState):
        return (~s.done) & (s.it < options.max_iter)

    def solve_from(x0, cls=-1, level0=0):
        # From x0 in the coordinates of `cls`, at stage `level0` (the follow-up phase
        # starts on all rows).
        zero = jnp.zeros((), dtype)
        p = x0.shape[0]
        init = _ALState(
            x=x0, f=zero, grad=jnp.zeros(p, dtype), hess=jnp.zeros((p, p), dtype),
            c=zero, gc=jnp.zeros(p, dtype), hc=jnp.zeros((p, p), dtype),
            La=zero, trial=x0, pred=zero, interior=jnp.asarray(False),
            mu=zero, rho=jnp.asarray(options.rho_init, dtype),
            radius=jnp.asarray(options.radius_init, dtype),
            measure=jnp.asarray(jnp.inf, dtype),
            outer=jnp.zeros((), jnp.int32), inner=jnp.zeros((), jnp.int32),
            it=jnp.zeros((), jnp.int32), done=jnp.asarray(False),
            fresh=jnp.asarray(True), level=jnp.asarray(level0, jnp.int32),
            stage_it=jnp.zeros((), jnp.int32), start=x0,
            sqp=jnp.asarray(False), mu_trial=zero, frac=jnp.ones((), dtype),
            residual=jnp.asarray(jnp.inf, dtype), entries=jnp.zeros((), jnp.int32),
            gsub=jnp.asarray(jnp.inf, dtype), cls=jnp.asarray(cls, jnp.int32))
        return jax.lax.while_loop(cond, body, init)

    def margin(z):  # mean cosine minus tau, in x: >= 0 is feasible
        return _cosine_margin(full(z), tau, False)

    def fun(z):  # f on all rows, in x
        return rows.value(full(z))

    def feasible(z):
        return margin(z) >= -feas_tol

    def post(s, force):
        # A solve's end point in x, moved onto the constraint if it ended outside it,
        # then the ray test (which follows a run-off it finds). The multiplier of the
        # paper's constraint is mu times the scale sqrt(1 + ||z||^2) of the solver's.
        x = s.x if sc_star else _from_polar(s.x, s.cls, n1)
        x, f = _restore_feasibility(x, s.f, margin, fun, feas_tol)
        f0 = f
        unb, x, f, cl, f2 = _not_attained(x, f, s.hess, fun, feasible, n1,
                                          converged=s.done, tol=tol, one_site=one_site,
                                          force=force, with_class=True)
        r = 100.0 * eps
        # A follow-up phase (s.cls >= 0) whose class rises when doubled ended at a
        # minimiser, however far out; flat to rounding there, the class saturated on
        # its way to an infimum at infinity, which is still not attained.
        unb = unb | ((s.cls >= 0) & ~(f2[1 + jnp.maximum(s.cls, 0)] > f0 * (1.0 + r)))
        # The first phase is followed up after a run-off, and also where f merely
        # fell at 2x along some ray: a stop in the slow valley of a run-off whose
        # direction is still turning (the 4x point then rises, so the ray test calls
        # no run-off; float32 stopped CONVERGED at ||theta_c|| = 40 on one sweep
        # instance whose float64 solution lies at 258).
        go = unb | jnp.any(f2 < f0 * (1.0 - r))
        z = jnp.where(s.cls >= 0, s.x, x)  # the solver's coordinates of the end point
        return _Phase(x, f, unb, s.done, s.mu * jnp.sqrt(1.0 + jnp.dot(z, z)),
                      s.it, s.outer, cl, go)

    def phase(prev, z0, cls, level0, later):
        # One phase from z0 (coordinates of `cls`) at stage `level0`. A later phase is
        # the follow-up of a run-off (see augmented_lagrangian): from the ray chain's
        # end, with the class that ran off in polar coordinates, on all rows, with a
        # budget of max_iter passes of its own (a first phase that crawled along the
        # run-off in (b, w), as float32 does, leaves nothing otherwise). Its verdict
        # replaces the first phase's: f still falls along a ray or is flat to rounding
        # when the class is doubled (UNBOUNDED), or rises there (a minimiser far out:
        # CONVERGED). It is kept if it ends feasible and no higher than `prev`.
        new = post(solve_from(z0, cls, level0), later)
        keep = ~later | (feasible(new.x) & jnp.isfinite(new.f) & (new.f <= prev.f))
        it, outer = prev.it + new.it, prev.outer + new.outer
        return jax.tree.map(lambda u, v: jnp.where(keep, u, v), new._replace(it=it, outer=outer),
                            prev._replace(it=it, outer=outer))

    follow = options.follow_runoffs and not sc_star
    starts = _starts(n1, options.num_starts, sc_star, dtype)  # [S, p]
    zero_i = jnp.zeros((), jnp.int32)

    def solve_start(x0):
        # One start's solve: its first phase, then, where that phase's ray test found
        # a run-off, the follow-up. Both phases run in one loop, so that the program
        # holds one copy of the solver's loop and of the ray test; the second pass
        # runs only after a run-off. The first phase starts with cls = -1 (no polar
        # class) at stage 0.
        if not follow:
            return post(solve_from(x0), False)

        def phase_body(c):
            ph, prev = c
            first = ph == 0
            z0 = jnp.where(first, x0, _to_polar(prev.x, prev.cls, n1))
            return ph + 1, phase(prev, z0, jnp.where(first, -1, prev.cls),
                                 jnp.where(first, 0, levels), ~first)

        none = _Phase(x0, jnp.asarray(jnp.inf, dtype), jnp.asarray(False),
                      jnp.asarray(False), jnp.zeros((), dtype), zero_i, zero_i,
                      jnp.asarray(-1, jnp.int32), jnp.asarray(False))
        return jax.lax.while_loop(
            lambda c: (c[0] == 0) | ((c[0] == 1) & c[1].follow),
            phase_body, (zero_i, none))[1]

    if options.num_starts == 1:
        res = solve_start(starts[0])
    else:
        # Every start is followed up on its own run-off before the starts are
        # compared: a start whose first phase crawls along a run-off (float32's, in
        # (b, w)) can end that phase far above the basin its follow-up reaches.
        # Tight-tau 20 of the sweep (n = 6, lambda_inv 10): float32's first phases
        # ended at 15.016 at best, the two starts whose follow-ups reach float64's
        # 14.9573 at 15.34; following up the best first phase alone gave 15.0009.
        runs = jax.vmap(solve_start)(starts)
        # The lowest objective among the feasible end points, converged or not: a
        # start that runs off along a separable direction never converges, and its
        # falling f beats every KKT point of the other basins (its ray test reports
        # UNBOUNDED). A converged end wins a tie within sqrt(eps). The identity
        # start's end point if none is feasible.
        viol_r = -jax.vmap(margin)(runs.x)
        slack = jnp.sqrt(jnp.finfo(dtype).eps) * (1.0 + jnp.abs(runs.f))
        score = jnp.where((viol_r <= feas_tol) & jnp.isfinite(runs.f),
                          runs.f + jnp.where(runs.done, 0.0, slack), jnp.inf)
        k = jnp.where(jnp.any(jnp.isfinite(score)), jnp.argmin(score), 0)
        # Iterations count every start's passes.
        res = jax.tree.map(lambda a: a[k], runs)._replace(
            it=jnp.sum(runs.it), outer=jnp.sum(runs.outer))
    params = _flat_params(res.x, sc_star)
    violation = jnp.maximum(-margin(res.x), 0.0)
    # With a real row, f is a mean of strictly positive terms at every finite theta,
    # so f = 0 is an infimum reached only by rounding, at the end of a run-off (an
    # all-padding batch filler has f = 0 by definition).
    unbounded = res.unbounded | ((res.f <= 0) & rows.has_rows)
    return _finish(params, None, lambda_inv, tau, converged=res.done,
                   violation=violation, feas_tol=feas_tol,
                   iterations=res.it, outer_iterations=res.outer + 1,
                   unbounded=unbounded, multiplier=res.multiplier, objective_value=res.f)


class _Phase(NamedTuple):
    """One phase's end of :func:`_al_solve`, in x: point, f, whether the infimum is
    not attained, converged, multiplier of the paper's constraint, passes, outer
    updates, and the class to put in polar form for a follow-up phase."""

    x: Array
    f: Array
    unbounded: Array
    done: Array
    multiplier: Array
    it: Array
    outer: Array
    cls: Array
    follow: Array  # a follow-up phase is due (the first phase's end only)


def coarse_subsample(num_rows: int, size: int) -> np.ndarray:
    """The rows of the subsample solve (:class:`SolverOptions` ``coarse_rows``):
    ``size`` of ``num_rows`` drawn without replacement by a fixed generator, sorted.
    A function of the two sizes alone (static under jit); random rather than
    strided, so that no period of the rows' order (contexts enumerated per query)
    aliases with it. Padded rows drawn stay masked."""
    rng = np.random.default_rng(num_rows)
    return np.sort(rng.choice(num_rows, size, replace=False))


# Start points of the multi-start (SolverOptions.num_starts). The invariance term is
# not convex and the mean-cosine feasible set is not convex either, so a problem can
# have several KKT points: with lambda_inv >= 1 and no trust region, SciPy's five
# starts end at 2.5 distinct points (median) on the sweep's 28 hardest instances
# (benchmarks/local_optima.py). The set: the identity; its slopes stretched (3),
# shrunk (0.3) and reversed (-1), for confident, collapsed and reversing calibrators;
# the two collapsed calibrators of uninformative data, which predict one class or
# the other (b = +-2, w = 0.3: the symmetric optima of the apex family); then points
# drawn once by a fixed generator (b ~ N(0, 1.5^2), w ~ U(-0.5, 2)), a function of
# (n - 1, count) alone, so the set is static under jit. On those 28 instances (26
# missed SciPy's best start in float64 with one start), 24 starts reach it, or go
# below it (11), on 27; the 28th (flipped seed 21) reached it at 48 starts. On the
# sweep's 129 instances with lambda_inv >= 1, 24 starts left two float64 misses
# (flipped 21, no-trust-region 32, where SciPy's five starts end in four different
# minima); 96 reach or go below SciPy's best start on all 129, and the vmap over
# the starts keeps the cost down (129 float64 fits in 115 s on the 2-core CPU,
# shared with another job; benchmarks/RESULTS.md, thirteenth pass).
_START_SLOPES = (1.0, 3.0, 0.3, -1.0)
_START_OFFSETS = (2.0, -2.0)
# The starts fit_batch uses where lambda_inv >= NONCONVEX_LAMBDA (see fit_batch).
NONCONVEX_STARTS = 96
NONCONVEX_LAMBDA = 1.0


def start_points(n1: int, count: int, sc_star: bool = False) -> np.ndarray:
    """The first ``count`` start points of the multi-start, ``[count, p]`` float64
    (p = 2 n1, flat (b, w); p = n1 for SC*, whose starts are offsets of b: 0, 1,
    -1, 2, then drawn ones)."""
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 1:
        raise ValueError(f"num_starts must be a positive int, got {count!r}")
    if sc_star:
        pts = [np.full(n1, o) for o in (0.0, 1.0, -1.0, 2.0)]
    else:
        pts = [np.concatenate([np.zeros(n1), np.full(n1, s)]) for s in _START_SLOPES]
        pts += [np.concatenate([np.full(n1, o), np.full(n1, 0.3)]) for o in _START_OFFSETS]
    rng = np.random.default_rng([n1, int(sc_star)])
    while len(pts) < count:
        b = rng.normal(size=n1) * 1.5
        pts.append(b if sc_star else np.concatenate([b, rng.uniform(-0.5, 2.0, n1)]))
    return np.stack(pts[:count])


def _starts(n1: int, count: int, sc_star: bool, dtype) -> Array:
    return jnp.asarray(start_points(n1, count, sc_star), dtype)


# ---------------------------------------------------------------------------------
# Projected gradient onto the per-class cones.


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


def project_bias_sc_star(b: Array, tau) -> Array:
    """SC* form of :func:`project_cone`: with w = 1 the cone is the box
    |b| <= sqrt(1/tau^2 - 1) for tau > 0 and no restriction for tau <= 0."""
    tau = jnp.asarray(tau, b.dtype)
    safe_tau = jnp.where(tau > 0, tau, 1.0)
    radius = jnp.where(tau > 0, jnp.sqrt(jnp.maximum(1.0 / (safe_tau * safe_tau) - 1.0, 0.0)),
                       jnp.inf)
    return jnp.clip(b, -radius, radius)


def _pg_fun(x, problem, lambda_inv, *, sc_star):
    return objective(_to_params(x, sc_star), problem, lambda_inv)


def projected(problem: Problem, lambda_inv, tau, *, sc_star: bool = False,
              options: SolverOptions = SolverOptions()) -> Solution:
    """Solve the per-class-constrained problem with ``jaxopt.ProjectedGradient``.

    min f(theta) s.t. cos(theta_c, v) >= tau for every class c, with the exact cones
    (the apex included). Every iterate is feasible for the paper's mean constraint too
    (with the exact cosine), so the optimum is never better than the paper's; it equals
    it when the constraint is inactive or n = 2. ``violation`` is the per-class one.

    jaxopt's projected gradient is FISTA (accelerated, with backtracking). Without
    restarts its momentum makes it oscillate on the ill-conditioned, non-separable
    problems that surrogate data give (thousands of iterations to 1e-8 on a
    1,680-row problem); restarting the momentum every ``pg_restart`` iterations (a
    fixed-schedule restart) cuts that by an order of magnitude.
    """
    from jaxopt import ProjectedGradient  # noqa: PLC0415

    dtype = problem.features.dtype
    tol, feas_tol = options.tolerances(dtype, projected=True)
    lambda_inv = jnp.asarray(lambda_inv, dtype)
    tau = jnp.asarray(tau, dtype)

    if sc_star:
        projection = lambda x, t: project_bias_sc_star(x, t)  # noqa: E731
    else:
        projection = project_cone
    pg = ProjectedGradient(
        fun=functools.partial(_pg_fun, sc_star=sc_star),
        projection=projection,
        tol=tol,
        maxiter=options.pg_restart,
        implicit_diff=False,
        unroll=False,
    )

    def cond(s):
        x, iters, done = s
        return (~done) & (iters < options.max_pg_iter)

    def body(s):
        x, iters, _ = s
        step = pg.run(x, tau, problem, lambda_inv)
        return step.params, iters + step.state.iter_num, step.state.error <= tol

    x0 = projection(_initial_x(problem, sc_star), tau)
    x, iters, done = jax.lax.while_loop(
        cond, body, (x0, jnp.zeros((), jnp.int32), jnp.asarray(False)))
    params = _to_params(x, sc_star)
    violation = cone_violation(params, tau)
    return _finish(params, problem, lambda_inv, tau, converged=done,
                   violation=violation, feas_tol=feas_tol,
                   iterations=iters, outer_iterations=1)


# ---------------------------------------------------------------------------------
# Batched entry point.

_JAX_METHODS: dict[str, Callable[..., Solution]] = {
    "augmented_lagrangian": augmented_lagrangian,
    "projected": projected,
}

# Number of times each batched solver has been traced (i.e. compiled). Tests use it
# to prove that a batch's contents never trigger a recompilation.
trace_counts: dict[str, int] = {name: 0 for name in _JAX_METHODS}


def resolve_batch_size(batch_size: int | None) -> int | None:
    """The number of instances solved in lockstep by one ``vmap``.

    ``None`` picks by backend: 1 on CPU, where a vmapped solve does the instances'
    arithmetic one after another anyway but makes every instance wait, at each loop
    step, for the batch's slowest (the nested while_loops run to the largest
    iteration count of the batch; 11x (AL) and 3.7x (PG) slower on the k = 8, n = 4
    float32 benchmark batch, see benchmarks/RESULTS.md); the whole bucket (returned
    as None) on GPU and TPU, where the lockstep is what fills the device. An int
    >= 1 is used as given.
    """
    if batch_size is None:
        return 1 if jax.default_backend() == "cpu" else None
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
            or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int or None, got {batch_size!r}")
    return int(batch_size)


THREADS_ENV = "SC_JAX_SOLVER_THREADS"


def resolve_threads(threads: int | None) -> int:
    """Host threads that solve parts of a batch at once in :func:`solve_batch`.

    XLA's CPU backend runs one compiled solver call on one core (the n = 3 float64
    benchmark batch took 80 ms pinned to one core of the 2-core CPU and 84 ms on
    both), but it runs calls of one executable made from several host threads at
    the same time (dispatching them from one thread did not overlap them). On that
    machine the gain is 1.0-1.7x on the benchmark batches (benchmarks/RESULTS.md,
    eighth pass); its two cores do not double throughput (two processes solving the
    batch side by side took 122 ms each against 82 ms alone).

    ``None``: on CPU, the number of cores this process may run on
    (``os.sched_getaffinity``), or the environment variable ``SC_JAX_SOLVER_THREADS``
    where it is set; 1 on GPU and TPU, where one vmapped call is what fills the
    device. An int >= 1 is used as given.
    """
    if threads is None:
        if jax.default_backend() != "cpu":
            return 1
        env = os.environ.get(THREADS_ENV)
        if env is None:
            return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
                else (os.cpu_count() or 1)
        try:
            threads = int(env)
        except ValueError:
            raise ValueError(f"{THREADS_ENV} must be a positive int, got {env!r}") from None
        where = THREADS_ENV
    else:
        where = "threads"
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 1:
        raise ValueError(f"{where} must be a positive int or None, got {threads!r}")
    return int(threads)


def split_parts(counts: Sequence[int], rows: Sequence[int], parts: int):
    """Deal the instances of buckets (``counts[j]`` instances of ``rows[j]`` padded
    rows each) to ``parts`` parts of one shape: every part holds
    ``slots[j] = ceil(counts[j] / parts)`` instances of bucket j, real ones or
    fillers, so that one compiled program serves them all. Largest buckets first,
    each instance goes to the least loaded part with a free slot (load: padded rows,
    plus 256 for each evaluation's fixed cost), so that the parts take about equally
    long. Returns ``slots`` and ``assign[t][j]``, the instance indices of bucket j in
    part t (at most ``slots[j]``; the rest of the slots are fillers).
    """
    slots = [-(-c // parts) for c in counts]
    assign = [[[] for _ in counts] for _ in range(parts)]
    load = [0] * parts
    for j in sorted(range(len(counts)), key=lambda j: -rows[j]):
        for i in range(counts[j]):
            t = min((t for t in range(parts) if len(assign[t][j]) < slots[j]),
                    key=lambda t: load[t])
            assign[t][j].append(i)
            load[t] += rows[j] + 256
    return slots, assign


_POOL: list = [None, 0]  # a ThreadPoolExecutor kept across calls, and its size


def _thread_pool(threads: int) -> ThreadPoolExecutor:
    """A pool of at least ``threads`` workers, kept for the next call: starting and
    joining two threads cost about 3 ms per call on the 2-core CPU, a fifth of the
    n = 2 benchmark batch's solve."""
    if _POOL[1] < threads:
        if _POOL[0] is not None:
            _POOL[0].shutdown(wait=False)
        _POOL[:] = [ThreadPoolExecutor(threads, thread_name_prefix="sc_jax_solve"), threads]
    return _POOL[0]


def _run_parts(fn, problems: tuple, lambda_invs: tuple, taus: tuple, threads: int):
    """``fn(problems, lambda_invs, taus)`` computed on one part of every bucket per
    thread (:func:`split_parts`; no more parts than the largest bucket has
    instances), the parts at the same time, and reassembled in the input order. A
    filler is an all-padding instance (mask 0) with lambda_inv 0 and tau -1: it ends
    after its first evaluation.

    Every thread passes the whole batch and its part's instance indices (``take``),
    and the compiled program gathers its part itself (index ``count`` of a bucket
    is out of range and gathers the filler's zeros): nothing is copied on the host.
    Cutting the parts in NumPy on the host cost about 8 ms per call of the n = 3
    float64 benchmark batch (a copy of every array, then another into each call;
    the batch's solve takes 50-60 ms), and as op-by-op JAX calls the ~200 small
    gathers cost more than the whole solve. More, smaller parts taken by threads as
    they free up would balance unequal instances, but each call has its own cost:
    on the 2-core CPU, 5 parts of one instance per bucket over 2 threads took the
    n = 3 float64 benchmark batch 70 ms, 2 parts 62-72 ms, one call 84 ms."""
    counts = [int(np.shape(lam)[0]) for lam in lambda_invs]
    rows = [int(p.features.shape[1]) for p in problems]
    parts = max(min(max(counts), threads), 1)
    slots, assign = split_parts(counts, rows, parts)
    order = [[assign[t][j] + [counts[j]] * (slots[j] - len(assign[t][j]))
              for j in range(len(counts))] for t in range(parts)]
    # jax.enable_x64 is per thread: the workers take the caller's setting.
    x64 = bool(jax.config.jax_enable_x64)
    # On the device once, so that the threads share the buffers (NumPy inputs would
    # be copied into every call).
    problems, lambda_invs, taus = jax.device_put((problems, lambda_invs, taus))

    def call(t):
        take = tuple(np.asarray(order[t][j], np.int32) for j in range(len(counts)))
        with jax.enable_x64(x64):
            return jax.device_get(fn(problems, lambda_invs, taus, take))

    outs = list(_thread_pool(parts).map(call, range(parts)))
    merged = []
    for j, count in enumerate(counts):
        flat = np.concatenate([order[t][j] for t in range(parts)])
        where = np.argsort(flat, kind="stable")[:count]  # fillers (index count) last
        merged.append(jax.tree.map(lambda *a, w=where: np.concatenate(a)[w],
                                   *[out[j] for out in outs]))
    return jax.device_put(tuple(merged))


# XLA options wanted for the augmented Lagrangian's batched program, per backend.
# On CPU the program is ~1,100 small fusions in while-loop bodies; with jaxlib 0.10
# XLA's MLIR fusion emitters spend ~2 s more of a cold call on them than the classic
# emitters (k = 8 default batch: 7.7-7.9 against 5.8-6.1 s in fresh processes), for
# runs 0-17% slower (benchmarks/RESULTS.md). jaxlib 0.11 and later have only the
# fusion emitters and refuse the option ("No such compile option"), so each option is
# used only where this jaxlib accepts it (:func:`compiler_options`). Per executable,
# so nothing global changes for the user's programs. Not for the projected solver:
# its vmapped program with the classic emitters and --xla_backend_optimization_level=0
# (the test suite's setting) ran for minutes where either alone took 3-5 s.
COMPILER_OPTIONS = {"cpu": {"xla_cpu_use_fusion_emitters": False}}


@functools.lru_cache(maxsize=None)
def compiler_options(backend: str) -> dict:
    """The options of :data:`COMPILER_OPTIONS` for ``backend`` that this jaxlib's XLA
    accepts, found once per process by compiling a one-op program with each."""
    accepted = {}
    arg = jax.ShapeDtypeStruct((), jnp.float32, sharding=jax.sharding.SingleDeviceSharding(
        jax.devices(backend)[0]))
    lowered = jax.jit(lambda x: x + 1).lower(arg)
    for name, setting in COMPILER_OPTIONS.get(backend, {}).items():
        try:
            lowered.compile(compiler_options={name: setting})
        except jax.errors.JaxRuntimeError as e:
            if "No such compile option" not in str(e):
                raise
        else:
            accepted[name] = setting
    return accepted


@functools.lru_cache(maxsize=None)
def _batched(method: str, sc_star: bool, options: SolverOptions | None,
             batch_size: int | None = None, backend: str = "cpu"):
    """jit of the solver over a tuple of buckets; ``batch_size`` (resolved, static):
    None vmaps each bucket whole, k runs ``lax.map`` over chunks of k vmapped
    instances (k = 1: one instance after another, no vmap; for the augmented
    Lagrangian all buckets through one copy of its loop, :func:`_solve_slots`).
    ``backend``: the platform compiled for, which picks :func:`compiler_options` (for
    the augmented Lagrangian)."""
    fn = _JAX_METHODS[method]
    kwargs = {"sc_star": sc_star}
    if options is not None:
        kwargs["options"] = options

    def one(problem, lambda_inv, tau):
        return fn(problem, lambda_inv, tau, **kwargs)

    def bucket(p, lam, t):
        # batch_size 1 maps even a bucket of one: under vmap, lax.cond becomes a
        # select that runs both branches (the solver's subsample and all-rows
        # evaluations, the ray test), so a vmap of one costs more than a map.
        if batch_size is None or 1 < batch_size >= lam.shape[0]:
            return jax.vmap(one)(p, lam, t)
        return jax.lax.map(lambda a: one(*a), (p, lam, t),
                           batch_size=None if batch_size == 1 else batch_size)

    def batch(problems, lambda_invs, taus, take=None):
        # A tuple of buckets, each its own vmap or map (and so its own while_loops)
        # inside the one compiled program. ``take``: per bucket, the instances to
        # solve (a part, see _run_parts); an index past the bucket's end gathers
        # zeros, a filler (all padding) with lambda_inv 0, and tau is set to -1.
        trace_counts[method] += 1  # runs only while tracing
        if method == "augmented_lagrangian" and batch_size == 1:
            return _solve_slots(problems, lambda_invs, taus, take, sc_star=sc_star,
                                options=options or SolverOptions())
        if take is not None:
            problems, lambda_invs, taus = _gather_parts(problems, lambda_invs, taus, take)
        return tuple(bucket(p, lam, t) for p, lam, t in zip(problems, lambda_invs, taus))

    options_xla = compiler_options(backend) if method == "augmented_lagrangian" else {}
    return jax.jit(batch, compiler_options=dict(options_xla) or None)


def _gather_parts(problems: tuple, lambda_invs: tuple, taus: tuple, take: tuple):
    """Per bucket, the instances ``take[j]`` (a part, see :func:`_run_parts`); an
    index past the bucket's end gathers zeros, a filler (all padding) with
    lambda_inv 0 and tau -1."""
    def part(a, k, fill=0):
        return jnp.take(a, k, axis=0, mode="fill", fill_value=fill)

    return (tuple(jax.tree.map(lambda a, k=k: part(a, k), p) for p, k in zip(problems, take)),
            tuple(part(lam, k) for lam, k in zip(lambda_invs, take)),
            tuple(part(t, k, -1) for t, k in zip(taus, take)))


def _filler_solution(n1: int, dtype, sc_star: bool) -> Solution:
    """What a skipped slot (a filler, see :func:`_solve_slots`) returns; discarded."""
    z, zero, none = jnp.zeros(n1, dtype), jnp.zeros((), dtype), jnp.zeros((), jnp.int32)
    return Solution(params=Params(z, jnp.ones_like(z) if sc_star else z), status=none,
                    iterations=none, outer_iterations=none, objective=zero,
                    constraint=zero, violation=zero, multiplier=zero)


def _solve_slots(problems: tuple, lambda_invs: tuple, taus: tuple, take, *,
                 sc_star: bool, options: SolverOptions) -> tuple:
    """The augmented Lagrangian over buckets with ONE copy of its loop in the program
    (CPU, instances one by one): ``lax.map`` over slots, each holding one instance of
    every bucket, and within a slot a ``lax.scan`` over the buckets whose solve
    reads the rows through ``lax.switch`` on the bucket. Only the evaluations of f
    (and the designs) depend on a bucket's row count, so only they are compiled
    per bucket; with a ``vmap`` or ``map`` per bucket the whole solver was, about
    0.8 s of XLA's compile per bucket on the 2-core CPU. The switch index is the
    bucket, never batched (also under the multi-start's vmap), so each evaluation
    runs one bucket's code. Slots past a bucket's count (buckets of unequal counts,
    or the fillers of a part) are skipped by a ``lax.cond``.

    problems, lambda_invs, taus: per bucket, ``[B_j, ...]`` and ``[B_j]``; take: per
    bucket the instances to solve (or None: all). Returns a tuple of per-bucket
    :class:`Solution` batches, ``[len(take[j])]`` (or ``[B_j]``).
    """
    counts = [int(p.features.shape[0]) for p in problems]
    if take is None:
        take = tuple(jnp.arange(c, dtype=jnp.int32) for c in counts)
    lens = [int(k.shape[0]) for k in take]
    slots = max(lens)
    take = tuple(jnp.concatenate([jnp.asarray(k, jnp.int32),
                                  jnp.full(slots - n, c, jnp.int32)])
                 for k, n, c in zip(take, lens, counts))
    valid = jnp.stack([k < c for k, c in zip(take, counts)], axis=1)  # [S, J]
    problems, lambda_invs, taus = _gather_parts(problems, lambda_invs, taus, take)
    dtype = problems[0].features.dtype
    n1 = problems[0].num_classes - 1
    stages = [options.coarse_levels(int(p.features.shape[1])) for p in problems]
    if any(stages):
        levels = jnp.asarray([len(z) for z in stages], jnp.int32)
    else:  # no subsample anywhere: known at trace time, no stage switch at all
        levels = None

    def slot(args):
        probs, lams, ts, ok = args  # one instance of every bucket
        designs = [_stage_designs(p, z) for p, z in zip(probs, stages)]
        has_rows = jnp.stack([jnp.any(p.mask > 0) for p in probs])

        def job(_, xs):
            j, lam, tau, good = xs
            evals = [_stage_evaluator(ds, lam) for ds in designs]
            rows = _Rows(
                evaluate=lambda x, level: jax.lax.switch(
                    j, [lambda e=e: e(x, level) for e in evals]),
                value=lambda x: jax.lax.switch(
                    j, [lambda ds=ds: value(x, ds[-1], lam) for ds in designs]),
                levels=0 if levels is None else levels[j], has_rows=has_rows[j])
            return None, jax.lax.cond(
                good, lambda: _al_solve(rows, n1, dtype, lam, tau, sc_star=sc_star,
                                        options=options, one_site=True),
                lambda: _filler_solution(n1, dtype, sc_star))

        return jax.lax.scan(job, None, (jnp.arange(len(probs)), jnp.stack(lams),
                                        jnp.stack(ts), ok))[1]

    out = jax.lax.map(slot, (problems, lambda_invs, taus, valid))  # [S, J, ...]
    return tuple(jax.tree.map(lambda a, j=j, n=n: a[:n, j], out) for j, n in enumerate(lens))


def solve_batch(problem: Problem | Sequence[Problem], lambda_inv, tau, *,
                method: str = "augmented_lagrangian", sc_star: bool = False,
                options: SolverOptions | None = None, batch_size: int | None = None,
                threads: int | None = None):
    """``jit(vmap(method))`` over a batch: every array of ``problem`` has a leading
    ``[B]`` axis, ``lambda_inv`` and ``tau`` are ``[B]``. One compilation per (shapes,
    dtype, num_queries, method, sc_star, options, batch_size); data, lambda_inv and tau
    are traced, so changing them never recompiles. Padded rows must have mask 0.

    batch_size: instances per vmap (:func:`resolve_batch_size`; None: 1 on CPU, all
    on accelerators). With k < B the batch runs as ``lax.map`` over chunks of k, still
    in the one compiled call; every choice gives the same solutions (a test compares
    them), only the speed differs.

    ``problem`` may also be a sequence of batched problems (buckets, each padded to
    its own N), with ``lambda_inv`` and ``tau`` sequences of matching ``[B_j]``
    arrays: each bucket is vmapped on its own inside the ONE compiled call and a
    tuple of :class:`Solution` is returned (with ``batch_size`` 1, the CPU default,
    the augmented Lagrangian solves every bucket with one copy of its loop:
    :func:`_solve_slots`; the same solutions, a test compares them). Under vmap
    every instance pays for the
    batch's padded N and for its slowest instance's iterations, so grouping problems
    of similar size saves both (see ``sc_jax.calibrators.fit_batch``).

    threads: host threads that each solve a part of the batch (:func:`resolve_threads`;
    None: on CPU one per core, else 1). The parts share one shape, so one compiled
    program serves them (:func:`split_parts`); the solutions are the same as
    with ``threads=1`` (a test compares them). Under ``jit`` (traced arguments) the
    batch is one call, and so is a multi-start batch (``options.num_starts`` > 1),
    whose concurrent calls can deadlock in XLA's CPU thread pool.
    """
    if method not in _JAX_METHODS:
        raise ValueError(f"unknown JAX solver {method!r}; choose one of "
                         f"{tuple(_JAX_METHODS)} (or 'scipy' through sc_jax.calibrators.fit)")
    fn = _batched(method, sc_star, options, resolve_batch_size(batch_size),
                  jax.default_backend())
    threads = resolve_threads(threads)
    if options is not None and options.num_starts > 1:
        # The multi-start vmaps its starts, so its matrix products are batched and
        # large enough for XLA's CPU backend to split over its Eigen thread pool,
        # and two such calls made at once from two host threads deadlocked in that
        # pool: the first 20 lambda_inv >= 1 instances of the sweep, with 48 or 96
        # starts, hung on 2 threads each time they were tried (96 twice, 48 once; no
        # CPU used after the compile) and took 50 s on one. (A known XLA CPU hang on vmapped programs, avoided
        # elsewhere with --xla_cpu_multi_thread_eigen=false, a flag a library must
        # not set for its user.) So a multi-start batch is one call; the vmap over
        # its starts keeps the cores busy.
        threads = 1
    single = isinstance(problem, Problem)
    if single:
        problem, lambda_inv, tau = (problem,), (lambda_inv,), (tau,)
    problem, lambda_inv, tau = tuple(problem), tuple(lambda_inv), tuple(tau)
    if not (len(problem) == len(lambda_inv) == len(tau)):
        raise ValueError(f"{len(problem)} buckets but {len(lambda_inv)} lambda_inv and "
                         f"{len(tau)} tau arrays")
    leaves = jax.tree.leaves((problem, lambda_inv, tau))
    many = max(int(np.shape(lam)[0]) for lam in lambda_inv) > 1
    if threads > 1 and many and not any(isinstance(a, jax.core.Tracer) for a in leaves):
        out = _run_parts(fn, problem, tuple(jnp.asarray(a) for a in lambda_inv),
                         tuple(jnp.asarray(a) for a in tau), threads)
    else:
        out = fn(problem, lambda_inv, tau)
    return out[0] if single else out


# ---------------------------------------------------------------------------------
# SciPy trust-constr reference (float64).


@dataclasses.dataclass(frozen=True)
class ScipyOptions:
    """trust-constr settings; tighter than SciPy's defaults because this is the
    reference that the JAX solvers are held to."""

    gtol: float = 1e-11
    xtol: float = 1e-14
    barrier_tol: float = 1e-11
    # trust-constr stops on the Lagrangian gradient alone, so it can stop while the
    # barrier still holds an active constraint off its bound (by ~1e-7 in the
    # cosine with SciPy's default of 0.1). A small initial barrier parameter leaves
    # a slack of about 1e-8 instead.
    initial_barrier: float = 1e-8
    max_iter: int = 3000
    feas_tol: float = 1e-9


def _flat_to_params(x, n1: int, sc_star: bool) -> Params:
    if sc_star:
        return Params(x, jnp.ones_like(x))
    return Params(x[:n1], x[n1:])


@functools.partial(jax.jit, static_argnames=("sc_star",))
def _sp_value_and_grad(x, problem, lambda_inv, sc_star):
    n1 = problem.num_classes - 1
    return jax.value_and_grad(
        lambda z: objective(_flat_to_params(z, n1, sc_star), problem, lambda_inv))(x)


@functools.partial(jax.jit, static_argnames=("sc_star",))
def _sp_hessian(x, problem, lambda_inv, sc_star):
    n1 = problem.num_classes - 1
    return jax.hessian(
        lambda z: objective(_flat_to_params(z, n1, sc_star), problem, lambda_inv))(x)


def _sp_constraint_fn(tau, n1: int, sc_star: bool, per_class: bool):
    # Mean form: mean_c cos_c >= tau. Per-class form: the exact cones,
    # w_c - tau ||theta_c|| >= 0, the set that the projected solver projects onto.
    def c(z):
        params = _flat_to_params(z, n1, sc_star)
        if per_class:
            return cone_margins(params, tau)
        return jnp.mean(class_cosines(params))[None] - tau
    return c


@functools.partial(jax.jit, static_argnames=("n1", "sc_star", "per_class"))
def _sp_constraint(x, tau, n1, sc_star, per_class):
    c = _sp_constraint_fn(tau, n1, sc_star, per_class)
    return c(x), jax.jacobian(c)(x)


@functools.partial(jax.jit, static_argnames=("n1", "sc_star", "per_class"))
def _sp_constraint_hess(x, v, tau, n1, sc_star, per_class):
    c = _sp_constraint_fn(tau, n1, sc_star, per_class)
    return jax.hessian(lambda z: jnp.dot(v, c(z)))(x)


def scipy(problem: Problem, lambda_inv: float, tau: float, *, sc_star: bool = False,
          per_class: bool = False, options: ScipyOptions = ScipyOptions(),
          x0=None) -> Solution:
    """``scipy.optimize.minimize(method="trust-constr")`` on the same problem, float64.

    Objective gradient and Hessian, constraint Jacobian and constraint Hessian are exact
    (JAX autodiff, jit-compiled once per shape). ``per_class=True`` imposes cos_c >= tau
    for every class (the problem :func:`projected` solves) instead of the mean. Starts
    from ``x0`` (flat (b, w), or b for SC*), by default the identity. Runs under a local ``jax.enable_x64`` scope, so it works
    whatever the process-wide setting is. Returns NumPy arrays in a :class:`Solution`.
    """
    import scipy.optimize as so  # noqa: PLC0415

    with jax.enable_x64(True):
        prob = Problem(
            features=jnp.asarray(np.asarray(problem.features), jnp.float64),
            labels=jnp.asarray(np.asarray(problem.labels), jnp.int32),
            query_ids=jnp.asarray(np.asarray(problem.query_ids), jnp.int32),
            mask=jnp.asarray(np.asarray(problem.mask), jnp.float64),
            num_queries=problem.num_queries,
        )
        n1 = prob.num_classes - 1
        lam = jnp.asarray(lambda_inv, jnp.float64)
        if x0 is None:
            x0 = np.zeros(n1) if sc_star else np.concatenate([np.zeros(n1), np.ones(n1)])
        x0 = np.asarray(x0, np.float64)

        def fun(x):
            v, g = _sp_value_and_grad(jnp.asarray(x), prob, lam, sc_star)
            return float(v), np.asarray(g)

        def hess(x):
            return np.asarray(_sp_hessian(jnp.asarray(x), prob, lam, sc_star))

        constraints = []
        tau_ = jnp.asarray(tau, jnp.float64)
        if tau > -1.0:  # tau = -1: the cosine is always >= -1, so no constraint
            def cfun(x):
                return np.asarray(_sp_constraint(jnp.asarray(x), tau_, n1, sc_star,
                                                 per_class)[0])

            def cjac(x):
                return np.asarray(_sp_constraint(jnp.asarray(x), tau_, n1, sc_star,
                                                 per_class)[1])

            def chess(x, v):
                return np.asarray(_sp_constraint_hess(jnp.asarray(x), jnp.asarray(v), tau_,
                                                      n1, sc_star, per_class))

            constraints = [so.NonlinearConstraint(cfun, 0.0, np.inf, jac=cjac, hess=chess)]

        res = so.minimize(
            fun, x0, jac=True, hess=hess, method="trust-constr", constraints=constraints,
            options={"gtol": options.gtol, "xtol": options.xtol,
                     "barrier_tol": options.barrier_tol, "maxiter": options.max_iter,
                     "initial_barrier_parameter": options.initial_barrier,
                     "initial_barrier_tolerance": options.initial_barrier},
        )
        x = jnp.asarray(res.x)
        params = _flat_to_params(x, n1, sc_star)
        obj = float(objective(params, prob, lam))
        constraint = float(trust_region(params))
        if per_class:
            violation = float(cone_violation(params, tau_))
        else:
            violation = max(0.0, tau - constraint)
    finite = np.isfinite(obj) and np.all(np.isfinite(res.x))
    if not finite:
        status = Status.NONFINITE
    elif violation > options.feas_tol:
        status = Status.INFEASIBLE
    elif res.status in (1, 2):  # gtol or xtol reached
        status = Status.CONVERGED
    else:
        status = Status.MAX_ITERATIONS
    return Solution(
        params=Params(np.asarray(params.b), np.asarray(params.w)),
        status=np.int32(status),
        iterations=np.int32(res.nit),
        outer_iterations=np.int32(1),
        objective=np.float64(obj),
        constraint=np.float64(constraint),
        violation=np.float64(violation),
        # trust-constr's multiplier of the one constraint, sign-free.
        multiplier=np.float64(abs(res.v[0][0]) if constraints else 0.0),
    )


def scipy_starts(num_classes: int, seed: int = 0) -> list:
    """Start points of :func:`scipy_best` (flat (b, w)): the identity, slopes 3 and
    0.3, and two random points (seeded)."""
    n1 = num_classes - 1
    rng = np.random.default_rng(seed)
    starts = [np.concatenate([np.zeros(n1), np.full(n1, s)]) for s in (1.0, 3.0, 0.3)]
    starts += [np.concatenate([rng.normal(size=n1) * 0.5, rng.uniform(0.2, 2.0, n1)])
               for _ in range(2)]
    return starts


def scipy_best(problem: Problem, lambda_inv: float, tau: float, *, seed: int = 0,
               options: ScipyOptions = ScipyOptions()) -> Solution | None:
    """The lowest-objective feasible end point of :func:`scipy` (mean-cosine form)
    over :func:`scipy_starts`; None if none ends within ``options.feas_tol``.

    The problem is not convex (the invariance term, and the mean-cosine set), so one
    local solve is not a reference; parity checks hold the JAX solvers to this.
    """
    best = None
    for x0 in scipy_starts(problem.num_classes, seed):
        s = scipy(problem, lambda_inv, tau, x0=x0, options=options)
        if s.violation <= options.feas_tol and (best is None or s.objective < best.objective):
            best = s
    return best
