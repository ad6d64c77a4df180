"""What the engine's calls cost, counted without running them: tokens and FLOPs of a
schedule call by call (:func:`replay`), XLA's memory and compile-time figures of its
model program lowered with abstract shapes (:func:`xla_call_bytes`,
:func:`compile_seconds`), and the device's peaks (:func:`device_peak_flops`,
:func:`device_bandwidth`, measured here or from datasheets) that put them on a roofline.
:mod:`sc_jax.experiment.plan` assembles them into a dry run of ``sc-jax run``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from sc_jax.models import attention as attn
from sc_jax.models import pallas_attention
from sc_jax.models.model import Decoder, KVCache
from sc_jax.runtime.sharding import kv_sharding, state_shardings
from sc_jax.scoring import engine as scoring
from sc_jax.scoring.attention_choice import layer_call
from sc_jax.scoring.packing import CostModel, PackShape, Schedule, attention_reads, call_trips
from sc_jax.scoring.schedule import (
    Planned,
    packed_temp_bytes,
    query_rows,
)

log = logging.getLogger(__name__)



def stage_name(depth: int) -> str:
    """``"d=3"``: the stage that continues the nodes of depth 2 (segments making
    depth-3 nodes, and query rows after contexts of 2 demonstrations)."""
    return f"d={depth}"


def replay(sched: Schedule, config, *, attention: str = "dense", platform: str = "default",
           itemsize: int = 4, mode: str = "first_token") -> dict[str, Any]:
    """Every call of ``sched`` as the engine runs it, counted: ``calls``, ``rows``
    (rows holding at least one item), ``unique_tokens`` (the items' real tokens: each
    trie node's segment once per chunk, every query row), ``executed_tokens`` (calls
    x B x W), ``padding_tokens``, ``programs`` (distinct model programs: one), and
    what the calls cost (:class:`CostModel`, activations of ``itemsize`` bytes, the
    packed calls' ``attention`` with ``platform``'s blocks): ``dense_flops``,
    ``dense_bytes`` (projections, MLP and the readout, of which ``readout_flops`` and
    ``readout_bytes``: every call's ``R`` readouts against the label rows, or in
    ``mode`` "sequence" the whole vocabulary), ``attention_flops``, ``attention_bytes``, ``scored_keys`` (keys
    scored per executed token, on average) and ``flops`` (their sum); per stage
    (:func:`stage_name`, in depth order) the same with ``segment_tokens`` /
    ``query_tokens`` (the unique tokens of each kind), the stage's slot length ``S``
    and slots per row ``m``."""
    sh = sched.shape
    cost = CostModel.of(config, itemsize)
    if attention == "pallas":
        bq, bk = pallas_attention.blocks(sh.W, sh.cache)
    else:
        bq, bk = attn.BLOCKS.get(platform, attn.BLOCKS["default"])
        bq, bk = (bq if sh.W % bq == 0 else sh.W), (bk if sh.cache % bk == 0 else sh.cache)
    G = config.num_heads // config.num_kv_heads
    stages: dict[str, dict] = {}
    for _, st, r0 in sched.calls():
        a, b = np.searchsorted(st.row, [r0, r0 + sh.B])
        lens = st.length[a:b]
        seg = int(lens[st.kind[a:b] == 0].sum())
        acc = stages.setdefault(stage_name(st.depth), {
            "S": st.S, "m": st.m, "calls": 0, "rows": 0, "unique_tokens": 0, "segment_tokens": 0,
            "query_tokens": 0, "executed_tokens": 0, "padding_tokens": 0, "flops": 0.0,
            "dense_flops": 0.0, "dense_bytes": 0.0, "attention_flops": 0.0, "attention_bytes": 0.0,
            "readout_flops": 0.0, "readout_bytes": 0.0, "scored_keys": 0.0})
        if attention == "pallas" or (attention == "blocked" and platform == "cpu"):
            trips = call_trips(st, r0, sh.B, sh.W, sh.cache, bq, bk)
        else:  # the accelerator's blocked path visits every key block (static loops)
            trips = sh.cache + sh.W
        scored, reads = attention_reads(attention, W=sh.W, C=sh.cache, scored=trips, bq=bq, G=G)
        d_flops, d_bytes = cost.dense(sh.B, sh.W)
        r_flops, r_bytes = cost.readout(sh.R, sh.labels, mode == "sequence")
        d_flops, d_bytes = d_flops + r_flops, d_bytes + r_bytes
        acc["readout_flops"] += r_flops
        acc["readout_bytes"] += r_bytes
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
        "dense_bytes", "attention_flops", "attention_bytes", "readout_flops", "readout_bytes")}
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
    ``.compile()``: the arguments of :func:`sc_jax.scoring.engine._packed`, the gathered cache
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


# ------------------------------------------------------------------ the device's peaks
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
    (:func:`sc_jax.models.attention.packed_attention`) on the default device, measured: a call
    of ``min(rows, B)`` rows of the ``shape``'s W tokens after its ``cache`` keys, laid
    out as the engine's attention choice times it
    (:func:`sc_jax.scoring.attention_choice.layer_call`); the median of ``repeats``
    timings after a compile. What calibrates `plan`'s attention time to this backend
    (the dense path's float32 scores cost more than their bytes on a CPU)."""
    c = config
    B, W, C = min(rows, shape.B), shape.W, shape.cache
    (q, k, v, ck, cv), meta = layer_call(config, dtype, shape, rows=B)
    masks = attn.packed_masks(**meta, windows=False, implementation=attention, platform=platform)
    f = jax.jit(lambda *a: attn.packed_attention(*a, implementation=attention))
    f(q, k, v, ck, cv, masks, 0).block_until_ready()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        f(q, k, v, ck, cv, masks, 0).block_until_ready()
        times.append(time.perf_counter() - t)
    trips = masks.trips
    # The keys it scored, counted as replay() counts them: the traced trips of the CPU's
    # blocked path and of the kernel, every key for the rest (the accelerator's blocked
    # path loops over every block).
    sparse = attention == "pallas" or (attention == "blocked" and jax.default_backend() == "cpu")
    scored = float(trips[0] * masks.bk + trips[1] * masks.bq) if sparse else float(C + W)
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



def non_embedding_params(config) -> int:
    return config.num_params() - config.vocab_size * config.hidden_size * (
        1 if config.tie_word_embeddings else 2)
