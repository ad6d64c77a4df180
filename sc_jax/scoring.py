"""Label scoring of (context, query) pairs: the plain path, flat batches, and the
prefix-sharing trie engine.

Label modes (paper Section 3.2.1 features come from their output):

* ``first_token``: log-probability of each label word's first token, renormalised
  over the labels. The full-vocabulary normaliser cancels in that renormalisation,
  so only the label rows of the output embedding are ever projected. Two labels
  with the same first token are refused.
* ``sequence``: sum of the log-probabilities of each label's full token sequence,
  renormalised over the labels (SST-5's "very negative", TREC's multi-word labels).
  Steps after the first need the full softmax normaliser, so the full vocabulary is
  projected at those few positions only (never ``[B, T, V]``).

All paths return ``[N, n_classes]`` float32 label log-probabilities for N pairs;
:func:`sc_jax.objective.log_odds` turns them into the features m_c = log p_c - log p_0.

The engine (:class:`ScoringEngine`) computes every distinct ordered sub-context once:
contexts are sorted so that shared prefixes sit together, cut into chunks that fit
``max_cache_tokens``, and within a chunk the trie is grown depth by depth, each node
extending its parent's KV cache by one demonstration. Every query of a context is then
scored against the context's cache in one batch. Shapes are padded to fixed buckets
(one segment length per run, cache lengths in multiples of 32, query rows in
power-of-two length buckets, power-of-two batches) so the number of compilations
stays small; :data:`COMPILES` counts them.

Device pipeline: each trie level is one preallocated buffer that growth steps write
in place (donated), so a level is never held twice; the model programs take only the
cache rows they extend (gathered by a model-free program), so their shapes do not
depend on level sizes; host batches are row lookups into tables packed once per
call; and each micro-batch's result is fetched after the next one is dispatched, so
the host never waits on the batch it has just sent. The token budgets come from the
device's memory (:mod:`sc_jax.schedule`) unless given.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import time
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from .loading import LoadedModel, bucket_batch
from .model import KVCache, empty_cache, positions_from_valid
# log_odds, engine_shapes, EngineShapes, micro_batch and query_length are importable
# from here too (the scoring stage's features and the engine's shapes).
from .objective import log_odds  # noqa: F401
from .prompts import PromptPieces
from .schedule import (  # noqa: F401
    EngineShapes, PlanError, QueryGroups, device_memory_bytes, engine_shapes, host_memory_bytes,
    micro_batch, peak_bytes, plan_budgets, query_batches, query_groups, query_length, query_rows,
    round_up, schedule)
from .multihost import smallest, to_host
from .sharding import batch_sharded, kv_sharding

MODES = ("first_token", "sequence")

#: Number of traces (= compilations) of each jitted engine function in this process.
COMPILES: Counter = Counter()


def _renorm(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return (x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))).astype(np.float32)


def check_mode(mode: str, pieces: PromptPieces) -> None:
    """Refuse an unknown mode, and first-token scoring of labels that share a first token."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode == "first_token":
        first = [ids[0] for ids in pieces.labels]
        dup = [t for t, c in Counter(first).items() if c > 1]
        if dup:
            which = [j for j, ids in enumerate(pieces.labels) if ids[0] in dup]
            raise ValueError(f"labels {which} share their first token {dup}: first_token "
                             "scoring cannot separate them; use mode='sequence'")


def _check_inputs(model: LoadedModel, pieces: PromptPieces, contexts, pairs, mode: str):
    """Validate everything before any forward pass."""
    check_mode(mode, pieces)
    contexts = np.asarray(contexts, np.int64)
    pairs = np.asarray(pairs, np.int64)
    k = len(pieces.demos)
    if k == 0:
        raise ValueError("the demonstration set is empty")
    if contexts.ndim != 2 or contexts.shape[1] < 1:
        raise ValueError(f"contexts must be [M, i] with i >= 1, got shape {contexts.shape}")
    if contexts.shape[1] > k:
        raise ValueError(f"context size {contexts.shape[1]} exceeds the {k} demonstrations")
    if contexts.size and (contexts.min() < 0 or contexts.max() >= k):
        raise ValueError(f"context entries must index the {k} demonstrations")
    if pairs.ndim != 2 or pairs.shape[1] != 2:
        raise ValueError(f"pairs must be [N, 2] (context index, query index), got {pairs.shape}")
    if pairs.size and (pairs[:, 0].min() < 0 or pairs[:, 0].max() >= len(contexts)):
        raise ValueError("a pair names a context index out of range")
    if pairs.size and (pairs[:, 1].min() < 0 or pairs[:, 1].max() >= len(pieces.queries)):
        raise ValueError("a pair names a query index out of range")
    if any(len(q) == 0 for q in pieces.queries):
        raise ValueError("a query tokenizes to nothing")
    # The longest prompt must fit the context window (and any sliding window).
    lengths = pieces.prompt_lengths(contexts, pairs, mode)
    limit = model.config.max_position_embeddings
    if lengths.size and lengths.max() > limit:
        r = int(lengths.argmax())
        c, q = (int(x) for x in pairs[r])
        qpart = f"demonstration {q}" if q < k else f"query {q}"
        raise ValueError(f"the longest prompt (context {contexts[c].tolist()}, {qpart}) has "
                         f"{int(lengths[r])} tokens, more than the model's context window of "
                         f"{limit}; shorten or drop its longest text, or use fewer demonstrations")
    # Sliding windows need no check: masking by position honours them in cached paths.
    return contexts, pairs


# ------------------------------------------------------------------ label log-probs
def _label_logprobs(out: np.ndarray, mode: str, n: int) -> np.ndarray:
    """Engine/flat outputs -> renormalised label log-probs ``[N, n]``. first_token:
    out is ``[N, n]`` label-row logits; sequence: ``[N * n]`` summed log-probs."""
    if mode == "first_token":
        return _renorm(out)
    return _renorm(out.reshape(-1, n))


# ------------------------------------------------------------------ plain path
def score_plain(model: LoadedModel, pieces: PromptPieces, contexts, pairs, mode: str = "first_token") -> np.ndarray:
    """The reference way: one prompt per forward pass, batch 1, context recomputed,
    through :meth:`LoadedModel.last_logits`. Returns ``[N, n_classes]``."""
    contexts, pairs = _check_inputs(model, pieces, contexts, pairs, mode)
    n = len(pieces.labels)
    out = np.zeros((len(pairs), n), np.float64)
    first = np.asarray([l[0] for l in pieces.labels], np.int32)
    for r, (c, q) in enumerate(pairs):
        ids = pieces.prompt(contexts[c], q)
        if mode == "first_token":
            out[r] = model.last_logits([ids], rows=first)[0]
            continue
        for cls, lab in enumerate(pieces.labels):
            total = 0.0
            for j, tok in enumerate(lab):
                logits = model.last_logits([ids + list(lab[:j])])[0].astype(np.float64)
                total += logits[tok] - (logits.max() + np.log(np.exp(logits - logits.max()).sum()))
            out[r, cls] = total
    return _renorm(out)


def _pack(rows, T: int, side: str):
    """Rows of ids -> (tokens [B, T], valid [B, T], start [B]): each row's first
    index. Vectorised: the row-major order of the valid mask is the order of the
    concatenated rows."""
    B = len(rows)
    lengths = np.fromiter(map(len, rows), np.int64, B)
    flat = np.fromiter(itertools.chain.from_iterable(rows), np.int32, int(lengths.sum()))
    start = np.zeros(B, np.int64) if side == "right" else T - lengths
    col = np.arange(T)
    valid = (col >= start[:, None]) & (col < (start + lengths)[:, None])
    tokens = np.zeros((B, T), np.int32)
    tokens[valid] = flat
    return tokens, valid, start.astype(np.int32)


def _gather_arrays(gathers, targets, start, P: int):
    """Per-row gather offsets (relative to the row start) and targets, P at most
    per row -> ``[B, P]`` absolute positions, targets and mask."""
    B = len(gathers)
    n = np.fromiter(map(len, gathers), np.int64, B)
    m = np.arange(P) < n[:, None]
    g = np.zeros((B, P), np.int32)
    t = np.zeros((B, P), np.int32)
    g[m] = np.fromiter(itertools.chain.from_iterable(gathers), np.int64, int(n.sum()))
    t[m] = np.fromiter(itertools.chain.from_iterable(targets), np.int64, int(n.sum()))
    g = np.where(m, g + np.asarray(start, np.int32)[:, None], 0)
    return g, t, m


# ------------------------------------------------------------------ jitted pieces
def _label_scores(model, hidden, gather, targets, tmask, rows, sequence: bool):
    sel = jnp.take_along_axis(hidden, gather[..., None], axis=1)  # [B, P, D]
    if not sequence:
        return model.project(sel[:, 0], rows)  # [B, n] label-row logits
    lp = jax.nn.log_softmax(model.project(sel), axis=-1)  # [B, P, V] at P positions only
    tok = jnp.take_along_axis(lp, targets[..., None], axis=-1)[..., 0]
    return jnp.sum(jnp.where(tmask, tok, 0.0), axis=-1)  # [B]


@functools.partial(jax.jit, static_argnames=("graphdef", "sequence"))
def _score_flat(graphdef, state, tokens, valid, gather, targets, tmask, rows, sequence):
    COMPILES["flat"] += 1
    model = nnx.merge(graphdef, state)
    hidden, _ = model(tokens, positions_from_valid(valid), valid)
    return _label_scores(model, hidden, gather, targets, tmask, rows, sequence)


def _take_rows(parent: KVCache, idx) -> KVCache:
    return KVCache(parent.k[:, idx], parent.v[:, idx], parent.pos[idx], parent.valid[idx])


# The model's programs take only the cache rows they extend (gathered by a separate,
# model-free program), so their shapes do not depend on how many nodes a trie level
# has: a run compiles one growth program per depth and micro-batch, not one per
# (level size, depth). Model programs are the expensive compiles (seconds to tens of
# seconds for a 7B model on a GPU); gathers and in-place writes compile in
# milliseconds.
@jax.jit
def _gather_rows(level: KVCache, idx) -> KVCache:
    """Rows ``idx [B]`` of a level buffer: ``[L, B, S, K, Dh]``."""
    COMPILES["gather"] += 1
    return _take_rows(level, idx)


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _grow(graphdef, state, rows: KVCache, tokens, valid) -> KVCache:
    """One segment after each of ``rows`` (B cached prefixes of S tokens): the new
    tokens' keys and values ``[L, B, T, K, Dh]``."""
    COMPILES["grow"] += 1
    model = nnx.merge(graphdef, state)
    _, seg = model(tokens, positions_from_valid(valid, rows.next_position(tokens.shape[0])), valid, rows)
    return seg


@functools.partial(jax.jit, donate_argnames=("level",))
def _write_rows(level: KVCache, rows: KVCache, seg: KVCache, offset) -> KVCache:
    """Children (``rows`` then ``seg``) written in place into rows ``offset .. offset
    + B`` of the donated ``level`` buffer ``[L, N, S_d, K, Dh]``: a level is never held
    twice (no concatenation of parts)."""
    COMPILES["write"] += 1
    z = jnp.zeros((), jnp.int32)
    S = rows.length

    def put(dst, a, b, lead):
        idx = (z, offset) if lead else (offset,)
        dst = jax.lax.dynamic_update_slice(dst, a.astype(dst.dtype), idx + (z,) * (a.ndim - len(idx)))
        at = idx + (jnp.int32(S),) + (z,) * (b.ndim - len(idx) - 1)
        return jax.lax.dynamic_update_slice(dst, b.astype(dst.dtype), at)

    return KVCache(put(level.k, rows.k, seg.k, True), put(level.v, rows.v, seg.v, True),
                   put(level.pos, rows.pos, seg.pos, False), put(level.valid, rows.valid, seg.valid, False))


@functools.partial(jax.jit, static_argnames=("config", "rows", "length", "dtype", "sharding"))
def _empty_level(config, rows: int, length: int, dtype, sharding=None):
    """A zeroed level buffer ``[L, rows, length, K, Dh]`` (all positions invalid),
    its rows split over the mesh's data axis when there is one."""
    L, K, Dh = config.num_layers, config.num_kv_heads, config.head_dim
    z = jnp.zeros((L, rows, length, K, Dh), dtype)
    out = KVCache(z, z, jnp.zeros((rows, length), jnp.int32), jnp.zeros((rows, length), bool))
    if sharding is not None:
        out = jax.lax.with_sharding_constraint(out, sharding)
    return out


@functools.partial(jax.jit, static_argnames=("graphdef", "sequence"))
def _score_cached(graphdef, state, cache: KVCache, tokens, valid, gather, targets, tmask, rows,
                  sequence):
    """Queries after their contexts' caches: ``cache`` holds Bc gathered contexts,
    each serving G = B / Bc consecutive query rows. Label scores ``[B, n]`` or
    ``[B]``."""
    COMPILES["score"] += 1
    model = nnx.merge(graphdef, state)
    hidden, _ = model(tokens, positions_from_valid(valid, cache.next_position(tokens.shape[0])),
                      valid, cache)
    return _label_scores(model, hidden, gather, targets, tmask, rows, sequence)


@dataclasses.dataclass
class EngineStats:
    """What one :meth:`ScoringEngine.score` call did: forward calls, real tokens
    computed (the trie's unique tokens plus query tokens), padded tokens, rows."""

    calls: int = 0
    tokens: int = 0
    padded_tokens: int = 0
    nodes: int = 0
    query_rows: int = 0
    seconds: float = 0.0


class ScoringEngine:
    """Prefix-shared scoring of many (context, query) pairs.

    ``max_tokens_per_batch``: padded (cache + new) tokens per forward call, which
    sets the micro-batch size. ``max_cache_tokens``: cached tokens held per chunk of
    the trie (memory bound: never all of k = 16's nodes at once). Either left as
    None is derived from the memory budget by :func:`sc_jax.schedule.plan_budgets`:
    ``device_memory`` bytes per device if given, else the device's ``bytes_limit``,
    else (CPU) the host's memory. When a budget is known (given or reported by the
    device), every call's plan is checked against it before anything compiles, and
    a :class:`sc_jax.schedule.PlanError` names the numbers if it cannot fit.
    ``side``: padding side of segments and queries (results do not depend on it).
    ``progress``: a tqdm bar with counts of rows and tokens. ``max_group``: how
    many query rows of one context share one gathered copy of its cache (a fixed
    group size keeps compiles bounded; larger groups copy less).
    """

    def __init__(self, model: LoadedModel, *, max_tokens_per_batch: int | None = None,
                 max_cache_tokens: int | None = None, device_memory: int | None = None,
                 side: str = "right", progress: bool = True, max_group: int = 64):
        if side not in ("left", "right"):
            raise ValueError(f"side must be 'left' or 'right', got {side!r}")
        for name, v in (("max_tokens_per_batch", max_tokens_per_batch),
                        ("max_cache_tokens", max_cache_tokens), ("device_memory", device_memory)):
            if v is not None and int(v) < 1:
                raise ValueError(f"{name} must be positive, got {v}")
        self.model = model
        self._tokens = None if max_tokens_per_batch is None else int(max_tokens_per_batch)
        self._cache = None if max_cache_tokens is None else int(max_cache_tokens)
        self.device_memory = None if device_memory is None else int(device_memory)
        self.max_tokens_per_batch = self._tokens
        self.max_cache_tokens = self._cache
        self.side = side
        self.progress = progress
        self.max_group = int(max_group)
        self.stats = EngineStats()
        self.budgets = None  # the last call's plan (sc_jax.schedule.Budgets), when derived

    def _budget(self) -> tuple[int, bool]:
        """(bytes per device, whether it is a real limit to check against)."""
        if self.device_memory is not None:
            return self.device_memory, True
        # The smallest over the processes of a multi-process run: each plans the same
        # batches, so each runs the same programs.
        dev = device_memory_bytes()
        if dev is not None:
            return smallest(dev), True
        return smallest(host_memory_bytes()), False

    def _resolve(self, shapes, contexts, pairs, nr: int, G: int, row_lengths) -> int:
        """Set this call's token budgets (given, or planned) and check the plan."""
        budget, enforce = self._budget()
        m = self.model
        platform = jax.default_backend()
        if self._tokens is None or self._cache is None:
            b = self.budgets = plan_budgets(m.config, m.dtype, shapes, budget_bytes=budget, G=G,
                                            n_devices=m.n_devices, platform=platform,
                                            model_shards=m.model_shards)
            self.max_tokens_per_batch = self._tokens or b.max_tokens_per_batch
            self.max_cache_tokens = self._cache or b.max_cache_tokens
            G = b.max_group
        else:
            self.max_tokens_per_batch, self.max_cache_tokens = self._tokens, self._cache
        if enforce:
            calls = schedule(shapes, contexts, pairs, nr, G, row_lengths,
                             max_tokens_per_batch=self.max_tokens_per_batch,
                             max_cache_tokens=self.max_cache_tokens, n_devices=m.n_devices)
            peak = peak_bytes(m.config, m.dtype, calls, model_shards=m.model_shards)
            if peak["peak_bytes"] > budget:
                gib = 2 ** 30
                raise PlanError(
                    f"the planned peak is {peak['peak_bytes'] / gib:.2f} GiB per device (weights "
                    f"{peak['weight_bytes'] / gib:.2f}, KV caches {peak['cache_bytes'] / gib:.2f}, "
                    f"one call's temporaries {peak['temp_bytes'] / gib:.2f}), over the "
                    f"{budget / gib:.2f} GiB budget: lower max_tokens_per_batch "
                    f"({self.max_tokens_per_batch}) or max_cache_tokens ({self.max_cache_tokens})")
        return G

    # -------------------------------------------------------------- helpers
    def _micro_batch(self, n_rows: int, width: int) -> int:
        return micro_batch(n_rows, width, self.max_tokens_per_batch, self.model.n_devices)

    def _put_idx(self, x):
        return self.model._put(x)

    def _level(self, rows: int, length: int) -> KVCache:
        m = self.model
        sharding = None
        if m.mesh is not None:
            c = m.config
            kv = kv_sharding(m.mesh, (c.num_layers, rows, length, c.num_kv_heads, c.head_dim))
            sharding = KVCache(kv, kv, batch_sharded(m.mesh), batch_sharded(m.mesh))
        return _empty_level(m.config, rows, length, m.dtype, sharding)

    # -------------------------------------------------------------- main entry
    def score(self, pieces: PromptPieces, contexts, pairs, mode: str = "first_token") -> np.ndarray:
        """Label log-probs ``[N, n_classes]`` of every (context, query) pair.

        pieces: tokenized demos and queries; contexts: ``[M, i]`` demo indices
        (ordered); pairs: ``[N, 2]`` (context index, query index). Equal, to float
        rounding, to :func:`score_plain` on the same inputs.

        Host work is table lookups (every segment and query row is packed once per
        call) and results are fetched one micro-batch behind, so the host prepares
        batch b + 1 while the device runs batch b, and never waits on a batch it
        has just dispatched.
        """
        contexts, pairs = _check_inputs(self.model, pieces, contexts, pairs, mode)
        t0 = time.perf_counter()
        n = len(pieces.labels)
        seq = mode == "sequence"
        nr = n if seq else 1  # query rows per pair
        st = self.stats = EngineStats()
        if len(pairs) == 0:
            return np.zeros((0, n), np.float32)
        i = contexts.shape[1]
        shapes = engine_shapes(pieces, i, mode)
        T_seg, T_q, P, lens = shapes.T_seg, shapes.T_q, shapes.P, shapes.lens
        segs = _SegmentTable(pieces, T_seg, self.side)
        qt = _QueryTable(pieces, mode, T_q, P, self.side)
        rows_arg = None if seq else self.model._rows([l[0] for l in pieces.labels])
        out = np.zeros((len(pairs) * nr, n) if not seq else (len(pairs) * nr,), np.float32)

        # Query rows of one context form groups of G that share one copy of its cache.
        per_ctx = np.bincount(pairs[:, 0], minlength=len(contexts))
        G = int(min(self.max_group, per_ctx.max() * nr))
        G = self._resolve(shapes, contexts, pairs, nr, G, qt.length)
        # Sort contexts so shared prefixes are adjacent; chunk by cache memory.
        order = np.lexsort(contexts.T[::-1])
        per_chunk = max(1, self.max_cache_tokens // lens[-1])

        bar = None
        if self.progress:
            bar = tqdm(total=len(pairs) * nr, unit="query", desc=f"scoring i={i}", leave=False)
        try:
            for c0 in range(0, len(order), per_chunk):
                chunk = order[c0:c0 + per_chunk]
                leaf_cache, leaf_of = self._grow_trie(segs, contexts[chunk], lens)
                groups = query_groups(chunk, len(contexts), pairs, nr, G, leaf_of, qt.length)
                if groups is None:
                    continue
                self._run_queries(leaf_cache, groups, qt, lens[-1], rows_arg, seq, out, bar)
        finally:
            if bar is not None:
                bar.close()
        st.seconds = time.perf_counter() - t0
        return _label_logprobs(out, mode, n)

    def _grow_trie(self, segs: "_SegmentTable", ctx, lens):
        """Caches of every distinct prefix of ``ctx`` ([C, i]), depth by depth.
        Returns (leaf caches [L, U, S_i, ...], index of each context's leaf)."""
        m, st = self.model, self.stats
        parent = empty_cache(m.config, 1, m.dtype)
        leaf_of = None
        for d in range(1, ctx.shape[1] + 1):
            prefixes, inverse = np.unique(ctx[:, :d], axis=0, return_inverse=True)
            if d == 1:
                pidx = np.zeros(len(prefixes), np.int64)
            else:
                # Every prefix of depth d - 1 has a child, so the unique parents are
                # exactly the previous level, in the same (lexicographic) order.
                _, pidx = np.unique(prefixes[:, :-1], axis=0, return_inverse=True)
            pidx = pidx.reshape(-1)
            seg = prefixes[:, -1]
            first = d == 1
            B = self._micro_batch(len(prefixes), lens[d])
            level = self._level(round_up(len(prefixes), B), lens[d])
            for s in range(0, len(prefixes), B):
                sl = slice(s, s + B)
                real = len(seg[sl])
                idx = np.zeros(B, np.int32)
                idx[:real] = pidx[sl]
                demo = np.full(B, seg[s])  # filler rows repeat a real one, land in padding rows
                demo[:real] = seg[sl]
                tokens, valid = segs.batch(demo, first)
                rows = _gather_rows(parent, self._put_idx(idx))
                seg_kv = _grow(m._graphdef, m._state, rows, self._put_idx(tokens), self._put_idx(valid))
                level = _write_rows(level, rows, seg_kv, np.int32(s))
                del rows, seg_kv
                st.calls += 1
                st.tokens += int(segs.lengths(first)[seg[sl]].sum())
                st.padded_tokens += B * segs.T
            st.nodes += len(prefixes)
            parent = level
            leaf_of = inverse.reshape(-1)
        return parent, leaf_of

    def _run_queries(self, cache, groups: QueryGroups, qt: "_QueryTable", S, rows_arg, seq, out, bar):
        """Score every group of <= G query rows against its leaf of ``cache`` and
        write the real rows into ``out``; each batch's result is fetched after the
        next batch has been dispatched."""
        m, st = self.model, self.stats
        G = groups.rows.shape[1]
        Bc = self._micro_batch(len(groups.leaf), S + G * qt.T)
        pending = None

        def collect(p):
            res, keep, dest = p
            res = to_host(res)[keep]  # blocks only on an earlier batch
            out[dest] = res
            st.query_rows += len(dest)
            if bar is not None:
                bar.update(len(dest))
                bar.set_postfix(tokens=st.tokens, refresh=False)

        for sel, real, T in query_batches(groups, Bc, qt.T):
            rows = groups.rows[sel].reshape(-1)
            keep = (groups.keep[sel] & real[:, None]).reshape(-1)
            tokens, valid, g, t, msk = qt.batch(rows, T)
            put = self._put_idx
            ctx_rows = _gather_rows(cache, put(groups.leaf[sel].astype(np.int32)))
            res = _score_cached(m._graphdef, m._state, ctx_rows, put(tokens), put(valid), put(g),
                                put(t), put(msk), rows_arg, sequence=seq)
            del ctx_rows
            st.calls += 1
            st.tokens += int(qt.length[rows[keep]].sum())
            st.padded_tokens += len(rows) * T
            if pending is not None:
                collect(pending)
            pending = (res, keep, groups.dest[sel].reshape(-1)[keep])
        if pending is not None:
            collect(pending)


class _SegmentTable:
    """Every demonstration's segment packed once: ``[k, T]`` with and without BOS
    (the first level of the trie carries it). Batches are row lookups."""

    def __init__(self, pieces: PromptPieces, T: int, side: str):
        k = len(pieces.demos)
        self.T = T
        rows = [list(pieces.bos) + pieces.segment(j) for j in range(k)] + \
            [pieces.segment(j) for j in range(k)]
        self.tokens, self.valid, _ = _pack(rows, T, side)
        self._len = np.asarray([len(r) for r in rows], np.int64)
        self.k = k

    def batch(self, demo, first: bool):
        r = demo + (0 if first else self.k)
        return self.tokens[r], self.valid[r]

    def lengths(self, first: bool):
        return self._len[:self.k] if first else self._len[self.k:]


class _QueryTable:
    """Every query row packed once (row q * nr + j: query q, label j in sequence
    mode): tokens, valid ``[R, T]``, gather offsets, targets and their mask
    ``[R, P]``. Batches are row lookups."""

    def __init__(self, pieces: PromptPieces, mode: str, T: int, P: int, side: str):
        rows, gathers, targets = query_rows(pieces, mode, range(len(pieces.queries)))
        self.T, self.side = T, side
        self.tokens, self.valid, start = _pack(rows, T, side)
        self.gather, self.targets, self.mask = _gather_arrays(gathers, targets, start, P)
        self.length = np.asarray([len(r) for r in rows], np.int64)

    def batch(self, rows, T: int | None = None):
        """The rows, cut to ``T`` columns (every row in the batch fits)."""
        T = self.T if T is None else T
        cut = self.T - T
        if self.side == "right":
            cols = slice(0, T)
            g = self.gather[rows]
        else:  # left padding: the real tokens are the last columns
            cols = slice(cut, self.T)
            g = np.where(self.mask[rows], self.gather[rows] - cut, 0)
        return (self.tokens[rows, cols], self.valid[rows, cols], g, self.targets[rows],
                self.mask[rows])


def flat_length(n: int) -> int:
    """Padded length of a flat prompt: multiples of 32 (less padding than powers
    of two; the prompts of one run span a few hundred tokens, so a handful of
    compiles)."""
    return max(32, round_up(n, 32))


def score_flat(model: LoadedModel, pieces: PromptPieces, contexts, pairs, mode: str = "first_token",
               *, max_tokens_per_batch: int = 16384, side: str = "right", stats: EngineStats | None = None) -> np.ndarray:
    """Flat batches of full prompts (no prefix sharing): every prompt is recomputed in
    full, but many at a time, the way a careful user would batch them: sorted by
    length, padded to multiples of 32 tokens, power-of-two batches of at most
    ``max_tokens_per_batch`` padded tokens, each result fetched after the next batch
    is dispatched. Returns ``[N, n_classes]``."""
    contexts, pairs = _check_inputs(model, pieces, contexts, pairs, mode)
    n = len(pieces.labels)
    seq = mode == "sequence"
    ctx_rows = [list(pieces.bos) + [t for j in c for t in pieces.segment(int(j))] for c in contexts]
    q_rows, q_gathers, q_targets = query_rows(pieces, mode, range(len(pieces.queries)))
    nr = n if seq else 1
    # Row r * nr + j: pair r, label j (sequence mode).
    rows, gathers, targets = [], [], []
    for c, q in pairs:
        prefix = ctx_rows[c]
        for j in range(nr):
            rows.append(prefix + q_rows[q * nr + j])
            gathers.append([len(prefix) + x for x in q_gathers[q * nr + j]])
            targets.append(q_targets[q * nr + j])
    P = 1 if not seq else max(len(l) for l in pieces.labels)
    rows_arg = None if seq else model._rows([l[0] for l in pieces.labels])
    lengths = np.fromiter(map(len, rows), np.int64, len(rows))
    order = np.argsort(lengths, kind="stable")
    padded = np.asarray([flat_length(int(x)) for x in lengths[order]])
    out = np.zeros((len(rows), n) if not seq else (len(rows),), np.float32)
    pending = None
    s = 0
    while s < len(order):
        T = int(padded[s])
        B = round_up(1 << (max(1, max_tokens_per_batch // T).bit_length() - 1), model.n_devices)
        e = min(int(np.searchsorted(padded, T, side="right")), s + B)
        idx = order[s:e]
        Bp = min(B, bucket_batch(len(idx), model.n_devices))
        fill = np.r_[idx, np.full(Bp - len(idx), idx[0])]
        tokens, valid, start = _pack([rows[j] for j in fill], T, side)
        g, t, msk = _gather_arrays([gathers[j] for j in fill], [targets[j] for j in fill], start, P)
        put = model._put
        res = _score_flat(model._graphdef, model._state, put(tokens), put(valid), put(g),
                          put(t), put(msk), rows_arg, sequence=seq)
        if pending is not None:
            out[pending[1]] = to_host(pending[0])[:len(pending[1])]
        pending = (res, idx)
        if stats is not None:
            stats.calls += 1
            stats.tokens += int(lengths[idx].sum())
            stats.padded_tokens += Bp * T
        s = e
    if pending is not None:
        out[pending[1]] = to_host(pending[0])[:len(pending[1])]
    return _label_logprobs(out, mode, n)
