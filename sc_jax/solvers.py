"""Solvers for Eq. final_opt_problem: min f(theta) s.t. mean_c cos(theta_c, v) >= tau.

Three solvers, all on the objective of :mod:`sc_jax.objective`:

* :func:`augmented_lagrangian`: a PHR augmented-Lagrangian outer loop for the single
  inequality constraint around a ``jaxopt.LBFGS`` inner solve. Solves the paper's
  problem (the *mean* cosine constraint).
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
(on CPU by default ``jit(lax.map(.))``, one instance after another: see
:func:`resolve_batch_size`).
Each instance returns a :class:`Status` code instead of raising (optimistix-style).

jaxopt is imported inside the functions that use it: importing it prints a deprecation
warning, which ``import sc_jax`` must not.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from typing import Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from sc_jax.objective import (
    Params,
    Problem,
    class_cosines,
    cone_margins,
    cone_violation,
    objective,
    trust_region,
)

Array = jax.Array

METHODS = ("augmented_lagrangian", "projected", "scipy")


class Status(enum.IntEnum):
    """Per-instance result code."""

    CONVERGED = 0
    MAX_ITERATIONS = 1  # stationarity tolerance not met within the iteration budget
    INFEASIBLE = 2  # trust-region constraint violated by more than feas_tol at the end
    NONFINITE = 3  # NaN or inf in the parameters or the objective


class Solution(NamedTuple):
    """Result of one solve; under ``vmap`` every field has a leading ``[B]`` axis.

    params: fitted :class:`Params` (``w`` is all ones for SC*).
    status: int32 :class:`Status` code.
    iterations: int32 inner iterations in total (LBFGS steps summed over outer steps;
        projected-gradient steps; trust-constr iterations).
    outer_iterations: int32 augmented-Lagrangian outer steps (1 for the others).
    objective: final f(theta), mean-NLL + lambda_inv * InvPenalty.
    constraint: final mean cosine, trust_region(params).
    violation: final violation of the constraint form that was solved: max(0, tau -
        mean cosine), or for the per-class form max_c max(0, tau - cos_c).
    """

    params: Params
    status: Array
    iterations: Array
    outer_iterations: Array
    objective: Array
    constraint: Array
    violation: Array


@dataclasses.dataclass(frozen=True)
class SolverOptions:
    """Static solver settings (hashable: part of the compilation key).

    tol: stationarity tolerance, the 2-norm of the gradient of the augmented
        Lagrangian (LBFGS) or of the gradient mapping (projected gradient). ``None``
        picks 1e-10 (projected: 1e-9) for float64 and 1e-5 for float32: the objective
        is a mean of O(1) terms, so these sit a little above each dtype's noise floor.
    feas_tol: allowed constraint violation, in units of the cosine. ``None``: 1e-9
        (float64), 1e-6 (float32).
    max_iter: LBFGS iterations per augmented-Lagrangian outer step.
    max_outer: augmented-Lagrangian outer steps.
    max_stepsize: largest LBFGS line-search step.
    max_pg_iter: projected-gradient iterations in all.
    pg_restart: projected-gradient iterations between momentum restarts.
    rho_init, rho_growth, rho_max: PHR penalty parameter schedule. rho grows when the
        constraint measure did not shrink by ``progress`` in one outer step, up to
        rho_max (``None``: 1e6 in float64, 1e4 in float32, since the penalty's
        rounding noise grows with rho).
    history_size: LBFGS memory.
    max_linesearch: zoom line-search evaluations per LBFGS step. Under vmap every
        instance pays the batch's largest count, and near float32's noise floor the
        search runs to its limit before giving up: 10 (jaxopt: 30) gave identical
        optima in half the time on the k = 8, n = 3 benchmark batch.
    max_scale: an augmented-Lagrangian inner solve that ends infeasible with some
        class both outside its cone (cos_c < tau) and of norm ||(b_c, w_c)|| above
        this has run off to infinity along a direction in which the data are
        separable: the objective tends to 0 there, while the cosine's gradient
        vanishes like 1/||theta||, so the penalty can never pull it back (and in
        float32 the gradient underflows, so the inner solve may even report
        convergence). Such a step is rejected (x and mu kept, rho grown). Features
        are log-odds of order 1-10, so such a calibrator is never an answer. Feasible
        iterates are never rejected, and neither is a huge class inside its cone: a
        nearly separable class may legitimately reach w_c in the thousands along the
        identity (n = 5 benchmark instances: rejecting those grew rho needlessly and
        ended infeasible where SciPy converged).
    """

    tol: float | None = None
    feas_tol: float | None = None
    max_iter: int = 500
    max_outer: int = 30
    rho_init: float = 100.0
    rho_growth: float = 10.0
    rho_max: float | None = None
    progress: float = 0.25
    history_size: int = 10
    max_stepsize: float = 1e3
    max_pg_iter: int = 10000
    pg_restart: int = 100
    max_linesearch: int = 10
    max_scale: float = 1e3

    def tolerances(self, dtype, projected: bool = False) -> tuple[float, float]:
        f64 = jnp.dtype(dtype) == jnp.float64
        if self.tol is not None:
            tol = self.tol
        elif projected:  # a first-order method: one decade looser
            tol = 1e-9 if f64 else 1e-5
        else:
            tol = 1e-10 if f64 else 1e-5
        feas = self.feas_tol if self.feas_tol is not None else (1e-9 if f64 else 1e-6)
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


def _finish(params: Params, problem: Problem, lambda_inv, tau, *, converged, violation,
            feas_tol, iterations, outer_iterations) -> Solution:
    obj = objective(params, problem, lambda_inv)
    finite = jnp.isfinite(obj) & jnp.all(jnp.isfinite(params.b)) & jnp.all(
        jnp.isfinite(params.w))
    status = jnp.where(
        ~finite, Status.NONFINITE,
        jnp.where(violation > feas_tol, Status.INFEASIBLE,
                  jnp.where(converged, Status.CONVERGED, Status.MAX_ITERATIONS)))
    return Solution(
        params=params,
        status=status.astype(jnp.int32),
        iterations=jnp.asarray(iterations, jnp.int32),
        outer_iterations=jnp.asarray(outer_iterations, jnp.int32),
        objective=obj,
        constraint=trust_region(params),
        violation=violation,
    )


# ---------------------------------------------------------------------------------
# Augmented Lagrangian (PHR) around jaxopt.LBFGS.


def _al_lagrangian(x, mu, rho, problem, lambda_inv, tau, *, sc_star):
    """PHR augmented Lagrangian for g(x) = trust_region - tau >= 0:

        f(x) + [max(0, mu - rho g(x))^2 - mu^2] / (2 rho)

    C^1 in x, which is all LBFGS needs.
    """
    params = _to_params(x, sc_star)
    g = trust_region(params) - tau
    shifted = jnp.maximum(mu - rho * g, 0.0)
    return objective(params, problem, lambda_inv) + (shifted**2 - mu**2) / (2.0 * rho)


class _ALState(NamedTuple):
    step: object  # jaxopt OptStep: params and LBFGS state (its curvature history)
    mu: Array  # multiplier estimate, >= 0
    rho: Array  # penalty parameter
    measure: Array  # |min(g, mu/rho)|: feasibility and complementarity in one number
    outer: Array
    inner: Array  # LBFGS iterations so far
    converged: Array
    stop: Array  # a run-off that rho can no longer counter: give up


def augmented_lagrangian(problem: Problem, lambda_inv, tau, *, sc_star: bool = False,
                         options: SolverOptions = SolverOptions()) -> Solution:
    """Solve Eq. final_opt_problem (mean-cosine constraint) for one problem.

    Outer loop (Powell-Hestenes-Rockafellar): minimise the augmented Lagrangian in x
    with LBFGS, warm-started from the previous x *and* its curvature history (only the
    penalty term changed), update mu <- max(0, mu - rho g(x)), and grow rho when the
    constraint measure |min(g, mu/rho)| stalls. Converged when that measure is
    <= feas_tol and the last inner solve met its tolerance. tau = -1 makes the
    constraint vacuous (the cosine is >= -1): one outer step, an unconstrained fit.

    problem: one unbatched :class:`Problem`; lambda_inv, tau: scalars (may be traced).
    """
    from jaxopt import LBFGS  # noqa: PLC0415  (deprecation warning on import)
    from jaxopt import OptStep  # noqa: PLC0415

    dtype = problem.features.dtype
    tol, feas_tol = options.tolerances(dtype)
    eps = float(jnp.finfo(dtype).eps)
    rho_max = options.rho_max if options.rho_max is not None else (
        1e6 if jnp.dtype(dtype) == jnp.float64 else 1e4)
    lambda_inv = jnp.asarray(lambda_inv, dtype)
    tau = jnp.asarray(tau, dtype)

    inner = LBFGS(
        # sc_star is bound here, not passed: jaxopt jit-compiles its step and would
        # trace it.
        fun=functools.partial(_al_lagrangian, sc_star=sc_star),
        tol=tol,
        maxiter=options.max_iter,
        history_size=options.history_size,
        # Near the float noise floor a line search can fail to find a decrease;
        # going on would burn the whole iteration budget of the batch under vmap.
        stop_if_linesearch_fails=True,
        # jaxopt caps the step at 1 by default, so a quasi-Newton direction that
        # underestimates the step (common right after a restart, and on the
        # non-convex invariance term) can never satisfy the curvature condition:
        # the line search "fails" far from the optimum. Let it extrapolate.
        max_stepsize=options.max_stepsize,
        increase_factor=2.0,
        maxls=options.max_linesearch,
        # Forward solves only: no implicit differentiation, and a lax.while_loop (the
        # "auto" default would unroll a scan of max_iter steps without it).
        implicit_diff=False,
        unroll=False,
    )

    def fresh_state(x, mu, rho):
        # jaxopt starts the line search of a fresh state at max_stepsize, i.e. a
        # first step of 1e3 x the gradient: from there the zoom search cannot
        # shrink back into the basin within max_linesearch evaluations, and a failed
        # search with no acceptable point takes its last trial step anyway (a jump
        # to w ~ -300 was seen). Start at 1 and let the step grow from there.
        st = inner.init_state(x, mu, rho, problem, lambda_inv, tau)
        return st._replace(stepsize=jnp.ones_like(st.stepsize))

    def cond(s: _ALState):
        return (~s.converged) & (~s.stop) & (s.outer < options.max_outer)

    def body(s: _ALState):
        step = inner.run(s.step, s.mu, s.rho, problem, lambda_inv, tau)
        state = step.state
        g = trust_region(_to_params(step.params, sc_star)) - tau
        measure = jnp.abs(jnp.minimum(g, s.mu / s.rho))
        # Near the optimum a line search can only fail: the decrease it looks for,
        # about error^2 / curvature, drops below the resolution of the value, eps
        # |f|, once error < sqrt(eps * curvature) ~ sqrt(eps * rho). A failure at
        # that floor is convergence at float precision; one above it is "stuck".
        floor = 100.0 * tol + jnp.sqrt(eps * s.rho)
        stuck = state.failed_linesearch & (state.error > floor)
        inner_ok = (state.error <= tol) | (state.failed_linesearch & ~stuck)
        mu = jnp.maximum(s.mu - s.rho * g, 0.0)
        # Grow rho only while the constraint measure stalls above the tolerance:
        # beyond what is needed it only costs precision.
        stalled = (measure > options.progress * s.measure) & (measure > feas_tol)
        rho = jnp.where(stalled, jnp.minimum(s.rho * options.rho_growth, rho_max), s.rho)
        # A run-off (see SolverOptions.max_scale): reject the step, keep x and mu,
        # and grow rho until the penalty outweighs the separable direction's gain.
        # Only a class that is both huge and outside the cone is running off: a
        # nearly separable class may legitimately grow to w_c in the thousands
        # *along* the identity, where it helps the constraint.
        new = _to_params(step.params, sc_star)
        huge = ~(jnp.sqrt(new.b * new.b + new.w * new.w) <= options.max_scale)
        run_off = (g < -feas_tol) & jnp.any(huge & ~(class_cosines(new) >= tau))
        x = jax.tree.map(lambda a, b: jnp.where(run_off, a, b), s.step.params, step.params)
        # A multiplier update needs a solved subproblem: after a stuck inner solve
        # (line search failed far from stationarity) keep mu and rho and only restart
        # the memory. Updating them from such a point made mu oscillate and rho hit
        # rho_max, and the iterates then ran away (n = 5, tight tau benchmark cases).
        # Known cost: a solve classed stuck just above the floor repeats the same
        # subproblem until max_outer (2 of 25 n = 6 float64 benchmark instances end
        # INFEASIBLE so; see benchmarks/RESULTS.md).
        mu = jnp.where(run_off | stuck, s.mu, mu)
        rho = jnp.where(stuck, s.rho, rho)
        rho = jnp.where(run_off, jnp.minimum(s.rho * options.rho_growth, rho_max), rho)
        give_up = run_off & (s.rho >= rho_max)
        # A line search that failed far from stationarity leaves a curvature pair
        # that can keep the next direction useless: restart the memory then (and
        # after a rejected step, whose history describes the run-off).
        fresh = fresh_state(x, mu, rho)
        state = jax.tree.map(lambda a, b: jnp.where(stuck | run_off, a, b), fresh, state)
        return _ALState(OptStep(x, state), mu, rho,
                        jnp.where(run_off, s.measure, measure), s.outer + 1,
                        s.inner + step.state.iter_num - s.step.state.iter_num,
                        inner_ok & (measure <= feas_tol) & ~run_off, give_up)

    x0 = _initial_x(problem, sc_star)
    mu0 = jnp.zeros((), dtype)
    rho0 = jnp.asarray(options.rho_init, dtype)
    init = _ALState(
        step=OptStep(x0, fresh_state(x0, mu0, rho0)),
        mu=mu0,
        rho=rho0,
        measure=jnp.asarray(jnp.inf, dtype),
        outer=jnp.zeros((), jnp.int32),
        inner=jnp.zeros((), jnp.int32),
        converged=jnp.asarray(False),
        stop=jnp.asarray(False),
    )
    s = jax.lax.while_loop(cond, body, init)
    params = _to_params(s.step.params, sc_star)
    violation = jnp.maximum(tau - trust_region(params), 0.0)
    return _finish(params, problem, lambda_inv, tau, converged=s.converged,
                   violation=violation, feas_tol=feas_tol,
                   iterations=s.inner, outer_iterations=s.outer)


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


@functools.lru_cache(maxsize=None)
def _batched(method: str, sc_star: bool, options: SolverOptions | None,
             batch_size: int | None = None):
    """jit of the solver over a tuple of buckets; ``batch_size`` (resolved, static):
    None vmaps each bucket whole, k runs ``lax.map`` over chunks of k vmapped
    instances (k = 1: one instance after another, no vmap)."""
    fn = _JAX_METHODS[method]
    kwargs = {"sc_star": sc_star}
    if options is not None:
        kwargs["options"] = options

    def one(problem, lambda_inv, tau):
        return fn(problem, lambda_inv, tau, **kwargs)

    def bucket(p, lam, t):
        if batch_size is None or batch_size >= lam.shape[0]:
            return jax.vmap(one)(p, lam, t)
        return jax.lax.map(lambda a: one(*a), (p, lam, t),
                           batch_size=None if batch_size == 1 else batch_size)

    def batch(problems, lambda_invs, taus):
        # A tuple of buckets, each its own vmap or map (and so its own while_loops)
        # inside the one compiled program.
        trace_counts[method] += 1  # runs only while tracing
        return tuple(bucket(p, lam, t) for p, lam, t in zip(problems, lambda_invs, taus))

    return jax.jit(batch)


def solve_batch(problem: Problem | Sequence[Problem], lambda_inv, tau, *,
                method: str = "augmented_lagrangian", sc_star: bool = False,
                options: SolverOptions | None = None, batch_size: int | None = None):
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
    tuple of :class:`Solution` is returned. Under vmap every instance pays for the
    batch's padded N and for its slowest instance's iterations, so grouping problems
    of similar size saves both (see ``sc_jax.calibrators.fit_batch``).
    """
    if method not in _JAX_METHODS:
        raise ValueError(f"unknown JAX solver {method!r}; choose one of "
                         f"{tuple(_JAX_METHODS)} (or 'scipy' through sc_jax.calibrators.fit)")
    fn = _batched(method, sc_star, options, resolve_batch_size(batch_size))
    if isinstance(problem, Problem):
        return fn((problem,), (lambda_inv,), (tau,))[0]
    problem, lambda_inv, tau = tuple(problem), tuple(lambda_inv), tuple(tau)
    if not (len(problem) == len(lambda_inv) == len(tau)):
        raise ValueError(f"{len(problem)} buckets but {len(lambda_inv)} lambda_inv and "
                         f"{len(tau)} tau arrays")
    return fn(problem, lambda_inv, tau)


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
          per_class: bool = False, options: ScipyOptions = ScipyOptions()) -> Solution:
    """``scipy.optimize.minimize(method="trust-constr")`` on the same problem, float64.

    Objective gradient and Hessian, constraint Jacobian and constraint Hessian are exact
    (JAX autodiff, jit-compiled once per shape). ``per_class=True`` imposes cos_c >= tau
    for every class (the problem :func:`projected` solves) instead of the mean. Starts
    from the identity. Runs under a local ``jax.enable_x64`` scope, so it works
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
        x0 = np.zeros(n1) if sc_star else np.concatenate([np.zeros(n1), np.ones(n1)])

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
    )
