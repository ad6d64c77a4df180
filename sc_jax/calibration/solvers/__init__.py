"""Solvers for Eq. final_opt_problem: min f(theta) s.t. mean_c cos(theta_c, v) >= tau.

Three solvers, all on the objective of :mod:`sc_jax.calibration.objective`:

* :func:`augmented_lagrangian`: a PHR augmented Lagrangian for the single inequality
  constraint, its subproblems minimised by trust-region Newton steps with the exact
  Hessian, multi-start, with run-offs (unattained infima) certified and followed.
  Solves the paper's problem (the *mean* cosine constraint).
* :func:`projected`: ``jaxopt.ProjectedGradient`` (FISTA with backtracking) with the
  exact closed-form projection onto the per-class cones
  { (b_c, w_c) : w_c >= tau ||(b_c, w_c)|| }: a *more conservative* problem than the
  paper's (a subset of its feasible set); the two coincide when the constraint is
  inactive or n = 2.
* :func:`scipy`: ``scipy.optimize.minimize(method="trust-constr")`` in float64 with
  exact JAX derivatives: the parity reference, for either constraint form.

The JAX solvers are pure functions of pytrees, without Python control flow on values,
so :func:`solve_batch` runs them over batches in one compiled call. Each instance
returns a :class:`Status` code instead of raising (optimistix-style).

The pieces, one job each:

* :mod:`.types`: :class:`Status`, :class:`Solution`, :class:`SolverOptions`, the status
  ladder;
* :mod:`.parameters`: the vector of unknowns, the one place SC* (bias only) is handled;
* :mod:`.steps`: the trust-region Newton step and the primal-dual (SQP) step;
* :mod:`.geometry`: the constraint's margin and derivatives, restoring
  feasibility, the cone projection;
* :mod:`.charts`: the solver's coordinates (plain, one class in polar form, the
  classes near their apex in cosine form) and the chain rule into them;
* :mod:`.runoff`: the ray test for unattained infima (the one UNBOUNDED rule of all
  three solvers) and the follow-up along them;
* :mod:`.levels`: the rows f is evaluated on, subsamples first, then all rows;
* :mod:`.lagrangian_state`: the iteration's setup and state, f, c and L_A in the
  solver's coordinates;
* :mod:`.lagrangian`: the augmented-Lagrangian iteration as init / step / terminate;
* :mod:`.multistart`: starts, follow-up phases, the best end point, and
  :func:`augmented_lagrangian`;
* :mod:`.projected`: the projected solver;
* :mod:`.batching`: batches, buckets, host threads, compiler options;
* :mod:`.exported`: the batched programs kept as ``jax.export`` files for later
  processes;
* :mod:`.reference`: the SciPy reference.
"""

from sc_jax.calibration.solvers.batching import (
    COMPILER_OPTIONS,
    THREADS_ENV,
    batched,
    compiler_options,
    resolve_batch_size,
    resolve_threads,
    run_parts,
    solve_batch,
    solve_slots,
    split_parts,
    trace_counts,
)
from sc_jax.calibration.solvers.exported import set_export_dir
from sc_jax.calibration.solvers.geometry import project_cone
from sc_jax.calibration.solvers.levels import coarse_subsample
from sc_jax.calibration.solvers.multistart import (
    NONCONVEX_LAMBDA,
    NONCONVEX_STARTS,
    augmented_lagrangian,
    start_points,
)
from sc_jax.calibration.solvers.parameters import project_bias_sc_star
from sc_jax.calibration.solvers.projected import projected
from sc_jax.calibration.solvers.reference import ScipyOptions, scipy, scipy_best, scipy_starts
from sc_jax.calibration.solvers.steps import sqp_step, trust_region_step
from sc_jax.calibration.solvers.types import (
    METHODS,
    Solution,
    Solver,
    SolverOptions,
    Status,
    is_converged,
)

__all__ = [
    "COMPILER_OPTIONS", "METHODS", "NONCONVEX_LAMBDA", "NONCONVEX_STARTS", "THREADS_ENV",
    "ScipyOptions", "Solution", "Solver", "SolverOptions", "Status", "augmented_lagrangian",
    "batched", "coarse_subsample", "compiler_options", "is_converged", "project_bias_sc_star",
    "project_cone", "projected", "resolve_batch_size", "resolve_threads", "run_parts",
    "scipy", "scipy_best", "scipy_starts", "set_export_dir", "solve_batch", "solve_slots", "split_parts",
    "sqp_step", "start_points", "trace_counts", "trust_region_step",
]
