"""The engine's last hidden states (``hidden=True``) against the plain path: one whole
prompt per forward pass (:func:`sc_jax.scoring.reference.states_plain`), float32, in
both label modes, through several jobs of one trie; the label log-probs of the same
calls equal ``hidden=False``'s bit for bit, and the two run programs apart."""

import numpy as np
import pytest

import sc_jax
from sc_jax.scoring.engine import ScoringEngine
from sc_jax.scoring.enumeration import all_contexts, sample_contexts, surrogate_pairs
from sc_jax.scoring.programs import COMPILES
from sc_jax.scoring.prompts import build_pieces
from sc_jax.scoring.reference import states_plain
from test_scoring import TEMPLATE, _texts  # the engine tests' words and labels

# Final-norm states are O(1) per element (RMS 1 before the norm's scale); the engine
# and the plain path differ only in float32 summation order (packed rows, cached keys,
# block-sparse attention): measured 3e-7 of the largest element on this model; bound
# at 1e-5.
REL = 1e-5


@pytest.fixture(scope="module")
def model():
    return sc_jax.load_model("random:tiny-llama", seed=1)


@pytest.fixture(scope="module")
def setup(model):
    rng = np.random.default_rng(0)
    k = 4
    texts = _texts(rng, k + 3)
    demos = list(zip(texts[:k], rng.integers(0, 3, k).tolist()))
    pieces = build_pieces(model.tokenizer, TEMPLATE, demos, texts)
    tests = np.arange(k, k + 3)
    jobs = {}
    for i in (1, 2):
        ctx = all_contexts(k, i)
        jobs[f"surrogate{i}"] = (ctx, surrogate_pairs(ctx, k))
    tctx = sample_contexts(k, 2, 2, seed=1)
    jobs["test2"] = (tctx, np.array([(c, q) for c in range(2) for q in tests]))
    jobs["base"] = (np.arange(k)[None], np.stack([np.zeros(3, int), tests], 1))
    return pieces, jobs


@pytest.mark.parametrize("mode", ["first_token", "sequence"])
def test_hidden_states_equal_the_plain_path_and_leave_log_probs_unchanged(model, setup, mode):
    pieces, jobs = setup
    eng = ScoringEngine(model, max_tokens_per_batch=256, progress=False)
    plain = eng.score_jobs(pieces, jobs, mode)
    done = {}
    got = eng.score_jobs(pieces, jobs, mode, hidden=True,
                         on_done=lambda tag, lp, h: done.setdefault(tag, (lp, h)))
    assert plain.hidden is None and set(got.hidden) == set(jobs) == set(done)
    D = model.config.hidden_size
    for tag, (ctx, pairs) in jobs.items():
        assert np.array_equal(got.scores[tag], plain.scores[tag]), tag  # bit for bit
        h = got.hidden[tag]
        assert h.shape == (len(pairs), D) and h.dtype == np.float32
        assert done[tag][1] is h and done[tag][0] is got.scores[tag]
        sub = pairs if len(pairs) <= 8 else pairs[np.random.default_rng(len(tag)).choice(
            len(pairs), 8, replace=False)]
        idx = [int(np.flatnonzero((pairs == p).all(1))[0]) for p in sub]
        want = states_plain(model, pieces, ctx, sub, mode)
        err = np.abs(h[idx] - want).max() / np.abs(want).max()
        assert err <= REL, (tag, err)
    # Every pair's own state: distinct prompts, distinct states.
    assert len(np.unique(got.hidden["surrogate2"].round(4), axis=0)) == len(jobs["surrogate2"][1])


def test_hidden_is_opt_in_and_compiles_its_own_programs(model, setup):
    """A hidden call compiles model programs of its own (the plain call passes no
    ``hidden`` argument: the program it always was), and a plain call after it
    compiles nothing, returns no states and the same log-probs, bit for bit."""
    pieces, jobs = setup
    base = jobs["base"]
    # Call shapes no other test asks states of (B = 16, 8, 4 rows of 128 tokens), so
    # that what it counts is what it compiles (JAX's cache is the process's).
    eng = ScoringEngine(model, max_tokens_per_batch=2048, progress=False)
    lp = eng.score(pieces, *base)
    before = COMPILES["packed"]
    lp_h, states = eng.score(pieces, *base, hidden=True)
    assert COMPILES["packed"] - before >= 1  # its own program
    before = COMPILES["packed"]
    again = eng.score_jobs(pieces, {"base": base})
    assert COMPILES["packed"] == before and again.stats.model_compiled == 0
    assert again.hidden is None
    assert np.array_equal(again.scores["base"], lp) and np.array_equal(lp_h, lp)
    assert states.shape == (3, model.config.hidden_size)
