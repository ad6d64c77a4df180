"""Attention of packed rows (the scoring engine's calls): each token sees the cached keys
of its own slot and the new keys of its own segment, nothing else.

A packed call (:class:`sc_jax.models.model.Packing`) has ``B`` rows of ``W`` new tokens, each
row after ``C`` cached keys: the row's ``m`` slots of ``S`` keys side by side, padded
(``C`` is fixed for a run; ``m`` and ``S`` change with the trie depth). A token of slot ``j``
may see ``S`` of the ``C`` cached keys and the earlier tokens of its own item, so the
attention of a row over all ``C + W`` keys computes ``m`` times too many scores over
the cache and most of the ``W`` packed ones (85-90% masked on a 7B plan). Four
implementations, one answer (to float rounding), chosen on the device by timing them
(:mod:`sc_jax.scoring.attention_choice`; :func:`choose` is what a plan assumes):

* ``"dense"``: XLA, every key of the row scored and masked (the plain path the others
  are tested against). The masks are built once per call (:func:`packed_masks`) and
  shared by every layer; the cached and packed scores are normalised together without
  concatenating them.
* ``"blocked"``: XLA, block-sparse with an online softmax (FlashAttention's
  recurrence): the queries in blocks of ``bq`` tokens, the keys in blocks; each query
  block scores only the key blocks that hold its slots' cached keys and its items'
  earlier tokens (:func:`block_ranges`). On a CPU the loops run to the call's largest
  such range, a traced number, so one program serves every depth. On an accelerator
  they run over every key block, the masks doing the skipping: a traced trip count
  there would have the host read each iteration's predicate back from the device
  (XLA's GPU while loop), hundreds of round trips per call. Scores never exceed one
  ``[bq, bk]`` tile per block and head.
* ``"cudnn"``: ``jax.nn.dot_product_attention(implementation="cudnn")`` over the row's
  ``C + W`` keys with the packed mask: cuDNN's fused flash kernel (GPU, bfloat16 or
  float16) never writes the scores to memory, at the price of scoring masked keys.
* ``"pallas"``: one Pallas kernel that scores only the key blocks of ``"blocked"``,
  with the block bounds read inside the kernel, so its loops never leave the device:
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

import jax
import jax.numpy as jnp
import numpy as np

from sc_jax.models import pallas_attention, pallas_tpu_attention

IMPLEMENTATIONS = ("dense", "blocked", "cudnn", "pallas")
#: Query and packed-key block of ``"blocked"`` (tokens; divides W) and its cache-key
#: block (divides C). Small blocks skip more masked keys; large ones make larger
#: matrix products. Per platform, as the call shape is.
BLOCKS = {"cpu": (32, 64), "default": (64, 128)}
# Finite, so a row with no visible key gives zeros rather than NaN; its output is
# never read.
_MASK_VALUE = -1e30


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PackedMasks:
    """What a packed call's every layer shares, built once (:func:`packed_masks`).

    Dense and cuDNN: ``cache`` ``[B, W, C]``, the token may see the cached key (valid,
    its slot, not later); ``new`` ``[B, W, W]``, it may see the packed key (valid, its
    segment, not later; the diagonal always, so a padding query sees one key);
    ``d_cache``, ``d_new``: query minus key position, for sliding windows (None
    when no layer has one). Blocked: the per-token inputs (``q_pos``, ``q_slot``,
    ``q_seg``, ``k_valid`` ``[B, W]``; ``c_pos``, ``c_slot``, ``c_valid`` ``[B, C]``)
    and the block bounds of :func:`block_ranges` (``c_lo``, ``c_n``, ``n_lo``
    ``[B, W/bq]``, ``trips`` ``[2]``), for blocks of ``bq`` queries and ``bk`` cached
    keys; ``windows``: some layer has a sliding window. Pallas: the blocked fields, at
    the kernel's blocks.
    """

    cache: jax.Array | None = None
    new: jax.Array | None = None
    d_cache: jax.Array | None = None
    d_new: jax.Array | None = None
    q_pos: jax.Array | None = None
    q_slot: jax.Array | None = None
    q_seg: jax.Array | None = None
    k_valid: jax.Array | None = None
    c_pos: jax.Array | None = None
    c_slot: jax.Array | None = None
    c_valid: jax.Array | None = None
    c_lo: jax.Array | None = None
    c_n: jax.Array | None = None
    n_lo: jax.Array | None = None
    trips: jax.Array | None = None
    windows: bool = dataclasses.field(default=False, metadata=dict(static=True))
    bq: int = dataclasses.field(default=0, metadata=dict(static=True))
    bk: int = dataclasses.field(default=0, metadata=dict(static=True))


def choose(platform: str) -> str:
    """The implementation a plan assumes where none was measured (``sc-jax plan``; the
    engine measures on its device: :mod:`sc_jax.scoring.attention_choice`): the Pallas
    kernel on a GPU (cuDNN's builds no plan on some CUDA releases, and scores masked
    keys), the block-sparse XLA path elsewhere (on a CPU, where it is the faster:
    ``benchmarks/RESULTS.md``)."""
    return "pallas" if platform in ("gpu", "cuda") else "blocked"


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


def packed_masks(q_pos, q_valid, segment, slot, c_pos, c_valid, c_slot, *, windows: bool,
                 implementation: str, platform: str = "default") -> PackedMasks:
    """The masks (and, for ``"blocked"`` and ``"pallas"``, the block bounds) of one packed
    call.

    q_pos, q_valid, segment, slot: ``[B, W]``; c_pos, c_valid, c_slot: ``[B, C]``
    (one cached row per batch row). ``windows``: some layer has a sliding window."""
    W, C = q_pos.shape[1], c_pos.shape[1]
    if implementation in ("blocked", "pallas"):
        if implementation == "pallas":  # one choice for every platform: see pallas_attention
            bq, bk = pallas_attention.blocks(W, C)
        else:
            bq, bk = BLOCKS.get(platform, BLOCKS["default"])
            bq, bk = (bq if W % bq == 0 else W), (bk if C % bk == 0 else C)  # blocks that tile
        c_lo, c_n, n_lo, trips = block_ranges(q_valid, slot, segment, c_slot, bq, bk)
        return PackedMasks(q_pos=q_pos, q_slot=slot, q_seg=segment, k_valid=q_valid, c_pos=c_pos,
                           c_slot=c_slot, c_valid=c_valid, c_lo=c_lo, c_n=c_n, n_lo=n_lo,
                           trips=trips, windows=windows, bq=bq, bk=bk)
    d_c = q_pos[:, :, None] - c_pos[:, None, :]
    d_n = q_pos[:, :, None] - q_pos[:, None, :]
    cache = c_valid[:, None, :] & (slot[:, :, None] == c_slot[:, None, :]) & (d_c >= 0)
    new = q_valid[:, None, :] & (segment[:, :, None] == segment[:, None, :]) & (d_n >= 0)
    new = new | jnp.eye(W, dtype=bool)[None]
    return PackedMasks(cache, new, d_c if windows else None, d_n if windows else None,
                       windows=windows)


def _windowed(mask, d, window):
    if d is None:
        return mask
    return mask & ((window <= 0) | (d < window))


def packed_attention(q, k, v, ck, cv, masks: PackedMasks, window, *, implementation: str):
    """Attention of a packed call's new queries over their slots' cached keys and their
    segments' new keys (paper-independent; the model's attention, Vaswani et al.
    eq. 1, softmax(q k^T / sqrt(Dh)) v, restricted by the masks).

    q: ``[B, W, H, Dh]``; k, v: ``[B, W, K, Dh]``; ck, cv: ``[B, C, K, Dh]``;
    ``window``: this layer's sliding window (0: none). Returns ``[B, W, H, Dh]``."""
    if implementation == "dense":
        return _dense(q, k, v, ck, cv, masks, window)
    if implementation == "blocked":
        # Traced trip counts on a CPU (the fewest blocks); on an accelerator a loop
        # predicate is read back by the host every iteration, so there the full ranges.
        return jax.lax.platform_dependent(
            cpu=lambda: _blocked(q, k, v, ck, cv, masks, window, static=False),
            default=lambda: _blocked(q, k, v, ck, cv, masks, window, static=True))
    if implementation == "pallas":
        return jax.lax.platform_dependent(
            cpu=lambda: _pallas(q, k, v, ck, cv, masks, window, interpret=True),
            cuda=lambda: _pallas(q, k, v, ck, cv, masks, window, interpret=False),
            tpu=lambda: _pallas(q, k, v, ck, cv, masks, window, interpret=False,
                                kernel=pallas_tpu_attention.packed_attention),
            default=lambda: _blocked(q, k, v, ck, cv, masks, window, static=True))
    if implementation == "cudnn":
        return _cudnn(q, k, v, ck, cv, masks, window)
    raise ValueError(f"attention implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")


def _dense(q, k, v, ck, cv, masks, window):
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


def _cudnn(q, k, v, ck, cv, masks, window):
    vis = jnp.concatenate([_windowed(masks.cache, masks.d_cache, window),
                           _windowed(masks.new, masks.d_new, window)], axis=-1)
    keys = jnp.concatenate([ck.astype(q.dtype), k], axis=1)
    vals = jnp.concatenate([cv.astype(q.dtype), v], axis=1)
    return jax.nn.dot_product_attention(q, keys, vals, mask=vis[:, None],
                                        scale=1.0 / np.sqrt(q.shape[-1]), implementation="cudnn")


def _pallas(q, k, v, ck, cv, masks, window, *, interpret, kernel=pallas_attention.packed_attention):
    """``kernel``: the GPU's (:mod:`sc_jax.models.pallas_attention`) or the TPU's
    (:mod:`sc_jax.models.pallas_tpu_attention`), which take the same inputs."""
    big = pallas_attention.INVALID
    return kernel(
        q, k, v, ck, cv, window, q_pos=masks.q_pos, q_slot=masks.q_slot, q_seg=masks.q_seg,
        k_id=jnp.where(masks.k_valid, masks.q_seg, big), c_pos=masks.c_pos,
        c_id=jnp.where(masks.c_valid, masks.c_slot, big), c_lo=masks.c_lo, c_n=masks.c_n,
        n_lo=masks.n_lo, bq=masks.bq, bk=masks.bk, windows=masks.windows, interpret=interpret)


def _blocked(q, k, v, ck, cv, masks, window, *, static: bool):
    """``static``: loops over every key block (the masks skip), no traced trip count."""
    B, W, H, Dh = q.shape
    K, C = k.shape[2], ck.shape[1]
    G = H // K
    bq, bk = masks.bq, masks.bk
    nq = W // bq
    scale = 1.0 / np.sqrt(Dh)
    qb = q.reshape(B, nq, bq, K, G, Dh)
    q_pos = masks.q_pos.reshape(B, nq, bq)
    q_slot = masks.q_slot.reshape(B, nq, bq)
    q_seg = masks.q_seg.reshape(B, nq, bq)
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

    def take(x, idx, b):  # x [B, n*b, ...], idx [B, nq] -> blocks [B, nq, b, ...]
        xb = x.reshape((B, x.shape[1] // b, b) + x.shape[2:])
        ix = idx.reshape((B, nq) + (1,) * (xb.ndim - 2))
        return jnp.take_along_axis(xb, ix, axis=1)

    def cache_step(i, state):
        idx = jnp.clip(masks.c_lo + i, 0, C // bk - 1)
        cp, cs, cvd = (take(x, idx, bk) for x in (masks.c_pos, masks.c_slot, masks.c_valid))
        d = q_pos[..., None] - cp[:, :, None, :]
        vis = cvd[:, :, None, :] & (q_slot[..., None] == cs[:, :, None, :]) & (d >= 0)
        vis = vis & (i < masks.c_n)[:, :, None, None]
        if masks.windows:
            vis = vis & ((window <= 0) | (d < window))
        return update(state, take(ck, idx, bk), take(cv, idx, bk), vis)

    def new_step(i, state):
        blk = jnp.broadcast_to(jnp.arange(nq, dtype=jnp.int32) - i, (B, nq))
        idx = jnp.clip(blk, 0, nq - 1)
        kp, ks, kvd = (take(x, idx, bq) for x in (masks.q_pos, masks.q_seg, masks.k_valid))
        d = q_pos[..., None] - kp[:, :, None, :]
        own = (i == 0) & (jnp.arange(bq)[:, None] == jnp.arange(bq)[None, :])
        vis = (kvd[:, :, None, :] & (q_seg[..., None] == ks[:, :, None, :]) & (d >= 0)) | own
        vis = vis & (blk >= masks.n_lo)[:, :, None, None]
        if masks.windows:
            vis = vis & ((window <= 0) | (d < window))
        return update(state, take(k, idx, bq), take(v, idx, bq), vis)

    n_c, n_n = (C // bk, nq) if static else (masks.trips[0], masks.trips[1])
    state = jax.lax.fori_loop(0, n_c, cache_step, state)
    m, l, acc = jax.lax.fori_loop(0, n_n, new_step, state)
    out = acc / jnp.where(l > 0, l, 1.0)[..., None]  # [B, nq, K, G, bq, Dh]
    return out.transpose(0, 1, 4, 2, 3, 5).reshape(B, W, H, Dh).astype(q.dtype)
