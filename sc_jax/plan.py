"""Dry run of ``sc-jax run`` (:func:`plan_run`): what a run would score and what it
needs, with no weights read and nothing scored.

:func:`plan_run` builds each seed's scoring jobs as the experiment does
(:func:`sc_jax.experiment.seed_jobs`), replays the engine's schedule for them
(:mod:`sc_jax.schedule`: chunks, micro-batches, compiles, the planned peak) and
counts tokens (unique, executed with padding, per stage) and FLOPs;
:func:`xla_call_bytes` lowers the engine's real programs with abstract shapes
(``jax.ShapeDtypeStruct``: nothing is allocated, no weights are read) and reads XLA's
``memory_analysis()`` for the same calls, and :func:`compile_seconds` compiles every
distinct program that way to measure what compiling costs on this machine.

The random presets tokenize with a byte-level stand-in unless a real vocabulary of
theirs is available (:data:`sc_jax.loading.PRESET_TOKENIZERS`); the plan says which,
and for the stand-in measures how many more tokens it makes than the Qwen2 vocabulary
on the same prompts.

The memory model itself (:func:`plan_budgets`, :func:`peak_bytes`, :class:`PlanError`
and the rest) lives in :mod:`sc_jax.schedule`, below the engine, and stays importable
from here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from . import scoring
from .experiment import check_run, draw_split, load_datasets, seed_jobs
from .loading import DTYPES, PRESET_TOKENIZERS, load_config_and_tokenizer
from .model import Decoder, KVCache
from .named_models import tokenizer_file
from .pypi import WheelFileError
# The memory model (sc_jax.schedule), importable from here too.
from .schedule import (  # noqa: F401
    ACTIVATION_SHARE, MAX_TOKENS_PER_BATCH, RESERVE, Budgets, Call, PlanError, call_temp_bytes,
    device_memory_bytes, engine_shapes, host_memory_bytes, kv_bytes_per_token, micro_batch_rows,
    peak_bytes, plan_budgets, query_rows, schedule, weight_bytes)
from .sharding import MODEL, axis_size, kv_sharding, make_mesh, state_shardings
from .tokenizer import ByteTokenizer, Tokenizer

log = logging.getLogger(__name__)


# ------------------------------------------------------------------ XLA's figures
def _abstract_model(config, dtype):
    return nnx.split(nnx.eval_shape(lambda: Decoder(config, dtype=dtype, rngs=nnx.Rngs(0))))


def lower_call(config, dtype, call: Call, *, mode: str = "first_token", n_labels: int = 2, mesh=None):
    """The engine's model program of ``call`` lowered with abstract shapes
    (``jax.ShapeDtypeStruct``: nothing allocated, no weight read), ready for
    ``.compile()``."""
    gd, st = _abstract_model(config, dtype)
    L, K, Dh = config.num_layers, config.num_kv_heads, config.head_dim
    sds = jax.ShapeDtypeStruct
    if mesh is not None:
        st = jax.tree.map(lambda x, s: sds(x.shape, x.dtype, sharding=s), st, state_shardings(mesh, st))

    def shard(spec):
        if mesh is None:
            return None
        return NamedSharding(mesh, P(*spec))

    def cache(rows, S):
        shape = (L, rows, S, K, Dh)
        kv = sds(shape, dtype, sharding=None if mesh is None else kv_sharding(mesh, shape))
        rs = shard(("data",)) if rows > 1 else shard(())
        return KVCache(kv, kv, sds((rows, S), jnp.int32, sharding=rs), sds((rows, S), jnp.bool_, sharding=rs))

    def ints(*shape, d=jnp.int32):
        return sds(shape, d, sharding=shard(("data",)))

    seq = mode == "sequence"
    rows = cache(call.Bc, call.S)  # the gathered cache rows the model program extends
    if call.kind == "grow":
        return scoring._grow.lower(gd, st, rows, ints(call.B, call.T), ints(call.B, call.T, d=jnp.bool_))
    labels = None if seq else sds((n_labels,), jnp.int32)
    return scoring._score_cached.lower(
        gd, st, rows, ints(call.B, call.T), ints(call.B, call.T, d=jnp.bool_), ints(call.B, 1),
        ints(call.B, 1), ints(call.B, 1, d=jnp.bool_), labels, sequence=seq)


def xla_call_bytes(config, dtype, call: Call, *, mode: str = "first_token", n_labels: int = 2,
                   mesh=None) -> dict[str, int]:
    """Compile the engine program of ``call`` with abstract shapes and return XLA's
    ``memory_analysis()``: argument, output, temp and alias bytes (per device).

    On CPU, XLA computes bfloat16 dots in float32 and hoists the conversion of every
    layer's stacked weights out of the layer loop (a float32 copy of all weights in
    temp); a GPU or TPU does neither. For a bfloat16 model on CPU the program is
    compiled with while-loop-invariant code motion disabled, which leaves one
    layer's float32 copy in temp (within the margin the tests state).
    """
    lowered = lower_call(config, dtype, call, mode=mode, n_labels=n_labels, mesh=mesh)
    opts = None
    if jax.default_backend() == "cpu" and jnp.dtype(dtype) == jnp.bfloat16:
        opts = {"xla_disable_hlo_passes": "while-loop-invariant-code-motion"}
    m = lowered.compile(compiler_options=opts).memory_analysis() if opts else \
        lowered.compile().memory_analysis()
    return dict(argument_bytes=int(m.argument_size_in_bytes), output_bytes=int(m.output_size_in_bytes),
                temp_bytes=int(m.temp_size_in_bytes), alias_bytes=int(m.alias_size_in_bytes))


def xla_peak_bytes(config, dtype, calls: list[Call], **kw) -> dict[str, Any]:
    """XLA's peak over the distinct model programs of ``calls``: arguments (the
    weights and the gathered cache rows) + outputs + temps - aliased bytes, plus the
    level buffers resident beside the program (the same figure as in
    :func:`peak_bytes`), the largest over programs."""
    seen, best = {}, dict(xla_peak_bytes=0)
    ms = kw.get("mesh")
    kvb = kv_bytes_per_token(config, dtype, axis_size(ms, MODEL))
    for call in calls:
        if call.key in seen:
            continue
        m = seen[call.key] = xla_call_bytes(config, dtype, call, **kw)
        resident = (call.level_rows * call.out_len + call.parent_rows * call.parent_len) * kvb \
            if call.kind == "grow" else call.level_rows * call.S * kvb
        peak = m["argument_bytes"] + m["output_bytes"] + m["temp_bytes"] - m["alias_bytes"] + resident
        if peak > best["xla_peak_bytes"]:
            best = dict(xla_peak_bytes=peak, call=dataclasses.asdict(call), **m)
    best["programs"] = len(seen)
    return best


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


def compile_call_seconds(config, dtype, call: Call, **kw) -> dict[str, Any]:
    """Trace, lower and compile the model program of ``call`` (abstract shapes, the
    default compiler options, as the engine compiles it) on this backend. Returns
    ``seconds`` (what compiling it costs: where JAX's persistent compilation cache
    served it, the compile time stored with the entry), ``wall_seconds`` (what this
    call took) and ``cached`` (served from that cache)."""
    t0 = time.perf_counter()
    lowered = lower_call(config, dtype, call, **kw)
    t1 = time.perf_counter()
    with _cache_events() as ev:
        lowered.compile()
    t2 = time.perf_counter()
    cached = ev["hits"] > 0
    compile_s = ev["saved"] + ev["read"] if cached else t2 - t1
    return {"seconds": (t1 - t0) + compile_s, "wall_seconds": t2 - t0, "cached": cached}


def compile_seconds(config, dtype, calls: list[Call], *, measured: dict, mode: str, n_labels: int,
                    mesh=None, progress: bool = False) -> dict[str, Any]:
    """Compile seconds of the distinct model programs of ``calls`` (one per
    :attr:`Call.key`; the model-free gathers and writes beside them compile in
    milliseconds and are left out): ``programs``, ``compile_seconds``,
    ``compile_wall_seconds`` and ``compile_cache_hits``. ``measured`` (program ->
    figures) carries programs already compiled by this plan, so a program two
    settings share is compiled once."""
    keys = {c.key: c for c in calls}
    out = {"programs": len(keys), "compile_seconds": 0.0, "compile_wall_seconds": 0.0,
           "compile_cache_hits": 0}
    for key, call in keys.items():
        program = (key, mode, n_labels)
        if program not in measured:
            measured[program] = compile_call_seconds(config, dtype, call, mode=mode, n_labels=n_labels,
                                                     mesh=mesh)
            if progress:
                m = measured[program]
                log.info("  compiled %s in %.1f s%s", key, m["seconds"],
                         f" (served from the persistent cache in {m['wall_seconds']:.1f} s)"
                         if m["cached"] else "")
        m = measured[program]
        out["compile_seconds"] += m["seconds"]
        out["compile_wall_seconds"] += m["wall_seconds"]
        out["compile_cache_hits"] += int(m["cached"])
    return out


# ------------------------------------------------------------------ a whole run
#: Dense bfloat16 peak of one H100 SXM (NVIDIA's datasheet).
H100_BF16_PEAK_FLOPS = 989e12
#: Dense bfloat16 peaks (datasheets) of accelerators by name, for `plan`'s time
#: estimate: `--accelerator NAME`, or the local device when its kind names one.
ACCELERATOR_PEAK_FLOPS = {"h100": H100_BF16_PEAK_FLOPS, "h200": H100_BF16_PEAK_FLOPS,
                          "a100": 312e12, "l4": 121e12, "v100": 125e12}


def measured_matmul_flops(dtype=jnp.float32, n: int = 1024, repeats: int = 5) -> float:
    """FLOP/s of an ``[n, n] @ [n, n]`` product on the default device, the median of
    ``repeats`` timed runs after one compile (about 0.3 s on a 2-core CPU)."""
    a = jnp.full((n, n), 0.5, dtype)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        f(a).block_until_ready()
        times.append(time.perf_counter() - t)
    return 2 * n ** 3 / float(np.median(times))


def device_peak_flops(accelerator: str | None = None, dtype=jnp.float32) -> tuple[float, str]:
    """(peak FLOP/s per device, where it comes from) for `plan`'s time estimate: the
    datasheet figure of ``accelerator`` (a key of :data:`ACCELERATOR_PEAK_FLOPS`), or
    of the local accelerator when its kind names one, else a matmul measured here
    (a CPU: an H100's figure would promise a CPU run hundreds of times too fast)."""
    if accelerator is not None:
        key = accelerator.lower()
        if key not in ACCELERATOR_PEAK_FLOPS:
            raise ValueError(f"unknown accelerator {accelerator!r}; known: "
                             f"{', '.join(ACCELERATOR_PEAK_FLOPS)} (or give --peak-tflops)")
        return ACCELERATOR_PEAK_FLOPS[key], f"{key.upper()} datasheet, dense bf16"
    dev = jax.local_devices()[0]
    kind = str(getattr(dev, "device_kind", dev.platform))
    if dev.platform != "cpu":
        for key, peak in ACCELERATOR_PEAK_FLOPS.items():
            if key in kind.lower():
                return peak, f"{kind} datasheet, dense bf16"
    where = dev.platform if kind.lower() == dev.platform else f"{dev.platform} ({kind})"
    return measured_matmul_flops(dtype), f"matmul measured on this {where}"


def engine_calls(config, dtype, pieces, ctx, pairs, mode, *, budget_bytes, n_devices,
                 platform, max_tokens_per_batch=None, max_cache_tokens=None, max_group=64,
                 model_shards=1):
    """The calls, budgets and token counts of one engine call, as
    :meth:`sc_jax.scoring.ScoringEngine.score` would plan and run it: a dict of
    ``tokens`` and ``cache`` (the two budgets), ``calls``, ``unique_tokens``,
    ``flat_tokens`` and ``shapes``."""
    n = len(pieces.labels)
    nr = n if mode == "sequence" else 1
    # The engine's shapes, without a model (the engine calls the same function).
    shapes = engine_shapes(pieces, ctx.shape[1], mode)
    per_ctx = np.bincount(pairs[:, 0], minlength=len(ctx))
    G = int(min(max_group, per_ctx.max() * nr))
    b = None
    if max_tokens_per_batch is None or max_cache_tokens is None:
        b = plan_budgets(config, dtype, shapes, budget_bytes=budget_bytes, G=G, n_devices=n_devices,
                         platform=platform, model_shards=model_shards)
        G = b.max_group
    tokens = max_tokens_per_batch or b.max_tokens_per_batch
    cache = max_cache_tokens or b.max_cache_tokens
    rows, _, _ = query_rows(pieces, mode, range(len(pieces.queries)))
    row_len = np.asarray([len(r) for r in rows])
    calls = schedule(shapes, ctx, pairs, nr, G, row_len, max_tokens_per_batch=tokens,
                     max_cache_tokens=cache, n_devices=n_devices)
    seg = np.asarray([len(pieces.segment(j)) for j in range(len(pieces.demos))])
    qlen = row_len.reshape(len(pieces.queries), nr).sum(1)
    stages = _stage_tokens(shapes, calls, ctx, pairs, seg, qlen, len(pieces.bos), cache)
    unique = sum(v["unique_tokens"] for v in stages.values())
    flat = int((len(pieces.bos) + seg[ctx[pairs[:, 0]]].sum(1) + qlen[pairs[:, 1]]).sum())
    return dict(tokens=tokens, cache=cache, calls=calls, unique_tokens=unique, flat_tokens=flat,
                shapes=shapes, stages=stages)


def stage_of(shapes, call: Call) -> str:
    """The stage a call belongs to: ``"grow d=3"`` (growing the trie's depth 3) or
    ``"score d=3"`` (query rows after contexts of 3 demonstrations)."""
    d = shapes.lens.index(call.S)
    return f"grow d={d + 1}" if call.kind == "grow" else f"score d={d}"


def _stage_tokens(shapes, calls, ctx, pairs, seg, qlen, n_bos: int, cache: int) -> dict[str, dict]:
    """Per stage (:func:`stage_of`): ``unique_tokens`` (what the engine computes: each
    chunk's distinct prefixes, a prefix shared by two chunks computed in both, then
    every query row), ``executed_tokens`` (padded rows x padded length, what the
    device runs) and ``micro_batches``."""
    depth = ctx.shape[1]
    unique = {f"grow d={d}": 0 for d in range(1, depth + 1)}
    unique[f"score d={depth}"] = int(qlen[pairs[:, 1]].sum())
    order = np.lexsort(ctx.T[::-1])
    per_chunk = max(1, cache // shapes.lens[-1])
    for c0 in range(0, len(order), per_chunk):
        part = ctx[order[c0:c0 + per_chunk]]
        unique["grow d=1"] += n_bos * len(np.unique(part[:, 0]))
        for d in range(1, depth + 1):
            unique[f"grow d={d}"] += int(seg[np.unique(part[:, :d], axis=0)[:, -1]].sum())
    out = {name: {"unique_tokens": u, "executed_tokens": 0, "micro_batches": 0} for name, u in unique.items()}
    for c in calls:
        st = out[stage_of(shapes, c)]
        st["executed_tokens"] += c.count * c.B * c.T
        st["micro_batches"] += c.count
    return out


# The name benchmarks/accelerator_suite.py imports.
_engine_calls = engine_calls


def _non_embedding_params(config) -> int:
    return config.num_params() - config.vocab_size * config.hidden_size * (
        1 if config.tie_word_embeddings else 2)


def _call_flops(config, call: Call) -> float:
    """Forward FLOPs of one call: 2 x non-embedding parameters per new token, plus
    attention (q.k and p.v, 4 x L x H x Dh per visible key), label rows ignored."""
    c = config
    nonembed = _non_embedding_params(c)
    per_key = 4 * c.num_layers * c.num_heads * c.head_dim
    BT = call.B * call.T
    return call.count * (2 * nonembed * BT + per_key * BT * (call.S + call.T / 2))


def _job_row(config, dtype, tag: str, ctx, pairs, e: dict, model_shards: int) -> dict[str, Any]:
    """The plan of one scoring job (``e``: its :func:`engine_calls`)."""
    peak = peak_bytes(config, dtype, e["calls"], model_shards)
    flops = sum(_call_flops(config, c) for c in e["calls"])
    executed = sum(c.count * c.B * c.T for c in e["calls"])
    return dict(job=tag, size=int(ctx.shape[1]), contexts=int(len(ctx)),
                pairs=int(len(pairs)), unique_tokens=e["unique_tokens"],
                flat_tokens=e["flat_tokens"], flops=flops, executed_tokens=executed,
                padding_tokens=executed - e["unique_tokens"],
                model_flops=2 * _non_embedding_params(config) * e["unique_tokens"],
                chunks=sum(1 for c in e["calls"] if c.kind == "score"),
                micro_batches=sum(c.count for c in e["calls"]),
                programs=len({c.key for c in e["calls"]}), stages=e["stages"],
                max_tokens_per_batch=e["tokens"], max_cache_tokens=e["cache"], **peak)


def _stage_totals(rows: list[dict], calls: list[Call], stage_of_call: list[str]) -> dict[str, dict]:
    """The jobs' :func:`_stage_tokens` summed per stage, with ``padding_tokens`` and
    the stage's distinct model ``programs``, largest padding first."""
    out: dict[str, dict] = {}
    for r in rows:
        for name, st in r["stages"].items():
            acc = out.setdefault(name, {"unique_tokens": 0, "executed_tokens": 0, "micro_batches": 0})
            for key, v in st.items():
                acc[key] += v
    keys: dict[str, set] = {}
    for c, name in zip(calls, stage_of_call):
        keys.setdefault(name, set()).add(c.key)
    for name, acc in out.items():
        acc["padding_tokens"] = acc["executed_tokens"] - acc["unique_tokens"]
        acc["programs"] = len(keys.get(name, ()))
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["padding_tokens"]))


def _setting_totals(name: str, k: int, rows: list[dict], calls: list[Call],
                    stage_of_call: list[str]) -> dict[str, Any]:
    """The plan of one (dataset, k): its jobs' rows, their sums and the worst job."""
    worst = max(rows, key=lambda r: r["peak_bytes"])
    total = {key: sum(r[key] for r in rows) for key in (
        "pairs", "unique_tokens", "executed_tokens", "padding_tokens", "flat_tokens", "flops",
        "model_flops", "micro_batches")}
    return dict(dataset=name, k=k, jobs=rows, **total,
                executed_per_unique=total["executed_tokens"] / max(total["unique_tokens"], 1),
                programs=len({c.key for c in calls}),
                stages=_stage_totals(rows, calls, stage_of_call),
                peak_bytes=worst["peak_bytes"], worst_job=worst["job"])


def _xla_worst_call(config, dtype, calls: list[Call], model_shards: int, *, mode: str,
                    n_labels: int, mesh) -> dict[str, int]:
    """XLA's figure for the planned worst of ``calls`` (one compile per distinct
    program would be too slow for 7B), beside the planned figure for that call."""
    def planned(c):
        return peak_bytes(config, dtype, [c], model_shards)["peak_bytes"]

    worst_call = max(calls, key=planned)
    x = xla_peak_bytes(config, dtype, [worst_call], mode=mode, n_labels=n_labels, mesh=mesh)
    return dict(xla_peak_bytes=x["xla_peak_bytes"], planned_peak_of_that_call=planned(worst_call))


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


@dataclasses.dataclass
class _Planner:
    """What every (dataset, k) of one plan shares."""

    run: Any
    config: Any
    dtype: Any
    tokenizer: Any
    reference: Any  # the Qwen2 tokenizer where the run's is a stand-in, else None
    calls_of: Any
    model_shards: int
    n_devices: int
    mesh: Any
    xla: bool
    compile_time: bool
    progress: bool
    measured: dict = dataclasses.field(default_factory=dict)


def _plan_setting(pl: _Planner, name: str, ds, k: int) -> dict[str, Any]:
    """One (dataset, k) of :func:`plan_run`, its first seed."""
    split = draw_split(ds, pl.run, k, pl.run.seeds[0])
    sj = seed_jobs(pl.tokenizer, ds, split, pl.run, k)
    rows, all_calls, stages = [], [], []
    for tag, (ctx, pairs) in sj.jobs.items():
        e = pl.calls_of(sj.pieces, ctx, pairs)
        rows.append(_job_row(pl.config, pl.dtype, tag, ctx, pairs, e, pl.model_shards))
        all_calls += e["calls"]
        stages += [stage_of(e["shapes"], c) for c in e["calls"]]
        if pl.progress:
            log.info("  %s k=%d %s: %d pairs", name, k, tag, len(pairs))
    setting = _setting_totals(name, k, rows, all_calls, stages)
    if pl.reference is not None:
        ref = seed_jobs(pl.reference, ds, split, pl.run, k)
        setting["prompt_tokens"] = _prompt_tokens(sj.pieces, sj.jobs, pl.run.mode)
        setting["prompt_tokens_reference"] = _prompt_tokens(ref.pieces, ref.jobs, pl.run.mode)
        setting["stand_in_inflation"] = setting["prompt_tokens"] / setting["prompt_tokens_reference"]
    lowered = pl.mesh is not None or pl.model_shards * pl.n_devices == 1
    kw = {"mode": pl.run.mode, "n_labels": ds.n_classes, "mesh": pl.mesh}
    if pl.compile_time and lowered:
        setting.update(compile_seconds(pl.config, pl.dtype, all_calls, measured=pl.measured,
                                       progress=pl.progress, **kw))
    if pl.xla and lowered:
        e = pl.calls_of(sj.pieces, *sj.jobs[setting["worst_job"]])
        setting.update(_xla_worst_call(pl.config, pl.dtype, e["calls"], pl.model_shards, **kw))
    return setting


def plan_run(run_config, *, device_memory: int | None = None, n_devices: int = 1, model_shards: int = 1,
             peak_flops: float | None = None, mfu: float = 0.4, xla: bool = True,
             compile_time: bool = True, progress: bool = False,
             accelerator: str | None = None) -> dict[str, Any]:
    """A dry run of ``sc-jax run``: what one seed of every (dataset, k) would score,
    with no weights read and nothing scored. Returns a JSON-able dict with, per
    (dataset, k) and job: prompts, (context, query) pairs, ``unique_tokens`` (what the
    trie computes), ``executed_tokens`` (padded rows x padded lengths, what the device
    runs), ``padding_tokens`` (their difference), ``flat_tokens`` (full prompts),
    FLOPs, chunks, micro-batches, the distinct model ``programs``, the planned
    ``peak_bytes``, per stage (:func:`stage_of`) the same token counts, and:

    * ``xla=True``: XLA's ``xla_peak_bytes`` for the worst program;
    * ``compile_time=True``: ``compile_seconds``, every distinct model program traced,
      lowered and compiled with abstract shapes on this backend (:func:`compile_seconds`;
      a CPU's figure, not a GPU's); a figure of its own, never added to the forward time;
    * ``forward_seconds_per_seed``: FLOPs at ``mfu`` of ``peak_flops`` per device
      (None: :func:`device_peak_flops`; ``peak_source`` says where it comes from);
    * ``tokenizer`` (real or the byte stand-in) and, for the stand-in,
      ``stand_in_inflation``: its prompt tokens over the Qwen2 vocabulary's on the same
      prompts (first seed), where that vocabulary is on this machine.

    ``flops`` is what the device executes (padded rows and tokens, attention
    included); ``model_flops`` is 2 x non-embedding parameters x unique tokens, the
    usual numerator of MFU. Seeds repeat the same work with other demonstrations, so
    totals multiply the first seed's figures by the number of seeds.
    """
    config, tokenizer = load_config_and_tokenizer(run_config.model)
    dtype = DTYPES[run_config.dtype]
    if peak_flops is None:
        peak_flops, peak_source = device_peak_flops(accelerator, dtype)
    else:
        peak_source = "given"
    platform = "cpu" if device_memory is None and jax.default_backend() == "cpu" else "default"
    budget = device_memory or device_memory_bytes() or host_memory_bytes()
    mesh = None
    if n_devices * model_shards > 1 and (xla or compile_time) and len(jax.devices()) >= n_devices * model_shards:
        mesh = make_mesh(n_devices, model=model_shards)
    reference, why = _reference_tokenizer() if isinstance(tokenizer, ByteTokenizer) else (None, "")
    out = dict(model=run_config.model, dtype=run_config.dtype, budget_bytes=int(budget),
               n_devices=n_devices, model_shards=model_shards,
               weight_bytes=weight_bytes(config, dtype, model_shards),
               kv_bytes_per_token=kv_bytes_per_token(config, dtype, model_shards),
               peak_flops=peak_flops, peak_source=peak_source, mfu=mfu,
               seeds=len(run_config.seeds), context_window=config.max_position_embeddings,
               tokenizer=_tokenizer_label(run_config.model, tokenizer),
               compile_backend=_backend_name(),
               settings=[])
    if why:
        out["stand_in_inflation_missing"] = why
    calls_of = functools.partial(
        engine_calls, config, dtype, mode=run_config.mode, budget_bytes=budget,
        n_devices=n_devices, platform=platform,
        max_tokens_per_batch=run_config.max_tokens_per_batch, model_shards=model_shards)
    datasets = load_datasets(run_config)
    # The run's own up-front check, every seed: a prompt too long for the context
    # window is named (task, seed, row) before the memory plan would misread it.
    device = {"budget_bytes": budget, "n_devices": n_devices, "model_shards": model_shards,
              "platform": platform}
    checked = {(c["dataset"], c["k"]): c
               for c in check_run(run_config, config, tokenizer, datasets, device=device)}
    pl = _Planner(run_config, config, dtype, tokenizer, reference, calls_of, model_shards, n_devices,
                  mesh, xla, compile_time, progress)
    for name, ds in datasets.items():
        for k in run_config.shots:
            if ds.n_classes > k:
                out["settings"].append(dict(dataset=name, k=k, skipped=True))
                continue
            setting = _plan_setting(pl, name, ds, k)
            setting.update(longest_prompt=checked[name, k]["longest_prompt"],
                           longest_seed=checked[name, k]["longest_seed"])
            # The mesh's devices share the work: peak_flops is per device.
            setting["forward_seconds_per_seed"] = setting["flops"] / (mfu * peak_flops * n_devices * model_shards)
            out["settings"].append(setting)
    out.update(_run_totals(out["settings"], len(run_config.seeds), pl.measured))
    return out


def _run_totals(settings: list[dict], seeds: int, measured: dict) -> dict[str, Any]:
    """The plan's totals: forward time and FLOPs over every seed, the stand-in's
    inflation over all settings, and the run's distinct programs (a program two
    settings share compiles once) with their compile seconds."""
    done = [s for s in settings if not s.get("skipped")]
    out = {"total_forward_seconds": sum(s["forward_seconds_per_seed"] for s in done) * seeds,
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


def _setting_line(s: dict[str, Any]) -> str:
    gib = 2 ** 30
    xla = f"{s['xla_peak_bytes'] / gib:.2f}" if "xla_peak_bytes" in s else "–"
    comp = f"{s['compile_seconds']:.1f}" if "compile_seconds" in s else "–"
    return (f"| {s['dataset']} | {s['k']} | {s['pairs']:,} | {s['unique_tokens']:,} | "
            f"{s['executed_tokens']:,} | {s['padding_tokens']:,} | {s['executed_per_unique']:.2f}x | "
            f"{s['flat_tokens'] / s['unique_tokens']:.1f}x | {s['flops'] / 1e12:.1f} | "
            f"{s['micro_batches']:,} | {s['programs']} | {comp} | {s['peak_bytes'] / gib:.2f} | {xla} | "
            f"{s['forward_seconds_per_seed']:.1f} |")


def _padding_lines(done: list[dict]) -> list[str]:
    """Per setting, the three stages with the most padding."""
    lines = []
    for s in done:
        top = list(s["stages"].items())[:3]
        parts = [f"{name} {st['padding_tokens']:,} ({st['padding_tokens'] / max(s['padding_tokens'], 1):.0%}, "
                 f"{st['programs']} programs)" for name, st in top]
        lines.append(f"- {s['dataset']} k={s['k']}: " + "; ".join(parts))
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
             f"{plan['model_shards']}; forward time at {plan['mfu']:.0%} MFU of "
             f"{plan['peak_flops'] / 1e12:.3g} TFLOP/s per device "
             f"({plan.get('peak_source', 'given')})", _tokenizer_line(plan), "",
             "| dataset | k | pairs | unique tokens | executed tokens | padding tokens | executed/unique | "
             f"flat/unique | TFLOP | micro-batches | programs | compile s ({backend}) | peak GiB | "
             "XLA peak GiB | forward s per seed |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in plan["settings"]:
        if s.get("skipped"):
            lines.append(f"| {s['dataset']} | {s['k']} | skipped: more classes than demonstrations "
                         "|" + " |" * 12)
            continue
        lines.append(_setting_line(s))
    done = [s for s in plan["settings"] if not s.get("skipped")]
    if done:
        lines += ["", "padding (executed - unique tokens) by stage, the largest three:"] + _padding_lines(done)
        w = max(done, key=lambda s: s["longest_prompt"])
        lines += ["", (f"longest prompt over all seeds and stages: {w['longest_prompt']:,} tokens "
                       f"({w['dataset']} k={w['k']} seed {w['longest_seed']}), context window "
                       f"{plan.get('context_window', 0):,}")]
    lines += ["", f"total over {plan['seeds']} seed(s): {plan['total_flops'] / 1e12:.1f} TFLOP, "
              f"about {plan['total_forward_seconds'] / 60:.1f} min of forward passes at the stated MFU",
              _compile_line(plan)]
    return "\n".join(lines)
