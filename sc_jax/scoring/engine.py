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
:func:`sc_jax.calibration.objective.log_odds` turns them into the features m_c = log p_c - log p_0.

The engine (:class:`ScoringEngine`) computes every distinct ordered sub-context once:
contexts are sorted so that shared prefixes sit together, cut into chunks that fit
``max_cache_tokens``, and within a chunk the trie is grown depth by depth, each node
extending its parent's KV cache by one demonstration. Every query of a context is then
scored against the context's cache in one batch. Every call has the one
shape of the engine's memory policy (:func:`sc_jax.scoring.schedule.call_shape`: B rows of W
tokens after a fixed number of cached keys per row, padded readouts and label rows),
so a run compiles one model program, and compiles it before the first call
(:meth:`ScoringEngine.compile`); :data:`COMPILES` counts the traces.

Device pipeline: each trie level is one preallocated buffer that growth steps write
in place (donated), so a level is never held twice; the model programs take only the
cache rows they extend (gathered by a model-free program), so their shapes do not
depend on level sizes; host batches are row lookups into tables packed once per
call; and each micro-batch's result is fetched after the next one is dispatched, so
the host never waits on the batch it has just sent. The token budgets come from the
device's memory (:mod:`sc_jax.scoring.schedule`) unless given.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import time
import warnings
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from sc_jax.models import attention as attn
from sc_jax.models.loading import LoadedModel, bucket_batch
from sc_jax.models.model import KVCache, Packing, empty_cache, positions_from_valid
from sc_jax.runtime.multihost import to_host
from sc_jax.runtime.sharding import batch_sharded, kv_sharding
from sc_jax.runtime.timing import CompileMeter
from sc_jax.scoring.enumeration import index_array
from sc_jax.scoring.attention_choice import choose_attention, error_line, fallbacks
from sc_jax.scoring.packing import MIN_CACHE, PackShape, Schedule, Stage, round_up
from sc_jax.scoring.prompts import PromptPieces
from sc_jax.scoring.schedule import MemoryPolicy, query_rows

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
    contexts = index_array("contexts", contexts)
    pairs = index_array("pairs", pairs)
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


# The engine's programs. The model program (`_packed`) has one shape for every call of
# a run (its rows, width, cached keys, readouts and label rows: PackShape.program). The
# model-free gathers, writes and level buffers around it take the level shapes, which
# the schedule buckets (sc_jax.scoring.packing.level_lengths, level_rows), and
# arguments of the call shape, so that other seeds find them compiled (in memory or
# in the persistent cache).
@functools.partial(jax.jit, static_argnames=("S", "keys"))
def _gather_slots(level: KVCache, idx, S: int, keys: int):
    """The cache of a call: rows ``idx[:, :m]`` (``idx [B, keys // MIN_CACHE]``, one
    shape for every stage; ``m = keys // S``) of a level buffer, each padded to ``S``
    tokens and laid side by side, then padded to ``keys`` (never visible):
    ``[L, B, keys, K, Dh]``, and the slot of every cached key ``[B, keys]`` (-1 in
    the padding)."""
    COMPILES["gather"] += 1
    m = max(1, keys // S)
    idx = idx[:, :m]
    B = idx.shape[0]
    flat = idx.reshape(-1)
    pad = S - level.length
    tail = keys - m * S

    def rows(x, lead):
        x = x[:, flat] if lead else x[flat]
        widths = [(0, 0)] * x.ndim
        widths[2 if lead else 1] = (0, pad)
        x = jnp.pad(x, widths)
        x = x.reshape(x.shape[:1] + (B, m * S) + x.shape[3:]) if lead else x.reshape(B, m * S)
        widths = [(0, 0)] * x.ndim
        widths[2 if lead else 1] = (0, tail)
        return jnp.pad(x, widths)

    cache = KVCache(rows(level.k, True), rows(level.v, True), rows(level.pos, False),
                    rows(level.valid, False))
    slot = jnp.pad(jnp.repeat(jnp.arange(m, dtype=jnp.int32), S), (0, tail), constant_values=-1)
    return cache, jnp.broadcast_to(slot, (B, keys))


@functools.partial(jax.jit, static_argnames=("graphdef", "sequence", "attention"))
def _packed(graphdef, state, cache: KVCache, cache_slot, tokens, positions, valid, segment, slot,
            readout, targets, rows, sequence, attention="dense"):
    """One packed call: ``B`` rows of ``W`` tokens, several items per row, each after
    its own slot of ``cache`` (:class:`sc_jax.models.model.Packing`), its attention by
    ``attention`` (:mod:`sc_jax.models.attention`). Returns the label
    scores at the ``R`` flat positions ``readout`` (``[R, labels]`` label-row logits, or
    ``[R]`` log-probabilities of ``targets`` in sequence mode) and the new tokens'
    keys and values ``[L, B, W, K, Dh]``."""
    COMPILES["packed"] += 1
    model = nnx.merge(graphdef, state)
    hidden, kv = model(tokens, positions, valid, cache, Packing(segment, slot, cache_slot), attention)
    B, W, D = hidden.shape
    sel = hidden.reshape(B * W, D)[readout]  # [R, D]
    if not sequence:
        return model.project(sel, rows), kv
    lp = jax.nn.log_softmax(model.project(sel), axis=-1)  # full vocabulary at R positions only
    return jnp.take_along_axis(lp, targets[:, None], axis=-1)[:, 0], kv


@functools.partial(jax.jit, donate_argnames=("level",))
def _write_children(level: KVCache, parent: KVCache, kv: KVCache, child, parent_row, start, length):
    """Children written in place into the donated ``level`` buffer: child row
    ``child[c]`` (out of range: ignored) = parent row ``parent_row[c]`` then the
    ``length[c]`` new tokens at flat position ``start[c]`` of the call's ``kv``."""
    COMPILES["write"] += 1
    L, BW = kv.k.shape[0], kv.k.shape[1] * kv.k.shape[2]
    T = level.length - parent.length
    col = jnp.arange(T)
    src = jnp.clip(start[:, None] + col, 0, BW - 1)  # [C, T]
    ok = col[None, :] < length[:, None]

    def seg(x, lead):
        flat = x.reshape((L, BW) + x.shape[3:]) if lead else x.reshape(BW)
        return flat[:, src] if lead else flat[src]

    def put(dst, par, new, lead):
        rows = jnp.concatenate([par[:, parent_row] if lead else par[parent_row], new.astype(dst.dtype)],
                               axis=2 if lead else 1)
        return dst.at[:, child].set(rows, mode="drop") if lead else dst.at[child].set(rows, mode="drop")

    okb = ok[None, :, :, None, None]
    return KVCache(put(level.k, parent.k, jnp.where(okb, seg(kv.k, True), 0), True),
                   put(level.v, parent.v, jnp.where(okb, seg(kv.v, True), 0), True),
                   put(level.pos, parent.pos, jnp.where(ok, seg(kv.pos, False), 0), False),
                   put(level.valid, parent.valid, ok & seg(kv.valid, False), False))


@functools.partial(jax.jit, static_argnames=("config", "rows", "length", "dtype", "sharding"))
def _empty_level(config, rows: int, length: int, dtype, sharding=None):
    """A zeroed level buffer ``[L, rows, length, K, Dh]`` (all positions invalid),
    its rows split over the mesh's data axis when there is one."""
    COMPILES["level"] += 1
    L, K, Dh = config.num_layers, config.num_kv_heads, config.head_dim
    z = jnp.zeros((L, rows, length, K, Dh), dtype)
    out = KVCache(z, z, jnp.zeros((rows, length), jnp.int32), jnp.zeros((rows, length), bool))
    if sharding is not None:
        out = jax.lax.with_sharding_constraint(out, sharding)
    return out


@dataclasses.dataclass
class EngineStats:
    """What one :meth:`ScoringEngine.score_jobs` call did: forward calls, real tokens
    computed (the trie's unique tokens plus query tokens), executed tokens (calls x
    B x W, padding included), trie nodes, query rows, distinct model ``programs``,
    the call shape, and where its ``seconds`` went: ``plan_s`` (the schedule, on the
    host), ``compile_s`` (JAX compiles: the model program before the first call,
    the model-free gathers and writes as they come; ``compiled`` programs, of them
    ``model_compiled`` model programs, and ``cache_hits`` served by the persistent
    compilation cache), ``host_s`` (building each call's arrays and filing its
    results) and ``forward_s`` (dispatching the calls and waiting for the device);
    ``attention``: the packed calls' attention (:mod:`sc_jax.models.attention`), with
    the candidates timed on this device to choose it (``attention_trials``, one
    :meth:`sc_jax.scoring.attention_choice.Trial.to_json` each; empty where nothing was
    timed) and whether that decision was read from the decision file
    (``attention_from_cache``); the choosing is part of ``compile_s``."""

    calls: int = 0
    tokens: int = 0
    padded_tokens: int = 0
    nodes: int = 0
    query_rows: int = 0
    programs: int = 0
    shape: PackShape | None = None
    seconds: float = 0.0
    plan_s: float = 0.0
    compile_s: float = 0.0
    host_s: float = 0.0
    forward_s: float = 0.0
    compiled: int = 0
    model_compiled: int = 0
    cache_hits: int = 0
    attention: str = ""
    attention_trials: list = dataclasses.field(default_factory=list)
    attention_from_cache: bool = False


class _Tokens:
    """Every item's tokens in one flat array: demonstration segments with BOS (depth
    1), without, then every query row; readout offsets and targets of each query
    row (CSR)."""

    def __init__(self, pieces: PromptPieces, mode: str):
        k = len(pieces.demos)
        segs = [list(pieces.bos) + pieces.segment(j) for j in range(k)] + \
            [pieces.segment(j) for j in range(k)]
        qrows, gathers, targets = query_rows(pieces, mode, range(len(pieces.queries)))
        rows = segs + qrows
        lens = np.fromiter(map(len, rows), np.int64, len(rows))
        self.flat = np.fromiter(itertools.chain.from_iterable(rows), np.int32, int(lens.sum()))
        self.start = np.r_[0, np.cumsum(lens)[:-1]]
        self.k = k
        self.seg_len = lens[k:2 * k]
        self.n_bos = len(pieces.bos)
        self.qlen = lens[2 * k:]
        cnt = np.fromiter(map(len, gathers), np.int64, len(gathers))
        self.ro_ptr = np.r_[0, np.cumsum(cnt)]
        self.ro_off = np.fromiter(itertools.chain.from_iterable(gathers), np.int64, int(cnt.sum()))
        self.ro_tgt = np.fromiter(itertools.chain.from_iterable(targets), np.int64, int(cnt.sum()))
        self.readouts = cnt

    def source(self, st: Stage, it: slice) -> np.ndarray:
        """Start of each item's tokens in :attr:`flat`."""
        ref = st.ref[it]
        seg = ref + (0 if st.depth == 1 else self.k)
        return self.start[np.where(st.kind[it] == 0, seg, 2 * self.k + ref)]


def _spans(lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(item of each token, offset of each token within its item) for items of
    ``lens`` tokens laid end to end."""
    item = np.repeat(np.arange(len(lens)), lens)
    within = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
    return item, within


def call_arrays(tok: _Tokens, shape: PackShape, st: Stage, r0: int) -> dict[str, np.ndarray]:
    """The host arrays of the call that runs rows ``r0 .. r0 + B`` of stage ``st``."""
    B, W, R, C = shape.B, shape.W, shape.R, shape.C
    a, b = np.searchsorted(st.row, [r0, r0 + B])
    it = slice(a, b)
    lens = st.length[it]
    base = (st.row[it] - r0) * W + st.off[it]
    item, within = _spans(lens)
    dst = base[item] + within
    tokens = np.zeros(B * W, np.int32)
    tokens[dst] = tok.flat[tok.source(st, it)[item] + within]
    positions = np.zeros(B * W, np.int32)
    positions[dst] = st.start[it][item] + within
    valid = np.zeros(B * W, bool)
    valid[dst] = True
    segment = np.full(B * W, -1, np.int32)
    segment[dst] = item
    slot = np.zeros(B * W, np.int32)
    slot[dst] = st.slot[it][item]
    idx = np.zeros((B, st.m), np.int32)
    nodes = st.slot_nodes[r0:r0 + B]
    idx[:len(nodes)] = nodes
    # Readouts of the query rows.
    q = np.flatnonzero(st.kind[it] == 1)
    refs = st.ref[it][q]
    cnt = tok.readouts[refs]
    qi, qw = _spans(cnt)
    src = tok.ro_ptr[refs][qi] + qw
    readout = np.zeros(R, np.int32)
    targets = np.zeros(R, np.int32)
    n_ro = len(src)
    readout[:n_ro] = base[q][qi] + tok.ro_off[src]
    targets[:n_ro] = tok.ro_tgt[src]
    # Children (segments) written into the next level.
    g = np.flatnonzero(st.kind[it] == 0)
    child = np.full(C, np.iinfo(np.int32).max, np.int32)
    parent_row = np.zeros(C, np.int32)
    start = np.zeros(C, np.int32)
    length = np.zeros(C, np.int32)
    child[:len(g)] = st.node[it][g]
    parent_row[:len(g)] = st.cache[it][g]
    start[:len(g)] = base[g]
    length[:len(g)] = lens[g]
    return dict(tokens=tokens.reshape(B, W), positions=positions.reshape(B, W),
                valid=valid.reshape(B, W), segment=segment.reshape(B, W), slot=slot.reshape(B, W),
                idx=idx, readout=readout, targets=targets, dest=st.dest[it][q][qi], n_children=len(g),
                child=child, parent_row=parent_row, start=start, length=length,
                tokens_real=int(lens.sum()), query_rows=len(q))


class ScoringEngine:
    """Prefix-shared, packed scoring of many (context, query) pairs.

    :meth:`score_jobs` scores several jobs (each ``(contexts, pairs)``) through one
    prefix trie, grown depth by depth in packed calls (:mod:`sc_jax.scoring.packing`):
    every distinct ordered sub-context is computed once, and the segments and query
    rows of each depth are packed end to end into rows of ``W`` tokens.

    ``policy``: the :class:`sc_jax.scoring.schedule.MemoryPolicy` that decides the memory
    budget and the call shape (default: :meth:`MemoryPolicy.resolve` of the other
    arguments and this model's mesh). ``max_tokens_per_batch``: cap on the tokens of
    one call (B x W; at least one row per device). ``max_cache_tokens``: tokens of
    one trie level held at once (the trie is cut into chunks that fit). Either left
    as None is derived from the memory budget: ``device_memory`` bytes per device if
    given, else the device's ``bytes_limit``, else (CPU) the host's memory. When a
    budget is known (given or reported by the device), the schedule's peak is
    checked against it before anything compiles, and a
    :class:`sc_jax.scoring.schedule.PlanError` names the numbers if it cannot fit.
    ``attention``: the packed calls' attention, one of
    :data:`sc_jax.models.attention.IMPLEMENTATIONS`, or ``"auto"``: on an accelerator,
    each candidate timed on one layer at the call shape and the fastest that agrees with
    ``"dense"`` kept (:func:`sc_jax.scoring.attention_choice.choose_attention`; the
    decision is kept beside the persistent compilation cache, so a second process does
    not time again), on a CPU the block-sparse path. Where the attention does not
    compile or fails on its first run in the whole model program (a cuDNN that builds
    no plan, say), the engine says so in one warning and uses the next (the other
    trials that passed, fastest first, then ``"blocked"``, then ``"dense"``).
    ``progress``: a tqdm bar of query rows.
    """

    def __init__(self, model: LoadedModel, *, max_tokens_per_batch: int | None = None,
                 max_cache_tokens: int | None = None, device_memory: int | None = None,
                 policy: MemoryPolicy | None = None, attention: str = "auto",
                 progress: bool = True):
        if attention != "auto" and attention not in attn.IMPLEMENTATIONS:
            raise ValueError(f"attention must be 'auto' or one of {attn.IMPLEMENTATIONS}, "
                             f"got {attention!r}")
        self.model = model
        self.attention = attention  # as asked; what each call shape uses: compile()
        self.policy = policy or MemoryPolicy.resolve(
            device_memory, n_devices=model.n_devices, model_shards=model.model_shards,
            max_tokens_per_batch=max_tokens_per_batch, max_cache_tokens=max_cache_tokens)
        self.device_memory = self.policy.budget_bytes if self.policy.enforced else None
        self.max_tokens_per_batch = self.policy.max_tokens_per_batch
        self.max_cache_tokens = self.policy.max_cache_tokens
        self.progress = progress
        self.stats = EngineStats()
        self.budgets = None  # the last call's plan (sc_jax.scoring.schedule.Budgets)
        # The call shape of the last schedule: later calls keep it where their items
        # fit (a process that met a longer item keeps its wider program).
        self._shape = None
        # The attention chosen per call shape (name, trials, from the decision file), and
        # the model programs compiled: (program, sequence) -> the attention they use.
        self._choices: dict = {}
        self._warm: dict = {}

    def plan(self, pieces: PromptPieces, jobs, mode: str) -> Schedule:
        """The packed schedule of ``jobs`` (checked inputs) under this engine's policy."""
        m = self.model
        planned = self.policy.plan(m.config, m.dtype, pieces, jobs, mode, prefer=self._shape)
        self._shape = planned.schedule.shape
        self.budgets = planned.budgets
        self.max_tokens_per_batch = planned.budgets.max_tokens_per_batch
        self.max_cache_tokens = planned.budgets.max_cache_tokens
        return planned.schedule

    def _level(self, sched: Schedule, chunk: int, d: int) -> KVCache:
        """The empty buffer of level ``d`` of ``chunk``, of the shape the plan counted
        (:meth:`sc_jax.scoring.packing.Schedule.level_shape`)."""
        m = self.model
        rows, length = sched.level_shape(chunk, d)
        sharding = None
        if m.mesh is not None:
            c = m.config
            kv = kv_sharding(m.mesh, (c.num_layers, rows, length, c.num_kv_heads, c.head_dim))
            sharding = KVCache(kv, kv, batch_sharded(m.mesh), batch_sharded(m.mesh))
        return _empty_level(m.config, rows, length, m.dtype, sharding)

    def _args(self, parent: KVCache, shape: PackShape, a: dict, S: int, rows_arg):
        """The model program's arguments for one call (the cache gathered on the device)."""
        m = self.model
        put, rep = m.put, m.replicate
        # The slots' nodes in one shape for every stage and for compile()'s call of
        # padding: one transfer program, and one gather per level shape, not per slot
        # count.
        idx = np.zeros((len(a["idx"]), max(1, shape.cache // MIN_CACHE)), np.int32)
        idx[:, :a["idx"].shape[1]] = a["idx"]
        cache, cslot = _gather_slots(parent, put(idx), S=S, keys=shape.cache)
        return (m.graphdef, m.state, cache, cslot, put(a["tokens"]), put(a["positions"]),
                put(a["valid"]), put(a["segment"]), put(a["slot"]), rep(a["readout"]),
                rep(a["targets"]), rows_arg)

    def choice(self, shape: PackShape) -> tuple[str, list, bool]:
        """The attention for calls of ``shape``: ``(name, trials, from_cache)``, decided
        once per shape (:func:`sc_jax.scoring.attention_choice.choose_attention` for
        ``"auto"``, timed on one device's share of the call's rows)."""
        if shape.program not in self._choices:
            m = self.model
            if self.attention == "auto":
                rows = max(1, shape.B // m.n_devices)
                self._choices[shape.program] = choose_attention(
                    m.config, m.dtype, shape, rows=rows, devices=m.n_devices * m.model_shards)
            else:
                self._choices[shape.program] = (self.attention, [], False)
        return self._choices[shape.program]

    def compile(self, shape: PackShape, mode: str = "first_token") -> str:
        """Compile the model program of calls of ``shape`` now, ahead of time (once per
        engine and shape), so that the first call of a stage times the forward pass only;
        returns the attention it uses. The arguments are those of a call of padding, so
        the program is the one the calls then find in JAX's cache. Unless it is one of
        the XLA paths on a CPU, the program also runs once on them: a kernel can compile
        and still fail when it runs. A failure either way moves to
        the next attention (:func:`sc_jax.scoring.attention_choice.fallbacks`)."""
        seq = mode == "sequence"
        if (shape.program, seq) in self._warm:
            return self._warm[shape.program, seq]
        m = self.model
        B, W = shape.B, shape.W
        a = dict(idx=np.zeros((B, 1), np.int32), tokens=np.zeros((B, W), np.int32),
                 positions=np.zeros((B, W), np.int32), valid=np.zeros((B, W), bool),
                 segment=np.full((B, W), -1, np.int32), slot=np.zeros((B, W), np.int32),
                 readout=np.zeros(shape.R, np.int32), targets=np.zeros(shape.R, np.int32))
        rows_arg = None if seq else m.replicate(np.zeros(shape.labels, np.int32))
        args = self._args(empty_cache(m.config, 1, m.dtype), shape, a, MIN_CACHE, rows_arg)
        name, trials, _ = self.choice(shape)
        order = [name] + fallbacks(name, trials)
        for i, cand in enumerate(order):
            try:
                _packed.lower(*args, sequence=seq, attention=cand).compile()
                if cand not in ("dense", "blocked") or jax.default_backend() != "cpu":
                    jax.block_until_ready(_packed(*args, sequence=seq, attention=cand))
                break
            except Exception as e:  # noqa: BLE001  (a kernel this backend cannot build or run)
                if i + 1 == len(order):
                    raise
                warnings.warn(f"attention {cand!r} does not compile or run here ({error_line(e)}); "
                              f"using {order[i + 1]!r}", RuntimeWarning, stacklevel=2)
        self._warm[shape.program, seq] = cand
        return cand

    # -------------------------------------------------------------- main entry
    def score(self, pieces: PromptPieces, contexts, pairs, mode: str = "first_token") -> np.ndarray:
        """Label log-probs ``[N, n_classes]`` of every (context, query) pair.

        pieces: tokenized demos and queries; contexts: ``[M, i]`` demo indices
        (ordered); pairs: ``[N, 2]`` (context index, query index). Equal, to float
        rounding, to :func:`score_plain` on the same inputs."""
        return self.score_jobs(pieces, {"job": (contexts, pairs)}, mode)["job"]

    def score_jobs(self, pieces: PromptPieces, jobs: dict, mode: str = "first_token",
                   on_done=None) -> dict:
        """Label log-probs of several jobs scored together: ``jobs`` maps a tag to
        ``(contexts [M, i], pairs [N, 2])`` (sizes may differ); returns tag ->
        ``[N, n_classes]``. ``on_done(tag, scores)`` is called as soon as a job's
        last query row is scored (jobs of small contexts finish first), so a caller
        can keep each job's result before the others end.

        Host work is table lookups, and each call's result is fetched after the next
        call has been dispatched, so the host never waits on the call it has just
        sent. :attr:`stats` says where the time went.
        """
        checked = {t: _check_inputs(self.model, pieces, c, p, mode) for t, (c, p) in jobs.items()}
        t0 = time.perf_counter()
        n = len(pieces.labels)
        seq = mode == "sequence"
        nr = n if seq else 1
        st = self.stats = EngineStats()
        tags = [t for t, (_, p) in checked.items() if len(p)]
        results = {t: np.zeros((0, n), np.float32) for t, (_, p) in checked.items() if not len(p)}
        if not tags:
            return results
        sched = self.plan(pieces, [checked[t] for t in tags], mode)
        st.shape, st.programs = sched.shape, len(sched.programs)
        tok = _Tokens(pieces, mode)
        rows_arg = None
        if not seq:  # label rows padded to the shape's count: one program for every dataset
            first = [l[0] for l in pieces.labels]
            rows_arg = self.model.replicate(np.asarray(first + first[:1] * (sched.shape.labels - n),
                                                       np.int32))
        sizes = np.asarray([len(checked[t][1]) * nr for t in tags])
        run = _Run(sched, tok, seq, n, np.r_[0, np.cumsum(sizes)], on_done, tags, results)
        st.plan_s = time.perf_counter() - t0
        bar = None
        if self.progress:
            bar = tqdm(total=int(sizes.sum()), unit="query", desc="scoring", leave=False)
        try:
            with CompileMeter() as meter:
                t = time.perf_counter()
                attention = self.compile(sched.shape, mode)
                # Choosing the attention runs candidates and the program once: wall time
                # beyond the meter's compiles, all of it before the first call.
                warm, warm_compiles = time.perf_counter() - t, meter.seconds
                loop = self._run(run, rows_arg, bar, attention)
        finally:
            if bar is not None:
                bar.close()
        st.attention = attention
        _, trials, st.attention_from_cache = self.choice(sched.shape)
        st.attention_trials = [t.to_json() for t in trials]
        st.compiled, st.cache_hits = meter.count()
        st.model_compiled = meter.count("_packed")[0]
        # Compiles happen inside dispatches: what the meter saw in the loop is compile
        # time, not forward time.
        in_loop = max(0.0, meter.seconds - warm_compiles)
        st.compile_s = warm + in_loop
        st.forward_s = max(0.0, loop - st.host_s - in_loop)
        st.seconds = time.perf_counter() - t0
        return {t: results[t] for t in jobs}

    def _run(self, run: _Run, rows_arg, bar, attention: str) -> float:
        """Every call of the schedule, chunk by chunk and depth by depth; returns the
        loop's seconds (host work in ``stats.host_s``)."""
        m, st, sched = self.model, self.stats, run.sched
        t_loop = time.perf_counter()
        pending = None
        for ci, ch in enumerate(sched.trie):
            parent = empty_cache(m.config, 1, m.dtype)
            for stage in sched.chunks[ci]:
                d = stage.depth
                level = self._level(sched, ci, d) if d <= ch.depth else None
                for r0 in range(0, stage.rows, sched.shape.B):
                    t = time.perf_counter()
                    a = call_arrays(run.tok, sched.shape, stage, r0)
                    st.host_s += time.perf_counter() - t
                    res, kv = _packed(*self._args(parent, sched.shape, a, stage.S, rows_arg),
                                      sequence=run.seq, attention=attention)
                    if a["n_children"]:
                        rep = m.replicate
                        level = _write_children(level, parent, kv, rep(a["child"]), rep(a["parent_row"]),
                                                rep(a["start"]), rep(a["length"]))
                    del kv
                    st.calls += 1
                    st.tokens += a["tokens_real"]
                    st.padded_tokens += a["tokens"].size
                    st.query_rows += a["query_rows"]
                    if pending is not None:
                        self._collect(run, *pending, bar)
                    pending = (res, a["dest"]) if len(a["dest"]) else None
                if level is not None:
                    st.nodes += ch.nodes(d)
                    parent = level
        if pending is not None:
            self._collect(run, *pending, bar)
        return time.perf_counter() - t_loop

    def _collect(self, run: _Run, res, dest, bar) -> None:
        """File one call's results (fetching them waits on the device: forward time)."""
        res = to_host(res)[:len(dest)]  # blocks only on an earlier call
        t = time.perf_counter()
        run.file(res, dest)
        if bar is not None:
            bar.update(len(np.unique(dest)))
        self.stats.host_s += time.perf_counter() - t


class _Run:
    """One :meth:`ScoringEngine.score_jobs` call's results as they come: the output
    rows of every job (``offsets``), the readouts each job still waits for, and the
    hand-over of a finished job (``on_done``)."""

    def __init__(self, sched: Schedule, tok: _Tokens, seq: bool, n: int, offsets, on_done, tags,
                 results):
        self.sched, self.tok, self.seq, self.n = sched, tok, seq, n
        self.offsets, self.on_done, self.tags, self.results = offsets, on_done, tags, results
        self.out = np.zeros((sched.n_out, n) if not seq else (sched.n_out,), np.float32)
        self.left = np.zeros(len(tags), np.int64)  # readouts still to come, per job
        for ch in sched.trie:
            for _, qrow, dest in ch.queries.values():
                job = np.searchsorted(offsets, dest, side="right") - 1
                np.add.at(self.left, job, tok.readouts[qrow])

    def file(self, res: np.ndarray, dest: np.ndarray) -> None:
        if self.seq:
            np.add.at(self.out, dest, res)
        else:
            self.out[dest] = res[:, :self.n]  # label rows past n are padding
        job = np.searchsorted(self.offsets, dest, side="right") - 1
        np.subtract.at(self.left, job, 1)
        for j in np.unique(job):
            if self.left[j] == 0:
                self._finished(int(j))

    def _finished(self, job: int) -> None:
        t, n = self.tags[job], self.n
        res = self.out[self.offsets[job]:self.offsets[job + 1]]
        self.results[t] = _label_logprobs(res.reshape(-1, n) if not self.seq else res, self.mode, n)
        if self.on_done is not None:
            self.on_done(t, self.results[t])

    @property
    def mode(self) -> str:
        return "sequence" if self.seq else "first_token"


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
    rows_arg = None if seq else model.replicate([l[0] for l in pieces.labels])
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
        put = model.put
        res = _score_flat(model.graphdef, model.state, put(tokens), put(valid), put(g),
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
