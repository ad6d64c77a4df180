"""The prefix-sharing trie engine (:class:`ScoringEngine`): label log-probs of many
(context, query) pairs, equal to float rounding to the plain path of
:mod:`sc_jax.scoring.reference`, whose label modes and checks it shares.

The engine computes every distinct ordered sub-context once: contexts are sorted so
that shared prefixes sit together, cut into chunks that fit ``max_cache_tokens``, and
within a chunk the trie is grown depth by depth, each node extending its parent's KV
cache by one demonstration (:mod:`sc_jax.scoring.schedule`). Every query of a context
is then scored against the context's cache in one batch. Every call has one of a few
shapes of the engine's memory policy (:func:`sc_jax.scoring.memory.call_shape`: B rows,
or half or a quarter of them, of W tokens after a fixed number of cached keys per row,
padded readouts and label rows: :func:`sc_jax.scoring.packing.row_ladder`), so a run
compiles a few programs (:func:`sc_jax.scoring.programs.packed_step`, one per call
size), the same for every dataset, and compiles them before the first call
(:meth:`ScoringEngine.compile`).

Device pipeline: every node's own keys and values go, once, into one preallocated
token pool (its size from the memory policy, kept by the engine and written in place,
donated); a call's cache is gathered from the pool at positions the host computes
(:func:`pool_arrays`: a node's ancestors' positions), and the gather, the model and
the write of the call's new keys are one program, whose shapes depend on neither the
data's lengths nor whether the call writes; host batches are row lookups into
tables packed once per call (:func:`call_arrays`); and each call's result is fetched
after the next one is dispatched, so the host never waits on the call it has just
sent. The token budgets
come from the device's memory (:mod:`sc_jax.scoring.memory`) unless given.
"""

from __future__ import annotations

import functools
import itertools
import time
from typing import Any, NamedTuple

import jax
import numpy as np

from sc_jax.models.loading import LoadedModel
from sc_jax.models.model import KVCache
from sc_jax.runtime.multihost import to_host
from sc_jax.runtime.progress import Bar
from sc_jax.runtime.sharding import kv_sharding, replicated
from sc_jax.runtime.timing import CompileMeter
from sc_jax.scoring.attention_choice import EngineAttention
from sc_jax.scoring.memory import MemoryPolicy, Planned, query_rows
from sc_jax.scoring.packing import MIN_CACHE, PackedDepth, PackShape
from sc_jax.scoring.programs import PackedInputs, empty_pool, packed_step
from sc_jax.scoring.prompts import PromptPieces
from sc_jax.scoring.reference import check_inputs, label_logprobs
from sc_jax.scoring.results import CallCounts, EngineStats, ScoreResult
from sc_jax.scoring.schedule import Chunk, Schedule


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

    def source(self, st: PackedDepth, it: slice) -> np.ndarray:
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


class CallArrays(NamedTuple):
    """The host arrays of one packed call: ``inputs``, the model program's packed rows;
    ``dest [R']``, the output index of each real readout; and counts:
    ``tokens_real`` (real tokens of the call) and ``query_rows``."""

    inputs: PackedInputs
    dest: np.ndarray
    tokens_real: int
    query_rows: int


def call_arrays(tok: _Tokens, shape: PackShape, st: PackedDepth, r0: int) -> CallArrays:
    """The host arrays of the call that runs rows ``r0 .. r0 + B`` of ``st``."""
    B, W, R = shape.B, shape.W, shape.R
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
    inputs = PackedInputs(tokens.reshape(B, W), positions.reshape(B, W), valid.reshape(B, W),
                          segment.reshape(B, W), slot.reshape(B, W), readout, targets)
    return CallArrays(inputs, st.dest[it][q][qi], int(lens.sum()), len(q))


def level_index(chunk: Chunk, d: int, parent: np.ndarray, level_len) -> np.ndarray:
    """``[nodes of depth d, S]``: the pool positions of each depth-d node's context
    in its cache slot of ``S = max(MIN_CACHE, level_len[d])`` keys: its parent's
    slot (``parent``, this for depth d - 1; depth 0: the empty root) then its own
    tokens, padded with position 0 (never written). The layout a trie level of whole
    rows would have; host data only."""
    S = max(MIN_CACHE, level_len[d])
    if d == 0:
        return np.zeros((1, S), np.int64)
    out = np.zeros((chunk.nodes(d), S), np.int64)
    par = chunk.parent[d]
    out[:, :level_len[d - 1]] = parent[par, :level_len[d - 1]]
    own = chunk.length[d] - chunk.length[d - 1][par]
    node, within = _spans(own)
    out[node, level_len[d - 1] + within] = chunk.start[d][node] + within
    return out


def pool_arrays(shape: PackShape, st: PackedDepth, r0: int, index: np.ndarray, chunk: Chunk,
                pool: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pool side of the call of rows ``r0 .. r0 + B`` of ``st``: ``src [B, keys]``,
    the pool positions of each row's cache (its slots' nodes' contexts, ``index``
    from :func:`level_index` of depth ``st.depth - 1``); ``key_slot [keys]``, the slot
    of each cached key (-1 past the slots); and ``dst [B x W]``, the pool position of
    each new token of a segment (``pool``, out of range, elsewhere: not written)."""
    B, W, keys, S, m = shape.B, shape.W, shape.cache, st.S, st.m
    nodes = st.slot_nodes[r0:r0 + B]
    src = np.zeros((B, keys), np.int32)
    src[:len(nodes), :m * S] = index[nodes].reshape(len(nodes), m * S)
    key_slot = np.full(keys, -1, np.int32)
    key_slot[:m * S] = np.repeat(np.arange(m), S)
    a, b = np.searchsorted(st.row, [r0, r0 + B])
    g = a + np.flatnonzero(st.kind[a:b] == 0)
    dst = np.full(B * W, pool, np.int32)
    if not len(g):  # query rows only: their keys are not kept
        return src, key_slot, dst
    lens = st.length[g]
    item, within = _spans(lens)
    dst[((st.row[g] - r0) * W + st.off[g])[item] + within] = \
        chunk.start[st.depth][st.node[g]][item] + within
    return src, key_slot, dst


def _padding_call(shape: PackShape) -> CallArrays:
    """The arrays of a call of ``shape`` that computes nothing (no valid token)."""
    B, W, R = shape.B, shape.W, shape.R
    z = np.zeros((B, W), np.int32)
    inputs = PackedInputs(z, z, np.zeros((B, W), bool), np.full((B, W), -1, np.int32), z,
                          np.zeros(R, np.int32), np.zeros(R, np.int32))
    return CallArrays(inputs, np.zeros(0, np.int64), 0, 0)


class ScoringEngine:
    """Prefix-shared, packed scoring of many (context, query) pairs.

    :meth:`score_jobs` scores several jobs (each ``(contexts, pairs)``) through one
    prefix trie, grown depth by depth in packed calls (:mod:`sc_jax.scoring.schedule`):
    every distinct ordered sub-context is computed once, and the segments and query
    rows of each depth are packed end to end into rows of ``W`` tokens.

    ``policy``: the :class:`sc_jax.scoring.memory.MemoryPolicy` that decides the memory
    budget and the call shape (default: :meth:`MemoryPolicy.resolve` of the other
    arguments and this model's mesh). ``max_tokens_per_batch``: cap on the tokens of
    one call (B x W; at least one row per device). ``max_cache_tokens``: tokens of
    the token pool, every node's own keys (the trie is cut into chunks that fit). Either left
    as None is derived from the memory budget: ``device_memory`` bytes per device if
    given, else the device's ``bytes_limit``, else (CPU) the host's memory. When a
    budget is known (given or reported by the device), the schedule's peak is
    checked against it before anything compiles, and a
    :class:`sc_jax.scoring.memory.PlanError` names the numbers if it cannot fit.
    ``attention``: the packed calls' attention, one of
    :data:`sc_jax.models.attention.IMPLEMENTATIONS`, or ``"auto"``: on an accelerator,
    each candidate timed on one layer at the call shape and the fastest that agrees with
    ``"dense"`` kept (:func:`sc_jax.scoring.attention_choice.choose_attention`; the
    decision is kept beside the persistent compilation cache, so a second process does
    not time again), on a CPU the block-sparse path. Where the attention does not
    compile or fails on its first run in the whole model program (a cuDNN that builds
    no plan, say), the engine says so in one warning and uses the next (the other
    trials that passed, fastest first, then ``"blocked"``, then ``"dense"``).
    ``progress``: a tqdm bar of query rows, on a terminal or in a notebook only
    (:class:`sc_jax.runtime.progress.Bar`).

    Every setting is fixed here; a call returns what it did (:class:`ScoreResult`)
    and changes nothing but the caches :meth:`__init__` names.
    """

    def __init__(self, model: LoadedModel, *, max_tokens_per_batch: int | None = None,
                 max_cache_tokens: int | None = None, device_memory: int | None = None,
                 policy: MemoryPolicy | None = None, attention: str = "auto",
                 progress: bool = True):
        self.model = model
        # As asked: "auto" is decided per call shape, the first time a shape comes, and
        # kept; what a call used is in its stats.
        self.attention = attention
        self.policy = policy or MemoryPolicy.resolve(
            device_memory, n_devices=model.n_devices, model_shards=model.model_shards,
            max_tokens_per_batch=max_tokens_per_batch, max_cache_tokens=max_cache_tokens)
        self.device_memory = self.policy.budget_bytes if self.policy.enforced else None
        self.progress = progress
        # Caches, filled as calls come (nothing else changes after construction): the
        # attention decided and built per call shape (the one place that decides it),
        # and the call shapes of the schedules scored, the last scored last, which later
        # plans keep where their items fit, so a process that met a longer item keeps
        # its wider program.
        self._attention = EngineAttention(attention, model.config, model.dtype,
                                          n_devices=model.n_devices, model_shards=model.model_shards)
        self._scored: dict[PackShape, None] = {}
        # The program of each call shape, pool size, label mode, hidden states and
        # attention, compiled ahead of time (:meth:`_step`).
        self._steps: dict[tuple, Any] = {}

    def plan(self, pieces: PromptPieces, jobs, mode: str) -> Planned:
        """The packed schedule of ``jobs`` (checked inputs) under this engine's policy,
        and the budgets it was made under. Assigns nothing; where an earlier
        :meth:`score_jobs` ran, the plan keeps the last scored call shape where the
        items fit (the ``_scored`` cache), so a process reuses its compiled program."""
        m = self.model
        prefer = next(reversed(self._scored), None)
        return self.policy.plan(m.config, m.dtype, pieces, jobs, mode, prefer=prefer)

    def _pool_of(self, tokens: int) -> KVCache:
        """An empty token pool of ``tokens`` positions (one per call of
        :meth:`score_jobs`, freed when it returns, so the device's memory is the fits'
        afterwards). A chunk writes every position it gathers before it gathers it, so
        the chunks of one call share it."""
        m = self.model
        sharding = None
        if m.mesh is not None:
            c = m.config
            kv = kv_sharding(m.mesh, (c.num_layers, 1, tokens, c.num_kv_heads, c.head_dim))
            sharding = KVCache(kv, kv, replicated(m.mesh), replicated(m.mesh))
        # Committed to its devices, as the compiled program's outputs are (:meth:`_step`):
        # the calls then see one kind of pool, before the first write and after it.
        return jax.tree.map(lambda a: jax.device_put(a, a.sharding),
                            empty_pool(m.config, tokens, m.dtype, sharding))

    def _args(self, a: CallArrays, src, key_slot, dst, rows_arg) -> tuple:
        """The device arguments of one call's program after the pool
        (:func:`sc_jax.scoring.programs.packed_step`): ``(src, key_slot, inputs, rows, dst)``."""
        m = self.model
        put, rep = m.put, m.replicate
        x = a.inputs
        inputs = PackedInputs(put(x.tokens), put(x.positions), put(x.valid), put(x.segment),
                              put(x.slot), rep(x.readout), rep(x.targets))
        return put(src), rep(key_slot), inputs, rows_arg, rep(dst)

    def choice(self, shape: PackShape) -> tuple[str, list, bool]:
        """The attention for calls of ``shape``: ``(name, trials, from_cache)``, decided
        once per shape (:meth:`sc_jax.scoring.attention_choice.EngineAttention.decide`)."""
        return self._attention.decide(shape)

    def compile(self, shape: PackShape, pool: KVCache, mode: str = "first_token", *,
                choose: PackShape | None = None, hidden: bool = False) -> tuple[str, KVCache]:
        """Compile the program of calls of ``shape`` (:func:`sc_jax.scoring.programs.packed_step`:
        gather, model and write) now, ahead of time (once per engine, shape and pool
        size), so that the first call of a depth times the forward pass only. Returns
        the attention it uses, as the engine's attention choice settles it
        (:meth:`sc_jax.scoring.attention_choice.EngineAttention.settle`: the decision
        for ``choose`` where given, as a schedule's smaller calls run its largest call's
        choice, and the next one where a candidate does not compile or run), and the
        pool to use from then on: the program donates ``pool``, so where a candidate is
        run once (on a call of padding that writes nothing) the pool is the one it
        returns, or a new empty one where the run failed. ``hidden``: the program that
        also returns the readouts' hidden states, a program of its own."""
        seq = mode == "sequence"
        if choose is not None:
            _, pool = self.compile(choose, pool, mode, hidden=hidden)
        m = self.model

        @functools.cache
        def args():
            return self._padding_args(shape, pool, seq)

        def build(name: str, run: bool) -> None:
            nonlocal pool
            step = self._step(shape, pool, seq, hidden, name, args())
            if run:
                try:
                    pool = jax.block_until_ready(step(m.state, pool, *args()))[1]
                except Exception:
                    if any(a.is_deleted() for a in jax.tree.leaves(pool)):  # donated
                        pool = self._pool_of(pool.k.shape[2])
                    raise

        name = self._attention.settle(shape, seq, build, like=choose, hidden=hidden)
        self._step(shape, pool, seq, hidden, name, args())  # settled with a pool of another size
        return name, pool

    def _padding_args(self, shape: PackShape, pool: KVCache, seq: bool) -> tuple:
        """The arguments after the pool (:meth:`_args`) of a call of ``shape`` that
        computes and writes nothing: what its program is compiled, and first run, with."""
        rows_arg = None if seq else self.model.replicate(np.zeros(shape.labels, np.int32))
        drop = np.full(shape.B * shape.W, pool.k.shape[2], np.int32)  # writes nothing
        return self._args(_padding_call(shape), np.zeros((shape.B, shape.cache), np.int32),
                          np.full(shape.cache, -1, np.int32), drop, rows_arg)

    def _lowered(self, shape: PackShape, pool: KVCache, seq: bool, hidden: bool, attention: str,
                 args: tuple | None = None):
        """The program of calls of ``shape`` on ``pool``'s size, traced and lowered, not
        compiled (``jax.stages.Lowered``; ``args``: :meth:`_padding_args`'s, made here
        where None). benchmarks/bench_compile_threads.py compiles these from threads."""
        m = self.model
        # Without hidden states the call is exactly the one every run makes (no
        # `hidden` argument), so its program and its cache entries are unchanged.
        extra = {"hidden": True} if hidden else {}
        args = self._padding_args(shape, pool, seq) if args is None else args
        return packed_step.lower(m.graphdef, m.state, pool, *args, sequence=seq,
                                 attention=attention, **extra)

    def _step(self, shape: PackShape, pool: KVCache, seq: bool, hidden: bool, attention: str,
              args: tuple):
        """The compiled program of calls of ``shape`` on ``pool``'s size, made once with
        ``args`` (those after the pool, :meth:`_args`). Which call sizes a seed's depths
        end in depends on its data, so :meth:`compile` makes every size's before the
        first call, and another seed's run finds the sizes this one did not use; the
        calls run this executable (:meth:`_run`)."""
        key = (shape.program, pool.k.shape, seq, hidden, attention)
        if key not in self._steps:
            self._steps[key] = self._lowered(shape, pool, seq, hidden, attention, args).compile()
        return self._steps[key]

    # -------------------------------------------------------------- main entry
    def score(self, pieces: PromptPieces, contexts, pairs, mode: str = "first_token", *,
              hidden: bool = False):
        """Label log-probs ``[N, n_classes]`` of every (context, query) pair.

        pieces: tokenized demos and queries; contexts: ``[M, i]`` demo indices
        (ordered); pairs: ``[N, 2]`` (context index, query index). Equal, to float
        rounding, to :func:`sc_jax.scoring.reference.score_plain` on the same inputs.
        With ``hidden``: ``(log-probs, states)``, ``states [N, D]`` float32 from the same
        forward pass (:meth:`score_jobs`)."""
        res = self.score_jobs(pieces, {"job": (contexts, pairs)}, mode, hidden=hidden)
        return (res.scores["job"], res.hidden["job"]) if hidden else res.scores["job"]

    def score_jobs(self, pieces: PromptPieces, jobs: dict, mode: str = "first_token",
                   on_done=None, planned: Planned | None = None, *,
                   hidden: bool = False) -> ScoreResult:
        """Label log-probs of several jobs scored together: ``jobs`` maps a tag to
        ``(contexts [M, i], pairs [N, 2])`` (sizes may differ); returns a
        :class:`ScoreResult`: tag -> ``[N, n_classes]``, where the time went
        (:class:`EngineStats`) and the plan. ``on_done(tag, scores)`` is called as
        soon as a job's last query row is scored (jobs of small contexts finish
        first), so a caller can keep each job's result before the others end.
        ``planned``: the schedule of exactly these jobs, made ahead under this engine's
        policy (as a run's plan holds it); None: planned here.

        ``hidden``: also return each pair's last hidden state, ``[N, D]`` float32 per job
        (:attr:`ScoreResult.hidden`): the final-norm state at the query's last token,
        which its label logits are projected from (in sequence mode, the first label
        row's first readout), read out of the same packed calls (same trie, same
        prefix sharing, log-probs unchanged) by model programs of their own; then
        ``on_done(tag, scores, states)``.

        Host work is table lookups, and each call's result is fetched after the next
        call has been dispatched, so the host never waits on the call it has just
        sent.
        """
        checked = {t: check_inputs(self.model, pieces, c, p, mode) for t, (c, p) in jobs.items()}
        t0 = time.perf_counter()
        n = len(pieces.labels)
        seq = mode == "sequence"
        nr = n if seq else 1
        tags = [t for t, (_, p) in checked.items() if len(p)]
        results = {t: np.zeros((0, n), np.float32) for t, (_, p) in checked.items() if not len(p)}
        D = self.model.config.hidden_size
        states = {t: np.zeros((0, D), np.float32) for t in results} if hidden else None
        if not tags:
            return ScoreResult({t: results[t] for t in jobs}, EngineStats(), None,
                               None if states is None else {t: states[t] for t in jobs})
        if planned is None:
            planned = self.plan(pieces, [checked[t] for t in tags], mode)
        sched = planned.schedule
        self._scored.pop(sched.shape, None)
        self._scored[sched.shape] = None  # the last scored last
        tok = _Tokens(pieces, mode)
        rows_arg = None
        if not seq:  # label rows padded to the shape's count: one program for every dataset
            first = [l[0] for l in pieces.labels]
            rows_arg = self.model.replicate(np.asarray(first + first[:1] * (sched.shape.labels - n),
                                                       np.int32))
        sizes = np.asarray([len(checked[t][1]) * nr for t in tags])
        run = _Run(sched, tok, seq, n, np.r_[0, np.cumsum(sizes)], on_done, tags, results, states, D)
        plan_s = time.perf_counter() - t0
        bar = None
        if self.progress:
            bar = Bar(total=int(sizes.sum()), unit="query", desc="scoring", leave=False)
        try:
            with CompileMeter() as meter:
                t = time.perf_counter()
                pool = self._pool_of(sched.pool)
                # Every call size, so that another dataset (whose depths end in other
                # sizes) finds its programs compiled.
                attention, pool = self.compile(sched.shape, pool, mode, hidden=hidden)
                sizes_used = {}
                for sh in sched.shapes:
                    sizes_used[sh.program], pool = self.compile(sh, pool, mode, choose=sched.shape,
                                                                hidden=hidden)
                # Choosing the attention runs candidates and the program once: wall time
                # beyond the meter's compiles, all of it before the first call.
                warm, warm_compiles = time.perf_counter() - t, meter.seconds
                loop, counts = self._run(run, pool, rows_arg, bar, sizes_used)
        finally:
            if bar is not None:
                bar.close()
        stats = self._stats(sched, counts, meter, attention, t0=t0, plan_s=plan_s, warm=warm,
                            warm_compiles=warm_compiles, loop=loop)
        return ScoreResult({t: results[t] for t in jobs}, stats, planned,
                           None if states is None else {t: states[t] for t in jobs})

    def _stats(self, sched: Schedule, counts: CallCounts, meter: CompileMeter, attention: str, *,
               t0: float, plan_s: float, warm: float, warm_compiles: float, loop: float) -> EngineStats:
        """A :meth:`score_jobs` call's stats, made once as it ends: the loop's ``counts``,
        the compiles the ``meter`` saw (``warm_compiles`` seconds of them before the
        loop, within ``warm`` seconds of getting the programs ready), the ``loop``'s
        seconds and the attention its calls ran."""
        _, trials, from_cache = self.choice(sched.shape)
        compiled, cache_hits = meter.count()
        # Compiles happen inside dispatches: what the meter saw in the loop is compile
        # time, not forward time.
        in_loop = max(0.0, meter.seconds - warm_compiles)
        return EngineStats(
            **counts._asdict(), programs=len(sched.programs), shape=sched.shape, plan_s=plan_s,
            compile_s=warm + in_loop, forward_s=max(0.0, loop - counts.host_s - in_loop),
            compiled=compiled, model_compiled=meter.count("packed_step")[0], cache_hits=cache_hits,
            attention=attention, attention_trials=[t.to_json() for t in trials],
            attention_from_cache=from_cache, seconds=time.perf_counter() - t0)

    def _run(self, run: _Run, pool: KVCache, rows_arg, bar, attention: dict) -> tuple[float, CallCounts]:
        """Every call of the schedule (:meth:`Schedule.calls`: chunk by chunk, depth by
        depth), each by the program :meth:`compile` made for its size, with the attention
        ``attention`` maps its size to, on ``pool`` (donated, the next call's the one it
        returns); returns the loop's seconds and what its calls did."""
        sched = run.sched
        t_loop = time.perf_counter()
        counts = CallCounts()
        pending, at, index = None, None, None
        hidden, state = run.states is not None, self.model.state
        for ci, packed, r0, shape in sched.calls():
            t = time.perf_counter()
            ch, d = sched.trie[ci], packed.depth
            nodes = 0
            if at != (ci, d):  # a new depth reads the nodes of depth d - 1
                index = self._index(sched, ci, d, index if at == (ci, d - 1) else None)
                at = (ci, d)
                nodes = ch.nodes(d) if d <= ch.depth else 0
            a = call_arrays(run.tok, shape, packed, r0)
            src, key_slot, dst = pool_arrays(shape, packed, r0, index, ch, sched.pool)
            host = time.perf_counter() - t
            step = self._steps[shape.program, pool.k.shape, run.seq, hidden, attention[shape.program]]
            res, pool = step(state, pool, *self._args(a, src, key_slot, dst, rows_arg))
            counts = counts.plus(calls=1, tokens=a.tokens_real, padded_tokens=a.inputs.tokens.size,
                                 nodes=nodes, query_rows=a.query_rows, host_s=host)
            if pending is not None:
                counts = counts.plus(host_s=self._collect(run, *pending, bar))
            pending = (res, a.dest) if len(a.dest) else None
        if pending is not None:
            counts = counts.plus(host_s=self._collect(run, *pending, bar))
        return time.perf_counter() - t_loop, counts

    @staticmethod
    def _index(sched: Schedule, ci: int, d: int, prev: np.ndarray | None) -> np.ndarray:
        """Level d - 1's index of chunk ``ci`` (:func:`level_index`), from ``prev``,
        level d - 2's, where given."""
        ch, lens = sched.trie[ci], sched.level_len
        if prev is not None:
            return level_index(ch, d - 1, prev, lens)
        index = level_index(ch, 0, None, lens)
        for j in range(1, d):
            index = level_index(ch, j, index, lens)
        return index

    @staticmethod
    def _collect(run: _Run, res, dest, bar) -> float:
        """File one call's results (fetching them waits on the device: forward time);
        returns the host's seconds filing them."""
        res, states = res if isinstance(res, tuple) else (res, None)
        res = to_host(res)[:len(dest)]  # blocks only on an earlier call
        if states is not None:
            states = to_host(states)[:len(dest)]
        t = time.perf_counter()
        run.file(res, dest, states)
        if bar is not None:
            bar.update(len(np.unique(dest)))
        return time.perf_counter() - t


class _Run:
    """One :meth:`ScoringEngine.score_jobs` call's results as they come: the output
    rows of every job (``offsets``), the readouts each job still waits for, the
    hand-over of a finished job (``on_done``); with ``states`` (a dict to fill, else
    None) every pair's hidden state ``[D]`` too."""

    def __init__(self, sched: Schedule, tok: _Tokens, seq: bool, n: int, offsets, on_done, tags,
                 results, states=None, D: int = 0):
        self.sched, self.tok, self.seq, self.n = sched, tok, seq, n
        self.offsets, self.on_done, self.tags, self.results = offsets, on_done, tags, results
        self.out = np.zeros((sched.n_out, n) if not seq else (sched.n_out,), np.float32)
        self.states, self.nr = states, n if seq else 1  # nr: output rows per pair
        if states is not None:
            self.hid = np.zeros((sched.n_out // self.nr, D), np.float32)
        self.left = np.zeros(len(tags), np.int64)  # readouts still to come, per job
        for ch in sched.trie:
            for _, qrow, dest in ch.queries.values():
                job = np.searchsorted(offsets, dest, side="right") - 1
                np.add.at(self.left, job, tok.readouts[qrow])

    def file(self, res: np.ndarray, dest: np.ndarray, states: np.ndarray | None = None) -> None:
        if states is not None:
            self._file_states(states, dest)
        if self.seq:
            np.add.at(self.out, dest, res)
        else:
            self.out[dest] = res[:, :self.n]  # label rows past n are padding
        job = np.searchsorted(self.offsets, dest, side="right") - 1
        np.subtract.at(self.left, job, 1)
        for j in np.unique(job):
            if self.left[j] == 0:
                self._finished(int(j))

    def _file_states(self, states: np.ndarray, dest: np.ndarray) -> None:
        """A pair's state is its first output row's first readout, the query's last
        token: a row's readouts are consecutive within one call, first one first; in
        sequence mode every label row of a pair holds the same query, its first is kept."""
        rows, first = np.unique(dest, return_index=True)
        keep = rows % self.nr == 0
        self.hid[rows[keep] // self.nr] = states[first[keep]]

    def _finished(self, job: int) -> None:
        t, n = self.tags[job], self.n
        res = self.out[self.offsets[job]:self.offsets[job + 1]]
        self.results[t] = label_logprobs(res.reshape(-1, n) if not self.seq else res, self.mode, n)
        done = (t, self.results[t])
        if self.states is not None:
            a, b = self.offsets[job] // self.nr, self.offsets[job + 1] // self.nr
            self.states[t] = self.hid[a:b].copy()
            done += (self.states[t],)
        if self.on_done is not None:
            self.on_done(*done)

    @property
    def mode(self) -> str:
        return "sequence" if self.seq else "first_token"
