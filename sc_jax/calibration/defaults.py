"""The settings both entry points default to, defined once: the invariance weight
lambda_inv, and the trust-region level tau of paper Appendix A, read off the base
model's in-sample accuracy.

The pure-JAX :func:`sc_jax.calibration.jax_calibrate.calibrate` applies the schedule in
the graph (:func:`tau_schedule`, :func:`base_accuracy` on traced arrays); the NumPy
:func:`sc_jax.calibration.numpy_fit.fit_batch` on the host (:func:`tau_from_accuracy`,
:func:`base_accuracy` in float64). Both give the same levels (:func:`tau_levels`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from sc_jax.calibration.validation import concrete

Array = jax.Array

__all__ = [
    "DEFAULT_LAMBDA_INV",
    "TAU_SCHEDULE",
    "base_accuracy",
    "tau_from_accuracy",
    "tau_levels",
    "tau_schedule",
]

#: Weight of the invariance penalty when none is given, for both entry points. The
#: paper's 10 was tuned for *summed* NLL and penalty terms; we use means (see
#: :mod:`sc_jax.calibration.objective`), so the scale differs. The choice rests on the
#: ablation of ``benchmarks/bench_solver.py`` over lambda in {0, 0.1, 1, 10} (figures in
#: ``benchmarks/RESULTS.md``): 0 and 0.1 tie, larger weights lose, because the symmetric
#: cross-entropy rewards confident, identical predictions and a large weight collapses
#: the calibrated predictions towards one class (what the reference code's unnormalised
#: sum did). 0.1 keeps the paper's invariance term at no measured cost.
DEFAULT_LAMBDA_INV = 0.1

#: Paper Appendix A: (least in-sample accuracy, alpha in degrees before the 1/(K-1)
#: root), tightest first; below the last, alpha = 180 (tau = -1, no trust region).
TAU_SCHEDULE = ((0.9, 20.0), (0.7, 45.0), (0.5, 90.0))


def tau_levels(num_classes: int) -> tuple[float, ...]:
    """The trust-region levels tau = cos(alpha degrees) of :data:`TAU_SCHEDULE` for K =
    ``num_classes``, one per row and then -1: Python floats (float64), the same
    numbers on every backend."""
    root = 1.0 / (num_classes - 1)
    alphas = [alpha**root for _, alpha in TAU_SCHEDULE] + [180.0]
    return tuple(float(np.clip(math.cos(math.radians(a)), -1.0, 1.0)) for a in alphas)


def tau_schedule(accuracy: Array, num_classes: int) -> Array:
    """Paper Appendix A: tau = cos(alpha degrees) from the base model's accuracy.

    alpha = 20^(1/(K-1)) if accuracy >= 0.9; 45^(1/(K-1)) if >= 0.7; 90^(1/(K-1)) if
    >= 0.5; otherwise 180 (tau = -1, no trust region). ``accuracy`` may be traced and
    batched; ``num_classes`` (K) is static. The levels are :func:`tau_levels`.
    """
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) \
            or num_classes < 2:
        # K = 1 divided by zero in the 1/(K-1) root.
        raise ValueError(f"num_classes must be an integer >= 2 (the number of classes K), "
                         f"got {num_classes!r}")
    host = concrete(accuracy)
    if host is not None:
        acc = np.asarray(host[0])
        # NaN read as "below 0.5" (tau = -1) and 2.0 as "above 0.9", without a word.
        if not (np.issubdtype(acc.dtype, np.floating) or np.issubdtype(acc.dtype, np.integer)) \
                or not np.all((acc >= 0) & (acc <= 1)):
            raise ValueError(f"accuracy must be a fraction in [0, 1], got {acc.tolist()!r}")
    levels = tau_levels(num_classes)
    accuracy = jnp.asarray(accuracy)
    tau = levels[-1]
    for (least, _), level in reversed(list(zip(TAU_SCHEDULE, levels))):
        tau = jnp.where(accuracy >= least, level, tau)
    return tau


def tau_from_accuracy(accuracy: float, num_classes: int) -> float:
    """:func:`tau_schedule` on one checked Python float, in float64: the NumPy fits'
    tau = cos(alpha degrees) (paper Appendix A, K = ``num_classes``)."""
    if not 0.0 <= accuracy <= 1.0:
        raise ValueError(f"accuracy must be in [0, 1], got {accuracy}")
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    with jax.enable_x64(True):  # the schedule's float64 levels, unrounded
        return float(tau_schedule(float(accuracy), num_classes))


def base_accuracy(features, labels, mask=None):
    """In-sample accuracy of the base model, argmax of (0, m_1, ..., m_{n-1}), over the
    rows where ``mask`` is 1 (all if None): features ``[..., N, n-1]``, labels and mask
    ``[..., N]`` -> ``[...]``.

    JAX arrays (traced ones too: :func:`sc_jax.calibrate` runs it in the graph) are
    counted in the features' dtype; anything else (NumPy arrays, lists) in NumPy
    float64, as the NumPy fits read it, a single accuracy as a Python float.
    """
    host = not isinstance(features, jax.Array)
    if host:
        features, labels = np.asarray(features, np.float64), np.asarray(labels)
        mask = None if mask is None else np.asarray(mask, np.float64)
    pred = (features.max(axis=-1) > 0) * (features.argmax(axis=-1) + 1)
    hit = (pred == labels).astype(features.dtype)
    if mask is None:
        acc = hit.mean(axis=-1)
    else:
        acc = (hit * mask).sum(axis=-1) / (mask.sum(axis=-1)).clip(min=1.0)
    return float(acc) if host and np.ndim(acc) == 0 else acc
