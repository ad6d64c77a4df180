"""The augmented-Lagrangian iteration for one start: ``init`` / ``step`` / ``terminate``.

PHR augmented Lagrangian for the single constraint g(x) = mean_c cos_c - tau >= 0
(scaled, see below),

    L_A(x; mu, rho) = f(x) + [max(0, mu - rho g(x))^2 - mu^2] / (2 rho),

minimised by trust-region Newton steps with the exact Hessian
(:func:`sc_jax.calibration.objective.value_grad_hess`; the constraint's in closed form,
:mod:`.geometry`; the generalised Hessian of the max term), every step solved exactly
by :func:`.steps.trust_region_step`. A trust region cannot stall: a rejected step
shrinks the radius until the quadratic model is accurate, and an accepted one lowers
L_A. One flat loop of at most ``max_iter`` passes, each one evaluation of f, its
gradient and Hessian (at the pending trial point), then one step. A subproblem counts
as solved once its gradient is below a tenth of the constraint measure
|min(g, mu/rho)| (below ``tol`` at the end); the multiplier then takes a Newton step
on the dual function, and rho grows by ``rho_growth`` if the measure did not shrink by
``progress``. The solve ends at a KKT point: gradient below ``tol`` and measure below
``feas_tol``. tau = -1 makes the constraint vacuous (the cosine is > -1): plain Newton
on f.

The constraint is the mean cosine times sqrt(1 + ||z||^2): the same feasible set and
KKT points, but a penalty that grows along every infeasible ray. The plain cosine is
homogeneous of degree 0, so its penalty is bounded on rays, while f's cost of turning
away from a direction along which the data are separable grows with ||x||: once an
iterate runs off along such an infeasible direction, no finite rho brings it back.

Large problems are first solved, by the same loop, on fixed random subsamples of their
rows (:class:`.types.SolverOptions` ``coarse_rows``), each level from the last one's
point, multiplier and penalty. Where the constraint is active at a level's end, and
after a multiplier update with mu > 0 (at most ``_SQP_ENTRIES`` times per solve), the
loop takes joint primal-dual Newton steps on the KKT conditions
(:func:`.steps.sqp_step`), backtracked on the KKT residual, while the KKT matrix has
the inertia of a strict local minimiser; otherwise the trust region resumes. Where the
steps before show quadratic convergence, the last step is taken without evaluating
its end point (``_TERMINAL_FRACTION``).

The loop works in the solver's coordinates z of a :class:`.charts.Chart`: x itself,
x with one class in polar form (the follow-up of a run-off), or x with the classes
near their apex in cosine form (the follow-up of a stop there); the follow-ups are
:mod:`.multistart`'s, never for SC*, whose w is pinned. Its setup and state, and f, c
and L_A in its coordinates, are in :mod:`.lagrangian_state`; the rows of each level
in :mod:`.levels`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from sc_jax.calibration.solvers import charts
from sc_jax.calibration.solvers.charts import Chart
from sc_jax.calibration.solvers.lagrangian_state import (
    Coarse,
    Dual,
    Point,
    PrimalDual,
    Setup,
    State,
    Trial,
    constraint,
    constraint_measure,
    derivatives,
    lagrangian,
)
from sc_jax.calibration.solvers.steps import kkt_residual, sqp_step, trust_region_step

Array = jax.Array

# Primal-dual (SQP) modes begun at multiplier updates, per solve: a problem whose
# steps keep failing the inertia or Armijo test does not pay for them at every update.
_SQP_ENTRIES = 3
# The terminal step ends a solve where the residual that quadratic convergence
# predicts after the step is below this fraction of tol; 0 turns it off (every solve
# then ends on an evaluated point).
_TERMINAL_FRACTION = 0.1


# ---------------------------------------------------------------------------------
# init / step / terminate.


def init(su: Setup, z0: Array, chart: Chart | None = None, level0=0) -> State:
    """The state before the first pass, from z0 (in the coordinates of ``chart``, the
    plain chart if None) at level ``level0``; z0 is the first trial, accepted
    unconditionally."""
    dtype = su.tau.dtype
    zero, p = jnp.zeros((), dtype), z0.shape[0]
    zero_i = jnp.zeros((), jnp.int32)
    inf = jnp.asarray(jnp.inf, dtype)
    vec, mat = jnp.zeros(p, dtype), jnp.zeros((p, p), dtype)
    return State(
        point=Point(z0, zero, vec, mat, zero, vec, mat),
        trial=Trial(z0, zero, zero, jnp.asarray(False), jnp.asarray(True), inf,
                    jnp.asarray(su.options.radius_init, dtype)),
        dual=Dual(zero, jnp.asarray(su.options.rho_init, dtype), inf, zero_i, zero_i),
        pd=PrimalDual(jnp.asarray(False), zero, jnp.ones((), dtype), inf, zero_i),
        coarse=Coarse(jnp.asarray(level0, jnp.int32), zero_i, z0),
        it=zero_i, done=jnp.asarray(False),
        chart=charts.plain(su.n1) if chart is None else chart)


def terminate(su: Setup, s: State) -> Array:
    """Done (a KKT point on all rows, or a terminal step), or out of passes."""
    return s.done | (s.it >= su.options.max_iter)


def run(su: Setup, z0: Array, chart: Chart | None = None, level0=0) -> State:
    """One phase: :func:`step` from :func:`init` until :func:`terminate`."""
    return jax.lax.while_loop(lambda s: ~terminate(su, s), lambda s: step(su, s),
                              init(su, z0, chart, level0))


class _Judged(NamedTuple):
    """A pass's verdict on the pending trial (:func:`_judge_trial`)."""

    point: Point  # the accepted point after the verdict
    accept: Array
    first: Array  # the trial was a start point
    tiny: Array  # its predicted decrease is below the rounding of L_A
    ratio: Array  # actual over predicted decrease
    pd_step: Array  # the trial was a primal-dual step
    pd_ok: Array  # ... and it lowered the KKT residual enough
    backtrack: Array  # ... it did not, and is halved
    pd_on: Array  # the primal-dual mode goes on
    mu: Array  # the multiplier at the accepted point
    res_t: Array  # KKT residual at the trial
    radius: Array


def _judge_trial(su: Setup, s: State, ev: tuple) -> _Judged:
    """Accept or reject the trial from its evaluation ``ev`` (:func:`derivatives`).

    A trust-region step is accepted on the ratio of actual to predicted decrease of
    L_A; below the rounding of L_A the ratio is noise, so a step the model predicts to
    be that small is accepted (it cannot hurt by more than the noise). A primal-dual
    step is judged by the KKT residual instead (Armijo's test); one that fails it is
    halved, at most three times, and then dropped together with the mode. The mode
    also ends after an accepted step that did not halve the residual: outside the
    region of quadratic convergence (a degenerate multiplier, a run-off) halved steps
    crawl.
    """
    dtype = su.tau.dtype
    eps, tiny_ = jnp.finfo(dtype).eps, jnp.finfo(dtype).tiny
    t, d, pd = s.trial, s.dual, s.pd
    ft, gft, hft, ct, gct, hct = ev
    first = t.fresh
    Lt = ft + (jnp.maximum(d.mu - d.rho * ct, 0.0) ** 2 - d.mu**2) / (2.0 * d.rho)
    ared = t.La - Lt
    noise = 100.0 * eps * jnp.maximum(jnp.abs(t.La), 1.0)
    ratio = ared / jnp.maximum(t.pred, tiny_)
    finite = jnp.isfinite(Lt) & jnp.all(jnp.isfinite(gft)) & jnp.all(jnp.isfinite(hft))
    tiny = t.pred <= noise
    pd_step = pd.on & ~first
    res_t = kkt_residual(gft, ct, gct, pd.mu)
    pd_ok = finite & (res_t <= (1.0 - 1e-4 * pd.frac) * pd.residual)
    backtrack = pd_step & ~pd_ok & (pd.frac > 0.125)
    accept = first | jnp.where(
        pd_step, pd_ok, finite & ((ratio >= 0.1) | (tiny & (ared >= -noise))))
    snorm = jnp.linalg.norm(t.z - s.point.z)
    radius = jnp.where(
        first | pd_step, t.radius,
        # Every rejected step shrinks the radius (a step rejected below the rounding
        # threshold too: else the same trial comes back forever).
        jnp.where(~accept | (~tiny & (ratio < 0.25)), 0.25 * snorm,
                  jnp.where((ratio > 0.75) & ~t.interior,
                            jnp.minimum(2.0 * t.radius, su.options.radius_max), t.radius)))
    new = Point(t.z, ft, gft, hft, ct, gct, hct)
    point = jax.tree.map(lambda a, b: jnp.where(accept, a, b), new, s.point)
    return _Judged(
        point=point, accept=accept, first=first, tiny=tiny, ratio=ratio, pd_step=pd_step,
        pd_ok=pd_ok, backtrack=backtrack,
        pd_on=pd.on & (first | (pd_ok & (res_t <= 0.5 * pd.residual)) | backtrack),
        mu=jnp.where(pd_step & pd_ok, pd.mu, d.mu), res_t=res_t,
        radius=jnp.maximum(radius, tiny_))


class _Outer(NamedTuple):
    """A pass's outer-iteration decision (:func:`_outer_update`)."""

    mu: Array
    rho: Array
    update: Array  # the multiplier and penalty were updated
    kkt: Array  # the accepted point is a KKT point on this level's rows
    loose: Array  # the subproblem is solved as well as the multiplier is known
    measure: Array
    gmax: Array  # max |grad L_A| at the accepted point, before the update


def _dual_newton(j: _Judged, ha: Array, shifted: Array, loose: Array, rho: Array) -> Array:
    """Newton's step on the dual function psi(mu) = min_x L_A(x; mu, rho) instead of
    the first-order mu - rho g: at the subproblem's minimiser psi'(mu) = -g and
    psi''(mu) = -gc^T H_A^-1 gc =: -t_A, so mu - g / t_A = (mu - rho g) - g / t with
    t_A = t / (1 + rho t). Where the constraint is inactive, or H_A is not positive
    definite (the inner budget ran out), the first-order step stays."""
    p = j.point
    hg = jax.scipy.linalg.cho_solve((jnp.linalg.cholesky(ha), True), p.gc)
    t_a = jnp.dot(p.gc, hg)
    good = loose & jnp.all(jnp.isfinite(hg)) & (t_a > 0) & (j.mu - rho * p.c > 0)
    t_inv = jnp.where(good, 1.0 / jnp.where(good, t_a, 1.0) - rho, 0.0)
    newton_mu = jnp.maximum(shifted - p.c * jnp.maximum(t_inv, 0.0), 0.0)
    return jnp.where(good, newton_mu, shifted)


def _outer_update(su: Setup, s: State, j: _Judged, tol_s, feas_s) -> _Outer:
    """Converged, or time for a multiplier update? At the accepted point.

    Subproblems are solved only as well as the multiplier is known: to a gradient
    below a tenth of the constraint measure. A subproblem gets at most ``max_inner``
    steps: where the data are separable along an infeasible direction its infimum
    lies at infinity, and updating mu and rho anyway raises the penalty until that
    direction no longer pays.
    """
    p, d = j.point, s.dual
    _, ga, ha, shifted = lagrangian(p, j.mu, d.rho)
    gmax = jnp.max(jnp.abs(ga))
    # A full Newton step whose decrease was below rounding: nothing left to gain on
    # this subproblem (a short step limited by the radius says nothing), if the
    # gradient is near the tolerance too (far from it, a tiny step means a stiff
    # penalty term, as at the apex, where the cosine's curvature is 1 / COSINE_EPS^2).
    flat = (~j.first & ~j.pd_step & j.accept & j.tiny & s.trial.interior
            & (gmax <= 10.0 * tol_s))
    solved = (gmax <= tol_s) | flat
    measure = constraint_measure(p.z, p.c, j.mu, d.rho)
    loose = solved | (gmax <= 0.1 * measure)
    kkt = solved & (measure <= feas_s)
    update = (loose | (d.inner >= su.options.max_inner)) & ~kkt & ~j.pd_on
    stalled = measure > su.options.progress * d.measure
    mu = jax.lax.cond(update, lambda: _dual_newton(j, ha, shifted, loose, d.rho), lambda: j.mu)
    # rho grows only while the constraint is violated by more than 10 feas_tol: near
    # feas_tol a stalled measure is rounding noise, which a larger rho only amplifies.
    rho = jnp.where(update & stalled & (measure > 10.0 * jnp.maximum(feas_s, su.rho_floor)),
                    jnp.minimum(d.rho * su.options.rho_growth, su.rho_max), d.rho)
    return _Outer(mu, rho, update, kkt, loose, measure, gmax)


class _Proposal(NamedTuple):
    """The next step (:func:`_propose`)."""

    La: Array  # L_A at the accepted point for the (possibly updated) subproblem
    gsub: Array  # max |grad L_A| there
    step: Array
    pred: Array  # the step's predicted decrease of L_A (0 for a primal-dual step)
    pd_on: Array  # the step is a primal-dual one
    mu_pd: Array  # the multiplier that goes with it
    frac: Array
    enter: Array  # the primal-dual mode begins here


def _propose(su: Setup, s: State, j: _Judged, o: _Outer) -> _Proposal:
    """The next step on the (possibly updated) subproblem: a primal-dual Newton step
    (SQP) where the mode is on or begins, else a trust-region step.

    The mode begins at a multiplier update that ends a subproblem solved (loosely)
    with a positive multiplier: the dual Newton update has just given mu to the
    accuracy of x, and the alternation of subproblem steps and updates that would
    follow (each update only as accurate as the last subproblem) costs several
    passes that a primal-dual step replaces. The conds keep each pass to the one
    step it takes (on CPU, instance by instance, only the branch taken runs).
    """
    dtype = su.tau.dtype
    p, pd = j.point, s.pd
    La, ga, ha, _ = lagrangian(p, o.mu, o.rho)
    zero, one = jnp.zeros((), dtype), jnp.ones((), dtype)

    def primal_dual():
        def newton():
            dx, mu_new, valid = sqp_step(p.grad, p.hess, p.c, p.gc, p.hc, o.mu)
            return dx, mu_new, valid, one

        def halve():  # s.trial.z - s.point.z is the rejected fraction of the step
            mu = s.dual.mu
            return (0.5 * (s.trial.z - s.point.z), mu + 0.5 * (pd.mu - mu), jnp.asarray(True),
                    0.5 * pd.frac)

        return jax.lax.cond(j.backtrack, halve, newton)

    enter = o.update & o.loose & (o.mu > 0) & (pd.entries < _SQP_ENTRIES)
    dx, mu_pd, on, frac = jax.lax.cond(
        (j.pd_on | enter) & ~o.kkt, primal_dual,
        lambda: (jnp.zeros_like(p.z), zero, jnp.asarray(False), one))
    # One trust-region solve in the program (the larger piece to compile), run where
    # no primal-dual step is taken.
    step, pred = jax.lax.cond(on, lambda: (dx, zero),
                              lambda: trust_region_step(ga, ha, j.radius))
    return _Proposal(La, jnp.max(jnp.abs(ga)), step, pred, on, mu_pd, frac, enter)


def _terminal(su: Setup, s: State, j: _Judged, o: _Outer, pr: _Proposal, fine, tol_s, feas_s):
    """Whether the step just proposed ends the solve without another pass over the
    rows; with its end point, f there (the quadratic model's), c and mu.

    Once Newton's steps converge quadratically, a residual r reached from r'
    predicts the next, about r (r / r')^2: the KKT residual for primal-dual steps,
    the largest entry of L_A's gradient for trust-region steps that are full Newton
    steps on an unchanged subproblem. Where the last step cut r by 100 or more and
    the prediction is below ``_TERMINAL_FRACTION`` tol, the step ends the solve: its
    end point's stationarity follows from the steps already seen, its f is the
    quadratic model's (the error is third order in a step of about r / ||H||), and
    its constraint measure is evaluated exactly (it involves no data). All-rows
    level only; it saves the pass that would only confirm convergence.
    """
    tiny_ = jnp.finfo(su.tau.dtype).tiny
    p = j.point
    newton = jnp.where(pr.pd_on, j.pd_step & j.pd_ok,
                       ~j.first & ~j.pd_step & j.accept & s.trial.interior & (j.ratio >= 0.75)
                       & ~o.update & (jnp.linalg.norm(pr.step) < 0.99 * j.radius))
    r_now = jnp.where(j.pd_step, j.res_t, o.gmax)
    r_prev = jnp.maximum(jnp.where(j.pd_step, s.pd.residual, s.trial.gsub), tiny_)
    z_fin = p.z + pr.step
    mu_fin = jnp.where(pr.pd_on, pr.mu_pd, o.mu)
    c_fin = constraint(su, z_fin, s.chart)
    measure_fin = constraint_measure(z_fin, c_fin, mu_fin, o.rho)
    terminal = (fine & newton & ~o.kkt & (r_now <= 1e-2 * r_prev)
                & (r_now * (r_now / r_prev) ** 2 <= _TERMINAL_FRACTION * tol_s)
                & (measure_fin <= feas_s))
    f_fin = p.f + jnp.dot(p.grad, pr.step) + 0.5 * jnp.dot(pr.step, p.hess @ pr.step)
    return terminal, z_fin, f_fin, c_fin, mu_fin


def step(su: Setup, s: State) -> State:
    """One pass: evaluate the pending trial and accept or reject it; converged, or
    update the multiplier and penalty; propose the next step; at a subsample level's
    end, hand over to the next level (from its KKT point, multiplier and penalty,
    with primal-dual steps where the constraint is active), or, if the level did
    not get there, to all rows afresh."""
    levels = su.rows.levels
    fine = s.coarse.level == levels
    if not isinstance(levels, int) or levels > 0:
        tol_s = jnp.where(fine, su.tol, su.coarse_tol)
        feas_s = jnp.where(fine, su.feas_tol, su.coarse_feas)
    else:
        tol_s, feas_s = su.tol, su.feas_tol
    j = _judge_trial(su, s, derivatives(su, s.trial.z, s.coarse.level, s.chart))
    o = _outer_update(su, s, j, tol_s, feas_s)
    pr = _propose(su, s, j, o)
    terminal, z_fin, f_fin, c_fin, mu_fin = _terminal(su, s, j, o, pr, fine, tol_s, feas_s)
    switch = ~fine & (o.kkt | (s.it + 1 - s.coarse.since >= su.coarse_budget))
    restart = switch & ~o.kkt
    p, opts = j.point, su.options
    fin = lambda new, old: jnp.where(terminal, new, old)  # noqa: E731
    return State(
        # After a terminal step grad, gc and hc stay the accepted point's: nothing
        # reads them.
        point=Point(fin(z_fin, p.z), fin(f_fin, p.f), p.grad, p.hess, fin(c_fin, p.c),
                    p.gc, p.hc),
        trial=Trial(
            z=jnp.where(switch, jnp.where(o.kkt, p.z, s.coarse.start), p.z + pr.step),
            La=pr.La, pred=pr.pred,
            interior=~pr.pd_on & (jnp.linalg.norm(pr.step) < 0.99 * j.radius),
            fresh=switch, gsub=pr.gsub,
            radius=jnp.where(restart, opts.radius_init, j.radius)),
        dual=Dual(
            mu=jnp.where(restart, 0.0, fin(mu_fin, o.mu)),
            rho=jnp.where(restart, opts.rho_init, o.rho),
            measure=jnp.where(switch, jnp.inf, jnp.where(o.update, o.measure, s.dual.measure)),
            outer=s.dual.outer + o.update.astype(jnp.int32),
            inner=jnp.where(o.update | switch, 0, s.dual.inner + 1)),
        pd=PrimalDual(
            on=jnp.where(switch, o.kkt & ((o.mu > 0) | (p.c <= 0)), pr.pd_on), mu=pr.mu_pd,
            frac=pr.frac, residual=kkt_residual(p.grad, p.c, p.gc, o.mu),
            entries=s.pd.entries + pr.enter.astype(jnp.int32)),
        coarse=Coarse(
            level=jnp.where(switch, jnp.where(o.kkt, s.coarse.level + 1, levels), s.coarse.level),
            since=jnp.where(switch, s.it + 1, s.coarse.since), start=s.coarse.start),
        it=s.it + 1, done=(o.kkt & fine) | terminal, chart=s.chart)
