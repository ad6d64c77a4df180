"""Dry run of ``sc-jax run`` (:func:`plan_run`): what a run would score and what it
needs, with no weights read and nothing scored.

:func:`plan_run` builds each seed's scoring jobs as the experiment does
(:func:`sc_jax.experiment.seed_jobs`) and plans them together, as ONE engine call
(:meth:`sc_jax.scoring.ScoringEngine.score_jobs`) scores them: one prefix trie over
every job of the seed, packed into calls of one shape (:func:`engine_plan`, the
engine's own :func:`sc_jax.schedule.plan_schedule`). :func:`replay` walks that
schedule call by call and counts tokens (unique, executed with padding, per stage:
trie depth) and FLOPs; :func:`xla_call_bytes` lowers the engine's model program
(:func:`sc_jax.scoring._packed`) with abstract shapes (``jax.ShapeDtypeStruct``:
nothing is allocated, no weights are read) and reads XLA's ``memory_analysis()``,
and :func:`compile_seconds` compiles every distinct model program (one per cache
bucket) that way to measure what compiling costs on this machine.

The random presets tokenize with a byte-level stand-in unless a real vocabulary of
theirs is available (:data:`sc_jax.loading.PRESET_TOKENIZERS`); the plan says which,
and for the stand-in measures how many more tokens it makes than the Qwen2 vocabulary
on the same prompts.

The memory model itself (:func:`plan_schedule`, :class:`Budgets`, :class:`PlanError`
and the rest) lives in :mod:`sc_jax.schedule`, below the engine, and stays importable
from here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from . import scoring
from .experiment import check_run, draw_split, load_datasets, run_policy, seed_jobs
from .loading import DTYPES, PRESET_TOKENIZERS, load_config_and_tokenizer
from .model import Decoder, KVCache
from .named_models import tokenizer_file
from . import attention as attn
from .packing import CostModel, PackShape, Roofline, Schedule, attention_reads, call_trips
from .pypi import WheelFileError
# The memory model (sc_jax.schedule), importable from here too.
from .schedule import (  # noqa: F401
    ACTIVATION_SHARE, MAX_TOKENS_PER_BATCH, RESERVE, Budgets, MemoryPolicy, PlanError, Planned,
    device_memory_bytes, host_memory_bytes, kv_bytes_per_token, level_peak_tokens,
    packed_temp_bytes, plan_schedule, query_rows, weight_bytes)
from .sharding import kv_sharding, make_mesh, state_shardings
from .tokenizer import ByteTokenizer, Tokenizer

log = logging.getLogger(__name__)


# ------------------------------------------------------------------ the engine's schedule
def engine_plan(config, dtype, pieces, jobs, mode: str, *, policy: MemoryPolicy | None = None,
                **budget) -> Planned:
    """The packed schedule and budgets of ``jobs`` (a list of ``(contexts, pairs)``,
    those with no pairs left out, as the engine leaves them), exactly as
    :meth:`sc_jax.scoring.ScoringEngine.score_jobs` plans them under ``policy`` (or
    :func:`plan_schedule`'s keywords ``budget``: ``budget_bytes``, ``n_devices``, ...)."""
    jobs = [(np.asarray(c, np.int64), np.asarray(p, np.int64).reshape(-1, 2)) for c, p in jobs]
    jobs = [(c, p) for c, p in jobs if len(p)]
    if policy is not None:
        return policy.plan(config, dtype, pieces, jobs, mode)
    return plan_schedule(config, dtype, pieces, jobs, mode, **{"enforce": False, **budget})


def stage_name(depth: int) -> str:
    """``"d=3"``: the stage that continues the nodes of depth 2 (segments making
    depth-3 nodes, and query rows after contexts of 2 demonstrations)."""
    return f"d={depth}"


def replay(sched: Schedule, config, *, attention: str = "dense", platform: str = "default",
           itemsize: int = 4) -> dict[str, Any]:
    """Every call of ``sched`` as the engine runs it, counted: ``calls``, ``rows``
    (rows holding at least one item), ``unique_tokens`` (the items' real tokens: each
    trie node's segment once per chunk, every query row), ``executed_tokens`` (calls
    x B x W), ``padding_tokens``, ``programs`` (distinct model programs: one), and
    what the calls cost (:class:`CostModel`, activations of ``itemsize`` bytes, the
    packed calls' ``attention`` with ``platform``'s blocks): ``dense_flops``,
    ``dense_bytes``, ``attention_flops``, ``attention_bytes``, ``scored_keys`` (keys
    scored per executed token, on average) and ``flops`` (their sum); per stage
    (:func:`stage_name`, in depth order) the same with ``segment_tokens`` /
    ``query_tokens`` (the unique tokens of each kind), the stage's slot length ``S``
    and slots per row ``m``."""
    sh = sched.shape
    cost = CostModel.of(config, itemsize)
    bq, bk = attn.BLOCKS.get(platform, attn.BLOCKS["default"])
    bq, bk = (bq if sh.W % bq == 0 else sh.W), (bk if sh.cache % bk == 0 else sh.cache)
    stages: dict[str, dict] = {}
    for _, st, r0 in sched.calls():
        a, b = np.searchsorted(st.row, [r0, r0 + sh.B])
        lens = st.length[a:b]
        seg = int(lens[st.kind[a:b] == 0].sum())
        acc = stages.setdefault(stage_name(st.depth), {
            "S": st.S, "m": st.m, "calls": 0, "rows": 0, "unique_tokens": 0, "segment_tokens": 0,
            "query_tokens": 0, "executed_tokens": 0, "padding_tokens": 0, "flops": 0.0,
            "dense_flops": 0.0, "dense_bytes": 0.0, "attention_flops": 0.0, "attention_bytes": 0.0,
            "scored_keys": 0.0})
        trips = call_trips(st, r0, sh.B, sh.W, sh.cache, bq, bk) if attention == "blocked" else 0
        scored, reads = attention_reads(attention, W=sh.W, C=sh.cache, scored=trips, bq=bq)
        d_flops, d_bytes = cost.dense(sh.B, sh.W)
        a_flops, a_bytes = cost.attention(sh.B, sh.W, scored, reads, attention)
        acc["calls"] += 1
        acc["rows"] += min(sh.B, st.rows - r0)
        acc["unique_tokens"] += int(lens.sum())
        acc["segment_tokens"] += seg
        acc["query_tokens"] += int(lens.sum()) - seg
        acc["executed_tokens"] += sh.B * sh.W
        acc["dense_flops"] += d_flops
        acc["dense_bytes"] += d_bytes
        acc["attention_flops"] += a_flops
        acc["attention_bytes"] += a_bytes
        acc["scored_keys"] += scored * sh.B * sh.W
        acc["flops"] += d_flops + a_flops
    for acc in stages.values():
        acc["padding_tokens"] = acc["executed_tokens"] - acc["unique_tokens"]
        acc["scored_keys"] /= max(acc["executed_tokens"], 1)
    stages = dict(sorted(stages.items(), key=lambda kv: int(kv[0][2:])))
    total = {key: sum(s[key] for s in stages.values()) for key in (
        "calls", "rows", "unique_tokens", "executed_tokens", "padding_tokens", "flops", "dense_flops",
        "dense_bytes", "attention_flops", "attention_bytes")}
    total["scored_keys"] = sum(s["scored_keys"] * s["executed_tokens"] for s in stages.values()) \
        / max(total["executed_tokens"], 1)
    return dict(total, programs=len(sched.programs), attention=attention, stages=stages)


def flat_tokens(pieces, jobs, mode: str) -> int:
    """Tokens of every prompt of ``jobs`` in full (BOS, context, query row; in
    sequence mode each label's row after one copy of the context)."""
    nr = len(pieces.labels) if mode == "sequence" else 1
    rows, _, _ = query_rows(pieces, mode, range(len(pieces.queries)))
    qlen = np.asarray([len(r) for r in rows]).reshape(len(pieces.queries), nr).sum(1)
    seg = np.asarray([len(pieces.segment(j)) for j in range(len(pieces.demos))])
    total = 0
    for ctx, pairs in jobs:
        ctx, pairs = np.asarray(ctx), np.asarray(pairs).reshape(-1, 2)
        total += int((len(pieces.bos) + seg[ctx[pairs[:, 0]]].sum(1) + qlen[pairs[:, 1]]).sum())
    return total


# ------------------------------------------------------------------ XLA's figures
def _abstract_model(config, dtype):
    return nnx.split(nnx.eval_shape(lambda: Decoder(config, dtype=dtype, rngs=nnx.Rngs(0))))


def lower_call(config, dtype, shape: PackShape, *, mode: str = "first_token", mesh=None,
               attention: str = "dense"):
    """The engine's model program for calls of ``shape``, lowered with abstract shapes
    (``jax.ShapeDtypeStruct``: nothing allocated, no weight read), ready for
    ``.compile()``: the arguments of :func:`sc_jax.scoring._packed`, the gathered cache
    ``[L, B, cache, K, Dh]`` and the rows batch-sharded over the mesh's ``data``
    axis, readouts and label rows replicated; its packed attention ``attention``."""
    gd, st = _abstract_model(config, dtype)
    L, K, Dh = config.num_layers, config.num_kv_heads, config.head_dim
    B, W, keys, R = shape.B, shape.W, shape.cache, max(shape.R, 1)
    sds = jax.ShapeDtypeStruct
    if mesh is not None:
        st = jax.tree.map(lambda x, s: sds(x.shape, x.dtype, sharding=s), st, state_shardings(mesh, st))

    def shard(spec):
        if mesh is None:
            return None
        return NamedSharding(mesh, P(*spec))

    kv_shape = (L, B, keys, K, Dh)
    kv = sds(kv_shape, dtype, sharding=None if mesh is None else kv_sharding(mesh, kv_shape))
    rs = shard(("data",)) if B > 1 else shard(())

    def rows(*dims, d=jnp.int32):
        return sds(dims, d, sharding=rs)

    def flat(n, d=jnp.int32):
        return sds((n,), d, sharding=shard(()))

    seq = mode == "sequence"
    cache = KVCache(kv, kv, rows(B, keys), rows(B, keys, d=jnp.bool_))
    labels = None if seq else flat(max(shape.labels, 1))
    return scoring._packed.lower(gd, st, cache, rows(B, keys), rows(B, W), rows(B, W),
                                 rows(B, W, d=jnp.bool_), rows(B, W), rows(B, W), flat(R), flat(R),
                                 labels, sequence=seq, attention=attention)


def xla_call_bytes(config, dtype, shape: PackShape, *, mode: str = "first_token",
                   mesh=None, attention: str = "dense") -> dict[str, int]:
    """Compile the engine's model program (calls of ``shape``) with abstract shapes and return XLA's ``memory_analysis()``: argument, output, temp and alias
    bytes (per device).

    On CPU, XLA computes bfloat16 dots in float32 and hoists the conversion of every
    layer's stacked weights out of the layer loop (a float32 copy of all weights in
    temp); a GPU or TPU does neither. For a bfloat16 model on CPU the program is
    compiled with while-loop-invariant code motion disabled, which leaves one
    layer's float32 copy in temp (within the margin the tests state).
    """
    lowered = lower_call(config, dtype, shape, mode=mode, mesh=mesh, attention=attention)
    opts = None
    if jax.default_backend() == "cpu" and jnp.dtype(dtype) == jnp.bfloat16:
        opts = {"xla_disable_hlo_passes": "while-loop-invariant-code-motion"}
    m = lowered.compile(compiler_options=opts).memory_analysis() if opts else \
        lowered.compile().memory_analysis()
    return dict(argument_bytes=int(m.argument_size_in_bytes), output_bytes=int(m.output_size_in_bytes),
                temp_bytes=int(m.temp_size_in_bytes), alias_bytes=int(m.alias_size_in_bytes))


def xla_peak_bytes(config, dtype, planned: Planned, *, model_shards: int = 1, **kw) -> dict[str, Any]:
    """XLA's peak for the model program of a schedule: arguments (the weights,
    the gathered cache, the packed rows) + outputs + temps - aliased bytes, plus the
    trie levels resident beside the program (``level_peak_tokens`` x KV bytes per
    token, as in the planned peak), beside ``planned_peak_of_that_call``: the planned
    figure for the same program (weights + levels + :func:`packed_temp_bytes`), and
    XLA's four figures as ``xla_argument_bytes``, ``xla_output_bytes``,
    ``xla_temp_bytes`` and ``xla_alias_bytes``."""
    sched, b = planned.schedule, planned.budgets
    sh = sched.shape
    m = xla_call_bytes(config, dtype, sh, **kw)
    resident = b.cache_bytes
    peak = m["argument_bytes"] + m["output_bytes"] + m["temp_bytes"] - m["alias_bytes"] + resident
    temp = packed_temp_bytes(config, dtype, sh.B, sh.W, sh.cache, R=sh.R,
                             sequence=kw.get("mode") == "sequence",
                             model_shards=model_shards)
    return {"xla_peak_bytes": int(peak),
            "planned_peak_of_that_call": int(b.weight_bytes + resident + temp),
            "xla_program": {"B": sh.B, "W": sh.W, "cache": sh.cache, "R": sh.R, "labels": sh.labels},
            **{f"xla_{key}": v for key, v in m.items()}}


# ------------------------------------------------------------------ compile time
_CACHE_HIT = "/jax/compilation_cache/cache_hits"
_CACHE_SAVED = "/jax/compilation_cache/compile_time_saved_sec"
_CACHE_READ = "/jax/compilation_cache/cache_retrieval_time_sec"


@contextlib.contextmanager
def _cache_events():
    """JAX's persistent-cache events while the block runs: ``hits`` and, for a hit,
    the compile time stored with the entry (``saved`` + ``read``)."""
    seen = {"hits": 0, "saved": 0.0, "read": 0.0}

    def event(name, **_):
        if name == _CACHE_HIT:
            seen["hits"] += 1

    def duration(name, secs, **_):
        if name in (_CACHE_SAVED, _CACHE_READ):
            seen["saved" if name == _CACHE_SAVED else "read"] += secs

    jax.monitoring.register_event_listener(event)
    jax.monitoring.register_event_duration_secs_listener(duration)
    try:
        yield seen
    finally:
        jax.monitoring.unregister_event_listener(event)
        jax.monitoring.unregister_event_duration_listener(duration)


def compile_call_seconds(config, dtype, shape: PackShape, **kw) -> dict[str, Any]:
    """Trace, lower and compile the engine's model program (calls of ``shape``;
    abstract shapes, the default compiler options, as the engine compiles it) on this
    backend. Returns ``seconds`` (what compiling it costs: where JAX's persistent
    compilation cache served it, the compile time stored with the entry),
    ``wall_seconds`` (what this call took) and ``cached`` (served from that cache)."""
    t0 = time.perf_counter()
    lowered = lower_call(config, dtype, shape, **kw)
    t1 = time.perf_counter()
    with _cache_events() as ev:
        lowered.compile()
    t2 = time.perf_counter()
    cached = ev["hits"] > 0
    compile_s = ev["saved"] + ev["read"] if cached else t2 - t1
    return {"seconds": (t1 - t0) + compile_s, "wall_seconds": t2 - t0, "cached": cached}


def compile_seconds(config, dtype, shape: PackShape, *, measured: dict, mode: str, mesh=None,
                    progress: bool = False, attention: str = "dense") -> dict[str, Any]:
    """Compile seconds of the engine's model program for calls of ``shape`` (the
    model-free gathers and writes beside it compile in milliseconds and are left
    out): ``programs``, ``compile_seconds``, ``compile_wall_seconds`` and
    ``compile_cache_hits``. ``measured`` (program -> figures) carries programs
    already compiled by this plan, so a program two settings share is compiled once
    and counted once (``programs`` 0 where it was)."""
    program = (shape.program, mode)
    out = {"programs": 0, "compile_seconds": 0.0, "compile_wall_seconds": 0.0,
           "compile_cache_hits": 0}
    if program in measured:
        return out
    m = measured[program] = compile_call_seconds(config, dtype, shape, mode=mode, mesh=mesh,
                                                 attention=attention)
    if progress:
        log.info("  compiled B=%d W=%d cache=%d R=%d labels=%d in %.1f s%s", *program[0], m["seconds"],
                 f" (served from the persistent cache in {m['wall_seconds']:.1f} s)"
                 if m["cached"] else "")
    return {"programs": 1, "compile_seconds": m["seconds"], "compile_wall_seconds": m["wall_seconds"],
            "compile_cache_hits": int(m["cached"])}


# ------------------------------------------------------------------ a whole run
#: Dense bfloat16 peak of one H100 SXM (NVIDIA's datasheet).
H100_BF16_PEAK_FLOPS = 989e12
#: Dense bfloat16 peaks (datasheets) of accelerators by name, for `plan`'s time
#: estimate: `--accelerator NAME`, or the local device when its kind names one.
ACCELERATOR_PEAK_FLOPS = {"h100": H100_BF16_PEAK_FLOPS, "h200": H100_BF16_PEAK_FLOPS,
                          "a100": 312e12, "l4": 121e12, "v100": 125e12}


def measured_matmul_flops(dtype=jnp.float32, n: int | None = None, repeats: int = 5) -> float:
    """FLOP/s of a square matrix product on the default device: the median of
    ``repeats`` timings after one compile, the best over the sizes tried.

    On a CPU one ``[n, n] @ [n, n]`` product per timing (``n`` 1024 by default; about
    0.3 s on 2 cores). On an accelerator 4096- and 8192-square products (``n`` is not
    used), 10 dispatched back to back per timing: a single 2048-square product is
    about 20 us there, no longer than its dispatch, and read as 115 TFLOP/s on an
    H200 whose bf16 products reach about 860.
    """
    if jax.default_backend() == "cpu":
        sizes, per_timing = (n or 1024,), 1
    else:
        sizes, per_timing = (4096, 8192), 10
    f = jax.jit(lambda x: x @ x)
    best = 0.0
    for size in sizes:
        a = jnp.full((size, size), 0.5, dtype)
        f(a).block_until_ready()
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            jax.block_until_ready([f(a) for _ in range(per_timing)])
            times.append((time.perf_counter() - t) / per_timing)
        best = max(best, 2 * size ** 3 / float(np.median(times)))
    return best


#: Memory bandwidths (datasheets, bytes/s) of the accelerators of
#: :data:`ACCELERATOR_PEAK_FLOPS`, for the memory-bound parts of `plan`'s time estimate.
ACCELERATOR_BANDWIDTH = {"h100": 3.35e12, "h200": 4.8e12, "a100": 2.0e12, "l4": 0.3e12,
                         "v100": 0.9e12}


def measured_bandwidth(mib: int = 256, repeats: int = 5) -> float:
    """Memory bytes/s of the default device: ``x + 1`` over a float32 array of ``mib``
    MiB (read once, written once), the median of ``repeats`` timings after a compile."""
    n = mib * 2 ** 20 // 4
    f = jax.jit(lambda x: x + 1.0)
    x = jnp.zeros((n,), jnp.float32)
    f(x).block_until_ready()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        f(x).block_until_ready()
        times.append(time.perf_counter() - t)
    return 2 * n * 4 / float(np.median(times))


def _datasheet(table: dict, accelerator: str | None) -> tuple[float, str] | None:
    """(figure, accelerator) from a datasheet ``table`` (by lower-case name): for
    ``accelerator``, else for the local accelerator when its kind names one; None on a
    CPU or an accelerator the table does not know."""
    if accelerator is not None:
        key = accelerator.lower()
        if key not in table:
            raise ValueError(f"unknown accelerator {accelerator!r}; known: {', '.join(table)} "
                             "(or give --peak-tflops and --bandwidth-gbs)")
        return table[key], key.upper()
    dev = jax.local_devices()[0]
    kind = str(getattr(dev, "device_kind", dev.platform))
    if dev.platform != "cpu":
        for key, figure in table.items():
            if key in kind.lower():
                return figure, kind
    return None


def device_bandwidth(accelerator: str | None = None) -> tuple[float, str]:
    """(memory bytes/s per device, where it comes from), as :func:`device_peak_flops`:
    the datasheet of ``accelerator`` or of the local accelerator, else measured here."""
    hit = _datasheet(ACCELERATOR_BANDWIDTH, accelerator)
    if hit is not None:
        return hit[0], f"{hit[1]} datasheet"
    return measured_bandwidth(), f"measured on this {jax.default_backend()}"


def measured_attention(config, dtype, shape: PackShape, attention: str, *, platform: str = "default",
                       rows: int = 4, repeats: int = 5) -> float:
    """Seconds per scored (token, query head, key) of one layer's packed attention
    (:func:`sc_jax.attention.packed_attention`) on the default device, measured: a call
    of ``min(rows, B)`` rows of the ``shape``'s W tokens after its ``cache`` keys, cut
    into four slots three quarters full, items of 32 tokens; the median of ``repeats``
    timings after a compile. What calibrates `plan`'s attention time to this backend
    (the dense path's float32 scores cost more than their bytes on a CPU)."""
    c = config
    B, W, C = min(rows, shape.B), shape.W, shape.cache
    S = C // 4
    col = np.arange(W)
    slot = np.minimum(col * 4 // W, 3)
    seg = col // 32
    fill = (3 * S) // 4
    pos = fill + col - np.searchsorted(slot, slot)  # each slot's items continue its prefix
    cs = np.repeat(np.arange(4), S)
    cpos = np.tile(np.arange(S), 4)
    rep = lambda x, dt: jnp.asarray(np.broadcast_to(x, (B,) + x.shape), dt)  # noqa: E731
    masks = attn.packed_masks(rep(pos, jnp.int32), jnp.ones((B, W), bool), rep(seg, jnp.int32),
                         rep(slot, jnp.int32), rep(cpos, jnp.int32), rep(cpos < fill, bool),
                         rep(cs, jnp.int32), windows=False, implementation=attention,
                         platform=platform)
    key = jax.random.PRNGKey(0)
    q = jax.random.normal(key, (B, W, c.num_heads, c.head_dim), dtype)
    k = jax.random.normal(key, (B, W, c.num_kv_heads, c.head_dim), dtype)
    ck = jax.random.normal(key, (B, C, c.num_kv_heads, c.head_dim), dtype)
    f = jax.jit(lambda *a: attn.packed_attention(*a, implementation=attention))
    f(q, k, k, ck, ck, masks, 0).block_until_ready()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        f(q, k, k, ck, ck, masks, 0).block_until_ready()
        times.append(time.perf_counter() - t)
    trips = masks.trips
    scored = float(trips[0] * masks.bk + trips[1] * masks.bq) if trips is not None else float(C + W)
    return float(np.median(times)) / (B * W * c.num_heads * scored)


def device_peak_flops(accelerator: str | None = None, dtype=jnp.float32) -> tuple[float, str]:
    """(peak FLOP/s per device, where it comes from) for `plan`'s time estimate: the
    datasheet figure of ``accelerator`` (a key of :data:`ACCELERATOR_PEAK_FLOPS`), or
    of the local accelerator when its kind names one, else a matmul measured here
    (a CPU: an H100's figure would promise a CPU run hundreds of times too fast)."""
    hit = _datasheet(ACCELERATOR_PEAK_FLOPS, accelerator)
    if hit is not None:
        return hit[0], f"{hit[1]} datasheet, dense bf16"
    dev = jax.local_devices()[0]
    kind = str(getattr(dev, "device_kind", dev.platform))
    where = dev.platform if kind.lower() == dev.platform else f"{dev.platform} ({kind})"
    return measured_matmul_flops(dtype), f"matmul measured on this {where}"



def _non_embedding_params(config) -> int:
    return config.num_params() - config.vocab_size * config.hidden_size * (
        1 if config.tie_word_embeddings else 2)


@dataclasses.dataclass
class _Planner:
    """What every (dataset, k) of one plan shares."""

    run: Any
    config: Any
    dtype: Any
    tokenizer: Any
    reference: Any  # the Qwen2 tokenizer where the run's is a stand-in, else None
    policy: MemoryPolicy
    model_shards: int
    n_devices: int
    mesh: Any
    xla: bool
    compile_time: bool
    progress: bool
    attention: str = "dense"
    score_seconds: float | None = None  # measured per scored key (see measured_attention)
    measured: dict = dataclasses.field(default_factory=dict)


def _plan_setting(pl: _Planner, name: str, ds, k: int) -> dict[str, Any]:
    """One (dataset, k) of :func:`plan_run`, its first seed: every job of the seed in
    one schedule, as the engine scores them."""
    split = draw_split(ds, pl.run, k, pl.run.seeds[0])
    sj = seed_jobs(pl.tokenizer, ds, split, pl.run, k)
    jobs = list(sj.jobs.values())
    planned = engine_plan(pl.config, pl.dtype, sj.pieces, jobs, pl.run.mode, policy=pl.policy)
    sched, b = planned.schedule, planned.budgets
    r = replay(sched, pl.config, attention=pl.attention, platform=pl.policy.platform,
               itemsize=jnp.dtype(pl.dtype).itemsize)
    sh = sched.shape
    setting = {"attention": r["attention"], "scored_keys": r["scored_keys"],
        **{key: r[key] for key in ("dense_flops", "dense_bytes", "attention_flops", "attention_bytes")},
        "dataset": name, "k": k, "pairs": int(sum(len(p) for _, p in jobs)),
        "job_pairs": {tag: len(p) for tag, (_, p) in sj.jobs.items()},
        "unique_tokens": r["unique_tokens"], "executed_tokens": r["executed_tokens"],
        "padding_tokens": r["padding_tokens"],
        "executed_per_unique": r["executed_tokens"] / max(r["unique_tokens"], 1),
        "flat_tokens": flat_tokens(sj.pieces, jobs, pl.run.mode), "flops": r["flops"],
        "model_flops": 2 * _non_embedding_params(pl.config) * r["unique_tokens"],
        "calls": r["calls"], "rows": r["rows"], "chunks": len(sched.chunks), "programs": r["programs"],
        "shape": dataclasses.asdict(sh),
        "max_tokens_per_batch": b.max_tokens_per_batch, "max_cache_tokens": b.max_cache_tokens,
        "level_peak_tokens": level_peak_tokens(sched), "peak_bytes": b.peak_bytes,
        "weight_bytes": b.weight_bytes, "cache_bytes": b.cache_bytes, "temp_bytes": b.temp_bytes,
        "stages": r["stages"]}
    if pl.progress:
        log.info("  %s k=%d: %d jobs, %d pairs, %d calls of %d x %d tokens (%d cached keys per row), "
                 "%d programs", name, k, len(jobs), setting["pairs"], r["calls"], sh.B, sh.W, sh.cache,
                 r["programs"])
    if pl.reference is not None:
        ref = seed_jobs(pl.reference, ds, split, pl.run, k)
        setting["prompt_tokens"] = _prompt_tokens(sj.pieces, sj.jobs, pl.run.mode)
        setting["prompt_tokens_reference"] = _prompt_tokens(ref.pieces, ref.jobs, pl.run.mode)
        setting["stand_in_inflation"] = setting["prompt_tokens"] / setting["prompt_tokens_reference"]
    lowered = pl.mesh is not None or pl.model_shards * pl.n_devices == 1
    # The program as the engine compiles it; cuDNN's kernel compiles on a GPU only, so
    # elsewhere its XLA figures are the dense path's (more temporaries, not fewer).
    lowered_attention = pl.attention if pl.attention != "cudnn" or jax.default_backend() == "gpu" \
        else "dense"
    kw = {"mode": pl.run.mode, "mesh": pl.mesh, "attention": lowered_attention}
    setting["xla_attention"] = lowered_attention
    if pl.compile_time and lowered:
        setting.update(compile_seconds(pl.config, pl.dtype, sh, measured=pl.measured,
                                       progress=pl.progress, **kw))
    if pl.xla and lowered:
        setting.update(xla_peak_bytes(pl.config, pl.dtype, planned, model_shards=pl.model_shards, **kw))
    return setting


def plan_run(run_config, *, device_memory: int | None = None, n_devices: int | None = None,
             model_shards: int | None = None, peak_flops: float | None = None, mfu: float = 0.4, xla: bool = True,
             compile_time: bool = True, progress: bool = False,
             accelerator: str | None = None, bandwidth: float | None = None,
             attention: str = "auto") -> dict[str, Any]:
    """A dry run of ``sc-jax run``: what one seed of every (dataset, k) would score,
    with no weights read and nothing scored. Every job of the seed (base, cc, dc,
    surrogate and test-time sizes) is planned together, as one engine call scores
    them (:func:`engine_plan`). Returns a JSON-able dict with, per (dataset, k):
    ``pairs`` (``job_pairs``: per job tag), ``unique_tokens`` (what the trie
    computes), ``executed_tokens`` (calls x B x W, what the device runs),
    ``padding_tokens`` (their difference), ``flat_tokens`` (full prompts), FLOPs,
    ``calls``, ``chunks``, the call ``shape``
    (B, W, cache, R, C, labels), the distinct model ``programs`` (one), the planned
    ``peak_bytes`` and its parts (``weight_bytes``, ``cache_bytes`` for the resident
    trie levels, ``temp_bytes`` for one call), per stage (:func:`stage_name`: trie
    depth) the same token counts (:func:`replay`), and:

    * ``xla=True``: XLA's ``xla_peak_bytes`` for the model program and the plan's
      figure for it (``planned_peak_of_that_call``);
    * ``compile_time=True``: ``compile_seconds``, the model program traced,
      lowered and compiled with abstract shapes on this backend (:func:`compile_seconds`;
      a CPU's figure, not a GPU's); a figure of its own, never added to the forward time;
    * ``forward_seconds_per_seed`` = ``dense_seconds_per_seed`` +
      ``attention_seconds_per_seed``: each part of every call on a roofline
      (:class:`sc_jax.packing.Roofline`), FLOPs at ``mfu`` of ``peak_flops`` per device
      (None: :func:`device_peak_flops`; ``peak_source`` says where it comes from), bytes
      at ``bandwidth`` (None: :func:`device_bandwidth`; ``bandwidth_source``), the
      attention that of the engine on that device (``attention``; "auto":
      :func:`sc_jax.attention.choose`), its scored keys and memory traffic counted per
      call (:class:`sc_jax.packing.CostModel`);
    * ``tokenizer`` (real or the byte stand-in) and, for the stand-in,
      ``stand_in_inflation``: its prompt tokens over the Qwen2 vocabulary's on the same
      prompts (first seed), where that vocabulary is on this machine.

    ``flops`` is what the device executes (every row of every call, padding and
    masked attention keys included); ``model_flops`` is 2 x non-embedding parameters
    x unique tokens, the usual numerator of MFU. Seeds repeat the same work with other
    demonstrations, so totals multiply the first seed's figures by the number of seeds.
    ``device_memory``, ``n_devices``, ``model_shards``: in place of the run's own
    ``device_memory``, ``mesh_devices`` and ``mesh_model``.
    """
    # NaN, 0 or a negative here would print "about nan min" or divide by zero after the
    # whole plan: refused first.
    if not 0 < mfu <= 1:
        raise ValueError(f"mfu (--mfu) is the fraction of the peak reached, in (0, 1], got {mfu}")
    for option, value, unit in (("peak_flops (--peak-tflops)", peak_flops, 1e12),
                                ("bandwidth (--bandwidth-gbs)", bandwidth, 1e9)):
        if value is not None and not 0 < value < math.inf:
            raise ValueError(f"{option} must be a positive number, got {value / unit:g}")
    datasets = load_datasets(run_config)  # bad data files fail before the model is read
    config, tokenizer = load_config_and_tokenizer(run_config.model)
    dtype = DTYPES[run_config.dtype]
    peak_flops_given, bandwidth_given = peak_flops, bandwidth
    if peak_flops is None:
        peak_flops, peak_source = device_peak_flops(accelerator, dtype)
    else:
        peak_source = "given"
    if bandwidth is None:
        bandwidth, bandwidth_source = device_bandwidth(accelerator)
    else:
        bandwidth_source = "given"
    if attention == "auto":
        attention = attn.choose("gpu" if accelerator else jax.default_backend(), dtype)
    # The attention's time is measured on this backend when the plan is for it (no
    # named accelerator, no given peak); else it is the roofline's.
    calibrate = accelerator is None and peak_flops_given is None and bandwidth_given is None
    # The run's own memory policy: its device memory (or the device's figure) and mesh;
    # the keywords stand in for the run's own fields.
    over = {key: v for key, v in (("device_memory", device_memory), ("mesh_devices", n_devices),
                                  ("mesh_model", model_shards)) if v is not None}
    run_config = dataclasses.replace(run_config, **over) if over else run_config
    # A dry run: every process computes the same plan and process 0 reports it, so no
    # collective over the processes' memory figures.
    policy = run_policy(run_config, agree=False)
    n_devices, model_shards, budget = policy.n_devices, policy.model_shards, policy.budget_bytes
    mesh = None
    if n_devices * model_shards > 1 and (xla or compile_time) and len(jax.devices()) >= n_devices * model_shards:
        mesh = make_mesh(n_devices, model=model_shards)
    reference, why = _reference_tokenizer() if isinstance(tokenizer, ByteTokenizer) else (None, "")
    out = dict(model=run_config.model, dtype=run_config.dtype, budget_bytes=int(budget),
               attention_source=f"{attention} attention on the roofline (scores' memory traffic "
                                "counted, not measured)",
               n_devices=n_devices, model_shards=model_shards,
               weight_bytes=weight_bytes(config, dtype, model_shards),
               kv_bytes_per_token=kv_bytes_per_token(config, dtype, model_shards),
               peak_flops=peak_flops, peak_source=peak_source, mfu=mfu, attention=attention,
               bandwidth=bandwidth, bandwidth_source=bandwidth_source,
               seeds=len(run_config.seeds), context_window=config.max_position_embeddings,
               tokenizer=_tokenizer_label(run_config.model, tokenizer),
               compile_backend=_backend_name(),
               settings=[])
    if why:
        out["stand_in_inflation_missing"] = why
    # The run's own up-front check, every seed: a prompt too long for the context
    # window is named (task, seed, row) before the memory plan would misread it.
    checked = {(c["dataset"], c["k"]): c
               for c in check_run(run_config, config, tokenizer, datasets, policy=policy)}
    pl = _Planner(run_config, config, dtype, tokenizer, reference, policy, model_shards,
                  n_devices, mesh, xla, compile_time, progress, attention)
    for name, ds in datasets.items():
        for k in run_config.shots:
            if ds.n_classes > k:
                out["settings"].append(dict(dataset=name, k=k, skipped=True))
                continue
            setting = _plan_setting(pl, name, ds, k)
            if calibrate and pl.score_seconds is None:
                # The attention's pace measured here, at the run's call shape: a plan for
                # this machine's own backend (a named accelerator's is the roofline's).
                pl.score_seconds = measured_attention(
                    config, dtype, PackShape(**setting["shape"]), attention, platform=policy.platform)
                out["attention_source"] = (f"{attention} attention measured on this "
                                           f"{jax.default_backend()}: {pl.score_seconds * 1e12:.2f} "
                                           "ps per scored key and head")
            setting.update(longest_prompt=checked[name, k]["longest_prompt"],
                           longest_seed=checked[name, k]["longest_seed"])
            # The mesh's devices share the work: the peaks are per device.
            roof = Roofline(mfu * peak_flops * n_devices * model_shards,
                            bandwidth * n_devices * model_shards)
            setting["dense_seconds_per_seed"] = roof.seconds(setting["dense_flops"], setting["dense_bytes"])
            if pl.score_seconds:  # measured on this backend: per scored (token, head, key)
                setting["attention_seconds_per_seed"] = (
                    setting["scored_keys"] * setting["executed_tokens"] * config.num_heads
                    * config.num_layers * pl.score_seconds / (n_devices * model_shards))
            else:
                setting["attention_seconds_per_seed"] = roof.seconds(setting["attention_flops"],
                                                                     setting["attention_bytes"])
            setting["forward_seconds_per_seed"] = (setting["dense_seconds_per_seed"]
                                                   + setting["attention_seconds_per_seed"])
            out["settings"].append(setting)
    out.update(_run_totals(out["settings"], len(run_config.seeds), pl.measured))
    return out


#: The named model whose vocabulary (Qwen2's byte-level BPE, 152k tokens) measures how
#: many more tokens the byte-level stand-in of the random presets makes.
INFLATION_REFERENCE = "qwen2.5-0.5b"


def _tokenizer_label(source: str, tokenizer) -> str:
    if isinstance(tokenizer, ByteTokenizer):
        return "byte stand-in"
    name = source.split(":", 1)[1] if source.startswith("random:") else None
    if name in PRESET_TOKENIZERS:
        return f"real ({PRESET_TOKENIZERS[name]}'s tokenizer.json)"
    return "the model's own"


def _backend_name() -> str:
    """"cpu", or the platform with its device kind ("gpu (NVIDIA H100 80GB HBM3)")."""
    dev = jax.local_devices()[0]
    kind = str(getattr(dev, "device_kind", dev.platform))
    return dev.platform if kind.lower() == dev.platform else f"{dev.platform} ({kind})"


def _reference_tokenizer():
    """(Qwen2 tokenizer or None, why none): only files already on this machine, so a
    plan never starts a download for a comparison."""
    try:
        path = tokenizer_file(INFLATION_REFERENCE, fetch=False)
    except (OSError, ValueError, ImportError, WheelFileError) as e:
        return None, str(e).splitlines()[0]
    if path is None:
        return None, (f"the {INFLATION_REFERENCE} vocabulary is not on this machine "
                      f"(`sc-jax info {INFLATION_REFERENCE}` fetches it)")
    return Tokenizer.from_file(path), ""


def _prompt_tokens(pieces, jobs, mode: str) -> int:
    """Tokens of every prompt the jobs score, in full."""
    return int(sum(pieces.prompt_lengths(ctx, pairs, mode).sum() for ctx, pairs in jobs.values()))



def _run_totals(settings: list[dict], seeds: int, measured: dict) -> dict[str, Any]:
    """The plan's totals: forward time and FLOPs over every seed, the stand-in's
    inflation over all settings, and the run's distinct programs (a program two
    settings share compiles once) with their compile seconds."""
    done = [s for s in settings if not s.get("skipped")]
    out = {"total_forward_seconds": sum(s["forward_seconds_per_seed"] for s in done) * seeds,
           "total_attention_seconds": sum(s["attention_seconds_per_seed"] for s in done) * seeds,
           "total_flops": sum(s["flops"] for s in done) * seeds}
    ref = sum(s.get("prompt_tokens_reference", 0) for s in done)
    if ref:
        out["stand_in_inflation"] = sum(s["prompt_tokens"] for s in done) / ref
    if measured:
        out.update(programs=len(measured),
                   compile_seconds=sum(m["seconds"] for m in measured.values()),
                   compile_wall_seconds=sum(m["wall_seconds"] for m in measured.values()),
                   compile_cache_hits=sum(int(m["cached"]) for m in measured.values()))
    return out


def _tokenizer_line(plan: dict[str, Any]) -> str:
    tok = plan.get("tokenizer", "byte stand-in")
    if tok != "byte stand-in":
        return f"tokenizer: {tok}"
    if "stand_in_inflation" in plan:
        return (f"tokenizer: byte stand-in, {plan['stand_in_inflation']:.2f}x the tokens of the Qwen2 "
                f"vocabulary ({INFLATION_REFERENCE}) on the same prompts (first seed, measured): "
                "token counts, FLOPs and times below are inflated by about that much")
    return (f"tokenizer: byte stand-in, several times the tokens of a real vocabulary (not measured: "
            f"{plan.get('stand_in_inflation_missing', 'no reference')})")


def _shape(s: dict[str, Any]) -> str:
    sh = s["shape"]
    return f"{sh['B']} x {sh['W']}, {sh['cache']} keys"


def _setting_line(s: dict[str, Any]) -> str:
    gib = 2 ** 30
    xla = f"{s['xla_peak_bytes'] / gib:.2f}" if "xla_peak_bytes" in s else "–"
    comp = f"{s['compile_seconds']:.1f}" if "compile_seconds" in s else "–"
    return (f"| {s['dataset']} | {s['k']} | {s['pairs']:,} | {s['unique_tokens']:,} | "
            f"{s['executed_tokens']:,} | {s['padding_tokens']:,} | {s['executed_per_unique']:.2f}x | "
            f"{s['flat_tokens'] / s['unique_tokens']:.1f}x | {s['flops'] / 1e12:.1f} | "
            f"{s['calls']:,} | {_shape(s)} | {s['programs']} | {comp} | {s['peak_bytes'] / gib:.2f} | "
            f"{xla} | {s['scored_keys']:,.0f} | {s['dense_seconds_per_seed']:.1f} | "
            f"{s['attention_seconds_per_seed']:.1f} | {s['forward_seconds_per_seed']:.1f} |")


def _padding_lines(done: list[dict]) -> list[str]:
    """Per setting, the three stages with the most padding: their share of the
    setting's padding, calls, and how much of it is in the unused ends of rows (the
    rest: the empty rows of each stage's last call)."""
    lines = []
    for s in done:
        W = s["shape"]["W"]
        top = sorted(s["stages"].items(), key=lambda kv: -kv[1]["padding_tokens"])[:3]
        parts = [f"{name} {st['padding_tokens']:,} ({st['padding_tokens'] / max(s['padding_tokens'], 1):.0%}; "
                 f"{st['calls']} calls, {(st['rows'] * W - st['unique_tokens']) / max(st['padding_tokens'], 1):.0%}"
                 " in row ends)" for name, st in top]
        lines.append(f"- {s['dataset']} k={s['k']}: " + "; ".join(parts))
    return lines


def _memory_lines(done: list[dict]) -> list[str]:
    """Per setting, the call shape and the planned peak's parts."""
    gib = 2 ** 30
    lines = []
    for s in done:
        sh = s["shape"]
        xla = ""
        if "xla_peak_bytes" in s:
            xla = (f"; XLA {s['xla_peak_bytes'] / gib:.2f} GiB for the model program "
                   f"({s.get('xla_attention', 'dense')} attention) "
                   f"(planned {s['planned_peak_of_that_call'] / gib:.2f})")
        slots = ", ".join(f"{name} {st['m']} x {st['S']}" for name, st in s["stages"].items())
        lines.append(
            f"- {s['dataset']} k={s['k']}: {s['calls']:,} calls of B {sh['B']} rows x W {sh['W']} "
            f"tokens after {sh['cache']} cached keys per row, R {sh['R']} readouts; "
            f"{s['chunks']} chunk(s); cache slots per row by stage (m x S tokens): {slots}; peak "
            f"{s['peak_bytes'] / gib:.2f} GiB = weights {s['weight_bytes'] / gib:.2f} + KV levels "
            f"{s['cache_bytes'] / gib:.2f} ({s['level_peak_tokens']:,} tokens) + one call "
            f"{s['temp_bytes'] / gib:.2f}{xla}")
    return lines


def _compile_line(plan: dict[str, Any]) -> str:
    if "compile_seconds" not in plan:
        return "compile time not measured (--no-compile-time, or a mesh larger than this machine's devices)"
    return (f"compile: {plan['programs']} distinct model programs over the run, "
            f"{plan['compile_seconds']:.1f} s to trace, lower and compile them on this "
            f"{plan.get('compile_backend', 'backend')} (measured with abstract shapes; a GPU compile "
            f"takes other times), not included in the forward time; "
            f"{plan['compile_cache_hits']} served from JAX's persistent compilation cache "
            f"(this plan spent {plan['compile_wall_seconds']:.1f} s)")


def plan_table(plan: dict[str, Any]) -> str:
    """Markdown summary of :func:`plan_run`."""
    gib = 2 ** 30
    backend = plan.get("compile_backend", "cpu").split(" ")[0]
    lines = [f"model {plan['model']} ({plan['dtype']}): weights {plan['weight_bytes'] / gib:.2f} GiB, "
             f"KV {plan['kv_bytes_per_token'] / 2 ** 20:.3f} MiB per token; budget "
             f"{plan['budget_bytes'] / gib:.1f} GiB per device; mesh data {plan['n_devices']} x model "
             f"{plan['model_shards']}; forward time on a roofline: {plan['mfu']:.0%} MFU of "
             f"{plan['peak_flops'] / 1e12:.3g} TFLOP/s per device "
             f"({plan.get('peak_source', 'given')}), memory {plan['bandwidth'] / 1e9:,.0f} GB/s "
             f"({plan['bandwidth_source']}); {plan['attention_source']} "
             "(dense s: projections and MLP; attention s: scores, softmax, values)",
             _tokenizer_line(plan), "",
             "| dataset | k | pairs | unique tokens | executed tokens | padding tokens | executed/unique | "
             f"flat/unique | TFLOP | calls | call shape B x W | programs | compile s ({backend}) | "
             "peak GiB | XLA peak GiB | keys scored per token | dense s per seed | attention s per seed | "
             "forward s per seed |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in plan["settings"]:
        if s.get("skipped"):
            lines.append(f"| {s['dataset']} | {s['k']} | skipped: more classes than demonstrations "
                         "|" + " |" * 16)
            continue
        lines.append(_setting_line(s))
    done = [s for s in plan["settings"] if not s.get("skipped")]
    if done:
        lines += ["", "calls and memory per device (all jobs of a seed in one schedule):"] + _memory_lines(done)
        lines += ["", ("padding (executed - unique tokens) by stage (d: segments making depth-d trie "
                       "nodes and query rows after d - 1 demonstrations), the largest three:")]
        lines += _padding_lines(done)
        w = max(done, key=lambda s: s["longest_prompt"])
        lines += ["", (f"longest prompt over all seeds and stages: {w['longest_prompt']:,} tokens "
                       f"({w['dataset']} k={w['k']} seed {w['longest_seed']}), context window "
                       f"{plan.get('context_window', 0):,}")]
    expect = ""
    if "compile_seconds" in plan:
        expect = (f", plus {plan['programs']} model program(s) to compile once per machine "
                  f"({plan['compile_seconds']:.1f} s on this {backend})")
    lines += ["", f"total over {plan['seeds']} seed(s): {plan['total_flops'] / 1e12:.1f} TFLOP, "
              f"about {plan['total_forward_seconds'] / 60:.1f} min of forward passes on the stated "
              f"roofline ({plan['total_attention_seconds'] / 60:.1f} min of it attention)"
              + expect, _compile_line(plan)]
    return "\n".join(lines)
