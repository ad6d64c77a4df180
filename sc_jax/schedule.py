"""The scoring engine's schedule and memory model, on the host with NumPy (no model,
nothing on a device): what :class:`sc_jax.scoring.ScoringEngine` runs for given
inputs, and what that needs on a device. The engine groups and batches its query rows
with these functions and checks its plan against the budget with :func:`schedule` and
:func:`peak_bytes` before anything compiles; :mod:`sc_jax.plan` replays the same
schedule for a whole run.

The schedule: contexts sorted so that shared prefixes sit together and cut into
chunks that fit ``max_cache_tokens``; per chunk one growth call per trie depth and
micro-batch, then the query rows of every context in groups of G sharing one copy
of its cache (:func:`query_groups`), in micro-batches padded to a few length
buckets (:func:`query_batches`). :func:`schedule` lists those calls.

What lives on a device while the engine runs:

* the weights, ``num_params x itemsize`` (divided over the ``model`` axis when the
  weights are sharded);
* KV caches of the trie, ``2 x L x K x Dh x itemsize`` bytes per cached token
  (:func:`kv_bytes_per_token`): while depth d grows, the parent level and the child
  level (written in place into one preallocated buffer); while queries run, the leaf
  level alone;
* one forward call's temporaries (:func:`call_temp_bytes`): the gathered copy of the
  cache rows it extends, the scan's stacked new keys and values, and one layer's
  working set (attention scores in float32 over cache + new tokens, the MLP).

:func:`plan_budgets` turns a memory budget into the engine's two knobs:
``max_tokens_per_batch`` (the largest power of two whose largest call fits a quarter
of what the weights leave) and ``max_cache_tokens`` (half of the rest, since two
levels are alive at once); :func:`peak_bytes` is the planned peak of a schedule.

The budget is ``device.memory_stats()["bytes_limit"]`` where the backend reports it
(GPUs, TPUs); otherwise (CPU) the host's physical memory, or what the caller passes.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np

from .loading import bucket_batch
from .prompts import PromptPieces

#: Fraction of the budget left to the runtime (XLA workspace, fragmentation).
RESERVE = 0.10
#: Fraction of what the weights leave that one forward call's temporaries may use.
ACTIVATION_SHARE = 0.25
#: Largest token budget per call considered (CPU: batching beyond gains nothing).
MAX_TOKENS_PER_BATCH = {"cpu": 1 << 14, "default": 1 << 16}


# ------------------------------------------------------------------ query rows and batches
def round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def micro_batch(n_rows: int, width: int, max_tokens_per_batch: int, n_devices: int = 1) -> int:
    """Rows per forward call: the largest power of two whose rows of ``width``
    padded tokens fit ``max_tokens_per_batch``, no more than ``n_rows`` needs,
    rounded up to a multiple of the mesh's data axis."""
    b = max(1, max_tokens_per_batch // max(width, 1))
    b = 1 << (b.bit_length() - 1)  # power of two
    b = min(b, bucket_batch(n_rows, 1))
    return round_up(max(b, 1), n_devices)  # the batch axis is split over the mesh


def query_rows(pieces: PromptPieces, mode: str, queries):
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


def engine_shapes(pieces: PromptPieces, i: int, mode: str) -> "EngineShapes":
    """The padded lengths the engine uses for contexts of size ``i``: one segment
    length and one query length per call (bounded compiles)."""
    k = len(pieces.demos)
    T_seg = round_up(max(len(pieces.bos) + len(pieces.segment(j)) for j in range(k)), 8)
    rows_all, _, _ = query_rows(pieces, mode, range(len(pieces.queries)))
    T_q = round_up(max(len(r) for r in rows_all), 8)
    P = 1 if mode != "sequence" else max(len(l) for l in pieces.labels)
    lens = [0]
    for _ in range(i):
        lens.append(round_up(lens[-1] + T_seg, 32))
    return EngineShapes(T_seg, T_q, P, tuple(lens))


@dataclasses.dataclass(frozen=True)
class EngineShapes:
    """Padded lengths of one engine call: segment ``T_seg``, query row ``T_q``,
    gathered positions per row ``P``, cache length after each depth ``lens``."""

    T_seg: int
    T_q: int
    P: int
    lens: tuple[int, ...]


@dataclasses.dataclass
class QueryGroups:
    """Query rows of one chunk in groups of G that share one leaf: ``rows``,
    ``dest`` (output index), ``keep`` (False for filler slots) ``[n_groups, G]``;
    ``leaf``, ``length`` (its longest row) ``[n_groups]``."""

    rows: np.ndarray
    dest: np.ndarray
    keep: np.ndarray
    leaf: np.ndarray
    length: np.ndarray


def query_length(n: int, T_max: int) -> int:
    """Padded query-row length of a batch whose longest row has ``n`` tokens: a power
    of two from 16, at most ``T_max`` (the run's longest row rounded up to 8). A few
    buckets, each padding less than 2x, instead of every row padded to the longest
    query of the run."""
    return min(T_max, max(16, 1 << (int(n) - 1).bit_length()))


def query_batches(groups: QueryGroups, Bc: int, T_max: int):
    """Micro-batches of Bc groups, longest groups first so that each batch is
    padded to its own length bucket. Yields (group indices [Bc] with filler, real
    mask [Bc], padded length T)."""
    order = np.argsort(-groups.length, kind="stable")
    n = len(order)
    for s0 in range(0, n, Bc):
        sel = order[s0:s0 + Bc]
        real = np.ones(Bc, bool)
        real[len(sel):] = False
        sel = np.r_[sel, np.full(Bc - len(sel), sel[0])]  # filler groups repeat a real one
        yield sel, real, query_length(groups.length[sel].max(), T_max)


def query_groups(chunk, n_contexts: int, pairs, nr: int, G: int, leaf_of, qlen) -> QueryGroups | None:
    """Group the query rows of the pairs whose context is in ``chunk`` (vectorised:
    rows of one context are consecutive, longest first, cut every G, so a group's
    rows have similar lengths). ``qlen``: tokens of each query row."""
    local = np.full(n_contexts, -1, np.int64)
    local[chunk] = np.arange(len(chunk))
    pos = local[pairs[:, 0]]
    sel = np.flatnonzero(pos >= 0)
    if sel.size == 0:
        return None
    sel = sel[np.argsort(pos[sel], kind="stable")]
    # Entries (pair r, label j): query row q * nr + j, output index r * nr + j.
    j = np.tile(np.arange(nr), len(sel))
    r = np.repeat(sel, nr)
    ctx = np.repeat(pos[sel], nr)
    qrow = pairs[r, 1] * nr + j
    dest = r * nr + j
    by_len = np.lexsort((-qlen[qrow], ctx))  # within a context, longest rows first
    ctx, qrow, dest = ctx[by_len], qrow[by_len], dest[by_len]
    first = np.r_[0, np.flatnonzero(np.diff(ctx)) + 1]  # first entry of each context
    start = np.repeat(first, np.diff(np.r_[first, len(ctx)]))
    rank = np.arange(len(ctx)) - start
    slot = rank % G
    gid = np.cumsum(slot == 0) - 1
    n_groups = int(gid[-1]) + 1
    head = np.flatnonzero(slot == 0)  # first entry of each group
    rows = np.repeat(qrow[head][:, None], G, axis=1)  # filler slots repeat the head
    dests = np.zeros((n_groups, G), np.int64)
    keep = np.zeros((n_groups, G), bool)
    rows[gid, slot] = qrow
    dests[gid, slot] = dest
    keep[gid, slot] = True
    return QueryGroups(rows, dests, keep, leaf_of[ctx[head]], qlen[qrow[head]])


# ------------------------------------------------------------------ memory
def _itemsize(dtype) -> int:
    return jnp.dtype(dtype).itemsize


def device_memory_bytes(device=None) -> int | None:
    """``bytes_limit`` of ``device`` (default: the first), None where the backend does
    not report one (CPU)."""
    dev = device or jax.local_devices()[0]
    try:
        stats = dev.memory_stats()
    except Exception:  # backends without memory statistics
        stats = None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    return None


def host_memory_bytes() -> int:
    """Physical memory of this host."""
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def weight_bytes(config, dtype, model_shards: int = 1) -> int:
    """Bytes of the weights on one device (``num_params x itemsize / model_shards``)."""
    return int(config.num_params() * _itemsize(dtype) // model_shards)


def kv_bytes_per_token(config, dtype, model_shards: int = 1) -> int:
    """Keys and values of every layer for one cached token, on one device
    (``2 x L x K x Dh x itemsize``, plus its int32 position and bool mask)."""
    return int(2 * config.num_layers * config.num_kv_heads * config.head_dim * _itemsize(dtype)
               // model_shards + 5)


@dataclasses.dataclass(frozen=True)
class Call:
    """One jitted engine program and how often it runs. ``kind``: "grow" (extend
    ``B`` cache rows of ``S`` tokens by ``T`` new tokens into a level of ``out_len``)
    or "score" (``B`` query rows of ``T`` tokens after ``Bc`` gathered cache rows of
    ``S``); ``rows``: rows of the resident level buffer(s) it reads and writes."""

    kind: str
    B: int
    T: int
    S: int
    Bc: int
    out_len: int
    level_rows: int
    parent_rows: int
    parent_len: int
    count: int = 1

    @property
    def key(self):
        """What determines the shape of its model program (the gathers and in-place
        writes around it are model-free programs that compile in milliseconds)."""
        return (self.kind, self.B, self.T, self.S, self.Bc)


def call_temp_bytes(config, dtype, call: Call, model_shards: int = 1) -> int:
    """Estimated temporaries of one engine call on one device (beyond its arguments
    and the level buffer it updates in place).

    gathered cache rows ``[L, Bc, S, K, Dh] x 2`` (the model program's input); for
    growth, the scan's stacked new keys and values ``[L, B, T, K, Dh] x 2`` (its
    output, written in place into the level afterwards; query calls discard them and
    XLA removes them); one layer's working set: hidden states, q/k/v with their float32 rotary
    copies, attention scores ``[B, H, T, S + T]`` in float32 plus probabilities, the
    MLP's gate, up and product ``[B, T, F]``.
    """
    c, e = config, _itemsize(dtype)
    L, K, Dh, H, D, F = (c.num_layers, c.num_kv_heads, c.head_dim, c.num_heads, c.hidden_size,
                         c.intermediate_size)
    kv_row = 2 * L * K * Dh * e // model_shards  # one token's KV, all layers
    gathered = call.Bc * call.S * kv_row
    grow = call.kind == "grow"
    seg = call.B * call.T * kv_row if grow else 0
    BT = call.B * call.T
    heads = (H + 2 * K) * Dh // model_shards
    layer = BT * (4 * D * e + heads * (e + 4) + 3 * F * e // model_shards) \
        + BT * (H // model_shards) * (call.S + call.T) * (4 + e)
    return int(gathered + seg + layer + BT * D * e)


def schedule(shapes, contexts: np.ndarray, pairs: np.ndarray, nr: int, G: int, qlen: np.ndarray, *,
             max_tokens_per_batch: int, max_cache_tokens: int, n_devices: int = 1) -> list[Call]:
    """The calls :meth:`sc_jax.scoring.ScoringEngine.score` makes for these inputs, in order (same
    chunking, micro-batching and grouping, computed with NumPy alone).

    shapes: :class:`EngineShapes`; contexts ``[M, i]``; pairs ``[N, 2]``;
    nr: query rows per pair (n labels in sequence mode, else 1); G: rows per group;
    qlen: tokens of every query row (row q * nr + j).
    """
    lens = shapes.lens
    order = np.lexsort(contexts.T[::-1])
    per_chunk = max(1, max_cache_tokens // lens[-1])
    calls: list[Call] = []
    for c0 in range(0, len(order), per_chunk):
        chunk = order[c0:c0 + per_chunk]
        ctx = contexts[chunk]
        parent_rows, parent_len, leaf_of = 1, 0, None
        for d in range(1, ctx.shape[1] + 1):
            prefixes, inverse = np.unique(ctx[:, :d], axis=0, return_inverse=True)
            B = micro_batch(len(prefixes), lens[d], max_tokens_per_batch, n_devices)
            rows = round_up(len(prefixes), B)
            calls.append(Call("grow", B, shapes.T_seg, lens[d - 1], B, lens[d], rows, parent_rows,
                              parent_len, count=rows // B))
            parent_rows, parent_len, leaf_of = rows, lens[d], inverse.reshape(-1)
        groups = query_groups(chunk, len(contexts), pairs, nr, G, leaf_of, qlen)
        if groups is None:
            continue
        Bc = micro_batch(len(groups.leaf), lens[-1] + G * shapes.T_q, max_tokens_per_batch, n_devices)
        per_T: dict[int, int] = {}
        for _, _, T in query_batches(groups, Bc, shapes.T_q):
            per_T[T] = per_T.get(T, 0) + 1
        for T, count in per_T.items():
            calls.append(Call("score", Bc * G, T, lens[-1], Bc, 0, parent_rows, 0, 0, count=count))
    return calls


def peak_bytes(config, dtype, calls: list[Call], model_shards: int = 1) -> dict[str, int]:
    """Planned peak on one device: weights + the level buffers alive during a call +
    that call's temporaries, at the worst call. Returns the breakdown at that call."""
    w = weight_bytes(config, dtype, model_shards)
    kvb = kv_bytes_per_token(config, dtype, model_shards)
    best = dict(peak_bytes=w, weight_bytes=w, cache_bytes=0, temp_bytes=0)
    for call in calls:
        if call.kind == "grow":
            cache = call.level_rows * call.out_len * kvb + call.parent_rows * call.parent_len * kvb
        else:
            cache = call.level_rows * call.S * kvb
        temp = call_temp_bytes(config, dtype, call, model_shards)
        if w + cache + temp > best["peak_bytes"]:
            best = dict(peak_bytes=w + cache + temp, weight_bytes=w, cache_bytes=cache, temp_bytes=temp)
    return best


class PlanError(ValueError):
    """The model or a single context does not fit the memory budget."""


@dataclasses.dataclass(frozen=True)
class OldBudgets:
    """The engine's knobs from a memory budget, and the figures behind them."""

    budget_bytes: int
    weight_bytes: int
    kv_bytes_per_token: int
    max_tokens_per_batch: int
    max_cache_tokens: int
    temp_bytes: int
    max_group: int


def plan_budgets(config, dtype, shapes, *, budget_bytes: int, G: int, n_devices: int = 1,
                 model_shards: int = 1, platform: str = "default") -> Budgets:
    """``max_tokens_per_batch`` and ``max_cache_tokens`` for contexts of ``shapes``
    within ``budget_bytes`` per device. Raises :class:`PlanError`, naming the
    numbers, when the weights or one context with its smallest call cannot fit."""
    w = weight_bytes(config, dtype, model_shards)
    kvb = kv_bytes_per_token(config, dtype, model_shards)
    usable = int(budget_bytes * (1 - RESERVE))
    gib = 2 ** 30
    if w >= usable:
        raise PlanError(f"the weights need {w / gib:.2f} GiB per device, more than the "
                        f"{usable / gib:.2f} GiB usable of a {budget_bytes / gib:.2f} GiB budget "
                        f"(after a {RESERVE:.0%} reserve); shard them over more devices or use a "
                        "smaller dtype")
    avail = usable - w
    S = shapes.lens[-1]

    def worst(tokens: int, G: int = G) -> int:
        # The largest calls of a run at this token budget: the deepest growth step
        # and a query group batch.
        Bg = micro_batch_rows(tokens, S, n_devices)
        Bq = micro_batch_rows(tokens, S + G * shapes.T_q, n_devices)
        grow = Call("grow", Bg, shapes.T_seg, shapes.lens[-2] if len(shapes.lens) > 1 else 0, Bg,
                    S, Bg, Bg, 0)
        score = Call("score", Bq * G, shapes.T_q, S, Bq, 0, Bq, 0, 0)
        return max(call_temp_bytes(config, dtype, grow, model_shards),
                   call_temp_bytes(config, dtype, score, model_shards))

    cap = MAX_TOKENS_PER_BATCH.get(platform, MAX_TOKENS_PER_BATCH["default"])
    # Query rows share a gathered cache row in groups of G, so a query call has at
    # least G rows: when even that does not leave room for one context's levels,
    # smaller groups are used.
    while G > 1 and worst(256, G) + 2 * S * kvb > avail:
        G //= 2
    tokens = cap
    while tokens > 256 and worst(tokens, G) > ACTIVATION_SHARE * avail:
        tokens //= 2
    temp = worst(tokens, G)
    cache_tokens = int((avail - temp) // (2 * kvb))
    if cache_tokens < S:
        raise PlanError(
            f"one context of {S} padded tokens needs {2 * S * kvb / gib:.3f} GiB of KV cache "
            f"(parent and child levels) plus {temp / gib:.3f} GiB for its smallest forward call, "
            f"but only {avail / gib:.3f} GiB per device remain after the weights "
            f"({w / gib:.2f} GiB) in a {budget_bytes / gib:.2f} GiB budget")
    return OldBudgets(int(budget_bytes), w, kvb, int(tokens), cache_tokens, int(temp), int(G))


def micro_batch_rows(tokens: int, width: int, n_devices: int) -> int:
    """Rows of ``width`` tokens in a call of at most ``tokens`` (unbounded row count)."""
    return micro_batch(1 << 30, width, tokens, n_devices)


# ------------------------------------------------------------------ the packed engine's plan
def schedule_inputs(pieces: PromptPieces, mode: str) -> dict:
    """What :func:`sc_jax.packing.build_schedule` needs of the prompts: segment
    lengths (no BOS), BOS length, query-row lengths and readouts per query row."""
    k = len(pieces.demos)
    rows, gathers, _ = query_rows(pieces, mode, range(len(pieces.queries)))
    return dict(seg_len=np.asarray([len(pieces.segment(j)) for j in range(k)], np.int64),
                n_bos=len(pieces.bos), qlen=np.asarray([len(r) for r in rows], np.int64),
                readouts=np.asarray([len(g) for g in gathers], np.int64))


def packed_temp_bytes(config, dtype, B: int, W: int, m: int, S: int, *, R: int = 0,
                      sequence: bool = False, model_shards: int = 1) -> int:
    """Estimated temporaries of one packed call on one device.

    The gathered cache ``[L, B, m x S, K, Dh] x 2`` (the model program's input); the
    scan's stacked new keys and values ``[L, B, W, K, Dh] x 2`` (its output); one
    layer's working set: hidden states, q/k/v with their float32 rotary copies,
    attention scores ``[B, H, W, m x S + W]`` in float32 plus probabilities, the MLP's
    gate, up and product ``[B, W, F]``; in sequence mode the full-vocabulary logits of
    the ``R`` readouts in float32.
    """
    c, e = config, _itemsize(dtype)
    L, K, Dh, H, D, F = (c.num_layers, c.num_kv_heads, c.head_dim, c.num_heads, c.hidden_size,
                         c.intermediate_size)
    kv_row = 2 * L * K * Dh * e // model_shards
    BW = B * W
    heads = (H + 2 * K) * Dh // model_shards
    layer = BW * (4 * D * e + heads * (e + 4) + 3 * F * e // model_shards) \
        + BW * (H // model_shards) * (m * S + W) * (4 + e)
    vocab = 2 * R * c.vocab_size * 4 // model_shards if sequence else 0
    return int(B * m * S * kv_row + BW * kv_row + layer + BW * D * e + vocab)


@dataclasses.dataclass(frozen=True)
class Budgets:
    """The engine's knobs from a memory budget, and the figures behind them:
    ``max_tokens_per_batch`` caps B x W, ``max_cache_tokens`` one trie level;
    ``temp_bytes`` the chosen call's temporaries, ``peak_bytes`` the planned peak."""

    budget_bytes: int
    weight_bytes: int
    kv_bytes_per_token: int
    max_tokens_per_batch: int
    max_cache_tokens: int
    temp_bytes: int
    peak_bytes: int = 0
    cache_bytes: int = 0


@dataclasses.dataclass
class Planned:
    """A packed schedule and the budgets it was made under."""

    schedule: "Schedule"
    budgets: Budgets


def level_peak_tokens(sched) -> int:
    """Most cached tokens alive at once: a level and its parent (the root: none)."""
    best = 0
    for ch in sched.trie:
        for d in range(1, ch.depth + 1):
            prev = ch.nodes(d - 1) * sched.level_len[d - 1] if d > 1 else 0
            best = max(best, prev + ch.nodes(d) * sched.level_len[d])
    return best


def weights_fit(config, dtype, budget_bytes: int, model_shards: int = 1) -> int:
    """Bytes of the weights per device; :class:`PlanError` where they leave nothing
    of the budget (after :data:`RESERVE`)."""
    w = weight_bytes(config, dtype, model_shards)
    usable = int(budget_bytes * (1 - RESERVE))
    gib = 2 ** 30
    if w >= usable:
        raise PlanError(f"the weights need {w / gib:.2f} GiB per device, more than the "
                        f"{usable / gib:.2f} GiB usable of a {budget_bytes / gib:.2f} GiB budget "
                        f"(after a {RESERVE:.0%} reserve); shard them over more devices or use a "
                        "smaller dtype")
    return w


def plan_schedule(config, dtype, pieces: PromptPieces, jobs, mode: str, *, budget_bytes: int,
                  n_devices: int = 1, model_shards: int = 1, platform: str = "default",
                  max_tokens_per_batch: int | None = None, max_cache_tokens: int | None = None,
                  enforce: bool = True, prefer=None) -> Planned:
    """The engine's packed schedule of ``jobs`` (``(contexts, pairs)`` each) within
    ``budget_bytes`` per device. Knobs left as None are derived: one trie level may
    hold half of what the weights and one call's share (:data:`ACTIVATION_SHARE`)
    leave, and the call shape is the cheapest whose temporaries fit that share
    (``prefer``: an earlier schedule's shape, kept where it fits). Raises
    :class:`PlanError`, naming the numbers, when the weights or one context with its
    smallest call cannot fit, or (``enforce``) when the planned peak is over budget."""
    from .packing import CostModel, build_schedule, cache_bucket, level_lengths

    w = weights_fit(config, dtype, budget_bytes, model_shards)
    kvb = kv_bytes_per_token(config, dtype, model_shards)
    gib = 2 ** 30
    avail = int(budget_bytes * (1 - RESERVE)) - w
    share = ACTIVATION_SHARE * avail
    inputs = schedule_inputs(pieces, mode)
    depth = max(int(np.asarray(c).shape[1]) for c, _ in jobs)
    level_len = level_lengths(int(inputs["seg_len"].max()) + inputs["n_bos"], depth)
    S_max = cache_bucket(level_len[-1])
    seq = mode == "sequence"
    R_est = max(8, 4 * int(inputs["readouts"].max()))

    def temp(B, W, m, R=R_est):
        return packed_temp_bytes(config, dtype, B, W, m, S_max, R=R, sequence=seq,
                                 model_shards=model_shards)

    cache = max_cache_tokens or int((avail - share) // (2 * kvb))
    if max_cache_tokens is None and cache < level_len[-1]:
        raise PlanError(
            f"one context of {level_len[-1]} padded tokens needs "
            f"{2 * level_len[-1] * kvb / gib:.3f} GiB of KV cache (parent and child levels), "
            f"but only {(avail - share) / gib:.3f} GiB per device remain after the weights "
            f"({w / gib:.2f} GiB) and one call's share in a {budget_bytes / gib:.2f} GiB budget")
    tokens = max_tokens_per_batch or MAX_TOKENS_PER_BATCH.get(platform, MAX_TOKENS_PER_BATCH["default"])
    temp_ok = None if max_tokens_per_batch else (lambda B, W, m: temp(B, W, m) <= share)
    sched = build_schedule(jobs, nr=len(pieces.labels) if seq else 1, cost=CostModel.of(config),
                           max_tokens=tokens, max_cache_tokens=cache, n_devices=n_devices,
                           temp_ok=temp_ok, prefer=prefer, **inputs)
    sh = sched.shape
    t = temp(sh.B, sh.W, sh.m, sh.R)
    levels = level_peak_tokens(sched) * kvb
    b = Budgets(int(budget_bytes), w, kvb, int(tokens), int(cache), t, w + levels + t, levels)
    if enforce and b.peak_bytes > budget_bytes:
        raise PlanError(
            f"the planned peak is {b.peak_bytes / gib:.2f} GiB per device (weights "
            f"{w / gib:.2f}, KV caches {levels / gib:.2f}, one call's temporaries "
            f"{t / gib:.2f}), over the {budget_bytes / gib:.2f} GiB budget: lower "
            f"max_tokens_per_batch ({tokens}) or max_cache_tokens ({cache})")
    return Planned(sched, b)
