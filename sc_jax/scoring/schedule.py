"""The scoring engine's schedule, on the host with NumPy (no model, nothing on a
device): which items each forward call of :class:`sc_jax.scoring.engine.ScoringEngine`
runs, packed into calls of one shape (:mod:`sc_jax.scoring.packing`).
:mod:`sc_jax.experiment.plan` replays the same schedule for a whole run.

Several scoring jobs (one (contexts, pairs) each: the surrogate sizes, the test-time
sizes and the baselines of one seed) are scored together: every context of every job
is a path in ONE prefix trie (a prefix shared by two jobs, such as the full context of
Base, CC and DC, is computed once), grown depth by depth. The items of depth d
continue the nodes of depth d - 1 (depth 0: the empty root) and are of two kinds:

* a segment: one demonstration appended to a node, making a node of depth d (the
  depth-1 segments carry the BOS token);
* a query row: a query (with the label's tokens before the last one, in sequence
  mode) after a context of d - 1 demonstrations, read out at its label positions.

The model-free programs around the model program (a level's buffer, the gather of a
call's slots, the write of its children) take the level shapes, so those are
bucketed (:func:`level_lengths`, :func:`level_rows`): level d holds ``d x s`` tokens
per node with ``s`` the longest segment rounded up to a power of two, and its rows
are the nodes rounded up to an eighth of their octave. Seeds whose longest
demonstrations fall in one octave then share every program, within a process and
through the persistent compilation cache. The cost: a level holds at most twice its
nodes' tokens (the power of two) and 12.5% more rows; the planner counts the padded
shapes (:func:`chunk_bounds`, :func:`sc_jax.scoring.memory.level_peak_tokens`), so a
plan stays an upper bound of what the engine allocates.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from sc_jax.scoring.packing import MIN_CACHE, PackedDepth, PackShape, pack_depth, pow2_at_least

def level_rows(nodes, n_devices: int = 1):
    """Rows of the level buffer of ``nodes`` trie nodes (an int or an array of them):
    rounded up to a multiple of an eighth of the largest power of two not above
    ``nodes`` (at most 12.5% more, eight sizes per octave) and of ``n_devices`` (the
    rows are split over the mesh's data axis). The engine allocates these rows and
    the planner counts them."""
    n = np.asarray(nodes, np.int64)
    octave = np.left_shift(1, np.floor(np.log2(np.maximum(n, 1))).astype(np.int64))
    step = np.lcm(np.maximum(octave // 8, 1), int(n_devices))
    rows = -(-n // step) * step
    return int(rows) if rows.ndim == 0 else rows



# ------------------------------------------------------------------ the trie of several jobs
@dataclasses.dataclass
class Chunk:
    """The trie of the contexts of one chunk, depth by depth.

    ``demo[d]``, ``parent[d]``, ``length[d]``: per node of depth d (1..D), its last
    demonstration, its parent's index at depth d - 1 (0: the root) and its real
    tokens (BOS included); depth 0 is the root (one node, 0 tokens).
    ``queries[d]``: the query rows after the nodes of depth d, as (node [n], query row
    [n], output index [n]), output index into the concatenation of every job's rows.
    """

    demo: list[np.ndarray]
    parent: list[np.ndarray]
    length: list[np.ndarray]
    queries: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]

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


def chunk_bounds(sorted_ctx: np.ndarray, level_len, max_cache_tokens: int,
                 n_devices: int = 1) -> list[tuple[int, int]]:
    """Cut the sorted contexts into runs whose every trie level fits
    ``max_cache_tokens`` (the level buffer's rows, :func:`level_rows`, x level
    length; a level and its parent are alive together, and the engine's budget
    counts each)."""
    new = _new_nodes(sorted_ctx).astype(np.int64)
    cum = np.vstack([np.zeros((1, new.shape[1]), np.int64), np.cumsum(new, axis=0)])
    per = np.asarray(level_len[1:], np.int64)
    real = sorted_ctx >= 0
    M = len(sorted_ctx)
    out, s = [], 0

    def fits(s, e):  # contexts s..e-1: the first one creates every node of its own
        counts = cum[e] - cum[s] - new[s] + real[s]
        return int((level_rows(counts, n_devices) * per).max()) <= max_cache_tokens

    while s < M:
        lo, hi = s + 1, M  # the largest e with fits(s, e); one context always runs
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if fits(s, mid):
                lo = mid
            else:
                hi = mid - 1
        out.append((s, lo))
        s = lo
    return out


def build_chunks(jobs, nr: int, seg_len: np.ndarray, n_bos: int, level_len,
                 max_cache_tokens: int, n_devices: int = 1) -> list[Chunk]:
    """The chunks of the union trie of ``jobs`` (each ``(contexts [M_j, i_j], pairs
    [N_j, 2])``). Output index of job j's pair r, label row t: ``offset_j + r * nr + t``
    with ``offset_j`` the rows of the jobs before it."""
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
    for s, e in chunk_bounds(sorted_ctx, level_len, max_cache_tokens, n_devices):
        part = sorted_ctx[s:e]
        new = _new_nodes(part)
        node_of = np.cumsum(new, axis=0) - 1  # [C, D]: node index at each depth
        demo, parent, length = [np.zeros(1, np.int64)], [np.zeros(1, np.int64)], [np.zeros(1, np.int64)]
        for d in range(part.shape[1]):
            rows = np.flatnonzero(new[:, d])
            if rows.size == 0:
                break
            demo.append(part[rows, d])
            parent.append(node_of[rows, d - 1] if d else np.zeros(rows.size, np.int64))
            length.append(length[-1][parent[-1]] + seg_len[part[rows, d]] + (n_bos if d == 0 else 0))
        lo, hi = np.searchsorted(pos, [s, e])
        local = pos[lo:hi] - s
        size = (part[local] >= 0).sum(1)
        queries = {}
        for d in np.unique(size):
            sel = size == d
            queries[int(d)] = (node_of[local[sel], d - 1], qrow[lo:hi][sel], dest[lo:hi][sel])
        chunks.append(Chunk(demo, parent, length, queries))
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
    """Every call of one engine call: ``shape``, per chunk its depths (packed), the
    level lengths ``level_len`` (tokens per node at each depth, padded), the
    count of output rows ``n_out`` and the devices the levels' rows are split over."""

    shape: PackShape
    level_len: tuple[int, ...]
    chunks: list[list[PackedDepth]]
    trie: list[Chunk]
    n_out: int
    n_devices: int = 1

    def level_shape(self, chunk: int, d: int) -> tuple[int, int]:
        """(rows, tokens per row) of the buffer of level ``d`` of ``chunk``: what the
        engine allocates and the planner counts."""
        return level_rows(self.trie[chunk].nodes(d), self.n_devices), self.level_len[d]

    def calls(self):
        """(chunk index, packed depth, first row) of every call, in order."""
        B = self.shape.B
        for ci, depths in enumerate(self.chunks):
            for st in depths:
                for r0 in range(0, st.rows, B):
                    yield ci, st, r0

    @property
    def programs(self) -> set[tuple[int, ...]]:
        """Distinct model programs (:attr:`PackShape.program`): one per schedule."""
        return {self.shape.program}


def segment_slot(seg_max: int) -> int:
    """Tokens each level adds per node: the longest segment ``seg_max`` (BOS included)
    rounded up to a power of two, at least :data:`MIN_CACHE`. A power of two, not a
    multiple of 32, so that seeds of one dataset (whose longest demonstrations differ
    by a few tokens) get the same level shapes, hence the same model-free programs."""
    return max(MIN_CACHE, pow2_at_least(seg_max))


def level_lengths(seg_max: int, depth: int) -> tuple[int, ...]:
    """Tokens per node of each level 0..depth, padded: level d holds its parent's row
    and one slot of :func:`segment_slot` tokens, ``d x segment_slot(seg_max)``."""
    s = segment_slot(seg_max)
    return tuple(d * s for d in range(depth + 1))


def build_schedule(jobs, *, shape: PackShape, nr: int, seg_len, n_bos: int, qlen, readouts,
                   max_cache_tokens: int, n_devices: int = 1) -> Schedule:
    """The packed schedule of ``jobs`` in calls of ``shape`` (see the module docstring).

    seg_len ``[k]``: tokens of each demonstration's segment (no BOS); qlen ``[Rq]``:
    tokens of each query row; readouts ``[Rq]``: positions read out per query row;
    ``max_cache_tokens``: tokens of one trie level (its buffer's rows split over
    ``n_devices``, :func:`level_rows`). ``shape`` must hold the longest
    item (``W``) and the deepest level (``cache``): :func:`schedule_geometry`. Its
    ``R`` and ``C`` grow (powers of two) where a call needs more.
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
    trie = build_chunks(jobs, nr, seg_len, n_bos, level_len, max_cache_tokens, n_devices)
    chunks = []
    for ch in trie:
        depths = []
        for d in range(1, depth + 2):
            it = depth_items(ch, d, seg_len, qlen, n_bos)
            if it is not None:
                S = slots[d - 1]
                depths.append(pack_depth(it, d, S, shape.W, max(1, shape.cache // S)))
        chunks.append(depths)
    R, C = shape.R, shape.C
    readouts = np.asarray(readouts, np.int64)
    for depths in chunks:
        for st in depths:
            for r0 in range(0, st.rows, shape.B):
                sel = (st.row >= r0) & (st.row < r0 + shape.B)
                q = sel & (st.kind == 1)
                R = max(R, int(readouts[st.ref[q]].sum()))
                C = max(C, int((sel & (st.kind == 0)).sum()))
    shape = dataclasses.replace(shape, R=pow2_at_least(R), C=pow2_at_least(C))
    n_out = sum(len(np.asarray(p).reshape(-1, 2)) for _, p in jobs) * nr
    return Schedule(shape, level_len, chunks, trie, n_out, n_devices)
