"""Ordered sub-contexts (paper Definition 1) and the (context, query) pairs of
Algorithm 1, with uniform sampling when a budget is exceeded.

C(i) is the set of ordered i-tuples of distinct demonstrations: |C(i)| = P(k, i) =
k! / (k - i)!. Algorithm 1 pairs each with each of its k - i held-out demonstrations,
so a full size-i surrogate set has P(k, i) (k - i) rows. Above a budget we sample
contexts uniformly *without replacement* by unranking random permutation indices,
never by taking the lexicographic prefix (the reference code's first-5,000 cut keeps
only tuples that start with demonstration 0 or 1).
"""

from __future__ import annotations

import itertools
import math

import numpy as np


def n_contexts(k: int, i: int) -> int:
    """|C(i)| = P(k, i)."""
    _check(k, i)
    return math.perm(k, i)


def _check(k: int, i: int) -> None:
    if k < 1:
        raise ValueError(f"need at least one demonstration, got k={k}")
    if not 1 <= i < k:
        raise ValueError(f"context size i={i} must satisfy 1 <= i < k={k} "
                         "(every context must leave at least one demonstration out)")


def unrank(k: int, i: int, ranks) -> np.ndarray:
    """The ``ranks``-th ordered i-tuples of range(k) in lexicographic order: ``[m, i]``."""
    ranks = np.asarray(ranks, dtype=np.int64)
    out = np.empty((len(ranks), i), np.int64)
    for r_idx, r in enumerate(ranks):
        avail = list(range(k))
        r = int(r)
        for pos in range(i):
            block = math.perm(k - pos - 1, i - pos - 1)
            j, r = divmod(r, block)
            out[r_idx, pos] = avail.pop(j)
    return out


def all_contexts(k: int, i: int) -> np.ndarray:
    """Every element of C(i), lexicographic: ``[P(k, i), i]`` int64."""
    _check(k, i)
    return np.asarray(list(itertools.permutations(range(k), i)), np.int64).reshape(-1, i)


def sample_contexts(k: int, i: int, m: int, seed: int) -> np.ndarray:
    """``m`` distinct contexts drawn uniformly from C(i) (sorted lexicographically, so
    shared prefixes sit together for the trie): ``[m, i]``."""
    total = n_contexts(k, i)
    if not 1 <= m <= total:
        raise ValueError(f"cannot draw {m} distinct contexts from |C({i})| = {total}")
    rng = np.random.default_rng(seed)
    ranks = np.sort(rng.choice(total, size=m, replace=False))
    return unrank(k, i, ranks)


def surrogate_contexts(k: int, i: int, budget: int | None = None, seed: int = 0) -> np.ndarray:
    """Contexts of size i for Algorithm 1: all of C(i) when P(k, i) (k - i) <= budget
    (or no budget), else floor(budget / (k - i)) drawn uniformly without replacement."""
    total = n_contexts(k, i)
    if budget is None or total * (k - i) <= budget:
        return all_contexts(k, i)
    m = max(1, budget // (k - i))
    return sample_contexts(k, i, m, seed)


def index_array(name: str, values, ndim: int | None = None) -> np.ndarray:
    """``values`` as int64 indices, refusing what is not integer: float indices were
    truncated (0.7 read as 0), so a caller's mistake picked other rows without a word.
    An empty list (NumPy makes it float) is accepted."""
    arr = np.asarray(values)
    if arr.size and not (np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(f"{name} must hold integer indices, got dtype {arr.dtype}; "
                         f"pass an integer array (np.asarray(..., np.int64))")
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} axes, got shape {arr.shape}")
    return arr.astype(np.int64)


def surrogate_pairs(contexts: np.ndarray, k: int) -> np.ndarray:
    """(context index, held-out demonstration) pairs of Algorithm 1: ``[M (k - i), 2]``.
    Queries run over the demonstrations not in the context, in increasing order.
    ``contexts [M, i]`` must name distinct demonstrations in [0, k) (ValueError otherwise:
    a context naming demonstration k or more would pair with every demonstration)."""
    contexts = index_array("contexts", contexts, ndim=2)
    M, i = contexts.shape
    if contexts.size and (contexts.min() < 0 or contexts.max() >= k):
        bad = int(contexts.max() if contexts.max() >= k else contexts.min())
        raise ValueError(f"contexts name demonstration {bad}, outside [0, k={k}): each entry "
                         "must index one of the k demonstrations")
    if i > 1 and contexts.size and np.any(np.diff(np.sort(contexts, axis=1), axis=1) == 0):
        raise ValueError("contexts must name distinct demonstrations in each row (a context is "
                         "an ordered tuple of distinct demonstrations)")
    pairs = []
    for c, ctx in enumerate(contexts):
        held = np.setdiff1d(np.arange(k), ctx)
        pairs.append(np.stack([np.full(len(held), c), held], axis=1))
    return np.concatenate(pairs).astype(np.int64) if pairs else np.zeros((0, 2), np.int64)


def default_m(n_rows: int, k: int, i: int, cap: int = 24) -> int:
    """Test-time sub-contexts per size (paper Appendix A):
    m_i = min(floor(|T_i| / 2), 24, |C(i)|), at least 1."""
    return max(1, min(n_rows // 2, cap, n_contexts(k, i)))
