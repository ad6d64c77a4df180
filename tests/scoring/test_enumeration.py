"""Sub-context enumeration (paper Definition 1, Algorithm 1) and sampling."""

import itertools
import math

import numpy as np
import pytest

from sc_jax.scoring.enumeration import (all_contexts, default_m, n_contexts, sample_contexts,
                                surrogate_contexts, surrogate_pairs, unrank)


@pytest.mark.parametrize("k,i", [(4, 1), (4, 3), (6, 2), (8, 3), (8, 5)])
def test_counts_and_disjointness(k, i):
    ctx = all_contexts(k, i)
    pairs = surrogate_pairs(ctx, k)
    assert len(ctx) == math.perm(k, i) == n_contexts(k, i)
    assert len(pairs) == math.perm(k, i) * (k - i)
    assert len({tuple(c) for c in ctx}) == len(ctx)  # no duplicate contexts
    assert len({(int(c), int(q)) for c, q in pairs}) == len(pairs)  # no duplicate pairs
    assert all(len(set(c)) == i for c in ctx)  # distinct demos within a context
    assert not any(q in ctx[c] for c, q in pairs)  # a query never in its own context


def test_k8_sizes_match_field_notes():
    """The surrogate set sizes |T_i| at k = 8 (i! C(8, i) contexts x 8 - i queries each)
    as sc_jax counts and enumerates them."""
    sizes = [n_contexts(8, i) * (8 - i) for i in range(1, 6)]
    assert sizes == [56, 336, 1680, 6720, 20160]
    assert [len(surrogate_pairs(all_contexts(8, i), 8)) for i in range(1, 4)] == sizes[:3]


def test_unrank_is_lexicographic():
    ref = list(itertools.permutations(range(6), 3))
    got = unrank(6, 3, np.arange(len(ref)))
    assert [tuple(r) for r in got] == ref


def test_sampling_reproducible_and_distinct():
    a = sample_contexts(16, 5, 500, seed=3)
    b = sample_contexts(16, 5, 500, seed=3)
    c = sample_contexts(16, 5, 500, seed=4)
    assert (a == b).all() and not (a == c).all()
    assert len({tuple(r) for r in a}) == 500


def test_sampling_uniform_on_first_position():
    """Chi-square on the first demonstration of sampled contexts (k=8, i=5): uniform
    sampling gives each of the 8 demos 1/8; the reference's lexicographic cut would give
    only demos 0 and 1."""
    from scipy.stats import chisquare

    ctx = surrogate_contexts(8, 5, budget=5000, seed=0)
    assert len(ctx) == 5000 // 3
    counts = np.bincount(ctx[:, 0], minlength=8)
    p = chisquare(counts).pvalue
    assert p > 1e-3, counts
    # And the test can fail: the lexicographic prefix is rejected outright.
    lex = all_contexts(8, 5)[: len(ctx)]
    assert chisquare(np.bincount(lex[:, 0], minlength=8)).pvalue < 1e-10


def test_budget_keeps_full_enumeration_when_it_fits():
    assert len(surrogate_contexts(6, 2, budget=10_000)) == 30


def test_default_m():
    assert default_m(56, 8, 1) == 8  # capped by |C(1)| = 8
    assert default_m(20160, 8, 5) == 24
    assert default_m(12, 4, 3) == 6


@pytest.mark.parametrize("k,i", [(4, 4), (4, 0), (3, 5), (0, 1)])
def test_bad_sizes(k, i):
    with pytest.raises(ValueError):
        all_contexts(k, i)
