"""The prefix-shared packed engine and flat batches against the plain one-prompt-at-a-time
path (float32, max |label log-prob difference| <= 1e-4), both scoring modes, several
chunkings and call shapes, several jobs in one call; compile counting; bad input."""

import numpy as np
import pytest

import sc_jax
from sc_jax.scoring.enumeration import all_contexts, sample_contexts, surrogate_pairs
from sc_jax.scoring.prompts import Template, build_pieces
from sc_jax.calibration.objective import log_odds
from sc_jax.scoring import packing
from sc_jax.scoring.engine import ScoringEngine
from sc_jax.scoring.programs import COMPILES
from sc_jax.scoring.reference import score_flat, score_plain
from sc_jax.runtime.sharding import make_mesh

TOL = 1e-4
WORDS = "good bad movie plot actor great terrible fine boring fun dull superb the a of".split()
# Multi-token labels with distinct first tokens (ByteTokenizer: " x" is one token).
TEMPLATE = Template("review:", "sentiment:", ("negative", "positive", "mixed"))


def _texts(rng, n, lo=1, hi=7):
    return [" ".join(rng.choice(WORDS, int(rng.integers(lo, hi)))) for _ in range(n)]


@pytest.fixture(scope="module")
def model():
    return sc_jax.load_model("random:tiny-llama", seed=1)


@pytest.fixture(scope="module")
def setup(model):
    rng = np.random.default_rng(0)
    k = 5
    demos = list(zip(_texts(rng, k), rng.integers(0, 3, k).tolist()))
    tests = _texts(rng, 3)
    pieces = build_pieces(model.tokenizer, TEMPLATE, demos, [t for t, _ in demos] + tests)
    return k, pieces


def _subsample(pairs, n, seed=0):
    rng = np.random.default_rng(seed)
    return pairs[np.sort(rng.choice(len(pairs), size=min(n, len(pairs)), replace=False))]


def _scored(eng, pieces, ctx, pairs):
    """One job through ``eng``: its scores ``[N, n]`` and the call's stats."""
    result = eng.score_jobs(pieces, {"job": (ctx, pairs)})
    return result.scores["job"], result.stats


@pytest.mark.parametrize("mode", ["first_token", "sequence"])
@pytest.mark.parametrize("i", [1, 3])
def test_engine_equals_plain(model, setup, mode, i):
    k, pieces = setup
    ctx = all_contexts(k, i)
    pairs = surrogate_pairs(ctx, k)
    # The plain path is slow (one compile-free call per prompt, per label step in
    # sequence mode): compare on a random subset of pairs, engine on all of them.
    sub = _subsample(pairs, 24 if mode == "first_token" else 8, seed=i)
    plain = score_plain(model, pieces, ctx, sub, mode)
    lookup = {(int(c), int(q)): r for r, (c, q) in enumerate(pairs)}
    rows = [lookup[(int(c), int(q))] for c, q in sub]
    # Chunkings that cut the trie in different places (one context per chunk at
    # 100 cached tokens), calls of one row and of many.
    # Each configuration runs in two of the four cases (every configuration compiles
    # its own shapes; CI's budget).
    configs = [(1 << 18, 1 << 14), (100, 128), (300, 700)]
    for max_cache, max_tok in [c for j, c in enumerate(configs)
                               if (j + i + (mode == "sequence")) % 3 != 0]:
        eng = ScoringEngine(model, max_cache_tokens=max_cache, max_tokens_per_batch=max_tok,
                            progress=False)
        got = eng.score(pieces, ctx, pairs, mode)
        assert got.shape == (len(pairs), 3)
        assert np.isfinite(got).all()
        err = np.abs(got[rows] - plain).max()
        assert err <= TOL, (max_cache, max_tok, err)
        np.testing.assert_allclose(np.exp(got).sum(-1), 1.0, atol=1e-5)
    flat = score_flat(model, pieces, ctx, pairs, mode, max_tokens_per_batch=512)
    assert np.abs(flat[rows] - plain).max() <= TOL


def test_attention_paths_agree_and_cudnn_falls_back(model, setup):
    """The engine's packed calls through each attention path (sc_jax.models.attention, the
    Pallas kernel interpreted) give the same scores; on a backend without cuDNN (this
    CPU) asking for it costs one warning and the block-sparse path, not a failed run."""
    k, pieces = setup
    ctx = all_contexts(k, 2)
    pairs = surrogate_pairs(ctx, k)
    dense = ScoringEngine(model, attention="dense", progress=False)
    blocked = ScoringEngine(model, attention="blocked", progress=False)
    (a, dense_st), (b, blocked_st) = _scored(dense, pieces, ctx, pairs), _scored(blocked, pieces, ctx, pairs)
    assert (dense_st.attention, blocked_st.attention) == ("dense", "blocked")
    assert np.abs(a - b).max() <= 1e-5
    pallas = ScoringEngine(model, attention="pallas", progress=False)  # interpreted on a CPU
    p, pallas_st = _scored(pallas, pieces, ctx, pairs)
    assert np.abs(p - b).max() <= 1e-5
    assert pallas_st.attention == "pallas"  # not a silent fallback
    cudnn = ScoringEngine(model, attention="cudnn", progress=False)
    with pytest.warns(RuntimeWarning, match="'cudnn' does not compile or run here"):
        c, cudnn_st = _scored(cudnn, pieces, ctx, pairs)
    assert cudnn_st.attention == "blocked" and np.abs(c - b).max() <= 1e-5
    with pytest.raises(ValueError, match="attention must be"):
        ScoringEngine(model, attention="flash")


def test_mesh_given_as_text(setup):
    """load_model(mesh="data=2") is the mesh `sc-jax --mesh data=2` makes (it raised
    AttributeError on the string: issue 55, case 13); any other object is refused."""
    k, pieces = setup
    ctx = all_contexts(k, 1)
    pairs = surrogate_pairs(ctx, k)
    one = sc_jax.load_model("random:tiny-llama", seed=1)
    two = sc_jax.load_model("random:tiny-llama", seed=1, mesh="data=2")
    assert two.n_devices == 2
    a = ScoringEngine(one, progress=False).score(pieces, ctx, pairs)
    b = ScoringEngine(two, progress=False).score(pieces, ctx, pairs)
    assert np.abs(a - b).max() <= TOL
    with pytest.raises(TypeError, match="mesh must be a jax.sharding.Mesh"):
        sc_jax.load_model("random:tiny-llama", mesh=[2, 1])


def test_test_time_contexts_all_queries(model, setup):
    """Test time: sampled sub-contexts, every test query under each of them."""
    k, pieces = setup
    ctx = sample_contexts(k, 2, 4, seed=0)
    tests = np.arange(k, len(pieces.queries))
    pairs = np.array([(c, q) for c in range(len(ctx)) for q in tests])
    eng = ScoringEngine(model, progress=False)
    got, st = _scored(eng, pieces, ctx, pairs)
    plain = score_plain(model, pieces, ctx, pairs)
    assert np.abs(got - plain).max() <= TOL
    # Each sub-context is computed once: 4 leaves + their distinct first demos.
    assert st.nodes == 4 + len(set(ctx[:, 0]))


def _packed_shape(monkeypatch, W, keys):
    """Force the engine's call shape: rows of ``W`` tokens after ``keys`` cached keys
    (at least the deepest level's length)."""
    from sc_jax.scoring import memory, packing

    def shape(*, longest, deepest, mode, n_labels, max_tokens, n_devices=1, platform="default",
              fits=None):
        return packing.PackShape(max(1, max_tokens // W), W, max(keys, packing.pow2_at_least(deepest)),
                                 labels=0 if mode == "sequence" else 8)

    monkeypatch.setattr(memory, "call_shape", shape)


@pytest.mark.parametrize("W,keys", [(128, 1024), (256, 1)])
def test_several_jobs_in_one_call(model, setup, monkeypatch, W, keys):
    """Jobs of different context sizes through one trie in packed rows (several
    items and several cache slots per row): each job equals the plain path, and
    each is handed over when its last query is scored, smaller contexts first."""
    k, pieces = setup
    _packed_shape(monkeypatch, W, keys)
    jobs = {}
    for i in (1, 2, 3):
        ctx = all_contexts(k, i)
        jobs[f"surrogate{i}"] = (ctx, surrogate_pairs(ctx, k))
    tests = np.arange(k, len(pieces.queries))
    full = np.arange(k)[None]
    jobs["base"] = (full, np.stack([np.zeros(len(tests), int), tests], 1))
    tctx = sample_contexts(k, 2, 3, seed=1)
    jobs["test2"] = (tctx, np.array([(c, q) for c in range(3) for q in tests]))
    order = []
    eng = ScoringEngine(model, max_tokens_per_batch=4 * W, progress=False)
    result = eng.score_jobs(pieces, jobs, on_done=lambda tag, arr: order.append(tag))
    got, st = result.scores, result.stats
    assert set(got) == set(jobs) and sorted(order) == sorted(jobs)
    assert order.index("surrogate1") < order.index("surrogate3") < order.index("base")
    for tag, (ctx, pairs) in jobs.items():
        sub = _subsample(pairs, 6, seed=len(tag))
        plain = score_plain(model, pieces, ctx, sub)
        idx = [int(np.flatnonzero((pairs == p).all(1))[0]) for p in sub]
        assert np.abs(got[tag][idx] - plain).max() <= TOL, tag
    # The trie is shared: surrogate1's 5 contexts are the depth-1 nodes of all.
    assert st.nodes == 5 + 20 + 60 + 2  # base's depths 4 and 5 are its own
    assert st.shape.W == W and st.shape.cache >= keys
    assert st.programs == len(result.plan.schedule.shapes) and st.model_compiled <= st.programs
    calls = list(result.plan.schedule.calls())
    assert st.calls == len(calls) and st.padded_tokens == sum(sh.B for *_, sh in calls) * W
    assert result.plan.schedule.shape == st.shape


def test_prefix_sharing_saves_tokens(model, setup):
    k, pieces = setup
    ctx = all_contexts(k, 3)
    pairs = surrogate_pairs(ctx, k)
    eng = ScoringEngine(model, progress=False)
    _, st = _scored(eng, pieces, ctx, pairs)
    from sc_jax.scoring.costs import flat_tokens

    # Trie nodes: 5 + 20 + 60 = 85 (each computed once) vs 60 * 2 full contexts.
    assert st.nodes == 5 + 20 + 60
    assert st.tokens < 0.6 * flat_tokens(pieces, [(ctx, pairs)], "first_token")


def test_one_model_program_for_every_seed_and_dataset(model, setup):
    """The model programs' shapes come from the memory policy, not from the data: a
    first engine call compiles its model programs (one per call size) before its first
    call, and another
    engine scoring other demonstrations (other lengths), other context sizes and
    another number of classes compiles no model program; the time of each call is
    split into plan, compile, forward and host seconds that add up."""
    k, pieces = setup
    ctx = all_contexts(k, 3)
    pairs = surrogate_pairs(ctx, k)
    eng = ScoringEngine(model, max_tokens_per_batch=1024, progress=False)
    packed = COMPILES["packed"]
    _, st = _scored(eng, pieces, ctx, pairs)
    assert COMPILES["packed"] - packed <= st.programs <= packing.ROW_SIZES
    parts = st.plan_s + st.compile_s + st.forward_s + st.host_s
    assert st.forward_s > 0 and abs(parts - st.seconds) <= 0.05 * st.seconds + 0.01
    packed = COMPILES["packed"]
    rng = np.random.default_rng(99)
    texts = _texts(rng, k + 3)
    pieces2 = build_pieces(model.tokenizer, Template("input:", "label:", ("x", "y", "z", "w")),
                           list(zip(texts[:k], rng.integers(0, 4, k).tolist())), texts)
    ctx2 = all_contexts(k, 2)
    eng2 = ScoringEngine(model, max_tokens_per_batch=1024, progress=False)
    got, st2 = _scored(eng2, pieces2, ctx2, surrogate_pairs(ctx2, k))
    assert got.shape[1] == 4 and COMPILES["packed"] == packed
    assert st2.shape.program == st.shape.program and st2.model_compiled == 0


def test_log_odds():
    lp = np.log(np.array([[0.2, 0.5, 0.3]]))
    np.testing.assert_allclose(log_odds(lp), [[np.log(2.5), np.log(1.5)]])


# ------------------------------------------------------------------ bad input
def test_first_token_collision_names_labels(model):
    t = Template("review:", "sentiment:", ("very negative", "very positive"))
    pieces = build_pieces(model.tokenizer, t, [("a", 0), ("b", 1)], ["a", "b"])
    with pytest.raises(ValueError, match=r"labels \[0, 1\] share their first token"):
        ScoringEngine(model, progress=False).score(pieces, [[0]], [[0, 1]], "first_token")
    # sequence mode separates them
    out = ScoringEngine(model, progress=False).score(pieces, [[0]], [[0, 1]], "sequence")
    assert out.shape == (1, 2)


def test_prompt_longer_than_context_window(model):
    window = model.config.max_position_embeddings
    long = " ".join(["word"] * (window // 4 + 50))  # 4 byte-level tokens a word: past the window
    pieces = build_pieces(model.tokenizer, TEMPLATE, [(long, 0), ("b", 1)], ["q"])
    before = sum(COMPILES.values())
    with pytest.raises(ValueError, match=f"context window of {window}"):
        ScoringEngine(model, progress=False).score(pieces, [[0]], [[0, 0]])
    assert sum(COMPILES.values()) == before  # raised before any forward pass


def test_empty_demos_and_bad_sizes(model):
    with pytest.raises(ValueError, match="empty"):
        pieces = build_pieces(model.tokenizer, TEMPLATE, [], ["q"])
        ScoringEngine(model, progress=False).score(pieces, np.zeros((1, 1), int), [[0, 0]])
    with pytest.raises(ValueError, match="1 <= i < k"):
        all_contexts(3, 3)
    pieces = build_pieces(model.tokenizer, TEMPLATE, [("a", 0), ("b", 1)], ["q"])
    with pytest.raises(ValueError, match="exceeds"):
        ScoringEngine(model, progress=False).score(pieces, [[0, 1, 0]], [[0, 0]])
    with pytest.raises(ValueError, match="mode"):
        ScoringEngine(model, progress=False).score(pieces, [[0]], [[0, 0]], "mean")
    with pytest.raises(ValueError, match="label 7"):
        build_pieces(model.tokenizer, TEMPLATE, [("a", 7)], ["q"])


def test_float_indices_and_contexts_outside_the_demonstrations_are_refused(model):
    """Issue 64, case 3: float pair indices were truncated ([[0.7, 3.2]] scored pair
    (0, 3)), and surrogate_pairs took contexts naming demonstration k or more."""
    pieces = build_pieces(model.tokenizer, TEMPLATE, [("a", 0), ("b", 1), ("c", 2)], ["q"])
    before = sum(COMPILES.values())
    with pytest.raises(ValueError, match=r"pairs must hold integer indices, got dtype float64"):
        ScoringEngine(model, progress=False).score(pieces, [[0]], [[0.7, 3.2]])
    with pytest.raises(ValueError, match=r"contexts must hold integer indices"):
        ScoringEngine(model, progress=False).score(pieces, [[0.0]], [[0, 1]])
    assert sum(COMPILES.values()) == before
    with pytest.raises(ValueError, match=r"contexts name demonstration 5, outside \[0, k=3\)"):
        surrogate_pairs(np.array([[0], [5]]), 3)
    with pytest.raises(ValueError, match=r"contexts name demonstration -1"):
        surrogate_pairs(np.array([[-1]]), 3)
    with pytest.raises(ValueError, match="distinct"):
        surrogate_pairs(np.array([[1, 1]]), 3)
    with pytest.raises(ValueError, match="integer"):
        surrogate_pairs(np.array([[1.5]]), 3)
    assert surrogate_pairs(np.array([[2]]), 3).tolist() == [[0, 0], [0, 1]]


def test_mesh_of_six_devices(setup):
    """A mesh size that is not a power of two: batches are padded to a multiple of it."""
    k, pieces = setup
    six = sc_jax.load_model("random:tiny-llama", seed=1, mesh=make_mesh(6))
    one = sc_jax.load_model("random:tiny-llama", seed=1)
    ctx = all_contexts(k, 1)
    pairs = surrogate_pairs(ctx, k)
    a = ScoringEngine(one, progress=False).score(pieces, ctx, pairs)
    b = ScoringEngine(six, max_tokens_per_batch=300, progress=False).score(pieces, ctx, pairs)
    c = score_flat(six, pieces, ctx, pairs, max_tokens_per_batch=300)
    assert np.abs(a - b).max() <= TOL and np.abs(a - c).max() <= TOL


def test_engine_with_sliding_window_shorter_than_prompts():
    """tiny-mistral has a 64-token window; these prompts are longer, so cached
    prefixes must mask keys that fall out of the window exactly as the plain path."""
    model = sc_jax.load_model("random:tiny-mistral", seed=2)
    assert model.config.min_window == 64
    rng = np.random.default_rng(4)
    k = 4
    demos = list(zip(_texts(rng, k, 4, 8), rng.integers(0, 3, k).tolist()))
    pieces = build_pieces(model.tokenizer, TEMPLATE, demos, [t for t, _ in demos])
    ctx = all_contexts(k, 2)
    pairs = _subsample(surrogate_pairs(ctx, k), 10)
    assert max(len(pieces.prompt(ctx[c], q)) for c, q in pairs) > 64
    got = ScoringEngine(model, progress=False).score(pieces, ctx, pairs)
    assert np.abs(got - score_plain(model, pieces, ctx, pairs)).max() <= TOL


# Data-parallel alone is covered by test_mesh_of_six_devices (and test_model.py).
@pytest.mark.parametrize("data,model_axis,modes", [(1, 8, ("first_token",)),
                                                  (2, 4, ("first_token", "sequence"))])
def test_two_dimensional_meshes_equal_one_device(data, model_axis, modes):
    """Model-parallel and mixed meshes on 8 simulated devices give one device's label
    log-probs (engine and flat path; both label modes on the mixed
    mesh). tiny-llama-8h has 8 heads, 4 key/value heads, MLP 128 and vocabulary 640,
    so the model axis really splits them (key/value heads stay replicated on a model
    axis of 8, which does not divide 4)."""
    from sc_jax.runtime.sharding import spec

    rng = np.random.default_rng(7)
    one = sc_jax.load_model("random:tiny-llama-8h", seed=3)
    mesh = make_mesh(data, model=model_axis)
    many = sc_jax.load_model("random:tiny-llama-8h", seed=3, mesh=mesh)
    wq = many.module.layers.wq[...].sharding.spec
    assert wq == spec(mesh, ("layers", "embed", "heads", "head_dim"), (2, 64, 8, 8))
    assert ("model" in str(wq)) == (model_axis > 1)
    k = 3
    demos = list(zip(_texts(rng, k), rng.integers(0, 3, k).tolist()))
    pieces = build_pieces(one.tokenizer, TEMPLATE, demos, [t for t, _ in demos] + _texts(rng, 2))
    ctx = all_contexts(k, 2)
    pairs = np.concatenate([surrogate_pairs(ctx, k), [[0, 3], [1, 4]]])
    for mode in modes:
        a = ScoringEngine(one, progress=False).score(pieces, ctx, pairs, mode)
        b = ScoringEngine(many, max_tokens_per_batch=1024, progress=False).score(pieces, ctx, pairs, mode)
        c = score_flat(many, pieces, ctx, pairs, mode, max_tokens_per_batch=1024)
        assert np.abs(a - b).max() <= TOL and np.abs(a - c).max() <= TOL, mode


def test_parse_mesh_and_single_process_distributed(monkeypatch):
    from sc_jax.runtime.multihost import initialize_distributed
    from sc_jax.runtime.sharding import parse_mesh

    assert parse_mesh("data=2,model=4") == (2, 4)
    assert parse_mesh("model=8") == (0, 8) and parse_mesh("8") == (8, 1)
    with pytest.raises(ValueError, match="data=D,model=M"):
        parse_mesh("data=2,heads=4")
    monkeypatch.delenv("SC_JAX_COORDINATOR", raising=False)
    assert initialize_distributed() is False  # one process: nothing to initialise
    monkeypatch.setenv("SC_JAX_COORDINATOR", "127.0.0.1:1234")
    monkeypatch.setenv("SC_JAX_NUM_PROCESSES", "two")
    with pytest.raises(ValueError, match="must be integers"):
        initialize_distributed()
    with pytest.raises(ValueError, match="needs 16 devices"):
        make_mesh(2, model=8)


@pytest.mark.parametrize("preset", ["tiny-qwen3", "tiny-gemma3"])
def test_later_families_engine_equals_plain(preset):
    """Qwen3 (q/k norms, head_dim 16 != hidden / heads) and Gemma 3 (windows of 8 on three
    of four layers, two rotary bases, sandwich norms, scaled embeddings and queries):
    the packed engine through each attention path equals the plain path, with prompts
    longer than Gemma's window so cached keys leave it."""
    model = sc_jax.load_model(f"random:{preset}", seed=5)
    rng = np.random.default_rng(6)
    k = 4
    demos = list(zip(_texts(rng, k, 3, 7), rng.integers(0, 3, k).tolist()))
    pieces = build_pieces(model.tokenizer, TEMPLATE, demos, [t for t, _ in demos])
    ctx = all_contexts(k, 2)
    pairs = surrogate_pairs(ctx, k)
    sub = _subsample(pairs, 8, seed=1)
    assert max(len(pieces.prompt(ctx[c], q)) for c, q in sub) > 8
    plain = score_plain(model, pieces, ctx, sub)
    # The scores must vary across prompts by far more than the tolerance, or a wrong
    # mask could hide under it.
    assert np.ptp(plain, axis=0).max() > 100 * TOL
    lookup = {(int(c), int(q)): r for r, (c, q) in enumerate(pairs)}
    rows = [lookup[(int(c), int(q))] for c, q in sub]
    for attention in ("dense", "blocked", "pallas"):
        eng = ScoringEngine(model, attention=attention, progress=False)
        got, st = _scored(eng, pieces, ctx, pairs)
        assert st.attention == attention
        assert np.abs(got[rows] - plain).max() <= TOL, attention
