"""Result and option types shared by every solver, and the one status ladder."""

from __future__ import annotations

import dataclasses
import enum
from typing import Literal, NamedTuple, get_args

import jax
import jax.numpy as jnp
import numpy as np

from sc_jax.calibration.objective import Params, trust_region

Array = jax.Array

Solver = Literal["augmented_lagrangian", "projected", "scipy"]
METHODS: tuple[Solver, ...] = get_args(Solver)


class Status(enum.IntEnum):
    """Per-instance result code (optimistix-style: a vmapped batch reports which
    instances failed instead of raising), exported as ``sc_jax.Status``.

    An ``IntEnum``: ``Calibration.status`` (an int32 array) and ``FitResult.status``
    compare to it (``cal.status == sc_jax.Status.CONVERGED``), and
    ``sc_jax.Status(int(code))`` names a code. Only CONVERGED parameters are a fit;
    ``calibrate`` and ``predict_proba`` warn about the others where the status can be
    read, and derivatives through ``calibrate`` are meaningful for CONVERGED only
    (UNBOUNDED gives NaN ones): check the status before ``jax.grad``."""

    CONVERGED = 0
    MAX_ITERATIONS = 1  # stationarity tolerance not met within the iteration budget
    INFEASIBLE = 2  # trust-region constraint violated by more than feas_tol at the end
    NONFINITE = 3  # NaN or inf in the parameters or the objective
    # The infimum is not attained: the data are separable along a feasible
    # direction, f -> 0 as ||theta|| grows; params are the last (feasible) iterate.
    UNBOUNDED = 4
    # Input that breaks the problem's rules (sc_jax.calibration.validation), seen inside a traced
    # program where it cannot raise (sc_jax.calibrate under jit); no fit is returned.
    INVALID_INPUT = 5


def is_converged(status) -> bool:
    """Whether a fit's status makes its parameters a fit: CONVERGED, and nothing else.

    status: a :class:`Status`, its int code, or its name as results.json records it.
    Every other status (MAX_ITERATIONS, INFEASIBLE, NONFINITE, UNBOUNDED,
    INVALID_INPUT, a name this version does not know, or no code at all) is not a
    fit, and the tables, notes and plots treat them all alike (this is the one test
    they use)."""
    if isinstance(status, str):
        return status == Status.CONVERGED.name
    try:
        return int(status) == Status.CONVERGED
    except (TypeError, ValueError):  # null or another JSON value in a results.json
        return False


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
        1e-9 for float64 and 1e-5 for float32. The objective is a mean of O(1)
        terms, so these sit a little above each dtype's noise floor; near that floor
        a full Newton step whose predicted decrease is below the rounding of the
        value also counts as converged, if the gradient is below 10 tol.
    feas_tol: allowed constraint violation, in units of the cosine. ``None``: 1e-9
        (float64); in float32 1e-7 for the augmented Lagrangian, whose margin is
        summed from 1 - cos terms near tau = 1 (:func:`geometry.cosine_margin`), and
        1e-6 for the projected solver, whose cone projection rounds at eps. The
        tolerance also bounds the slack an active constraint may keep at the end,
        which costs the multiplier times that slack in f (with 1e-6, float32 could
        stop 3e-4 above float64's optimum; with 1e-7, 1e-5).
    max_iter: evaluations of f, its gradient and Hessian in all (one pass over the
        rows each, and one trust-region Newton step), outer updates included. Under
        vmap the batch runs to its slowest instance's count, and never beyond this.
        A follow-up phase (``follow_runoffs``, ``follow_apex``) has a budget of its
        own, so a solve that is followed up makes at most twice this many.
    max_inner: steps on one subproblem before the multiplier and penalty are
        updated anyway (a subproblem whose infimum lies at infinity, along a
        separable but infeasible direction, is never solved).
    num_starts: augmented-Lagrangian starts (:func:`multistart.start_points`),
        vmapped on an accelerator and one after another on a CPU (``lax.map``),
        each with its own run-off follow-up; the lowest feasible objective
        is kept, converged or not, so a start that runs off to an unattained
        infimum wins and is reported UNBOUNDED. The problem is not convex once the
        invariance term weighs (lambda_inv >= NONCONVEX_LAMBDA = 0.5), and there one
        start often ends at a worse KKT point: :func:`sc_jax.calibration.numpy_fit.fit_batch`
        uses ``NONCONVEX_STARTS`` there unless given options.
    rho_init, rho_growth, rho_max: PHR penalty parameter schedule. rho grows when the
        constraint measure did not shrink by ``progress`` in one outer step, up to
        rho_max (``None``: 1e8 in float64, 1e4 in float32, since the penalty's
        rounding noise grows with rho).
    radius_init, radius_max: trust-region radius in parameter units.
    max_pg_iter, pg_restart: projected-gradient iterations in all, and between
        momentum restarts.
    coarse_rows, coarse_tol, max_coarse_iter: subsample sizes (an int or a tuple;
        default 2,048). A problem of N rows is first solved on a fixed random
        subsample of each size m with N > 2 m, smallest first, each level from the
        last one's end, to a stationarity and feasibility of ``coarse_tol`` (the
        sampling error is about 1/sqrt(m), so a tighter solve there buys nothing),
        in at most ``max_coarse_iter`` evaluations per level; the solve then ends on
        all rows. The cheap levels absorb the slow start from the identity; the
        later ones begin near their solution, where a few joint primal-dual Newton
        steps finish them. Every level costs about 1 s of compile time per bucket
        (one more copy of the evaluation), so more than one size is an option for
        very large N, not the default. If a subsample level fails, the solve
        continues on all rows afresh. At most ``max_iter - 1`` evaluations go to
        the subsamples. 0 (or an empty tuple) disables.
    follow_runoffs: after a solve whose end point the ray test finds on a run-off
        (f falls when theta, or one class's part of it, is scaled up), solve again
        from the followed point with that class in polar coordinates (see
        :mod:`sc_jax.calibration.solvers.multistart`). Off: the first phase's end point is
        reported. (SC* has no follow-up: its w is pinned.)
    follow_apex: after a first phase that stopped without converging with some
        classes within ``charts.APEX_RADIUS`` (100) COSINE_EPS of theta_c = 0 and no
        run-off, solve again from its end point with those classes in cosine form,
        (b_c, cos_c) (see :mod:`sc_jax.calibration.solvers.charts`), with a budget of
        ``max_iter`` passes of its own; its end point is kept if it is feasible and
        no higher. Off: the first phase's end point is reported. (Not for SC*.)
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
    follow_apex: bool = True

    def _coarse_sizes(self) -> tuple:
        return self.coarse_rows if isinstance(self.coarse_rows, tuple) else (self.coarse_rows,)

    def __post_init__(self):
        # Bad subsample sizes fail here, not as a shape error deep inside a trace.
        sizes = self._coarse_sizes()
        if any(isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 0
               for m in sizes):
            raise ValueError("coarse_rows must be a non-negative int or a tuple of them "
                             f"(0 disables), got {self.coarse_rows!r}")

    def coarse_levels(self, num_rows: int) -> list[int]:
        """The subsample sizes a problem of ``num_rows`` rows is solved on before all
        rows, ascending: each ``coarse_rows`` entry m with num_rows > 2 m."""
        sizes = self._coarse_sizes()
        if self.max_iter <= 1:
            return []
        return sorted({int(m) for m in sizes if 0 < m and num_rows > 2 * m})

    def tolerances(self, dtype, projected: bool = False) -> tuple[float, float]:
        """(stationarity tol, feasibility tol) for ``dtype`` (see the fields)."""
        f64 = jnp.dtype(dtype) == jnp.float64
        tol = self.tol if self.tol is not None else (1e-9 if f64 else 1e-5)
        feas = self.feas_tol if self.feas_tol is not None else (
            1e-9 if f64 else (1e-6 if projected else 1e-7))
        return tol, feas


def status_code(*, finite, violation, feas_tol, unbounded, converged):
    """The one status ladder, first match wins: NONFINITE, INFEASIBLE (violation above
    ``feas_tol``), UNBOUNDED, CONVERGED, MAX_ITERATIONS. Elementwise on JAX or NumPy
    booleans and floats (the SciPy reference uses it on host values); int32."""
    code = jnp.where(
        ~jnp.asarray(finite), Status.NONFINITE,
        jnp.where(jnp.asarray(violation) > feas_tol, Status.INFEASIBLE,
                  jnp.where(unbounded, Status.UNBOUNDED,
                            jnp.where(converged, Status.CONVERGED, Status.MAX_ITERATIONS))))
    return code.astype(jnp.int32)


def finish(params: Params, objective_value: Array, *, converged, violation, feas_tol,
           iterations, outer_iterations, unbounded=False, multiplier=None) -> Solution:
    """A :class:`Solution` from a solve's end point and its objective value
    f(params); the status from :func:`status_code`."""
    obj = objective_value
    finite = jnp.isfinite(obj) & jnp.all(jnp.isfinite(params.b)) & jnp.all(
        jnp.isfinite(params.w))
    dtype = obj.dtype
    return Solution(
        params=params,
        status=status_code(finite=finite, violation=violation, feas_tol=feas_tol,
                           unbounded=unbounded, converged=converged),
        iterations=jnp.asarray(iterations, jnp.int32),
        outer_iterations=jnp.asarray(outer_iterations, jnp.int32),
        objective=obj,
        constraint=trust_region(params),
        violation=violation,
        multiplier=jnp.zeros((), dtype) if multiplier is None else jnp.asarray(multiplier, dtype),
    )
