"""Supervised Calibration as one pure JAX function, :func:`calibrate`, for research code.

It is jit-able, vmap-able and differentiable, takes and returns arrays or pytrees of
arrays, and never calls back to the host::

    @jax.jit
    def loss(features, labels, query_ids, test_features):
        cal = sc_jax.calibrate(features, labels, query_ids, num_queries=8)
        logp = sc_jax.calibrated_log_probs(cal.b, cal.w, test_features)
        return -jnp.mean(logp[:, 0])

    jax.grad(loss)(...)     # through the solve, by implicit differentiation
    jax.jacfwd(loss)(...)   # forward mode too (a custom_jvp rule)

Its result, :class:`Calibration`, is turned into probabilities by
:mod:`sc_jax.calibration.jax_predict`. The NumPy batch layer
(:mod:`sc_jax.calibration.numpy_fit`: ``fit``, ``fit_batch``) shares its defaults
(:mod:`sc_jax.calibration.defaults`) and input checks
(:mod:`sc_jax.calibration.validation`).
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike

from sc_jax.calibration import solvers
from sc_jax.calibration.defaults import DEFAULT_LAMBDA_INV, base_accuracy, tau_schedule
from sc_jax.calibration.objective import (
    Problem,
    class_cosines,
    design_arrays,
    flat_from_params,
    params_from_flat,
    value,
)
from sc_jax.calibration.solvers import SolverOptions, Status, is_converged
from sc_jax.calibration.validation import (
    check_lambda,
    check_num_queries,
    check_precision,
    check_problem,
    check_setting_shape,
    check_tau,
    concrete,
    valid_problem,
)

Array = jax.Array

__all__ = ["Calibration", "calibrate", "warn_unless_converged"]


class Calibration(NamedTuple):
    """What :func:`calibrate` returns; leading batch axes as the inputs had.

    b, w: ``[..., n-1]`` the affine map (w is all ones for SC*).
    status: int32 :class:`sc_jax.Status` code (an ``IntEnum``: ``cal.status ==
        sc_jax.Status.CONVERGED`` compares, ``sc_jax.Status(int(cal.status))`` names it).
        Only CONVERGED parameters are a fit; their derivatives are meaningful only then.
    objective: mean NLL + lambda_inv * InvPenalty at (b, w).
    constraint: mean cosine (1/(n-1)) sum_c w_c / ||(b_c, w_c)||.
    violation: max(0, tau - constraint).
    multiplier: Lagrange multiplier of the mean-cosine constraint (0 if inactive).
    iterations: Newton steps taken.
    tau: the trust-region level used (after the schedule, if tau was None).
    """

    b: Array
    w: Array
    status: Array
    objective: Array
    constraint: Array
    violation: Array
    multiplier: Array
    iterations: Array
    tau: Array

    @property
    def converged(self) -> Array:
        """``[...]`` bool: status == CONVERGED (traceable)."""
        return jnp.asarray(self.status) == Status.CONVERGED


def warn_unless_converged(status, what: str, stacklevel: int = 3) -> None:
    """Warn (at the Python level, where ``status`` is concrete; nothing under a trace,
    where no value can be read) when a fit's status is not CONVERGED: its parameters
    are the last iterate of a solve that did not end at a minimum, or NaN."""
    host = concrete(status)
    if host is None:
        return
    codes = np.atleast_1d(np.asarray(host[0]))
    bad = sorted({int(c) for c in codes.ravel() if not is_converged(c)})
    if bad:
        names = ", ".join(Status(c).name if c in Status._value2member_map_ else str(c) for c in bad)
        warnings.warn(f"{what}: the fit's status is {names}, not CONVERGED: its parameters are not a "
                      "minimum of the calibration objective (and gradients through it are not "
                      "meaningful); check Calibration.status / FitResult.status first",
                      RuntimeWarning, stacklevel=stacklevel)


# ---------------------------------------------------------------------------------
# calibrate: one solve, batched over leading axes, differentiable by implicit
# differentiation of its KKT conditions.


def _kkt(z, features, labels1h, groups, lambda_inv, tau, sc_star):
    """KKT residual of Eq. final_opt_problem at z = [x, mu] (flat, ``[p + 1]``):
    stationarity of the Lagrangian f - mu (mean cos - tau), and c(x) = 0 where
    mu > 0 (active) or mu = 0 where it is not. Zero at the solver's solution; the
    implicit function theorem on it gives the solution's derivatives."""
    x, mu = z[:-1], z[-1]
    design = design_arrays(features, labels1h, groups)

    def f(x):
        return value(flat_from_params(params_from_flat(x, sc_star)), design, lambda_inv)

    def c(x):
        return jnp.mean(class_cosines(params_from_flat(x, sc_star))) - tau

    stationarity = jax.grad(f)(x) - mu * jax.grad(c)(x)
    return jnp.concatenate([stationarity, jnp.where(mu > 0, c(x), mu)[None]])


def _solve_single(features, labels1h, groups, lambda_inv, tau, *, sc_star, options):
    """The forward solve of one problem: ``(x, Solution)``. Under a caller's ``vmap``
    on a CPU the instances are solved one after another (:func:`_mapped_solve`)."""
    return _mapped_solve(sc_star, options)(features, labels1h, groups, lambda_inv, tau)


@functools.lru_cache(maxsize=None)
def _mapped_solve(sc_star: bool, options: SolverOptions):
    """:func:`_solve_one` with a batching rule of its own (``custom_vmap``). A caller's
    ``vmap`` would otherwise batch the solver's while loops into lockstep loops, whose
    ``lax.cond`` branches all run as selects: on a CPU, which solves the instances one
    after another either way, that is a larger program (its trace and compile took
    1.5 s more in a fresh process, n = 2) that runs each instance to the batch's
    slowest. The rule maps over the instances there (``lax.map``), as
    :func:`_calibrate_arrays` does for leading axes, and vmaps (lockstep) on an
    accelerator. The solve's inputs are ``stop_gradient``-ed (derivatives come from
    :func:`_kkt_point`), so the rule is never differentiated."""
    one = functools.partial(_solve_one, sc_star=sc_star, options=options)
    solve = jax.custom_batching.custom_vmap(one)

    @solve.def_vmap
    def _rule(axis_size, in_batched, *args):
        if _lockstep():
            axes = [0 if b else None for b in in_batched]
            out = jax.vmap(one, in_axes=axes)(*args)
        else:
            args = [a if b else jnp.broadcast_to(a, (axis_size,) + jnp.shape(a))
                    for a, b in zip(args, in_batched)]
            out = jax.lax.map(lambda a: solve(*a), tuple(args))
        return out, jax.tree.map(lambda _: True, out)

    return solve


def _solve_one(features, labels1h, groups, lambda_inv, tau, *, sc_star, options):
    problem = Problem(features, jnp.argmax(labels1h, axis=0).astype(jnp.int32),
                      jnp.argmax(groups, axis=1).astype(jnp.int32),
                      jnp.sum(groups, axis=1), groups.shape[1])
    # A CPU solves one instance at a time (alone, or mapped): the ray test's points one
    # by one there, with one copy of f's code in the program instead of two.
    sol = solvers.augmented_lagrangian(problem, lambda_inv, tau, sc_star=sc_star,
                                       options=options, one_site=not _lockstep())
    return flat_from_params(sol.params, sc_star), sol


def _solve_differentiably(features, labels1h, groups, lambda_inv, tau, *, sc_star, options):
    """``(z, Solution)`` with z = [x, mu] the solver's KKT point, differentiable in every
    argument by the implicit function theorem on :func:`_kkt` (:func:`_kkt_point`).
    The solver's loop is the forward solve only, run on ``stop_gradient``-ed inputs:
    never differentiated, never unrolled. The Solution's diagnostics carry no
    derivatives."""
    data = jax.lax.stop_gradient((features, labels1h, groups, lambda_inv, tau))
    x, sol = _solve_single(*data, sc_star=sc_star, options=options)
    # The solver reports the multiplier of the paper's constraint.
    z_star = jnp.concatenate([x, sol.multiplier[None]])
    return _kkt_point(sc_star, z_star, features, labels1h, groups, lambda_inv, tau), sol


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _kkt_point(sc_star, z, features, labels1h, groups, lambda_inv, tau):
    """z, a zero of :func:`_kkt` at the data, as a function of the data: its JVP rule
    is the implicit function theorem, dz = -J_z^-1 (d_data KKT)(d data), with J_z
    (``[p + 1, p + 1]``, p + 1 <= 11) materialised and LU-solved.
    ``jax.lax.custom_root`` computes the same derivatives, but traces the KKT residual
    and its tangent solve with every primal trace, derivatives asked for or not: 29%
    of the trace of ``jit(calibrate)`` at n = 6. A JVP rule is traced only where a
    derivative is taken. Reverse mode transposes the rule's tangent part, linear in
    the tangents (a JVP, then ``jnp.linalg.solve``, itself a ``custom_linear_solve``);
    higher orders differentiate the rule, whose z is this function again, so the
    tangent of z's own input is never used."""
    return z


@_kkt_point.defjvp
def _kkt_point_jvp(sc_star, primals, tangents):
    z_in, *data = primals
    z = _kkt_point(sc_star, z_in, *data)

    def kkt(z, *data):
        return _kkt(z, *data, sc_star)

    _, kkt_dot = jax.jvp(lambda *d: kkt(z, *d), tuple(data), tuple(tangents[1:]))
    return z, -jnp.linalg.solve(jax.jacfwd(kkt)(z, *data), kkt_dot)


def _check_solver_and_dtype(solver: str, dtype):
    """``dtype`` as a ``jnp.dtype`` (None stays None), once solver and dtype are usable here."""
    if solver != "augmented_lagrangian":
        raise ValueError(f"calibrate solves with 'augmented_lagrangian' only, got {solver!r}; "
                         "use sc_jax.calibration.numpy_fit.fit(..., solver=...) for the others")
    if dtype is not None:
        dtype = jnp.dtype(dtype)
        if str(dtype) in ("float16", "bfloat16"):
            raise ValueError(f'dtype="{dtype}": the solvers work in float32 or float64; pass '
                             'dtype="float32" (or None to follow the features)')
        if dtype == jnp.float64 and not jax.config.jax_enable_x64:
            raise ValueError('dtype="float64" needs 64-bit JAX: call '
                             'jax.config.update("jax_enable_x64", True) first (or use '
                             'sc_jax.calibration.numpy_fit.fit, which enables it for the solve)')
    return dtype


def _host_checks(features, labels, query_ids, mask, num_queries, lambda_inv, tau) -> int:
    """The :mod:`sc_jax.calibration.validation` rules on whatever is concrete (and on
    what is static: num_queries, the features' dtype), before anything is compiled;
    returns ``num_queries`` (inferred from concrete query ids if None)."""
    check_num_queries(num_queries)
    host = concrete(features, labels, query_ids, mask)
    if host is not None:
        check_problem(*host[:3], mask=host[3], num_queries=num_queries)
        if num_queries is None:
            num_queries = int(np.max(host[2])) + 1
    elif num_queries is None:
        raise ValueError("query_ids are traced: pass num_queries= (a static bound on the "
                         "query ids)")
    for name, setting, check in (("lambda_inv", lambda_inv, check_lambda), ("tau", tau, check_tau)):
        if setting is not None:
            check_setting_shape(name, setting, tuple(np.shape(features))[:-2])
        host_setting = concrete(setting)
        if host_setting is not None:
            check(host_setting[0])
    return num_queries


def _as_arrays(features, labels, query_ids, mask, dtype):
    """JAX arrays of the problem (floating features in ``dtype``, a mask of ones if
    None), their shapes checked: ``[..., N, n-1]`` and ``[..., N]`` x 3."""
    features = jnp.asarray(features, dtype)
    if not jnp.issubdtype(features.dtype, jnp.floating):
        features = features.astype(jnp.float32)
    dtype = features.dtype
    # Static, so checked under jit too (concrete half-precision features were refused
    # by the host checks already, with this message).
    check_precision(dtype)
    if features.ndim < 2:
        raise ValueError(f"features must be [..., N, n-1], got shape {features.shape}")
    labels = jnp.asarray(labels)
    query_ids = jnp.asarray(query_ids)
    batch, n_rows = features.shape[:-2], features.shape[-2]
    if labels.shape != batch + (n_rows,) or query_ids.shape != batch + (n_rows,):
        raise ValueError(f"labels and query_ids must have shape {batch + (n_rows,)}, got "
                         f"{labels.shape} and {query_ids.shape}")
    mask = jnp.ones(labels.shape, dtype) if mask is None else jnp.asarray(mask, dtype)
    if mask.shape != labels.shape:
        raise ValueError(f"mask must have shape {labels.shape}, got {mask.shape}")
    return features, labels, query_ids, mask


def _calibrate_one(features, labels1h, groups, lambda_inv, tau, valid, *, sc_star,
                   options) -> Calibration:
    """One unbatched problem: ``features [N, n-1]``, ``labels1h [n, N]``, ``groups
    [N, G]``, scalar settings; NaN numbers and INVALID_INPUT where ``valid`` is False."""
    dtype = features.dtype
    z, sol = _solve_differentiably(features, labels1h, groups, lambda_inv, tau,
                                   sc_star=sc_star, options=options)
    p = params_from_flat(z[:-1], sc_star)
    # Recomputed from the solution so that they carry derivatives too.
    objective = value(flat_from_params(p), design_arrays(features, labels1h, groups),
                      lambda_inv)
    constraint = jnp.mean(class_cosines(p))
    fit = Calibration(b=p.b, w=p.w, status=sol.status, objective=objective,
                      constraint=constraint, violation=sol.violation,
                      multiplier=sol.multiplier, iterations=sol.iterations, tau=tau)
    # Bad input seen only in the graph: a status, and no numbers to mistake for a fit.
    nan = jnp.asarray(jnp.nan, dtype)
    return fit._replace(
        b=jnp.where(valid, fit.b, nan), w=jnp.where(valid, fit.w, nan),
        objective=jnp.where(valid, fit.objective, nan),
        constraint=jnp.where(valid, fit.constraint, nan),
        status=jnp.where(valid, fit.status, jnp.int32(Status.INVALID_INPUT)))


def calibrate(features: Array, labels: Array, query_ids: Array, *,
              lambda_inv=DEFAULT_LAMBDA_INV, tau=None, mask: Array | None = None,
              num_queries: int | None = None,
              solver: Literal["augmented_lagrangian"] = "augmented_lagrangian",
              sc_star: bool = False, dtype: Literal["float32", "float64"] | DTypeLike | None = None,
              options: SolverOptions | None = None) -> Calibration:
    """Fit SC for one context size (paper Eq. final_opt_problem) as a pure JAX function.

    features: ``[..., N, n-1]`` log-odds m_c = log p_c / p_0 of the surrogate rows.
    labels: ``[..., N]`` ints in [0, n). query_ids: ``[..., N]`` ints in
        [0, num_queries): which held-out demonstration each row queried.
    mask: ``[..., N]`` 1 for real rows, 0 for padding (default all ones).
    num_queries: static bound on the query ids; inferred from concrete query_ids,
        required when they are traced.
    lambda_inv: invariance weight >= 0 (scalar or ``[...]``, may be traced).
    tau: trust-region level in [-1, 1] (scalar or ``[...]``, may be traced); None
        applies the Appendix A schedule to the base model's in-sample accuracy, in
        the graph.
    solver: "augmented_lagrangian" (the paper's mean constraint). The per-class
        "projected" and the SciPy solvers are in :func:`sc_jax.calibration.numpy_fit.fit`.
    sc_star: the bias-only calibrator SC* (w = 1).
    dtype: None follows ``features`` under JAX's own convention: float64 NumPy input
        is solved in float32 unless 64-bit JAX is on. "float64" requires
        ``jax_enable_x64`` (it raises instead of silently solving in float32).
    options: :class:`sc_jax.calibration.solvers.SolverOptions` (static). None picks the
        starts as ``numpy_fit.fit_batch`` does: one where lambda_inv is below
        ``solvers.NONCONVEX_LAMBDA`` (0.5), where the objective is convex, and
        ``solvers.NONCONVEX_STARTS`` (96) where a concrete lambda_inv reaches it: there
        the objective has several basins and one start often ends in a worse one.
        A traced lambda_inv (inside the caller's jit or grad) cannot be read, so it
        gets one start: pass ``SolverOptions(num_starts=solvers.NONCONVEX_STARTS)``
        where it may reach 0.5.

    Bad input (:mod:`sc_jax.calibration.validation`: no real rows, a non-finite feature, labels
    or query ids out of range, a class with no rows, tau outside [-1, 1],
    lambda_inv < 0, shapes that disagree) raises ``ValueError`` before anything is
    compiled when the arrays are concrete, as :func:`sc_jax.calibration.numpy_fit.fit` does.
    Under ``jit`` or ``vmap``, where values cannot be inspected, the same rules are
    evaluated in the graph: a problem that breaks one gets status ``INVALID_INPUT``
    (never ``CONVERGED``) and NaN b, w, objective and constraint.

    Leading axes are batch axes (the solve is vmapped over them); ``jax.jit`` and
    ``jax.vmap`` of this function work too. Derivatives of b, w (and of the objective)
    with respect to features, lambda_inv and tau, forward (``jax.jvp``, ``jacfwd``,
    ``hessian``) and reverse (``grad``, ``jacrev``), come from implicit
    differentiation of the KKT conditions (a ``custom_jvp`` rule), not from
    unrolling the solver's loop. They are those of the solution's active set, and
    meaningful for status CONVERGED only: an UNBOUNDED fit (separable data) gives NaN
    gradients. Called on concrete arrays, a status other than CONVERGED warns; inside
    ``jax.grad`` or ``jit`` no value can be read, so check first, outside the trace::

        cal = sc_jax.calibrate(features, labels, query_ids)
        assert bool(jnp.all(cal.status == sc_jax.Status.CONVERGED)), sc_jax.Status(int(cal.status))
        jax.grad(loss)(features, ...)

    or return ``cal.status`` as ``has_aux`` output of ``jax.value_and_grad`` and read it.
    """
    dtype = _check_solver_and_dtype(solver, dtype)
    # Host checks first, on whatever is concrete: nothing has been compiled yet.
    num_queries = _host_checks(features, labels, query_ids, mask, num_queries, lambda_inv, tau)
    features, labels, query_ids, mask = _as_arrays(features, labels, query_ids, mask, dtype)
    dtype = features.dtype
    lambda_inv = jnp.asarray(lambda_inv, dtype)
    tau = None if tau is None else jnp.asarray(tau, dtype)
    args = (features, labels, query_ids, mask, lambda_inv, tau)
    traced = any(isinstance(a, jax.core.Tracer) for a in args)
    out = _program(None if traced else jax.default_backend())(
        *args, num_queries=int(num_queries), sc_star=bool(sc_star),
        options=options or _default_options(lambda_inv))
    # Concrete (not under the caller's jit or grad): say so when a fit did not converge.
    # Under a trace no value can be read: the docstring says to check status first.
    if not traced:
        warn_unless_converged(out.status, "calibrate")
    return out


def _lockstep() -> bool:
    """Whether :func:`calibrate` vmaps its leading axes (an accelerator) or maps over
    them one instance after another (a CPU)."""
    return jax.default_backend() != "cpu"


def _default_options(lambda_inv) -> SolverOptions:
    """:func:`calibrate`'s solver options where the caller gives none: the multi-start
    of ``solvers.NONCONVEX_STARTS`` starts where a concrete lambda_inv reaches
    ``solvers.NONCONVEX_LAMBDA``, else one start (as ``numpy_fit.fit_batch`` picks)."""
    host = concrete(lambda_inv)
    if host is not None and np.any(host[0] >= solvers.NONCONVEX_LAMBDA):
        return SolverOptions(num_starts=solvers.NONCONVEX_STARTS)
    return SolverOptions()


@functools.lru_cache(maxsize=None)
def _program(backend: str | None):
    """:func:`calibrate`'s array part as one jitted program. Called on concrete arrays
    (``backend`` given), it carries the solver's compiler options for that backend
    (:func:`sc_jax.calibration.solvers.compiler_options`), compiles the solver once, and a
    second call of the same shapes reuses it (run op by op, every vmapped
    ``while_loop`` would compile on its own: the solver twice, anew in every call).
    Inside a caller's jit, vmap or grad (``backend`` None) it is a plain nested jit,
    which JAX inlines, and which may not carry compiler options."""
    options = {} if backend is None else {"compiler_options": solvers.compiler_options(backend)}
    return jax.jit(_calibrate_arrays, static_argnames=("num_queries", "sc_star", "options"),
                   **options)


def _calibrate_arrays(features, labels, query_ids, mask, lambda_inv, tau, *, num_queries: int,
                      sc_star: bool, options: SolverOptions) -> Calibration:
    """:func:`calibrate` on checked arrays (``tau`` None: the Appendix A schedule)."""
    dtype = features.dtype
    batch, n1 = features.shape[:-2], features.shape[-1]
    lambda_inv = jnp.broadcast_to(lambda_inv, batch)
    if tau is None:
        tau = tau_schedule(base_accuracy(features, labels, mask), n1 + 1).astype(dtype)
    tau = jnp.broadcast_to(tau, batch)
    valid = valid_problem(features, labels, query_ids, mask, num_queries, lambda_inv, tau)
    labels1h = jax.nn.one_hot(labels, n1 + 1, dtype=dtype, axis=-2) * mask[..., None, :]
    groups = jax.nn.one_hot(query_ids, num_queries, dtype=dtype) * mask[..., None]
    one = functools.partial(_calibrate_one, sc_star=sc_star, options=options)
    args = (features, labels1h, groups, lambda_inv, tau, valid)
    if not batch:
        return one(*args)
    if _lockstep():
        # An accelerator solves the batch in lockstep: the vmap is what fills it.
        fn = one
        for _ in batch:
            fn = jax.vmap(fn)
        return fn(*args)
    # A CPU solves the instances one after another either way; in lockstep each waits,
    # at every step, for the batch's slowest, and under vmap the solver's lax.conds
    # become selects that run both branches (sc_jax.calibration.solvers.resolve_batch_size).
    size = math.prod(batch)
    flat = jax.tree.map(lambda a: a.reshape((size,) + a.shape[len(batch):]), args)
    out = jax.lax.map(lambda a: one(*a), flat)
    return jax.tree.map(lambda a: a.reshape(batch + a.shape[1:]), out)
