"""The projected solver: ``jaxopt.ProjectedGradient`` onto the per-class cones."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from sc_jax.calibration.objective import Problem, cone_violation, objective
from sc_jax.calibration.solvers import parameters
from sc_jax.calibration.solvers.runoff import end_point_unbounded
from sc_jax.calibration.solvers.types import Solution, SolverOptions, finish

Array = jax.Array


def _objective(z: Array, problem: Problem, lambda_inv, *, sc_star: bool) -> Array:
    return objective(parameters.to_params(z, sc_star), problem, lambda_inv)


def _projection(z: Array, tau, *, sc_star: bool) -> Array:
    return parameters.project(z, tau, sc_star)


def projected(problem: Problem, lambda_inv, tau, *, sc_star: bool = False,
              options: SolverOptions = SolverOptions()) -> Solution:
    """Solve the per-class-constrained problem with ``jaxopt.ProjectedGradient``.

    min f(theta) s.t. cos(theta_c, v) >= tau for every class c, with the exact cones
    (the apex included; :func:`.geometry.project_cone`). Every iterate is feasible
    for the paper's mean constraint too (with the exact cosine), so the optimum is
    never better than the paper's; it equals it when the constraint is inactive or
    n = 2. ``violation`` is the per-class one.

    jaxopt's projected gradient is FISTA (accelerated, with backtracking). Without
    restarts its momentum makes it oscillate on the ill-conditioned, non-separable
    problems that surrogate data give (thousands of iterations to 1e-8 on a
    1,680-row problem); restarting the momentum every ``pg_restart`` iterations (a
    fixed-schedule restart) cuts that by an order of magnitude.

    It stops on a small gradient mapping, which a run-off (data separable along a
    direction inside the cones: f falls towards an infimum no finite theta attains)
    meets too: the end point's status comes from the ray test every solver shares
    (:func:`.runoff.end_point_unbounded`), UNBOUNDED there, never CONVERGED.

    problem: one unbatched :class:`Problem`; lambda_inv, tau: scalars (may be traced).
    """
    # Imported here: importing jaxopt prints a deprecation warning, which
    # `import sc_jax` must not.
    from jaxopt import ProjectedGradient  # noqa: PLC0415

    dtype = problem.features.dtype
    tol, feas_tol = options.tolerances(dtype, projected=True)
    lambda_inv = jnp.asarray(lambda_inv, dtype)
    tau = jnp.asarray(tau, dtype)
    projection = functools.partial(_projection, sc_star=sc_star)
    pg = ProjectedGradient(fun=functools.partial(_objective, sc_star=sc_star),
                           projection=projection, tol=tol, maxiter=options.pg_restart,
                           implicit_diff=False, unroll=False)

    def cond(s):
        _, iters, done = s
        return (~done) & (iters < options.max_pg_iter)

    def body(s):
        z, iters, _ = s
        step = pg.run(z, tau, problem, lambda_inv)
        return step.params, iters + step.state.iter_num, step.state.error <= tol

    z0 = projection(parameters.initial(problem.num_classes - 1, dtype, sc_star), tau)
    z, iters, done = jax.lax.while_loop(
        cond, body, (z0, jnp.zeros((), jnp.int32), jnp.asarray(False)))
    params = parameters.to_params(z, sc_star)
    f = objective(params, problem, lambda_inv)

    def evaluate(pts):  # [n, 2, p] -> f and cone membership there
        def one(u):
            pu = parameters.to_params(u, sc_star)
            return objective(pu, problem, lambda_inv), cone_violation(pu, tau) <= feas_tol
        return jax.vmap(jax.vmap(one))(pts)

    runs_off = end_point_unbounded(z, f, evaluate, problem.num_classes - 1,
                                   jnp.any(problem.mask > 0))
    return finish(params, f, converged=done, violation=cone_violation(params, tau),
                  feas_tol=feas_tol, iterations=iters, outer_iterations=1,
                  unbounded=runs_off)
