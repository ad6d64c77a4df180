"""Hidden Calibration (Cho et al., NAACL 2025, "Token-based Decision Criteria Are
Suboptimal in In-context Learning"): a nearest-centroid classifier on the LM's last
hidden states instead of its label-token probabilities.

With ``h(x, C) in R^D`` the final-norm hidden state at the prompt's last token (the
vector the label logits are projected from), a calibration set of labelled prompts
``(x_r, C_r, y_r)`` gives one centroid per class,

    mu_c = mean_{r : y_r = c} h(x_r, C_r),

and a test prompt is assigned the class of the nearest centroid in Euclidean distance,
``argmin_c ||h(x, C) - mu_c||_2``. As probabilities (which ECE needs) the authors'
StaICC implementation (``hidden_calibration.inference``) takes a softmax of the
negated distances,

    P(c | x, C) = exp(-d_c) / sum_c' exp(-d_c'),   d_c = ||h(x, C) - mu_c||_2,

whose argmax is the nearest centroid. Here the calibration prompts are SC's surrogate
prompts (each demonstration as the query under sub-contexts of the others) and a
test query's probabilities are averaged over its sampled sub-contexts and the sizes
(:func:`hidden_calibration`; docs/methods.md says how this differs from the paper).

Pure NumPy functions of arrays (float64 inside); the states come from the scoring
engine (:meth:`sc_jax.scoring.engine.ScoringEngine.score_jobs` with ``hidden=True``).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["centroid_distances", "class_centroids", "distance_probs", "hidden_calibration"]


def class_centroids(states, labels, n: int) -> np.ndarray:
    """``mu [n, D]``: the mean of ``states [N, D]`` over the rows of each class
    (``labels [N]`` in ``0 .. n - 1``); NaN for a class without a row (no centroid:
    :func:`centroid_distances` puts it at infinite distance)."""
    states = np.asarray(states, np.float64)
    labels = np.asarray(labels)
    if not np.all(np.isfinite(states)):  # a NaN state would make its class's centroid NaN: never predicted
        raise ValueError("Hidden Calibration: the calibration prompts' hidden states hold NaN or inf; "
                         "check the model's checkpoint and dtype")
    if states.ndim != 2 or labels.shape != states.shape[:1]:
        raise ValueError(f"states must be [N, D] with labels [N], got {states.shape} and "
                         f"{labels.shape}")
    if labels.size and (labels.min() < 0 or labels.max() >= n):
        raise ValueError(f"labels must lie in 0 .. {n - 1}")
    count = np.bincount(labels, minlength=n).astype(np.float64)  # [n]
    total = np.zeros((n, states.shape[1]))
    np.add.at(total, labels, states)
    with np.errstate(invalid="ignore"):
        return total / count[:, None]


def centroid_distances(states, centroids) -> np.ndarray:
    """``d [..., n]``: the Euclidean distance of each state ``[..., D]`` to each
    centroid ``[n, D]``; ``inf`` to a centroid of NaN (a class without calibration
    rows, never the nearest)."""
    states = np.asarray(states, np.float64)
    centroids = np.asarray(centroids, np.float64)
    if centroids.ndim != 2 or states.shape[-1:] != centroids.shape[1:]:
        raise ValueError(f"states [..., D] and centroids [n, D] must share D, got "
                         f"{states.shape} and {centroids.shape}")
    # Class by class: [..., D] at a time, never [..., n, D].
    d = np.stack([np.linalg.norm(states - mu, axis=-1) for mu in centroids], axis=-1)
    return np.where(np.isnan(centroids).any(axis=1), np.inf, d)


def distance_probs(distances) -> np.ndarray:
    """``softmax(-d)`` over the last axis ``[..., n]`` (StaICC's mapping from centroid
    distances to probabilities); a class at infinite distance gets 0."""
    z = -np.asarray(distances, np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def hidden_calibration(distances: Sequence[np.ndarray]) -> np.ndarray:
    """``[T, n]`` Hidden Calibration probabilities of T test queries from one
    ``[m_i, T, n]`` array of distances per size i (each test query under m_i sampled
    sub-contexts of size i, to the centroids of size i's calibration prompts):

        P(c | x) = (1 / |I|) sum_i (1 / m_i) sum_j softmax_c(-d_c(x, C_i^(j))),

    SC's two-level ensemble (Algorithm 2) with the nearest-centroid probabilities in
    place of the fitted calibrator's."""
    if not len(distances):
        raise ValueError("hidden_calibration needs the distances of at least one size")
    if any(np.isnan(np.asarray(d, np.float64)).any() for d in distances):
        raise ValueError("Hidden Calibration: the test prompts' centroid distances hold NaN (a NaN "
                         "hidden state); check the model's checkpoint and dtype")
    return np.mean([distance_probs(d).mean(axis=0) for d in distances], axis=0)
