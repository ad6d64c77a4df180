"""The engine's programs (the token pool, and one program per call size that gathers
the call's cache, runs the model and writes its new keys) are shaped from the memory
policy alone: another seed or another dataset compiles no program of any kind, whatever
the lengths of its demonstrations (every call size is compiled before the first call);
a dataset of another call shape compiles one program per call size, nothing else; the
plan counts the pool the engine allocates, and the call sizes bound the padding."""

import numpy as np
import pytest

import sc_jax
import sc_jax.scoring.engine as engine_mod
from sc_jax.runtime.timing import CompileMeter
from sc_jax.scoring.engine import ScoringEngine
from sc_jax.scoring.enumeration import all_contexts, sample_contexts, surrogate_pairs
from sc_jax.scoring.memory import level_peak_tokens
from sc_jax.scoring.packing import ROW_SIZES, PackShape, row_ladder, split_rows
from sc_jax.scoring.programs import COMPILES
from sc_jax.scoring.prompts import Template, build_pieces
from sc_jax.scoring.reference import score_plain
from sc_jax.scoring.schedule import level_lengths, segment_slot

K = 4
WORDS = "good bad movie plot actor great terrible fine boring fun dull superb".split()
REVIEWS = Template("review:", "sentiment:", ("negative", "positive"))
NEWS = Template("headline:", "topic:", ("world", "sports", "business", "tech"))
SHORT = Template("r:", "s:", ("neg", "pos"))


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


def test_call_sizes_bound_their_padding():
    """Call sizes: B and its halvings, multiples of the data axis; a depth's rows are
    covered by calls of those sizes with less padding than the smallest size. Slot
    lengths: multiples of one power-of-two slot, under twice the unpadded lengths."""
    for B, devices in ((32, 1), (16, 2), (8, 8), (1, 1)):
        ladder = row_ladder(PackShape(B, 128, 256, R=64), devices)
        sizes = [sh.B for sh in ladder]
        assert sizes[0] == B and all(b % devices == 0 for b in sizes) and len(sizes) <= 3
        assert all(sh.R * B == ladder[0].R * sh.B or sh.R == 8 for sh in ladder)
        for rows in range(1, 5 * B + 3):
            calls = split_rows(rows, sizes)
            assert set(calls) <= set(sizes) and 0 <= sum(calls) - rows < sizes[-1]
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


def test_host_arrays_reach_the_device_without_a_program(model):
    """A call's host arrays go to the device without a program of their own (on jax
    0.10, jnp.asarray lifts each new shape through a compiled "stage" program: a dozen
    per call shape). Shapes no other test puts, so nothing is served from memory."""
    arrays = [np.arange(3 * 7 * 11, dtype=np.int32).reshape(3, 7, 11), np.zeros((5, 13), bool)]
    with CompileMeter() as meter:
        put = [model.put(arrays[0]), model.replicate(arrays[1].astype(np.int32))]
    assert meter.count() == (0, 0), dict(meter.compiled)
    assert all(np.array_equal(np.asarray(d), a) for d, a in zip(put, arrays))


def test_datasets_of_other_lengths_compile_nothing(model):
    """One engine scores a short-text task (longest demonstration under 32 tokens),
    then a longer-text one of another template and four classes (longest
    demonstration in the next power of two), then another seed of it: neither
    compiles a program of any kind (the call sizes the first one's depths did not end
    in were compiled before its first call); both score what a fresh engine scores,
    and the plain path's label log-probs (float32, 1e-4)."""
    short = _pieces(model, SHORT, [1, 2, 1, 2, 1, 2], 0)
    longer = [_pieces(model, NEWS, [5, 3, 4, 2, 3, 4], 2), _pieces(model, NEWS, [3, 5, 2, 4, 3, 2], 3)]
    slots = [segment_slot(_longest_segment(p)) for p in [short] + longer]
    assert slots[0] * 2 == slots[1] == slots[2], slots
    eng = ScoringEngine(model, progress=False)
    eng.score_jobs(short, _jobs())
    for pieces in longer:
        before = sum(COMPILES.values())
        with CompileMeter() as meter:
            result = eng.score_jobs(pieces, _jobs())
        assert sum(COMPILES.values()) == before and meter.count()[0] == 0, dict(meter.compiled)
        assert result.stats.model_compiled == 0
        fresh = ScoringEngine(model, progress=False).score_jobs(pieces, _jobs()).scores
        for tag, got in result.scores.items():
            np.testing.assert_allclose(got, fresh[tag], atol=1e-5)
    ctx, pairs = _jobs()["2"]
    plain = score_plain(model, longer[1], ctx, pairs[::4])
    assert np.abs(result.scores["2"][::4] - plain).max() <= 1e-4


def test_another_call_shape_compiles_one_program_per_call_size(model):
    """A dataset whose query is longer than the first one's rows takes a wider call
    shape: it compiles one program per call size (gather, model and write in one,
    :func:`sc_jax.scoring.programs.packed_step`) and nothing else (the pool is the
    same size), and scores the plain path's label log-probs (float32, 1e-4)."""
    eng = ScoringEngine(model, progress=False)
    first = eng.score_jobs(_pieces(model, REVIEWS, [4, 6, 3, 7, 5, 6], 0), _jobs())
    wide = _pieces(model, NEWS, [5, 3, 4, 2, 3, 40], 2)
    with CompileMeter() as meter:
        result = eng.score_jobs(wide, _jobs())
    sched = result.plan.schedule
    assert sched.shape.W > first.plan.schedule.shape.W and sched.pool == first.plan.schedule.pool
    assert len(sched.shapes) > 1, sched.shapes
    # Compiled here or read from the persistent cache of an earlier test run.
    made = meter.compiled + meter.hits
    assert set(made) == {"jit(packed_step)"} and made.total() == len(sched.shapes) <= ROW_SIZES, made
    assert result.stats.model_compiled == result.stats.compiled
    ctx, pairs = _jobs()["k"]
    assert np.abs(result.scores["k"] - score_plain(model, wide, ctx, pairs)).max() <= 1e-4


def test_plan_counts_the_pool_the_engine_allocates(model, monkeypatch):
    """Chunks cut where the trie's own tokens outgrow ``max_cache_tokens``: each call
    of the engine allocates one pool, shared by its chunks, of the tokens the plan
    counts (its cache peak); every chunk fits it; the scores equal an unchunked
    engine's, twice over one engine."""
    k = 5
    pieces = build_pieces(model.tokenizer, REVIEWS,
                          [(" ".join(WORDS[j:j + 3]), j % 2) for j in range(k)],
                          [" ".join(WORDS[j:j + 3]) for j in range(k)])
    ctx = all_contexts(k, 2)  # 5 nodes at depth 1, 20 at depth 2
    pairs = surrogate_pairs(ctx, k)
    ref = ScoringEngine(model, progress=False).score(pieces, ctx, pairs)
    pool = 1000
    eng = ScoringEngine(model, max_cache_tokens=pool, progress=False)
    allocated = []
    real = engine_mod.empty_pool

    def record(config, tokens, dtype, sharding=None):
        allocated.append(tokens)
        return real(config, tokens, dtype, sharding)

    monkeypatch.setattr(engine_mod, "empty_pool", record)
    for _ in range(2):
        np.testing.assert_allclose(eng.score(pieces, ctx, pairs), ref, atol=1e-5)
    sched = eng.plan(pieces, [(ctx, pairs)], "first_token").schedule
    assert allocated == [pool, pool] and sched.pool == pool == level_peak_tokens(sched)
    assert len(sched.trie) > 1 and all(ch.tokens <= pool for ch in sched.trie)
    assert sum(ch.tokens for ch in sched.trie) > pool
