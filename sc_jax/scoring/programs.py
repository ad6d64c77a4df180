"""The scoring engine's jitted programs: the flat reference batches'
(:func:`flat_call`), the packed model program every engine call runs
(:func:`packed_call`, one shape per run: :attr:`sc_jax.scoring.packing.PackShape.program`)
and the model-free programs around it, which take the trie levels' shapes (a level's
empty buffer :func:`empty_level`, the gather of a call's cache slots
:func:`gather_slots`, the in-place write of a call's children :func:`write_children`).
The host builds their inputs (:mod:`sc_jax.scoring.engine`); nothing here reads a
schedule.
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
#: too; tests and benchmarks read it to check that a run compiles one model program.
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


class ChildWrites(NamedTuple):
    """The children one call writes into the next level, ``[C]`` each (a pytree):
    the ``child`` row of the level (out of range: none), its ``parent_row`` in the
    level the call read, and its new tokens' flat ``start`` in the call and
    ``length``."""

    child: jax.Array
    parent_row: jax.Array
    start: jax.Array
    length: jax.Array


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


# ------------------------------------------------------------------ the engine's programs
# The model program (`packed_call`) has one shape for every call of a run (its rows,
# width, cached keys, readouts and label rows: PackShape.program). The model-free
# gathers, writes and level buffers around it take the level shapes, which the
# schedule buckets (sc_jax.scoring.schedule.level_lengths, level_rows), and arguments
# of the call shape, so that other seeds find them compiled (in memory or in the
# persistent cache).
@functools.partial(jax.jit, static_argnames=("S", "keys"))
def gather_slots(level: KVCache, idx, S: int, keys: int):
    """The cache of a call: rows ``idx[:, :m]`` (``idx [B, keys // MIN_CACHE]`` with
    :data:`sc_jax.scoring.packing.MIN_CACHE`, one shape for every depth; ``m = keys //
    S``) of a level buffer, each padded to ``S``
    tokens and laid side by side, then padded to ``keys`` (never visible):
    ``[L, B, keys, K, Dh]``, and the slot of every cached key ``[B, keys]`` (-1 in
    the padding)."""
    COMPILES["gather"] += 1
    m = max(1, keys // S)
    idx = idx[:, :m]
    B = idx.shape[0]
    flat = idx.reshape(-1)
    pad = S - level.length
    tail = keys - m * S

    def rows(x, lead):
        x = x[:, flat] if lead else x[flat]
        widths = [(0, 0)] * x.ndim
        widths[2 if lead else 1] = (0, pad)
        x = jnp.pad(x, widths)
        x = x.reshape(x.shape[:1] + (B, m * S) + x.shape[3:]) if lead else x.reshape(B, m * S)
        widths = [(0, 0)] * x.ndim
        widths[2 if lead else 1] = (0, tail)
        return jnp.pad(x, widths)

    cache = KVCache(rows(level.k, True), rows(level.v, True), rows(level.pos, False),
                    rows(level.valid, False))
    slot = jnp.pad(jnp.repeat(jnp.arange(m, dtype=jnp.int32), S), (0, tail), constant_values=-1)
    return cache, jnp.broadcast_to(slot, (B, keys))


@functools.partial(jax.jit, static_argnames=("graphdef", "sequence", "attention"))
def packed_call(graphdef, state, cache: KVCache, cache_slot, inputs: PackedInputs, rows, sequence,
                attention="dense"):
    """One packed call: ``B`` rows of ``W`` tokens (:class:`PackedInputs`), several
    items per row, each after its own slot of ``cache`` (``[L, B, keys, K, Dh]``, the
    slot of each key ``cache_slot [B, keys]``: :class:`sc_jax.models.model.Packing`),
    label rows ``rows [labels]`` (None in sequence mode), its attention by
    ``attention`` (:mod:`sc_jax.models.attention`). Returns the label
    scores at the ``R`` flat positions ``readout`` (``[R, labels]`` label-row logits, or
    ``[R]`` log-probabilities of ``targets`` in sequence mode) and the new tokens'
    keys and values ``[L, B, W, K, Dh]``."""
    COMPILES["packed"] += 1
    x = inputs
    model = nnx.merge(graphdef, state)
    hidden, kv = model(x.tokens, x.positions, x.valid, cache, Packing(x.segment, x.slot, cache_slot),
                       attention)
    B, W, D = hidden.shape
    sel = hidden.reshape(B * W, D)[x.readout]  # [R, D]
    if not sequence:
        return model.project(sel, rows), kv
    lp = jax.nn.log_softmax(model.project(sel), axis=-1)  # full vocabulary at R positions only
    return jnp.take_along_axis(lp, x.targets[:, None], axis=-1)[:, 0], kv


@functools.partial(jax.jit, donate_argnames=("level",))
def write_children(level: KVCache, parent: KVCache, kv: KVCache, children: ChildWrites):
    """Children written in place into the donated ``level`` buffer: child row
    ``child[c]`` (out of range: ignored) = parent row ``parent_row[c]`` then the
    ``length[c]`` new tokens at flat position ``start[c]`` of the call's ``kv``."""
    COMPILES["write"] += 1
    child, parent_row, start, length = children
    L, BW = kv.k.shape[0], kv.k.shape[1] * kv.k.shape[2]
    T = level.length - parent.length
    col = jnp.arange(T)
    src = jnp.clip(start[:, None] + col, 0, BW - 1)  # [C, T]
    ok = col[None, :] < length[:, None]

    def seg(x, lead):
        flat = x.reshape((L, BW) + x.shape[3:]) if lead else x.reshape(BW)
        return flat[:, src] if lead else flat[src]

    def put(dst, par, new, lead):
        rows = jnp.concatenate([par[:, parent_row] if lead else par[parent_row], new.astype(dst.dtype)],
                               axis=2 if lead else 1)
        return dst.at[:, child].set(rows, mode="drop") if lead else dst.at[child].set(rows, mode="drop")

    okb = ok[None, :, :, None, None]
    return KVCache(put(level.k, parent.k, jnp.where(okb, seg(kv.k, True), 0), True),
                   put(level.v, parent.v, jnp.where(okb, seg(kv.v, True), 0), True),
                   put(level.pos, parent.pos, jnp.where(ok, seg(kv.pos, False), 0), False),
                   put(level.valid, parent.valid, ok & seg(kv.valid, False), False))


@functools.partial(jax.jit, static_argnames=("config", "rows", "length", "dtype", "sharding"))
def empty_level(config, rows: int, length: int, dtype, sharding=None):
    """A zeroed level buffer ``[L, rows, length, K, Dh]`` (all positions invalid),
    its rows split over the mesh's data axis when there is one."""
    COMPILES["level"] += 1
    L, K, Dh = config.num_layers, config.num_kv_heads, config.head_dim
    z = jnp.zeros((L, rows, length, K, Dh), dtype)
    out = KVCache(z, z, jnp.zeros((rows, length), jnp.int32), jnp.zeros((rows, length), bool))
    if sharding is not None:
        out = jax.lax.with_sharding_constraint(out, sharding)
    return out
