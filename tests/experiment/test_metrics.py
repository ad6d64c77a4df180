"""Metrics against hand-computed values."""

import numpy as np
import pytest

from sc_jax.experiment.evaluation.metrics import accuracy, expected_calibration_error, macro_f1


def test_accuracy():
    assert accuracy([0, 1, 2, 2], [0, 2, 2, 1]) == 0.5
    assert accuracy(np.array([[1, 1]]), np.array([1, 0])) == 0.5  # flattened


def test_macro_f1_by_hand():
    y_true = [0, 0, 1, 1, 2, 2]
    y_pred = [0, 1, 1, 1, 2, 0]
    # class 0: tp1 fp1 fn1 -> 2/4; class 1: tp2 fp1 fn0 -> 4/5; class 2: tp1 fp0 fn1 -> 2/3
    assert macro_f1(y_true, y_pred) == pytest.approx((0.5 + 0.8 + 2 / 3) / 3)


def test_macro_f1_class_set():
    # Without num_classes only classes seen in y_true or y_pred count (scikit-learn's
    # macro); with it, an unseen class scores 0 and drags the mean down.
    y = [0, 0, 1, 1]
    assert macro_f1(y, y) == 1.0
    assert macro_f1(y, y, num_classes=3) == pytest.approx(2 / 3)
    # Constant predictions on balanced data: F1 of 2/3 for the predicted class only.
    assert macro_f1(y, [0, 0, 0, 0]) == pytest.approx((2 / 3 + 0) / 2)


def test_ece_by_hand():
    probs = np.array([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.45, 0.55]])
    labels = np.array([0, 1, 1, 1])
    # conf 0.9 (bin 9, correct), 0.8 (bin 8, wrong), 0.7 (bin 7, correct), 0.55 (bin 6, correct)
    expected = 0.25 * (abs(1 - 0.9) + abs(0 - 0.8) + abs(1 - 0.7) + abs(1 - 0.55))
    assert expected_calibration_error(probs, labels) == pytest.approx(expected)
    # One bin: |accuracy - mean confidence|.
    assert expected_calibration_error(probs, labels, num_bins=1) == pytest.approx(
        abs(0.75 - np.mean([0.9, 0.8, 0.7, 0.55])))


def test_ece_zero_for_calibrated_predictions():
    rng = np.random.default_rng(0)
    n = 200_000
    conf = rng.choice([0.6, 0.8], size=n)
    correct = rng.random(n) < conf
    labels = np.where(correct, 0, 1)
    probs = np.stack([conf, 1 - conf], axis=1)
    assert expected_calibration_error(probs, labels) < 0.005
    # Overconfident by 0.1 everywhere -> ECE 0.1.
    probs_over = np.stack([conf + 0.1, 0.9 - conf], axis=1)
    assert expected_calibration_error(probs_over, labels) == pytest.approx(0.1, abs=0.005)


def test_bad_input():
    with pytest.raises(ValueError, match="differ in length"):
        accuracy([0, 1], [0])
    with pytest.raises(ValueError, match="no predictions"):
        macro_f1([], [])
    with pytest.raises(ValueError, match=r"\[N, n\]"):
        expected_calibration_error(np.ones(3), [0, 1, 2])
