"""The scoring engine's packed schedule, on the host with NumPy (no model, nothing on a
device): which tokens each forward call of :class:`sc_jax.scoring.engine.ScoringEngine`
runs, where they sit, and what the call costs. :mod:`sc_jax.experiment.plan` replays the same
schedule for a whole run.

Several scoring jobs (one (contexts, pairs) each: the surrogate sizes, the test-time
sizes and the baselines of one seed) are scored together: every context of every job
is a path in ONE prefix trie (a prefix shared by two jobs, such as the full context of
Base, CC and DC, is computed once), grown depth by depth. Stage d continues the nodes
of depth d - 1 (depth 0: the empty root) with two kinds of items:

* a segment: one demonstration appended to a node, making a node of depth d (the
  depth-1 segments carry the BOS token);
* a query row: a query (with the label's tokens before the last one, in sequence
  mode) after a context of d - 1 demonstrations, read out at its label positions.

Items are packed into rows of ``W`` tokens, as packed training does: a row holds
several items end to end; each item attends to its own tokens (causally) and to the
cached keys of its own node. A row's cache holds up to ``m`` nodes side by side
(slots), so the items of nodes with few items share rows; a node with many items
(a test-time context and its hundreds of queries) fills rows of its own. ``B`` rows
make one call. The padding left is the end of each row and the rows of each stage's
last call: with ``W`` a few times the longest item and a few dozen calls per stage,
a few percent of the unique tokens.

Shapes: every call of every schedule made under one memory policy has the same ``B``,
``W``, ``R`` and ``cache`` (cached keys per row): the shape depends on the model, its
dtype, the memory budget and the mesh (:func:`sc_jax.scoring.schedule.call_shape`), not on the
seed or the dataset, so a run compiles ONE model program, and a second run on the
same machine finds it in the persistent compilation cache. What varies per stage is
how a row's ``cache`` keys are cut into slots: stage d reads level d - 1, whose nodes
hold ``S`` tokens each, so a row holds ``m = cache // S`` slots (many small nodes per
row early in the trie, few long ones late). The model program sees only ``m x S``
padded to ``cache``.

The model-free programs around it (a level's buffer, the gather of a call's slots,
the write of its children) take the level shapes, so those are bucketed too
(:func:`level_lengths`, :func:`level_rows`): level d holds ``d x s`` tokens per node
with ``s`` the longest segment rounded up to a power of two, and its rows are the
nodes rounded up to an eighth of their octave. Seeds whose longest demonstrations
fall in one octave then share every program, within a process and through the
persistent compilation cache. The cost: a level holds at most twice its nodes'
tokens (the power of two) and 12.5% more rows; the planner counts the padded shapes
(:func:`chunk_bounds`, :func:`sc_jax.scoring.schedule.level_peak_tokens`), so a plan
stays an upper bound of what the engine allocates.
"""

from __future__ import annotations

import dataclasses

import numpy as np

#: Smallest cache length bucket (the root's stage reads an empty cache of this length).
MIN_CACHE = 32


def round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def pow2_at_least(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


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


# ------------------------------------------------------------------ packing
@dataclasses.dataclass
class Stage:
    """The items of one stage (continuing the nodes of depth ``depth - 1``), packed
    with ``m`` cache slots of ``S`` tokens per row.

    Per item, in packed order: ``kind`` (0 segment, 1 query row), ``ref`` (the demo,
    or the query row), ``length``, ``row``, ``off`` (first column), ``slot``,
    ``start`` (rotary position of its first token), ``node`` (segment: the node it
    makes at depth ``depth``; query row: -1), ``dest`` (query row: output index;
    segment: -1), ``cache`` (the node of depth ``depth - 1`` it continues).
    ``slot_nodes``: ``[rows, m]`` the node in each row's slots (0 where unused).
    """

    depth: int
    S: int
    m: int
    kind: np.ndarray
    ref: np.ndarray
    length: np.ndarray
    row: np.ndarray
    off: np.ndarray
    slot: np.ndarray
    start: np.ndarray
    node: np.ndarray
    dest: np.ndarray
    cache: np.ndarray
    slot_nodes: np.ndarray

    @property
    def rows(self) -> int:
        return len(self.slot_nodes)


def stage_items(chunk: Chunk, d: int, seg_len, qlen, n_bos: int):
    """The items of stage d of ``chunk``, sorted by the node they continue: (kind,
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


def _next_fit(length: np.ndarray, cache: np.ndarray, W: int, m: int):
    """Next fit, item by item: (starts a new row, opens a new slot, column, slot)."""
    o, used, last = W, m, -1
    for ln, c in zip(length.tolist(), cache.tolist()):
        new_row = o + ln > W or (c != last and used == m)
        if new_row:
            o, used, last = 0, 0, -1
        new_slot = c != last
        if new_slot:
            used += 1
            last = c
        yield new_row, new_slot, o, used - 1
        o += ln


def pack(length: np.ndarray, cache: np.ndarray, W: int, m: int):
    """Next-fit packing of items (in order) into rows of ``W`` tokens with at most
    ``m`` distinct cache nodes per row. Returns (row, off, slot) per item and the
    nodes of each row's slots ``[rows, m]``."""
    n = len(length)
    if n and int(length.max()) > W:
        raise ValueError(f"an item of {int(length.max())} tokens does not fit a row of {W}")
    row = np.empty(n, np.int64)
    off = np.empty(n, np.int64)
    slot = np.empty(n, np.int64)
    slots: list[list[int]] = []
    C = cache.tolist()
    for j, (new_row, new_slot, o, sl) in enumerate(_next_fit(length, cache, W, m)):
        if new_row:
            slots.append([])
        if new_slot:
            slots[-1].append(C[j])
        row[j], off[j], slot[j] = len(slots) - 1, o, sl
    nodes = np.zeros((len(slots), m), np.int64)
    for i, s in enumerate(slots):
        nodes[i, :len(s)] = s
    return row, off, slot, nodes


def pack_stage(items, d: int, S: int, W: int, m: int) -> Stage:
    kind, ref, length, cache, start, node, dest = items
    row, off, slot, nodes = pack(length, cache, W, m)
    return Stage(d, S, m, kind, ref, length, row, off, slot, start, node, dest, cache, nodes)


# ------------------------------------------------------------------ shapes and costs
@dataclasses.dataclass(frozen=True)
class PackShape:
    """The shape every call of a schedule shares: ``B`` rows of ``W`` tokens, each
    row after ``cache`` cached keys (its slots side by side, padded), ``R`` readouts,
    ``C`` children written per call, and ``labels`` label rows of the output
    embedding (the classes, padded; 0 in sequence mode, which reads the full
    vocabulary). Everything the model program's shapes depend on."""

    B: int
    W: int
    cache: int
    R: int = 8
    C: int = 8
    labels: int = 0

    @property
    def program(self) -> tuple[int, int, int, int, int]:
        """What tells one model program from another (:func:`sc_jax.scoring.engine._packed`;
        C only shapes the model-free writes)."""
        return (self.B, self.W, self.cache, self.R, self.labels)


@dataclasses.dataclass(frozen=True)
class CostModel:
    """FLOPs and memory traffic of a packed call, per part.

    FLOPs: ``token`` per executed token (2 x non-embedding parameters), ``key`` per
    (token, scored key) (4 x L x H x Dh: q.k and p.v). Bytes: the dense work reads the weights once per call (``weights``) and moves
    ``act`` bytes of activations per executed token (each layer's hidden states, q, k,
    v, attention output and MLP gate, up and product, written and read once); the
    attention reads every scored key's K and V once per query block (``kv`` bytes per
    key and layer) and moves, per (token, head, scored key), scores and probabilities: XLA's paths write the float32 scores, read them for the
    maximum and again for the exponentials, and write and read the probabilities in the
    value dtype (12 + 2 x itemsize bytes); cuDNN's fused kernel keeps them on chip and
    reads only the mask's bias (itemsize bytes). The readout (:meth:`readout`) is the
    unembedding of the call's ``R`` readout positions, against the label rows or the
    whole vocabulary. Times follow from a :class:`Roofline`.
    """

    token: float
    key: float
    weights: float = 0.0
    act: float = 0.0
    kv: float = 0.0
    itemsize: int = 4
    layers: int = 1
    heads: int = 1
    hidden: int = 0
    vocab: int = 0

    @classmethod
    def of(cls, config, itemsize: int = 4) -> CostModel:
        """The costs of ``config`` with weights and activations of ``itemsize`` bytes."""
        c, e = config, int(itemsize)
        embed = c.vocab_size * c.hidden_size * (1 if c.tie_word_embeddings else 2)
        token = 2.0 * (c.num_params() - embed)
        act = c.num_layers * e * (6 * c.hidden_size + 3 * c.intermediate_size
                                  + 2 * (c.num_heads + 2 * c.num_kv_heads) * c.head_dim)
        return cls(token, 4.0 * c.num_layers * c.num_heads * c.head_dim,
                   weights=float((c.num_params() - embed) * e), act=float(act),
                   kv=2.0 * c.num_kv_heads * c.head_dim * e, itemsize=e, layers=c.num_layers,
                   heads=c.num_heads, hidden=c.hidden_size, vocab=c.vocab_size)

    def dense(self, B: int, W: int) -> tuple[float, float]:
        """(FLOPs, bytes) of a call's dense work: projections, MLP, norms."""
        return B * W * self.token, self.weights + B * W * self.act

    def readout(self, R: int, labels: int, sequence: bool) -> tuple[float, float]:
        """(FLOPs, bytes) of a call's readout: ``R`` hidden states ``[R, D]`` against
        the output embedding. First-token mode multiplies the ``labels`` rows of the
        table alone (``[R, labels]`` float32 logits); sequence mode the whole table
        ``[V, D]`` (read once per call), its float32 logits ``[R, V]`` written, then
        read by the log-softmax's maximum and its sum, and its result written and read
        by the gather of the targets."""
        rows = self.vocab if sequence else labels
        flops = 2.0 * R * self.hidden * rows
        passes = 5 if sequence else 1
        return flops, rows * self.hidden * self.itemsize + passes * R * rows * 4.0

    def attention(self, B: int, W: int, scored: float, reads: float, implementation: str) -> tuple[float, float]:
        """(FLOPs, bytes) of a call's attention: ``scored`` keys per token, ``reads`` key
        reads per row (K and V of each key, once per query block that scores it)."""
        # The fused kernels keep their scores on chip; the XLA paths write and read them.
        score_bytes = self.itemsize if implementation in ("cudnn", "pallas") else 12 + 2 * self.itemsize
        traffic = self.layers * (B * W * scored * self.heads * score_bytes + B * reads * self.kv)
        return B * W * scored * self.key, traffic


@dataclasses.dataclass(frozen=True)
class Roofline:
    """A device's pace: ``flops`` (FLOP/s at the stated utilisation) and ``bytes``
    (memory bytes/s), and where they come from. A part of a call takes
    max(FLOPs / flops, bytes / bytes): compute-bound or memory-bound."""

    flops: float
    bytes: float
    source: str = ""

    def seconds(self, flops: float, nbytes: float) -> float:
        return max(flops / self.flops, nbytes / self.bytes)


def attention_reads(implementation: str, *, W: int, C: int, scored: float, bq: int = 0,
                    G: int = 1) -> tuple[float, float]:
    """(scored keys per token, key reads per row) of one call: the dense paths score
    all ``C + W`` keys and read them once per row (cuDNN: once per 128-query tile);
    the block-sparse path (``scored`` keys per query block of ``bq``; on an
    accelerator every key, ``scored = C + W``) reads them once per block, the Pallas
    kernel once per block and query head of a group of ``G``."""
    if implementation in ("blocked", "pallas"):
        return scored, (W // bq) * scored * (G if implementation == "pallas" else 1)
    tiles = -(-W // 128) if implementation == "cudnn" else 1
    return float(C + W), float(tiles * (C + W))


def call_trips(st: Stage, r0: int, B: int, W: int, C: int, bq: int, bk: int) -> int:
    """Keys the block-sparse attention scores per token in the call of rows ``r0 ..
    r0 + B`` of ``st``: its loop trips over cached blocks of ``bk`` and packed blocks
    of ``bq``, the largest over the call's query blocks (as
    :func:`sc_jax.models.attention.block_ranges` finds them on the device)."""
    a, b = np.searchsorted(st.row, [r0, r0 + B])
    if a == b:
        return bk + bq
    row, off, ln, slot = st.row[a:b] - r0, st.off[a:b], st.length[a:b], st.slot[a:b]
    first, last = off // bq, (off + ln - 1) // bq
    n = last - first + 1
    item = np.repeat(np.arange(len(off)), n)
    qb = first[item] + np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
    key = row[item] * (W // bq) + qb
    nb = B * (W // bq)
    lo = np.full(nb, C, np.int64)
    hi = np.zeros(nb, np.int64)
    start = np.full(nb, W, np.int64)
    np.minimum.at(lo, key, slot[item] * st.S)
    np.maximum.at(hi, key, (slot[item] + 1) * st.S)
    np.minimum.at(start, key, off[item])
    used = hi > 0
    c_lo = np.minimum(lo[used] // bk, C // bk - 1)
    c_n = int((-(-np.minimum(hi[used], C) // bk) - c_lo).max())
    n_n = int((np.arange(nb)[used] % (W // bq) - start[used] // bq + 1).max())
    return c_n * bk + n_n * bq


def slot_lengths(level_len) -> list[int]:
    """Tokens per cache slot of every stage d = 1..D+1: stage d reads level d - 1,
    whose nodes hold ``level_len[d - 1]`` tokens (at least :data:`MIN_CACHE`, the
    empty root's stage included)."""
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
    """Every call of one engine call: ``shape``, per chunk its stages (packed), the
    level lengths ``level_len`` (tokens per node at each depth, padded), the
    count of output rows ``n_out`` and the devices the levels' rows are split over."""

    shape: PackShape
    level_len: tuple[int, ...]
    chunks: list[list[Stage]]
    trie: list[Chunk]
    n_out: int
    n_devices: int = 1

    def level_shape(self, chunk: int, d: int) -> tuple[int, int]:
        """(rows, tokens per row) of the buffer of level ``d`` of ``chunk``: what the
        engine allocates and the planner counts."""
        return level_rows(self.trie[chunk].nodes(d), self.n_devices), self.level_len[d]

    def calls(self):
        """(chunk index, stage, first row) of every call, in order."""
        B = self.shape.B
        for ci, stages in enumerate(self.chunks):
            for st in stages:
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
        stages = []
        for d in range(1, depth + 2):
            it = stage_items(ch, d, seg_len, qlen, n_bos)
            if it is not None:
                S = slots[d - 1]
                stages.append(pack_stage(it, d, S, shape.W, max(1, shape.cache // S)))
        chunks.append(stages)
    R, C = shape.R, shape.C
    readouts = np.asarray(readouts, np.int64)
    for stages in chunks:
        for st in stages:
            for r0 in range(0, st.rows, shape.B):
                sel = (st.row >= r0) & (st.row < r0 + shape.B)
                q = sel & (st.kind == 1)
                R = max(R, int(readouts[st.ref[q]].sum()))
                C = max(C, int((sel & (st.kind == 0)).sum()))
    shape = dataclasses.replace(shape, R=pow2_at_least(R), C=pow2_at_least(C))
    n_out = sum(len(np.asarray(p).reshape(-1, 2)) for _, p in jobs) * nr
    return Schedule(shape, level_len, chunks, trie, n_out, n_devices)
