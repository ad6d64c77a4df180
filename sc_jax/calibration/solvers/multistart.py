"""The augmented-Lagrangian solver: multi-start, run-off follow-up, the best end point.

Each start runs the loop of :mod:`.lagrangian` (its first phase), then the ray test
(:func:`.runoff.not_attained`). After a run-off, a second phase (``follow_runoffs``)
solves again on all rows, from the point the ray test reached, with the class that
ran off held in polar coordinates, (b_c, w_c) = e^s (sin phi, cos phi): in (b_c, w_c)
the fall of f per unit of ||theta_c|| soon lies below the stationarity tolerance
(float32's especially), while the other classes and the run-off's direction must still
adjust to it (a binding mean cosine couples them); per unit of s it is ||theta_c||
times larger, and the class's cosine depends on phi alone. Both phases run in one loop,
so the program holds one copy of the solver. With several starts each start is
followed up on its own run-off (the starts vmapped on an accelerator, mapped on a
CPU) before the starts' end points are compared:
a start whose first phase crawls along a run-off can end that phase far above the
basin its follow-up reaches.

A first phase that stops without converging with classes near their apex,
||theta_c|| <= APEX_RADIUS COSINE_EPS, and no run-off is followed up too
(``follow_apex``): from its end point, on all rows, with those classes held in cosine
form, (b_c, t_c = cos_c) (:mod:`.charts`). Where the constraint binds there (near-
uninformative data, or a class that a strong invariance term switches off) the first
phase crawls along the boundary, which bends on the scale COSINE_EPS, until
``max_iter``; in cosine form the constraint is linear and the follow-up converges.
Solves that converge in their first phase never run it.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sc_jax.calibration.objective import COSINE_EPS, Problem, value
from sc_jax.calibration.solvers import charts, lagrangian, parameters
from sc_jax.calibration.solvers.geometry import cosine_margin, restore_feasibility
from sc_jax.calibration.solvers.lagrangian_state import Setup, State, setup
from sc_jax.calibration.solvers.levels import Rows, level_designs, level_evaluator
from sc_jax.calibration.solvers.runoff import not_attained, unbounded
from sc_jax.calibration.solvers.types import Solution, SolverOptions, finish

Array = jax.Array

# The start set (SolverOptions.num_starts). The invariance term is not convex and the
# mean-cosine feasible set is not convex either, so a problem can have several KKT
# points (with lambda_inv >= 1 and no trust region, SciPy's five starts end at 2.5
# distinct points, median, on the hardest synthetic instances: benchmarks/
# local_optima.py). The set: the identity; its slopes stretched (3), shrunk (0.3) and
# reversed (-1), for confident, collapsed and reversing calibrators; the two collapsed
# calibrators of uninformative data, which predict one class or the other (b = +-2,
# w = 0.3: the symmetric optima of the apex family); then points drawn once by a fixed
# generator (b ~ N(0, 1.5^2), w ~ U(-0.5, 2)), a function of (n - 1, count) alone, so
# the set is static under jit. 96 starts reach or go below SciPy's best start on every
# lambda_inv >= 1/2 instance of the synthetic sweep.
_START_SLOPES = (1.0, 3.0, 0.3, -1.0)
_START_OFFSETS = (2.0, -2.0)
# The starts fit_batch uses where lambda_inv >= NONCONVEX_LAMBDA (see fit_batch).
NONCONVEX_STARTS = 96
# Where the objective stops being convex. At a flat calibrator (w = 0: the same
# prediction p = softmax(0, b) on every row) the invariance term is 2 H(p), and at the
# uniform p the Hessians in b of the NLL and of H are C and -C (C = diag(p) - p p^T,
# positive definite): f's is (1 - 2 lambda_inv) C, flat at 1/2 and negative definite
# above, so around the flat calibrators that near-uninformative data select, f has
# several basins from lambda_inv = 1/2 on.
NONCONVEX_LAMBDA = 0.5


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


class Phase(NamedTuple):
    """One phase's end, in plain coordinates v (flat (b, w), or b for SC*)."""

    v: Array
    f: Array
    unbounded: Array  # the infimum is not attained
    done: Array  # converged
    multiplier: Array  # of the paper's (unscaled) constraint
    it: Array  # passes
    outer: Array  # outer updates
    cls: Array  # the class a run-off's follow-up puts in polar form
    follow: Array  # a follow-up phase is due (the first phase's end only)
    apex: Array  # [n1] the classes an apex follow-up puts in cosine form


def _margin(su: Setup, v: Array) -> Array:
    """Mean cosine minus tau at v: >= 0 is feasible."""
    return cosine_margin(parameters.expand(v, su.sc_star), su.tau)


def _feasible(su: Setup, v: Array) -> Array:
    return _margin(su, v) >= -su.feas_tol


def _fun(su: Setup, v: Array) -> Array:
    """f on all rows at v."""
    return su.rows.value(parameters.expand(v, su.sc_star))


def _end_phase(su: Setup, s: State, force, one_site: bool) -> Phase:
    """A phase's end point in plain coordinates, moved onto the constraint if it ended
    outside it, then the ray test (which follows a run-off it finds); and which
    follow-up, if any, a first phase calls for."""
    z, n1 = s.point.z, su.n1
    v = z if su.sc_star else charts.to_x(z, s.chart, n1)
    v, f = restore_feasibility(v, s.point.f, lambda u: _margin(su, u), lambda u: _fun(su, u),
                               su.feas_tol)
    f0 = f
    rt = not_attained(v, f, s.point.hess, lambda u: _fun(su, u), lambda u: _feasible(su, u),
                      n1, converged=s.done, tol=su.tol, one_site=one_site, force=force)
    r = 100.0 * jnp.finfo(f.dtype).eps
    # A follow-up phase (s.chart.cls >= 0) whose class rises when doubled ended at a
    # minimiser, however far out; flat to rounding there, the class saturated on its
    # way to an infimum at infinity, which is still not attained.
    polar = s.chart.cls >= 0
    unb = rt.unbounded | (polar & ~(rt.f2x[1 + jnp.maximum(s.chart.cls, 0)] > f0 * (1.0 + r)))
    # The first phase is followed up after a run-off, and also where f merely fell at
    # 2x along some ray: a stop in the slow valley of a run-off whose direction is
    # still turning (the 4x point then rises, so the ray test calls no run-off).
    runoff = su.options.follow_runoffs & (unb | jnp.any(rt.f2x < f0 * (1.0 - r)))
    # A first phase that stopped unconverged with classes near their apex and no
    # run-off is followed up in cosine form; that takes precedence over the polar
    # follow-up of a mere fall at 2x along some ray.
    first = charts.is_plain(s.chart)
    apex = jnp.zeros(n1, bool)
    if su.options.follow_apex and not su.sc_star:
        near = jnp.hypot(rt.x[:n1], rt.x[n1:]) <= charts.APEX_RADIUS * COSINE_EPS
        apex = first & ~s.done & ~unb & near
    zs = jnp.where(first, rt.x, z)  # the solver's coordinates there
    # The multiplier of the paper's constraint is mu times the scale sqrt(1 + ||z||^2).
    return Phase(rt.x, rt.f, unb, s.done, s.dual.mu * jnp.sqrt(1.0 + jnp.dot(zs, zs)),
                 s.it, s.dual.outer, rt.cls, runoff | jnp.any(apex), apex)


def _phase(su: Setup, prev: Phase, z0, chart, level0, later,
           one_site: bool) -> Phase:
    """One phase from z0 (coordinates of ``chart``) at level ``level0``. A later phase
    is a follow-up: of a run-off (one class in polar form) or of a stop near the apex
    (those classes in cosine form); from the first phase's end, on all rows, with a
    budget of ``max_iter`` passes of its own (a first phase that crawled along the
    run-off in (b, w), as float32 does, leaves nothing otherwise). Its verdict
    replaces the first phase's: after a run-off, f still falls along a ray or is flat
    to rounding when the class is doubled (UNBOUNDED), or rises there (a minimiser
    far out: CONVERGED). It is kept if it ends feasible and no higher than ``prev``."""
    new = _end_phase(su, lagrangian.run(su, z0, chart, level0), later, one_site)
    keep = ~later | (_feasible(su, new.v) & jnp.isfinite(new.f) & (new.f <= prev.f))
    it, outer = prev.it + new.it, prev.outer + new.outer
    return jax.tree.map(lambda u, w: jnp.where(keep, u, w), new._replace(it=it, outer=outer),
                        prev._replace(it=it, outer=outer))


def _follow_up_chart(prev: Phase) -> charts.Chart:
    """The chart of the follow-up a first phase's end calls for."""
    to_apex = jnp.any(prev.apex)
    return charts.Chart(jnp.where(to_apex, -1, prev.cls).astype(jnp.int32), prev.apex)


def solve_start(su: Setup, z0: Array, one_site: bool = False) -> Phase:
    """One start's solve: its first phase (the plain chart, level 0), then, where its
    end calls for one, the follow-up, both in one loop (one copy of the solver's loop
    and of the ray test in the program)."""
    n1 = su.n1
    if su.sc_star or not (su.options.follow_runoffs or su.options.follow_apex):
        return _end_phase(su, lagrangian.run(su, z0), False, one_site)
    dtype, zero_i = z0.dtype, jnp.zeros((), jnp.int32)

    def body(c):
        ph, prev = c
        first = ph == 0
        later = _follow_up_chart(prev)
        chart = jax.tree.map(lambda a, b: jnp.where(first, a, b), charts.plain(n1), later)
        start = jnp.where(first, z0, charts.from_x(prev.v, later, n1))
        return ph + 1, _phase(su, prev, start, chart, jnp.where(first, 0, su.rows.levels),
                              ~first, one_site)

    none = Phase(z0, jnp.asarray(jnp.inf, dtype), jnp.asarray(False), jnp.asarray(False),
                 jnp.zeros((), dtype), zero_i, zero_i, jnp.asarray(-1, jnp.int32),
                 jnp.asarray(False), jnp.zeros(n1, bool))
    return jax.lax.while_loop(lambda c: (c[0] == 0) | ((c[0] == 1) & c[1].follow),
                              body, (zero_i, none))[1]


def best_start(su: Setup, runs: Phase) -> Phase:
    """The lowest objective among the starts' feasible end points (``[S]`` runs),
    converged or not: a start that runs off along a separable direction never
    converges, and its falling f beats every KKT point of the other basins (its ray
    test reports UNBOUNDED). A converged end wins a tie within sqrt(eps). The first
    start's end point if none is feasible. Iterations count every start's passes."""
    viol = -jax.vmap(lambda v: _margin(su, v))(runs.v)
    slack = jnp.sqrt(jnp.finfo(runs.f.dtype).eps) * (1.0 + jnp.abs(runs.f))
    score = jnp.where((viol <= su.feas_tol) & jnp.isfinite(runs.f),
                      runs.f + jnp.where(runs.done, 0.0, slack), jnp.inf)
    k = jnp.where(jnp.any(jnp.isfinite(score)), jnp.argmin(score), 0)
    return jax.tree.map(lambda a: a[k], runs)._replace(it=jnp.sum(runs.it),
                                                      outer=jnp.sum(runs.outer))


def solve(rows: Rows, n1: int, dtype, lambda_inv, tau, *, sc_star: bool,
          options: SolverOptions, one_site: bool = False) -> Solution:
    """The augmented Lagrangian on one instance's :class:`.levels.Rows`, from
    ``options.num_starts`` starts. ``one_site`` (a CPU, which solves one instance at a
    time): the starts one after another and the ray test's points one by one
    (:func:`.runoff.not_attained`); otherwise the starts are vmapped."""
    su = setup(rows, n1, dtype, tau, sc_star=sc_star, options=options)
    starts = jnp.asarray(start_points(n1, options.num_starts, sc_star), dtype)  # [S, p]
    if options.num_starts == 1:
        res = solve_start(su, starts[0], one_site)
    elif one_site:
        # A CPU runs the starts one after another (lax.map): vmapped, each start's
        # nested while loops would run in lockstep to the slowest start's count, with
        # every lax.cond a select that runs both branches. JAX's batching of nested
        # while loops is also slow to trace (2.9 of the 4.1 s that tracing a 96-start
        # fit_batch took). Mapped, 7 float64 96-start fits took 22.5 s cold (62.1 s
        # vmapped) and 3.1 s warm (5.4 s), the same optima (benchmarks/RESULTS.md).
        res = best_start(su, jax.lax.map(lambda z: solve_start(su, z, one_site), starts))
    else:  # an accelerator: the starts in lockstep fill it
        res = best_start(su, jax.vmap(lambda z: solve_start(su, z, one_site))(starts))
    violation = jnp.maximum(-_margin(su, res.v), 0.0)
    return finish(parameters.to_params(res.v, sc_star), res.f, converged=res.done,
                  violation=violation, feas_tol=su.feas_tol, iterations=res.it,
                  outer_iterations=res.outer + 1,
                  unbounded=unbounded(res.unbounded, res.f, rows.has_rows),
                  multiplier=res.multiplier)


def augmented_lagrangian(problem: Problem, lambda_inv, tau, *, sc_star: bool = False,
                         options: SolverOptions = SolverOptions(),
                         one_site: bool = False) -> Solution:
    """Solve Eq. final_opt_problem (the mean-cosine constraint) for one problem.

    The PHR augmented Lagrangian of :mod:`.lagrangian` (trust-region Newton steps
    with the exact Hessian, primal-dual steps near the solution, subsample levels
    for large N) from ``options.num_starts`` starts (:func:`start_points`; the
    identity, b = 0 and w = 1, first), each followed up on its own run-off; the
    best end point is kept (:func:`best_start`). An infimum that is not attained
    (data separable along a feasible direction: f tends to 0 as ||theta|| grows)
    ends ``UNBOUNDED``: the final point is feasible and f falls when theta (or one
    class's part of it) is doubled and doubled again, which no minimiser allows.

    problem: one unbatched :class:`Problem` (``[N, n-1]`` features); lambda_inv, tau:
    scalars (may be traced). Pure: composes with jit and vmap. ``one_site``: the starts
    run one after another (``lax.map``) and the ray test's points are evaluated one by
    one (:func:`.runoff.not_attained`): the same result in a smaller program, for a
    CPU, which solves instances one after another; otherwise the starts are vmapped,
    in lockstep, as fills an accelerator.
    """
    dtype = problem.features.dtype
    lambda_inv = jnp.asarray(lambda_inv, dtype)
    sizes = options.coarse_levels(problem.features.shape[0])
    designs = level_designs(problem, sizes)
    rows = Rows(evaluate=level_evaluator(designs, lambda_inv),
                           value=lambda x: value(x, designs[-1], lambda_inv),
                           levels=len(sizes), has_rows=jnp.any(problem.mask > 0))
    return solve(rows, problem.num_classes - 1, dtype, lambda_inv, tau, sc_star=sc_star,
                 options=options, one_site=one_site)
