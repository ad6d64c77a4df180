"""GGUF checkpoints (llama, qwen2 and gemma3 architectures), read into Hugging Face layout.

A GGUF file (llama.cpp's format) holds everything a model directory holds, in other
clothes: the config as `<arch>.*` metadata keys, the tokenizer as `tokenizer.ggml.*`
arrays, and the weights, usually block-quantised. `read_gguf` turns one into

* an HF `config.json` dict (`LlamaForCausalLM`, `Qwen2ForCausalLM` or
  `Gemma3ForCausalLM` with model_type "gemma3_text"),
* float32 NumPy weights under HF names, in HF layout `[out_features, in_features]`,
  dequantised one tensor at a time when they are read,
* a `tokenizers.Tokenizer` equal to the one the model was trained with,

and `write_hf_dir` saves that as a model directory that transformers, and our own
safetensors loader, read like any other.

What differs from an HF checkpoint, and who undoes it:

1. Names. `blk.3.attn_q.weight` is `model.layers.3.self_attn.q_proj.weight`: the
   `gguf` package's own `TensorNameMap` (the table llama.cpp's converter writes with)
   maps them.
2. Shapes. GGUF lists a tensor's dimensions fastest-first (`ne[0]` is the row length),
   the reverse of NumPy's order. The header reader here turns them around.
3. Quantisation. F16, BF16, Q8_0, Q4_0/1, Q5_0/1 and the K-quants are expanded to
   float32 with `gguf.quants.dequantize`. Nothing is rounded afterwards: the float32
   weights are exactly the values llama.cpp computes with.
4. Rotary layout (llama only). llama.cpp rotates adjacent pairs `(x[2j], x[2j+1])` of
   each head, HF Llama rotates the halves `(x[j], x[j + head_dim/2])`, so llama.cpp's
   converter reorders the rows of `q_proj` and `k_proj` within every head
   (`_unpermute_rotary_rows` inverts it). Qwen2 files use the half rotation (llama.cpp's
   NEOX rope) and are stored unpermuted, and so are Gemma 3's.
5. Norm weights (gemma3 only). Gemma's RMSNorm scales by `1 + w` and HF stores w;
   llama.cpp's converter stores `w + 1` for every `*norm.weight` (q/k norms included),
   so the reader subtracts 1 again, in float32 as transformers' GGUF loader does.
6. Llama 3.1/3.2 rope scaling (llama only). HF states it as `rope_scaling`
   {"rope_type": "llama3", ...}; llama.cpp's converter writes instead the tensor
   `rope_freqs.weight`, one divisor per rotary frequency. `_llama3_rope_scaling` finds
   the known setting with those divisors and puts it in the config; the tensor itself
   is not among the HF weights.
7. What the metadata leaves out (gemma3). llama.cpp hard-codes, per architecture, what
   HF's config.json states: every 6th layer global and the others sliding, a rotary base
   of 10000 on the sliding layers, the query scale `head_dim ** -0.5` (27B: `(hidden /
   heads) ** -0.5`), the tanh-approximated GELU. `_gemma3_fields` writes those into the
   config; a file that does state them (`sliding_window_pattern`, `rope.freq_base_swa`)
   is read instead.
8. The tokenizer. transformers builds it from the metadata
   (`convert_gguf_tokenizer`, which needs no torch); `_build_tokenizer` corrects it
   where it differs from the model's own tokenizer (see there).

Every check that can fail (magic, version, truncation, architecture, unsupported
features, missing, unexpected or misshapen tensors, quantisation types, tokenizer
metadata) runs on the header alone, before any weight is dequantised.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import json
import logging
import math
import mmap
import os
import shutil
import struct
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import tokenizers
from safetensors.numpy import save_file
from tokenizers import normalizers, pre_tokenizers, processors

from sc_jax.models.checkpoint import check_keys, key_map
from sc_jax.models.config import ModelConfig, rope_inv_freq


@contextlib.contextmanager
def _without_torch_notice():
    """transformers' notice, logged as it is imported without PyTorch, that "Models
    won't be available", left out: only its GGUF tokenizer conversion is used here,
    which needs no PyTorch. Every other record of transformers passes."""
    def keep(record: logging.LogRecord) -> bool:
        return "Models won't be available" not in record.getMessage()

    logger = logging.getLogger("transformers")
    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)


try:
    import gguf
    from gguf import quants as _quants
    with _without_torch_notice():
        from transformers.integrations.gguf.gguf_tokenizer_mapping import (
            GGUF_PRE_TOKENIZER_SPLITS,
            GGUF_TOKENIZER_MAPPING,
            convert_gguf_tokenizer,
        )
except ImportError as error:  # pragma: no cover - depends on the installation
    raise ImportError(
        f"Reading .gguf files needs the `gguf` and `transformers` packages ({error.name} is "
        "missing): pip install 'sc-jax[gguf]'"
    ) from error

__all__ = ["GGUFCheckpoint", "GGUFError", "SUPPORTED_ARCHITECTURES", "read_gguf", "write_hf_dir"]

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "gemma3")
_HF_CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "gemma3": "Gemma3ForCausalLM"}
# HF model_type of each architecture: a gemma3 GGUF holds the text tower only.
_HF_MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "gemma3": "gemma3_text"}

# `tokenizer.ggml.pre` values whose pre-tokenizer transformers' GGUF conversion gets
# wrong, with the fix. "smollm" and "starcoder" isolate every numeric character before
# the GPT-2 split (llama.cpp's regex `\p{N}`; SmolLM2's own tokenizer.json has
# `Digits(individual_digits=True)`); transformers 5.x does not know these names and
# falls back to the plain GPT-2 split (tests/models/test_gguf.py pins where that changes the
# tokens).
_DIGIT_SPLIT_PRE_TYPES = ("smollm", "starcoder")
SUPPORTED_PRE_TOKENIZERS = ("gpt2", *_DIGIT_SPLIT_PRE_TYPES, *sorted(GGUF_PRE_TOKENIZER_SPLITS))
# llama.cpp's LLAMA3 pre-tokenizer group: a pre-token that is itself in the vocabulary is
# one token, merges or not (`ignore_merges`, also in Llama 3's own tokenizer.json), and
# BOS is added unless the file's `add_bos_token` says otherwise (llama-vocab.cpp).
_LLAMA3_PRE_TYPES = ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                     "midm-2.0", "lfm2", "jina-v5-nano")
# SentencePiece vocabularies (tokenizer.ggml.model "llama") are built only for these
# architectures, whose builder transformers has checked against the model's own tokenizer.
_SENTENCEPIECE_ARCHITECTURES = ("gemma3",)


class GGUFError(ValueError):
    """A .gguf file that cannot be read, or that describes a model we do not support."""


@dataclasses.dataclass(frozen=True)
class GGUFCheckpoint:
    """A GGUF checkpoint in Hugging Face terms.

    Attributes:
      config: HF `config.json` contents (`LlamaForCausalLM` or `Qwen2ForCausalLM`).
      tensors: HF parameter name -> float32 array in HF layout, e.g.
        `model.layers.{i}.self_attn.q_proj.weight` is `[num_heads * head_dim, hidden]`
        and `model.embed_tokens.weight` is `[vocab, hidden]`. `lm_head.weight` is present
        only when the embeddings are untied. A read-only mapping over the open file:
        every access dequantises that one tensor afresh, so a loop over it holds one
        float tensor at a time.
      tokenizer: the tokenizer built from the file's metadata; it adds BOS/EOS only
        where the file says so (SmolLM2, Qwen2.5: neither).
      tokenizer_config: HF `tokenizer_config.json` contents (special tokens as strings,
        `add_bos_token`, `chat_template`, `model_max_length`).
    """

    config: dict
    tensors: Mapping[str, np.ndarray]
    tokenizer: tokenizers.Tokenizer
    tokenizer_config: dict = dataclasses.field(default_factory=dict)


# --------------------------------------------------------------------------- header


# GGUF metadata value types -> NumPy dtypes (little-endian); 8 is a string, 9 an array.
_SCALARS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9
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

    def value(self, vtype: int):
        """One metadata value: a Python scalar, a str, or a list (arrays of numbers are
        read in one NumPy call: the tokenizer's 150k token types take microseconds)."""
        if vtype in _SCALARS:
            dtype = np.dtype(_SCALARS[vtype])
            return np.frombuffer(self.buf, dtype, 1, self.take(dtype.itemsize))[0].item()
        if vtype == _STRING:
            return self.string().decode("utf-8", errors="replace")
        if vtype == _ARRAY:
            sub, count = self.u32(), self.u64()
            if sub in _SCALARS:
                dtype = np.dtype(_SCALARS[sub])
                return np.frombuffer(self.buf, dtype, count, self.take(count * dtype.itemsize)).tolist()
            return [self.value(sub) for _ in range(count)]
        raise GGUFError(
            f"{self.path} is corrupt: metadata value type {vtype} at byte {self.pos} "
            "is not a GGUF type. Fetch the file again."
        )


def _check_start(path: Path) -> int:
    """Checks that ``path`` is a GGUF v2/v3 file from its first bytes; returns its size."""
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
    return size


def _read_header(path: Path) -> tuple[dict, list[tuple], int]:
    """The metadata, the raw tensor table ``(name, ne, ggml_type, offset)`` and the
    byte offset where tensor data starts (the header's end, aligned)."""
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        cur = _Cursor(buf, path)
        cur.take(8)
        n_tensors, n_kv = cur.u64(), cur.u64()
        metadata = {}
        for _ in range(n_kv):
            key = cur.string().decode("utf-8", errors="replace")
            metadata[key] = cur.value(cur.u32())
        alignment = metadata.get("general.alignment", gguf.GGUF_DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
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
    return metadata, raw, data_start


def _tensor_infos(path: Path, raw: list[tuple], data_start: int) -> list[_TensorInfo]:
    """The tensor table in NumPy order with absolute offsets and byte sizes; checks
    that names are unique, types known and rows whole blocks."""
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
    return infos


def _check_not_cut(path: Path, infos: list[_TensorInfo], size: int) -> None:
    """Every tensor's bytes lie inside the file of ``size`` bytes."""
    cut = [t for t in infos if t.start + t.nbytes > size]
    if cut:
        need = max(t.start + t.nbytes for t in infos)
        raise GGUFError(
            f"{path} is truncated: it is {size} bytes but its tensors need {need} "
            f"({need - size} bytes missing; {len(cut)} of {len(infos)} tensors cut off, "
            f"first {cut[0].name!r}). The download or copy was interrupted: fetch the file again."
        )


def _scan_layout(path: Path) -> tuple[dict, list[_TensorInfo]]:
    """Reads the header and checks that the file is a whole GGUF v2/v3 file.

    Reads only the header (metadata and tensor table: 2 MB for SmolLM2, 6 MB for
    Qwen2.5), never tensor data. Checks: magic, version, that the header and every
    tensor's bytes lie inside the file, that tensor names are unique and their types known.
    Returns the metadata as a dict (key -> scalar, str or list) and the tensor table.
    """
    size = _check_start(path)
    metadata, raw, data_start = _read_header(path)
    infos = _tensor_infos(path, raw, data_start)
    _check_not_cut(path, infos, size)
    return metadata, infos


class _Metadata:
    """The metadata dict, with errors that name the file and the key."""

    def __init__(self, fields: dict, path: Path):
        self.fields, self.path = fields, path

    def __contains__(self, key: str) -> bool:
        return key in self.fields

    def get(self, key: str, default=None):
        return self.fields.get(key, default)

    def need(self, key: str):
        if key not in self.fields:
            raise GGUFError(
                f"{self.path} lacks the metadata key {key!r}, which a "
                f"{self.get('general.architecture')} GGUF must have. Re-convert the model "
                "with llama.cpp's convert_hf_to_gguf.py."
            )
        return self.fields[key]


# --------------------------------------------------------------------------- config


def _float32_shortest(x: float) -> float:
    # GGUF stores 1e-5 as float32 (9.99999974e-06); give back the decimal the original
    # config.json had. Both round to the same float32, so the model computes the same.
    return float(np.format_float_positional(np.float32(x), unique=True, trim="-"))


def _attention_dims(meta: _Metadata, arch: str) -> tuple[int, int, int, int]:
    """(hidden size, query heads, KV heads, key head size) from the `<arch>.*` keys."""
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
    return hidden, n_heads, n_kv, head_dim


def _unsupported_features(meta: _Metadata, arch: str, tensor_names: set[str], n_heads: int,
                          n_kv: int, head_dim: int) -> list[str]:
    """What the file uses that the model here does not have, in words (rope scaling
    types aside: :func:`_rope_scaling`)."""
    key = lambda name: f"{arch}.{name}"  # noqa: E731
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
    if _ROPE_FREQS in tensor_names and arch != "llama":
        # llama.cpp applies the per-frequency divisors only in its llama graph.
        unsupported.append(f"per-frequency rotary divisors ({_ROPE_FREQS}) in a {arch} model")
    if int(meta.get("split.count", 1)) > 1:
        unsupported.append(
            "a model split over several .gguf files (merge them with llama-gguf-split --merge)"
        )
    return unsupported


def _rope_scaling(meta: _Metadata, arch: str) -> tuple[dict | None, str | None]:
    """The HF `rope_scaling` of the file, and what is unsupported about it (or None)."""
    factor = meta.get(f"{arch}.rope.scaling.factor")
    # llama.cpp reads a file that states a factor but no type as linear scaling (its
    # default type), and a factor of 0 or 1 as no scaling at all.
    scaling_type = meta.get(f"{arch}.rope.scaling.type", "linear" if factor not in (None, 0, 1) else "none")
    if scaling_type == "linear":
        return {"rope_type": "linear", "factor": float(meta.need(f"{arch}.rope.scaling.factor"))}, None
    if scaling_type != "none":
        return None, f"rope scaling of type {scaling_type!r}"
    return None, None


# llama.cpp's converter turns HF's `rope_scaling` {"rope_type": "llama3", ...} into the
# tensor `rope_freqs.weight` (generate_extra_tensors in convert_hf_to_gguf.py): one float32
# per rotary frequency j, 1 for short wavelengths, `factor` for long ones, smoothed in
# between, and its rope computes the angle pos * theta^(-2j/d) / rope_freqs[j]. That is
# HF's unscaled inverse frequency over its llama3-scaled one, so the HF setting is
# recovered by computing those ratios for the known settings and finding the file's.
_ROPE_FREQS = "rope_freqs.weight"
_LLAMA3_ROPE_SETTINGS = {
    "Llama 3.1": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    "Llama 3.2": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
}
# float32 divisors against ones computed in float64: the converter's own float32 rounding
# stays below 1e-6 relative; a different setting differs by far more.
_ROPE_FREQS_RTOL = 1e-5


# The metadata key (after `<arch>.`) each config.json field of :func:`_hf_config` is read
# from, for the messages of :func:`_model_config`.
_GGUF_KEYS = {
    "hidden_size": "embedding_length", "num_attention_heads": "attention.head_count",
    "num_key_value_heads": "attention.head_count_kv", "head_dim": "attention.key_length",
    "num_hidden_layers": "block_count", "intermediate_size": "feed_forward_length",
    "vocab_size": "vocab_size", "rms_norm_eps": "attention.layer_norm_rms_epsilon",
    "rope_theta": "rope.freq_base", "rope_scaling.factor": "rope.scaling.factor",
    "max_position_embeddings": "context_length", "sliding_window": "attention.sliding_window",
    "rope_local_base_freq": "rope.freq_base_swa",
}


def _model_config(path: Path, arch: str, config: dict) -> ModelConfig:
    """``config`` (built from the file's metadata) as a checked :class:`ModelConfig`; a
    refused value names the file and the metadata key it came from."""
    try:
        return ModelConfig.from_hf(config)
    except ValueError as e:
        key = _GGUF_KEYS.get(getattr(e, "field", None))
        where = f" (metadata key {arch}.{key})" if key else ""
        raise GGUFError(f"{path}{where}: {e}") from None


def _llama3_rope_divisors(config: dict, scaling: dict) -> np.ndarray:
    """llama.cpp's `rope_freqs` for the HF `config` with llama3 `scaling` (float64)."""
    model = ModelConfig.from_hf(config | {"rope_scaling": scaling})
    plain = ModelConfig.from_hf(config | {"rope_scaling": None})
    return rope_inv_freq(plain) / rope_inv_freq(model)


def _llama3_rope_scaling(meta: _Metadata, config: dict, info: _TensorInfo) -> dict:
    """The HF llama3 `rope_scaling` whose divisors are the file's `rope_freqs.weight`
    (``info``), which this reads: a few hundred bytes, before any weight.

    Tried in order: the file's own `llama.rope.scaling.factor` and
    `.original_context_length`, where it states either (llama.cpp's converter writes
    neither for llama3; the rest as in Llama 3.1), then Llama 3.1's and 3.2's settings.
    """
    if info.shape != (config["head_dim"] // 2,):
        raise GGUFError(
            f"{meta.path} is corrupt: {_ROPE_FREQS} has shape {info.shape}, not "
            f"({config['head_dim'] // 2},) (one divisor per rotary frequency)."
        )
    _check_dequantizable(meta.path, [info])
    divisors = _Tensors(meta.path, {_ROPE_FREQS: info}, {})[_ROPE_FREQS]
    candidates = {}
    factor = meta.get("llama.rope.scaling.factor")
    context = meta.get("llama.rope.scaling.original_context_length")
    if factor is not None or context is not None:
        stated = dict(_LLAMA3_ROPE_SETTINGS["Llama 3.1"])
        if factor is not None:
            stated["factor"] = _float32_shortest(factor)
        if context is not None:
            stated["original_max_position_embeddings"] = int(context)
        candidates["the file's llama.rope.scaling.* keys"] = stated
    candidates |= _LLAMA3_ROPE_SETTINGS
    errors = {}
    for name, scaling in candidates.items():
        want = _llama3_rope_divisors(config, scaling).astype(np.float32)
        error = float(np.max(np.abs(divisors - want) / want))
        errors[name] = error if math.isfinite(error) else math.inf  # NaN in a corrupt file
        if errors[name] <= _ROPE_FREQS_RTOL:
            return dict(scaling)
    closest = min(errors, key=errors.get)
    raise GGUFError(
        f"{meta.path}: {_ROPE_FREQS} matches no known Llama 3 rope scaling (closest: "
        f"{closest}, {candidates[closest]}, max relative difference {errors[closest]:.2g} > "
        f"{_ROPE_FREQS_RTOL:g}); the GGUF reader cannot state its rotations as an HF config."
    )


def _vocab_size(meta: _Metadata, arch: str) -> int:
    n_tokens = len(meta.get("tokenizer.ggml.tokens", ()))
    vocab_size = int(meta.get(f"{arch}.vocab_size", n_tokens or 0))
    if not vocab_size:
        raise GGUFError(
            f"{meta.path} states no vocabulary size ({arch}.vocab_size or tokenizer.ggml.tokens)."
        )
    return vocab_size


def _special_token_ids(meta: _Metadata) -> dict[str, int]:
    """`bos_token_id`, `eos_token_id`, `pad_token_id`: those the file states."""
    ids = {}
    for name in ("bos", "eos", "pad"):
        token_id = meta.get(f"tokenizer.ggml.{'padding' if name == 'pad' else name}_token_id")
        if token_id is not None:
            ids[f"{name}_token_id"] = int(token_id)
    return ids


def _gemma3_fields(meta: _Metadata, hidden: int, n_heads: int, head_dim: int, n_layers: int) -> dict:
    """The gemma3 config.json fields llama.cpp derives rather than reads (see the module
    docstring, item 7), in transformers 4.x spelling, which 5.x and ModelConfig read.

    Mirrors llama.cpp's `llama_model::load_hparams` for LLM_ARCH_GEMMA3: layer `il`
    slides when `il % pattern < pattern - 1` (pattern 6 unless the file states
    `attention.sliding_window_pattern`, an int or one bool per layer); no
    `attention.sliding_window` (or 0) means every layer is global.
    """
    key = lambda name: f"gemma3.{name}"  # noqa: E731
    window = int(meta.get(key("attention.sliding_window"), 0) or 0)
    pattern = meta.get(key("attention.sliding_window_pattern"), 6)
    if isinstance(pattern, list):
        if len(pattern) != n_layers:
            raise GGUFError(
                f"{meta.path} is corrupt: {key('attention.sliding_window_pattern')} has "
                f"{len(pattern)} entries for {n_layers} layers."
            )
        sliding = [bool(x) for x in pattern]
    else:
        pattern = int(pattern)
        sliding = [pattern == 0 or il % pattern < pattern - 1 for il in range(n_layers)]
    if not window:
        sliding = [False] * n_layers
    # llama.cpp: f_attention_scale = 1/sqrt(n_embd / n_head) for the 62-layer 27B model,
    # else 1/sqrt(head_dim); HF states the same as query_pre_attn_scalar.
    query_scalar = hidden // n_heads if n_layers == 62 else head_dim
    return {
        "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": query_scalar,
        "sliding_window": window or None,
        "layer_types": ["sliding_attention" if s else "full_attention" for s in sliding],
        "rope_local_base_freq": _float32_shortest(meta.get(key("rope.freq_base_swa"), 10000.0)),
        "attention_bias": False,
        "attn_logit_softcapping": None,
        "final_logit_softcapping": None,
        "use_bidirectional_attention": False,
    }


def _hf_config(meta: _Metadata, arch: str, infos: list[_TensorInfo]) -> dict:
    """The HF `config.json` of a llama, qwen2 or gemma3 file, from its `<arch>.*` keys
    (and a llama file's `rope_freqs.weight`: :func:`_llama3_rope_scaling`)."""
    tensor_names = {t.name for t in infos}
    key = lambda name: f"{arch}.{name}"  # noqa: E731
    hidden, n_heads, n_kv, head_dim = _attention_dims(meta, arch)
    unsupported = _unsupported_features(meta, arch, tensor_names, n_heads, n_kv, head_dim)
    rope_scaling, scaling_problem = _rope_scaling(meta, arch)
    if scaling_problem:
        unsupported.append(scaling_problem)
    if _ROPE_FREQS in tensor_names and arch == "llama" and rope_scaling is not None:
        # llama.cpp would apply both; HF's llama3 type has no linear factor on top.
        unsupported.append(f"{rope_scaling['rope_type']} rope scaling on top of {_ROPE_FREQS}")
    for softcap in ("final_logit_softcapping", "attn_logit_softcapping"):
        if meta.get(key(softcap)):
            unsupported.append(f"{softcap.replace('_', ' ')} ({key(softcap)})")
    if unsupported:
        raise GGUFError(
            f"{meta.path} uses {'; '.join(unsupported)}, which the GGUF reader does not "
            "support. Convert the model from its original Hugging Face checkpoint instead."
        )
    n_layers = int(meta.need(key("block_count")))
    config = {
        "architectures": [_HF_CLASSES[arch]],
        "model_type": _HF_MODEL_TYPES[arch],
        "vocab_size": _vocab_size(meta, arch),
        "hidden_size": hidden,
        "intermediate_size": int(meta.need(key("feed_forward_length"))),
        "num_hidden_layers": n_layers,
        "num_attention_heads": n_heads,
        "num_key_value_heads": n_kv,
        "head_dim": head_dim,
        # Gemma names it hidden_activation (_gemma3_fields).
        **({} if arch == "gemma3" else {"hidden_act": "silu"}),
        "rms_norm_eps": _float32_shortest(meta.need(key("attention.layer_norm_rms_epsilon"))),
        # llama.cpp's default when the key is absent.
        "rope_theta": _float32_shortest(meta.get(key("rope.freq_base"), 10000.0)),
        "rope_scaling": rope_scaling,
        "max_position_embeddings": int(meta.need(key("context_length"))),
        # llama.cpp writes output.weight only when it differs from the embedding.
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "torch_dtype": "float32",
    }
    if arch == "llama":
        config |= {"attention_bias": False, "mlp_bias": False}
    elif arch == "qwen2":
        # Qwen2 always has q/k/v biases (HF's class has no switch). llama.cpp's qwen2
        # graph attends over the whole context, so no sliding window either.
        config["use_sliding_window"] = False
    else:
        config |= _gemma3_fields(meta, hidden, n_heads, head_dim, n_layers)
    config |= _special_token_ids(meta)
    _model_config(meta.path, arch, config)  # every value checked before the rope_freqs read
    if _ROPE_FREQS in tensor_names and arch == "llama":
        rope_freqs = next(t for t in infos if t.name == _ROPE_FREQS)
        config["rope_scaling"] = _llama3_rope_scaling(meta, config, rope_freqs)
    return config


def _hf_names(path: Path, config: dict, infos: list[_TensorInfo], arch: str) -> dict[str, _TensorInfo]:
    """HF name -> the file's tensor, checked against the model the config describes.

    The GGUF name of each HF parameter comes from `gguf`'s `TensorNameMap`. Missing,
    unexpected and misshapen tensors are one error, raised before any data is read.
    """
    model_config = _model_config(path, arch, config)
    gguf_arch = next(a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == arch)
    name_map = gguf.get_tensor_name_map(gguf_arch, config["num_hidden_layers"])
    to_hf = {name_map.get_name(hf, try_suffixes=(".weight", ".bias")): hf for hf in key_map(model_config)}
    # Unknown GGUF tensors keep their GGUF name, so the error lists them as they are.
    by_hf = {to_hf.get(t.name, t.name): t for t in infos}
    try:
        check_keys(model_config, {name: t.shape for name, t in by_hf.items()}, source=str(path))
    except ValueError as error:
        message = str(error).replace("with this config.json", "of the size its metadata states")
        raise GGUFError(
            f"{message}. The file is incomplete or of another model family; re-convert it with "
            "llama.cpp's convert_hf_to_gguf.py."
        ) from None
    return by_hf


# --------------------------------------------------------------------------- weights


def _unpermute_rotary_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undoes llama.cpp's reordering of q/k projection rows: GGUF -> HF rotary layout.

    Within each head of `head_dim` rows, llama.cpp stores the row for output j of
    the first half and j of the second half side by side (`[a0, b0, a1, b1, ...]`) so its
    adjacent-pair rotary matches HF's half rotation. HF wants `[a0, a1, ..., b0, b1, ...]`.

    Args:
      w: `[n_heads * head_dim, in_features]` (or `[n_heads * head_dim]`) as stored.
      n_heads: query heads for q_proj, KV heads for k_proj.
    Returns:
      the same shape, in HF order.
    """
    rows = w.shape[0]
    half = rows // n_heads // 2
    return w.reshape(n_heads, half, 2, -1).transpose(0, 2, 1, 3).reshape(w.shape)


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


class _Tensors(Mapping):
    """HF name -> float32 array, dequantised from the memory-mapped file on each access.

    permute: HF name -> heads, for q/k rows stored in llama.cpp's rotary order;
    norm_shifted: HF names stored as `w + 1` (Gemma's norms), given back as w.
    """

    def __init__(self, path: Path, by_hf: dict[str, _TensorInfo], permute: dict[str, int],
                 norm_shifted: frozenset[str] = frozenset()):
        self._file = np.memmap(path, np.uint8, mode="r")
        self._sources = {hf: (info, permute.get(hf), hf in norm_shifted) for hf, info in by_hf.items()}

    def __getitem__(self, name: str) -> np.ndarray:
        info, heads, shifted = self._sources[name]
        qtype = gguf.GGMLQuantizationType(info.ggml_type)
        # Rows of raw bytes, the layout gguf.quants.dequantize takes for every type.
        raw = self._file[info.start : info.start + info.nbytes].reshape(*info.shape[:-1], -1)
        w = _quants.dequantize(raw, qtype).reshape(info.shape)
        # F32 comes back as a view of the file: copy it, so the array outlives the map.
        w = w.astype(np.float32, copy=qtype == gguf.GGMLQuantizationType.F32)
        if shifted:
            # float32 minus float32 1, as transformers' GGUF loader computes it: the same w.
            w -= np.float32(1.0)
        return _unpermute_rotary_rows(w, heads) if heads else w

    def __iter__(self):
        return iter(self._sources)

    def __len__(self) -> int:
        return len(self._sources)


# --------------------------------------------------------------------------- tokenizer


def _check_tokenizer_metadata(meta: _Metadata, arch: str) -> tuple[str, str, list]:
    """The file's tokenizer model ("gpt2" or "llama"), pre-tokenizer name and vocabulary,
    once its tokenizer metadata has passed every check."""
    path = meta.path
    kind = meta.get("tokenizer.ggml.model")
    if kind == "llama" and arch not in _SENTENCEPIECE_ARCHITECTURES:
        raise GGUFError(
            f"{path} has a SentencePiece vocabulary (tokenizer.ggml.model = 'llama', as in "
            "Llama-2 and Mistral files), which sc_jax builds from GGUF metadata only for "
            f"{', '.join(_SENTENCEPIECE_ARCHITECTURES)} files. Pass the model's Hugging Face "
            "directory (config.json, *.safetensors, tokenizer.json) instead."
        )
    if kind not in ("gpt2", "llama"):
        raise GGUFError(
            f"{path} has a {kind!r} tokenizer; only byte-level BPE ('gpt2') tokenizers, and "
            "Gemma's SentencePiece one, can be built from GGUF metadata. Use the model's "
            "Hugging Face directory instead."
        )
    pre = meta.get("tokenizer.ggml.pre")
    if kind == "gpt2" and pre not in SUPPORTED_PRE_TOKENIZERS:
        raise GGUFError(
            f"{path} asks for pre-tokenizer {pre!r}; supported: {', '.join(SUPPORTED_PRE_TOKENIZERS)}. "
            "Use the model's Hugging Face directory, whose tokenizer.json spells it out."
        )
    tokens = meta.need("tokenizer.ggml.tokens")
    if kind == "gpt2":
        meta.need("tokenizer.ggml.merges")  # Gemma's merges are rebuilt from the token order
    types = meta.get("tokenizer.ggml.token_type")
    if types is not None and len(types) != len(tokens):
        raise GGUFError(f"{path} is corrupt: {len(types)} token types for {len(tokens)} tokens.")
    return kind, pre, tokens


def _correct_pre_tokenizer(tok: tokenizers.Tokenizer, meta: _Metadata, pre: str) -> None:
    """Digit isolation for "smollm"/"starcoder", NFC for "qwen2", whole-word lookup for
    the Llama 3 group (see :func:`_build_tokenizer`)."""
    if pre in _DIGIT_SPLIT_PRE_TYPES:
        add_prefix_space = bool(meta.get("tokenizer.ggml.add_space_prefix", False))
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=True),
            ]
        )
    if pre == "qwen2":
        tok.normalizer = normalizers.NFC()
    if pre in _LLAMA3_PRE_TYPES:
        tok.model.ignore_merges = True


def _special_token(meta: _Metadata, tokens: list, name: str) -> tuple[str | None, int | None]:
    """(token, id) of `tokenizer.ggml.<name>_token_id`, or (None, None) if the file has none."""
    token_id = meta.get(f"tokenizer.ggml.{name}_token_id")
    if token_id is None:
        return None, None
    if not 0 <= token_id < len(tokens):
        raise GGUFError(
            f"{meta.path}: tokenizer.ggml.{name}_token_id = {token_id} is outside the vocabulary."
        )
    return tokens[token_id], int(token_id)


def _post_processor(bos, bos_id, eos, eos_id, add_bos: bool, add_eos: bool, byte_level: bool = True):
    """BOS/EOS added exactly where the file says; otherwise byte-level offsets, or
    nothing for a SentencePiece vocabulary (no byte-level pieces to map)."""
    if add_bos or add_eos:
        single = " ".join([f"{bos}:0"] * add_bos + ["$A:0"] + [f"{eos}:0"] * add_eos)
        specials = [(bos, bos_id)] * add_bos + [(eos, eos_id)] * (add_eos and eos != bos)
        return processors.TemplateProcessing(single=single, special_tokens=specials)
    return processors.ByteLevel(trim_offsets=False) if byte_level else None


def _without_foreign_tokens(tok: tokenizers.Tokenizer, n_tokens: int) -> tokenizers.Tokenizer:
    """`tok` without added tokens past the file's `n_tokens`.

    transformers' byte-level builder (`GPT2Tokenizer`) adds GPT-2's `<|endoftext|>` when
    the vocabulary lacks it (Llama 3's does): an id the model's embedding has no row
    for, so text containing that string would index past it.
    """
    if tok.get_vocab_size(with_added_tokens=True) <= n_tokens:
        return tok  # SmolLM2's and Qwen2.5's vocabularies: nothing to drop
    spec = json.loads(tok.to_str())
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["id"] < n_tokens]
    return tokenizers.Tokenizer.from_str(json.dumps(spec))


def _build_tokenizer(meta: _Metadata, arch: str) -> tuple[tokenizers.Tokenizer, dict]:
    """The file's tokenizer, built by transformers and corrected where it is wrong.

    transformers' `convert_gguf_tokenizer` builds the byte-level BPE (vocabulary
    respelled in GPT-2's byte alphabet, merges, control tokens kept whole, the split
    regex `tokenizer.ggml.pre` names). Two corrections, each to match the model's own
    tokenizer:

    * "smollm"/"starcoder": isolate digits before the GPT-2 split (transformers does
      not know these names and uses the plain GPT-2 split);
    * "qwen2": NFC-normalise first, as Qwen2's tokenizer.json (and transformers'
      `Qwen2Tokenizer`) does; transformers' GGUF path leaves it out, so composed and
      decomposed accents would tokenize differently from training;
    * the Llama 3 group ("llama-bpe", ...): a pre-token found whole in the vocabulary is
      one token (`ignore_merges`, as llama.cpp and Llama 3's tokenizer.json do), where
      transformers' GGUF path would apply the merges and may stop short of it.

    Gemma 3's SentencePiece vocabulary (tokenizer.ggml.model "llama") is transformers'
    `GemmaTokenizer` on the file's tokens, merges rebuilt from their order, byte
    fallback, spaces as U+2581 and no prefix space, left as transformers builds it.

    BOS/EOS are added exactly where the file's `add_bos_token`/`add_eos_token` say; a
    SentencePiece or Llama 3 group file without `add_bos_token` gets BOS (llama.cpp's
    default there: Llama 3 wants `<|begin_of_text|>`, Gemma `<bos>`).
    """
    kind, pre, tokens = _check_tokenizer_metadata(meta, arch)
    fields = {
        name: meta.get(f"tokenizer.{key}")
        for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items()
        if f"tokenizer.{key}" in meta
    }
    tok, _ = convert_gguf_tokenizer(arch, fields)
    tok = _without_foreign_tokens(tok, len(tokens))
    _correct_pre_tokenizer(tok, meta, pre)
    bos, bos_id = _special_token(meta, tokens, "bos")
    eos, eos_id = _special_token(meta, tokens, "eos")
    # Without the key llama.cpp adds BOS for SentencePiece and the Llama 3 group.
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", kind == "llama" or pre in _LLAMA3_PRE_TYPES))
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
    if (add_bos and bos is None) or (add_eos and eos is None):
        raise GGUFError(f"{meta.path} asks to add a BOS/EOS token but gives no id for it.")
    tok.post_processor = _post_processor(bos, bos_id, eos, eos_id, add_bos, add_eos, kind == "gpt2")

    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "clean_up_tokenization_spaces": False,
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": _special_token(meta, tokens, "unknown")[0],
        "pad_token": _special_token(meta, tokens, "padding")[0],
    }
    template = meta.get("tokenizer.chat_template")
    if template is not None:
        tokenizer_config["chat_template"] = template
    return tok, tokenizer_config


# --------------------------------------------------------------------------- API


def read_gguf(path: str | os.PathLike) -> GGUFCheckpoint:
    """Reads a llama, qwen2 or gemma3 .gguf file into HF config, float32 weights and tokenizer.

    All validation (file integrity, architecture, features, tensor names and shapes,
    quantisation types, tokenizer metadata) happens before the first weight is
    dequantised; the weights themselves are dequantised when `tensors` is read.

    Args:
      path: a single-file GGUF v2/v3 checkpoint with `general.architecture` "llama" or
        "qwen2" and a byte-level BPE (`gpt2`) tokenizer, or "gemma3" (either tokenizer;
        Gemma's own is SentencePiece).
    Returns:
      A `GGUFCheckpoint`; see its docstring for names, shapes and layouts.
    Raises:
      GGUFError (a ValueError): the file is not GGUF, is truncated or corrupt, is of
        another architecture, uses an unsupported feature or tokenizer, or its tensors do
        not match its metadata. FileNotFoundError: no file at `path`.
    """
    path = Path(path)
    fields, infos = _scan_layout(path)
    meta = _Metadata(fields, path)

    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise GGUFError(
            f"{path} holds a {arch!r} model (general.architecture); sc_jax reads GGUF files of "
            f"architecture {', '.join(map(repr, SUPPORTED_ARCHITECTURES))} only. For other models "
            "pass their Hugging Face directory (config.json + safetensors)."
        )
    config = _hf_config(meta, arch, infos)
    if arch == "llama":
        # HF has no such tensor: what it holds is now the config's rope_scaling.
        infos = [t for t in infos if t.name != _ROPE_FREQS]
    by_hf = _hf_names(path, config, infos, arch)
    tokenizer, tokenizer_config = _build_tokenizer(meta, arch)
    tokenizer_config["model_max_length"] = config["max_position_embeddings"]
    if tokenizer.get_vocab_size() > config["vocab_size"]:
        raise GGUFError(
            f"{path} has {tokenizer.get_vocab_size()} tokens but an embedding of only "
            f"{config['vocab_size']} rows; the file is inconsistent."
        )
    _check_dequantizable(path, infos)

    permute = {}
    if arch == "llama":
        for i in range(config["num_hidden_layers"]):
            permute[f"model.layers.{i}.self_attn.q_proj.weight"] = config["num_attention_heads"]
            permute[f"model.layers.{i}.self_attn.k_proj.weight"] = config["num_key_value_heads"]
    # llama.cpp's gemma converters add 1 to every tensor whose name ends in norm.weight.
    norm_shifted = frozenset(n for n in by_hf if arch == "gemma3" and n.endswith("norm.weight"))
    return GGUFCheckpoint(
        config=config,
        tensors=_Tensors(path, by_hf, permute, norm_shifted),
        tokenizer=tokenizer,
        tokenizer_config=tokenizer_config,
    )


def _write_synced(path: Path, write) -> None:
    write(path)
    os.chmod(path, 0o644)  # some writers create private files; a model dir is shared
    with path.open("rb") as f:
        os.fsync(f.fileno())


def _write_weights(tensors: Mapping[str, np.ndarray], out: Path, shard_bytes: int, save_file) -> None:
    """`tensors` as float32 safetensors in `out`, reading one shard's tensors at a time."""
    groups: list[dict[str, np.ndarray]] = [{}]
    files: list[Path] = []
    total = 0

    def flush():
        files.append(out / f".shard{len(files)}")
        _write_synced(files[-1], lambda p: save_file(groups[-1], str(p), metadata={"format": "pt"}))
        groups[-1] = dict.fromkeys(groups[-1])  # keep the names, drop the arrays

    for name in tensors:
        w = np.ascontiguousarray(tensors[name], dtype=np.float32)
        if groups[-1] and sum(map(np.size, groups[-1].values())) * 4 + w.nbytes > shard_bytes:
            flush()
            groups.append({})
        groups[-1][name] = w
        total += w.nbytes
    flush()
    if len(files) == 1:
        os.replace(files[0], out / "model.safetensors")
        return
    weight_map = {}
    for i, (file, names) in enumerate(zip(files, groups, strict=True), 1):
        final = f"model-{i:05d}-of-{len(files):05d}.safetensors"
        os.replace(file, out / final)
        weight_map |= dict.fromkeys(names, final)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    _write_synced(out / "model.safetensors.index.json", lambda p: p.write_text(json.dumps(index, indent=2) + "\n"))


def write_hf_dir(
    checkpoint: GGUFCheckpoint,
    out_dir: str | os.PathLike,
    *,
    overwrite: bool = False,
    shard_bytes: int = 1 << 30,
) -> Path:
    """Writes `checkpoint` as a Hugging Face model directory, atomically.

    Files: `config.json`, the float32 weights (with `format: pt` metadata so
    transformers accepts them) as `model.safetensors`, or, past `shard_bytes`, as
    `model-0000i-of-0000n.safetensors` shards with `model.safetensors.index.json`;
    `tokenizer.json`, `tokenizer_config.json`. Tensors are read (dequantised) one shard at
    a time, so peak memory is about two shards, not the whole model. Everything is
    written into a hidden temporary directory beside `out_dir` and moved into place with
    one rename, so `out_dir` either does not exist or is complete, even if the process dies.

    Args:
      checkpoint: from `read_gguf`.
      out_dir: the directory to create. Its parent is created if needed.
      overwrite: replace an existing `out_dir`; otherwise an existing one is an error.
      shard_bytes: largest shard; 1 GiB keeps SmolLM2 (540 MB) in one file and splits
        Qwen2.5-0.5B (2.5 GB) in three.
    Returns:
      `out_dir` as a Path.
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise FileExistsError(
            f"{out_dir} already exists; pass overwrite=True to replace it, or choose another path."
        )
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    try:
        _write_weights(checkpoint.tensors, tmp, shard_bytes, save_file)
        tokenizer_config = dict(checkpoint.tokenizer_config)
        tokenizer_config.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
        _write_synced(
            tmp / "config.json", lambda p: p.write_text(json.dumps(checkpoint.config, indent=2) + "\n")
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
