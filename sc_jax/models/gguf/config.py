"""A GGUF file's metadata as a Hugging Face `config.json`, and its tensor names as HF's.

:func:`hf_config` builds the `config.json` dict (`LlamaForCausalLM`, `Qwen2ForCausalLM`
or `Gemma3ForCausalLM` with model_type "gemma3_text") from the `<arch>.*` keys, refusing
what the model here does not compute; :func:`hf_names` maps the tensor table onto HF's
parameter names and checks it against the model the config describes. What the
metadata states otherwise than HF, and how it is undone:

1. Names. `blk.3.attn_q.weight` is `model.layers.3.self_attn.q_proj.weight`: the
   `gguf` package's own `TensorNameMap` (the table llama.cpp's converter writes with)
   maps them.
2. Llama 3.1/3.2 rope scaling (llama only). HF states it as `rope_scaling`
   {"rope_type": "llama3", ...}; llama.cpp's converter writes instead the tensor
   `rope_freqs.weight`, one divisor per rotary frequency. `_llama3_rope_scaling` finds
   the known setting with those divisors and puts it in the config; the tensor itself
   is not among the HF weights.
3. What the metadata leaves out (gemma3). llama.cpp hard-codes, per architecture, what
   HF's config.json states: every 6th layer global and the others sliding, a rotary base
   of 10000 on the sliding layers, the query scale `head_dim ** -0.5` (27B: `(hidden /
   heads) ** -0.5`), the tanh-approximated GELU. `_gemma3_fields` writes those into the
   config; a file that does state them (`sliding_window_pattern`, `rope.freq_base_swa`)
   is read instead.
"""

from __future__ import annotations

import math
from pathlib import Path

import gguf
import numpy as np

from sc_jax.models.checkpoint import check_keys, key_map
from sc_jax.models.config import ModelConfig, rope_inv_freq
from sc_jax.models.gguf.reader import GGUFError, Metadata, Tensors, TensorInfo, check_dequantizable

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "gemma3")
_HF_CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "gemma3": "Gemma3ForCausalLM"}
# HF model_type of each architecture: a gemma3 GGUF holds the text tower only.
_HF_MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "gemma3": "gemma3_text"}



def _float32_shortest(x: float) -> float:
    # GGUF stores 1e-5 as float32 (9.99999974e-06); give back the decimal the original
    # config.json had. Both round to the same float32, so the model computes the same.
    return float(np.format_float_positional(np.float32(x), unique=True, trim="-"))


def _attention_dims(meta: Metadata, arch: str) -> tuple[int, int, int, int]:
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


def _unsupported_features(meta: Metadata, arch: str, tensor_names: set[str], n_heads: int,
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
    if ROPE_FREQS in tensor_names and arch != "llama":
        # llama.cpp applies the per-frequency divisors only in its llama graph.
        unsupported.append(f"per-frequency rotary divisors ({ROPE_FREQS}) in a {arch} model")
    if int(meta.get("split.count", 1)) > 1:
        unsupported.append(
            "a model split over several .gguf files (merge them with llama-gguf-split --merge)"
        )
    return unsupported


def _rope_scaling(meta: Metadata, arch: str) -> tuple[dict | None, str | None]:
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
ROPE_FREQS = "rope_freqs.weight"
_LLAMA3_ROPE_SETTINGS = {
    "Llama 3.1": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    "Llama 3.2": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
}
# float32 divisors against ones computed in float64: the converter's own float32 rounding
# stays below 1e-6 relative; a different setting differs by far more.
_ROPE_FREQS_RTOL = 1e-5


# The metadata key (after `<arch>.`) each config.json field of :func:`hf_config` is read
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


def _llama3_rope_scaling(meta: Metadata, config: dict, info: TensorInfo) -> dict:
    """The HF llama3 `rope_scaling` whose divisors are the file's `rope_freqs.weight`
    (``info``), which this reads: a few hundred bytes, before any weight.

    Tried in order: the file's own `llama.rope.scaling.factor` and
    `.original_context_length`, where it states either (llama.cpp's converter writes
    neither for llama3; the rest as in Llama 3.1), then Llama 3.1's and 3.2's settings.
    """
    if info.shape != (config["head_dim"] // 2,):
        raise GGUFError(
            f"{meta.path} is corrupt: {ROPE_FREQS} has shape {info.shape}, not "
            f"({config['head_dim'] // 2},) (one divisor per rotary frequency)."
        )
    check_dequantizable(meta.path, [info])
    divisors = Tensors(meta.path, {ROPE_FREQS: info}, {})[ROPE_FREQS]
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
        f"{meta.path}: {ROPE_FREQS} matches no known Llama 3 rope scaling (closest: "
        f"{closest}, {candidates[closest]}, max relative difference {errors[closest]:.2g} > "
        f"{_ROPE_FREQS_RTOL:g}); the GGUF reader cannot state its rotations as an HF config."
    )


def _vocab_size(meta: Metadata, arch: str) -> int:
    n_tokens = len(meta.get("tokenizer.ggml.tokens", ()))
    vocab_size = int(meta.get(f"{arch}.vocab_size", n_tokens or 0))
    if not vocab_size:
        raise GGUFError(
            f"{meta.path} states no vocabulary size ({arch}.vocab_size or tokenizer.ggml.tokens)."
        )
    return vocab_size


def _special_token_ids(meta: Metadata) -> dict[str, int]:
    """`bos_token_id`, `eos_token_id`, `pad_token_id`: those the file states."""
    ids = {}
    for name in ("bos", "eos", "pad"):
        token_id = meta.get(f"tokenizer.ggml.{'padding' if name == 'pad' else name}_token_id")
        if token_id is not None:
            ids[f"{name}_token_id"] = int(token_id)
    return ids


def _gemma3_fields(meta: Metadata, hidden: int, n_heads: int, head_dim: int, n_layers: int) -> dict:
    """The gemma3 config.json fields llama.cpp derives rather than reads (see the module
    docstring, item 3), in transformers 4.x spelling, which 5.x and ModelConfig read.

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


def hf_config(meta: Metadata, arch: str, infos: list[TensorInfo]) -> dict:
    """The HF `config.json` of a llama, qwen2 or gemma3 file, from its `<arch>.*` keys
    (and a llama file's `rope_freqs.weight`: :func:`_llama3_rope_scaling`)."""
    tensor_names = {t.name for t in infos}
    key = lambda name: f"{arch}.{name}"  # noqa: E731
    hidden, n_heads, n_kv, head_dim = _attention_dims(meta, arch)
    unsupported = _unsupported_features(meta, arch, tensor_names, n_heads, n_kv, head_dim)
    rope_scaling, scaling_problem = _rope_scaling(meta, arch)
    if scaling_problem:
        unsupported.append(scaling_problem)
    if ROPE_FREQS in tensor_names and arch == "llama" and rope_scaling is not None:
        # llama.cpp would apply both; HF's llama3 type has no linear factor on top.
        unsupported.append(f"{rope_scaling['rope_type']} rope scaling on top of {ROPE_FREQS}")
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
    if ROPE_FREQS in tensor_names and arch == "llama":
        rope_freqs = next(t for t in infos if t.name == ROPE_FREQS)
        config["rope_scaling"] = _llama3_rope_scaling(meta, config, rope_freqs)
    return config


def hf_names(path: Path, config: dict, infos: list[TensorInfo], arch: str) -> dict[str, TensorInfo]:
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

