"""Calibrated probabilities from fitted parameters, as pure JAX functions: one map
(:func:`calibrated_log_probs`, paper Eq. affine_logit_model_formal) and the two-level
ensemble over context sizes (:func:`ensemble_proba`, Algorithm 2, Part 2).

jit-, vmap- and grad-composable, like :func:`sc_jax.calibration.jax_calibrate.calibrate`
whose :class:`~sc_jax.calibration.jax_calibrate.Calibration` they take; the NumPy
layer's :mod:`sc_jax.calibration.numpy_predict` computes the same in NumPy float64.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from sc_jax.calibration.jax_calibrate import Calibration, warn_unless_converged
from sc_jax.calibration.objective import Params, affine_log_probs
from sc_jax.calibration.validation import check_features, check_params, concrete

Array = jax.Array

__all__ = ["calibrated_log_probs", "ensemble_proba"]


def calibrated_log_probs(b: Array | Calibration, w: Array | None = None,
                         features: Array | None = None) -> Array:
    """log f(m; theta) of Eq. affine_logit_model_formal: ``[..., n-1]`` log-odds ->
    ``[..., n]`` log-probabilities (b, w ``[..., n-1]`` broadcast against features'
    leading axes; their last axis must equal the features').

    Also ``calibrated_log_probs(cal, features)`` with a :class:`Calibration`: then a
    concrete status other than CONVERGED warns (RuntimeWarning). Bad input raises
    ValueError naming the argument: parameters of another class count, NaN or
    infinite parameters or features (where concrete)."""
    if isinstance(b, Calibration):
        cal, features = b, w
        warn_unless_converged(cal.status, "calibrated_log_probs")
        b, w = cal.b, cal.w
    if w is None or features is None:
        raise ValueError("calibrated_log_probs takes (b, w, features) or (calibration, features)")
    check_features(features)
    check_params(b, w, np.shape(features)[-1])
    return affine_log_probs(Params(b, w), features)


def ensemble_proba(b: Array, w: Array, features: Sequence[Array],
                   weights: Array | None = None) -> Array:
    """The two-level ensemble of Algorithm 2, Part 2.

    b, w: ``[S, n-1]``, one fitted map per context size.
    features: a sequence of S arrays ``[m_i, T, n-1]``: the T test queries' log-odds
        under each of the m_i sampled sub-contexts of size i (m_i may differ).
    weights: ``[S]`` size weights a_i (normalised here); None is uniform, the paper.
    Returns ``[T, n]``: sum_i a_i (1/m_i) sum_j f(m(x; C_i^(j)); theta_i).

    Raises ValueError naming the argument for: b, w not ``[S, n-1]``; a size with no
    sub-contexts (m_i = 0: a mean over nothing) or other T or n-1; weights not ``[S]``,
    negative, all zero or not finite (where concrete); NaN parameters or features.
    """
    if isinstance(features, (jax.Array, np.ndarray)):
        features = list(features)
    S = len(features)
    if S == 0:
        raise ValueError("features must hold one [m_i, T, n-1] array per fitted size, got none")
    if np.ndim(b) != 2 or np.shape(b)[0] != S:
        raise ValueError(f"b and w must be [S, n-1] with S = {S} (one row per feature array), got "
                         f"{np.shape(b)}")
    n1 = np.shape(b)[-1]
    check_params(b, w, n1)
    T = None
    for i, f in enumerate(features):
        shape = np.shape(f)
        if len(shape) != 3 or shape[-1] != n1 or shape[0] < 1 or T is not None and shape[1] != T:
            raise ValueError(f"features[{i}] must be [m_i, T, {n1}] with m_i >= 1 and the same T "
                             f"for every size, got {shape}")
        T = shape[1]
        check_features(f, f"[{i}]")
    if weights is not None:
        if np.shape(weights) != (S,):
            raise ValueError(f"weights must be [S] = [{S}], got shape {np.shape(weights)}")
        host = concrete(weights)
        if host is not None:
            wts = np.asarray(host[0], np.float64)
            # [0, 0] divided by zero (NaN); [1, -2] gave "probabilities" above 1 and below 0.
            if not np.all(np.isfinite(wts)) or np.any(wts < 0) or wts.sum() <= 0:
                raise ValueError(f"weights must be finite, >= 0 and not all zero, got {wts.tolist()}")
    per_size = jnp.stack([jnp.mean(jnp.exp(calibrated_log_probs(b[i], w[i], f)), axis=0)
                          for i, f in enumerate(features)])  # [S, T, n]
    if weights is None:
        weights = jnp.ones(len(features), per_size.dtype)
    weights = jnp.asarray(weights, per_size.dtype)
    return jnp.einsum("s,stn->tn", weights / jnp.sum(weights), per_size)
