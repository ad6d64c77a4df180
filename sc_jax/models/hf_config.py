"""Reading a Hugging Face ``config.json`` into the fields of
:class:`sc_jax.models.config.ModelConfig` (transformers 4.x or 5.x keys): the model
type, the numbers, the rotary settings and sliding windows of each family, and the
fields refused because they ask for computation the decoder does not do (soft-capping,
experts, MLP biases).

Every field the decoder reads is checked here for its type (a boolean is ``true`` or
``false``, not the string ``"false"``; an integer is not ``2.5``) and its range (heads
positive and dividing, a positive window, eps, theta, scalar and context, a rope
scaling complete for its type), each refusal a :class:`ConfigError`: one line naming
the field and the value (:meth:`ModelConfig.from_hf` adds the file). A field left out
takes transformers' default for the family (:data:`HF_DEFAULTS`, listed in
docs/models.md); a null is refused unless transformers gives it a meaning.
"""

from __future__ import annotations

import json
import math
import numbers
from typing import Any, Mapping

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
_HF_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh"}

#: transformers 5's class defaults (``models/<family>/configuration_<family>.py``) of the
#: fields a ``config.json`` may leave out, per ``model_type``. ``None`` for
#: ``num_key_value_heads`` means ``num_attention_heads``, for ``head_dim``
#: ``hidden_size // num_attention_heads``. The size fields (vocab_size, hidden_size,
#: intermediate_size, num_hidden_layers, num_attention_heads) are required: the class
#: defaults describe some other model.
HF_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": dict(num_key_value_heads=None, head_dim=None, max_position_embeddings=2048,
                  tie_word_embeddings=False, rope_theta=10000.0),
    "mistral": dict(num_key_value_heads=8, head_dim=None, max_position_embeddings=131072,
                    tie_word_embeddings=False, rope_theta=10000.0, sliding_window=4096),
    "qwen2": dict(num_key_value_heads=32, head_dim=None, max_position_embeddings=32768,
                  tie_word_embeddings=False, rope_theta=10000.0, use_sliding_window=False,
                  sliding_window=4096, max_window_layers=28),
    "qwen3": dict(num_key_value_heads=32, head_dim=128, max_position_embeddings=32768,
                  tie_word_embeddings=False, rope_theta=10000.0, use_sliding_window=False,
                  sliding_window=4096, max_window_layers=28),
    "gemma3_text": dict(num_key_value_heads=4, head_dim=256, max_position_embeddings=131072,
                        tie_word_embeddings=True, rope_theta=1000000.0,
                        rope_local_base_freq=10000.0, query_pre_attn_scalar=256,
                        sliding_window=4096, sliding_window_pattern=6),
}
_COMMON_DEFAULTS = dict(rms_norm_eps=1e-6, attention_bias=False)
# The fields whose null transformers reads as "derive it" (its __post_init__), per
# family; any other null is refused (transformers' strict fields refuse it too, and a
# null rope_theta reaches its rotary as None).
_NULL_DERIVED = {"llama": ("num_key_value_heads", "head_dim"), "mistral": ("head_dim",),
                 "qwen2": ("num_key_value_heads", "head_dim"), "qwen3": ("num_key_value_heads",),
                 "gemma3_text": ()}
# Where attention_bias switches biases on: transformers' Mistral has none whatever the
# field says, and Qwen2 always has q/k/v biases (and no o bias).
_ATTENTION_BIAS_FAMILIES = ("llama", "qwen3", "gemma3_text")


class ConfigError(ValueError):
    """A model configuration value refused: one line naming the field and the value
    (and, from :meth:`sc_jax.models.config.ModelConfig.from_hf` on, the file).
    ``field``: the field's name as the configuration spells it."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


def _show(value) -> str:
    """A value as the configuration spells it (JSON), else its repr."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def _refuse(key: str, value, what: str) -> ConfigError:
    return ConfigError(f"field {key!r} must be {what}, got {_show(value)}", key)


def _is_real(value) -> bool:
    # numbers.Real: GGUF metadata comes as NumPy scalars; a bool is not a number here.
    return (not isinstance(value, bool) and isinstance(value, numbers.Real)
            and math.isfinite(value))


def check_int(key: str, value, minimum: int = 1) -> int:
    """``value`` as an int (an integral float too), refused unless ``>= minimum``."""
    if not _is_real(value) or float(value) != int(value):
        raise _refuse(key, value, "an integer")
    if value < minimum:
        raise _refuse(key, value, "positive" if minimum == 1 else f"at least {minimum}")
    return int(value)


def check_number(key: str, value, *, minimum: float | None = None) -> float:
    """``value`` as a float, refused unless ``> 0`` (or ``>= minimum`` when given)."""
    if not _is_real(value):
        raise _refuse(key, value, "a number")
    if (value <= 0) if minimum is None else (value < minimum):
        raise _refuse(key, value, "positive" if minimum is None else f"at least {minimum:g}")
    return float(value)


def check_bool(key: str, value) -> bool:
    if not isinstance(value, bool):
        raise _refuse(key, value, "true or false")
    return value


_REQUIRED = object()


def _get(cfg: Mapping[str, Any], key: str, default=_REQUIRED):
    """``(value, given)``: ``cfg[key]``, or ``default`` where it is left out."""
    if key in cfg:
        return cfg[key], True
    if default is _REQUIRED:
        raise ConfigError(f"field {key!r} is missing", key)
    return default, False


def _int(cfg, key, default=_REQUIRED, *, minimum: int = 1, null_ok: bool = False):
    value, given = _get(cfg, key, default)
    if not given or (value is None and null_ok):
        return value
    return check_int(key, value, minimum)


def _float(cfg, key, default=_REQUIRED, *, minimum: float | None = None):
    value, given = _get(cfg, key, default)
    return check_number(key, value, minimum=minimum) if given else value


def _bool(cfg, key, default):
    value, given = _get(cfg, key, default)
    return check_bool(key, value) if given else value


def hf_fields(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of :class:`sc_jax.models.config.ModelConfig` for a Hugging
    Face ``config.json`` dict (a multimodal Gemma 3's text tower), every field it reads
    checked (see the module docstring).

    Raises ConfigError (a ValueError), naming the field and the value, for unsupported
    architectures or values.
    """
    cfg = _text_config(cfg)
    mtype = supported_model_type(cfg)
    d = {**_COMMON_DEFAULTS, **HF_DEFAULTS[mtype]}
    heads, kv_heads, hidden, head_dim = _attention_sizes(cfg, mtype, d)
    n_layers = _int(cfg, "num_hidden_layers")
    max_pos = _int(cfg, "max_position_embeddings", d["max_position_embeddings"])
    gemma = mtype == "gemma3_text"
    if gemma:
        theta, scaling, local_theta = _gemma3_rope(cfg, max_pos)
    else:
        (theta, scaling), local_theta = _rope_settings(cfg, d["rope_theta"], max_pos), None
    if cfg.get("partial_rotary_factor") is not None:
        _check_partial_rotary("partial_rotary_factor", cfg["partial_rotary_factor"])
    windows = _layer_windows(cfg, mtype, n_layers, d)
    bias = _bool(cfg, "attention_bias", d["attention_bias"]) and mtype in _ATTENTION_BIAS_FAMILIES
    qpas = _float(cfg, "query_pre_attn_scalar", d["query_pre_attn_scalar"]) if gemma else None

    return dict(
        vocab_size=_int(cfg, "vocab_size"),
        hidden_size=hidden,
        intermediate_size=_int(cfg, "intermediate_size"),
        num_layers=n_layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=_float(cfg, "rms_norm_eps", d["rms_norm_eps"]),
        rope_theta=theta,
        rope_scaling=tuple(sorted(scaling.items())) or None,
        max_position_embeddings=max_pos,
        tie_word_embeddings=_bool(cfg, "tie_word_embeddings", d["tie_word_embeddings"]),
        qkv_bias=mtype == "qwen2" or bias,
        o_bias=bias,
        layer_windows=windows,
        model_type=mtype,
        bos_token_id=_token_id(cfg, "bos_token_id"),
        eos_token_id=_token_id(cfg, "eos_token_id"),
        qk_norm=mtype in ("qwen3", "gemma3_text"),
        sandwich_norm=gemma,
        norm_offset=1.0 if gemma else 0.0,
        hidden_act=_HF_ACTIVATIONS[_activation(cfg, mtype)],
        embed_scale=math.sqrt(hidden) if gemma else None,
        attn_scale=qpas ** -0.5 if gemma else None,
        local_rope_theta=local_theta,
    )


def _attention_sizes(cfg: Mapping[str, Any], mtype: str, d: Mapping[str, Any]):
    """(query heads, key/value heads, hidden size, head size), positive and dividing."""
    heads = _int(cfg, "num_attention_heads")
    hidden = _int(cfg, "hidden_size")
    derivable = _NULL_DERIVED[mtype]
    head_dim = _int(cfg, "head_dim", d["head_dim"], null_ok="head_dim" in derivable)
    # transformers' Llama and Gemma 3 require it whatever head_dim says
    # (validate_architecture); the others only where head_dim is derived from it.
    if (head_dim is None or mtype in ("llama", "gemma3_text")) and hidden % heads:
        raise ConfigError(f"field 'hidden_size' must be a multiple of num_attention_heads "
                          f"({heads}), got {hidden}", "hidden_size")
    if head_dim is None:
        head_dim = hidden // heads
        if head_dim % 2:
            raise ConfigError(f"field 'hidden_size' / num_attention_heads must be an even head "
                              f"size (rotary embeddings turn pairs), got {hidden} / {heads} = "
                              f"{head_dim}", "hidden_size")
    elif head_dim % 2:
        raise _refuse("head_dim", head_dim, "even (rotary embeddings turn pairs)")
    kv = _int(cfg, "num_key_value_heads", d["num_key_value_heads"],
              null_ok="num_key_value_heads" in derivable)
    kv = heads if kv is None else kv
    if heads % kv:
        raise _refuse("num_key_value_heads", kv, f"a divisor of num_attention_heads ({heads})")
    return heads, kv, hidden, head_dim


def _check_partial_rotary(key: str, value) -> None:
    if check_number(key, value) != 1.0:
        raise ConfigError(f"field {key!r} is {_show(value)}: rotary embeddings on part of each "
                          "head are not supported (sc_jax rotates whole heads: 1)", key)


def _text_config(cfg):
    """A multimodal ``gemma3`` config's text tower (``text_config``); any other config
    as it is."""
    if isinstance(cfg, Mapping) and cfg.get("model_type") == "gemma3":
        text = cfg.get("text_config")
        if not isinstance(text, Mapping):
            raise ConfigError("a gemma3 config.json without a text_config: sc_jax runs the "
                              "text tower of Gemma 3 only", "text_config")
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


def _activation(cfg: Mapping[str, Any], mtype: str) -> str:
    # transformers' Gemma reads hidden_activation only, the others hidden_act only.
    key, default = (("hidden_activation", "gelu_pytorch_tanh") if mtype == "gemma3_text"
                    else ("hidden_act", "silu"))
    act, _ = _get(cfg, key, default)
    if not isinstance(act, str) or act not in _HF_ACTIVATIONS:
        raise _refuse(key, act, f"one of {', '.join(sorted(_HF_ACTIVATIONS))} (the "
                                "activations sc_jax computes)")
    return act


def supported_model_type(cfg) -> str:
    """The ``model_type`` of a ``config.json`` dict, once the checkpoint is one this
    decoder runs (architecture, required fields, activation, biases)."""
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"config must be a mapping, got {type(cfg).__name__}")
    mtype = cfg.get("model_type")
    if not isinstance(mtype, str) or mtype not in SUPPORTED_MODEL_TYPES:
        archs = cfg.get("architectures")
        raise ConfigError(
            f"unsupported model_type {mtype!r} (architectures={archs}); sc_jax supports "
            f"{', '.join(SUPPORTED_MODEL_TYPES)} checkpoints", "model_type")
    required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads")
    missing = [k for k in required if k not in cfg]
    if missing:
        raise ConfigError(f"config.json lacks required field(s) {missing}", missing[0])
    for field, what in _REFUSED_FIELDS:
        if cfg.get(field) not in (None, False, 0):
            raise ConfigError(f"config.json field {field}={cfg[field]!r} asks for {what}, which "
                              f"sc_jax does not compute ({mtype} models without it load)", field)
    _activation(cfg, mtype)
    return mtype


def _mapping(cfg: Mapping[str, Any], key: str, name: str | None = None) -> dict[str, Any]:
    """``cfg[key]`` as a dict (null or absent: empty), refused unless a mapping."""
    value = cfg.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _refuse(name or key, value, "an object (a JSON mapping) or null")
    return dict(value)


def _rope_settings(cfg: Mapping[str, Any], default_theta: float, max_pos: int, *,
                   params_name: str = "rope_parameters",
                   theta_key: str = "rope_theta") -> tuple[float, dict[str, Any]]:
    """(rope theta, rope scaling dict: empty for the default rotary), each checked."""
    # transformers 5 nests theta and scaling in `rope_parameters`; 4.x had top-level
    # `rope_theta` and `rope_scaling`.
    rp = _mapping(cfg, "rope_parameters", params_name)
    scaling = {**_mapping(cfg, "rope_scaling"), **rp}
    scaling.pop("rope_theta", None)
    if "rope_theta" in rp:
        theta = check_number(f"{params_name}.rope_theta", rp["rope_theta"])
    else:
        theta = _float(cfg, theta_key, default_theta)
    return theta, rope_scaling_fields(scaling, max_pos, params_name if rp else "rope_scaling")


def rope_scaling_fields(scaling: Mapping[str, Any], max_pos: int,
                        name: str = "rope_scaling") -> dict[str, Any]:
    """A rope scaling dict complete for its type, each value checked (``{}`` for the
    default rotary): ``linear`` needs ``factor`` >= 1 (transformers' rule); ``llama3``
    needs ``factor``, ``low_freq_factor`` > 0 and ``high_freq_factor`` above it, and
    takes ``original_max_position_embeddings`` (a positive int) from ``max_pos`` where
    absent, as transformers does. No other value is assumed. ``name``: the field the
    dict came from, for the messages."""
    s = dict(scaling)
    if "type" in s and "rope_type" not in s:
        s["rope_type"] = s.pop("type")
    s.pop("type", None)
    if s.get("partial_rotary_factor") is not None:
        _check_partial_rotary(f"{name}.partial_rotary_factor", s["partial_rotary_factor"])
    s.pop("partial_rotary_factor", None)
    rtype = s.get("rope_type", "default")
    if not isinstance(rtype, str) or rtype not in SUPPORTED_ROPE_TYPES:
        raise ConfigError(f"field '{name}.rope_type': rope scaling type {rtype!r} is not "
                          f"supported; supported: {', '.join(SUPPORTED_ROPE_TYPES)}",
                          f"{name}.rope_type")
    if rtype == "default":
        return {}

    def need(key: str):
        if key not in s:
            raise ConfigError(f"field '{name}.{key}' is missing: {rtype} rope scaling needs it "
                              "(no default is assumed)", f"{name}.{key}")
        return s[key]

    s["factor"] = check_number(f"{name}.factor", need("factor"), minimum=1.0)
    if rtype == "llama3":
        low = check_number(f"{name}.low_freq_factor", need("low_freq_factor"))
        high = check_number(f"{name}.high_freq_factor", need("high_freq_factor"))
        if high <= low:
            raise _refuse(f"{name}.high_freq_factor", s["high_freq_factor"],
                          f"greater than low_freq_factor ({low:g})")
        s["low_freq_factor"], s["high_freq_factor"] = low, high
        key = "original_max_position_embeddings"
        s[key] = check_int(f"{name}.{key}", s.get(key, max_pos))
    return s


def _gemma3_rope(cfg: Mapping[str, Any], max_pos: int) -> tuple[float, dict[str, Any], float]:
    """(global theta, global scaling, local theta) of a Gemma 3 config.

    transformers 5 writes ``rope_parameters`` per layer type (``full_attention``,
    ``sliding_attention``); 4.x wrote ``rope_theta``, ``rope_scaling`` (the global
    layers') and ``rope_local_base_freq``.
    """
    d = HF_DEFAULTS["gemma3_text"]
    rp = _mapping(cfg, "rope_parameters")
    if ("full_attention" in rp or "sliding_attention" in rp):
        name = "rope_parameters.full_attention"
        # transformers lays a 4.x rope_scaling over the global layers' parameters.
        full = {**_mapping(rp, "full_attention", name), **_mapping(cfg, "rope_scaling")}
        theta, scaling = _rope_settings({"rope_parameters": full, **_only(cfg, "rope_theta")},
                                        d["rope_theta"], max_pos, params_name=name)
        local_theta, local_scaling = _rope_settings(
            {"rope_parameters": _mapping(rp, "sliding_attention", "rope_parameters.sliding_attention"),
             **_only(cfg, "rope_local_base_freq")}, d["rope_local_base_freq"], max_pos,
            params_name="rope_parameters.sliding_attention", theta_key="rope_local_base_freq")
    else:
        theta, scaling = _rope_settings({**_only(cfg, "rope_theta"), **_only(cfg, "rope_scaling")},
                                        d["rope_theta"], max_pos)
        local_theta, local_scaling = _float(cfg, "rope_local_base_freq", d["rope_local_base_freq"]), {}
    if local_scaling:
        raise ConfigError(f"rope scaling {local_scaling.get('rope_type')!r} on the sliding-window "
                          "layers is not supported (sc_jax scales the global layers' rotary only)",
                          "rope_parameters.sliding_attention")
    return theta, scaling, local_theta


def _only(cfg: Mapping[str, Any], key: str) -> dict[str, Any]:
    return {key: cfg[key]} if key in cfg else {}


def _token_id(cfg: Mapping[str, Any], key: str) -> int | None:
    """A special token id of ``config.json``: an int, a list (its first) or None."""
    value = cfg.get(key)
    if value is None:
        return None
    ids = value if isinstance(value, list) else [value]
    if not all(_is_real(v) and float(v) == int(v) and v >= 0 for v in ids):
        raise _refuse(key, value, "a token id (an integer >= 0), a list of them or null")
    return int(ids[0]) if ids else None


def _window(cfg: Mapping[str, Any], default, used: bool) -> int | None:
    """``sliding_window`` (None: no window), checked for its range where it is used and
    for its type where not (Qwen's with use_sliding_window false), as transformers'
    strict field is."""
    value, _ = _get(cfg, "sliding_window", default)
    if value is None:
        return None
    if not used:
        if not (_is_real(value) and float(value) == int(value)):
            raise _refuse("sliding_window", value, "an integer or null")
        return None
    return check_int("sliding_window", value)


def _layer_types(cfg: Mapping[str, Any], n_layers: int) -> list[str] | None:
    types = cfg.get("layer_types")
    if types is None:
        return None
    if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
        raise _refuse("layer_types", types, "a list of layer type names or null")
    if len(types) != n_layers:
        raise ConfigError(f"config.json's layer_types has {len(types)} entries for "
                          f"num_hidden_layers {n_layers}", "layer_types")
    unknown = sorted(set(types) - {"full_attention", "sliding_attention"})
    if unknown:
        raise ConfigError(f"config.json's layer_types holds {unknown}; sc_jax computes "
                          "full_attention and sliding_attention layers", "layer_types")
    return types


def _layer_windows(cfg: Mapping[str, Any], mtype: str, n_layers: int,
                   d: Mapping[str, Any]) -> tuple[int, ...] | None:
    types = _layer_types(cfg, n_layers)
    if mtype == "gemma3_text":
        if types is None:
            # transformers 4.x: every pattern-th layer is global, the others slide.
            key = "sliding_window_pattern" if "sliding_window_pattern" in cfg else "_sliding_window_pattern"
            pattern = _int(cfg, key, d["sliding_window_pattern"])
            types = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                     for i in range(n_layers)]
        return _windows_of_types(types, _window(cfg, d["sliding_window"], "sliding_attention" in types))
    if mtype in ("qwen2", "qwen3"):
        use = _bool(cfg, "use_sliding_window", d["use_sliding_window"])
        sw = _window(cfg, d["sliding_window"], use)
        if sw is None:
            return None
        if types is None:
            first = _int(cfg, "max_window_layers", d["max_window_layers"], minimum=0)
            types = ["full_attention" if i < first else "sliding_attention"
                     for i in range(n_layers)]
        return _windows_of_types(types, sw)
    if mtype == "mistral":
        sw = _window(cfg, d["sliding_window"], True)
        return None if sw is None else (sw,) * n_layers
    return None


def _windows_of_types(types: list[str], sw: int | None) -> tuple[int, ...] | None:
    if "sliding_attention" in types and not sw:
        raise ConfigError("config.json's layer_types has sliding_attention layers but no "
                          "sliding_window", "sliding_window")
    wins = tuple(sw if t == "sliding_attention" else 0 for t in types)
    return wins if any(wins) else None
