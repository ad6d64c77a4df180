"""Packed attention as one Pallas kernel for a TPU (Mosaic lowering): the kernel of
:mod:`sc_jax.models.pallas_attention` (same inputs, visibility rule, online softmax and
block bounds; read its docstring first) in the TPU's idioms.

Differences from the GPU kernel, each for Mosaic:

* The block bounds ``c_lo``, ``c_n``, ``n_lo`` ``[B, W/bq]`` and the window are scalar
  prefetch operands (``pltpu.PrefetchScalarGridSpec``): they sit in SMEM, and the
  kernel's two loops (``lax.fori_loop`` over the cache blocks ``c_lo .. c_lo + c_n``
  and the packed blocks ``n_lo .. i``) lower to ``scf.for`` with bounds read from
  there, so no trip count leaves the chip and no skipped block costs a grid step.
* Grid ``(B, K, W/bq)``: one program per row, key/value head and query block, with the
  G query heads of that key/value head in one block (Mosaic takes any G; Triton's
  power-of-two tiles made the GPU kernel put heads in the grid). q and the output are
  read as ``[B, W, H*Dh]`` (a free reshape), so a block ``[bq, G*Dh]`` holds the G
  heads side by side and needs no transpose; the row's keys and values of one head,
  ``[W, Dh]`` and ``[C, Dh]`` (``[B, W, K*Dh]`` blocks), stay in VMEM across the
  query blocks of the row, fetched once per (row, head): every query block of a row
  reads some of its slots, and together they read all. The keys of a block are read
  once for its G heads.
* Running max, sum and accumulator are VMEM scratch (``[G, bq, 128]``, ``[G, bq, 128]``,
  ``[G, bq, Dh]`` float32), reset at each program's start; max and sum are kept
  broadcast over the 128 lanes, as JAX's TPU flash attention keeps them, so every
  update is a full-vreg operation.
* The per-token inputs come in layouts Mosaic loads without relayout: a query block's
  position, slot and item ``[bq, 128]`` (broadcast over lanes, as splash attention's
  segment ids), a key block's position and id ``[1, b]`` rows of ``[n_blocks, 1, b]``
  arrays, indexed on the leading axis by the loop counter (a dynamic index on an
  untiled axis; no dynamic lane offset).
* Dh is padded with zeros to a multiple of 128 (the lane width; Mosaic's blocks must
  tile it), as the GPU kernel pads to a power of two; in the interpreter it is not.

Blocks ``(bq, bk)``: those of the masks (:func:`sc_jax.models.pallas_attention.blocks`,
64 and 64 at the 7B call), so one set of bounds serves the GPU and the TPU program
and a program lowered for either on any host is that device's. VMEM per program at
the 7B call (W = 512, C = 2048, Dh = 128, G = 7, bfloat16): keys and values 1.25 MiB,
double-buffered 2.5 MiB, plus about 2 MiB of blocks and scratch.

Accuracy: the GPU kernel's arithmetic (float32 scores, probabilities rounded to the
value dtype before ``p v``), so its bounds: float32 within 1e-5 and bfloat16 within
3e-2 of a float64 softmax (``tests/models/test_attention.py``, in Pallas' TPU
interpreter).

What a host without a TPU checks: the arithmetic (the interpreter, which also raises
on an out-of-bounds read and fills unwritten memory with NaN) and the lowering to a
Mosaic module (``tests/scoring/test_lowering.py``). Mosaic's layout passes and its
compilation run in the TPU runtime, and the speed is a TPU's: ``"auto"`` times the
kernel there and, should it not compile or run, records why and keeps an XLA path
(:mod:`sc_jax.scoring.attention_choice`). At 64 keys a block the score tile fills
half of a vreg's 128 lanes; a TPU's timing may favour 128.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from sc_jax.models.pallas_attention import _DOT, _MASK_VALUE, _PV

#: The TPU's lane width: Dh's padding unit, and the width max and sum are kept at.
LANES = 128
#: The smallest VMEM a TPU generation lets a kernel use unless raised (v4, v5e); above
#: it the call asks for what it needs, with a margin for Mosaic's own temporaries.
DEFAULT_VMEM = 16 << 20


def _lanes(x, n: int):
    """``[r, LANES]`` (equal across lanes) as ``[r, n]``."""
    if n <= LANES:
        return x[:, :n]
    if n % LANES == 0:  # whole vregs side by side (a lane-merging reshape is not Mosaic's)
        return jnp.concatenate([x] * (n // LANES), axis=1)
    return jnp.broadcast_to(x[:, :1], (x.shape[0], n))


def _kernel(c_lo_ref, c_n_ref, n_lo_ref, win_ref, q_ref, k_ref, v_ref, ck_ref, cv_ref, pos_ref,
            slot_ref, seg_ref, k_pos_ref, k_id_ref, c_pos_ref, c_id_ref, o_ref, m_ref, l_ref,
            acc_ref, *, G, D, bq, bk, scale, windows):
    """One (row, key/value head, query block): q_ref, o_ref ``[bq, G*D]``; k/v_ref
    ``[W, D]``, ck/cv_ref ``[C, D]``; pos/slot/seg_ref ``[bq, LANES]``; k_pos/k_id_ref
    ``[W/bq, 1, bq]``, c_pos/c_id_ref ``[C/bk, 1, bk]``; scratch m/l_ref ``[G, bq,
    LANES]``, acc_ref ``[G, bq, D]``."""
    b, i = pl.program_id(0), pl.program_id(2)
    f32 = jnp.float32
    m_ref[...] = jnp.full(m_ref.shape, _MASK_VALUE, f32)
    l_ref[...] = jnp.zeros(l_ref.shape, f32)
    acc_ref[...] = jnp.zeros(acc_ref.shape, f32)
    # The window as a bound on the distance (a scalar int, broadcast; no boolean scalar).
    limit = jnp.where(win_ref[0] > 0, win_ref[0], jnp.int32(np.iinfo(np.int32).max))

    def step(kb, vb, k_pos, k_id, own):
        """One key block ``kb``, ``vb`` ``[n, D]`` with its positions and ids ``[1, n]``,
        against the query ids ``own`` (slot for cached keys, item for packed ones)."""
        n = kb.shape[0]
        d = _lanes(pos_ref[...], n) - k_pos
        vis = (_lanes(own, n) == k_id) & (d >= 0)
        if windows:
            vis = vis & (d < limit)
        for g in range(G):  # the G query heads of this key/value head
            q = q_ref[:, g * D:(g + 1) * D]
            s = jax.lax.dot_general(q, kb, _DOT, preferred_element_type=f32) * scale
            s = jnp.where(vis, s, _MASK_VALUE)
            m_prev = m_ref[g]
            m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
            p = jnp.where(vis, jnp.exp(s - _lanes(m_next, n)), 0.0)
            r = jnp.exp(m_prev - m_next)
            m_ref[g] = m_next
            l_ref[g] = l_ref[g] * r + jnp.sum(p, axis=1, keepdims=True)
            pv = jax.lax.dot_general(p.astype(vb.dtype), vb, _PV, preferred_element_type=f32)
            acc_ref[g] = acc_ref[g] * _lanes(r, D) + pv

    def cache_block(j, carry):
        keys = pl.ds(pl.multiple_of(j * bk, bk), bk)
        step(ck_ref[keys, :], cv_ref[keys, :], c_pos_ref[j], c_id_ref[j], slot_ref[...])
        return carry

    def new_block(j, carry):
        keys = pl.ds(pl.multiple_of(j * bq, bq), bq)
        step(k_ref[keys, :], v_ref[keys, :], k_pos_ref[j], k_id_ref[j], seg_ref[...])
        return carry

    c_lo = c_lo_ref[b, i]
    jax.lax.fori_loop(c_lo, c_lo + c_n_ref[b, i], cache_block, 0)
    jax.lax.fori_loop(n_lo_ref[b, i], i + 1, new_block, 0)
    for g in range(G):
        l = l_ref[g]
        out = acc_ref[g] / _lanes(jnp.where(l > 0, l, 1.0), D)
        o_ref[:, g * D:(g + 1) * D] = out.astype(o_ref.dtype)


def vmem_bytes(W: int, C: int, G: int, D: int, bq: int, bk: int, itemsize: int) -> int:
    """VMEM one program holds: its blocks (each double-buffered by the pipeline) and the
    scratch. A ``[n, 1, b]`` id array occupies ``n`` tiles of 8 x 128 words."""
    tile = lambda n, b: n * 8 * (-(-b // LANES) * LANES) * 4  # noqa: E731
    blocks = (2 * bq * G * D * itemsize + 2 * (W + C) * D * itemsize + 3 * bq * LANES * 4
              + 2 * tile(W // bq, bq) + 2 * tile(C // bk, bk))
    return 2 * blocks + G * bq * (2 * LANES + D) * 4


def packed_attention(q, k, v, ck, cv, window, *, q_pos, q_slot, q_seg, k_id, c_pos, c_id, c_lo,
                     c_n, n_lo, bq: int, bk: int, windows: bool, interpret=False):
    """The kernel over a packed call (shapes in :mod:`sc_jax.models.pallas_attention`'s
    docstring); ``window``: the layer's sliding window (traced; 0: none), read only when
    ``windows``. Returns ``[B, W, H, Dh]`` in q's dtype. ``interpret``: Pallas' TPU
    interpreter (``pltpu.InterpretParams()``, any platform) or False (Mosaic)."""
    B, W, H, Dh = q.shape
    K, C = k.shape[2], ck.shape[1]
    G, nq, nc = H // K, W // bq, C // bk
    scale = float(1.0 / np.sqrt(Dh))  # a Python float: weakly typed, never float64
    ck, cv = ck.astype(q.dtype), cv.astype(q.dtype)
    if not interpret and Dh % LANES:  # Mosaic's blocks tile the lanes; zeros add nothing
        pad = [(0, 0)] * 3 + [(0, -Dh % LANES)]
        q, k, v, ck, cv = (jnp.pad(x, pad) for x in (q, k, v, ck, cv))
    D = q.shape[-1]
    i32 = lambda x: x.astype(jnp.int32)  # noqa: E731
    lanes = lambda x: jax.lax.broadcast_in_dim(i32(x), (B, W, LANES), (0, 1))  # noqa: E731
    rows = lambda x, b: i32(x).reshape(B, -1, 1, b)  # noqa: E731
    # Index maps take the grid's (row, key/value head, query block), then the prefetched.
    heads = lambda n: pl.BlockSpec((None, n, D), lambda b, h, i, *_: (b, 0, h))  # noqa: E731
    whole = lambda n, b: pl.BlockSpec((None, n, 1, b), lambda r, *_: (r, 0, 0, 0))  # noqa: E731
    ids = pl.BlockSpec((None, bq, LANES), lambda b, h, i, *_: (b, i, 0))
    group = pl.BlockSpec((None, bq, G * D), lambda b, h, i, *_: (b, i, h))
    f32 = jnp.float32
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=4,
        grid=(B, K, nq),  # the query blocks innermost: a row's keys stay in VMEM
        in_specs=[group, heads(W), heads(W), heads(C), heads(C), ids, ids, ids,
                  whole(nq, bq), whole(nq, bq), whole(nc, bk), whole(nc, bk)],
        out_specs=group,
        scratch_shapes=[pltpu.VMEM((G, bq, LANES), f32), pltpu.VMEM((G, bq, LANES), f32),
                        pltpu.VMEM((G, bq, D), f32)])
    need = vmem_bytes(W, C, G, D, bq, bk, q.dtype.itemsize)
    call = pl.pallas_call(
        functools.partial(_kernel, G=G, D=D, bq=bq, bk=bk, scale=scale, windows=windows),
        out_shape=jax.ShapeDtypeStruct((B, W, H * D), q.dtype),
        grid_spec=grid_spec,
        # Each program starts its own softmax: every axis may be split across cores.
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel"),
            vmem_limit_bytes=None if need <= DEFAULT_VMEM else int(1.25 * need)),
        interpret=interpret,
        name="packed_attention_tpu",
    )
    win = jnp.reshape(i32(jnp.asarray(window)), (1,))
    flat = lambda x: x.reshape(x.shape[0], x.shape[1], -1)  # noqa: E731
    out = call(i32(c_lo), i32(c_n), i32(n_lo), win, flat(q), flat(k), flat(v), flat(ck), flat(cv),
               lanes(q_pos), lanes(q_slot), lanes(q_seg), rows(q_pos, bq), rows(k_id, bq),
               rows(c_pos, bk), rows(c_id, bk))
    return out.reshape(B, W, H, D)[..., :Dh]
