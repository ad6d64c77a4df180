"""Reading a Hugging Face ``config.json`` into the fields of
:class:`sc_jax.models.config.ModelConfig` (transformers 4.x or 5.x keys): the model
type, the numbers, the rotary settings and sliding windows of each family, and the
fields refused because they ask for computation the decoder does not do (soft-capping,
experts, MLP biases), each error naming the field.
"""

from __future__ import annotations

import json
import math
import numbers
from typing import Any, Mapping

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text")
_HF_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh"}


def hf_fields(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of :class:`sc_jax.models.config.ModelConfig` for a Hugging
    Face ``config.json`` dict (a multimodal Gemma 3's text tower).

    Raises ValueError, naming the field, for unsupported architectures or values.
    """
    cfg = _text_config(cfg)
    mtype = supported_model_type(cfg)
    heads = _number(cfg, "num_attention_heads", int)
    hidden = _number(cfg, "hidden_size", int)
    head_dim = _number(cfg, "head_dim", int, None) or hidden // heads
    gemma = mtype == "gemma3_text"
    if gemma:
        theta, scaling, local_theta = _gemma3_rope(cfg)
    else:
        (theta, scaling), local_theta = _rope_settings(cfg), None
    if cfg.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("partial_rotary_factor != 1 is not supported")

    n_layers = _number(cfg, "num_hidden_layers", int)
    windows = _layer_windows(cfg, mtype, n_layers)
    qkv_bias = mtype == "qwen2" or bool(cfg.get("attention_bias", False))
    o_bias = mtype != "qwen2" and bool(cfg.get("attention_bias", False))
    qpas = _number(cfg, "query_pre_attn_scalar", float, None) if gemma else None

    return dict(
        vocab_size=_number(cfg, "vocab_size", int),
        hidden_size=hidden,
        intermediate_size=_number(cfg, "intermediate_size", int),
        num_layers=n_layers,
        num_heads=heads,
        num_kv_heads=_number(cfg, "num_key_value_heads", int, None) or heads,
        head_dim=int(head_dim),
        rms_norm_eps=_number(cfg, "rms_norm_eps", float, 1e-6),
        rope_theta=theta,
        rope_scaling=tuple(sorted(scaling.items())) or None,
        max_position_embeddings=_number(cfg, "max_position_embeddings", int, 4096),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        layer_windows=windows,
        model_type=mtype,
        bos_token_id=_token_id(cfg.get("bos_token_id")),
        eos_token_id=_token_id(cfg.get("eos_token_id")),
        qk_norm=mtype in ("qwen3", "gemma3_text"),
        sandwich_norm=gemma,
        norm_offset=1.0 if gemma else 0.0,
        hidden_act=_HF_ACTIVATIONS[_activation(cfg)],
        embed_scale=math.sqrt(hidden) if gemma else None,
        attn_scale=float(qpas) ** -0.5 if qpas else None,
        local_rope_theta=local_theta,
    )


_MISSING = object()


def _number(cfg: Mapping[str, Any], key: str, kind, default=_MISSING):
    """``cfg[key]`` as ``kind`` (int or float), ``default`` if absent or null; a value
    that is not a number raises ValueError naming the field (``float("abc")`` named
    neither field nor file)."""
    value = cfg.get(key)
    if value is None:
        if default is _MISSING:
            raise ValueError(f"field {key!r} is missing")
        return default
    # numbers.Real: GGUF metadata comes as NumPy scalars.
    bad = isinstance(value, bool) or not isinstance(value, numbers.Real) or (
        kind is int and float(value) != int(value)) or not math.isfinite(value)
    if bad:
        what = "an integer" if kind is int else "a number"
        raise ValueError(f"field {key!r} must be {what}, got {json.dumps(value)}")
    return kind(value)


def _text_config(cfg):
    """A multimodal ``gemma3`` config's text tower (``text_config``); any other config
    as it is."""
    if isinstance(cfg, Mapping) and cfg.get("model_type") == "gemma3":
        text = cfg.get("text_config")
        if not isinstance(text, Mapping):
            raise ValueError("a gemma3 config.json without a text_config: sc_jax runs the "
                             "text tower of Gemma 3 only")
        return {**text, "model_type": "gemma3_text", "_text_tower_of": "gemma3"}
    return cfg


# Fields whose value, when set (anything but None, False or 0), asks for computation
# this decoder does not do: (field, what it is).
_REFUSED_FIELDS = (
    ("attn_logit_softcapping", "attention logit soft-capping"),
    ("final_logit_softcapping", "final logit soft-capping"),
    ("use_bidirectional_attention", "bidirectional attention"),
    ("num_experts", "a mixture of experts"),
    ("num_local_experts", "a mixture of experts"),
    ("n_routed_experts", "a mixture of experts"),
    ("mlp_bias", "MLP biases"),
)


def _activation(cfg: Mapping[str, Any]) -> str:
    # Gemma names its activation hidden_activation; the others hidden_act.
    key = "hidden_activation" if cfg.get("hidden_activation") is not None else "hidden_act"
    act = cfg.get(key) or "silu"
    if act not in _HF_ACTIVATIONS:
        raise ValueError(f"{key} {act!r} is not supported (supported: "
                         f"{', '.join(sorted(_HF_ACTIVATIONS))})")
    return act


def supported_model_type(cfg) -> str:
    """The ``model_type`` of a ``config.json`` dict, once the checkpoint is one this
    decoder runs (architecture, required fields, activation, biases)."""
    if not isinstance(cfg, Mapping):
        raise ValueError(f"config must be a mapping, got {type(cfg).__name__}")
    mtype = cfg.get("model_type")
    if mtype not in SUPPORTED_MODEL_TYPES:
        archs = cfg.get("architectures")
        raise ValueError(
            f"unsupported model_type {mtype!r} (architectures={archs}); sc_jax supports "
            f"{', '.join(SUPPORTED_MODEL_TYPES)} checkpoints")
    required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads")
    missing = [k for k in required if k not in cfg]
    if missing:
        raise ValueError(f"config.json lacks required field(s) {missing}")
    for field, what in _REFUSED_FIELDS:
        if cfg.get(field) not in (None, False, 0):
            raise ValueError(f"config.json field {field}={cfg[field]!r} asks for {what}, "
                             f"which sc_jax does not compute ({mtype} models without it load)")
    _activation(cfg)
    return mtype


def _rope_settings(cfg: Mapping[str, Any]) -> tuple[float, dict[str, Any]]:
    """(rope theta, rope scaling dict: empty for the default rotary)."""
    # transformers 5 nests theta and scaling in `rope_parameters`; 4.x had
    # top-level `rope_theta` and `rope_scaling`.
    rp = dict(cfg.get("rope_parameters") or {})
    scaling = dict(cfg.get("rope_scaling") or {})
    theta = float(rp.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    scaling.update({k: v for k, v in rp.items() if k != "rope_theta"})
    if "type" in scaling and "rope_type" not in scaling:
        scaling["rope_type"] = scaling.pop("type")
    scaling.pop("type", None)
    if scaling.get("rope_type", "default") == "default":
        scaling = {}
    return theta, scaling


def _gemma3_rope(cfg: Mapping[str, Any]) -> tuple[float, dict[str, Any], float]:
    """(global theta, global scaling, local theta) of a Gemma 3 config.

    transformers 5 writes ``rope_parameters`` per layer type (``full_attention``,
    ``sliding_attention``); 4.x wrote ``rope_theta``, ``rope_scaling`` (the global
    layers') and ``rope_local_base_freq``.
    """
    rp = cfg.get("rope_parameters")
    if isinstance(rp, Mapping) and ("full_attention" in rp or "sliding_attention" in rp):
        full = dict(rp.get("full_attention") or {})
        local = dict(rp.get("sliding_attention") or {})
        theta, scaling = _rope_settings({"rope_parameters": full,
                                         "rope_theta": cfg.get("rope_theta", 1000000.0)})
        local_theta, local_scaling = _rope_settings(
            {"rope_parameters": local, "rope_theta": cfg.get("rope_local_base_freq", 10000.0)})
    else:
        theta, scaling = _rope_settings({"rope_theta": cfg.get("rope_theta", 1000000.0),
                                         "rope_scaling": cfg.get("rope_scaling")})
        local_theta, local_scaling = float(cfg.get("rope_local_base_freq", 10000.0)), {}
    if local_scaling:
        raise ValueError(f"rope scaling {local_scaling.get('rope_type')!r} on the sliding-window "
                         "layers is not supported (sc_jax scales the global layers' rotary only)")
    return theta, scaling, local_theta


def _token_id(v) -> int | None:
    """A special token id of ``config.json``: an int, a list (its first) or None."""
    if isinstance(v, list):
        return int(v[0]) if v else None
    return None if v is None else int(v)


def _layer_windows(cfg: Mapping[str, Any], mtype: str, n_layers: int) -> tuple[int, ...] | None:
    sw = cfg.get("sliding_window")
    if mtype == "gemma3_text":
        types = cfg.get("layer_types")
        if types is None:
            # transformers 4.x: every pattern-th layer is global, the others slide.
            pattern = int(cfg.get("sliding_window_pattern", cfg.get("_sliding_window_pattern", 6)))
            types = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                     for i in range(n_layers)]
        return _windows_of_types(types, sw, n_layers)
    if mtype in ("qwen2", "qwen3"):
        if not cfg.get("use_sliding_window", False) or not sw:
            return None
        types = cfg.get("layer_types")
        if types is None:
            first = int(cfg.get("max_window_layers", n_layers))
            types = ["full_attention" if i < first else "sliding_attention"
                     for i in range(n_layers)]
        return _windows_of_types(types, sw, n_layers)
    if mtype == "mistral" and sw:
        return (int(sw),) * n_layers
    return None


def _windows_of_types(types, sw, n_layers: int) -> tuple[int, ...] | None:
    if len(types) != n_layers:
        raise ValueError(f"config.json's layer_types has {len(types)} entries for "
                         f"num_hidden_layers {n_layers}")
    unknown = sorted({t for t in types} - {"full_attention", "sliding_attention"})
    if unknown:
        raise ValueError(f"config.json's layer_types holds {unknown}; sc_jax computes "
                         "full_attention and sliding_attention layers")
    if "sliding_attention" in types and not sw:
        raise ValueError("config.json's layer_types has sliding_attention layers but no "
                         "sliding_window")
    wins = tuple(int(sw) if t == "sliding_attention" else 0 for t in types)
    return wins if any(wins) else None
