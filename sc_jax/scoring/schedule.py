"""The scoring engine's schedule, on the host with NumPy (no model, nothing on a
device): which items each forward call of :class:`sc_jax.scoring.engine.ScoringEngine`
runs, packed into calls of one shape (:mod:`sc_jax.scoring.packing`).
:mod:`sc_jax.experiment.execution.plan` replays the same schedule for a whole run.

Several scoring jobs (one (contexts, pairs) each: the surrogate sizes, the test-time
sizes and the baselines of one seed) are scored together: every context of every job
is a path in ONE prefix trie (a prefix shared by two jobs, such as the full context of
Base, CC and DC, is computed once), grown depth by depth. The items of depth d
continue the nodes of depth d - 1 (depth 0: the empty root) and are of two kinds:

* a segment: one demonstration appended to a node, making a node of depth d (the
  depth-1 segments carry the BOS token);
* a query row: a query (with the label's tokens before the last one, in sequence
  mode) after a context of d - 1 demonstrations, read out at its label positions.

Every node's own tokens (its segment) are computed once and kept, for the whole
chunk, in one token pool (a KV cache of ``pool`` tokens, :func:`pool_tokens`): a node
of depth d holds ``tokens`` pool positions (:attr:`Chunk.start`), and the cache of an
item is the concatenation of its ancestors' positions, gathered on the device per
call. The positions are host data, so the model-free programs around the model
program (the pool's buffer, the gather of a call's slots, the write of its new keys)
take only the call shape and the pool's size, which the memory policy fixes: another
seed or another dataset compiles none of them. Calls run ``B`` rows or fewer
(:func:`sc_jax.scoring.packing.row_ladder`): a few call sizes, shared by every dataset,
so a depth's last call is not padded to ``B`` rows.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from sc_jax.scoring.packing import (
    MIN_CACHE,
    PackedDepth,
    PackShape,
    pack_depth,
    pow2_at_least,
    row_ladder,
    split_rows,
)



# ------------------------------------------------------------------ the trie of several jobs
@dataclasses.dataclass
class Chunk:
    """The trie of the contexts of one chunk, depth by depth.

    ``demo[d]``, ``parent[d]``, ``length[d]``, ``start[d]``: per node of depth d
    (1..D), its last demonstration, its parent's index at depth d - 1 (0: the root),
    its real tokens (BOS included) and the pool position of its own tokens (its
    segment); depth 0 is the root (one node, 0 tokens). Pool position 0 is never
    written (the padding of every gathered cache reads it).
    ``queries[d]``: the query rows after the nodes of depth d, as (node [n], query row
    [n], output index [n]), output index into the concatenation of every job's rows.
    """

    demo: list[np.ndarray]
    parent: list[np.ndarray]
    length: list[np.ndarray]
    start: list[np.ndarray]
    queries: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]

    @property
    def tokens(self) -> int:
        """Pool positions the chunk uses: its nodes' own tokens and position 0."""
        return 1 + int(sum((ln - self.length[d - 1][p]).sum()
                           for d, (ln, p) in enumerate(zip(self.length[1:], self.parent[1:]), 1)))

    @property
    def depth(self) -> int:
        return len(self.demo) - 1

    def nodes(self, d: int) -> int:
        return len(self.demo[d])


def _padded_contexts(jobs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every job's contexts in one ``[M, D]`` array (-1 past a context's end), their
    sizes ``[M]`` and the offset of each job's first context."""
    D = max(int(np.asarray(c).shape[1]) for c, _ in jobs)
    parts, sizes, offs, n = [], [], [], 0
    for ctx, _ in jobs:
        ctx = np.asarray(ctx, np.int64)
        p = np.full((len(ctx), D), -1, np.int64)
        p[:, :ctx.shape[1]] = ctx
        parts.append(p)
        sizes.append(np.full(len(ctx), ctx.shape[1], np.int64))
        offs.append(n)
        n += len(ctx)
    return np.concatenate(parts), np.concatenate(sizes), np.asarray(offs, np.int64)


def _new_nodes(sorted_ctx: np.ndarray) -> np.ndarray:
    """``[M, D]`` bool: context r (sorted) creates a new node at depth d + 1 (its
    prefix differs from the previous context's there, and it is that long)."""
    M, D = sorted_ctx.shape
    real = sorted_ctx >= 0
    if M == 0:
        return real
    diff = np.ones((M, D), bool)
    diff[1:] = np.cumsum(sorted_ctx[1:] != sorted_ctx[:-1], axis=1) > 0
    return diff & real


def _node_tokens(sorted_ctx: np.ndarray, seg_len: np.ndarray, n_bos: int) -> np.ndarray:
    """``[M, D]``: the tokens of the node each context makes at depth d + 1 (its
    segment, BOS at depth 1; 0 past the context's end)."""
    tok = np.where(sorted_ctx >= 0, seg_len[np.maximum(sorted_ctx, 0)], 0)
    if tok.shape[1]:
        tok[:, 0] += n_bos * (sorted_ctx[:, 0] >= 0)
    return tok


def chunk_bounds(sorted_ctx: np.ndarray, node_tokens: np.ndarray, pool: int) -> list[tuple[int, int]]:
    """Cut the sorted contexts into runs whose trie nodes' own tokens
    (``node_tokens``, :func:`_node_tokens`), with pool position 0, fit ``pool``
    tokens; one context always runs."""
    new = _new_nodes(sorted_ctx)
    made = (new * node_tokens).sum(1)  # tokens of the nodes context r makes
    whole = node_tokens.sum(1)  # ... and of every node of its own (a chunk's first)
    cum = np.r_[0, np.cumsum(made)]
    M = len(sorted_ctx)
    out, s = [], 0

    def fits(s, e):
        return 1 + int(cum[e] - cum[s] - made[s] + whole[s]) <= pool

    while s < M:
        lo, hi = s + 1, M  # the largest e with fits(s, e)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if fits(s, mid):
                lo = mid
            else:
                hi = mid - 1
        out.append((s, lo))
        s = lo
    return out


def build_chunks(jobs, nr: int, seg_len: np.ndarray, n_bos: int, pool: int) -> list[Chunk]:
    """The chunks of the union trie of ``jobs`` (each ``(contexts [M_j, i_j], pairs
    [N_j, 2])``), each within ``pool`` tokens (:func:`chunk_bounds`). Output index of
    job j's pair r, label row t: ``offset_j + r * nr + t`` with ``offset_j`` the rows
    of the jobs before it."""
    ctx, _, ctx_off = _padded_contexts(jobs)
    order = np.lexsort(ctx.T[::-1])
    sorted_ctx = ctx[order]
    rank = np.empty(len(order), np.int64)
    rank[order] = np.arange(len(order))
    # Every pair as (global context, query row, output index).
    gc, qrow, dest, row_off = [], [], [], 0
    for (c, pairs), off in zip(jobs, ctx_off):
        pairs = np.asarray(pairs, np.int64).reshape(-1, 2)
        t = np.tile(np.arange(nr), len(pairs))
        gc.append(np.repeat(pairs[:, 0] + off, nr))
        qrow.append(np.repeat(pairs[:, 1], nr) * nr + t)
        dest.append(row_off + np.arange(len(pairs) * nr))
        row_off += len(pairs) * nr
    gc, qrow, dest = (np.concatenate(x) if x else np.zeros(0, np.int64) for x in (gc, qrow, dest))
    pos = rank[gc]  # sorted position of each row's context
    by_ctx = np.argsort(pos, kind="stable")
    pos, qrow, dest = pos[by_ctx], qrow[by_ctx], dest[by_ctx]
    chunks = []
    tokens = _node_tokens(sorted_ctx, seg_len, n_bos)
    for s, e in chunk_bounds(sorted_ctx, tokens, pool):
        part = sorted_ctx[s:e]
        new = _new_nodes(part)
        node_of = np.cumsum(new, axis=0) - 1  # [C, D]: node index at each depth
        demo, parent, length = [np.zeros(1, np.int64)], [np.zeros(1, np.int64)], [np.zeros(1, np.int64)]
        start, used = [np.zeros(1, np.int64)], 1  # pool position 0: never written
        for d in range(part.shape[1]):
            rows = np.flatnonzero(new[:, d])
            if rows.size == 0:
                break
            demo.append(part[rows, d])
            parent.append(node_of[rows, d - 1] if d else np.zeros(rows.size, np.int64))
            own = tokens[s + rows, d]
            length.append(length[-1][parent[-1]] + own)
            start.append(used + np.r_[0, np.cumsum(own)[:-1]])
            used += int(own.sum())
        lo, hi = np.searchsorted(pos, [s, e])
        local = pos[lo:hi] - s
        size = (part[local] >= 0).sum(1)
        queries = {}
        for d in np.unique(size):
            sel = size == d
            queries[int(d)] = (node_of[local[sel], d - 1], qrow[lo:hi][sel], dest[lo:hi][sel])
        chunks.append(Chunk(demo, parent, length, start, queries))
    return chunks



def depth_items(chunk: Chunk, d: int, seg_len, qlen, n_bos: int):
    """The items of depth d of ``chunk``, sorted by the node they continue: (kind,
    ref, length, cache node, start position, node, dest)."""
    parts = []
    if d <= chunk.depth:
        n = chunk.nodes(d)
        demo, par = chunk.demo[d], chunk.parent[d]
        ln = seg_len[demo] + (n_bos if d == 1 else 0)
        parts.append((np.zeros(n, np.int64), demo, ln, par, chunk.length[d - 1][par],
                      np.arange(n), np.full(n, -1)))
    if d - 1 in chunk.queries:
        node, qrow, dest = chunk.queries[d - 1]
        parts.append((np.ones(len(node), np.int64), qrow, qlen[qrow], node,
                      chunk.length[d - 1][node], np.full(len(node), -1), dest))
    if not parts:
        return None
    cols = [np.concatenate([p[j] for p in parts]).astype(np.int64) for j in range(7)]
    order = np.argsort(cols[3], kind="stable")
    return [c[order] for c in cols]


def slot_lengths(level_len) -> list[int]:
    """Tokens per cache slot of the items of each depth d = 1..D+1: depth d reads
    level d - 1, whose nodes hold ``level_len[d - 1]`` tokens (at least
    :data:`MIN_CACHE`: depth 1 reads the empty root)."""
    return [max(MIN_CACHE, int(level_len[d - 1])) for d in range(1, len(level_len) + 1)]


def schedule_geometry(jobs, *, seg_len, n_bos: int, qlen) -> tuple[int, int]:
    """(longest item, tokens per node of the deepest level) of ``jobs``: what the
    call shape must hold (a row of ``W`` tokens takes any item, a row's cache a node
    of the deepest level)."""
    depth = max(int(np.asarray(c).shape[1]) for c, _ in jobs)
    seg_max = int(np.max(seg_len)) + n_bos
    return max(seg_max, int(np.max(qlen, initial=1))), level_lengths(seg_max, depth)[-1]


# ------------------------------------------------------------------ the whole schedule
@dataclasses.dataclass
class Schedule:
    """Every call of one engine call: ``shapes``, the call sizes (largest first,
    :func:`sc_jax.scoring.packing.row_ladder`; ``shape`` the largest), per chunk its
    depths (packed), the slot lengths ``level_len`` (tokens per node at each depth,
    padded: a depth-d item's cache slot holds ``level_len[d - 1]``), the count of
    output rows ``n_out``, the pool's tokens ``pool`` (:func:`pool_tokens`) and the
    devices the calls' rows are split over."""

    shapes: tuple[PackShape, ...]
    level_len: tuple[int, ...]
    chunks: list[list[PackedDepth]]
    trie: list[Chunk]
    n_out: int
    pool: int
    n_devices: int = 1

    @property
    def shape(self) -> PackShape:
        return self.shapes[0]

    def calls(self):
        """(chunk index, packed depth, first row, call shape) of every call, in order:
        each depth's rows in calls of the sizes :func:`sc_jax.scoring.packing.split_rows`
        picks."""
        by_rows = {sh.B: sh for sh in self.shapes}
        for ci, depths in enumerate(self.chunks):
            for st in depths:
                r0 = 0
                for b in split_rows(st.rows, list(by_rows)):
                    yield ci, st, r0, by_rows[b]
                    r0 += b

    @property
    def programs(self) -> set[tuple[int, ...]]:
        """Distinct model programs (:attr:`PackShape.program`): one per call size, every
        one compiled by the engine (a later dataset needing another size would compile it)."""
        return {sh.program for sh in self.shapes}


def pool_tokens(policy_tokens: int, trie: list[Chunk]) -> int:
    """Tokens of the pool: the policy's ``policy_tokens`` (a function of the memory
    budget, so one pool shape for every dataset), or where one context alone is
    longer (a chunk of one context over it), a power of two that holds it."""
    need = max((ch.tokens for ch in trie), default=1)
    return policy_tokens if need <= policy_tokens else pow2_at_least(need)


def segment_slot(seg_max: int) -> int:
    """Tokens each depth adds to a cache slot: the longest segment ``seg_max`` (BOS
    included) rounded up to a power of two, at least :data:`MIN_CACHE` (slots of
    whole key blocks). Host data only: it sets how many nodes share a row's cache
    (:func:`sc_jax.scoring.packing.pack`), no program's shape."""
    return max(MIN_CACHE, pow2_at_least(seg_max))


def level_lengths(seg_max: int, depth: int) -> tuple[int, ...]:
    """Cache slot length of the nodes of each depth 0..depth, padded:
    ``d x segment_slot(seg_max)`` (a node's ancestors' tokens, one slot each)."""
    s = segment_slot(seg_max)
    return tuple(d * s for d in range(depth + 1))


def build_schedule(jobs, *, shape: PackShape, nr: int, seg_len, n_bos: int, qlen, readouts,
                   max_cache_tokens: int, n_devices: int = 1) -> Schedule:
    """The packed schedule of ``jobs`` in calls of ``shape`` and its halvings (see the
    module docstring).

    seg_len ``[k]``: tokens of each demonstration's segment (no BOS); qlen ``[Rq]``:
    tokens of each query row; readouts ``[Rq]``: positions read out per query row;
    ``max_cache_tokens``: the pool's tokens (the trie is cut into chunks whose nodes'
    tokens fit, :func:`pool_tokens`). ``shape`` must hold the longest item (``W``)
    and the deepest context (``cache``): :func:`schedule_geometry`. Its ``R`` grows
    (a power of two) where a call needs more.
    """
    seg_len = np.asarray(seg_len, np.int64)
    qlen = np.asarray(qlen, np.int64)
    depth = max(int(np.asarray(c).shape[1]) for c, _ in jobs)
    level_len = level_lengths(int(seg_len.max()) + n_bos, depth)
    longest, deepest = schedule_geometry(jobs, seg_len=seg_len, n_bos=n_bos, qlen=qlen)
    if longest > shape.W or deepest > shape.cache:
        raise ValueError(f"a call of {shape} cannot hold an item of {longest} tokens and a "
                         f"cached context of {deepest}")
    slots = slot_lengths(level_len)
    trie = build_chunks(jobs, nr, seg_len, n_bos, max_cache_tokens)
    chunks = []
    for ch in trie:
        depths = []
        for d in range(1, depth + 2):
            it = depth_items(ch, d, seg_len, qlen, n_bos)
            if it is not None:
                S = slots[d - 1]
                depths.append(pack_depth(it, d, S, shape.W, max(1, shape.cache // S)))
        chunks.append(depths)
    n_out = sum(len(np.asarray(p).reshape(-1, 2)) for _, p in jobs) * nr
    pool = pool_tokens(max_cache_tokens, trie)
    sched = Schedule(row_ladder(shape, n_devices), level_len, chunks, trie, n_out, pool, n_devices)
    # Readouts: the largest call's R covers every call's, scaled to its size.
    R = shape.R
    readouts = np.asarray(readouts, np.int64)
    for _, st, r0, sh in sched.calls():
        sel = (st.row >= r0) & (st.row < r0 + sh.B) & (st.kind == 1)
        R = max(R, -(-int(readouts[st.ref[sel]].sum()) * shape.B // sh.B))
    if R > shape.R:
        sched.shapes = row_ladder(dataclasses.replace(shape, R=pow2_at_least(R)), n_devices)
    return sched
