"""Leave-one-out calibration, LOOC (Reif & Schwartz, NAACL 2024, "Beyond Performance:
Quantifying and Mitigating Label Bias in LLMs", Sec. 6).

LOOC estimates the context's label prior from the k demonstrations themselves: each
demonstration j is queried with the other k - 1 as its context, and the prior is the
mean of those label distributions taken per gold label first, so that an unbalanced
set of demonstrations does not tilt it::

    q_j      = P(y | x_j, C \\ {j})                                   [n], j = 1..k
    p_bar    = (1/|L|) sum_{l in L} mean_{j : y_j = l} q_j           [n]
    LOOC(x)  = normalise_y( P(y | x, C) / p_bar_y )

with L the labels that occur among the demonstrations and every distribution
renormalised over the label set. The prediction divides by p_bar as CC divides by the
content-free prior (:func:`sc_jax.calibration.baselines.contextual_calibration`).

SC's surrogate data of size k - 1 are these prompts: every held-out demonstration under
orderings of the other k - 1 (all (k - 1)! of them when the budget covers the size,
else the sampled ones). :func:`looc_prior` first averages the rows of each held-out
demonstration over its orderings (q_j), then per label as above; with one row per
demonstration it is the paper's estimator exactly.
"""

from __future__ import annotations

import numpy as np

from sc_jax.calibration.baselines import _divide, _probs, base

__all__ = ["leave_one_out_calibration", "looc_prior"]


def looc_prior(loo_probs, labels, query_ids=None) -> np.ndarray:
    """LOOC's label prior p_bar ``[n]``.

    Args:
      loo_probs: ``[N, n]`` label probabilities of held-out demonstrations, each under
        the others as its context (renormalised over the labels here).
      labels: ``[N]`` the gold label of each row's held-out demonstration.
      query_ids: ``[N]`` which demonstration each row holds out; rows of one
        demonstration (its context in several orders) are averaged into its q_j first.
        None: every row is its own demonstration (the paper's one prompt each).

    Returns:
      p_bar = mean over the labels present of the mean q_j of that label's
      demonstrations.
    """
    p = base(_probs(loo_probs, "loo_probs"))
    labels = np.asarray(labels)
    if p.ndim != 2 or labels.shape != p.shape[:1]:
        raise ValueError(f"loo_probs must be [N, n] and labels [N], got shapes {p.shape} "
                         f"and {labels.shape}")
    if len(p) == 0:
        raise ValueError("LOOC needs at least one leave-one-out prompt, got none")
    if query_ids is not None:
        query_ids = np.asarray(query_ids)
        if query_ids.shape != labels.shape:
            raise ValueError(f"query_ids must be [N] like labels, got {query_ids.shape}")
        ids, first, inverse = np.unique(query_ids, return_index=True, return_inverse=True)
        sums = np.zeros((len(ids), p.shape[1]))
        np.add.at(sums, inverse, p)
        p = sums / np.bincount(inverse, minlength=len(ids))[:, None]  # q_j  [k, n]
        labels = labels[first]
    return np.mean([p[labels == label].mean(axis=0) for label in np.unique(labels)], axis=0)


def leave_one_out_calibration(probs, loo_probs, labels, query_ids=None) -> np.ndarray:
    """LOOC: ``probs [..., T, n]`` (under the full k-shot context) divided by
    :func:`looc_prior` of the leave-one-out prompts, renormalised: ``[..., T, n]``."""
    return _divide(base(_probs(probs, "probs")), looc_prior(loo_probs, labels, query_ids))
