"""The scoring engine's jitted programs: the flat reference batches'
(:func:`flat_call`), the one program every engine call runs (:func:`packed_step`, one
per call size: :attr:`sc_jax.scoring.packing.PackShape.program`, and the token pool's
size) and its parts: the gather of a call's cache slots from the token pool
(:func:`gather_slots`), the packed model (:func:`packed_call`, also a program of its
own for cost and lowering checks) and the in-place write of a call's new keys
(:func:`write_tokens`); the pool's empty buffer (:func:`empty_pool`). The host builds
their inputs (:mod:`sc_jax.scoring.engine`); nothing here reads a schedule.
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from sc_jax.models.model import KVCache, Packing, positions_from_valid

#: Number of traces (= compilations) of each jitted program here in this process.
#: Module-level on purpose: JAX's jit cache, whose traces it counts, is process-wide
#: too; tests and benchmarks read it to check what a run compiles.
COMPILES: Counter = Counter()


class PackedInputs(NamedTuple):
    """The packed rows of one call, as the model program takes them (a pytree):
    per token ``[B, W]`` ``tokens``, rotary ``positions``, ``valid``, ``segment``
    (its item within the row, -1 in padding) and ``slot`` (its item's cache slot);
    per readout ``[R]`` the flat position ``readout`` into ``B x W`` and the label
    token ``targets`` (read in sequence mode)."""

    tokens: jax.Array
    positions: jax.Array
    valid: jax.Array
    segment: jax.Array
    slot: jax.Array
    readout: jax.Array
    targets: jax.Array


# ------------------------------------------------------------------ flat batches
def _label_scores(model, hidden, gather, targets, tmask, rows, sequence: bool):
    sel = jnp.take_along_axis(hidden, gather[..., None], axis=1)  # [B, P, D]
    if not sequence:
        return model.project(sel[:, 0], rows)  # [B, n] label-row logits
    lp = jax.nn.log_softmax(model.project(sel), axis=-1)  # [B, P, V] at P positions only
    tok = jnp.take_along_axis(lp, targets[..., None], axis=-1)[..., 0]
    return jnp.sum(jnp.where(tmask, tok, 0.0), axis=-1)  # [B]


@functools.partial(jax.jit, static_argnames=("graphdef", "sequence"))
def flat_call(graphdef, state, tokens, valid, gather, targets, tmask, rows, sequence):
    """Full prompts ``tokens [B, T]`` (``valid``) in one batch: the label scores at
    ``gather [B, P]`` (``[B, n]`` label-row logits, or in sequence mode ``[B]``
    summed log-probabilities of ``targets`` where ``tmask``)."""
    COMPILES["flat"] += 1
    model = nnx.merge(graphdef, state)
    hidden, _ = model(tokens, positions_from_valid(valid), valid)
    return _label_scores(model, hidden, gather, targets, tmask, rows, sequence)


@functools.partial(jax.jit, static_argnames=("graphdef",))
def last_states(graphdef, state, tokens, valid, last):
    """Full prompts ``tokens [B, T]`` (``valid``): the final-norm hidden state at
    position ``last [B]`` of each, float32 ``[B, D]`` (the plain path of the engine's
    ``hidden`` readouts)."""
    COMPILES["states"] += 1
    model = nnx.merge(graphdef, state)
    hidden, _ = model(tokens, positions_from_valid(valid), valid)
    return jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0].astype(jnp.float32)


# ------------------------------------------------------------------ the engine's programs
# An engine call is one program (`packed_step`) per call size (its rows, width, cached
# keys, readouts and label rows: PackShape.program): the gather of the call's cache from
# the token pool (a KVCache of one row of `pool` tokens, its size from the memory
# policy), the model, and the write of the new keys into the pool, at pool positions
# the host computes, so that other seeds and datasets find it compiled (in memory or in
# the persistent cache). The parts are jitted functions of their own; called inside
# `packed_step` they are inlined into its one XLA program.
@jax.jit
def gather_slots(pool: KVCache, src, key_slot):
    """The cache of a call: pool positions ``src [B, keys]`` (each row's slots side by
    side, their padding position 0, never written: invalid) ->
    ``[L, B, keys, K, Dh]``, and the slot of every cached key ``key_slot [keys]``
    (-1 past the slots) broadcast to ``[B, keys]``."""
    COMPILES["gather"] += 1
    cache = KVCache(pool.k[:, 0, src], pool.v[:, 0, src], pool.pos[0, src], pool.valid[0, src])
    return cache, jnp.broadcast_to(key_slot, src.shape)


@functools.partial(jax.jit, static_argnames=("graphdef", "sequence", "attention", "hidden"))
def packed_call(graphdef, state, cache: KVCache, cache_slot, inputs: PackedInputs, rows, sequence,
                attention="dense", hidden=False):
    """One packed call: ``B`` rows of ``W`` tokens (:class:`PackedInputs`), several
    items per row, each after its own slot of ``cache`` (``[L, B, keys, K, Dh]``, the
    slot of each key ``cache_slot [B, keys]``: :class:`sc_jax.models.model.Packing`),
    label rows ``rows [labels]`` (None in sequence mode), its attention by
    ``attention`` (:mod:`sc_jax.models.attention`). Returns the label
    scores at the ``R`` flat positions ``readout`` (``[R, labels]`` label-row logits, or
    ``[R]`` log-probabilities of ``targets`` in sequence mode) and the new tokens'
    keys and values ``[L, B, W, K, Dh]``. With ``hidden`` (a program of its own) the
    scores come as ``(scores, states)``: ``states [R, D]`` float32, the final-norm
    hidden state each readout's logits are projected from."""
    COMPILES["packed"] += 1
    x = inputs
    model = nnx.merge(graphdef, state)
    h, kv = model(x.tokens, x.positions, x.valid, cache, Packing(x.segment, x.slot, cache_slot),
                  attention)
    B, W, D = h.shape
    sel = h.reshape(B * W, D)[x.readout]  # [R, D]
    if not sequence:
        scores = model.project(sel, rows)
    else:
        lp = jax.nn.log_softmax(model.project(sel), axis=-1)  # full vocabulary at R positions only
        scores = jnp.take_along_axis(lp, x.targets[:, None], axis=-1)[:, 0]
    return ((scores, sel.astype(jnp.float32)) if hidden else scores), kv


@functools.partial(jax.jit, donate_argnames=("pool",))
def write_tokens(pool: KVCache, kv: KVCache, dst):
    """The call's new keys ``kv`` (``[L, B, W, K, Dh]``, positions and validity
    ``[B, W]``) written in place into the donated ``pool``: token ``i`` of the flattened
    ``B x W`` at pool position ``dst[i]`` (out of range: not kept). A field of ``kv``
    that is None is left as it is."""
    COMPILES["write"] += 1

    def put(dst_arr, new):
        if new is None:
            return dst_arr
        if new.ndim > 2:  # [L, B, W, K, Dh] -> [L, B x W, K, Dh]
            flat = new.reshape((new.shape[0], -1) + new.shape[3:]).astype(dst_arr.dtype)
            return dst_arr.at[:, 0, dst].set(flat, mode="drop")
        return dst_arr.at[0, dst].set(new.reshape(-1), mode="drop")

    return KVCache(put(pool.k, kv.k), put(pool.v, kv.v), put(pool.pos, kv.pos),
                   put(pool.valid, kv.valid))


@functools.partial(jax.jit, static_argnames=("graphdef", "sequence", "attention", "hidden"),
                   donate_argnames=("pool",))
def packed_step(graphdef, state, pool: KVCache, src, key_slot, inputs: PackedInputs, rows, dst,
                sequence, attention="dense", hidden=False):
    """One engine call as one program: the cache gathered from the donated token
    ``pool`` (:func:`gather_slots` of ``src [B, keys]``, ``key_slot [keys]``), the packed
    model on it (:func:`packed_call`), and the call's new tokens written into the pool in
    place (:func:`write_tokens` at ``dst [B x W]``; a call that keeps none passes
    positions out of range, so every call of a size is this one program). Returns
    ``(scores, pool)``: :func:`packed_call`'s scores (``(scores, states)`` with
    ``hidden``) and the written pool, which aliases the donated one."""
    COMPILES["step"] += 1
    # A call's cache is its items' ancestors, written by earlier calls: it never reads a
    # pool position it writes. Its tokens' positions and validity (inputs, not model
    # outputs) are written first and the cache gathered after, as the keys are written
    # after the gather (through the model): each write is ordered after the reads of
    # its buffer, so XLA writes in place (positions written after the gather, with
    # nothing ordering the two, were copied whole).
    pool = write_tokens(pool, KVCache(None, None, inputs.positions, inputs.valid), dst)
    cache, cache_slot = gather_slots(pool, src, key_slot)
    scores, kv = packed_call(graphdef, state, cache, cache_slot, inputs, rows, sequence=sequence,
                             attention=attention, hidden=hidden)
    return scores, write_tokens(pool, KVCache(kv.k, kv.v, None, None), dst)


@functools.partial(jax.jit, static_argnames=("config", "tokens", "dtype", "sharding"))
def empty_pool(config, tokens: int, dtype, sharding=None):
    """A zeroed token pool ``[L, 1, tokens, K, Dh]`` (all positions invalid), its key
    and value heads split over the mesh's model axis when there is one."""
    COMPILES["pool"] += 1
    L, K, Dh = config.num_layers, config.num_kv_heads, config.head_dim
    z = jnp.zeros((L, 1, tokens, K, Dh), dtype)
    out = KVCache(z, z, jnp.zeros((1, tokens), jnp.int32), jnp.zeros((1, tokens), bool))
    if sharding is not None:
        out = jax.lax.with_sharding_constraint(out, sharding)
    return out
