"""What the NumPy fits return, :class:`FitResult`, and the calibrated probabilities
from it: one map (:func:`calibrated_proba`) and the two-level ensemble of Algorithm 2,
Part 2 (:func:`predict_proba`), in float64.

Calibrated probabilities are averaged over the m_i sampled sub-contexts of each size,
then over sizes, uniformly as in the paper, or weighted by min(P(k, i)(k - i), 15000)
as the reference code does (``size_weights="reference"``,
:func:`reference_size_weights`). The arithmetic is that of the pure-JAX
:mod:`sc_jax.calibration.jax_predict`, written again in NumPy: run eagerly, JAX compiled
one small program per operation and per new shape (about 17 in a run's metrics, again
for every other class count, test size or m_i), while these few array operations cost
microseconds. Tests hold the two to float64 rounding.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal, Sequence

import numpy as np

from sc_jax.calibration.jax_calibrate import warn_unless_converged
from sc_jax.calibration.solvers import Solver, Status, is_converged
from sc_jax.calibration.validation import check_features, check_params

# Reference code (gundemkorel/ICL, ICL_modules/functions.py): the final average across
# sizes is weighted by min(P(k, i)(k - i), 15000), the full surrogate row count of size i.
REFERENCE_SIZE_WEIGHT_CAP = 15000

__all__ = ["FitResult", "calibrated_proba", "predict_proba", "reference_size_weights"]


@dataclasses.dataclass(frozen=True)
class FitResult:
    """Fitted calibration for one context size.

    b, w: ``[n-1]`` float64 NumPy arrays (w is all ones for SC*).
    status: :class:`sc_jax.calibration.solvers.Status`; ``converged`` is status == CONVERGED
        (:func:`sc_jax.calibration.solvers.is_converged`).
    objective: mean-NLL + lambda_inv * InvPenalty at (b, w).
    constraint: mean cosine (1/(n-1)) sum_c w_c / ||(b_c, w_c)||; violation: of the
        constraint form the solver kept (per-class cones for "projected").
    tau, lambda_inv, solver, sc_star: the settings used (tau after the schedule).
    num_rows: |T_i|; base_accuracy: in-sample accuracy of the base model.
    guarded: SC was asked for and the guard fitted SC* instead (``sc_star`` True).
    """

    b: np.ndarray
    w: np.ndarray
    status: Status
    iterations: int
    outer_iterations: int
    objective: float
    constraint: float
    violation: float
    tau: float
    lambda_inv: float
    solver: Solver
    sc_star: bool
    num_rows: int
    base_accuracy: float
    guarded: bool = False

    @property
    def converged(self) -> bool:
        return is_converged(self.status)

    @property
    def num_classes(self) -> int:
        return self.b.shape[0] + 1

    def predict_proba(self, features: np.ndarray) -> np.ndarray:
        """``[..., n-1]`` log-odds -> ``[..., n]`` calibrated probabilities. Warns
        (RuntimeWarning) when the fit's status is not CONVERGED; raises ValueError for
        NaN parameters or features of another width."""
        warn_unless_converged(np.int32(self.status), "FitResult.predict_proba")
        return calibrated_proba(self.b, self.w, features)


def _affine_proba(b: np.ndarray, w: np.ndarray, features: np.ndarray) -> np.ndarray:
    """f(m; theta) without checks, float64: ``[..., n-1]`` -> ``[..., n]``; the steps of
    :func:`sc_jax.calibration.objective.affine_log_probs` (logits with class 0 pinned at
    0, then a log-softmax shifted by its max) followed by exp."""
    z = features * w + b  # [..., n-1]
    logits = np.concatenate([np.zeros_like(z[..., :1]), z], axis=-1)  # [..., n]
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return np.exp(shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True)))


def calibrated_proba(b: np.ndarray, w: np.ndarray, features: np.ndarray) -> np.ndarray:
    """f(m; theta) of Eq. affine_logit_model_formal: ``[..., n-1]`` -> ``[..., n]``, in
    float64; exp of :func:`sc_jax.calibration.jax_predict.calibrated_log_probs`."""
    b, w, features = (np.asarray(a, np.float64) for a in (b, w, features))
    check_features(features)
    check_params(b, w, features.shape[-1])
    return _affine_proba(b, w, features)


def reference_size_weights(shots: int, sizes: Sequence[int]) -> np.ndarray:
    """The reference code's size weights, ``[len(sizes)]`` (unnormalised):

        a_i = min(P(k, i) (k - i), 15000),  P(k, i) = k! / (k - i)!,

    the number of surrogate rows of size i before any budget truncation (every ordered
    i-tuple of the k demonstrations with each of the k - i held-out ones as query),
    capped at 15000 (gundemkorel/ICL ``ICL_modules/functions.py``: ``min(math.perm(k, i)
    * (k - i), 15000)``). It does not depend on the budget: at k = 8 with the default
    budget 5000 the fitted sizes have 56, 336, 1680, 5000, 5000 rows but weights 56,
    336, 1680, 6720, 15000."""
    # int(1.5) read a size of 1: the weight of another size, without a word.
    if isinstance(shots, bool) or not isinstance(shots, (int, np.integer)):
        raise ValueError(f"shots (k) must be an integer, got {shots!r}")
    if any(isinstance(i, bool) or not isinstance(i, (int, np.integer)) for i in sizes):
        raise ValueError(f"sizes must be integers, got {list(sizes)}")
    sizes = [int(i) for i in sizes]
    if any(not 1 <= i < shots for i in sizes):
        raise ValueError(f"sizes must lie in 1..k-1 = 1..{shots - 1}, got {sizes}")
    return np.array([min(math.perm(shots, i) * (shots - i), REFERENCE_SIZE_WEIGHT_CAP)
                     for i in sizes], float)


def predict_proba(fits: Sequence[FitResult], features: Sequence[np.ndarray], *,
                  size_weights: Literal["uniform", "reference"] = "uniform", shots: int | None = None,
                  sizes: Sequence[int] | None = None) -> np.ndarray:
    """p_SC(x) = sum_i a_i (1/m_i) sum_j f(m(x; C_i^(j)); theta_i) (Algorithm 2, Part 2).

    fits: one :class:`FitResult` per context size i in I.
    features: per size, ``[m_i, T, n-1]`` log-odds of the T test queries under each of
        the m_i sampled sub-contexts of that size (``[T, n-1]`` means m_i = 1).
    size_weights: "uniform" (a_i = 1/|I|, the paper) or "reference" (a_i proportional
        to min(P(k, i)(k - i), 15000), the reference code: :func:`reference_size_weights`;
        needs ``shots`` k and the fits' ``sizes`` i).
    Returns ``[T, n]`` probabilities; the SC prediction is their argmax.
    """
    if len(fits) == 0 or len(fits) != len(features):
        raise ValueError(f"need one feature array per fitted size: {len(fits)} fits, "
                         f"{len(features)} feature arrays")
    if size_weights == "uniform":
        weights = np.ones(len(fits))
    elif size_weights == "reference":
        if shots is None or sizes is None or len(sizes) != len(fits):
            raise ValueError("size_weights='reference' needs shots (k) and one size per fit")
        weights = reference_size_weights(shots, sizes)
    else:
        raise ValueError(f"size_weights must be 'uniform' or 'reference', got {size_weights!r}")
    feats_all = []
    for i, (fit_i, feats) in enumerate(zip(fits, features)):
        if not isinstance(fit_i, FitResult):
            raise ValueError(f"fits[{i}] must be a FitResult (from fit or fit_batch), got "
                             f"{type(fit_i).__name__}")
        if not np.all(np.isfinite(fit_i.b)) or not np.all(np.isfinite(fit_i.w)):
            raise ValueError(f"fits[{i}] has NaN or infinite parameters (status "
                             f"{Status(int(fit_i.status)).name}): it is not a fit; refit that size")
        check_params(fit_i.b, fit_i.w, None, f" (fits[{i}])")
        warn_unless_converged(np.int32(fit_i.status), f"predict_proba (fits[{i}])")
        feats = np.asarray(feats, np.float64)
        if feats.ndim == 2:
            feats = feats[None]
        if feats.ndim != 3 or feats.shape[-1] != fit_i.num_classes - 1:
            raise ValueError(f"features[{i}] must be [m_i, T, {fit_i.num_classes - 1}], "
                             f"got {feats.shape}")
        if feats.shape[0] == 0:
            # A mean over no sub-contexts was NaN for every query.
            raise ValueError(f"features[{i}] has no sub-contexts (m_i = 0, shape {feats.shape}): "
                             "score the test queries under at least one context of that size")
        if not np.all(np.isfinite(feats)):
            raise ValueError("test features contain NaN or infinite values")
        if feats_all and feats.shape[1] != feats_all[0].shape[1]:
            raise ValueError("every size must score the same T test queries")
        feats_all.append(feats)
    # The two levels of :func:`sc_jax.calibration.jax_predict.ensemble_proba`: the mean
    # over each size's m_i sub-contexts, then the a_i-weighted sum over sizes.
    per_size = np.stack([_affine_proba(np.asarray(f.b, np.float64), np.asarray(f.w, np.float64),
                                       feats).mean(axis=0)
                         for f, feats in zip(fits, feats_all)])  # [S, T, n]
    return np.einsum("s,stn->tn", weights / weights.sum(), per_size)
