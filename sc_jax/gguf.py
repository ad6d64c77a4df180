"""Llama-architecture GGUF checkpoints, read into Hugging Face layout.

A GGUF file (llama.cpp's format) holds everything a model directory holds, in other
clothes: the config as `llama.*` metadata keys, the tokenizer as `tokenizer.ggml.*`
arrays, and the weights, usually block-quantised. `read_gguf` turns one into

* an HF `config.json` dict for `LlamaForCausalLM`,
* float32 NumPy weights under HF names, in HF layout `[out_features, in_features]`,
* a `tokenizers.Tokenizer` equal to the one the model was trained with,

and `write_hf_dir` saves that as a model directory that transformers, and our own
safetensors loader, read like any other.

Three things differ from an HF checkpoint and are undone here:

1. Shapes. GGUF lists a tensor's dimensions fastest-first (`ne[0]` is the row length),
   the reverse of NumPy's order: a `[576, 49152]` GGUF embedding is a `[49152, 576]`
   array. `gguf.GGUFReader` hands the raw blocks over already in NumPy order.
2. Quantisation. Q4_1, Q8_0, ... blocks are expanded to float32 with
   `gguf.quants.dequantize`. Nothing is re-quantised or rounded afterwards: the
   float32 weights are exactly the values llama.cpp computes with.
3. Rotary layout. llama.cpp rotates adjacent pairs `(x[2j], x[2j+1])` of each head,
   HF Llama rotates the halves `(x[j], x[j + head_dim/2])`. llama.cpp's converter
   therefore reorders the output rows of `q_proj` and `k_proj` within every head
   (`_unpermute_rotary_rows` inverts it).

Every check that can fail (magic, version, truncation, architecture, unsupported
features, missing, unexpected or misshapen tensors, tokenizer metadata) runs on the
header alone, before any weight is dequantised.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import math
import mmap
import os
import shutil
import struct
import tempfile
from pathlib import Path

import numpy as np
import tokenizers
from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors

try:
    import gguf
    from gguf import quants as _quants
except ImportError as error:  # pragma: no cover - depends on the installation
    raise ImportError(
        "Reading .gguf files needs the `gguf` package: pip install 'sc-jax[gguf]' (or pip install gguf)."
    ) from error

__all__ = ["GGUFCheckpoint", "GGUFError", "SUPPORTED_ARCHITECTURES", "read_gguf", "write_hf_dir"]

SUPPORTED_ARCHITECTURES = ("llama",)

# `tokenizer.ggml.pre` -> the pre-tokenizer llama.cpp applies for it, as a `tokenizers`
# pipeline. "smollm" and "starcoder" isolate every numeric character before the GPT-2
# split (llama.cpp's regex `\p{N}`; the models' own tokenizer.json has
# `Digits(individual_digits=True)`). transformers' GGUF loader (5.x) does not know these
# names and falls back to the plain GPT-2 split; see tests/test_gguf.py for where that
# changes the tokens.
_DIGIT_SPLIT_PRE_TYPES = ("smollm", "starcoder")
_PLAIN_GPT2_PRE_TYPES = ("gpt2",)
SUPPORTED_PRE_TOKENIZERS = _DIGIT_SPLIT_PRE_TYPES + _PLAIN_GPT2_PRE_TYPES

# llama.cpp's token types (`tokenizer.ggml.token_type`).
_TOKEN_CONTROL = 3
_TOKEN_USER_DEFINED = 4


class GGUFError(ValueError):
    """A .gguf file that cannot be read, or that describes a model we do not support."""


@dataclasses.dataclass(frozen=True)
class GGUFCheckpoint:
    """A GGUF checkpoint in Hugging Face terms.

    Attributes:
      config: HF `config.json` contents for `LlamaForCausalLM`.
      tensors: HF parameter name -> float32 array in HF layout, e.g.
        `model.layers.{i}.self_attn.q_proj.weight` is `[num_heads * head_dim, hidden]`
        and `model.embed_tokens.weight` is `[vocab, hidden]`. `lm_head.weight` is present
        only when the embeddings are untied.
      tokenizer: byte-level BPE built from the file's metadata; it adds BOS/EOS only
        where the file says so (SmolLM2: neither).
      tokenizer_config: HF `tokenizer_config.json` contents (special tokens as strings,
        `add_bos_token`, `chat_template`, `model_max_length`).
    """

    config: dict
    tensors: dict[str, np.ndarray]
    tokenizer: tokenizers.Tokenizer
    tokenizer_config: dict = dataclasses.field(default_factory=dict)


# --------------------------------------------------------------------------- header


_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY, _UINT32 = 8, 9, 4
_HEADER_BYTES = 24  # magic u32, version u32, tensor count u64, metadata count u64


@dataclasses.dataclass(frozen=True)
class _TensorInfo:
    name: str
    shape: tuple[int, ...]  # NumPy order (slowest dimension first)
    ggml_type: int
    start: int  # absolute byte offset of the data in the file
    nbytes: int


class _Cursor:
    """Little-endian reads from a buffer that turn running off its end into a clear error."""

    def __init__(self, buf, path: Path):
        self.buf, self.path, self.pos = buf, path, 0

    def take(self, n: int) -> int:
        start = self.pos
        if n < 0 or start + n > len(self.buf):
            raise GGUFError(
                f"{self.path} is truncated: its header runs past the end of the file "
                f"({len(self.buf)} bytes). The file was cut off while downloading or "
                "copying; fetch it again."
            )
        self.pos += n
        return start

    def u32(self) -> int:
        return struct.unpack_from("<I", self.buf, self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack_from("<Q", self.buf, self.take(8))[0]

    def string(self) -> bytes:
        n = self.u64()
        start = self.take(n)
        return bytes(self.buf[start : start + n])

    def skip_value(self, vtype: int) -> None:
        if vtype in _SCALAR_SIZES:
            self.take(_SCALAR_SIZES[vtype])
        elif vtype == _STRING:
            self.take(self.u64())
        elif vtype == _ARRAY:
            sub, count = self.u32(), self.u64()
            if sub in _SCALAR_SIZES:
                self.take(count * _SCALAR_SIZES[sub])
            else:
                for _ in range(count):
                    self.skip_value(sub)
        else:
            raise GGUFError(
                f"{self.path} is corrupt: metadata value type {vtype} at byte {self.pos} "
                "is not a GGUF type. Fetch the file again."
            )


def _scan_layout(path: Path) -> list[_TensorInfo]:
    """Walks the header and checks that the file is a whole GGUF v2/v3 file.

    Reads only the header (metadata and tensor table, about 2 MB for SmolLM2), never
    tensor data: the checks are magic, version, that the header and every tensor's
    bytes lie inside the file, and that tensor names are unique.
    """
    if not path.is_file():
        raise FileNotFoundError(f"No GGUF file at {path}: check the path.")
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(64)
    if head[:4] != b"GGUF":
        hint = ""
        if head.startswith(b"version https://git-lfs"):
            hint = " It is a Git LFS pointer: run `git lfs pull` to fetch the real file."
        elif head[:2] == b"PK":
            hint = " It looks like a zip archive (a wheel?): extract the .gguf from it first."
        raise GGUFError(
            f"{path} is not a GGUF file: it starts with {head[:4]!r}, not b'GGUF'.{hint} "
            "Pass a llama.cpp .gguf checkpoint."
        )
    if size < _HEADER_BYTES:
        raise GGUFError(f"{path} is truncated: {size} bytes is shorter than a GGUF header. Fetch it again.")
    version = struct.unpack_from("<I", head, 4)[0]
    if version not in (2, 3):
        raise GGUFError(
            f"{path} is GGUF version {version}; only versions 2 and 3 (little-endian) "
            "are supported. Re-convert it with a current llama.cpp."
        )

    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        cur = _Cursor(buf, path)
        cur.take(8)
        n_tensors, n_kv = cur.u64(), cur.u64()
        alignment = gguf.GGUF_DEFAULT_ALIGNMENT
        for _ in range(n_kv):
            key = cur.string()
            vtype = cur.u32()
            if key == b"general.alignment" and vtype == _UINT32:
                alignment = cur.u32()
            else:
                cur.skip_value(vtype)
        if alignment <= 0 or alignment & (alignment - 1):
            raise GGUFError(f"{path} is corrupt: general.alignment = {alignment} is not a power of two.")

        raw = []
        for _ in range(n_tensors):
            name = cur.string().decode("utf-8", errors="replace")
            n_dims = cur.u32()
            if not 1 <= n_dims <= 4:
                raise GGUFError(f"{path} is corrupt: tensor {name!r} claims {n_dims} dimensions.")
            ne = [cur.u64() for _ in range(n_dims)]
            ggml_type, offset = cur.u32(), cur.u64()
            raw.append((name, ne, ggml_type, offset))
        data_start = -(-cur.pos // alignment) * alignment

    infos, seen = [], set()
    for name, ne, ggml_type, offset in raw:
        if name in seen:
            raise GGUFError(f"{path} is corrupt: tensor {name!r} appears twice.")
        seen.add(name)
        try:
            block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ggml_type)]
        except (ValueError, KeyError):
            raise GGUFError(
                f"{path}: tensor {name!r} has ggml type {ggml_type}, which gguf "
                f"{importlib.metadata.version('gguf')} does not know. Upgrade the gguf package."
            ) from None
        n_elements = math.prod(ne)  # Python ints: a corrupt header cannot overflow
        if ne[0] % block:
            raise GGUFError(
                f"{path} is corrupt: tensor {name!r} rows of {ne[0]} do not fill blocks of {block}."
            )
        infos.append(
            _TensorInfo(
                name, tuple(reversed(ne)), ggml_type, data_start + offset, n_elements // block * type_size
            )
        )

    cut = [t for t in infos if t.start + t.nbytes > size]
    if cut:
        need = max(t.start + t.nbytes for t in infos)
        raise GGUFError(
            f"{path} is truncated: it is {size} bytes but its tensors need {need} "
            f"({need - size} bytes missing; {len(cut)} of {len(infos)} tensors cut off, "
            f"first {cut[0].name!r}). The download or copy was interrupted: fetch the file again."
        )
    return infos


class _Metadata:
    """`reader.fields` with defaults and errors that name the file and the key."""

    def __init__(self, reader: gguf.GGUFReader, path: Path):
        self.fields, self.path = reader.fields, path

    def __contains__(self, key: str) -> bool:
        return key in self.fields

    def get(self, key: str, default=None):
        field = self.fields.get(key)
        return default if field is None else field.contents()

    def need(self, key: str):
        if key not in self.fields:
            raise GGUFError(
                f"{self.path} lacks the metadata key {key!r}, which a llama GGUF must have. "
                "Re-convert the model with llama.cpp's convert_hf_to_gguf.py."
            )
        return self.fields[key].contents()


# --------------------------------------------------------------------------- config


def _float32_shortest(x: float) -> float:
    # GGUF stores 1e-5 as float32 (9.99999974e-06); give back the decimal the original
    # config.json had. Both round to the same float32, so the model computes the same.
    return float(np.format_float_positional(np.float32(x), unique=True, trim="-"))


def _llama_config(meta: _Metadata, tensor_names: set[str]) -> dict:
    arch = "llama"
    key = lambda name: f"{arch}.{name}"  # noqa: E731
    hidden = int(meta.need(key("embedding_length")))
    n_heads = int(meta.need(key("attention.head_count")))
    n_kv = meta.get(key("attention.head_count_kv"), n_heads)
    if isinstance(n_kv, list):
        raise GGUFError(f"{meta.path} has a different number of KV heads per layer; this is not supported.")
    n_kv = int(n_kv)
    if n_heads <= 0 or n_kv <= 0 or hidden <= 0:
        raise GGUFError(f"{meta.path} is corrupt: {n_heads} heads, {n_kv} KV heads, hidden size {hidden}.")
    head_dim = int(meta.get(key("attention.key_length"), hidden // n_heads))
    value_dim = int(meta.get(key("attention.value_length"), head_dim))
    rope_dim = int(meta.get(key("rope.dimension_count"), head_dim))

    unsupported = []
    if value_dim != head_dim:
        unsupported.append(f"value head size {value_dim} != key head size {head_dim}")
    if rope_dim != head_dim:
        unsupported.append(f"rotary embedding on {rope_dim} of {head_dim} head dimensions")
    if n_heads % n_kv:
        unsupported.append(f"{n_heads} query heads not a multiple of {n_kv} KV heads")
    if int(meta.get(key("expert_count"), 0)) > 0:
        unsupported.append("mixture of experts")
    if "rope_freqs.weight" in tensor_names:
        unsupported.append("Llama-3.1-style rope scaling (rope_freqs.weight)")
    if int(meta.get("split.count", 1)) > 1:
        unsupported.append(
            "a model split over several .gguf files (merge them with llama-gguf-split --merge)"
        )

    rope_scaling = None
    scaling_type = meta.get(key("rope.scaling.type"), "none")
    if scaling_type == "linear":
        rope_scaling = {"rope_type": "linear", "factor": float(meta.need(key("rope.scaling.factor")))}
    elif scaling_type != "none":
        unsupported.append(f"rope scaling of type {scaling_type!r}")
    if unsupported:
        raise GGUFError(
            f"{meta.path} uses {'; '.join(unsupported)}, which the GGUF reader does not "
            "support. Convert the model from its original Hugging Face checkpoint instead."
        )

    n_tokens = len(meta.fields["tokenizer.ggml.tokens"].data) if "tokenizer.ggml.tokens" in meta else None
    vocab_size = int(meta.get(key("vocab_size"), n_tokens or 0))
    if not vocab_size:
        raise GGUFError(
            f"{meta.path} states no vocabulary size ({arch}.vocab_size or tokenizer.ggml.tokens)."
        )

    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": int(meta.need(key("feed_forward_length"))),
        "num_hidden_layers": int(meta.need(key("block_count"))),
        "num_attention_heads": n_heads,
        "num_key_value_heads": n_kv,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": _float32_shortest(meta.need(key("attention.layer_norm_rms_epsilon"))),
        # llama.cpp's default when the key is absent.
        "rope_theta": _float32_shortest(meta.get(key("rope.freq_base"), 10000.0)),
        "rope_scaling": rope_scaling,
        "max_position_embeddings": int(meta.need(key("context_length"))),
        # llama.cpp writes output.weight only when it differs from the embedding.
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "float32",
    }
    for name in ("bos", "eos", "pad"):
        token_id = meta.get(f"tokenizer.ggml.{'padding' if name == 'pad' else name}_token_id")
        if token_id is not None:
            config[f"{name}_token_id"] = int(token_id)
    return config


def _tensor_plan(config: dict) -> dict[str, tuple[str, tuple[int, ...], int | None]]:
    """GGUF name -> (HF name, NumPy shape, heads to un-permute or None): the one key map."""
    d, f, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    hd, nq, nkv = config["head_dim"], config["num_attention_heads"], config["num_key_value_heads"]
    plan = {
        "token_embd.weight": ("model.embed_tokens.weight", (v, d), None),
        "output_norm.weight": ("model.norm.weight", (d,), None),
    }
    if not config["tie_word_embeddings"]:
        plan["output.weight"] = ("lm_head.weight", (v, d), None)
    for i in range(config["num_hidden_layers"]):
        b, h = f"blk.{i}.", f"model.layers.{i}."
        plan |= {
            b + "attn_norm.weight": (h + "input_layernorm.weight", (d,), None),
            b + "attn_q.weight": (h + "self_attn.q_proj.weight", (nq * hd, d), nq),
            b + "attn_k.weight": (h + "self_attn.k_proj.weight", (nkv * hd, d), nkv),
            b + "attn_v.weight": (h + "self_attn.v_proj.weight", (nkv * hd, d), None),
            b + "attn_output.weight": (h + "self_attn.o_proj.weight", (d, nq * hd), None),
            b + "ffn_norm.weight": (h + "post_attention_layernorm.weight", (d,), None),
            b + "ffn_gate.weight": (h + "mlp.gate_proj.weight", (f, d), None),
            b + "ffn_up.weight": (h + "mlp.up_proj.weight", (f, d), None),
            b + "ffn_down.weight": (h + "mlp.down_proj.weight", (d, f), None),
        }
    return plan


def _check_tensors(path: Path, infos: list[_TensorInfo], plan: dict) -> None:
    def names(xs):
        xs = sorted(xs)
        return ", ".join(xs[:8]) + (f" and {len(xs) - 8} more" if len(xs) > 8 else "")

    present = {t.name: t for t in infos}
    missing = plan.keys() - present.keys()
    unexpected = present.keys() - plan.keys()
    problems = []
    if missing:
        problems.append(f"{len(missing)} tensors missing ({names(missing)})")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected tensors ({names(unexpected)})")
    for name in sorted(plan.keys() & present.keys()):
        if present[name].shape != plan[name][1]:
            problems.append(f"{name} has shape {present[name].shape}, the metadata implies {plan[name][1]}")
    if problems:
        raise GGUFError(
            f"{path} does not match a llama model of the size its metadata states: "
            f"{'; '.join(problems)}. The file is incomplete or of another model family; "
            "re-convert it with llama.cpp's convert_hf_to_gguf.py."
        )


# --------------------------------------------------------------------------- weights


def _unpermute_rotary_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undoes llama.cpp's reordering of q/k projection rows: GGUF -> HF rotary layout.

    Within each head of `head_dim` rows, llama.cpp stores the row for output j of
    the first half and j of the second half side by side (`[a0, b0, a1, b1, ...]`) so its
    adjacent-pair rotary matches HF's half rotation. HF wants `[a0, a1, ..., b0, b1, ...]`.

    Args:
      w: `[n_heads * head_dim, in_features]` as stored in the GGUF.
      n_heads: query heads for q_proj, KV heads for k_proj.
    Returns:
      `[n_heads * head_dim, in_features]` in HF order.
    """
    rows, cols = w.shape
    half = rows // n_heads // 2
    return w.reshape(n_heads, half, 2, cols).transpose(0, 2, 1, 3).reshape(rows, cols)


def _dequantize(reader_tensor, info: _TensorInfo) -> np.ndarray:
    """The tensor's blocks expanded to float32, `[*info.shape]` in NumPy order."""
    qtype = gguf.GGMLQuantizationType(info.ggml_type)
    w = _quants.dequantize(reader_tensor.data, qtype).reshape(info.shape)
    if qtype == gguf.GGMLQuantizationType.F32:
        # A view of the memory-mapped file: own the memory so the checkpoint outlives
        # the reader.
        w = w.copy()
    return w.astype(np.float32, copy=False)


def _check_dequantizable(path: Path, infos: list[_TensorInfo]) -> None:
    """Fails early, on one zero block per type, for types gguf cannot expand."""
    for ggml_type in sorted({t.ggml_type for t in infos}):
        qtype = gguf.GGMLQuantizationType(ggml_type)
        _, type_size = gguf.GGML_QUANT_SIZES[qtype]
        try:
            _quants.dequantize(np.zeros((1, type_size), np.uint8), qtype)
        except NotImplementedError:
            users = [t.name for t in infos if t.ggml_type == ggml_type]
            raise GGUFError(
                f"{path}: {len(users)} tensors (first {users[0]!r}) are quantised as {qtype.name}, "
                "which the installed gguf package cannot dequantise. Upgrade gguf, or use a "
                "file quantised as F32, F16, BF16, Q8_0, Q4_0/1, Q5_0/1 or a K-quant."
            ) from None


# --------------------------------------------------------------------------- tokenizer


def _gpt2_byte_spelling() -> dict[int, str]:
    """GPT-2's printable spelling of the 256 bytes, the alphabet of byte-level BPE.

    Printable Latin-1 bytes stand for themselves; the other 68 (controls, space, NBSP,
    soft hyphen) are moved, in order, to U+0100 and up: space becomes 'Ġ'.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    moved = [b for b in range(256) if b not in printable]
    return {b: chr(b) for b in printable} | {b: chr(256 + i) for i, b in enumerate(moved)}


_BYTE_SPELLING = _gpt2_byte_spelling()
_BYTE_ALPHABET = frozenset(_BYTE_SPELLING.values())


def _respell(token: str) -> str:
    """A token written as raw text, spelled in the byte alphabet (as HF vocabularies are)."""
    if set(token) <= _BYTE_ALPHABET:
        return token
    return "".join(_BYTE_SPELLING[b] for b in token.encode("utf-8"))


def _build_tokenizer(meta: _Metadata) -> tuple[tokenizers.Tokenizer, dict]:
    """Byte-level BPE from `tokenizer.ggml.*`, pre-tokenised as `tokenizer.ggml.pre` says."""
    path = meta.path
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise GGUFError(
            f"{path} has a {kind!r} tokenizer; only byte-level BPE ('gpt2') tokenizers can be "
            "built from GGUF metadata. Use the model's Hugging Face checkpoint instead."
        )
    pre = meta.get("tokenizer.ggml.pre")
    if pre not in SUPPORTED_PRE_TOKENIZERS:
        raise GGUFError(
            f"{path} asks for pre-tokenizer {pre!r}; supported: {', '.join(SUPPORTED_PRE_TOKENIZERS)}. "
            "Use the model's Hugging Face checkpoint, whose tokenizer.json spells it out."
        )
    tokens = meta.need("tokenizer.ggml.tokens")
    merges = meta.need("tokenizer.ggml.merges")
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if len(types) != len(tokens):
        raise GGUFError(f"{path} is corrupt: {len(types)} token types for {len(tokens)} tokens.")

    added = {_TOKEN_CONTROL, _TOKEN_USER_DEFINED}
    # Control and user-defined tokens are matched whole in the raw text, so they keep
    # their spelling; normal tokens must be in the byte alphabet for BPE to reach them.
    vocab = {}
    for i, (token, kind_id) in enumerate(zip(tokens, types, strict=True)):
        vocab.setdefault(token if kind_id in added else _respell(token), i)
    pairs = []
    for merge in merges:
        left, sep, right = merge.partition(" ")
        if not sep:
            raise GGUFError(f"{path} is corrupt: merge {merge!r} is not two tokens separated by a space.")
        pairs.append((left, right))

    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
    add_prefix_space = bool(meta.get("tokenizer.ggml.add_space_prefix", False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=True)
    if pre in _DIGIT_SPLIT_PRE_TYPES:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(
        [
            AddedToken(t, special=True, normalized=False)
            for t, k in zip(tokens, types, strict=True)
            if k == _TOKEN_CONTROL
        ]
    )
    tok.add_tokens(
        [
            AddedToken(t, special=False, normalized=False)
            for t, k in zip(tokens, types, strict=True)
            if k == _TOKEN_USER_DEFINED
        ]
    )
    for i, (t, k) in enumerate(zip(tokens, types, strict=True)):
        if k in added and tok.token_to_id(t) != i:
            raise GGUFError(f"{path}: special token {t!r} (id {i}) is listed twice in the vocabulary.")

    def token_of(name: str):
        token_id = meta.get(f"tokenizer.ggml.{name}_token_id")
        if token_id is None:
            return None, None
        if not 0 <= token_id < len(tokens):
            raise GGUFError(f"{path}: tokenizer.ggml.{name}_token_id = {token_id} is outside the vocabulary.")
        return tokens[token_id], int(token_id)

    bos, bos_id = token_of("bos")
    eos, eos_id = token_of("eos")
    # GPT-2-style tokenizers add nothing unless the file says so (SmolLM2: it says no).
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
    if (add_bos and bos is None) or (add_eos and eos is None):
        raise GGUFError(f"{path} asks to add a BOS/EOS token but gives no id for it.")
    if add_bos or add_eos:
        single = " ".join([f"{bos}:0"] * add_bos + ["$A:0"] + [f"{eos}:0"] * add_eos)
        specials = [(bos, bos_id)] * add_bos + [(eos, eos_id)] * (add_eos and eos != bos)
        tok.post_processor = processors.TemplateProcessing(single=single, special_tokens=specials)
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)

    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "clean_up_tokenization_spaces": False,
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": token_of("unknown")[0],
        "pad_token": token_of("padding")[0],
    }
    template = meta.get("tokenizer.chat_template")
    if template is not None:
        tokenizer_config["chat_template"] = template
    return tok, tokenizer_config


# --------------------------------------------------------------------------- API


def read_gguf(path: str | os.PathLike) -> GGUFCheckpoint:
    """Reads a llama-architecture .gguf file into HF config, float32 weights and tokenizer.

    All validation (file integrity, architecture, features, tensor names and shapes,
    tokenizer metadata) happens before the first weight is dequantised. SmolLM2-135M
    (98 MB Q4_1) takes about 4 s on 2 CPU cores and 0.55 GB of memory.

    Args:
      path: a single-file GGUF v2/v3 checkpoint with `general.architecture = "llama"`
        and a byte-level BPE (`gpt2`) tokenizer.
    Returns:
      A `GGUFCheckpoint`; see its docstring for names, shapes and layouts.
    Raises:
      GGUFError (a ValueError): the file is not GGUF, is truncated or corrupt, is of
        another architecture, uses an unsupported feature, or its tensors do not match
        its metadata. FileNotFoundError: no file at `path`.
    """
    path = Path(path)
    infos = _scan_layout(path)
    try:
        reader = gguf.GGUFReader(path)
    except Exception as error:
        raise GGUFError(
            f"{path} is corrupt: the gguf package cannot parse it ({error}). Fetch it again."
        ) from error
    meta = _Metadata(reader, path)

    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise GGUFError(
            f"{path} holds a {arch!r} model (general.architecture); sc_jax reads GGUF files of "
            f"architecture {', '.join(map(repr, SUPPORTED_ARCHITECTURES))} only. For other models "
            "pass their Hugging Face directory (config.json + safetensors)."
        )
    names = {t.name for t in infos}
    config = _llama_config(meta, names)
    plan = _tensor_plan(config)
    _check_tensors(path, infos, plan)
    tokenizer, tokenizer_config = _build_tokenizer(meta)
    tokenizer_config["model_max_length"] = config["max_position_embeddings"]
    if tokenizer.get_vocab_size() > config["vocab_size"]:
        raise GGUFError(
            f"{path} has {tokenizer.get_vocab_size()} tokens but an embedding of only "
            f"{config['vocab_size']} rows; the file is inconsistent."
        )

    _check_dequantizable(path, infos)

    by_name = {t.name: t for t in reader.tensors}
    tensors = {}
    for info in infos:
        hf_name, _, heads = plan[info.name]
        w = _dequantize(by_name[info.name], info)
        tensors[hf_name] = _unpermute_rotary_rows(w, heads) if heads else w
    return GGUFCheckpoint(
        config=config, tensors=tensors, tokenizer=tokenizer, tokenizer_config=tokenizer_config
    )


def _write_synced(path: Path, write) -> None:
    write(path)
    os.chmod(path, 0o644)  # some writers create private files; a model dir is shared
    with path.open("rb") as f:
        os.fsync(f.fileno())


def write_hf_dir(checkpoint: GGUFCheckpoint, out_dir: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Writes `checkpoint` as a Hugging Face model directory, atomically.

    Files: `config.json`, `model.safetensors` (float32, with `format: pt` metadata so
    transformers accepts it), `tokenizer.json`, `tokenizer_config.json`. They are written
    into a hidden temporary directory beside `out_dir` and moved into place with one
    rename, so `out_dir` either does not exist or is complete, even if the process dies.

    Args:
      checkpoint: from `read_gguf`.
      out_dir: the directory to create. Its parent is created if needed.
      overwrite: replace an existing `out_dir`; otherwise an existing one is an error.
    Returns:
      `out_dir` as a Path.
    """
    from safetensors.numpy import save_file

    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise FileExistsError(
            f"{out_dir} already exists; pass overwrite=True to replace it, or choose another path."
        )
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    try:
        tensors = {name: np.ascontiguousarray(w, dtype=np.float32) for name, w in checkpoint.tensors.items()}
        tokenizer_config = dict(checkpoint.tokenizer_config)
        tokenizer_config.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
        _write_synced(
            tmp / "config.json", lambda p: p.write_text(json.dumps(checkpoint.config, indent=2) + "\n")
        )
        _write_synced(
            tmp / "model.safetensors", lambda p: save_file(tensors, str(p), metadata={"format": "pt"})
        )
        _write_synced(tmp / "tokenizer.json", lambda p: checkpoint.tokenizer.save(str(p)))
        _write_synced(
            tmp / "tokenizer_config.json",
            lambda p: p.write_text(json.dumps(tokenizer_config, indent=2) + "\n"),
        )
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; a model dir is normally shared
        if out_dir.exists():
            if not overwrite:
                raise FileExistsError(f"{out_dir} appeared while it was being written; not replacing it.")
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
            os.replace(out_dir, old / "dir")
            os.replace(tmp, out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out_dir)
        dir_fd = os.open(out_dir.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
