"""The engine's model-free programs (level buffers, slot gathers, child writes) are
shaped from the call shape and bucketed level sizes: another seed of the same data,
or another dataset whose longest demonstration falls in the same power of two,
compiles no program of any kind; the plan counts the bucketed buffers the engine
allocates."""

import numpy as np
import pytest

import sc_jax
import sc_jax.scoring.engine as engine_mod
from sc_jax.runtime.timing import CompileMeter
from sc_jax.scoring.engine import ScoringEngine
from sc_jax.scoring.enumeration import all_contexts, sample_contexts, surrogate_pairs
from sc_jax.scoring.memory import level_peak_tokens
from sc_jax.scoring.programs import COMPILES
from sc_jax.scoring.prompts import Template, build_pieces
from sc_jax.scoring.schedule import level_lengths, level_rows, segment_slot

K = 4
WORDS = "good bad movie plot actor great terrible fine boring fun dull superb".split()
REVIEWS = Template("review:", "sentiment:", ("negative", "positive"))
NEWS = Template("headline:", "topic:", ("world", "sports", "business", "tech"))


@pytest.fixture(scope="module")
def model():
    return sc_jax.load_model("random:tiny-llama", seed=1)


def _pieces(model, template, words_per_text, seed):
    """K demonstrations then two test queries, texts of the given word counts."""
    rng = np.random.default_rng(seed)
    texts = [" ".join(rng.choice(WORDS, n)) for n in words_per_text]
    demos = list(zip(texts[:K], (np.arange(K) % len(template.labels)).tolist()))
    return build_pieces(model.tokenizer, template, demos, texts)


def _jobs():
    """One seed's jobs, as a run scores them: surrogate pairs at sizes 1 and 2, the
    test queries after the full context."""
    c1, c2, full = all_contexts(K, 1), sample_contexts(K, 2, 6, 0), np.arange(K)[None]
    test = np.stack([np.zeros(2, np.int64), K + np.arange(2)], 1)
    return {"1": (c1, surrogate_pairs(c1, K)), "2": (c2, surrogate_pairs(c2, K)), "k": (full, test)}


def _longest_segment(pieces):
    return max(len(pieces.segment(j)) for j in range(K)) + len(pieces.bos)


def test_level_buckets_bound_their_padding():
    """Level rows: at most 12.5% over the nodes, multiples of the data axis; level
    lengths: multiples of one power-of-two slot, under twice the unpadded lengths."""
    n = np.arange(1, 5000)
    for devices in (1, 2, 8):
        rows = level_rows(n, devices)
        assert (rows >= n).all() and (rows % devices == 0).all()
        assert (rows - n < np.maximum(n / 8, devices)).all()
        assert (np.diff(rows) >= 0).all()
    assert len(set(level_rows(np.arange(1025, 2049)).tolist())) == 8
    for seg in (1, 31, 33, 64, 65, 200):
        lens = level_lengths(seg, 4)
        assert lens[0] == 0 and all(b - a == segment_slot(seg) for a, b in zip(lens, lens[1:]))
        assert all(d * seg <= lens[d] < 2 * d * max(seg, 32) for d in range(1, 5))


def test_other_seeds_and_datasets_compile_nothing(model):
    """One engine (as a run keeps it) scores a seed, then another seed with other
    demonstrations (another longest one, in the same power of two), then another
    dataset (another template, four classes, longer texts in that power of two):
    the later two compile no program of any kind, and score what a fresh engine
    scores."""
    seeds = [_pieces(model, REVIEWS, [4, 6, 3, 7, 5, 6], 0),
             _pieces(model, REVIEWS, [7, 5, 9, 4, 2, 9], 1),
             _pieces(model, NEWS, [12, 10, 14, 9, 11, 13], 2)]
    longest = [_longest_segment(p) for p in seeds]
    assert len(set(longest)) == 3 and len({segment_slot(s) for s in longest}) == 1, longest
    eng = ScoringEngine(model, progress=False)
    eng.score_jobs(seeds[0], _jobs())
    for pieces in seeds[1:]:
        before = dict(COMPILES)
        with CompileMeter() as meter:
            result = eng.score_jobs(pieces, _jobs())
        assert meter.count() == (0, 0) and dict(COMPILES) == before, dict(meter.compiled)
        assert result.stats.compiled == 0
        got = result.scores
        fresh = ScoringEngine(model, progress=False).score_jobs(pieces, _jobs()).scores
        for tag in got:
            np.testing.assert_allclose(got[tag], fresh[tag], atol=1e-5)


def test_plan_counts_the_level_buffers_the_engine_allocates(model, monkeypatch):
    """Chunks cut where a level of 17 nodes fits but its bucketed 18 rows would not:
    every buffer the engine allocates is a shape the plan counted, within
    ``max_cache_tokens``, and a level with its parent within the planned peak; the
    scores equal an unchunked engine's."""
    k = 5
    pieces = build_pieces(model.tokenizer, REVIEWS,
                          [(" ".join(WORDS[j:j + 3]), j % 2) for j in range(k)],
                          [" ".join(WORDS[j:j + 3]) for j in range(k)])
    ctx = all_contexts(k, 2)  # 5 nodes at depth 1, 20 at depth 2
    pairs = surrogate_pairs(ctx, k)
    whole = ScoringEngine(model, progress=False)
    ref = whole.score(pieces, ctx, pairs)
    length = whole.plan(pieces, [(ctx, pairs)], "first_token").schedule.level_len[2]
    assert level_rows(17) == 18 and level_rows(16) == 16
    eng = ScoringEngine(model, max_cache_tokens=17 * length, progress=False)
    allocated = []
    real = engine_mod.empty_level

    def record(config, rows, length, dtype, sharding=None):
        allocated.append((rows, length))
        return real(config, rows, length, dtype, sharding)

    monkeypatch.setattr(engine_mod, "empty_level", record)
    got = eng.score(pieces, ctx, pairs)
    np.testing.assert_allclose(got, ref, atol=1e-5)
    sched = eng.plan(pieces, [(ctx, pairs)], "first_token").schedule
    planned = [sched.level_shape(ci, d) for ci, ch in enumerate(sched.trie)
               for d in range(1, ch.depth + 1)]
    assert allocated == planned and [ch.nodes(2) for ch in sched.trie] == [16, 4]
    assert max(r * n for r, n in allocated) <= 17 * length
    alive = [a[0] * a[1] + b[0] * b[1] for a, b in zip(allocated, allocated[1:]) if b[1] > a[1]]
    assert max(alive) <= level_peak_tokens(sched)
