"""Dry run of ``sc-jax run`` (:func:`plan_run`): what a run would score and what it
needs, with no weights read and nothing scored.

:func:`plan_run` builds each seed's scoring jobs as the experiment does
(:func:`sc_jax.experiment.seed_jobs`), replays the engine's schedule for them
(:mod:`sc_jax.schedule`: chunks, micro-batches, compiles, the planned peak) and
counts tokens and FLOPs; :func:`xla_call_bytes` lowers the engine's real programs
with abstract shapes (``jax.ShapeDtypeStruct``: nothing is allocated, no weights are
read) and reads XLA's ``memory_analysis()`` for the same calls.

The memory model itself (:func:`plan_budgets`, :func:`peak_bytes`, :class:`PlanError`
and the rest) lives in :mod:`sc_jax.schedule`, below the engine, and stays importable
from here.
"""

from __future__ import annotations

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
from .loading import DTYPES, load_config_and_tokenizer
from .model import Decoder, KVCache
# The memory model (sc_jax.schedule), importable from here too.
from .schedule import (  # noqa: F401
    ACTIVATION_SHARE, MAX_TOKENS_PER_BATCH, RESERVE, Budgets, Call, PlanError, call_temp_bytes,
    device_memory_bytes, engine_shapes, host_memory_bytes, kv_bytes_per_token, micro_batch_rows,
    peak_bytes, plan_budgets, query_rows, schedule, weight_bytes)
from .sharding import MODEL, axis_size, kv_sharding, make_mesh, state_shardings

log = logging.getLogger(__name__)


# ------------------------------------------------------------------ XLA's figures
def _abstract_model(config, dtype):
    return nnx.split(nnx.eval_shape(lambda: Decoder(config, dtype=dtype, rngs=nnx.Rngs(0))))


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
        lowered = scoring._grow.lower(gd, st, rows, ints(call.B, call.T), ints(call.B, call.T, d=jnp.bool_))
    else:
        labels = None if seq else sds((n_labels,), jnp.int32)
        lowered = scoring._score_cached.lower(
            gd, st, rows, ints(call.B, call.T), ints(call.B, call.T, d=jnp.bool_), ints(call.B, 1),
            ints(call.B, 1), ints(call.B, 1, d=jnp.bool_), labels, sequence=seq)
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
    # Tokens the engine computes: each chunk's distinct prefixes (a prefix shared by
    # two chunks is computed in both), then every query row.
    order = np.lexsort(ctx.T[::-1])
    per_chunk = max(1, cache // shapes.lens[-1])
    unique = int(qlen[pairs[:, 1]].sum())
    for c0 in range(0, len(order), per_chunk):
        part = ctx[order[c0:c0 + per_chunk]]
        unique += len(pieces.bos) * len(np.unique(part[:, 0]))
        for d in range(1, ctx.shape[1] + 1):
            unique += int(seg[np.unique(part[:, :d], axis=0)[:, -1]].sum())
    flat = int((len(pieces.bos) + seg[ctx[pairs[:, 0]]].sum(1) + qlen[pairs[:, 1]]).sum())
    return dict(tokens=tokens, cache=cache, calls=calls, unique_tokens=unique, flat_tokens=flat,
                shapes=shapes)


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
    return dict(job=tag, size=int(ctx.shape[1]), contexts=int(len(ctx)),
                pairs=int(len(pairs)), unique_tokens=e["unique_tokens"],
                flat_tokens=e["flat_tokens"], flops=flops,
                padded_tokens=sum(c.count * c.B * c.T for c in e["calls"]),
                model_flops=2 * _non_embedding_params(config) * e["unique_tokens"],
                chunks=sum(1 for c in e["calls"] if c.kind == "score"),
                micro_batches=sum(c.count for c in e["calls"]),
                programs=len({c.key for c in e["calls"]}),
                max_tokens_per_batch=e["tokens"], max_cache_tokens=e["cache"], **peak)


def _setting_totals(name: str, k: int, rows: list[dict], calls: list[Call]) -> dict[str, Any]:
    """The plan of one (dataset, k): its jobs' rows, their sums and the worst job."""
    worst = max(rows, key=lambda r: r["peak_bytes"])
    return dict(dataset=name, k=k, jobs=rows,
                pairs=sum(r["pairs"] for r in rows),
                unique_tokens=sum(r["unique_tokens"] for r in rows),
                flat_tokens=sum(r["flat_tokens"] for r in rows),
                flops=sum(r["flops"] for r in rows),
                model_flops=sum(r["model_flops"] for r in rows),
                padded_tokens=sum(r["padded_tokens"] for r in rows),
                micro_batches=sum(r["micro_batches"] for r in rows),
                compiles=len({c.key for c in calls}),
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


def plan_run(run_config, *, device_memory: int | None = None, n_devices: int = 1, model_shards: int = 1,
             peak_flops: float | None = None, mfu: float = 0.4, xla: bool = True,
             progress: bool = False, accelerator: str | None = None) -> dict[str, Any]:
    """A dry run of ``sc-jax run``: what one seed of every (dataset, k) would score,
    with no weights read and nothing scored. Returns a JSON-able dict with, per
    (dataset, k) and size: prompts, (context, query) pairs, ``unique_tokens`` (what
    the trie computes) and ``flat_tokens`` (full prompts), FLOPs, chunks,
    micro-batches, compiles, the planned ``peak_bytes`` and (``xla=True``) XLA's
    ``xla_peak_bytes`` for the worst program, and a time estimate at ``mfu`` of
    ``peak_flops``. ``flops`` is what the device executes (padded rows and tokens,
    attention included); ``model_flops`` is 2 x non-embedding parameters x unique
    tokens, the usual numerator of MFU. Seeds repeat the same work with other demonstrations, so totals
    multiply the first seed's figures by the number of seeds. ``peak_flops`` None:
    :func:`device_peak_flops` (``accelerator``'s datasheet, the local accelerator's, or
    a matmul measured on this CPU); ``peak_source`` says which.
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
    if n_devices * model_shards > 1 and xla and len(jax.devices()) >= n_devices * model_shards:
        mesh = make_mesh(n_devices, model=model_shards)
    out = dict(model=run_config.model, dtype=run_config.dtype, budget_bytes=int(budget),
               n_devices=n_devices, model_shards=model_shards,
               weight_bytes=weight_bytes(config, dtype, model_shards),
               kv_bytes_per_token=kv_bytes_per_token(config, dtype, model_shards),
               peak_flops=peak_flops, peak_source=peak_source, mfu=mfu,
               seeds=len(run_config.seeds), context_window=config.max_position_embeddings,
               settings=[])
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
    for name, ds in datasets.items():
        for k in run_config.shots:
            if ds.n_classes > k:
                out["settings"].append(dict(dataset=name, k=k, skipped=True))
                continue
            split = draw_split(ds, run_config, k, run_config.seeds[0])
            sj = seed_jobs(tokenizer, ds, split, run_config, k)
            rows, all_calls = [], []
            for tag, (ctx, pairs) in sj.jobs.items():
                e = calls_of(sj.pieces, ctx, pairs)
                rows.append(_job_row(config, dtype, tag, ctx, pairs, e, model_shards))
                all_calls += e["calls"]
                if progress:
                    log.info("  %s k=%d %s: %d pairs", name, k, tag, len(pairs))
            setting = _setting_totals(name, k, rows, all_calls)
            setting.update(longest_prompt=checked[name, k]["longest_prompt"],
                           longest_seed=checked[name, k]["longest_seed"])
            # The mesh's devices share the work: peak_flops is per device.
            setting["seconds_per_seed"] = setting["flops"] / (mfu * peak_flops * n_devices * model_shards)
            if xla and (mesh is not None or n_devices * model_shards == 1):
                e = calls_of(sj.pieces, *sj.jobs[setting["worst_job"]])
                setting.update(_xla_worst_call(config, dtype, e["calls"], model_shards,
                                               mode=run_config.mode, n_labels=ds.n_classes,
                                               mesh=mesh))
            out["settings"].append(setting)
    done = [s for s in out["settings"] if not s.get("skipped")]
    out["total_seconds"] = sum(s["seconds_per_seed"] for s in done) * len(run_config.seeds)
    out["total_flops"] = sum(s["flops"] for s in done) * len(run_config.seeds)
    return out


def plan_table(plan: dict[str, Any]) -> str:
    """Markdown summary of :func:`plan_run`."""
    gib = 2 ** 30
    lines = [f"model {plan['model']} ({plan['dtype']}): weights {plan['weight_bytes'] / gib:.2f} GiB, "
             f"KV {plan['kv_bytes_per_token'] / 2 ** 20:.3f} MiB per token; budget "
             f"{plan['budget_bytes'] / gib:.1f} GiB per device; mesh data {plan['n_devices']} x model "
             f"{plan['model_shards']}; time at {plan['mfu']:.0%} MFU of "
             f"{plan['peak_flops'] / 1e12:.3g} TFLOP/s per device "
             f"({plan.get('peak_source', 'given')})", "",
             "| dataset | k | pairs | unique tokens | flat tokens | flat/unique | TFLOP | micro-batches | "
             "compiles | peak GiB | XLA peak GiB | s per seed |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in plan["settings"]:
        if s.get("skipped"):
            lines.append(f"| {s['dataset']} | {s['k']} | skipped: more classes than demonstrations "
                         "| | | | | | | | | |")
            continue
        xla = f"{s['xla_peak_bytes'] / gib:.2f}" if "xla_peak_bytes" in s else "–"
        lines.append(f"| {s['dataset']} | {s['k']} | {s['pairs']:,} | {s['unique_tokens']:,} | "
                     f"{s['flat_tokens']:,} | {s['flat_tokens'] / s['unique_tokens']:.1f}x | "
                     f"{s['flops'] / 1e12:.1f} | {s['micro_batches']:,} | {s['compiles']} | "
                     f"{s['peak_bytes'] / gib:.2f} | {xla} | {s['seconds_per_seed']:.1f} |")
    done = [s for s in plan["settings"] if not s.get("skipped")]
    if done and "longest_prompt" in done[0]:
        w = max(done, key=lambda s: s["longest_prompt"])
        lines += ["", (f"longest prompt over all seeds and stages: {w['longest_prompt']:,} tokens "
                       f"({w['dataset']} k={w['k']} seed {w['longest_seed']}), context window "
                       f"{plan.get('context_window', 0):,}")]
    lines += ["", f"total over {plan['seeds']} seed(s): {plan['total_flops'] / 1e12:.1f} TFLOP, "
              f"about {plan['total_seconds'] / 60:.1f} min of forward passes at the stated MFU"]
    return "\n".join(lines)
