"""The Flax decoder against HF transformers PyTorch (float32), and every fast path
of the model against its plain path.

Tolerance: max |logit difference| <= 1e-4 (float32 on both sides; logits are O(1)).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import jax  # noqa: E402

import sc_jax  # noqa: E402
from sc_jax.runtime.sharding import make_mesh  # noqa: E402

from hf_models import CASES, VOCAB, hf_logits, make_checkpoint  # noqa: E402

TOL = 1e-4
torch.set_num_threads(2)


def _prompts(seed=0, n=5, lo=1, hi=23):
    rng = np.random.default_rng(seed)
    return [list(rng.integers(3, VOCAB, size=int(L))) for L in rng.integers(lo, hi, size=n)]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {name: (root / name, make_checkpoint(name, root / name, seed=i))
            for i, name in enumerate(CASES)}


@pytest.mark.parametrize("name", list(CASES))
def test_parity_with_transformers(checkpoints, name):
    path, hf = checkpoints[name]
    model = sc_jax.load_model(path)
    prompts = _prompts(seed=len(name), n=5, lo=1, hi=23)  # longer than the window of 5
    # Every position of every prompt, in one right-padded batch.
    tokens, valid, _ = model.pad(prompts)
    T = tokens.shape[1]
    gather = np.broadcast_to(np.arange(T, dtype=np.int32), tokens.shape)
    ours = np.asarray(model.logits_at(tokens, valid, gather))
    worst = 0.0
    for i, p in enumerate(prompts):
        ref = hf_logits(hf, p)
        worst = max(worst, float(np.abs(ours[i, :len(p)] - ref).max()))
    print(f"{name}: max |logit diff| vs transformers = {worst:.2e}")
    assert worst <= TOL
    # The plain API gives the last row of the same logits.
    last = model.last_logits(prompts)
    for i, p in enumerate(prompts):
        np.testing.assert_allclose(last[i], hf_logits(hf, p)[-1], atol=TOL, rtol=0)


def test_sharded_index_checkpoint(tmp_path):
    path = tmp_path / "sharded"
    hf = make_checkpoint("llama", path, seed=7, max_shard_size="60KB")
    assert (path / "model.safetensors.index.json").exists()
    assert len(list(path.glob("model-*.safetensors"))) > 1
    model = sc_jax.load_model(path)
    prompts = _prompts(seed=3)
    got = model.last_logits(prompts)
    ref = np.stack([hf_logits(hf, p)[-1] for p in prompts])
    assert np.abs(got - ref).max() <= TOL


def test_vocab_rows_and_positions(checkpoints):
    """Restricting to vocabulary rows equals slicing the full logits."""
    path, _ = checkpoints["qwen2"]
    model = sc_jax.load_model(path)
    prompts = _prompts(seed=11)
    rows = np.array([5, 17, 300, 42], np.int32)
    full = model.last_logits(prompts)
    sub = model.last_logits(prompts, rows=rows)
    np.testing.assert_allclose(sub, full[:, rows], atol=1e-6)


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batch_equals_alone(checkpoints, side):
    path, _ = checkpoints["mistral_window"]
    model = sc_jax.load_model(path)
    prompts = _prompts(seed=5, n=7, lo=1, hi=40)
    batch = model.last_logits(prompts, side=side)
    alone = np.stack([model.last_logits([p])[0] for p in prompts])
    assert np.abs(batch - alone).max() <= 1e-5


@pytest.mark.parametrize("name", ["llama_bias", "mistral_window"])
def test_cache_extend_equals_plain(checkpoints, name):
    """prefill(prefix) + extend(continuations) == one plain pass over prefix+continuation,
    for a shared batch-1 prefix broadcast over many rows and for per-row prefixes of
    different lengths (padded)."""
    path, _ = checkpoints[name]
    model = sc_jax.load_model(path)
    rng = np.random.default_rng(1)
    prefix = list(rng.integers(3, VOCAB, 9))
    conts = [list(rng.integers(3, VOCAB, int(n))) for n in (1, 4, 7, 2)]
    plain = model.last_logits([prefix + c for c in conts])

    # (a) one shared prefix, broadcast.
    pt, pv, _ = model.pad([prefix])
    cache = model.prefill(pt[:1], pv[:1])
    ct, cv, last = model.pad(conts)
    got, _ = model.extend(cache, ct, cv, last[:, None])
    got = np.asarray(got)[: len(conts), 0]
    assert np.abs(got - plain).max() <= 1e-5

    # (b) per-row prefixes of different lengths, then a second extension on top.
    prefixes = [prefix[:n] for n in (3, 9, 5, 1)]
    mids = [list(rng.integers(3, VOCAB, int(n))) for n in (2, 1, 3, 5)]
    plain2 = model.last_logits([p + m + c for p, m, c in zip(prefixes, mids, conts)])
    pt, pv, _ = model.pad(prefixes, side="left")
    cache = model.prefill(pt, pv)
    mt, mv, mlast = model.pad(mids)
    _, seg = model.extend(cache, mt, mv, mlast[:, None])
    from sc_jax.models.model import concat_cache

    cache2 = concat_cache(cache, seg)
    ct, cv, last = model.pad(conts)
    got2, _ = model.extend(cache2, ct, cv, last[:, None])
    assert np.abs(np.asarray(got2)[:4, 0] - plain2).max() <= 1e-5


@pytest.mark.parametrize("name,attention", [("llama_bias", "dense"), ("llama_bias", "blocked"),
                                            ("mistral_window", "dense"),
                                            ("mistral_window", "blocked"), ("qwen2", "blocked"),
                                            ("mistral_window", "pallas"), ("gemma3", "blocked"),
                                            ("qwen3", "dense")])
def test_packed_row_equals_plain(checkpoints, name, attention):
    """Packed rows (sc_jax.models.model.Packing): four segments end to end in one row, two
    after each of two cached prefixes laid side by side (slots, the shorter one
    padded), give at every position the logits of that prefix + segment run alone
    (sliding windows included: mistral_window's window of 5 is shorter than the
    prompts), through the dense, the block-sparse and the Pallas kernel's attention
    (sc_jax.models.attention; the kernel interpreted on this CPU)."""
    import jax.numpy as jnp
    from flax import nnx

    from sc_jax.models.model import KVCache, Packing

    path, _ = checkpoints[name]
    model = sc_jax.load_model(path)
    dec = nnx.merge(model.graphdef, model.state)
    rng = np.random.default_rng(2)
    prefixes = [list(rng.integers(3, VOCAB, n)) for n in (9, 4)]
    items = [(0, 3), (1, 5), (0, 6), (1, 1)]  # (slot, segment length)
    segs = [list(rng.integers(3, VOCAB, n)) for _, n in items]

    def run(tokens, positions, valid, cache=None, packing=None):
        h, kv = dec(jnp.asarray(tokens, jnp.int32)[None], jnp.asarray(positions, jnp.int32)[None],
                    jnp.asarray(valid)[None], cache, packing, attention)
        return np.asarray(dec.project(h))[0], kv

    S = 12  # each slot's cache padded to 12 tokens
    parts = []
    for p in prefixes:
        _, kv = run(p, np.arange(len(p)), np.ones(len(p), bool))
        pad = S - len(p)
        parts.append(KVCache(jnp.pad(kv.k, ((0, 0), (0, 0), (0, pad), (0, 0), (0, 0))),
                             jnp.pad(kv.v, ((0, 0), (0, 0), (0, pad), (0, 0), (0, 0))),
                             jnp.pad(kv.pos, ((0, 0), (0, pad))), jnp.pad(kv.valid, ((0, 0), (0, pad)))))
    cache = KVCache(*(jnp.concatenate([getattr(a, f) for a in parts], axis=2 if f in "kv" else 1)
                      for f in ("k", "v", "pos", "valid")))
    W = sum(n for _, n in items) + 3  # three padding tokens at the end
    tokens, positions = np.zeros(W, int), np.zeros(W, int)
    segment, slot, valid = np.full(W, -1), np.zeros(W, int), np.zeros(W, bool)
    o, spans = 0, []
    for j, ((sl, n), seg) in enumerate(zip(items, segs)):
        tokens[o:o + n], positions[o:o + n] = seg, len(prefixes[sl]) + np.arange(n)
        segment[o:o + n], slot[o:o + n], valid[o:o + n] = j, sl, True
        spans.append((o, n))
        o += n
    packing = Packing(jnp.asarray(segment, jnp.int32)[None], jnp.asarray(slot, jnp.int32)[None],
                      jnp.repeat(jnp.arange(2, dtype=jnp.int32), S)[None])
    got, _ = run(tokens, positions, valid, cache, packing)
    for (sl, n), seg, (o, _) in zip(items, segs, spans):
        full = prefixes[sl] + seg
        want, _ = run(full, np.arange(len(full)), np.ones(len(full), bool))
        assert np.abs(got[o:o + n] - want[-n:]).max() <= 1e-5


def test_sharded_over_8_devices_equals_one(checkpoints):
    assert len(jax.devices()) == 8, "conftest sets 8 simulated CPU devices"
    path, _ = checkpoints["llama"]
    one = sc_jax.load_model(path)
    eight = sc_jax.load_model(path, mesh=make_mesh(8))
    prompts = _prompts(seed=9, n=11)
    a, b = one.last_logits(prompts), eight.last_logits(prompts)
    assert np.abs(a - b).max() <= 1e-5
    # The batch really is split over the 8 devices.
    tokens, valid, last = eight.pad(prompts)
    out = eight.logits_at(tokens, valid, last[:, None])
    assert len(out.sharding.device_set) == 8


def test_bfloat16_close_to_float32(checkpoints):
    path, _ = checkpoints["llama"]
    f32 = sc_jax.load_model(path).last_logits(_prompts(seed=2))
    bf16 = sc_jax.load_model(path, dtype="bfloat16").last_logits(_prompts(seed=2))
    assert bf16.dtype == np.float32
    # bf16 has 8 mantissa bits; through 3 layers a few percent of the logit scale.
    assert np.abs(bf16 - f32).max() <= 0.05 * np.abs(f32).max()


def test_random_presets_load_and_run():
    # tiny-llama and tiny-mistral run throughout test_scoring.py; this covers qwen2.
    for name in ("tiny-qwen2",):
        m = sc_jax.load_model(f"random:{name}")
        ids = m.tokenizer.encode("review: fine\nsentiment:")
        out = m.last_logits([ids])
        assert out.shape == (1, m.config.vocab_size) and np.isfinite(out).all()


def test_llama_2_presets_have_the_published_sizes():
    # Parameter counts of the released checkpoints (safetensors headers):
    # 6,738,415,616 / 13,015,864,320 / 68,976,648,192.
    from sc_jax.models.config import preset

    assert preset("llama-2-7b").num_params() == 6_738_415_616
    assert preset("llama-2-13b").num_params() == 13_015_864_320
    assert preset("llama-2-70b").num_params() == 68_976_648_192


# ------------------------------------------------------------------ bad input
def test_bad_inputs(checkpoints, tmp_path):
    path, _ = checkpoints["llama"]
    model = sc_jax.load_model(path)
    with pytest.raises(ValueError, match="empty"):
        model.last_logits([[1, 2], []])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model.last_logits([[1, VOCAB]])
    with pytest.raises(ValueError, match="context window"):
        model.last_logits([[5] * 257])
    with pytest.raises(ValueError, match="dtype"):
        sc_jax.load_model(path, dtype="int8")
    with pytest.raises(ValueError, match="unknown preset"):
        sc_jax.load_model("random:gpt-5")
    with pytest.raises(FileNotFoundError, match="neither"):
        sc_jax.load_model(tmp_path / "nowhere")


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_malformed_config(checkpoints, tmp_path):
    src, _ = checkpoints["llama"]
    d = _copy(src, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    del cfg["hidden_size"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="hidden_size"):
        sc_jax.load_model(d)
    (d / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        sc_jax.load_model(d)
    cfg["hidden_size"] = 60
    cfg["model_type"] = "gpt2"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="unsupported model_type 'gpt2'"):
        sc_jax.load_model(d)


def test_missing_unknown_and_misshaped_tensors(checkpoints, tmp_path):
    from safetensors.numpy import load_file, save_file

    src, _ = checkpoints["llama"]
    d = _copy(src, tmp_path / "m")
    tensors = load_file(str(d / "model.safetensors"))
    t = dict(tensors)
    del t["model.layers.1.mlp.up_proj.weight"]
    save_file(t, str(d / "model.safetensors"))
    with pytest.raises(ValueError, match=r"missing tensors \(1\): model.layers.1.mlp.up_proj.weight"):
        sc_jax.load_model(d)
    t = dict(tensors)
    t["model.layers.9.extra.weight"] = np.zeros(3, np.float32)
    save_file(t, str(d / "model.safetensors"))
    with pytest.raises(ValueError, match="unknown tensors.*model.layers.9.extra.weight"):
        sc_jax.load_model(d)
    t = dict(tensors)
    t["model.norm.weight"] = np.zeros(61, np.float32)
    save_file(t, str(d / "model.safetensors"))
    with pytest.raises(ValueError, match=r"wrong shapes.*model.norm.weight: expected \(60,\)"):
        sc_jax.load_model(d)


def test_missing_tokenizer_and_bin_only(checkpoints, tmp_path):
    src, _ = checkpoints["llama"]
    d = _copy(src, tmp_path / "m")
    (d / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        sc_jax.load_model(d)
    d2 = _copy(src, tmp_path / "b")
    (d2 / "model.safetensors").rename(d2 / "pytorch_model.bin")
    with pytest.raises(ValueError, match="safetensors"):
        sc_jax.load_model(d2)


def test_duplicate_tensor_across_shards(tmp_path):
    from safetensors.numpy import load_file, save_file

    path = tmp_path / "sharded"
    make_checkpoint("llama", path, seed=7, max_shard_size="60KB")
    shards = sorted(path.glob("model-*.safetensors"))
    a = load_file(str(shards[0]))
    b = dict(load_file(str(shards[1])))
    dup = next(iter(a))
    b[dup] = a[dup]
    save_file(b, str(shards[1]))
    with pytest.raises(ValueError, match=f"tensor {dup} appears in both"):
        sc_jax.load_model(path)


def test_a_tied_config_over_a_checkpoint_with_its_own_head(tmp_path):
    """Issue 64, case 1: config.json says tie_word_embeddings but the file carries an
    lm_head.weight of its own: the embedding was used as the head (logits off by up to
    0.77 from transformers'). Now, as transformers 5: the file's head, and a warning;
    a head equal to the embedding stays tied, without a word."""
    import warnings

    from safetensors.numpy import load_file, save_file

    from hf_models import write_numpy_checkpoint

    d = write_numpy_checkpoint(tmp_path / "untied")
    ids = [[5, 17, 42, 7]]
    want = sc_jax.load_model(str(d), dtype="float32").last_logits(ids)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": True}))
    with pytest.warns(UserWarning, match="lm_head.weight differs from model.embed_tokens.weight; "
                                         "using the file's head"):
        model = sc_jax.load_model(str(d), dtype="float32")
    assert not model.config.tie_word_embeddings
    np.testing.assert_allclose(model.last_logits(ids), want, atol=1e-5)
    tensors = load_file(str(d / "model.safetensors"))
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].copy()
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        tied = sc_jax.load_model(str(d), dtype="float32")
    assert tied.config.tie_word_embeddings
