"""Input checks for the calibrator, shared by :func:`sc_jax.calibration.numpy_fit.fit` (NumPy)
and :func:`sc_jax.calibrate` (JAX).

Two forms of the same rules:

* :func:`check_problem`, :func:`check_tau`, :func:`check_lambda` run on the host on
  concrete arrays and raise ``ValueError`` naming the problem, before anything is
  compiled or solved.
* :func:`valid_problem` is the same test as a boolean array inside a traced program,
  where no value can be inspected: :func:`sc_jax.calibrate` turns a ``False`` into
  status ``INVALID_INPUT``.
* :func:`check_params` and :func:`check_features` check fitted parameters and the
  features they are applied to, for both layers' predictions: shapes always, values
  where :func:`concrete` can read them.
* :func:`check_precision` and :func:`check_num_queries` read only what is static
  (a dtype, a Python int), so they raise under ``jit`` too.

A problem (paper Eq. final_opt_problem) is ``features [..., N, n-1]`` (log-odds
against class 0), ``labels [..., N]`` in [0, n), ``query_ids [..., N]`` in
[0, num_queries), and an optional ``mask [..., N]`` (1 for real rows, 0 for padding).
The rules: at least one real row; every feature finite (padding included, since a
NaN times a zero mask is still NaN); labels and query ids integers in range on the
real rows; every class the label of at least one real row (SC cannot calibrate a
class it never sees); ``tau`` a cosine in [-1, 1]; ``lambda_inv`` finite and >= 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from sc_jax.runtime.ranges import LAMBDA_MAX  # defined with the other options' ranges

__all__ = ["check_features", "check_lambda", "check_num_queries", "check_params",
           "check_precision", "check_problem", "check_setting_shape", "check_tau", "concrete",
           "valid_problem"]


def _at(where: str, index: tuple = ()) -> str:
    parts = [f"problem {where}"] if where else []
    if index:
        parts.append(f"batch index {index}")
    return f" ({', '.join(parts)})" if parts else ""


def _first(bad: np.ndarray) -> tuple:
    """Leading-axes index of the first True in ``bad [...]`` (() for a scalar)."""
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), bad.shape)) if bad.ndim else ()


def _check_shapes(features, labels, query_ids, at: str, batch_axes: bool) -> None:
    """features ``[..., N, n-1]`` of real numbers with n >= 2, labels and query ids ``[..., N]``."""
    if features.ndim < 2 or features.ndim > 2 and not batch_axes or features.shape[-1] < 1:
        raise ValueError(
            f"features{at} must be [N, n-1] log-odds against class 0 with n >= 2 classes"
            f"{' (leading batch axes allowed)' if batch_axes else ''}, got shape "
            f"{features.shape}")
    check_precision(features.dtype, at)
    if not np.issubdtype(features.dtype, np.number) or np.iscomplexobj(features):
        raise ValueError(f"features{at} must be real numbers, got dtype {features.dtype}")
    rows = features.shape[:-1]
    if labels.shape != rows or query_ids.shape != rows:
        raise ValueError(
            f"labels{at} and query_ids must have shape [..., N] = {list(rows)}, got "
            f"{list(labels.shape)} and {list(query_ids.shape)}")


def check_precision(dtype, at: str = "") -> None:
    """Refuse half-precision features (float16, bfloat16) by their dtype, which is
    static: the same check on concrete arrays and under ``jit``. Half precision passed
    as numbers and then failed in LAPACK (float16) or in the solver's loop (bfloat16
    under jit), or was read as "not real numbers" (bfloat16): the solvers work in
    float32 or float64."""
    if str(dtype) in ("float16", "bfloat16"):
        raise ValueError(f"features{at} are {dtype}: cast them to float32 first "
                         "(np.asarray(features, np.float32)); the solvers work in float32 or float64")


def check_num_queries(num_queries) -> None:
    """``num_queries`` (a static bound on the query ids): None or a positive int."""
    if num_queries is not None and (isinstance(num_queries, bool) or not isinstance(
            num_queries, (int, np.integer)) or num_queries < 1):
        raise ValueError(f"num_queries must be a positive int (a static bound on the query "
                         f"ids, or None to infer it from concrete ones), got {num_queries!r}")


def _real_rows(mask, rows: tuple, at: str) -> np.ndarray:
    """``[..., N]`` bool, True for a real row: all rows without a mask, else mask == 1
    (a mask must hold only 0 and 1)."""
    if mask is None:
        return np.ones(rows, bool)
    mask = np.asarray(mask)
    if mask.shape != rows:
        raise ValueError(f"mask{at} must have shape {list(rows)}, got {list(mask.shape)}")
    if not np.all((mask == 0) | (mask == 1)):
        raise ValueError(f"mask{at} must hold 0 (padding) or 1 (a real row)")
    return mask == 1


def _check_ids(name: str, ids: np.ndarray, top: int | None, real: np.ndarray, n1: int,
               where: str) -> None:
    """``ids`` (labels or query ids) integers in [0, top) on the real rows (>= 0 if
    ``top`` is None)."""
    at = _at(where)
    bound = f"in [0, {top})" if top is not None else ">= 0"
    if not (np.issubdtype(ids.dtype, np.integer) or
            np.issubdtype(ids.dtype, np.floating) and np.all(np.mod(ids[real], 1) == 0)):
        raise ValueError(f"{name}{at} must be integers {bound}, got dtype {ids.dtype}")
    out = real & ((ids < 0) | (ids >= top if top is not None else False))
    if np.any(out):
        idx = _first(np.any(out, axis=-1))
        vals = ids[real]
        what = (f" for features with {n1} log-odds columns (n = {n1 + 1} classes)"
                if name == "labels" else " (num_queries)" if top is not None else "")
        raise ValueError(f"{name}{_at(where, idx)} must be {bound}{what}; got min "
                         f"{vals.min()}, max {vals.max()}")


def check_problem(features, labels, query_ids, *, mask=None, num_queries: int | None = None,
                  where: str = "", batch_axes: bool = True
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Raise ``ValueError`` unless (features, labels, query_ids, mask) is a valid
    problem (the rules in the module docstring); leading axes are batch axes (unless
    ``batch_axes`` is False), and an error names the first bad batch index.

    ``num_queries``: the bound on the query ids; None checks only that they are
    non-negative integers (:func:`sc_jax.calibration.numpy_fit.fit` renumbers them).
    Returns the NumPy arrays ``(features, labels int32, query_ids, mask bool)``.
    """
    at = _at(where)
    features = np.asarray(features)
    labels = np.asarray(labels)
    query_ids = np.asarray(query_ids)
    _check_shapes(features, labels, query_ids, at, batch_axes)
    rows, n1 = features.shape[:-1], features.shape[-1]
    real = _real_rows(mask, rows, at)
    empty = ~np.any(real, axis=-1)
    if rows[-1] == 0 or np.any(empty):
        raise ValueError(f"features{_at(where, _first(empty))} have N = 0 real rows: there is "
                         "no surrogate data to fit; generate it with Algorithm 1 for a size i < k")
    finite = np.isfinite(features)
    if not np.all(finite):
        bad = int(np.sum(~finite))
        raise ValueError(
            f"features{_at(where, _first(~np.all(finite, axis=(-2, -1))))} contain {bad} NaN "
            "or infinite values; log-odds must be finite (clip the probabilities, e.g. "
            "log((p_c + 1e-9) / (p_0 + 1e-9)))")
    _check_ids("labels", labels, n1 + 1, real, n1, where)
    _check_ids("query_ids", query_ids, num_queries, real, n1, where)
    labels = labels.astype(np.int32)
    present = np.stack([np.any(real & (labels == c), axis=-1) for c in range(n1 + 1)], -1)
    if not np.all(present):
        idx = _first(~np.all(present, axis=-1))
        absent = np.flatnonzero(~present[idx]).tolist()
        raise ValueError(
            f"class(es) {absent} have no rows in the surrogate data{_at(where, idx)}: SC "
            "cannot calibrate a class it never sees as a label. Use more demonstrations "
            "(k >= n, class-balanced), or a larger context-size gap k - i")
    return features, labels, query_ids, real


def check_tau(tau) -> None:
    """``tau`` (None, a scalar or an array): a cosine in [-1, 1]; -1 turns the trust
    region off."""
    if tau is None:
        return
    t = np.asarray(tau, float)
    if not np.all(np.isfinite(t) & (t >= -1.0) & (t <= 1.0)):
        raise ValueError(f"tau must be a cosine in [-1, 1] (-1 disables the trust region), "
                         f"got {tau}")


def check_setting_shape(name: str, value, batch: tuple) -> None:
    """A setting (``lambda_inv``, ``tau``) of a batch of problems with leading axes
    ``batch``: one number, or one per problem (shape ``batch``); its shape is static,
    so this holds for traced values too."""
    shape = tuple(np.shape(value))
    if shape not in ((), tuple(batch)):
        each = f" or one per problem (shape {list(batch)})" if batch else ""
        raise ValueError(f"{name} must be one number{each}, got shape {list(shape)}")


def check_lambda(lambda_inv) -> None:
    """``lambda_inv`` (a scalar or an array): finite, >= 0 and at most :data:`LAMBDA_MAX`."""
    lam = np.asarray(lambda_inv, float)
    if not np.all(np.isfinite(lam) & (lam >= 0) & (lam <= LAMBDA_MAX)):
        raise ValueError(f"lambda_inv must be finite, >= 0 and at most {LAMBDA_MAX:g}, got {lambda_inv}")


def valid_problem(features, labels, query_ids, mask, num_queries: int, lambda_inv, tau):
    """:func:`check_problem`, :func:`check_tau` and :func:`check_lambda` as one traced
    boolean per problem: ``[..., N, n-1]``, ``[..., N]`` x 3, scalars or ``[...]`` ->
    ``[...]``. Shapes and dtypes are static and checked on the host."""
    n = features.shape[-1] + 1
    real = mask == 1
    ok = jnp.all(jnp.isfinite(features), axis=(-2, -1))
    ok &= jnp.all((mask == 0) | real, axis=-1) & jnp.any(real, axis=-1)
    ok &= jnp.all(~real | ((labels >= 0) & (labels < n)), axis=-1)
    ok &= jnp.all(~real | ((query_ids >= 0) & (query_ids < num_queries)), axis=-1)
    for c in range(n):
        ok &= jnp.any(real & (labels == c), axis=-1)
    ok &= jnp.isfinite(lambda_inv) & (lambda_inv >= 0) & (lambda_inv <= LAMBDA_MAX)
    return ok & jnp.isfinite(tau) & (tau >= -1) & (tau <= 1)


# ---------------------------------------------------------------------------------
# Fitted parameters and the features they are applied to (both layers' predictions).


def concrete(*arrays):
    """NumPy copies of ``arrays`` (None stays None), or None if any is traced."""
    try:
        return [None if a is None else np.asarray(a) for a in arrays]
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return None


def check_params(b, w, n1: int | None, where: str = "") -> None:
    """b and w ``[..., n-1]`` of one shape, ``n-1`` matching the features' last axis
    (shapes: checked even when traced), and finite where concrete."""
    b_shape, w_shape = np.shape(b), np.shape(w)
    if len(b_shape) < 1 or b_shape != w_shape:
        raise ValueError(f"b{where} and w{where} must be [..., n-1] arrays of one shape, got "
                         f"{b_shape} and {w_shape}")
    if n1 is not None and b_shape[-1] != n1:
        # Broadcasting [1] over [..., n-1] gave an n-class answer from 2-class parameters.
        raise ValueError(f"b{where} and w{where} are for {b_shape[-1] + 1} classes ([..., "
                         f"{b_shape[-1]}]) but features have {n1} log-odds per row ({n1 + 1} "
                         "classes): pass parameters fitted on features of this width")
    for name, arr in (("b", b), ("w", w)):
        host = concrete(arr)
        if host is not None and not (np.issubdtype(host[0].dtype, np.floating)
                                     or np.issubdtype(host[0].dtype, np.integer)):
            raise ValueError(f"{name}{where} must be real numbers, got dtype {host[0].dtype}")
        if host is not None and not np.all(np.isfinite(host[0])):
            raise ValueError(f"{name}{where} holds NaN or infinite values: it is not a fit (check "
                             "the fit's status: sc_jax.Status)")


def check_features(features, where: str = "") -> None:
    """features ``[..., n-1]`` with n >= 2 (shape checked even when traced), real and
    finite where concrete."""
    if np.ndim(features) < 1 or np.shape(features)[-1] < 1:
        raise ValueError(f"features{where} must be [..., n-1] log-odds with n >= 2, got shape "
                         f"{np.shape(features)}")
    host = concrete(features)
    if host is not None:
        arr = np.asarray(host[0])
        if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
            raise ValueError(f"features{where} must be real numbers, got dtype {arr.dtype}")
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"features{where} hold NaN or infinite values")
