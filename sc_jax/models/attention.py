"""Attention of packed rows (the scoring engine's calls): each token sees the cached keys
of its own slot and the new keys of its own segment, nothing else.

A packed call (:class:`sc_jax.models.model.Packing`) has ``B`` rows of ``W`` new tokens, each
row after ``C`` cached keys: the row's ``m`` slots of ``S`` keys side by side, padded
(``C`` is fixed for a run; ``m`` and ``S`` change with the trie depth). A token of slot ``j``
may see ``S`` of the ``C`` cached keys and the earlier tokens of its own item, so the
attention of a row over all ``C + W`` keys computes ``m`` times too many scores over
the cache and most of the ``W`` packed ones (85-90% masked on a 7B plan). Four
implementations, one answer (to float rounding), chosen on the device by timing them
(:mod:`sc_jax.scoring.attention_choice`; :func:`choose` is what a plan assumes).

This module is where a name becomes a computation: :data:`REGISTRY` maps each name to
an :class:`Implementation`, which builds its own typed inputs once per call from the
call's :class:`PackedTokens` (:func:`packed_inputs`: only what it reads, a pytree) and
runs one layer on them (:func:`packed_attention`):

* ``"dense"``: XLA, every key of the row scored and masked (the plain path the others
  are tested against). The masks (:class:`DenseInputs`) are built once per call and
  shared by every layer; the cached and packed scores are normalised together without
  concatenating them.
* ``"blocked"``: XLA, block-sparse with an online softmax (FlashAttention's
  recurrence): the queries in blocks of ``bq`` tokens, the keys in blocks; each query
  block scores only the key blocks that hold its slots' cached keys and its items'
  earlier tokens (:func:`block_ranges`; :class:`BlockedInputs`). On a CPU the loops run to the call's largest
  such range, a traced number, so one program serves every depth. On an accelerator
  they run over every key block, the masks doing the skipping: a traced trip count
  there would have the host read each iteration's predicate back from the device
  (XLA's GPU while loop), hundreds of round trips per call. Scores never exceed one
  ``[bq, bk]`` tile per block and head.
* ``"cudnn"``: ``jax.nn.dot_product_attention(implementation="cudnn")`` over the row's
  ``C + W`` keys with the packed mask (:class:`CudnnInputs`): cuDNN's fused flash kernel (GPU, bfloat16 or
  float16) never writes the scores to memory, at the price of scoring masked keys.
* ``"pallas"``: one Pallas kernel that scores only the key blocks of ``"blocked"``,
  with the block bounds read inside the kernel (:class:`SparseInputs`, the kernel's
  keyword arguments), so its loops never leave the device:
  Triton on a GPU (:mod:`sc_jax.models.pallas_attention`), Mosaic on a TPU
  (:mod:`sc_jax.models.pallas_tpu_attention`). On a CPU the GPU kernel runs in
  Pallas' interpreter (slow: for tests); on another accelerator, the accelerator form
  of ``"blocked"``.

Where a path differs by platform, ``jax.lax.platform_dependent`` picks the branch when
the program is lowered for its platform, so a program exported for a GPU from a CPU
host is the GPU's.

Shapes: B rows, W new tokens, C cached keys, H query heads, K key/value heads,
G = H / K, Dh head dim.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sc_jax.models import pallas_attention, pallas_tpu_attention

#: Query and packed-key block of ``"blocked"`` (tokens; divides W) and its cache-key
#: block (divides C). Small blocks skip more masked keys; large ones make larger
#: matrix products. Per platform, as the call shape is.
BLOCKS = {"cpu": (32, 64), "default": (64, 128)}
# Finite, so a row with no visible key gives zeros rather than NaN; its output is
# never read.
_MASK_VALUE = -1e30
# The id of a padding key: equal to no query's slot or item (those are >= -1).
_INVALID = pallas_attention.INVALID


class PackedTokens(NamedTuple):
    """Where every token of a packed call sits, what each implementation's inputs are
    built from (:func:`packed_inputs`): per new token ``[B, W]`` its rotary position
    ``q_pos``, ``q_valid`` (False: padding), its item ``segment`` (-1 in padding) and
    its item's cache ``slot``; per cached key ``[B, C]`` ``c_pos``, ``c_valid`` and
    ``c_slot`` (the slot it belongs to, -1 past the slots)."""

    q_pos: jax.Array
    q_valid: jax.Array
    segment: jax.Array
    slot: jax.Array
    c_pos: jax.Array
    c_valid: jax.Array
    c_slot: jax.Array


class DenseInputs(NamedTuple):
    """``"dense"``'s inputs: ``cache`` ``[B, W, C]``, the token may see the cached key
    (valid, its slot, not later); ``new`` ``[B, W, W]``, it may see the packed key
    (valid, its segment, not later; the diagonal always, so a padding query sees one
    key); ``d_cache``, ``d_new``: query minus key position, for sliding windows (None
    when no layer has one)."""

    cache: jax.Array
    new: jax.Array
    d_cache: jax.Array | None
    d_new: jax.Array | None


class CudnnInputs(NamedTuple):
    """``"cudnn"``'s inputs, over the row's ``C + W`` keys (cached, then packed): the
    dense masks side by side, ``mask`` ``[B, W, C + W]``, and the position differences
    ``d`` (None without sliding windows)."""

    mask: jax.Array
    d: jax.Array | None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SparseInputs:
    """What the block-sparse loops read (the Pallas kernels' keyword arguments, and the
    XLA form of ``"blocked"``): per new token ``[B, W]`` ``q_pos``, ``q_slot``,
    ``q_seg`` and ``k_id`` (its item if valid, else :data:`_INVALID`); per cached key
    ``[B, C]`` ``c_pos`` and ``c_id`` (its slot if valid, else :data:`_INVALID`), so a
    key's validity is folded into its id; the block bounds of :func:`block_ranges`
    (``c_lo``, ``c_n``, ``n_lo`` ``[B, W/bq]``) for blocks of ``bq`` queries and ``bk``
    cached keys; ``windows``: some layer has a sliding window."""

    q_pos: jax.Array
    q_slot: jax.Array
    q_seg: jax.Array
    k_id: jax.Array
    c_pos: jax.Array
    c_id: jax.Array
    c_lo: jax.Array
    c_n: jax.Array
    n_lo: jax.Array
    bq: int = dataclasses.field(metadata=dict(static=True))
    bk: int = dataclasses.field(metadata=dict(static=True))
    windows: bool = dataclasses.field(metadata=dict(static=True))

    def kwargs(self) -> dict:
        """The fields as keyword arguments (a Pallas kernel's)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


class BlockedInputs(NamedTuple):
    """``"blocked"``'s inputs: the block-sparse ones and ``trips`` ``[2]``, the call's
    largest count of cache and packed key blocks (the CPU's loop bounds)."""

    sparse: SparseInputs
    trips: jax.Array


class Implementation(NamedTuple):
    """One packed attention: ``inputs(tokens, windows, blocks)`` builds its inputs once
    per call from the :class:`PackedTokens` (shared by every layer), ``attend(q, k, v,
    ck, cv, inputs, window)`` runs one layer on them; ``blocks(platform, W, C)`` gives
    its ``(bq, bk)`` (None: it is not blocked)."""

    inputs: Callable
    attend: Callable
    blocks: Callable | None = None


def choose(platform: str) -> str:
    """The implementation a plan assumes where none was measured (``sc-jax plan``; the
    engine measures on its device: :mod:`sc_jax.scoring.attention_choice`): the Pallas
    kernel on a GPU (cuDNN's builds no plan on some CUDA releases, and scores masked
    keys), the block-sparse XLA path elsewhere (on a CPU, where it is the faster:
    ``benchmarks/RESULTS.md``)."""
    return "pallas" if platform in ("gpu", "cuda") else "blocked"


def blocks(implementation: str, platform: str, W: int, C: int) -> tuple[int, int] | None:
    """``(bq, bk)``, the query and cache-key blocks of ``implementation`` at a call of
    ``W`` new tokens after ``C`` cached keys on ``platform`` (None: not blocked)."""
    impl = _implementation(implementation)
    return impl.blocks(platform, W, C) if impl.blocks is not None else None


def _blocked_blocks(platform: str, W: int, C: int) -> tuple[int, int]:
    bq, bk = BLOCKS.get(platform, BLOCKS["default"])
    return (bq if W % bq == 0 else W), (bk if C % bk == 0 else C)  # blocks that tile


def _pallas_blocks(platform: str, W: int, C: int) -> tuple[int, int]:
    return pallas_attention.blocks(W, C)  # one choice for every platform: see pallas_attention


def _segment_first(segment):
    """``[B, W]``: the column where each token's segment begins (segments are runs)."""
    W = segment.shape[1]
    col = jnp.arange(W, dtype=jnp.int32)
    first = jnp.concatenate([jnp.ones_like(segment[:, :1], bool), segment[:, 1:] != segment[:, :-1]],
                            axis=1)
    return jax.lax.cummax(jnp.where(first, col, 0), axis=1)


def block_ranges(q_valid, q_slot, q_seg, c_slot, bq: int, bk: int):
    """Per query block of ``bq`` tokens: the cache-key blocks (of ``bk``) that hold the
    keys of its tokens' slots (first ``c_lo`` and count ``c_n``, ``[B, W/bq]``), the
    first packed-key block (of ``bq``) that holds its items' first tokens (``n_lo``),
    and the call's largest counts ``trips = [max c_n, max packed blocks]``.

    The slots of a row lie side by side in its cache in order (``c_slot``: 0, ..., m-1,
    then -1 for padding), so a slot's keys are one range, found by binary search."""
    B, W = q_slot.shape
    C = c_slot.shape[1]
    nq = W // bq
    big = jnp.int32(np.iinfo(np.int32).max // 2)
    cs = jnp.where(c_slot < 0, big, c_slot)
    lo = jax.vmap(lambda c, s: jnp.searchsorted(c, s, side="left"))(cs, q_slot).astype(jnp.int32)
    hi = jax.vmap(lambda c, s: jnp.searchsorted(c, s, side="right"))(cs, q_slot).astype(jnp.int32)
    lo = jnp.where(q_valid, lo, C).reshape(B, nq, bq).min(-1)
    hi = jnp.where(q_valid, hi, 0).reshape(B, nq, bq).max(-1)
    c_lo = jnp.minimum(lo // bk, C // bk - 1)
    c_n = jnp.maximum(0, -(-hi // bk) - c_lo)
    first = jnp.where(q_valid, _segment_first(q_seg), W).reshape(B, nq, bq).min(-1)
    qb = jnp.arange(nq, dtype=jnp.int32)
    n_lo = jnp.minimum(first // bq, qb)  # a block of padding sees its own block only
    trips = jnp.stack([jnp.max(c_n), jnp.max(qb - n_lo + 1)]).astype(jnp.int32)
    return c_lo.astype(jnp.int32), c_n.astype(jnp.int32), n_lo.astype(jnp.int32), trips


def packed_inputs(tokens: PackedTokens, *, implementation: str, windows: bool,
                  platform: str = "default"):
    """The inputs of ``implementation`` for one packed call, built once and shared by
    every layer: :class:`DenseInputs`, :class:`CudnnInputs`, :class:`BlockedInputs` or
    (``"pallas"``) :class:`SparseInputs`. ``tokens``: the call's :class:`PackedTokens`
    (``[B, W]`` and ``[B, C]``, one cached row per batch row); ``windows``: some layer
    has a sliding window; ``platform``: the one the blocks are chosen for."""
    impl = _implementation(implementation)
    W, C = tokens.q_pos.shape[1], tokens.c_pos.shape[1]
    return impl.inputs(tokens, windows, impl.blocks(platform, W, C) if impl.blocks else None)


def _dense_inputs(t: PackedTokens, windows: bool, blocks=None) -> DenseInputs:
    W = t.q_pos.shape[1]
    d_c = t.q_pos[:, :, None] - t.c_pos[:, None, :]
    d_n = t.q_pos[:, :, None] - t.q_pos[:, None, :]
    cache = t.c_valid[:, None, :] & (t.slot[:, :, None] == t.c_slot[:, None, :]) & (d_c >= 0)
    new = t.q_valid[:, None, :] & (t.segment[:, :, None] == t.segment[:, None, :]) & (d_n >= 0)
    new = new | jnp.eye(W, dtype=bool)[None]
    return DenseInputs(cache, new, d_c if windows else None, d_n if windows else None)


def _cudnn_inputs(t: PackedTokens, windows: bool, blocks=None) -> CudnnInputs:
    m = _dense_inputs(t, windows)
    d = jnp.concatenate([m.d_cache, m.d_new], axis=-1) if windows else None
    return CudnnInputs(jnp.concatenate([m.cache, m.new], axis=-1), d)


def _sparse_inputs(t: PackedTokens, windows: bool, blocks) -> tuple[SparseInputs, jax.Array]:
    """The block-sparse inputs and the call's largest trip counts."""
    bq, bk = blocks
    c_lo, c_n, n_lo, trips = block_ranges(t.q_valid, t.slot, t.segment, t.c_slot, bq, bk)
    sparse = SparseInputs(t.q_pos, t.slot, t.segment, jnp.where(t.q_valid, t.segment, _INVALID),
                          t.c_pos, jnp.where(t.c_valid, t.c_slot, _INVALID), c_lo, c_n, n_lo,
                          bq=bq, bk=bk, windows=windows)
    return sparse, trips


def _blocked_inputs(t: PackedTokens, windows: bool, blocks) -> BlockedInputs:
    return BlockedInputs(*_sparse_inputs(t, windows, blocks))


def _pallas_inputs(t: PackedTokens, windows: bool, blocks) -> SparseInputs:
    return _sparse_inputs(t, windows, blocks)[0]


def packed_attention(q, k, v, ck, cv, inputs, window, *, implementation: str):
    """Attention of a packed call's new queries over their slots' cached keys and their
    segments' new keys (paper-independent; the model's attention, Vaswani et al.
    eq. 1, softmax(q k^T / sqrt(Dh)) v, restricted to the keys each token may see).

    q: ``[B, W, H, Dh]``; k, v: ``[B, W, K, Dh]``; ck, cv: ``[B, C, K, Dh]``;
    ``inputs``: :func:`packed_inputs` of the same ``implementation``; ``window``: this
    layer's sliding window (0: none). Returns ``[B, W, H, Dh]``."""
    return _implementation(implementation).attend(q, k, v, ck, cv, inputs, window)


def _implementation(name: str) -> Implementation:
    if name not in REGISTRY:
        raise ValueError(f"attention implementation must be one of {tuple(REGISTRY)}, got {name!r}")
    return REGISTRY[name]


def _windowed(mask, d, window):
    if d is None:
        return mask
    return mask & ((window <= 0) | (d < window))


def _dense(q, k, v, ck, cv, masks: DenseInputs, window):
    B, W, H, Dh = q.shape
    K = k.shape[2]
    qg = q.reshape(B, W, K, H // K, Dh)
    scale = 1.0 / np.sqrt(Dh)
    vis_c = _windowed(masks.cache, masks.d_cache, window)[:, None, None]
    vis_n = _windowed(masks.new, masks.d_new, window)[:, None, None]
    s_c = jnp.einsum("btkgd,bskd->bkgts", qg, ck, preferred_element_type=jnp.float32) * scale
    s_n = jnp.einsum("btkgd,bskd->bkgts", qg, k, preferred_element_type=jnp.float32) * scale
    s_c = jnp.where(vis_c, s_c, _MASK_VALUE)
    s_n = jnp.where(vis_n, s_n, _MASK_VALUE)
    # One softmax over both key sets, without concatenating them.
    mx = jnp.maximum(s_c.max(-1, keepdims=True), s_n.max(-1, keepdims=True))
    p_c, p_n = jnp.exp(s_c - mx), jnp.exp(s_n - mx)
    z = p_c.sum(-1, keepdims=True) + p_n.sum(-1, keepdims=True)
    p_c, p_n = (p_c / z).astype(v.dtype), (p_n / z).astype(v.dtype)
    out = jnp.einsum("bkgts,bskd->btkgd", p_c, cv, preferred_element_type=jnp.float32)
    out = out + jnp.einsum("bkgts,bskd->btkgd", p_n, v, preferred_element_type=jnp.float32)
    return out.reshape(B, W, H, Dh).astype(q.dtype)


def _cudnn(q, k, v, ck, cv, masks: CudnnInputs, window):
    keys = jnp.concatenate([ck.astype(q.dtype), k], axis=1)
    vals = jnp.concatenate([cv.astype(q.dtype), v], axis=1)
    return jax.nn.dot_product_attention(q, keys, vals, mask=_windowed(masks.mask, masks.d, window)[:, None],
                                        scale=1.0 / np.sqrt(q.shape[-1]), implementation="cudnn")


def _blocked_attend(q, k, v, ck, cv, x: BlockedInputs, window):
    # Traced trip counts on a CPU (the fewest blocks); on an accelerator a loop
    # predicate is read back by the host every iteration, so there the full ranges.
    return jax.lax.platform_dependent(
        cpu=lambda: _blocked(q, k, v, ck, cv, x.sparse, window, trips=x.trips),
        default=lambda: _blocked(q, k, v, ck, cv, x.sparse, window))


def _pallas_attend(q, k, v, ck, cv, x: SparseInputs, window):
    return jax.lax.platform_dependent(
        cpu=lambda: _pallas(q, k, v, ck, cv, x, window, interpret=True),
        cuda=lambda: _pallas(q, k, v, ck, cv, x, window, interpret=False),
        tpu=lambda: _pallas(q, k, v, ck, cv, x, window, interpret=False,
                            kernel=pallas_tpu_attention.packed_attention),
        default=lambda: _blocked(q, k, v, ck, cv, x, window))


def _pallas(q, k, v, ck, cv, x: SparseInputs, window, *, interpret,
            kernel=pallas_attention.packed_attention):
    """``kernel``: the GPU's (:mod:`sc_jax.models.pallas_attention`) or the TPU's
    (:mod:`sc_jax.models.pallas_tpu_attention`), which take the same inputs."""
    return kernel(q, k, v, ck, cv, window, **x.kwargs(), interpret=interpret)


def _blocked(q, k, v, ck, cv, x: SparseInputs, window, trips=None):
    """The block-sparse loops in XLA. ``trips`` ``[2]``: the loops' trip counts (the
    CPU's); None: every key block (the masks skip), no traced trip count."""
    B, W, H, Dh = q.shape
    K, C = k.shape[2], ck.shape[1]
    G = H // K
    bq, bk = x.bq, x.bk
    nq = W // bq
    scale = 1.0 / np.sqrt(Dh)
    qb = q.reshape(B, nq, bq, K, G, Dh)
    q_pos = x.q_pos.reshape(B, nq, bq)
    q_slot = x.q_slot.reshape(B, nq, bq)
    q_seg = x.q_seg.reshape(B, nq, bq)
    f32 = jnp.float32
    state = (jnp.full((B, nq, K, G, bq), _MASK_VALUE, f32), jnp.zeros((B, nq, K, G, bq), f32),
             jnp.zeros((B, nq, K, G, bq, Dh), f32))

    def update(state, kb, vb, vis):
        """One key block for every query block: kb, vb ``[B, nq, b, K, Dh]``, vis
        ``[B, nq, bq, b]``; FlashAttention's online softmax."""
        m, l, acc = state
        s = jnp.einsum("bnqkgd,bnskd->bnkgqs", qb, kb, preferred_element_type=f32) * scale
        vis = vis[:, :, None, None]
        s = jnp.where(vis, s, _MASK_VALUE)
        m_new = jnp.maximum(m, s.max(-1))
        p = jnp.where(vis, jnp.exp(s - m_new[..., None]), 0.0)
        r = jnp.exp(m - m_new)
        l = l * r + p.sum(-1)
        acc = acc * r[..., None] + jnp.einsum("bnkgqs,bnskd->bnkgqd", p.astype(vb.dtype), vb,
                                              preferred_element_type=f32)
        return m_new, l, acc

    def take(a, idx, b):  # a [B, n*b, ...], idx [B, nq] -> blocks [B, nq, b, ...]
        xb = a.reshape((B, a.shape[1] // b, b) + a.shape[2:])
        ix = idx.reshape((B, nq) + (1,) * (xb.ndim - 2))
        return jnp.take_along_axis(xb, ix, axis=1)

    def cache_step(i, state):
        idx = jnp.clip(x.c_lo + i, 0, C // bk - 1)
        cp, cid = (take(a, idx, bk) for a in (x.c_pos, x.c_id))
        d = q_pos[..., None] - cp[:, :, None, :]
        vis = (q_slot[..., None] == cid[:, :, None, :]) & (d >= 0)  # a padding key's id is no slot
        vis = vis & (i < x.c_n)[:, :, None, None]
        if x.windows:
            vis = vis & ((window <= 0) | (d < window))
        return update(state, take(ck, idx, bk), take(cv, idx, bk), vis)

    def new_step(i, state):
        blk = jnp.broadcast_to(jnp.arange(nq, dtype=jnp.int32) - i, (B, nq))
        idx = jnp.clip(blk, 0, nq - 1)
        kp, kid = (take(a, idx, bq) for a in (x.q_pos, x.k_id))
        d = q_pos[..., None] - kp[:, :, None, :]
        own = (i == 0) & (jnp.arange(bq)[:, None] == jnp.arange(bq)[None, :])
        vis = ((q_seg[..., None] == kid[:, :, None, :]) & (d >= 0)) | own
        vis = vis & (blk >= x.n_lo)[:, :, None, None]
        if x.windows:
            vis = vis & ((window <= 0) | (d < window))
        return update(state, take(k, idx, bq), take(v, idx, bq), vis)

    n_c, n_n = (C // bk, nq) if trips is None else (trips[0], trips[1])
    state = jax.lax.fori_loop(0, n_c, cache_step, state)
    m, l, acc = jax.lax.fori_loop(0, n_n, new_step, state)
    out = acc / jnp.where(l > 0, l, 1.0)[..., None]  # [B, nq, K, G, bq, Dh]
    return out.transpose(0, 1, 4, 2, 3, 5).reshape(B, W, H, Dh).astype(q.dtype)


#: The packed attentions by name, in the order of :data:`IMPLEMENTATIONS`.
REGISTRY: dict[str, Implementation] = {
    "dense": Implementation(_dense_inputs, _dense),
    "blocked": Implementation(_blocked_inputs, _blocked_attend, _blocked_blocks),
    "cudnn": Implementation(_cudnn_inputs, _cudnn),
    "pallas": Implementation(_pallas_inputs, _pallas_attend, _pallas_blocks),
}
IMPLEMENTATIONS = tuple(REGISTRY)
