"""The SciPy reference: ``scipy.optimize.minimize(method="trust-constr")`` in float64.

The parity reference the JAX solvers are held to; it solves either constraint form
(the paper's mean cosine, or the per-class cones the projected solver uses).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from sc_jax.calibration.objective import (
    Params,
    Problem,
    class_cosines,
    cone_margins,
    cone_violation,
    objective,
    params_from_flat,
    trust_region,
)
from sc_jax.calibration.solvers.runoff import end_point_unbounded
from sc_jax.calibration.solvers.types import Solution, status_code


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


def _optimize():
    # Imported on first use: scipy.optimize takes about 0.4 s to import, and only the
    # float64 reference needs it (the JAX solvers and the command line do not).
    from scipy import optimize  # noqa: PLC0415

    return optimize


@functools.partial(jax.jit, static_argnames=("sc_star",))
def value_and_grad(x, problem, lambda_inv, sc_star):
    """f and its gradient at the flat x (jit-compiled once per shape)."""
    return jax.value_and_grad(
        lambda z: objective(params_from_flat(z, sc_star), problem, lambda_inv))(x)


@functools.partial(jax.jit, static_argnames=("sc_star",))
def hessian(x, problem, lambda_inv, sc_star):
    """f's Hessian at the flat x."""
    return jax.hessian(
        lambda z: objective(params_from_flat(z, sc_star), problem, lambda_inv))(x)


def _constraint_fn(tau, sc_star: bool, per_class: bool):
    # Mean form: mean_c cos_c >= tau. Per-class form: the exact cones,
    # w_c - tau ||theta_c|| >= 0, the set that the projected solver projects onto.
    def c(z):
        params = params_from_flat(z, sc_star)
        if per_class:
            return cone_margins(params, tau)
        return jnp.mean(class_cosines(params))[None] - tau
    return c


@functools.partial(jax.jit, static_argnames=("sc_star", "per_class"))
def constraint(x, tau, sc_star, per_class):
    """The constraint's value (>= 0 feasible) and Jacobian at the flat x."""
    c = _constraint_fn(tau, sc_star, per_class)
    return c(x), jax.jacobian(c)(x)


@functools.partial(jax.jit, static_argnames=("sc_star", "per_class"))
def constraint_hessian(x, v, tau, sc_star, per_class):
    """The Hessian of v . c(x)."""
    c = _constraint_fn(tau, sc_star, per_class)
    return jax.hessian(lambda z: jnp.dot(v, c(z)))(x)


def _f64(x) -> np.ndarray:
    """A point from trust-constr as the jitted functions take it: a float64 NumPy array,
    moved by jit's argument handling (``jnp.asarray`` runs a program per call on jax 0.10)."""
    return np.asarray(x, np.float64)


def _float64(problem: Problem) -> Problem:
    return Problem(features=jnp.asarray(np.asarray(problem.features), jnp.float64),
                   labels=jnp.asarray(np.asarray(problem.labels), jnp.int32),
                   query_ids=jnp.asarray(np.asarray(problem.query_ids), jnp.int32),
                   mask=jnp.asarray(np.asarray(problem.mask), jnp.float64),
                   num_queries=problem.num_queries)


def _constraints(tau: float, sc_star: bool, per_class: bool) -> list:
    """trust-constr's constraint with exact Jacobian and Hessian; none for tau = -1
    (the cosine is always >= -1)."""
    if tau <= -1.0:
        return []
    t = jnp.asarray(tau, jnp.float64)
    return [_optimize().NonlinearConstraint(
        lambda x: np.asarray(constraint(_f64(x), t, sc_star, per_class)[0]), 0.0, np.inf,
        jac=lambda x: np.asarray(constraint(_f64(x), t, sc_star, per_class)[1]),
        hess=lambda x, v: np.asarray(constraint_hessian(_f64(x), _f64(v), t, sc_star, per_class)))]


def _on_host():
    """A context that puts :func:`scipy`'s JAX work on the CPU device where the default
    backend is an accelerator; where it is the CPU already, no context at all.

    trust-constr iterates on the host and asks for a few derivatives of small arrays
    per iteration; on an accelerator each of those is a dispatch and a transfer back,
    which made the loop about 1.7 times slower on an H200 machine than on a 2-core CPU
    VM. Evaluated on the CPU device, the loop is the host loop it is reported as. On a
    CPU backend a ``default_device`` context would only change the trace context (a
    second compilation of the same programs; on jaxlib 0.12.0.1 that brought back the
    crash that tests/calibration/test_solvers.py's cache fixture describes), so none is entered."""
    if jax.default_backend() == "cpu":
        return contextlib.nullcontext()
    try:
        return jax.default_device(jax.devices("cpu")[0])
    except RuntimeError:  # no CPU backend loaded (JAX_PLATFORMS=cuda)
        return contextlib.nullcontext()


def _runs_off(x: np.ndarray, prob: Problem, lam, tau: float, sc_star: bool, per_class: bool,
              feas_tol: float) -> bool:
    """The ray test every solver's UNBOUNDED follows (:func:`.runoff.end_point_unbounded`)
    at trust-constr's end point x: trust-constr stops on a small gradient, which a
    run-off meets too. Its points are evaluated one by one with the functions the
    solve compiled (a vmapped program would be one more compilation per shape)."""
    t = jnp.asarray(tau, jnp.float64)

    def fun(u):
        return float(value_and_grad(_f64(u), prob, lam, sc_star)[0])

    def feasible(u):
        return tau <= -1.0 or bool(np.all(np.asarray(
            constraint(_f64(u), t, sc_star, per_class)[0]) >= -feas_tol))

    def evaluate(pts):  # [n, 2, p] -> f and feasibility there, NumPy
        flat = np.asarray(pts).reshape(-1, pts.shape[-1])
        shape = pts.shape[:2]
        return (np.reshape([fun(u) for u in flat], shape),
                np.reshape([feasible(u) for u in flat], shape))

    x = np.asarray(x, np.float64)
    return bool(end_point_unbounded(x, fun(x), evaluate, prob.num_classes - 1,
                                    bool(np.any(np.asarray(prob.mask) > 0))))


def scipy(problem: Problem, lambda_inv: float, tau: float, *, sc_star: bool = False,
          per_class: bool = False, options: ScipyOptions = ScipyOptions(),
          x0=None) -> Solution:
    """``scipy.optimize.minimize(method="trust-constr")`` on the same problem, float64.

    Objective gradient and Hessian, constraint Jacobian and constraint Hessian are
    exact (JAX autodiff, jit-compiled once per shape). ``per_class=True`` imposes
    cos_c >= tau for every class (the problem :func:`.projected.projected` solves)
    instead of the mean. Starts from ``x0`` (flat (b, w), or b for SC*), by default
    the identity. Runs under a local ``jax.enable_x64`` scope, so it works whatever
    the process-wide setting is. Returns NumPy arrays in a :class:`Solution`; the
    status from the same ladder as the JAX solvers (gtol or xtol reached: CONVERGED,
    unless the end point is on a run-off: UNBOUNDED by the ray test they all share,
    :func:`.runoff.end_point_unbounded`).
    Its derivatives are evaluated on the CPU device, whatever the default device.
    """
    with jax.enable_x64(True), _on_host():
        prob = _float64(problem)
        n1 = prob.num_classes - 1
        lam = jnp.asarray(lambda_inv, jnp.float64)
        if x0 is None:
            x0 = np.zeros(n1) if sc_star else np.concatenate([np.zeros(n1), np.ones(n1)])

        def fun(x):
            v, g = value_and_grad(_f64(x), prob, lam, sc_star)
            return float(v), np.asarray(g)

        constraints = _constraints(tau, sc_star, per_class)
        res = _optimize().minimize(
            fun, np.asarray(x0, np.float64), jac=True, method="trust-constr",
            hess=lambda x: np.asarray(hessian(_f64(x), prob, lam, sc_star)),
            constraints=constraints,
            options={"gtol": options.gtol, "xtol": options.xtol,
                     "barrier_tol": options.barrier_tol, "maxiter": options.max_iter,
                     "initial_barrier_parameter": options.initial_barrier,
                     "initial_barrier_tolerance": options.initial_barrier})
        params = params_from_flat(jnp.asarray(res.x), sc_star)
        obj = float(objective(params, prob, lam))
        cons = float(trust_region(params))
        violation = (float(cone_violation(params, jnp.asarray(tau, jnp.float64))) if per_class
                     else max(0.0, tau - cons))
        unbounded = _runs_off(res.x, prob, lam, tau, sc_star, per_class, options.feas_tol)
    status = status_code(finite=np.isfinite(obj) and np.all(np.isfinite(res.x)),
                         violation=violation, feas_tol=options.feas_tol, unbounded=unbounded,
                         converged=res.status in (1, 2))
    return Solution(
        params=Params(np.asarray(params.b), np.asarray(params.w)),
        status=np.int32(status), iterations=np.int32(res.nit),
        outer_iterations=np.int32(1), objective=np.float64(obj),
        constraint=np.float64(cons), violation=np.float64(violation),
        # trust-constr's multiplier of the one constraint, sign-free.
        multiplier=np.float64(abs(res.v[0][0]) if constraints else 0.0))


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
