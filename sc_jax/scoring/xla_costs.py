"""XLA's own figures of the engine's model program, lowered with abstract shapes
(nothing allocated, no weight read): its memory (:func:`xla_call_bytes`,
:func:`xla_peak_bytes`) and its compile time (:func:`compile_seconds`).
:mod:`sc_jax.experiment.execution.plan` sets them beside the counted costs of
:mod:`sc_jax.scoring.costs`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from sc_jax.models.model import Decoder, KVCache
from sc_jax.runtime.sharding import kv_sharding, state_shardings
from sc_jax.scoring.memory import Planned, packed_temp_bytes
from sc_jax.scoring.packing import PackShape
from sc_jax.scoring.programs import PackedInputs, packed_call

log = logging.getLogger(__name__)


# ------------------------------------------------------------------ XLA's figures
def _abstract_model(config, dtype):
    return nnx.split(nnx.eval_shape(lambda: Decoder(config, dtype=dtype, rngs=nnx.Rngs(0))))


def lower_call(config, dtype, shape: PackShape, *, mode: str = "first_token", mesh=None,
               attention: str = "dense"):
    """The engine's model program for calls of ``shape``, lowered with abstract shapes
    (``jax.ShapeDtypeStruct``: nothing allocated, no weight read), ready for
    ``.compile()``: the arguments of :func:`sc_jax.scoring.programs.packed_call`, the gathered cache
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
    inputs = PackedInputs(rows(B, W), rows(B, W), rows(B, W, d=jnp.bool_), rows(B, W), rows(B, W),
                          flat(R), flat(R))
    return packed_call.lower(gd, st, cache, rows(B, keys), inputs, labels, sequence=seq,
                             attention=attention)


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
    """XLA's peak for the model program of a schedule's largest calls: arguments (the weights,
    the gathered cache, the packed rows) + outputs + temps - aliased bytes, plus the
    token pool resident beside the program (``level_peak_tokens`` x KV bytes per
    token, as in the planned peak), beside ``planned_peak_of_that_call``: the planned
    figure for the same program (weights + pool + :func:`packed_temp_bytes`), and
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


def compile_seconds(config, dtype, shape, *, measured: dict, mode: str, mesh=None,
                    progress: bool = False, attention: str = "dense") -> dict[str, Any]:
    """Compile seconds of the engine's model programs for calls of ``shape`` (a
    :class:`PackShape`, or a schedule's call sizes, summed; the model-free gathers
    and writes beside them compile in milliseconds and are left out): ``programs``,
    ``compile_seconds``, ``compile_wall_seconds`` and ``compile_cache_hits``.
    ``measured`` (program -> figures) carries programs already compiled by this plan,
    so a program two settings share is compiled once and counted once (``programs`` 0
    where it was)."""
    out = {"programs": 0, "compile_seconds": 0.0, "compile_wall_seconds": 0.0,
           "compile_cache_hits": 0}
    for sh in (shape,) if isinstance(shape, PackShape) else shape:
        program = (sh.program, mode)
        if program in measured:
            continue
        m = measured[program] = compile_call_seconds(config, dtype, sh, mode=mode, mesh=mesh,
                                                     attention=attention)
        if progress:
            log.info("  compiled B=%d W=%d cache=%d R=%d labels=%d in %.1f s%s", *program[0], m["seconds"],
                     f" (served from the persistent cache in {m['wall_seconds']:.1f} s)"
                     if m["cached"] else "")
        for key, v in (("programs", 1), ("compile_seconds", m["seconds"]),
                       ("compile_wall_seconds", m["wall_seconds"]), ("compile_cache_hits", int(m["cached"]))):
            out[key] += v
    return out
