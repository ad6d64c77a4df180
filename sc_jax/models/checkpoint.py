"""Checkpoint conversion: Hugging Face tensor names -> the stacked parameters of
:class:`sc_jax.models.model.Decoder`, through one explicit key map.

Every expected key is listed from the config, every shape is asserted, and unknown,
missing or duplicate keys are refused by name *before* any weight is read (shapes
come from the safetensors headers). No torch: safetensors reads straight into NumPy.

Tied embeddings with a head in the file: a ``config.json`` that says
``tie_word_embeddings: true`` over a checkpoint that also carries ``lm_head.weight``.
If that tensor equals the embedding (exporters often write the tied copy), the model
stays tied. If it differs, sc_jax follows transformers 5: the file's head is used
(the model is loaded untied, ``tie_word_embeddings=False``) and a warning says so.
Using the embedding as the head there gave logits that differed from transformers'
by up to 0.77 and another top token, without a word (issue 64, case 1).
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path
from typing import Callable, Iterable, Mapping

import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import safe_open

from sc_jax.models.config import ModelConfig, layer_inv_freq
from sc_jax.models.model import LAYER_PARAMS, Decoder
from sc_jax.runtime.multihost import put_global

# Keys some checkpoints carry that hold no weights we need (recomputed buffers).
_IGNORABLE_SUFFIXES = ("rotary_emb.inv_freq",)
# A multimodal Gemma 3 checkpoint (Gemma3ForConditionalGeneration) holds the text tower
# under these prefixes (transformers 5, then 4.x) beside the vision tower's tensors,
# which the text tower does not read.
_TEXT_TOWER_PREFIXES = (("model.language_model.", "model."), ("language_model.model.", "model."),
                        ("language_model.lm_head.", "lm_head."))
_VISION_PREFIXES = ("model.vision_tower.", "model.multi_modal_projector.", "vision_tower.",
                    "multi_modal_projector.")


def text_tower_names(keys: Iterable[str]) -> dict[str, str]:
    """``{our HF name: the checkpoint's name}`` of a checkpoint's text tensors: a
    multimodal Gemma 3 checkpoint's language-model tensors renamed to a text model's,
    its vision tensors left out; any other checkpoint's keys unchanged."""
    keys = list(keys)
    if not any(k.startswith(p) for k in keys for p, _ in _TEXT_TOWER_PREFIXES):
        return {k: k for k in keys}
    out = {}
    for k in keys:
        if k.startswith(_VISION_PREFIXES):
            continue
        new = next((to + k[len(p):] for p, to in _TEXT_TOWER_PREFIXES if k.startswith(p)), k)
        out[new] = k
    return out


@dataclasses.dataclass(frozen=True)
class KeyRule:
    """How one HF tensor maps onto our parameters.

    ``target``: our parameter name; ``layer``: index on the stacked axis or None;
    ``hf_shape``: the shape the checkpoint must have; ``convert``: HF array -> our
    layout (transposes from ``[out, in]`` Linear weights, head splits).
    """

    target: str
    layer: int | None
    hf_shape: tuple[int, ...]
    convert: Callable[[np.ndarray], np.ndarray]


def key_map(config: ModelConfig) -> dict[str, KeyRule]:
    """The full map ``{hf_key: KeyRule}`` that a checkpoint of ``config`` must match."""
    c = config
    D, H, K, Dh, F, V = (c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim,
                         c.intermediate_size, c.vocab_size)

    def heads_in(n):  # Linear [n*Dh, D] -> [D, n, Dh]
        return lambda w: w.T.reshape(D, n, Dh)

    def bias_heads(n):
        return lambda b: b.reshape(n, Dh)

    ident = lambda w: w  # noqa: E731
    transpose = lambda w: w.T  # noqa: E731

    m: dict[str, KeyRule] = {
        "model.embed_tokens.weight": KeyRule("embed", None, (V, D), ident),
        "model.norm.weight": KeyRule("final_norm", None, (D,), ident),
    }
    if not c.tie_word_embeddings:
        m["lm_head.weight"] = KeyRule("lm_head", None, (V, D), ident)
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        m[p + "input_layernorm.weight"] = KeyRule("attn_norm", i, (D,), ident)
        if c.sandwich_norm:
            # Gemma: post_attention_layernorm follows attention; the MLP's input norm
            # is pre_feedforward_layernorm (in Llama's names it is post_attention's).
            m[p + "post_attention_layernorm.weight"] = KeyRule("post_attn_norm", i, (D,), ident)
            m[p + "pre_feedforward_layernorm.weight"] = KeyRule("mlp_norm", i, (D,), ident)
            m[p + "post_feedforward_layernorm.weight"] = KeyRule("post_mlp_norm", i, (D,), ident)
        else:
            m[p + "post_attention_layernorm.weight"] = KeyRule("mlp_norm", i, (D,), ident)
        if c.qk_norm:
            m[p + "self_attn.q_norm.weight"] = KeyRule("q_norm", i, (Dh,), ident)
            m[p + "self_attn.k_norm.weight"] = KeyRule("k_norm", i, (Dh,), ident)
        m[p + "self_attn.q_proj.weight"] = KeyRule("wq", i, (H * Dh, D), heads_in(H))
        m[p + "self_attn.k_proj.weight"] = KeyRule("wk", i, (K * Dh, D), heads_in(K))
        m[p + "self_attn.v_proj.weight"] = KeyRule("wv", i, (K * Dh, D), heads_in(K))
        m[p + "self_attn.o_proj.weight"] = KeyRule("wo", i, (D, H * Dh),
                                                    lambda w: w.T.reshape(H, Dh, D))
        if c.qkv_bias:
            m[p + "self_attn.q_proj.bias"] = KeyRule("bq", i, (H * Dh,), bias_heads(H))
            m[p + "self_attn.k_proj.bias"] = KeyRule("bk", i, (K * Dh,), bias_heads(K))
            m[p + "self_attn.v_proj.bias"] = KeyRule("bv", i, (K * Dh,), bias_heads(K))
        if c.o_bias:
            m[p + "self_attn.o_proj.bias"] = KeyRule("bo", i, (D,), ident)
        m[p + "mlp.gate_proj.weight"] = KeyRule("w_gate", i, (F, D), transpose)
        m[p + "mlp.up_proj.weight"] = KeyRule("w_up", i, (F, D), transpose)
        m[p + "mlp.down_proj.weight"] = KeyRule("w_down", i, (D, F), transpose)
    return m


def check_keys(config: ModelConfig, shapes: Mapping[str, tuple[int, ...]], *, source: str = "checkpoint"):
    """Validate a checkpoint's ``{key: shape}`` against :func:`key_map`.

    Raises ValueError naming every missing, unknown or mis-shaped key. A tied
    checkpoint may still carry ``lm_head.weight`` (some exporters write it); it must
    then have the embedding's shape and is ignored.
    """
    kmap = key_map(config)
    present = set(shapes)
    ignorable = {k for k in present if k.endswith(_IGNORABLE_SUFFIXES)}
    if config.tie_word_embeddings and "lm_head.weight" in present:
        ignorable.add("lm_head.weight")
    missing = sorted(set(kmap) - present)
    unknown = sorted(present - set(kmap) - ignorable)
    bad = [f"{k}: expected {kmap[k].hf_shape}, found {tuple(shapes[k])}"
           for k in sorted(set(kmap) & present) if tuple(shapes[k]) != kmap[k].hf_shape]
    problems = []
    if missing:
        problems.append(f"missing tensors ({len(missing)}): {_short(missing)}")
    if unknown:
        problems.append(f"unknown tensors ({len(unknown)}): {_short(unknown)}")
    if bad:
        problems.append(f"wrong shapes ({len(bad)}): {_short(bad)}")
    if problems:
        raise ValueError(f"{source} does not match a {config.model_type} model with this "
                         f"config.json: " + "; ".join(problems))


def _short(items, n=8):
    s = ", ".join(items[:n])
    return s + (f", ... (+{len(items) - n} more)" if len(items) > n else "")


def convert(config: ModelConfig, tensors: Mapping[str, np.ndarray] | Callable[[str], np.ndarray],
            keys: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """HF tensors -> ``{our_name: array}`` with per-layer tensors stacked ``[L, ...]``.

    ``tensors`` is a mapping, or a function ``key -> array`` that reads lazily (so
    only one checkpoint tensor beyond the output is in host memory at a time).
    Call :func:`check_keys` first; this asserts each shape again as it reads.
    """
    get = tensors.__getitem__ if isinstance(tensors, Mapping) else tensors
    kmap = key_map(config)
    out: dict[str, np.ndarray] = {}
    for key, rule in kmap.items():
        arr = np.asarray(get(key))
        if tuple(arr.shape) != rule.hf_shape:
            raise ValueError(f"tensor {key} has shape {arr.shape}, expected {rule.hf_shape}")
        val = rule.convert(arr)
        if rule.layer is None:
            out[rule.target] = val
        else:
            # Written into the stacked array as it is read (no list of layers and a
            # stack after it: that held every layer weight twice).
            if rule.target not in out:
                out[rule.target] = np.empty((config.num_layers, *val.shape), val.dtype)
            out[rule.target][rule.layer] = val
    return out


# ------------------------------------------------------------------ safetensors dirs
def safetensors_files(model_dir: Path) -> list[Path]:
    """The weight files of an HF directory, picked as transformers picks a local
    folder's (``_get_resolved_checkpoint_files`` in its modeling_utils.py, 5.x): the
    file config.json's ``transformers_weights`` names, else ``model.safetensors``
    (its SAFE_WEIGHTS_NAME), else the shards listed in ``model.safetensors.index.json``
    (SAFE_WEIGHTS_INDEX_NAME). A folder holding both loads the single file, as there."""
    named = _named_weights(model_dir)
    if named is not None:
        if named.name.endswith(".safetensors.index.json"):
            return _shards(named)
        if not named.is_file():
            raise FileNotFoundError(f"{model_dir / 'config.json'}: transformers_weights names "
                                    f"{named.name}, which does not exist")
        return [named]
    single = model_dir / "model.safetensors"
    if single.exists():
        return [single]
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        return _shards(index)
    if list(model_dir.glob("*.bin")) or list(model_dir.glob("*.pth")):
        raise ValueError(f"{model_dir} holds PyTorch .bin weights only; sc_jax reads "
                         "safetensors (no torch at run time). Re-save the model with "
                         "save_pretrained(..., safe_serialization=True).")
    raise FileNotFoundError(f"{model_dir} has neither model.safetensors nor "
                            "model.safetensors.index.json")


def _named_weights(model_dir: Path) -> Path | None:
    """The weights file config.json's ``transformers_weights`` names (a .safetensors
    file or index inside ``model_dir``, as transformers requires), or None."""
    cfg_path = model_dir / "config.json"
    try:
        name = json.loads(cfg_path.read_text()).get("transformers_weights")
    except (OSError, ValueError, AttributeError):
        return None  # no readable config.json mapping: reading it is the config's job
    if name is None:
        return None
    inside = isinstance(name, str) and Path(name).name == name and name not in (".", "..")
    if not inside or not name.endswith((".safetensors", ".safetensors.index.json")):
        raise ValueError(f"{cfg_path}: field 'transformers_weights' must name a .safetensors "
                         f"file or index in {model_dir}, got {json.dumps(name)}")
    return model_dir / name


def _shards(index: Path) -> list[Path]:
    """The shard files a safetensors index lists, each present."""
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        files = sorted(set(weight_map.values()))
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{index} is not a valid safetensors index ({e})") from e
    missing = [f for f in files if not (index.parent / f).exists()]
    if missing:
        raise FileNotFoundError(f"{index} lists shard(s) that do not exist: {missing}")
    return [index.parent / f for f in files]


def untie_distinct_head(config: ModelConfig, shapes: Mapping[str, tuple[int, ...]],
                        get: Callable[[str], np.ndarray], *, source: str) -> ModelConfig:
    """``config`` untied when it says tied but the checkpoint's ``lm_head.weight`` (of
    the embedding's shape, :func:`check_keys`) differs from the embedding: the file's
    head is used, as transformers 5 does, with a warning (see the module docstring).
    Otherwise ``config`` as it is."""
    if not config.tie_word_embeddings or "lm_head.weight" not in shapes:
        return config
    if tuple(shapes["lm_head.weight"]) != tuple(shapes.get("model.embed_tokens.weight", ())):
        return config  # check_keys refuses it
    if np.array_equal(np.asarray(get("lm_head.weight")), np.asarray(get("model.embed_tokens.weight"))):
        return config
    warnings.warn(f"{source}: config.json says tie_word_embeddings but the checkpoint's "
                  "lm_head.weight differs from model.embed_tokens.weight; using the file's head "
                  "(as transformers does). Set tie_word_embeddings to false in config.json to "
                  "silence this.", UserWarning, stacklevel=3)
    return dataclasses.replace(config, tie_word_embeddings=False)


def read_safetensors(config: ModelConfig, files: list[Path]) -> tuple[ModelConfig, dict[str, np.ndarray]]:
    """Validate headers (keys, shapes, duplicates across shards), then read and
    convert. Returns the config the weights are for (:func:`untie_distinct_head`:
    untied when a tied config's file carries a head of its own) and ``{our_name:
    array}`` in the checkpoint's dtype."""
    where: dict[str, Path] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    handles = []
    try:
        for f in files:
            try:
                h = safe_open(str(f), framework="numpy")
            except Exception as e:  # safetensors raises its own error types
                raise ValueError(f"cannot read {f} as safetensors: {e}") from e
            handles.append(h)
            for k in h.keys():
                if k in where:
                    raise ValueError(f"tensor {k} appears in both {where[k].name} and {f.name}")
                where[k] = f
                shapes[k] = tuple(h.get_slice(k).get_shape())
        names = text_tower_names(shapes)
        check_keys(config, {ours: shapes[theirs] for ours, theirs in names.items()},
                   source=str(files[0].parent))
        by_file = {f: h for f, h in zip(files, handles)}

        def get(k):
            return by_file[where[names[k]]].get_tensor(names[k])

        ours = {o: shapes[t] for o, t in names.items()}
        config = untie_distinct_head(config, ours, get, source=str(files[0].parent))
        return config, convert(config, get)
    finally:
        handles.clear()


def decoder_from_arrays(config: ModelConfig, arrays: Mapping[str, np.ndarray], *, dtype, sharding=None,
                        consume: bool = False):
    """Build a :class:`~sc_jax.models.model.Decoder` from converted arrays without ever
    allocating random weights (the module is created abstractly, then filled).

    ``sharding``: a ``jax.sharding.Sharding`` for every parameter, or a function
    ``(name, shape) -> Sharding`` (:func:`sc_jax.runtime.sharding.param_sharding` over a mesh)
    (default: the default device). ``consume``: delete each array from ``arrays`` (a dict) once it is
    on the device, so host memory holds about one copy of the weights, not two.
    """
    model = nnx.eval_shape(lambda: Decoder(config, dtype=dtype, rngs=nnx.Rngs(0)))
    expected = {"embed", "final_norm"} | ({"lm_head"} if not config.tie_word_embeddings else set())
    expected |= {n for n in LAYER_PARAMS if hasattr(model.layers, n)}
    if set(arrays) != expected:
        raise ValueError(f"converted arrays {sorted(arrays)} do not match the model's "
                         f"parameters {sorted(expected)}")

    def where(name, shape):
        return sharding(name, shape) if callable(sharding) else sharding

    def put(x, name):
        x = np.asarray(x)
        x = jnp.asarray(x, dtype=dtype) if sharding is None else put_global(
            x.astype(jnp.dtype(dtype)), where(name, x.shape))
        return x

    for name in list(arrays):
        arr = arrays[name]
        owner = model.layers if name in LAYER_PARAMS else model
        var = getattr(owner, name)
        if tuple(var.get_value().shape) != tuple(arr.shape):
            raise ValueError(f"{name}: converted shape {arr.shape} != model shape "
                             f"{var.get_value().shape}")
        var.set_value(put(arr, name))
        if consume:
            del arrays[name], arr  # host copy freed as soon as the device has it
    consts = {"inv_freq": np.asarray(layer_inv_freq(config), np.float32),
              "windows": np.asarray(config.windows, np.int32)}
    for name, val in consts.items():
        getattr(model, name).set_value(jnp.asarray(val) if sharding is None else put_global(val, where(name, val.shape)))
    return model
