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
:func:`log_odds` turns them into the features m_c = log p_c - log p_0.

The engine (:class:`ScoringEngine`) computes every distinct ordered sub-context once:
contexts are sorted so that shared prefixes sit together, cut into chunks that fit
``max_cache_tokens``, and within a chunk the trie is grown depth by depth, each node
extending its parent's KV cache by one demonstration. Every query of a context is then
scored against the context's cache in one batch. Shapes are padded to fixed buckets
(one segment length per run, cache lengths in multiples of 32, power-of-two batches)
so the number of compilations stays small; :data:`COMPILES` counts them.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from .loading import LoadedModel, bucket_batch, bucket_length
from .model import KVCache, concat_cache, empty_cache, positions_from_valid
from .prompts import PromptPieces

MODES = ("first_token", "sequence")

#: Number of traces (= compilations) of each jitted engine function in this process.
COMPILES: Counter = Counter()


def log_odds(logprobs: np.ndarray) -> np.ndarray:
    """Features m_c = log p_c - log p_0 for c = 1..n-1: ``[..., n] -> [..., n-1]``."""
    logprobs = np.asarray(logprobs)
    return logprobs[..., 1:] - logprobs[..., :1]


def _renorm(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return (x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))).astype(np.float32)


def _check_mode(mode: str, pieces: PromptPieces) -> None:
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
    _check_mode(mode, pieces)
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
    seg = [len(pieces.segment(j)) for j in range(k)]
    longest_ctx = max((sum(seg[j] for j in c) for c in contexts), default=0)
    longest = len(pieces.bos) + longest_ctx + max(len(q) for q in pieces.queries) + \
        (max(len(l) for l in pieces.labels) - 1 if mode == "sequence" else 0)
    limit = model.config.max_position_embeddings
    if longest > limit:
        raise ValueError(f"the longest prompt has {longest} tokens, more than the model's "
                         f"context window of {limit}; use fewer or shorter demonstrations")
    # Sliding windows need no check: masking by position honours them in cached paths.
    return contexts, pairs


# ------------------------------------------------------------------ query rows
def _query_rows(pieces: PromptPieces, mode: str, queries):
    """Per query (and label, in sequence mode): the tokens to run after the context,
    gather offsets (relative to the row start) and target tokens.

    first_token: one row per query, gather its last token. sequence: one row per
    (query, label): query + label[:-1], gathering the m positions that predict
    label[0..m-1]."""
    rows, gathers, targets = [], [], []
    for q in queries:
        qi = list(pieces.queries[q])
        if mode == "first_token":
            rows.append(qi)
            gathers.append([len(qi) - 1])
            targets.append([0])
        else:
            for lab in pieces.labels:
                rows.append(qi + list(lab[:-1]))
                gathers.append([len(qi) - 1 + j for j in range(len(lab))])
                targets.append(list(lab))
    return rows, gathers, targets


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
    """Rows of ids -> (tokens [B, T], valid [B, T], start [B]): each row's first index."""
    B = len(rows)
    tokens = np.zeros((B, T), np.int32)
    valid = np.zeros((B, T), bool)
    start = np.zeros((B,), np.int32)
    for i, r in enumerate(rows):
        s = 0 if side == "right" else T - len(r)
        tokens[i, s:s + len(r)] = r
        valid[i, s:s + len(r)] = True
        start[i] = s
    return tokens, valid, start


def _gather_arrays(gathers, targets, start, P: int):
    B = len(gathers)
    g = np.zeros((B, P), np.int32)
    t = np.zeros((B, P), np.int32)
    m = np.zeros((B, P), bool)
    for i, (gi, ti) in enumerate(zip(gathers, targets)):
        g[i, :len(gi)] = np.asarray(gi) + start[i]
        t[i, :len(ti)] = ti
        m[i, :len(gi)] = True
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


@functools.partial(jax.jit, static_argnames=("graphdef", "out_len"))
def _grow(graphdef, state, parent: KVCache, parent_idx, tokens, valid, out_len: int):
    """Children caches: parent rows (gathered) + one segment each, padded to out_len."""
    COMPILES["grow"] += 1
    model = nnx.merge(graphdef, state)
    cache = _take_rows(parent, parent_idx)
    _, seg = model(tokens, positions_from_valid(valid, cache.next_position(tokens.shape[0])), valid, cache)
    full = concat_cache(cache, seg)
    pad = out_len - full.length
    return KVCache(jnp.pad(full.k, ((0, 0), (0, 0), (0, pad), (0, 0), (0, 0))),
                   jnp.pad(full.v, ((0, 0), (0, 0), (0, pad), (0, 0), (0, 0))),
                   jnp.pad(full.pos, ((0, 0), (0, pad))),
                   jnp.pad(full.valid, ((0, 0), (0, pad))))


@functools.partial(jax.jit, static_argnames=("graphdef", "sequence"))
def _score_cached(graphdef, state, parent: KVCache, parent_idx, tokens, valid, gather,
                  targets, tmask, rows, sequence):
    """Queries after their contexts' caches: ``parent_idx [Bc]`` picks one cached
    context per group of G = B / Bc consecutive query rows. Label scores ``[B, n]``
    or ``[B]``."""
    COMPILES["score"] += 1
    model = nnx.merge(graphdef, state)
    cache = _take_rows(parent, parent_idx)
    hidden, _ = model(tokens, positions_from_valid(valid, cache.next_position(tokens.shape[0])),
                      valid, cache)
    return _label_scores(model, hidden, gather, targets, tmask, rows, sequence)


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


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
    the trie (memory bound: never all of k = 16's nodes at once). ``side``: padding
    side of segments and queries (results do not depend on it). ``progress``: a
    tqdm bar with counts of rows and tokens. ``max_group``: how many query rows of
    one context share one gathered copy of its cache (a fixed group size keeps
    compiles bounded; larger groups copy less).
    """

    def __init__(self, model: LoadedModel, *, max_tokens_per_batch: int = 16384,
                 max_cache_tokens: int = 1 << 18, side: str = "right", progress: bool = True,
                 max_group: int = 64):
        if side not in ("left", "right"):
            raise ValueError(f"side must be 'left' or 'right', got {side!r}")
        if max_tokens_per_batch < 1 or max_cache_tokens < 1:
            raise ValueError("token budgets must be positive")
        self.model = model
        self.max_tokens_per_batch = int(max_tokens_per_batch)
        self.max_cache_tokens = int(max_cache_tokens)
        self.side = side
        self.progress = progress
        self.max_group = int(max_group)
        self.stats = EngineStats()

    # -------------------------------------------------------------- helpers
    def _micro_batch(self, n_rows: int, width: int) -> int:
        nd = self.model.n_devices
        b = max(1, self.max_tokens_per_batch // max(width, 1))
        b = 1 << (b.bit_length() - 1)  # power of two
        b = min(b, bucket_batch(n_rows, 1))
        return _round_up(max(b, 1), nd)  # the batch axis is split over the mesh

    def _put_idx(self, x):
        return self.model._put(x)

    # -------------------------------------------------------------- main entry
    def score(self, pieces: PromptPieces, contexts, pairs, mode: str = "first_token") -> np.ndarray:
        """Label log-probs ``[N, n_classes]`` of every (context, query) pair.

        pieces: tokenized demos and queries; contexts: ``[M, i]`` demo indices
        (ordered); pairs: ``[N, 2]`` (context index, query index). Equal, to float
        rounding, to :func:`score_plain` on the same inputs.
        """
        contexts, pairs = _check_inputs(self.model, pieces, contexts, pairs, mode)
        t0 = time.perf_counter()
        n = len(pieces.labels)
        seq = mode == "sequence"
        st = self.stats = EngineStats()
        out = np.zeros((len(pairs), n) if not seq else (len(pairs) * n,), np.float32)
        if len(pairs) == 0:
            return np.zeros((0, n), np.float32)
        i = contexts.shape[1]
        k = len(pieces.demos)
        # One segment length and one query length per run: bounded compiles.
        seg_rows = [list(pieces.bos) + pieces.segment(j) if d == 0 else pieces.segment(j)
                    for d in range(2) for j in range(k)]
        T_seg = _round_up(max(len(r) for r in seg_rows), 8)
        rows_all, _, _ = _query_rows(pieces, mode, range(len(pieces.queries)))
        T_q = _round_up(max(len(r) for r in rows_all), 8)
        P = 1 if not seq else max(len(l) for l in pieces.labels)
        lens = [0]
        for _ in range(i):
            lens.append(_round_up(lens[-1] + T_seg, 32))
        rows_arg = None if seq else jnp.asarray([l[0] for l in pieces.labels], jnp.int32)

        # Sort contexts so shared prefixes are adjacent; chunk by cache memory.
        order = np.lexsort(contexts.T[::-1])
        per_chunk = max(1, self.max_cache_tokens // lens[-1])
        pairs_by_ctx = [[] for _ in range(len(contexts))]
        for r, (c, _) in enumerate(pairs):
            pairs_by_ctx[c].append(r)
        n_rows_total = len(pairs) * (n if seq else 1)
        # Query rows of one context form groups of G that share one copy of its cache.
        G = min(self.max_group, max(len(v) for v in pairs_by_ctx) * (n if seq else 1))

        bar = None
        if self.progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=n_rows_total, unit="query", desc=f"scoring i={i}", leave=False)
        try:
            for c0 in range(0, len(order), per_chunk):
                chunk = order[c0:c0 + per_chunk]
                leaf_cache, leaf_of = self._grow_trie(pieces, contexts[chunk], lens, T_seg, bar)
                # Queries of this chunk's contexts.
                prs = [r for c in chunk for r in pairs_by_ctx[c]]
                if not prs:
                    continue
                local = {int(c): j for j, c in enumerate(chunk)}
                groups = []  # (leaf, [(tokens, gather, target, dest)]) with <= G rows
                for c in chunk:
                    entries = []
                    for r in pairs_by_ctx[c]:
                        rr, gg, tt = _query_rows(pieces, mode, [pairs[r][1]])
                        entries += [(a, b, t, r * n + j if seq else r)
                                    for j, (a, b, t) in enumerate(zip(rr, gg, tt))]
                    for g0 in range(0, len(entries), G):
                        groups.append((leaf_of[local[int(c)]], entries[g0:g0 + G]))
                res, dest = self._run_queries(leaf_cache, groups, G, T_q, P, lens[-1],
                                              rows_arg, seq, bar)
                out[dest] = res
        finally:
            if bar is not None:
                bar.close()
        st.seconds = time.perf_counter() - t0
        return _label_logprobs(out, mode, n)

    def _grow_trie(self, pieces, ctx, lens, T_seg, bar):
        """Caches of every distinct prefix of ``ctx`` ([C, i]), depth by depth.
        Returns (leaf caches [L, U, S_i, ...], index of each context's leaf)."""
        m, st = self.model, self.stats
        parent = empty_cache(m.config, 1, m.dtype)
        parent_of_prev = None
        for d in range(1, ctx.shape[1] + 1):
            prefixes, inverse = np.unique(ctx[:, :d], axis=0, return_inverse=True)
            inverse = inverse.reshape(-1)
            if d == 1:
                pidx = np.zeros(len(prefixes), np.int64)
            else:
                prev = {tuple(p): j for j, p in enumerate(parent_of_prev)}
                pidx = np.asarray([prev[tuple(p[:-1])] for p in prefixes])
            segs = [(list(pieces.bos) if d == 1 else []) + pieces.segment(int(p[-1])) for p in prefixes]
            B = self._micro_batch(len(segs), lens[d])
            parts = []
            for s in range(0, len(segs), B):
                rows = segs[s:s + B]
                idx = np.zeros(B, np.int32)
                idx[:len(rows)] = pidx[s:s + B]
                rows = rows + [rows[0]] * (B - len(rows))  # filler rows, discarded
                tokens, valid, _ = _pack(rows, T_seg, self.side)
                parts.append(_grow(m._graphdef, m._state, parent, self._put_idx(idx),
                                   self._put_idx(tokens), self._put_idx(valid), out_len=lens[d]))
                st.calls += 1
                st.tokens += sum(len(r) for r in segs[s:s + B])
                st.padded_tokens += B * T_seg
            st.nodes += len(segs)
            parent = parts[0] if len(parts) == 1 else jax.tree_util.tree_map(
                lambda *xs: jnp.concatenate(xs, axis=1 if xs[0].ndim == 5 else 0), *parts)
            parent_of_prev = prefixes
            leaf_of = inverse
        return parent, leaf_of

    def _run_queries(self, cache, groups, G, T_q, P, S, rows_arg, seq, bar):
        """Score groups of <= G query rows, each group against one leaf of ``cache``.
        Returns (scores of the real rows, their destination indices)."""
        m, st = self.model, self.stats
        Bc = self._micro_batch(len(groups), S + G * T_q)
        res, dest = [], []
        for s0 in range(0, len(groups), Bc):
            batch = groups[s0:s0 + Bc]
            batch = batch + [batch[0]] * (Bc - len(batch))  # filler groups, discarded
            idx = np.asarray([leaf for leaf, _ in batch], np.int32)
            rows, gathers, targets, keep = [], [], [], []
            for gi, (_, entries) in enumerate(batch):
                real = s0 + gi < len(groups)
                for j in range(G):
                    a, b, t, d = entries[min(j, len(entries) - 1)]
                    rows.append(a), gathers.append(b), targets.append(t)
                    if real and j < len(entries):
                        keep.append(len(rows) - 1)
                        dest.append(d)
            tokens, valid, start = _pack(rows, T_q, self.side)
            g, t, msk = _gather_arrays(gathers, targets, start, P)
            put = self._put_idx
            out = _score_cached(m._graphdef, m._state, cache, put(idx), put(tokens), put(valid),
                                put(g), put(t), put(msk), rows_arg, sequence=seq)
            res.append(np.asarray(out)[np.asarray(keep)])
            st.calls += 1
            st.tokens += sum(len(rows[j]) for j in keep)
            st.padded_tokens += len(rows) * T_q
            st.query_rows += len(keep)
            if bar is not None:
                bar.update(len(keep))
                bar.set_postfix(tokens=st.tokens, refresh=False)
        return np.concatenate(res), np.asarray(dest)


def score_flat(model: LoadedModel, pieces: PromptPieces, contexts, pairs, mode: str = "first_token",
               *, max_tokens_per_batch: int = 16384, side: str = "right", stats: EngineStats | None = None) -> np.ndarray:
    """Flat batches of full prompts (no prefix sharing): every prompt is recomputed in
    full, but many at a time. Returns ``[N, n_classes]``."""
    contexts, pairs = _check_inputs(model, pieces, contexts, pairs, mode)
    n = len(pieces.labels)
    seq = mode == "sequence"
    rows, gathers, targets = [], [], []
    for c, q in pairs:
        prefix = pieces.prompt(contexts[c], q)[: -len(pieces.queries[q])]
        rr, gg, tt = _query_rows(pieces, mode, [q])
        for a, b, t in zip(rr, gg, tt):
            rows.append(prefix + a)
            gathers.append([len(prefix) + x for x in b])
            targets.append(t)
    P = 1 if not seq else max(len(l) for l in pieces.labels)
    rows_arg = None if seq else jnp.asarray([l[0] for l in pieces.labels], jnp.int32)
    order = np.argsort([len(r) for r in rows], kind="stable")
    out = np.zeros((len(rows), n) if not seq else (len(rows),), np.float32)
    s = 0
    while s < len(order):
        T = bucket_length(len(rows[order[s]]))
        B = _round_up(1 << (max(1, max_tokens_per_batch // T).bit_length() - 1), model.n_devices)
        e = s
        while e < len(order) and e - s < B and bucket_length(len(rows[order[e]])) == T:
            e += 1
        idx = list(order[s:e])
        Bp = min(B, bucket_batch(len(idx), model.n_devices))
        fill = idx + [idx[0]] * (Bp - len(idx))
        tokens, valid, start = _pack([rows[j] for j in fill], T, side)
        g, t, msk = _gather_arrays([gathers[j] for j in fill], [targets[j] for j in fill], start, P)
        put = model._put
        res = np.asarray(_score_flat(model._graphdef, model._state, put(tokens), put(valid), put(g),
                                     put(t), put(msk), rows_arg, sequence=seq))
        out[np.asarray(idx)] = res[:len(idx)]
        if stats is not None:
            stats.calls += 1
            stats.tokens += sum(len(rows[j]) for j in idx)
            stats.padded_tokens += Bp * T
        s = e
    return _label_logprobs(out, mode, n)
