"""Label-marginal baselines: Base, CC, DC and BC (paper Appendix D table, Appendix A).

Each divides the model's label probabilities P(y | x, C) by an estimate of the
context's label prior P(y | C) and renormalises; they differ only in the estimate:

    Base: none                     argmax_y P(y | x, C)
    CC:   content-free inputs      P(y | x, C) / mean_s P(y | s, C),  s in CONTENT_FREE_INPUTS
    DC:   random in-domain strings P(y | x, C) / mean_j P(y | RandDom_j, C), 20 strings
    BC:   the test batch itself    P(y | x, C) / mean_{x' in batch} P(y | x', C), batches of 128
    BC (reference code):           softmax_y(P(y | x, C) - mean_{x' in batch} P(y | x', C))

The last is what the reference implementation computes for BC (gundemkorel/ICL,
``ICL_calibrations/calibration_methods.py``, ``batch_calibration``), not the paper's
ratio: :func:`batch_calibration_reference`. The paper's BC stays the baseline
(``batch_calibration``); the reference form is reported beside it.

All are pure NumPy functions of probabilities ``[..., T, n]`` (leading axes, e.g. one
per context, broadcast). The prompts that produce the reference probabilities come from
the scoring engine; :func:`random_domain_strings` builds DC's inputs.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

# Paper Appendix A (Zhao et al. 2021). The reference code uses 'NA' for the first.
CONTENT_FREE_INPUTS: tuple[str, ...] = ("N/A", "", "[MASK]")
NUM_DOMAIN_STRINGS = 20
BC_BATCH_SIZE = 128

__all__ = [
    "BC_BATCH_SIZE",
    "CONTENT_FREE_INPUTS",
    "NUM_DOMAIN_STRINGS",
    "base",
    "batch_calibration",
    "batch_calibration_reference",
    "contextual_calibration",
    "domain_context_calibration",
    "random_domain_strings",
]


def _probs(p, name: str) -> np.ndarray:
    p = np.asarray(p, np.float64)
    if p.ndim < 1 or p.shape[-1] < 2:
        raise ValueError(f"{name} must be [..., n] label probabilities with n >= 2, "
                         f"got shape {p.shape}")
    if not np.all(np.isfinite(p)) or np.any(p < 0):
        raise ValueError(f"{name} must be finite and non-negative")
    return p


def _divide(p: np.ndarray, prior: np.ndarray) -> np.ndarray:
    # A label the prior gives probability 0 would divide by zero; the tiny floor keeps
    # such a label maximal only if the model also puts mass on it.
    q = p / np.maximum(prior, np.finfo(np.float64).tiny)
    return q / q.sum(axis=-1, keepdims=True)


def base(probs) -> np.ndarray:
    """The uncalibrated model: probabilities renormalised over the label set."""
    p = _probs(probs, "probs")
    return p / p.sum(axis=-1, keepdims=True)


def contextual_calibration(probs, content_free_probs) -> np.ndarray:
    """CC: ``probs [..., T, n]`` divided by the mean of ``content_free_probs [..., S, n]``
    (the S = 3 content-free inputs scored with the same context), renormalised."""
    p = _probs(probs, "probs")
    cf = _probs(content_free_probs, "content_free_probs")
    prior = base(cf).mean(axis=-2, keepdims=True)  # [..., 1, n]
    return _divide(base(p), prior)


def domain_context_calibration(probs, domain_probs) -> np.ndarray:
    """DC: ``probs [..., T, n]`` divided by the mean of ``domain_probs [..., 20, n]``
    (random in-domain strings scored with the same context), renormalised."""
    p = _probs(probs, "probs")
    dom = _probs(domain_probs, "domain_probs")
    prior = base(dom).mean(axis=-2, keepdims=True)
    return _divide(base(p), prior)


def _per_batch(probs, batch_size: int, calibrate) -> np.ndarray:
    """``calibrate(chunk, mean)`` on each batch of ``batch_size`` consecutive test
    predictions along T (the last may be shorter), ``mean`` the batch's mean
    prediction ``[..., 1, n]``. probs: ``[..., T, n]``, renormalised over the labels."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    p = base(_probs(probs, "probs"))
    if p.ndim < 2:
        raise ValueError(f"probs must be [..., T, n], got shape {p.shape}")
    out = np.empty_like(p)
    for start in range(0, p.shape[-2], batch_size):
        chunk = p[..., start:start + batch_size, :]
        out[..., start:start + batch_size, :] = calibrate(chunk, chunk.mean(axis=-2, keepdims=True))
    return out


def _softmax_of_difference(chunk: np.ndarray, mean: np.ndarray) -> np.ndarray:
    # chunk - mean lies in [-1, 1]: exp cannot overflow, so no max-shift is needed.
    e = np.exp(chunk - mean)
    return e / e.sum(axis=-1, keepdims=True)


def batch_calibration(probs, batch_size: int = BC_BATCH_SIZE) -> np.ndarray:
    """BC: each prediction divided by the mean over its batch of ``batch_size``
    consecutive test predictions, in order (the last batch may be shorter).

    probs: ``[..., T, n]``; batches run along the T axis.
    """
    return _per_batch(probs, batch_size, _divide)


def batch_calibration_reference(probs, batch_size: int = BC_BATCH_SIZE) -> np.ndarray:
    """BC as the reference code computes it: for each batch B of ``batch_size``
    consecutive test predictions, in order (the last batch may be shorter),

        q(y | x) = softmax_y( p(y | x) - (1/|B|) sum_{x' in B} p(y | x') ),  x in B,

    with p the label probabilities renormalised over the label set (the reference's
    ``label_space_probs``; gundemkorel/ICL ``calibration_methods.batch_calibration``,
    default batch size 128, as here).

    The paper (Appendix D; Zhou et al. 2024) writes BC as p(y | x) / mean_B p(y | x'),
    which :func:`batch_calibration` implements. The prediction here is
    argmax_y p(y|x) - mean_B p(y|x'): on two classes the same as the ratio's (both
    predict class 1 iff p_1(x) exceeds its batch mean), on more classes not (a label
    the model rarely favours gains at most its small mean, not a factor 1 / mean). The
    probabilities are softmaxes of numbers in [-1, 1], so never far from uniform
    (ratios at most e^2): their ECE differs from the ratio's even on two classes.

    probs: ``[..., T, n]``; batches run along the T axis. Returns ``[..., T, n]``.
    """
    return _per_batch(probs, batch_size, _softmax_of_difference)


def random_domain_strings(pool: Sequence[str], num_strings: int = NUM_DOMAIN_STRINGS,
                          seed: int = 0) -> list[str]:
    """DC's content-free, in-domain inputs (Fei et al. 2023; paper Appendix A).

    A bag of words is built from the unlabeled pool (the test inputs): every
    whitespace-separated word, with multiplicity. Each of ``num_strings`` strings draws
    L words from the bag uniformly with replacement, L = the pool's average input
    length in words (rounded, at least 1). Deterministic given ``seed``.
    """
    texts = [str(t) for t in pool]
    words = [w for t in texts for w in t.split()]
    if not words:
        raise ValueError("the unlabeled pool has no words to build DC's bag of words from")
    length = max(1, int(round(np.mean([len(t.split()) for t in texts]))))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(words), size=(num_strings, length))
    return [" ".join(words[i] for i in row) for row in idx]
