"""Decoder configuration: one frozen dataclass covers Llama 2 and 3, Mistral, Qwen2,
Qwen3 and Gemma 3 (text).

The families differ only in fields here (q/k/v biases, q/k norms, sandwich norms and
their ``1 + w`` scale, the MLP's activation, scaled embeddings, the attention's scale,
sliding windows and per-layer rotary bases, rotary scaling, tied embeddings), never in
code. A config is built from a Hugging Face ``config.json`` with
:meth:`ModelConfig.from_hf`, or from a preset with :func:`preset`. Whatever of a
family's config the decoder does not compute (a rope type, soft-capping, experts) is
refused there, naming the field.

Reading a ``config.json`` (its fields, and those refused) is
:mod:`sc_jax.models.hf_config`'s. Adding a family: teach
:func:`sc_jax.models.hf_config.supported_model_type` its ``model_type``, map its fields
in :func:`sc_jax.models.hf_config.hf_fields`, its tensor names in
:func:`sc_jax.models.checkpoint.key_map` (and GGUF's in :mod:`sc_jax.models.gguf`), then
add a tiny random case to ``tests/hf_models.py``: ``tests/models/test_model.py``'s parity tests
run every case against transformers.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from sc_jax.models.hf_config import (SUPPORTED_MODEL_TYPES, ConfigError, check_bool, check_int,
                                     check_number, hf_fields, rope_scaling_fields)

#: Activations of the gated MLP: ``act(x W_gate) * (x W_up)``.
ACTIVATIONS = ("silu", "gelu_tanh")


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
        # The same checks as a config.json's (sc_jax.models.hf_config), on this class's
        # names: a ModelConfig built by hand is held to them too.
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                     "num_heads", "num_kv_heads", "head_dim", "max_position_embeddings"):
            check_int(f"ModelConfig.{name}", getattr(self, name))
        for name in ("rms_norm_eps", "rope_theta"):
            check_number(f"ModelConfig.{name}", getattr(self, name))
        for name in ("embed_scale", "attn_scale", "local_rope_theta"):
            if getattr(self, name) is not None:
                check_number(f"ModelConfig.{name}", getattr(self, name))
        for name in ("tie_word_embeddings", "qkv_bias", "o_bias", "qk_norm", "sandwich_norm"):
            check_bool(f"ModelConfig.{name}", getattr(self, name))
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads}) for grouped-query attention", "num_kv_heads")
        if self.head_dim % 2:
            raise ConfigError(f"head_dim must be even for rotary embeddings, got {self.head_dim}",
                              "head_dim")
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ConfigError(f"model_type {self.model_type!r} is not supported; "
                              f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}", "model_type")
        if self.layer_windows is not None:
            if len(self.layer_windows) != self.num_layers:
                raise ConfigError(f"layer_windows has {len(self.layer_windows)} entries for "
                                  f"{self.num_layers} layers", "layer_windows")
            for w in self.layer_windows:  # 0: a full layer
                check_int("ModelConfig.layer_windows", w, minimum=0)
        if self.hidden_act not in ACTIVATIONS:
            raise ConfigError(f"hidden_act {self.hidden_act!r} is not supported; supported: "
                              f"{', '.join(ACTIVATIONS)}", "hidden_act")
        if self.rope_scaling is not None:
            rope_scaling_fields(dict(self.rope_scaling), self.max_position_embeddings,
                                "ModelConfig.rope_scaling")

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
    def from_hf(cls, cfg: Mapping[str, Any], source: str | Path | None = None) -> "ModelConfig":
        """Build from a Hugging Face ``config.json`` dict (transformers 4.x or 5.x keys),
        every field checked (:mod:`sc_jax.models.hf_config`) before any weight is read.

        Raises ConfigError (a ValueError): one line naming the field, the value and
        ``source`` (the file, or where the dict came from), where given.
        """
        try:
            return cls(**hf_fields(cfg))
        except ConfigError as e:
            if source is None:
                raise
            raise ConfigError(f"{source}: {e}", e.field) from None

    @classmethod
    def from_json(cls, path: str | Path) -> "ModelConfig":
        path = Path(path)
        try:
            cfg = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path} is not valid JSON: {e}") from e
        return cls.from_hf(cfg, source=path)


# ------------------------------------------------------------------ presets
#: The context window of the tiny and small presets. Their byte-level tokenizer makes
#: about one token per character; the longest k = 4 prompt of the nine tasks' data
#: (the four longest texts of a task as demonstrations and its longest again as the
#: query, sequence mode) is 3,650 tokens, on AG News (tests/models/test_presets.py
#: measures it). Rotary positions are computed per token, so the window costs nothing.
TINY_WINDOW = 4096
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
                       max_position_embeddings=TINY_WINDOW, bos_token_id=1, eos_token_id=2),
    "tiny-mistral": dict(model_type="mistral", vocab_size=613, hidden_size=60,
                         intermediate_size=83, num_hidden_layers=2, num_attention_heads=6,
                         num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=10000.0,
                         max_position_embeddings=TINY_WINDOW, sliding_window=64,
                         bos_token_id=1, eos_token_id=2),
    "tiny-qwen2": dict(model_type="qwen2", vocab_size=613, hidden_size=60,
                       intermediate_size=83, num_hidden_layers=2, num_attention_heads=6,
                       num_key_value_heads=3, rms_norm_eps=1e-6, rope_theta=10000.0,
                       max_position_embeddings=TINY_WINDOW, tie_word_embeddings=True,
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
                        max_position_embeddings=TINY_WINDOW, bos_token_id=1, eos_token_id=2),
    "tiny-qwen3": dict(model_type="qwen3", vocab_size=613, hidden_size=60,
                       intermediate_size=83, num_hidden_layers=3, num_attention_heads=6,
                       num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
                       rope_theta=1000000.0, max_position_embeddings=TINY_WINDOW,
                       tie_word_embeddings=True, bos_token_id=1, eos_token_id=2),
    "tiny-gemma3": dict(model_type="gemma3_text", vocab_size=613, hidden_size=60,
                        intermediate_size=83, num_hidden_layers=4, num_attention_heads=6,
                        num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24,
                        rms_norm_eps=1e-6, sliding_window=8,
                        layer_types=["sliding_attention", "sliding_attention",
                                     "full_attention", "sliding_attention"],
                        rope_theta=1000000.0, rope_local_base_freq=10000.0,
                        rope_scaling={"rope_type": "linear", "factor": 2.0},
                        hidden_activation="gelu_pytorch_tanh", max_position_embeddings=TINY_WINDOW,
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
                          max_position_embeddings=TINY_WINDOW, bos_token_id=1, eos_token_id=2),
    # A mid-size model for CPU benchmarks: big enough that compute dominates.
    "small-llama": dict(model_type="llama", vocab_size=4096, hidden_size=256,
                        intermediate_size=704, num_hidden_layers=6, num_attention_heads=8,
                        num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=10000.0,
                        max_position_embeddings=TINY_WINDOW, bos_token_id=1, eos_token_id=2),
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
    return ModelConfig.from_hf(preset_hf_config(name), source=f"preset {name!r}")


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
        # Complete and checked at construction (hf_config.rope_scaling_fields).
        factor = float(s["factor"])
        low = float(s["low_freq_factor"])
        high = float(s["high_freq_factor"])
        old_ctx = float(s["original_max_position_embeddings"])
        low_wl, high_wl = old_ctx / low, old_ctx / high
        wl = 2 * math.pi / inv
        scaled = np.where(wl > low_wl, inv / factor, inv)
        smooth = (old_ctx / wl - low) / (high - low)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        is_mid = (wl >= high_wl) & (wl <= low_wl)
        return np.where(is_mid, mid, scaled)
    return inv
