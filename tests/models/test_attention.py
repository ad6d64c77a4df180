"""Packed attention (sc_jax.models.attention): the dense, block-sparse and Pallas paths
(the GPU kernel in Pallas' interpreter, the TPU kernel in Pallas' TPU interpreter)
against a float64 brute force that applies the rule token by token (a token sees the
valid cached keys of its slot and the valid keys of its own segment, none later than
itself, none outside a sliding window), and the block bounds against the keys a token
may see.

Tolerances: float32 inputs of size O(1), outputs O(1): rounding of a softmax over at
most 384 keys and two products of 16 terms leaves ~1e-6 (at most 7e-7 seen); 1e-5 is
the bound. bfloat16
inputs (8 significant bits) give outputs that round by up to 2^-8 of their size, with the
probabilities rounded too: 3e-2 against the float64 result of the same bf16 inputs (at
most 8e-3 seen).
"""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax.experimental.pallas import tpu as pltpu

from sc_jax.models import attention, pallas_attention, pallas_tpu_attention
from sc_jax.models.attention import BLOCKS, PackedTokens, block_ranges, packed_attention, packed_inputs

B, W, C, H, K, Dh = 3, 128, 256, 4, 2, 16


def packed_call(rng, S, dtype=jnp.float32, max_item=20, heads=(H, K), empty_rows=()):
    """A call of B rows: each row uses some of its C // S slots (S cached keys each, a
    random number of them real) and packs items (segments) after them, as the engine's
    packing does: slots in order, each slot's items end to end. ``heads``: (query,
    key/value) heads; ``empty_rows``: rows of padding only (no cache, no token)."""
    m = C // S
    seg = np.full((B, W), -1)
    slot, pos, valid = np.zeros((B, W), int), np.zeros((B, W), int), np.zeros((B, W), bool)
    cpos, cvalid, cslot = np.zeros((B, C), int), np.zeros((B, C), bool), np.full((B, C), -1)
    for b in range(B):
        used = int(rng.integers(1, m + 1))
        lens = rng.integers(0, S + 1, used)  # an empty slot: the root's stage
        cslot[b, :used * S] = np.repeat(np.arange(used), S)
        o, item = 0, 0
        for j in range(used):
            cpos[b, j * S:j * S + lens[j]] = np.arange(lens[j])
            cvalid[b, j * S:j * S + lens[j]] = True
            for _ in range(int(rng.integers(1, 4))):
                n = int(rng.integers(1, max_item))
                if o + n > W:
                    break
                seg[b, o:o + n], slot[b, o:o + n], valid[b, o:o + n] = item, j, True
                pos[b, o:o + n] = lens[j] + np.arange(n)
                o, item = o + n, item + 1
    for b in empty_rows:
        seg[b], valid[b], cvalid[b], cslot[b] = -1, False, False, -1
    h, kv = heads
    f = lambda *shape: jnp.asarray(rng.normal(size=shape), dtype)  # noqa: E731
    arrays = (f(B, W, h, Dh), f(B, W, kv, Dh), f(B, W, kv, Dh), f(B, C, kv, Dh), f(B, C, kv, Dh))
    meta = dict(q_pos=pos, q_valid=valid, segment=seg, slot=slot, c_pos=cpos, c_valid=cvalid,
                c_slot=cslot)
    return arrays, {n: jnp.asarray(x, jnp.int32 if x.dtype != bool else bool) for n, x in meta.items()}


def visible_keys(meta, b, t, window):
    """(cached, packed) key indices token t of row b may see: the rule, one key at a time."""
    g = {n: np.asarray(x) for n, x in meta.items()}
    ok = lambda d: d >= 0 and (window <= 0 or d < window)  # noqa: E731
    cached = [c for c in range(C) if g["c_valid"][b, c] and g["c_slot"][b, c] == g["slot"][b, t]
              and ok(g["q_pos"][b, t] - g["c_pos"][b, c])]
    packed = [u for u in range(W) if g["q_valid"][b, u] and g["segment"][b, u] == g["segment"][b, t]
              and ok(g["q_pos"][b, t] - g["q_pos"][b, u])]
    return cached, packed


def brute_force(arrays, meta, window):
    q, k, v, ck, cv = (np.asarray(x, np.float64) for x in arrays)
    out = np.zeros(q.shape)
    for b in range(B):
        for t in np.flatnonzero(np.asarray(meta["q_valid"][b])):
            cached, packed = visible_keys(meta, b, t, window)
            keys = np.concatenate([ck[b, cached], k[b, packed]])
            vals = np.concatenate([cv[b, cached], v[b, packed]])
            G = q.shape[2] // k.shape[2]
            for h in range(q.shape[2]):
                s = keys[:, h // G] @ q[b, t, h] / np.sqrt(Dh)
                p = np.exp(s - s.max())
                out[b, t, h] = (p / p.sum()) @ vals[:, h // G]
    return out


def run(arrays, meta, window, implementation, platform):
    """The path on this CPU; ``"blocked-static"``: the blocked path with the full trip
    counts it runs on an accelerator; ``"pallas-tpu"``: the TPU kernel in Pallas' TPU
    interpreter (which raises on an out-of-bounds read and fills unwritten memory with
    NaN)."""
    static, tpu = implementation == "blocked-static", implementation == "pallas-tpu"
    implementation = "blocked" if static else "pallas" if tpu else implementation
    inputs = packed_inputs(PackedTokens(**meta), windows=window > 0, implementation=implementation,
                           platform=platform)
    if static:
        fn = jax.jit(lambda *a, x, w: attention._blocked(*a, x.sparse, w))
    elif tpu:
        fn = jax.jit(lambda *a, x, w: attention._pallas(*a, x, w, interpret=pltpu.InterpretParams(),
                                                        kernel=pallas_tpu_attention.packed_attention))
    else:
        fn = jax.jit(lambda *a, x, w: packed_attention(*a, x, w, implementation=implementation))
    return np.asarray(fn(*arrays, x=inputs, w=jnp.int32(window)), np.float64)


def assert_equals_the_rule(arrays, meta, window, paths):
    """Each (implementation, platform) of ``paths`` within its dtype's tolerance of the
    brute force on the real tokens, and finite everywhere; returns the largest error."""
    want = brute_force(arrays, meta, window)
    real = np.asarray(meta["q_valid"])
    tol = 1e-5 if arrays[0].dtype == jnp.float32 else 3e-2
    worst = 0.0
    for implementation, platform in paths:
        got = run(arrays, meta, window, implementation, platform)
        err = np.abs(got[real] - want[real]).max()
        assert err <= tol, (implementation, platform, err)
        assert np.isfinite(got).all(), (implementation, platform)  # padding queries included
        worst = max(worst, err)
    return worst


@pytest.mark.parametrize("S,window,dtype", [(32, 0, jnp.float32), (96, 0, jnp.float32),
                                            (64, 7, jnp.float32), (32, 0, jnp.bfloat16)])
def test_every_path_equals_the_rule(S, window, dtype):
    """S = 32: eight small slots per row (the early stages); 96: slots that straddle the
    cache blocks; a window of 7, shorter than the items and the cached prefixes."""
    rng = np.random.default_rng(S + window)
    arrays, meta = packed_call(rng, S, dtype)
    assert_equals_the_rule(arrays, meta, window, [
        ("dense", "cpu"), ("blocked", "cpu"), ("blocked", "default"), ("blocked-static", "default"),
        ("pallas", "cpu")])


@pytest.mark.parametrize("heads,window,dtype", [
    ((7, 1), 0, jnp.float32), ((14, 2), 5, jnp.bfloat16), ((2, 2), 9, jnp.float32)])
def test_pallas_kernel_equals_the_rule(heads, window, dtype):
    """The kernel (interpreted) with G = 7 (Qwen2-7B's grouping) and G = 1, sliding
    windows, and a row of padding only, at the GPU's blocks (those of the 7B call):
    two query blocks and four cache blocks per row."""
    rng = np.random.default_rng(heads[0] + window)
    arrays, meta = packed_call(rng, 64, dtype, heads=heads, empty_rows=(1,))
    inputs = packed_inputs(PackedTokens(**meta), windows=True, implementation="pallas")
    assert (inputs.bq, inputs.bk) == pallas_attention.BLOCKS == pallas_attention.blocks(512, 2048)
    assert_equals_the_rule(arrays, meta, window, [("pallas", "cpu"), ("blocked-static", "default")])


@pytest.mark.parametrize("S,heads,window,dtype", [
    (64, (7, 1), 0, jnp.float32), (96, (14, 2), 5, jnp.bfloat16), (32, (2, 2), 9, jnp.float32)])
def test_tpu_kernel_equals_the_rule(S, heads, window, dtype):
    """The TPU kernel (Pallas' TPU interpreter) at the masks' blocks (those of the 7B
    call: two query blocks and four cache blocks per row), with a row of padding only:
    G = 7 in one block of heads; slots that straddle cache blocks with a window and
    bfloat16; eight small slots per row and G = 1."""
    rng = np.random.default_rng(S + heads[0] + window)
    arrays, meta = packed_call(rng, S, dtype, heads=heads, empty_rows=(1,))
    assert_equals_the_rule(arrays, meta, window, [("pallas-tpu", "tpu")])


@pytest.mark.parametrize("platform", ["cpu", "default"])
def test_block_bounds_hold_every_visible_key_and_skip_the_rest(platform):
    """Every key a token may see lies in its query block's ranges; with eight slots of 32
    keys per row, each query block scores at most two of the four cached blocks (the
    dense path scores all 256 keys per token)."""
    rng = np.random.default_rng(11)
    _, meta = packed_call(rng, 32, max_item=12)
    bq, bk = BLOCKS[platform]
    c_lo, c_n, n_lo, trips = (np.asarray(x) for x in block_ranges(
        meta["q_valid"], meta["slot"], meta["segment"], meta["c_slot"], bq, bk))
    assert c_n.max() == trips[0] and trips[0] <= 2 * 32 // bk + 1 and trips[0] < C // bk
    for b in range(B):
        for t in np.flatnonzero(np.asarray(meta["q_valid"][b])):
            cached, packed = visible_keys(meta, b, t, 0)
            qb = t // bq
            assert all(c_lo[b, qb] * bk <= c < (c_lo[b, qb] + c_n[b, qb]) * bk for c in cached)
            assert all(n_lo[b, qb] * bq <= u <= t for u in packed)
            assert qb - n_lo[b, qb] + 1 <= trips[1]


def test_unknown_implementation_is_refused():
    rng = np.random.default_rng(0)
    arrays, meta = packed_call(rng, 32)
    inputs = packed_inputs(PackedTokens(**meta), windows=False, implementation="dense")
    with pytest.raises(ValueError, match="attention implementation"):
        packed_attention(*arrays, inputs, 0, implementation="flash")
    with pytest.raises(ValueError, match="attention implementation"):
        packed_inputs(PackedTokens(**meta), windows=False, implementation="flash")


def test_each_implementation_gets_only_its_own_inputs():
    """Every implementation builds one typed pytree of what it reads, once per call: the
    dense masks (position differences only with sliding windows), cuDNN's masks side by
    side over its C + W keys, the blocked loops' inputs with their trip counts, and for
    the Pallas kernels exactly their keyword arguments (the GPU's and the TPU's alike).
    Types and shapes by ``jax.eval_shape`` (nothing compiles); values where they say
    something."""
    rng = np.random.default_rng(5)
    _, meta = packed_call(rng, 32)
    tokens = PackedTokens(**meta)

    def build(name, windows=True):
        return jax.eval_shape(lambda t: packed_inputs(t, implementation=name, windows=windows), tokens)
    built = {name: build(name) for name in attention.IMPLEMENTATIONS}
    assert {n: type(x) for n, x in built.items()} == {
        "dense": attention.DenseInputs, "blocked": attention.BlockedInputs,
        "cudnn": attention.CudnnInputs, "pallas": attention.SparseInputs}
    for kernel in (pallas_attention.packed_attention, pallas_tpu_attention.packed_attention):
        params = inspect.signature(kernel).parameters.values()
        assert set(built["pallas"].kwargs()) == {p.name for p in params
                                                  if p.kind == p.KEYWORD_ONLY} - {"interpret"}
    assert built["cudnn"].mask.shape == built["cudnn"].d.shape == (B, W, C + W)
    assert built["blocked"].trips.shape == (2,) and built["pallas"].c_n.shape == (B, W // built["pallas"].bq)
    plain = build("dense", windows=False)
    assert plain.d_cache is None and plain.d_new is None and build("cudnn", windows=False).d is None
    dense = packed_inputs(tokens, implementation="dense", windows=False)
    cudnn = packed_inputs(tokens, implementation="cudnn", windows=False)
    np.testing.assert_array_equal(cudnn.mask, np.concatenate([dense.cache, dense.new], -1))
