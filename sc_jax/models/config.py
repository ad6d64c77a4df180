"""Decoder configuration: one frozen dataclass covers Llama 2 and 3, Mistral, Qwen2,
Qwen3 and Gemma 3 (text).

The families differ only in fields here (q/k/v biases, q/k norms, sandwich norms and
their ``1 + w`` scale, the MLP's activation, scaled embeddings, the attention's scale,
sliding windows and per-layer rotary bases, rotary scaling, tied embeddings), never in
code. A config is built from a Hugging Face ``config.json`` with
:meth:`ModelConfig.from_hf`, or from a preset with :func:`preset`. Whatever of a
family's config the decoder does not compute (a rope type, soft-capping, experts) is
refused there, naming the field.

Adding a family: teach :func:`_supported_model_type` its ``model_type``, map its fields
in :meth:`ModelConfig.from_hf`, its tensor names in
:func:`sc_jax.models.checkpoint.key_map` (and GGUF's in :mod:`sc_jax.models.gguf`), then
add a tiny random case to ``tests/hf_models.py``: ``tests/test_model.py``'s parity tests
run every case against transformers.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
from pathlib import Path
from typing import Any, Mapping

import numpy as np

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text")
#: Activations of the gated MLP: ``act(x W_gate) * (x W_up)``.
ACTIVATIONS = ("silu", "gelu_tanh")
_HF_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh"}
_SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of a decoder-only transformer (pre-norm, RMSNorm, RoPE,
    grouped-query attention, SwiGLU MLP).

    ``layer_windows`` holds, per layer, the sliding-window length (a key at position
    j is visible from a query at position i iff ``0 <= i - j < window``) or 0 for full
    causal attention.

    The later families' fields (defaults: the Llama block):

    * ``qk_norm``: RMSNorm over each head's ``head_dim`` of q and k, before the
      rotation (Qwen3, Gemma 3);
    * ``sandwich_norm``: norms after attention and after the MLP as well as before
      (Gemma's ``post_attention_layernorm`` and ``post_feedforward_layernorm``);
    * ``norm_offset``: every RMSNorm scales by ``norm_offset + w`` (Gemma stores
      ``w`` around 0 and scales by ``1 + w``; 0 elsewhere);
    * ``hidden_act``: the gated MLP's activation, one of :data:`ACTIVATIONS`;
    * ``embed_scale``: embeddings multiplied by it (Gemma: ``sqrt(hidden_size)``);
    * ``attn_scale``: the query-key scale (Gemma 3: ``query_pre_attn_scalar ** -0.5``),
      None for ``head_dim ** -0.5``;
    * ``local_rope_theta``: the rotary base of the sliding-window layers (Gemma 3's
      local layers, unscaled), None for every layer on ``rope_theta`` and
      ``rope_scaling``.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    # Hashable form of the checkpoint's rope scaling dict: (("factor", 8.0), ...).
    rope_scaling: tuple[tuple[str, Any], ...] | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    layer_windows: tuple[int, ...] | None = None
    model_type: str = "llama"
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    qk_norm: bool = False
    sandwich_norm: bool = False
    norm_offset: float = 0.0
    hidden_act: str = "silu"
    embed_scale: float | None = None
    attn_scale: float | None = None
    local_rope_theta: float | None = None

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                     "num_heads", "num_kv_heads", "head_dim"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive integer, got {v!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads}) for grouped-query attention")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"model_type {self.model_type!r} is not supported; "
                             f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
        if self.layer_windows is not None and len(self.layer_windows) != self.num_layers:
            raise ValueError(f"layer_windows has {len(self.layer_windows)} entries for "
                             f"{self.num_layers} layers")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act {self.hidden_act!r} is not supported; supported: "
                             f"{', '.join(ACTIVATIONS)}")
        if self.rope_scaling is not None:
            rtype = dict(self.rope_scaling).get("rope_type", "default")
            if rtype not in _SUPPORTED_ROPE_TYPES:
                raise ValueError(f"rope scaling type {rtype!r} is not supported; supported: "
                                 f"{', '.join(_SUPPORTED_ROPE_TYPES)}")

    @property
    def windows(self) -> tuple[int, ...]:
        """Per-layer window, 0 meaning full causal attention."""
        return self.layer_windows or (0,) * self.num_layers

    @property
    def min_window(self) -> int | None:
        """The smallest sliding window of any layer, or None if all layers are full."""
        w = [x for x in self.windows if x > 0]
        return min(w) if w else None

    def num_params(self) -> int:
        d, f, h, kv, hd = (self.hidden_size, self.intermediate_size, self.num_heads,
                           self.num_kv_heads, self.head_dim)
        per_layer = d * hd * (h + 2 * kv) + h * hd * d + 3 * d * f + 2 * d
        if self.qkv_bias:
            per_layer += hd * (h + 2 * kv)
        if self.o_bias:
            per_layer += d
        if self.qk_norm:
            per_layer += 2 * hd
        if self.sandwich_norm:
            per_layer += 2 * d
        embed = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
        return per_layer * self.num_layers + embed + d

    # ------------------------------------------------------------------ HF I/O
    @classmethod
    def from_hf(cls, cfg: Mapping[str, Any]) -> "ModelConfig":
        """Build from a Hugging Face ``config.json`` dict (transformers 4.x or 5.x keys).

        Raises ValueError, naming the field, for unsupported architectures or values.
        """
        cfg = _text_config(cfg)
        mtype = _supported_model_type(cfg)
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

        return cls(
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

    @classmethod
    def from_json(cls, path: str | Path) -> "ModelConfig":
        path = Path(path)
        try:
            cfg = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON: {e}") from e
        return cls.from_hf(cfg)


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


def _supported_model_type(cfg) -> str:
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


# ------------------------------------------------------------------ presets
# Real configurations of the paper's three 7B models (for throughput work with
# random weights) and tiny ones with odd sizes (for tests: shape bugs show).
_PRESETS: dict[str, dict[str, Any]] = {
    "llama-2-7b": dict(model_type="llama", vocab_size=32000, hidden_size=4096,
                       intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=32, rms_norm_eps=1e-5, rope_theta=10000.0,
                       max_position_embeddings=4096, bos_token_id=1, eos_token_id=2),
    # The paper's appendix scales to LLaMA-13B; 70B (grouped-query attention, 8 KV
    # heads) is the size that needs weights sharded over devices (issue 12).
    "llama-2-13b": dict(model_type="llama", vocab_size=32000, hidden_size=5120,
                        intermediate_size=13824, num_hidden_layers=40, num_attention_heads=40,
                        num_key_value_heads=40, rms_norm_eps=1e-5, rope_theta=10000.0,
                        max_position_embeddings=4096, bos_token_id=1, eos_token_id=2),
    "llama-2-70b": dict(model_type="llama", vocab_size=32000, hidden_size=8192,
                        intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                        num_key_value_heads=8, rms_norm_eps=1e-5, rope_theta=10000.0,
                        max_position_embeddings=4096, bos_token_id=1, eos_token_id=2),
    "mistral-7b": dict(model_type="mistral", vocab_size=32768, hidden_size=4096,
                       intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=8, rms_norm_eps=1e-5, rope_theta=1000000.0,
                       max_position_embeddings=32768, sliding_window=None,
                       bos_token_id=1, eos_token_id=2),
    "qwen2-7b": dict(model_type="qwen2", vocab_size=152064, hidden_size=3584,
                     intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                     num_key_value_heads=4, rms_norm_eps=1e-6, rope_theta=1000000.0,
                     max_position_embeddings=32768, use_sliding_window=False,
                     bos_token_id=151643, eos_token_id=151645),
    "smollm2-135m": dict(model_type="llama", vocab_size=49152, hidden_size=576,
                         intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, rms_norm_eps=1e-5, rope_theta=100000.0,
                         max_position_embeddings=8192, tie_word_embeddings=True,
                         bos_token_id=1, eos_token_id=2),
    "tiny-llama": dict(model_type="llama", vocab_size=613, hidden_size=70,
                       intermediate_size=97, num_hidden_layers=3, num_attention_heads=7,
                       num_key_value_heads=1, rms_norm_eps=1e-5, rope_theta=10000.0,
                       max_position_embeddings=512, bos_token_id=1, eos_token_id=2),
    "tiny-mistral": dict(model_type="mistral", vocab_size=613, hidden_size=60,
                         intermediate_size=83, num_hidden_layers=2, num_attention_heads=6,
                         num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=10000.0,
                         max_position_embeddings=512, sliding_window=64,
                         bos_token_id=1, eos_token_id=2),
    "tiny-qwen2": dict(model_type="qwen2", vocab_size=613, hidden_size=60,
                       intermediate_size=83, num_hidden_layers=2, num_attention_heads=6,
                       num_key_value_heads=3, rms_norm_eps=1e-6, rope_theta=10000.0,
                       max_position_embeddings=512, tie_word_embeddings=True,
                       bos_token_id=1, eos_token_id=2),
    # Tiny cases of the later families, odd sizes again (head_dim 16 with hidden 60 / 6
    # heads: head_dim is not hidden / heads) and Gemma 3's interleaving: sliding
    # windows of 8 on layers 0, 1, 3, a global layer 2, two rotary bases.
    "tiny-llama3": dict(model_type="llama", vocab_size=613, hidden_size=70,
                        intermediate_size=97, num_hidden_layers=3, num_attention_heads=7,
                        num_key_value_heads=1, rms_norm_eps=1e-5,
                        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0,
                                         "factor": 8.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 64},
                        max_position_embeddings=512, bos_token_id=1, eos_token_id=2),
    "tiny-qwen3": dict(model_type="qwen3", vocab_size=613, hidden_size=60,
                       intermediate_size=83, num_hidden_layers=3, num_attention_heads=6,
                       num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
                       rope_theta=1000000.0, max_position_embeddings=512,
                       tie_word_embeddings=True, bos_token_id=1, eos_token_id=2),
    "tiny-gemma3": dict(model_type="gemma3_text", vocab_size=613, hidden_size=60,
                        intermediate_size=83, num_hidden_layers=4, num_attention_heads=6,
                        num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24,
                        rms_norm_eps=1e-6, sliding_window=8,
                        layer_types=["sliding_attention", "sliding_attention",
                                     "full_attention", "sliding_attention"],
                        rope_theta=1000000.0, rope_local_base_freq=10000.0,
                        rope_scaling={"rope_type": "linear", "factor": 2.0},
                        hidden_activation="gelu_pytorch_tanh", max_position_embeddings=512,
                        tie_word_embeddings=True, bos_token_id=1, eos_token_id=2),
    # The 2024-25 families' published configurations (text towers), for plans and
    # throughput with random weights.
    "llama-3.1-8b": dict(model_type="llama", vocab_size=128256, hidden_size=4096,
                         intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, rms_norm_eps=1e-5,
                         rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0,
                                          "factor": 8.0, "low_freq_factor": 1.0,
                                          "high_freq_factor": 4.0,
                                          "original_max_position_embeddings": 8192},
                         max_position_embeddings=131072, bos_token_id=128000,
                         eos_token_id=128001),
    "qwen3-8b": dict(model_type="qwen3", vocab_size=151936, hidden_size=4096,
                     intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
                     rope_theta=1000000.0, max_position_embeddings=40960,
                     tie_word_embeddings=False, bos_token_id=151643, eos_token_id=151645),
    "gemma-3-270m": dict(model_type="gemma3_text", vocab_size=262144, hidden_size=640,
                         intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4,
                         num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
                         rms_norm_eps=1e-6, sliding_window=512, sliding_window_pattern=6,
                         rope_theta=1000000.0, rope_local_base_freq=10000.0,
                         hidden_activation="gelu_pytorch_tanh", max_position_embeddings=32768,
                         tie_word_embeddings=True, bos_token_id=2, eos_token_id=1),
    "gemma-3-4b": dict(model_type="gemma3_text", vocab_size=262208, hidden_size=2560,
                       intermediate_size=10240, num_hidden_layers=34, num_attention_heads=8,
                       num_key_value_heads=4, head_dim=256, query_pre_attn_scalar=256,
                       rms_norm_eps=1e-6, sliding_window=1024, sliding_window_pattern=6,
                       rope_theta=1000000.0, rope_local_base_freq=10000.0,
                       rope_scaling={"rope_type": "linear", "factor": 8.0},
                       hidden_activation="gelu_pytorch_tanh", max_position_embeddings=131072,
                       tie_word_embeddings=True, bos_token_id=2, eos_token_id=1),
    "gemma-3-12b": dict(model_type="gemma3_text", vocab_size=262208, hidden_size=3840,
                        intermediate_size=15360, num_hidden_layers=48, num_attention_heads=16,
                        num_key_value_heads=8, head_dim=256, query_pre_attn_scalar=256,
                        rms_norm_eps=1e-6, sliding_window=1024, sliding_window_pattern=6,
                        rope_theta=1000000.0, rope_local_base_freq=10000.0,
                        rope_scaling={"rope_type": "linear", "factor": 8.0},
                        hidden_activation="gelu_pytorch_tanh", max_position_embeddings=131072,
                        tie_word_embeddings=True, bos_token_id=2, eos_token_id=1),
    # Dimensions that a model axis of 2, 4 or 8 divides (heads 8, key/value heads 4,
    # MLP 128, vocabulary 640): for tests of model-parallel sharding.
    "tiny-llama-8h": dict(model_type="llama", vocab_size=640, hidden_size=64,
                          intermediate_size=128, num_hidden_layers=2, num_attention_heads=8,
                          num_key_value_heads=4, rms_norm_eps=1e-5, rope_theta=10000.0,
                          max_position_embeddings=512, bos_token_id=1, eos_token_id=2),
    # A mid-size model for CPU benchmarks: big enough that compute dominates.
    "small-llama": dict(model_type="llama", vocab_size=4096, hidden_size=256,
                        intermediate_size=704, num_hidden_layers=6, num_attention_heads=8,
                        num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=10000.0,
                        max_position_embeddings=2048, bos_token_id=1, eos_token_id=2),
}

PRESETS = tuple(_PRESETS)
#: The transformers class of each model_type (``architectures`` of a preset's config).
HF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                    "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                    "gemma3_text": "Gemma3ForCausalLM"}


def preset_hf_config(name: str) -> dict[str, Any]:
    """The Hugging Face-style config dict of a preset."""
    if name not in _PRESETS:
        raise ValueError(f"unknown preset {name!r}; available: {', '.join(PRESETS)}")
    cfg = dict(_PRESETS[name])
    arch = HF_ARCHITECTURES[cfg["model_type"]]
    cfg.setdefault("architectures", [arch])
    return cfg


def preset(name: str) -> ModelConfig:
    """A :class:`ModelConfig` for a named preset (see :data:`PRESETS`)."""
    return ModelConfig.from_hf(preset_hf_config(name))


def layer_inv_freq(config: ModelConfig):
    """Rotary inverse frequencies of every layer ``[L, head_dim // 2]`` (float64 NumPy):
    :func:`rope_inv_freq` on the global layers, and on the sliding-window layers too
    unless ``local_rope_theta`` gives them their own (unscaled) base, as Gemma 3 does."""
    glob = rope_inv_freq(config)
    if config.local_rope_theta is None:
        return np.broadcast_to(glob, (config.num_layers, glob.size)).copy()
    d = config.head_dim
    local = 1.0 / (config.local_rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    return np.stack([local if w > 0 else glob for w in config.windows])


def rope_inv_freq(config: ModelConfig):
    """Rotary inverse frequencies ``[head_dim // 2]`` (float64 NumPy), with the
    checkpoint's scaling applied (``linear`` divides by the factor; ``llama3`` uses
    the wavelength-dependent smoothing of Llama 3.1)."""
    d = config.head_dim
    inv = 1.0 / (config.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    if not config.rope_scaling:
        return inv
    s = dict(config.rope_scaling)
    rtype = s.get("rope_type", "default")
    if rtype == "linear":
        return inv / float(s["factor"])
    if rtype == "llama3":
        factor = float(s["factor"])
        low = float(s.get("low_freq_factor", 1.0))
        high = float(s.get("high_freq_factor", 4.0))
        old_ctx = float(s.get("original_max_position_embeddings", 8192))
        low_wl, high_wl = old_ctx / low, old_ctx / high
        wl = 2 * math.pi / inv
        scaled = np.where(wl > low_wl, inv / factor, inv)
        smooth = (old_ctx / wl - low) / (high - low)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        is_mid = (wl >= high_wl) & (wl <= low_wl)
        return np.where(is_mid, mid, scaled)
    return inv
