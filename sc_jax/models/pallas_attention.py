"""Packed attention as one Pallas kernel (Triton lowering on a GPU): each query block
scores only the cache-key blocks of its tokens' slots and the packed-key blocks of its
tokens' items, with the block bounds read as scalars inside the kernel, so no loop trip
count ever goes back to the host.

Shapes: q ``[B, W, H, Dh]``; k, v ``[B, W, K, Dh]`` (the call's new keys); ck, cv
``[B, C, K, Dh]`` (the cached keys: ``m`` slots of ``S`` keys, then padding); G = H / K
query heads share a key/value head. Per token, ``[B, W]``: ``q_pos``, ``q_slot``,
``q_seg`` (position, slot, item) and ``k_id`` (the item of a valid key, :data:`INVALID`
for padding); ``[B, C]``: ``c_pos`` and ``c_id`` (the slot of a valid cached key,
:data:`INVALID` otherwise). Block bounds (:func:`sc_jax.models.attention.block_ranges`),
``[B, W/bq]``: ``c_lo``, ``c_n`` (first cache block, count), ``n_lo`` (first packed
block).

Visibility: a query at position ``p`` of slot ``j`` and item ``s`` sees a cached key iff
it is valid, of slot ``j`` and at a position ``<= p``; a new key iff it is valid, of item
``s`` and at a position ``<= p``; with a sliding window ``w > 0`` also ``p - p_key < w``.
Folding validity into the key's slot or item id (:data:`INVALID` equals no query's id)
leaves two loads per key block (position and id).

Recurrence (FlashAttention's online softmax, float32): per key block, scores
``s = q k^T / sqrt(Dh)`` (masked to ``-1e30``), ``m' = max(m, max_k s)``,
``p = exp(s - m')`` (0 where masked), ``l' = l e^{m - m'} + sum_k p``,
``acc' = acc e^{m - m'} + p v``; the output is ``acc / l`` (0 for a padding query, which
sees no key: finite, never read).

Grid ``(B, W/bq, H)``: one program per row, query block and query head, reading its
key/value head ``h // G``; G is absorbed in the grid (Triton wants power-of-two tiles,
and G = 7 for Qwen2-7B is not), at the price of each key block being read G times, from
the L2 cache for all but the first. Blocks :data:`BLOCKS` ``(bq, bk) = (64, 64)``: at the
7B call (W = 512, C = 2048, Dh = 128, bfloat16) they divide W and C, give
16 * 8 * 28 = 3584 programs (many per streaming multiprocessor of an H100), keep a
``[64, 128]`` query tile and two ``[64, 128]`` key/value tiles in registers and shared
memory, and skip keys in units of 64: each slot of S cached keys costs at most
``S/64 + 1`` blocks, and a query block reads the packed blocks from its earliest item's
first token to itself. The same blocks
serve every platform, so a program lowered for a GPU on any host has the GPU's blocks.

Platforms: the Triton kernel on CUDA; on a TPU its Mosaic form
(:mod:`sc_jax.models.pallas_tpu_attention`, same inputs and blocks); on a CPU the
Triton kernel in Pallas' interpreter (tests, and the engine run on a CPU); elsewhere
the static-trip XLA path of :mod:`sc_jax.models.attention` over the same bounds. The
choice is made when the program is lowered for its platform
(``jax.lax.platform_dependent``), not when it is traced.

Accuracy: the recurrence is exact algebra, so the kernel differs from a float64
softmax by rounding only: float32 inputs within 1e-5 (~1e-6: a softmax over a few
hundred keys, products of Dh terms), bfloat16 inputs within 3e-2 (8 significant bits,
probabilities rounded to bfloat16 before the ``p v`` product, as FlashAttention does);
``tests/models/test_attention.py`` holds it to these bounds in the interpreter. On a GPU a
float32 product stays IEEE float32 (Triton's default for float32 inputs), not TF32.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

#: Query/packed-key block and cache-key block (tokens): see the module docstring.
BLOCKS = (64, 64)
#: The id of an invalid key: no query's slot or item (those are >= -1).
INVALID = int(np.iinfo(np.int32).min)
# Finite, so a masked score minus the running maximum is never inf - inf.
_MASK_VALUE = -1e30
_DOT = (((1,), (1,)), ((), ()))  # [bq, Dh] x [bk, Dh] -> [bq, bk]
_PV = (((1,), (0,)), ((), ()))  # [bq, bk] x [bk, Dh] -> [bq, Dh]


def blocks(W: int, C: int) -> tuple[int, int]:
    """``(bq, bk)``: :data:`BLOCKS`, halved down to 16 (Triton's smallest matrix tile)
    until they divide W and C, else the whole width (the interpreter takes any)."""
    out = []
    for b, n in zip(BLOCKS, (W, C)):
        while b > 16 and n % b:
            b //= 2
        out.append(b if n % b == 0 else n)
    return out[0], out[1]


def _kernel(c_lo_ref, c_n_ref, n_lo_ref, win_ref, q_ref, k_ref, v_ref, ck_ref, cv_ref,
            q_pos_ref, q_slot_ref, q_seg_ref, k_id_ref, c_pos_ref, c_id_ref, o_ref, *, bq, bk,
            scale, windows):
    """One (row, query block, query head): q_ref ``[bq, Dh]``; k/v_ref ``[W, Dh]``,
    ck/cv_ref ``[C, Dh]`` (its key/value head); the per-token refs of the whole row."""
    i = pl.program_id(1)
    f32 = jnp.float32
    q = q_ref[...]
    rows = pl.ds(i * bq, bq)
    pos = q_pos_ref[rows]
    slot = q_slot_ref[rows]
    seg = q_seg_ref[rows]
    window = win_ref[0]

    def step(kb, vb, k_pos, ok, carry):
        m, l, acc = carry
        d = pos[:, None] - k_pos[None, :]
        vis = ok & (d >= 0)
        if windows:
            vis = vis & ((window <= 0) | (d < window))
        s = jax.lax.dot_general(q, kb, _DOT, preferred_element_type=f32) * scale
        s = jnp.where(vis, s, _MASK_VALUE)
        m_new = jnp.maximum(m, jnp.max(s, axis=1))
        p = jnp.where(vis, jnp.exp(s - m_new[:, None]), 0.0)
        r = jnp.exp(m - m_new)
        l = l * r + jnp.sum(p, axis=1)
        pv = jax.lax.dot_general(p.astype(vb.dtype), vb, _PV, preferred_element_type=f32)
        return m_new, l, acc * r[:, None] + pv

    def cache_block(j, carry):
        keys = pl.ds(j * bk, bk)
        ok = slot[:, None] == c_id_ref[keys][None, :]
        return step(ck_ref[keys, :], cv_ref[keys, :], c_pos_ref[keys], ok, carry)

    def new_block(j, carry):
        keys = pl.ds(j * bq, bq)
        ok = seg[:, None] == k_id_ref[keys][None, :]
        return step(k_ref[keys, :], v_ref[keys, :], q_pos_ref[keys], ok, carry)

    carry = (jnp.full((bq,), _MASK_VALUE, f32), jnp.zeros((bq,), f32),
             jnp.zeros(q.shape, f32))
    c_lo = c_lo_ref[0]
    carry = jax.lax.fori_loop(c_lo, c_lo + c_n_ref[0], cache_block, carry)
    _, l, acc = jax.lax.fori_loop(n_lo_ref[0], i + 1, new_block, carry)
    o_ref[...] = (acc / jnp.where(l > 0, l, 1.0)[:, None]).astype(o_ref.dtype)


def packed_attention(q, k, v, ck, cv, window, *, q_pos, q_slot, q_seg, k_id, c_pos, c_id, c_lo,
                     c_n, n_lo, bq: int, bk: int, windows: bool, interpret: bool = False):
    """The kernel over a packed call (shapes in the module docstring); ``window``: the
    layer's sliding window (traced; 0: none), read only when ``windows``. Returns
    ``[B, W, H, Dh]`` in q's dtype. ``interpret``: Pallas' interpreter (any platform)."""
    B, W, H, Dh = q.shape
    K, C = k.shape[2], ck.shape[1]
    G = H // K
    nq = W // bq
    scale = 1.0 / np.sqrt(Dh)
    ck, cv = ck.astype(q.dtype), cv.astype(q.dtype)
    if not interpret and Dh & (Dh - 1):  # Triton's tiles are powers of two; zeros add nothing
        pad = [(0, 0)] * 3 + [(0, pl.next_power_of_2(Dh) - Dh)]
        q, k, v, ck, cv = (jnp.pad(x, pad) for x in (q, k, v, ck, cv))
    D = q.shape[-1]
    bound = pl.BlockSpec((None, 1), lambda b, i, h: (b, i))
    row = lambda n: pl.BlockSpec((None, n), lambda b, i, h: (b, 0))  # noqa: E731
    heads = lambda n: pl.BlockSpec((None, n, None, D),  # noqa: E731
                                   lambda b, i, h: (b, 0, h // G, 0))
    call = pl.pallas_call(
        functools.partial(_kernel, bq=bq, bk=bk, scale=scale, windows=windows),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        grid=(B, nq, H),
        in_specs=[bound, bound, bound, pl.BlockSpec((1,), lambda b, i, h: (0,)),
                  pl.BlockSpec((None, bq, None, D), lambda b, i, h: (b, i, h, 0)),
                  heads(W), heads(W), heads(C), heads(C), row(W), row(W), row(W), row(W), row(C),
                  row(C)],
        out_specs=pl.BlockSpec((None, bq, None, D), lambda b, i, h: (b, i, h, 0)),
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=2),
        interpret=interpret,
        name="packed_attention",
    )
    win = jnp.reshape(jnp.asarray(window, jnp.int32), (1,))
    i32 = lambda x: x.astype(jnp.int32)  # noqa: E731
    out = call(i32(c_lo), i32(c_n), i32(n_lo), win, q, k, v, ck, cv, i32(q_pos), i32(q_slot),
               i32(q_seg), i32(k_id), i32(c_pos), i32(c_id))
    return out[..., :Dh]
