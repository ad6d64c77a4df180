"""The scoring engine's jitted programs: the flat reference batches'
(:func:`flat_call`), the packed model program every engine call runs
(:func:`packed_call`, one shape per run: :attr:`sc_jax.scoring.packing.PackShape.program`)
and the model-free programs around it, which take the call shape and the token
pool's size (the pool's empty buffer :func:`empty_pool`, the gather of a call's
cache slots :func:`gather_slots`, the in-place write of a call's new keys
:func:`write_tokens`). The host builds their inputs (:mod:`sc_jax.scoring.engine`);
nothing here reads a schedule.
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
# The model program (`packed_call`) has one shape per call size (its rows, width,
# cached keys, readouts and label rows: PackShape.program). The model-free programs
# around it take the pool (a KVCache of one row of `pool` tokens, its size from the
# memory policy) and arrays of the call shape whose values (pool positions) come from
# the host, so that other seeds and datasets find them compiled (in memory or in the
# persistent cache).
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
    """The call's new keys ``kv`` (``[L, B, W, K, Dh]``) written in place into the
    donated ``pool``: token ``i`` of the flattened ``B x W`` at pool position
    ``dst[i]`` (out of range: not kept)."""
    COMPILES["write"] += 1
    L, B, W = kv.k.shape[:3]

    def put(dst_arr, new, lead):
        if lead:
            flat = new.reshape((L, B * W) + new.shape[3:]).astype(dst_arr.dtype)
            return dst_arr.at[:, 0, dst].set(flat, mode="drop")
        return dst_arr.at[0, dst].set(new.reshape(B * W), mode="drop")

    return KVCache(put(pool.k, kv.k, True), put(pool.v, kv.v, True), put(pool.pos, kv.pos, False),
                   put(pool.valid, kv.valid, False))


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
