"""Hidden Calibration's arrays (sc_jax.calibration.hidden): class centroids, Euclidean
distances (against SciPy's cdist), softmax(-d) and the ensemble over contexts and
sizes, on Gaussian clusters whose nearest centroid is known."""

import numpy as np
import pytest
from scipy.spatial.distance import cdist

from sc_jax.calibration.hidden import (centroid_distances, class_centroids, distance_probs,
                                       hidden_calibration)


def _clusters(rng, n, per, D, spread):
    """``per`` points around each of n well separated means in R^D."""
    means = rng.normal(0.0, 10.0, (n, D))
    y = np.repeat(np.arange(n), per)
    return means, means[y] + spread * rng.normal(size=(n * per, D)), y


def test_nearest_centroid_recovers_gaussian_clusters():
    rng = np.random.default_rng(0)
    n, D = 4, 17
    means, x, y = _clusters(rng, n, 50, D, 1.0)
    mu = class_centroids(x, y, n)
    # Each centroid is its class's mean (within 6 standard errors of the truth).
    assert np.abs(mu - means).max() < 6 / np.sqrt(50)
    np.testing.assert_allclose(mu[2], x[y == 2].mean(0), rtol=1e-12)
    # Test points from the same clusters under 3 contexts: the nearest centroid is
    # their class; the distances are SciPy's Euclidean ones.
    _, xt, yt = _clusters(np.random.default_rng(0), n, 50, D, 1.0)
    xt = np.stack([xt + rng.normal(0, 0.1, xt.shape) for _ in range(3)])  # [3, T, D]
    d = centroid_distances(xt, mu)
    assert d.shape == (3, n * 50, n)
    np.testing.assert_allclose(d[1], cdist(xt[1], mu), rtol=1e-12)
    p = hidden_calibration([d, d[:2]])
    assert p.shape == (n * 50, n) and (p.argmax(-1) == yt).all()
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-12)


def test_equation_softmax_of_negative_distances_averaged_over_contexts_and_sizes():
    d1 = np.array([[[1.0, 2.0, 4.0]], [[3.0, 1.0, 1.0]]])  # [m=2, T=1, n=3]
    d2 = np.array([[[0.5, 0.5, 9.0]]])  # [m=1, T=1, n=3]
    soft = lambda v: np.exp(-np.asarray(v)) / np.exp(-np.asarray(v)).sum()  # noqa: E731
    want = 0.5 * (0.5 * (soft([1, 2, 4]) + soft([3, 1, 1])) + soft([0.5, 0.5, 9.0]))
    np.testing.assert_allclose(hidden_calibration([d1, d2])[0], want, rtol=1e-12)
    # Far-apart distances do not overflow; shifting all distances changes nothing.
    np.testing.assert_allclose(distance_probs([1e4, 1e4 + 1]), distance_probs([0, 1]), rtol=1e-12)


def test_a_class_without_calibration_rows_is_never_predicted():
    x = np.array([[0.0, 0.0], [0.2, 0.0], [5.0, 5.0]])
    mu = class_centroids(x, np.array([0, 0, 2]), 3)
    assert np.isnan(mu[1]).all()
    d = centroid_distances(np.array([[0.1, 0.0], [4.0, 4.0]]), mu)
    assert np.isinf(d[:, 1]).all()
    p = distance_probs(d)
    assert (p[:, 1] == 0).all() and p.argmax(-1).tolist() == [0, 2]


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="labels must lie"):
        class_centroids(np.zeros((2, 3)), np.array([0, 3]), 3)
    with pytest.raises(ValueError, match="share D"):
        centroid_distances(np.zeros((2, 3)), np.zeros((2, 4)))
    with pytest.raises(ValueError, match="at least one size"):
        hidden_calibration([])
