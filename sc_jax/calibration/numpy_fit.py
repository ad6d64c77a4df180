"""Supervised Calibration (SC) fitted from NumPy arrays, many problems per compiled program.

Fitting (paper Algorithm 2, Part 1). For each context size i the surrogate data of
Algorithm 1 are log-odds features ``[N, n-1]`` (``m_c = log p_c / p_0``), labels
``[N]`` and query ids ``[N]``; :func:`fit` solves Eq. final_opt_problem for one size
and :func:`fit_batch` for many (all sizes x seeds, and datasets with the same n), one
compiled program per row bucket::

    res = fit(features, labels, query_ids)                 # tau from Appendix A
    res = fit(features, labels, query_ids, tau=0.9, solver="projected")
    fits = fit_batch([(X1, y1, g1), (X2, y2, g2), ...])   # one program per row bucket
    proba = predict_proba(fits, [F1, F2, ...])            # F_i: [m_i, T, n-1]

Defaults and where they come from:

* ``tau=None`` sets tau = cos(alpha) from the base model's in-sample accuracy on the
  surrogate data (paper Appendix A,
  :func:`sc_jax.calibration.defaults.tau_from_accuracy`).
* ``lambda_inv = DEFAULT_LAMBDA_INV = 0.1``: the evidence for it is at
  :data:`sc_jax.calibration.defaults.DEFAULT_LAMBDA_INV` (means, not the paper's sums).
* ``solver="augmented_lagrangian"``: the paper's mean-cosine constraint. ``"projected"``
  keeps every class inside its own cone, a subset of the paper's feasible set, so it
  is more conservative. ``"scipy"`` is the float64 trust-constr reference.
* ``dtype="float32"``; ``"float64"`` runs under a local ``jax.enable_x64`` scope.

The results, :class:`~sc_jax.calibration.numpy_predict.FitResult`, and the two-level
ensemble over them (Algorithm 2, Part 2) are in :mod:`sc_jax.calibration.numpy_predict`;
the padding into buckets in :mod:`sc_jax.calibration.buckets`; the pure-JAX
counterpart, :func:`sc_jax.calibrate`, in :mod:`sc_jax.calibration.jax_calibrate`.

Departures from the reference code, all deliberate: means instead of sums in the
objective; the identity (b=0, w=1) as the start point instead of zeros (where the
cosine is undefined) or a random point; the hard trust-region constraint of the paper
instead of a soft hinge; exact gradients instead of finite differences; the cosine
smoothed at the apex (``sc_jax.calibration.objective.COSINE_EPS``).
"""

from __future__ import annotations

import dataclasses
from typing import Literal, Sequence, get_args

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike

from sc_jax.calibration import solvers
from sc_jax.calibration.buckets import checked_dtype, pack_batch, pack_buckets
from sc_jax.calibration.defaults import DEFAULT_LAMBDA_INV, base_accuracy, tau_from_accuracy
from sc_jax.calibration.numpy_predict import FitResult
from sc_jax.calibration.objective import Problem
from sc_jax.calibration.solvers import (
    METHODS,
    NONCONVEX_LAMBDA,
    NONCONVEX_STARTS,
    ScipyOptions,
    Solution,
    Solver,
    SolverOptions,
    Status,
    resolve_batch_size,
    resolve_threads,
)
from sc_jax.calibration.solvers.batching import DeviceName, fit_device
from sc_jax.calibration.validation import check_lambda, check_problem, check_tau

# What fit_batch does with a size whose surrogate data the LLM scores below chance:
# "none" fits SC as the paper does; "bias_only" fits SC* (w = 1) there instead, with
# the problem's trust region; "bias_only_free" fits SC* without it (tau = -1), the
# reference code's unconstrained bias-only form. Under the tau schedule the two agree
# (below chance means accuracy < 0.5, where the schedule gives tau = -1 already).
Guard = Literal["none", "bias_only", "bias_only_free"]
GUARDS: tuple[Guard, ...] = get_args(Guard)

#: The dtypes the solvers take, by name (or any dtype-like naming one of them).
FloatDType = Literal["float32", "float64"] | DTypeLike

__all__ = ["GUARDS", "FloatDType", "Guard", "below_chance", "fit", "fit_batch"]


def below_chance(accuracy: float, num_classes: int) -> bool:
    """The guard's test: the LLM's in-sample accuracy on the surrogate data of one
    size is below chance, 1 / n.

    Leave-one-out surrogate data are drawn against the held-out class: its
    demonstrations are under-represented in the other k - 1 (absent when k = n), so a
    model that copies the labels in its context scores below chance on them while it
    scores above chance at test time, where the sub-contexts come from all k
    (``sc_jax.experiment.reporting.diagnostics.diagnose`` measures both). Fitted there, SC
    learns to reverse the LLM (negative w)."""
    return accuracy < 1.0 / num_classes


# ---------------------------------------------------------------------------------
# Input checks (sc_jax.calibration.validation, shared with sc_jax.calibrate): all raised before
# any solve.


def _check_solver(solver):
    if solver not in METHODS:
        raise ValueError(f"unknown solver {solver!r}; choose one of {METHODS}")


def _per_problem(value, count: int, name: str) -> list:
    if value is None or np.ndim(value) == 0:
        return [value] * count
    value = list(value)
    if len(value) != count:
        raise ValueError(f"{name} has {len(value)} entries for {count} problems")
    return value


# ---------------------------------------------------------------------------------
# Fitting.


def _result(sol: Solution, k: int | None, *, tau, lam, solver, sc_star, num_rows,
            acc) -> FitResult:
    pick = (lambda a: np.asarray(a)) if k is None else (lambda a: np.asarray(a)[k])
    return FitResult(
        b=pick(sol.params.b).astype(np.float64),
        w=pick(sol.params.w).astype(np.float64),
        status=Status(int(pick(sol.status))),
        iterations=int(pick(sol.iterations)),
        outer_iterations=int(pick(sol.outer_iterations)),
        objective=float(pick(sol.objective)),
        constraint=float(pick(sol.constraint)),
        violation=float(pick(sol.violation)),
        tau=float(tau),
        lambda_inv=float(lam),
        solver=solver,
        sc_star=bool(sc_star),
        num_rows=int(num_rows),
        base_accuracy=float(acc),
    )


def _by_group(keys: list, fit_group) -> list:
    """One ``fit_group(key, indices)`` per distinct key (in sorted order), the results
    put back in problem order."""
    out = [None] * len(keys)
    for key in sorted(set(keys)):
        idx = [j for j, k in enumerate(keys) if k == key]
        for j, f in zip(idx, fit_group(key, idx)):
            out[j] = f
    return out


def _checked_settings(count: int, lambda_inv, tau, *, solver, guard, batch_size,
                      threads, device) -> tuple[list, list]:
    """Per-problem lambda_inv and tau, once every setting of :func:`fit_batch` has
    passed its check (all before any packing or solve)."""
    _check_solver(solver)
    if guard not in GUARDS:
        raise ValueError(f"guard must be one of {GUARDS}, got {guard!r}")
    if solver != "scipy":
        resolve_batch_size(batch_size)  # bad values fail before any packing
        resolve_threads(threads)
    fit_device(device)
    lams = _per_problem(lambda_inv, count, "lambda_inv")
    taus = _per_problem(tau, count, "tau")
    for lam in lams:
        check_lambda(lam)
    for t in taus:
        check_tau(t)
    return lams, taus


def _class_widths(problems: Sequence[tuple]) -> list:
    """Each problem's n-1, or None for a malformed one (pack_batch reports it)."""
    return [np.shape(p[0])[-1] if len(p) == 3 and np.ndim(p[0]) == 2 else None
            for p in problems]


def _below_chance_flags(problems: Sequence[tuple]) -> list[bool]:
    """The guard's test (:func:`below_chance`) per problem; bad input fails here,
    before any solve."""
    for j, prob in enumerate(problems):
        if len(prob) != 3:
            raise ValueError(f"problem {j} must be (features, labels, query_ids)")
        check_problem(*prob, where=str(j), batch_axes=False)
    return [below_chance(base_accuracy(np.asarray(p[0]), np.asarray(p[1])),
                         np.shape(p[0])[-1] + 1) for p in problems]


def _mark_guarded(fits: list[FitResult], guarded: bool) -> list[FitResult]:
    return [dataclasses.replace(f, guarded=True) for f in fits] if guarded else fits


def _pack(problems: Sequence[tuple], dtype, bucketed: bool):
    """(indices per bucket, one batched Problem per bucket, row counts): one bucket
    per padded row count, or one for all."""
    if bucketed:
        return pack_buckets(problems, dtype)
    one, sizes = pack_batch(problems, dtype)
    return [list(range(len(problems)))], [one], sizes


def _fit_scipy(packed: Problem, sizes: list[int], lams, taus, accs, *, sc_star,
               options) -> list[FitResult]:
    """The float64 reference: one trust-constr solve per problem of ``packed``, on its
    own rows only."""
    out = []
    for k in range(len(sizes)):
        rows = slice(0, sizes[k])
        prob = Problem(packed.features[k, rows], packed.labels[k, rows],
                       packed.query_ids[k, rows], packed.mask[k, rows], packed.num_queries)
        sol = solvers.scipy(prob, lams[k], taus[k], sc_star=sc_star,
                            options=options or ScipyOptions())
        out.append(_result(sol, None, tau=taus[k], lam=lams[k], solver="scipy",
                           sc_star=sc_star, num_rows=sizes[k], acc=accs[k]))
    return out


def _fit_packed(problems: Sequence[tuple], lams: list, taus: list, *, solver, sc_star,
                dtype, options, bucketed, batch_size, threads, device) -> list[FitResult]:
    """Problems of one class count and one start count: packed, tau filled in from
    the schedule, solved per row bucket (a loop for "scipy") on the device
    :func:`sc_jax.calibration.solvers.batching.fit_device` picks, unpacked."""
    dtype = checked_dtype(jnp.float64 if solver == "scipy" else dtype)
    with jax.enable_x64(dtype == jnp.float64):
        indices, packed, sizes = _pack(problems, dtype, bucketed and solver != "scipy")
        n = packed[0].num_classes
        accs = [base_accuracy(np.asarray(p[0]), np.asarray(p[1])) for p in problems]
        taus = [tau_from_accuracy(a, n) if t is None else float(t) for t, a in zip(taus, accs)]
        if solver == "scipy":
            return _fit_scipy(packed[0], sizes, lams, taus, accs, sc_star=sc_star,
                              options=options)
        starts = (options.num_starts if solver == "augmented_lagrangian" and options is not None
                  else 1)
        sols = solvers.solve_batch(
            packed, [np.asarray([lams[k] for k in idx], dtype) for idx in indices],
            [np.asarray([taus[k] for k in idx], dtype) for idx in indices],
            method=solver, sc_star=sc_star, options=options, batch_size=batch_size,
            threads=threads, device=fit_device(device, packed, starts))
        sols = jax.device_get(sols)
    out: list[FitResult | None] = [None] * len(problems)
    for idx, sol in zip(indices, sols):
        for j, k in enumerate(idx):
            out[k] = _result(sol, j, tau=taus[k], lam=lams[k], solver=solver, sc_star=sc_star,
                             num_rows=sizes[k], acc=accs[k])
    return out


def fit_batch(problems: Sequence[tuple], *, lambda_inv=DEFAULT_LAMBDA_INV, tau=None,
              solver: Solver = "augmented_lagrangian", sc_star: bool = False,
              dtype: FloatDType = "float32", options: SolverOptions | ScipyOptions | None = None,
              bucketed: bool = True, batch_size: int | None = None,
              threads: int | None = None, guard: Guard = "none",
              device: DeviceName | jax.Device = "auto") -> list[FitResult]:
    """Fit many SC problems of one class count, one compiled program per row bucket
    (:func:`sc_jax.calibration.solvers.batching.run_parts`), shaped by buckets only,
    so that later batches of other counts and sizes reuse the programs.

    problems: ``[(features [N_j, n-1], labels [N_j], query_ids [N_j]), ...]``, e.g.
        every context size x seed (x dataset with the same n).
    lambda_inv, tau: a scalar for all problems or one value per problem; ``tau=None``
        (or a None entry) applies the Appendix A schedule to that problem's base
        accuracy. Neither triggers a recompilation.
    solver: "augmented_lagrangian" | "projected" (batched) | "scipy" (a loop of
        trust-constr solves, float64).
    bucketed: group the problems by padded row count, one compiled program per group
        (:func:`.buckets.pack_buckets`). Under vmap each instance
        costs the group's padded N times the group's largest iteration count, so mixing a
        56-row and a 20,160-row problem makes the small one as dear as the large one
        and lets one hard instance hold up all the others: on the k = 8, n = 4
        benchmark batch (25 problems, float32, 2-core CPU) bucketing was 15x
        (augmented Lagrangian) and 94x (projected) faster. It compiles one solver
        per bucket, once per machine with the persistent compilation cache.
        ``False`` pads every problem to the largest N, one program. Both give the
        same solutions (a test compares them).
    batch_size: instances solved in lockstep by one vmap (see
        :func:`sc_jax.calibration.solvers.resolve_batch_size`). ``None``: 1 on CPU, where the
        lockstep only makes every instance wait for the slowest (one after another
        inside the compiled call is several times faster on the benchmark batches:
        ``benchmarks/RESULTS.md``), the whole bucket on GPU/TPU. Same solutions either
        way (a test compares them).
    threads: host threads that solve parts of the batch at once (see
        :func:`sc_jax.calibration.solvers.resolve_threads`). ``None``: on CPU one per core (XLA
        runs one call on one core; threads let several calls run at once), 1 on GPU/TPU.
        Same solutions either way (a test compares them).
    options: :class:`SolverOptions` (or :class:`ScipyOptions` for "scipy"). None:
        the defaults, except that the augmented Lagrangian solves problems with
        ``lambda_inv >= NONCONVEX_LAMBDA`` (0.5) from ``NONCONVEX_STARTS`` (96)
        starts, since the invariance term makes their objective non-convex (one
        start ended at a worse KKT point than SciPy's best start on 26 of 144
        instances of the synthetic sweep, all at lambda_inv >= 1, and on near-apex
        instances at lambda_inv = 0.5).
    guard: "none" (the paper), "bias_only" or "bias_only_free": problems whose
        surrogate in-sample accuracy is below chance (:func:`below_chance`) are fitted
        as SC* (bias only, w = 1) and marked ``guarded``; the others as asked. SC*
        keeps the problem's trust region (mean_c 1/||(b_c, 1)|| >= tau, which at
        tau = 0.997 bounds |b| near 0.08) under "bias_only", and drops it (tau = -1,
        the reference code's unconstrained bias-only fit) under "bias_only_free".
        With ``tau=None`` the two agree: the Appendix A schedule already gives a
        below-chance problem (accuracy < 1/n <= 0.5) tau = -1; they differ only where
        tau is fixed. A deviation from the paper (benchmarks/real_eval/README.md); ignored for
        ``sc_star=True``.
    device: where the batched solvers run (:func:`sc_jax.calibration.solvers.batching.fit_device`).
        "auto" (default): where JAX's default backend is the CPU, as without this
        option; on a GPU or TPU, each compiled call whose batch has fewer than
        ``batching.HOST_CELLS`` (1e6) padded rows x (n - 1) x starts is solved on the
        host CPU, the larger ones on the default device. A solve is a chain of small
        dependent loop steps, each a few kernel launches on an accelerator: an H200
        took 3-10x the time of a 2-core CPU for the augmented Lagrangian on
        25-problem benchmark batches.
        "cpu": the host CPU; "default": JAX's default device; or a ``jax.Device``.
        Batch size, threads and XLA options follow the device used. The solutions
        are the same wherever they are computed, up to the rounding of the device's
        arithmetic. Not used by "scipy", which evaluates on the host anyway.
    Returns one :class:`.numpy_predict.FitResult` per problem, in order. Solver
    failures are reported in ``status``, never raised; bad input raises ValueError
    before any solve.
    """
    count = len(problems)
    lams, taus = _checked_settings(count, lambda_inv, tau, solver=solver, guard=guard,
                                   batch_size=batch_size, threads=threads, device=device)
    common = dict(solver=solver, sc_star=sc_star, dtype=dtype, options=options,
                  bucketed=bucketed, batch_size=batch_size, threads=threads, guard=guard,
                  device=device)

    def part(idx, **changes):  # fit_batch on the problems idx, settings changed
        settings = dict(common, lambda_inv=[lams[j] for j in idx], tau=[taus[j] for j in idx])
        return fit_batch([problems[j] for j in idx], **{**settings, **changes})

    # Problems of different class counts: one group (and compiled solver) per n, so
    # that each gets its own n in the tau schedule and its own parameter count.
    widths = _class_widths(problems)
    if len(set(widths)) > 1 and None not in widths:
        return _by_group(widths, lambda _, idx: part(idx))
    if guard in ("bias_only", "bias_only_free") and not sc_star and count:
        flagged = _below_chance_flags(problems)
        if any(flagged):
            free = {"tau": -1.0} if guard == "bias_only_free" else {}
            return _by_group(flagged, lambda star, idx: _mark_guarded(
                part(idx, sc_star=star, guard="none", **(free if star else {})), star))
    if solver == "augmented_lagrangian" and options is None and count:
        # Where the invariance term weighs, the objective has several KKT points and
        # one start often ends at a worse one (SolverOptions.num_starts): those
        # problems get NONCONVEX_STARTS starts, in their own compiled call.
        many = [lam >= NONCONVEX_LAMBDA for lam in lams]
        if any(many) and not all(many):
            return _by_group(many, lambda _, idx: part(idx))
        if all(many):
            options = SolverOptions(num_starts=NONCONVEX_STARTS)
    return _fit_packed(problems, lams, taus, solver=solver, sc_star=sc_star, dtype=dtype,
                       options=options, bucketed=bucketed, batch_size=batch_size,
                       threads=threads, device=device)


def fit(features: np.ndarray, labels: np.ndarray, query_ids: np.ndarray, *,
        lambda_inv: float = DEFAULT_LAMBDA_INV, tau: float | None = None,
        solver: Solver = "augmented_lagrangian", sc_star: bool = False,
        dtype: FloatDType = "float32", options: SolverOptions | ScipyOptions | None = None,
        device: DeviceName | jax.Device = "auto") -> FitResult:
    """Fit SC for one context size (paper Eq. final_opt_problem).

    features: ``[N, n-1]`` log-odds m_c = log p_c / p_0 of the surrogate rows.
    labels: ``[N]`` ints in [0, n); every class must occur.
    query_ids: ``[N]`` which held-out demonstration each row queried (any integers).
    lambda_inv: weight of the mean invariance penalty (>= 0).
    tau: trust-region level in [-1, 1]; None: Appendix A schedule from the base
        model's in-sample accuracy; -1: no trust region.
    solver: "augmented_lagrangian" (default), "projected" or "scipy".
    sc_star: fit the bias only (w = 1), the paper's SC*.
    device: where the solver runs, as in :func:`fit_batch` ("auto": the host CPU on
        an accelerator for all but very large problems).
    """
    return fit_batch([(features, labels, query_ids)], lambda_inv=lambda_inv, tau=tau,
                     solver=solver, sc_star=sc_star, dtype=dtype, options=options,
                     device=device)[0]

