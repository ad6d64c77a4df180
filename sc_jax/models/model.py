"""One Flax NNX decoder for Llama-2, Mistral and Qwen2 (they differ only in config).

Pre-norm blocks: ``x += Attn(RMSNorm(x)); x += SwiGLU(RMSNorm(x))``, rotary position
embeddings (rotate-half layout, as in Hugging Face checkpoints), grouped-query
attention, optional q/k/v (and o) biases, per-layer sliding windows, tied or untied
embeddings.

Per-layer weights are stacked on a leading ``[L, ...]`` axis and the blocks run under
``jax.lax.scan``: one compiled block instead of L unrolled copies, which keeps compile
time flat in depth (it matters: the scoring engine compiles one program per length
bucket).

Masking is by *position*, not index: a query at position p_i sees a key at position
p_j iff the key is a real token, ``p_j <= p_i`` and (for a sliding-window layer)
``p_i - p_j < window``. That single rule covers right padding, left padding and keys
held in a KV cache, so every unpacked forward mode below shares one attention
function. Packed rows (:class:`Packing`: several segments per row, each after its own
slot of the cache) add "same slot, same segment" to the rule and go through
:mod:`sc_jax.models.attention`, whose block-sparse path scores only the key blocks a token's
slot and segment occupy, with the masks built once per call rather than per layer.

Shapes: B batch, T new tokens, S cached tokens, D hidden, H query heads, K key/value
heads, G = H / K, Dh head dim, F MLP width, V vocabulary, L layers.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sc_jax.models.attention import PackedTokens, packed_attention, packed_inputs
from sc_jax.models.config import ModelConfig, layer_inv_freq

# Finite, so a row with no visible key (a padded query) gives a uniform softmax
# rather than NaN; its output is never read.
_MASK_VALUE = -1e30


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
    """Keys and values of a prefix, for every layer.

    k, v: ``[L, Bc, S, K, Dh]``; pos: ``[Bc, S]`` int32 rotary positions;
    valid: ``[Bc, S]`` bool, False for padding. A batch of B rows may extend it when
    B is a multiple of Bc: cached row c serves batch rows c*G .. c*G+G-1 (G = B/Bc).
    Bc = 1 is one prefix shared by the whole batch; it is read once, never copied.
    """

    k: jax.Array
    v: jax.Array
    pos: jax.Array
    valid: jax.Array

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    @property
    def length(self) -> int:
        return self.k.shape[2]

    def next_position(self, batch: int | None = None) -> jax.Array:
        """int32 position the next token takes (one past the last real one): ``[Bc]``,
        or ``[batch]`` when each cached row serves ``batch // Bc`` consecutive rows."""
        nxt = jnp.max(jnp.where(self.valid, self.pos + 1, 0), axis=-1, initial=0).astype(jnp.int32)
        if batch is not None and batch != self.batch:
            if batch % self.batch:
                raise ValueError(f"batch {batch} is not a multiple of the cache's {self.batch} rows")
            nxt = jnp.repeat(nxt, batch // self.batch)
        return nxt


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Packing:
    """Several independent segments in one row (packed rows, as in packed training).

    segment: ``[B, T]`` int32, the segment of each new token: a new token sees the
    new keys of its own segment only (causal by position within it). slot: ``[B, T]``
    int32, the cache slot it continues; cache_slot: ``[B, S]`` int32, the slot of
    each cached key. A row's cache holds several prefixes side by side (slot j: the
    keys of one prefix); a token sees only the cached keys of its slot. With one
    segment and one slot per row this is the unpacked forward pass.
    """

    segment: jax.Array
    slot: jax.Array
    cache_slot: jax.Array


def _normal(rngs: nnx.Rngs, shape, dtype, std=0.02):
    return nnx.Param(jax.random.normal(rngs.params(), shape, jnp.float32).astype(dtype) * std)


# Stacked per-layer parameters, in checkpoint order; the biases exist only when the
# config asks for them.
LAYER_PARAMS = ("attn_norm", "wq", "wk", "wv", "bq", "bk", "bv", "q_norm", "k_norm", "wo", "bo",
                "post_attn_norm", "mlp_norm", "w_gate", "w_up", "w_down", "post_mlp_norm")


class Layers(nnx.Module):
    """All L transformer blocks, weights stacked on a leading layer axis."""

    def __init__(self, config: ModelConfig, *, dtype: Any, rngs: nnx.Rngs):
        c = config
        L, D, H, K, Dh, F = (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads,
                             c.head_dim, c.intermediate_size)
        # A norm's scale is norm_offset + w: w starts where the scale is 1.
        norm = lambda n: nnx.Param(jnp.full((L, n), 1.0 - c.norm_offset, dtype))  # noqa: E731
        self.attn_norm = norm(D)
        self.wq = _normal(rngs, (L, D, H, Dh), dtype)
        self.wk = _normal(rngs, (L, D, K, Dh), dtype)
        self.wv = _normal(rngs, (L, D, K, Dh), dtype)
        self.wo = _normal(rngs, (L, H, Dh, D), dtype)
        if c.qkv_bias:
            self.bq = _normal(rngs, (L, H, Dh), dtype)
            self.bk = _normal(rngs, (L, K, Dh), dtype)
            self.bv = _normal(rngs, (L, K, Dh), dtype)
        if c.o_bias:
            self.bo = _normal(rngs, (L, D), dtype)
        if c.qk_norm:
            self.q_norm, self.k_norm = norm(Dh), norm(Dh)
        if c.sandwich_norm:
            self.post_attn_norm, self.post_mlp_norm = norm(D), norm(D)
        self.mlp_norm = norm(D)
        self.w_gate = _normal(rngs, (L, D, F), dtype)
        self.w_up = _normal(rngs, (L, D, F), dtype)
        self.w_down = _normal(rngs, (L, F, D), dtype)


class Decoder(nnx.Module):
    """Decoder-only LM. ``Decoder(config, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))`` makes
    one with random weights (normal, std 0.02); checkpoints are loaded by
    :func:`sc_jax.models.checkpoint.decoder_from_arrays`."""

    def __init__(self, config: ModelConfig, *, dtype: Any = jnp.float32, rngs: nnx.Rngs):
        self.config = config
        self.dtype = dtype
        self.embed = _normal(rngs, (config.vocab_size, config.hidden_size), dtype)
        self.layers = Layers(config, dtype=dtype, rngs=rngs)
        self.final_norm = nnx.Param(jnp.full((config.hidden_size,), 1.0 - config.norm_offset, dtype))
        if not config.tie_word_embeddings:
            self.lm_head = _normal(rngs, (config.vocab_size, config.hidden_size), dtype)
        # Constants, not parameters: rotary inverse frequencies [L, Dh/2] (Gemma 3's
        # local and global layers turn at different bases) and per-layer windows.
        self.inv_freq = nnx.Variable(jnp.asarray(layer_inv_freq(config), jnp.float32))
        self.windows = nnx.Variable(jnp.asarray(config.windows, jnp.int32))

    # ------------------------------------------------------------------ blocks
    def _rms_norm(self, x, w):
        """RMSNorm over the last axis, scaled by ``norm_offset + w`` (Gemma's 1 + w)."""
        # float32 statistics regardless of the activation dtype (parity, bf16 safety);
        # the offset is added in float32 too, where 1 + w keeps w's small digits.
        xf = x.astype(jnp.float32)
        xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.config.rms_norm_eps)
        return (xf * (self.config.norm_offset + w.astype(jnp.float32))).astype(self.dtype)

    def _rope(self, x, positions, inv_freq):
        """x: ``[B, T, N, Dh]``; positions: ``[B, T]``; inv_freq: ``[Dh/2]`` (this
        layer's). Rotate-half layout."""
        ang = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, Dh/2]
        cos = jnp.cos(ang)[:, :, None, :]
        sin = jnp.sin(ang)[:, :, None, :]
        xf = x.astype(jnp.float32)
        x1, x2 = jnp.split(xf, 2, axis=-1)
        out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
        return out.astype(x.dtype)

    def _attend(self, q, k_new, v_new, q_pos, new_valid, window, ck, cv, c_pos, c_valid):
        """Grouped-query attention of the new queries over [cached keys, new keys] (one
        sequence per row; packed rows go through :mod:`sc_jax.models.attention`).

        q: ``[B, T, H, Dh]``; k_new, v_new: ``[B, T, K, Dh]``; q_pos, new_valid: ``[B, T]``;
        ck, cv: ``[Bc, S, K, Dh]`` or None; c_pos, c_valid: ``[Bc, S]``.
        Returns ``[B, T, H, Dh]``.
        """
        c = self.config
        B, T, H, Dh = q.shape
        K = c.num_kv_heads
        qg = q.reshape(B, T, K, H // K, Dh)
        scale = 1.0 / np.sqrt(Dh)

        def visible(k_pos, k_valid):  # [b, S] -> [B, 1, 1, T, S]
            d = q_pos[:, :, None] - k_pos[:, None, :]
            ok = k_valid[:, None, :] & (d >= 0)
            ok = ok & ((window <= 0) | (d < window))
            return ok[:, None, None, :, :]

        s_new = jnp.einsum("btkgd,bskd->bkgts", qg, k_new,
                           preferred_element_type=jnp.float32) * scale
        s_new = jnp.where(visible(q_pos, new_valid), s_new, _MASK_VALUE)
        if ck is None:
            p = jax.nn.softmax(s_new, axis=-1).astype(v_new.dtype)
            out = jnp.einsum("bkgts,bskd->btkgd", p, v_new, preferred_element_type=jnp.float32)
            return out.reshape(B, T, H, Dh).astype(q.dtype)

        # The cache has Bc rows and the batch B = Bc * G: each cached row is shared by
        # G consecutive batch rows (G = B for one shared prefix, G = 1 for per-row
        # caches). Contracting group-wise reads each cached row once, never a G-fold
        # copy: the queries of one context all attend to one copy of its cache.
        Bc, S = ck.shape[0], ck.shape[1]
        G = B // Bc
        Gh = H // K
        q6 = qg.reshape(Bc, G, T, K, Gh, Dh)
        s_old = jnp.einsum("cgtkhd,cskd->cgkhts", q6, ck, preferred_element_type=jnp.float32)
        s_old = s_old.reshape(B, K, Gh, T, S)
        c_pos = jnp.repeat(c_pos, G, axis=0)  # [Bc, S] -> [B, S]: small int/bool
        c_valid = jnp.repeat(c_valid, G, axis=0)
        s_old = jnp.where(visible(c_pos, c_valid), s_old * scale, _MASK_VALUE)
        p = jax.nn.softmax(jnp.concatenate([s_old, s_new], axis=-1), axis=-1).astype(v_new.dtype)
        p_old, p_new = p[..., :S], p[..., S:]
        out = jnp.einsum("cgkhts,cskd->cgtkhd", p_old.reshape(Bc, G, K, Gh, T, S), cv,
                         preferred_element_type=jnp.float32).reshape(B, T, K, Gh, Dh)
        out = out + jnp.einsum("bkgts,bskd->btkgd", p_new, v_new,
                               preferred_element_type=jnp.float32)
        return out.reshape(B, T, H, Dh).astype(q.dtype)

    # ------------------------------------------------------------------ forward
    def __call__(self, tokens, positions, valid, cache: KVCache | None = None,
                 packing: Packing | None = None, attention: str = "dense"):
        """Run the new tokens (optionally after a cached prefix).

        tokens, positions: ``[B, T]`` int32; valid: ``[B, T]`` bool (False = padding).
        ``packing`` (with a cache of B rows): several segments per row, see
        :class:`Packing`; its attention is ``attention``, one of
        :data:`sc_jax.models.attention.IMPLEMENTATIONS` (each token sees its slot's cached
        keys and its segment's new keys; its inputs are built once for all layers).
        Returns ``(hidden [B, T, D] after the final norm, KVCache of the new tokens
        [L, B, T, K, Dh])``; concatenate it to ``cache`` to extend.
        """
        c = self.config
        x = self.embed[...][tokens].astype(self.dtype)  # [B, T, D]
        if c.embed_scale is not None:
            # Gemma: sqrt(D), rounded to the activation dtype as transformers does.
            x = x * jnp.asarray(c.embed_scale, self.dtype)
        # Every attention implementation scales q k^T by Dh^-1/2; a config's own scale
        # (Gemma 3's query_pre_attn_scalar^-1/2) is folded into q, once per layer.
        q_mult = None if c.attn_scale is None else c.attn_scale * float(np.sqrt(c.head_dim))
        act = jax.nn.silu if c.hidden_act == "silu" else (
            lambda g: jax.nn.gelu(g, approximate=True))
        lp = {n: getattr(self.layers, n)[...] for n in LAYER_PARAMS if hasattr(self.layers, n)}
        attn_inputs = None
        if packing is not None:
            tokens_at = PackedTokens(positions, valid, packing.segment, packing.slot, cache.pos,
                                     cache.valid, packing.cache_slot)
            attn_inputs = packed_inputs(tokens_at, implementation=attention,
                                        windows=any(w > 0 for w in c.windows),
                                        platform=jax.default_backend())

        def block(x, xs):
            w = xs["w"]
            h = self._rms_norm(x, w["attn_norm"])
            q = jnp.einsum("btd,dhk->bthk", h, w["wq"])
            k = jnp.einsum("btd,dhk->bthk", h, w["wk"])
            v = jnp.einsum("btd,dhk->bthk", h, w["wv"])
            if c.qkv_bias:
                q, k, v = q + w["bq"], k + w["bk"], v + w["bv"]
            if c.qk_norm:  # per head, over Dh, before the rotation (Qwen3, Gemma 3)
                q, k = self._rms_norm(q, w["q_norm"]), self._rms_norm(k, w["k_norm"])
            q, k = self._rope(q, positions, xs["inv_freq"]), self._rope(k, positions, xs["inv_freq"])
            if q_mult is not None and q_mult != 1.0:
                q = (q.astype(jnp.float32) * q_mult).astype(q.dtype)
            if attn_inputs is not None:
                a = packed_attention(q, k, v, xs["ck"], xs["cv"], attn_inputs, xs["window"],
                                     implementation=attention)
            elif cache is None:
                a = self._attend(q, k, v, positions, valid, xs["window"], None, None, None, None)
            else:
                a = self._attend(q, k, v, positions, valid, xs["window"], xs["ck"], xs["cv"],
                                 cache.pos, cache.valid)
            o = jnp.einsum("bthk,hkd->btd", a, w["wo"])
            if c.o_bias:
                o = o + w["bo"]
            if c.sandwich_norm:
                o = self._rms_norm(o, w["post_attn_norm"])
            x = x + o
            h = self._rms_norm(x, w["mlp_norm"])
            g = jnp.einsum("btd,df->btf", h, w["w_gate"])
            u = jnp.einsum("btd,df->btf", h, w["w_up"])
            m = jnp.einsum("btf,fd->btd", act(g) * u, w["w_down"])
            if c.sandwich_norm:
                m = self._rms_norm(m, w["post_mlp_norm"])
            x = x + m
            return x, (k, v)

        xs = {"w": lp, "window": self.windows[...], "inv_freq": self.inv_freq[...]}
        if cache is not None:
            xs["ck"], xs["cv"] = cache.k, cache.v
        with jax.named_scope("blocks"):
            x, (ks, vs) = jax.lax.scan(block, x, xs)
        x = self._rms_norm(x, self.final_norm[...])
        return x, KVCache(ks, vs, positions.astype(jnp.int32), valid)

    def project(self, hidden, rows=None):
        """Logits of chosen vocabulary rows: hidden ``[..., D]`` -> ``[..., R]`` float32.

        ``rows``: ``[R]`` int32 vocabulary ids, or None for the full vocabulary. Only
        these rows of the output embedding are multiplied (label scoring needs a
        handful of rows out of tens of thousands).
        """
        table = self.embed[...] if self.config.tie_word_embeddings else self.lm_head[...]
        if rows is not None:
            table = table[rows]
        return jnp.einsum("...d,vd->...v", hidden, table, preferred_element_type=jnp.float32)


def empty_cache(config, batch: int = 1, dtype=jnp.float32) -> KVCache:
    """A zero-length cache (the trie root when the tokenizer adds no BOS)."""
    L, K, Dh = config.num_layers, config.num_kv_heads, config.head_dim
    z = jnp.zeros((L, batch, 0, K, Dh), dtype)
    return KVCache(z, z, jnp.zeros((batch, 0), jnp.int32), jnp.zeros((batch, 0), bool))


def concat_cache(a: KVCache, b: KVCache) -> KVCache:
    """Append segment ``b`` after ``a`` (a's batch is broadcast if it is 1)."""
    B = b.batch
    if a.batch != B:
        a = KVCache(jnp.broadcast_to(a.k, (a.k.shape[0], B) + a.k.shape[2:]),
                    jnp.broadcast_to(a.v, (a.v.shape[0], B) + a.v.shape[2:]),
                    jnp.broadcast_to(a.pos, (B, a.pos.shape[1])),
                    jnp.broadcast_to(a.valid, (B, a.valid.shape[1])))
    return KVCache(jnp.concatenate([a.k, b.k], axis=2), jnp.concatenate([a.v, b.v], axis=2),
                   jnp.concatenate([a.pos, b.pos], axis=1),
                   jnp.concatenate([a.valid, b.valid], axis=1))


def positions_from_valid(valid, start=None):
    """Rotary positions ``[B, T]`` of the real tokens: 0, 1, 2, ... after ``start``
    (``[B]`` or ``[1]``, default 0), whatever the padding side. Padding gets the
    clipped neighbouring value; it is never visible as a key."""
    pos = jnp.cumsum(valid.astype(jnp.int32), axis=1) - 1
    pos = jnp.maximum(pos, 0)
    if start is not None:
        pos = pos + start[:, None]
    return pos.astype(jnp.int32)
