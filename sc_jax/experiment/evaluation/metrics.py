"""Evaluation metrics on NumPy arrays: accuracy, macro-F1, expected calibration error."""

from __future__ import annotations

import numpy as np

__all__ = ["accuracy", "calibration_bins", "expected_calibration_error", "macro_f1"]


def _labels(y_true, y_pred):
    y_true = np.asarray(y_true).reshape(-1)
    y_pred = np.asarray(y_pred).reshape(-1)
    if y_true.shape != y_pred.shape:
        raise ValueError(f"y_true and y_pred differ in length: {y_true.shape} vs "
                         f"{y_pred.shape}")
    if y_true.size == 0:
        raise ValueError("no predictions to score")
    return y_true, y_pred


def accuracy(y_true, y_pred) -> float:
    """Fraction of exact matches."""
    y_true, y_pred = _labels(y_true, y_pred)
    return float(np.mean(y_true == y_pred))


def macro_f1(y_true, y_pred, num_classes: int | None = None) -> float:
    """Unweighted mean over classes of F1 = 2 TP / (2 TP + FP + FN).

    Classes: 0..num_classes-1 if given, else those occurring in y_true or y_pred (as
    scikit-learn's ``average="macro"``). A class with no true and no predicted
    instance scores 0 when listed through ``num_classes``.
    """
    y_true, y_pred = _labels(y_true, y_pred)
    classes = (np.arange(num_classes) if num_classes is not None
               else np.union1d(y_true, y_pred))
    scores = []
    for c in classes:
        tp = np.sum((y_true == c) & (y_pred == c))
        fp = np.sum((y_true != c) & (y_pred == c))
        fn = np.sum((y_true == c) & (y_pred != c))
        denom = 2 * tp + fp + fn
        scores.append(2 * tp / denom if denom else 0.0)
    return float(np.mean(scores))


def expected_calibration_error(probs, labels, num_bins: int = 10) -> float:
    """Top-label ECE: sum_b (|B_b| / N) |accuracy(B_b) - confidence(B_b)| over
    ``num_bins`` equal-width confidence bins on [0, 1] (right-closed, the first also
    holding 0).

    probs: ``[N, n]`` predicted probabilities; labels: ``[N]``.
    """
    conf, correct, bins = _top_label(probs, labels, num_bins)
    ece = 0.0
    for b in range(num_bins):
        in_bin = bins == b
        if in_bin.any():
            ece += in_bin.mean() * abs(correct[in_bin].mean() - conf[in_bin].mean())
    return float(ece)


def calibration_bins(probs, labels,
                     num_bins: int = 10) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The bins of :func:`expected_calibration_error` (a reliability diagram's bars):
    ``(count, accuracy, confidence)``, each ``[num_bins]``: per bin the number of
    predictions whose top-label confidence falls in it, their accuracy and their mean
    confidence (NaN in an empty bin). ECE = sum_b count_b / N |accuracy_b - confidence_b|.

    probs: ``[N, n]`` predicted probabilities; labels: ``[N]``.
    """
    conf, correct, bins = _top_label(probs, labels, num_bins)
    count = np.bincount(bins, minlength=num_bins).astype(np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):  # empty bins: NaN
        acc = np.bincount(bins, correct, minlength=num_bins) / count
        mean_conf = np.bincount(bins, conf, minlength=num_bins) / count
    return count, acc, mean_conf


def _top_label(probs, labels, num_bins: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(confidence, correct, bin)``, each ``[N]``: the top probability, whether its
    class is the label (1.0 / 0.0) and its bin of ``num_bins`` equal-width bins on
    [0, 1], right-closed, the first also holding 0."""
    probs = np.asarray(probs, np.float64)
    labels = np.asarray(labels).reshape(-1)
    if probs.ndim != 2 or probs.shape[0] != labels.shape[0] or probs.shape[0] == 0:
        raise ValueError(f"probs must be [N, n] with N = len(labels) > 0, got "
                         f"{probs.shape} and {labels.shape}")
    if num_bins < 1:
        raise ValueError(f"num_bins must be >= 1, got {num_bins}")
    conf = probs.max(axis=1)
    correct = (probs.argmax(axis=1) == labels).astype(np.float64)
    # bin b holds confidences in (b/B, (b+1)/B]; confidence 0 goes to bin 0.
    bins = np.clip(np.ceil(conf * num_bins).astype(np.int64) - 1, 0, num_bins - 1)
    return conf, correct, bins
