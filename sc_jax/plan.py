"""Memory plan of the scoring engine, derived from the device's memory and the model.

What lives on a device while :class:`sc_jax.scoring.ScoringEngine` runs:

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
levels are alive at once). :func:`plan_run` replays the engine's schedule without a
model (:func:`schedule`) and reports chunks, micro-batches, compiles, tokens, FLOPs and
the planned peak; :func:`xla_call_bytes` lowers the engine's real programs with
abstract shapes (``jax.ShapeDtypeStruct``: nothing is allocated, no weights are read)
and reads XLA's ``memory_analysis()`` for the same calls.

The budget is ``device.memory_stats()["bytes_limit"]`` where the backend reports it
(GPUs, TPUs); otherwise (CPU) the host's physical memory, or what the caller passes.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

#: Fraction of the budget left to the runtime (XLA workspace, fragmentation).
RESERVE = 0.10
#: Fraction of what the weights leave that one forward call's temporaries may use.
ACTIVATION_SHARE = 0.25
#: Largest token budget per call considered (CPU: batching beyond gains nothing).
MAX_TOKENS_PER_BATCH = {"cpu": 1 << 14, "default": 1 << 16}


def _itemsize(dtype) -> int:
    import jax.numpy as jnp

    return jnp.dtype(dtype).itemsize


def device_memory_bytes(device=None) -> int | None:
    """``bytes_limit`` of ``device`` (default: the first), None where the backend does
    not report one (CPU)."""
    import jax

    dev = device or jax.devices()[0]
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
    """The calls :meth:`ScoringEngine.score` makes for these inputs, in order (same
    chunking, micro-batching and grouping, computed with NumPy alone).

    shapes: :class:`sc_jax.scoring.EngineShapes`; contexts ``[M, i]``; pairs ``[N, 2]``;
    nr: query rows per pair (n labels in sequence mode, else 1); G: rows per group;
    qlen: tokens of every query row (row q * nr + j).
    """
    from .scoring import _query_batches, _query_groups, micro_batch, _round_up

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
            rows = _round_up(len(prefixes), B)
            calls.append(Call("grow", B, shapes.T_seg, lens[d - 1], B, lens[d], rows, parent_rows,
                              parent_len, count=rows // B))
            parent_rows, parent_len, leaf_of = rows, lens[d], inverse.reshape(-1)
        groups = _query_groups(chunk, len(contexts), pairs, nr, G, leaf_of, qlen)
        if groups is None:
            continue
        Bc = micro_batch(len(groups.leaf), lens[-1] + G * shapes.T_q, max_tokens_per_batch, n_devices)
        per_T: dict[int, int] = {}
        for _, _, T in _query_batches(groups, Bc, shapes.T_q):
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
class Budgets:
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
    return Budgets(int(budget_bytes), w, kvb, int(tokens), cache_tokens, int(temp), int(G))


def micro_batch_rows(tokens: int, width: int, n_devices: int) -> int:
    """Rows of ``width`` tokens in a call of at most ``tokens`` (unbounded row count)."""
    from .scoring import micro_batch

    return micro_batch(1 << 30, width, tokens, n_devices)


# ------------------------------------------------------------------ XLA's figures
def _abstract_model(config, dtype):
    from flax import nnx

    from .model import Decoder

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
    import jax
    import jax.numpy as jnp

    from .model import KVCache
    from . import scoring

    gd, st = _abstract_model(config, dtype)
    L, K, Dh = config.num_layers, config.num_kv_heads, config.head_dim
    sds = jax.ShapeDtypeStruct
    if mesh is not None:
        from .sharding import kv_sharding, state_shardings

        st = jax.tree.map(lambda x, s: sds(x.shape, x.dtype, sharding=s), st, state_shardings(mesh, st))

    def shard(spec):
        if mesh is None:
            return None
        from jax.sharding import NamedSharding, PartitionSpec as P

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
    from .sharding import MODEL, axis_size

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
#: Dense bfloat16 peak of one H100 SXM (NVIDIA's datasheet), the default for time estimates.
H100_BF16_PEAK_FLOPS = 989e12


def _engine_calls(config, dtype, pieces, ctx, pairs, mode, *, budget_bytes, n_devices,
                  platform, max_tokens_per_batch=None, max_cache_tokens=None, max_group=64,
                  model_shards=1):
    """(Budgets, calls, unique tokens, flat tokens) of one engine call, as
    :meth:`ScoringEngine.score` would plan and run it."""
    from .scoring import _query_rows, engine_shapes

    n = len(pieces.labels)
    nr = n if mode == "sequence" else 1
    # The engine's shapes, without a model: the same arithmetic as ScoringEngine.shapes.
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
    rows, _, _ = _query_rows(pieces, mode, range(len(pieces.queries)))
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


def _call_flops(config, call: Call) -> float:
    """Forward FLOPs of one call: 2 x non-embedding parameters per new token, plus
    attention (q.k and p.v, 4 x L x H x Dh per visible key), label rows ignored."""
    c = config
    nonembed = c.num_params() - c.vocab_size * c.hidden_size * (1 if c.tie_word_embeddings else 2)
    per_key = 4 * c.num_layers * c.num_heads * c.head_dim
    BT = call.B * call.T
    return call.count * (2 * nonembed * BT + per_key * BT * (call.S + call.T / 2))


def plan_run(run_config, *, device_memory: int | None = None, n_devices: int = 1, model_shards: int = 1,
             peak_flops: float = H100_BF16_PEAK_FLOPS, mfu: float = 0.4, xla: bool = True,
             progress: bool = False) -> dict[str, Any]:
    """A dry run of ``sc-jax run``: what one seed of every (dataset, k) would score,
    with no weights read and nothing scored. Returns a JSON-able dict with, per
    (dataset, k) and size: prompts, (context, query) pairs, ``unique_tokens`` (what
    the trie computes) and ``flat_tokens`` (full prompts), FLOPs, chunks,
    micro-batches, compiles, the planned ``peak_bytes`` and (``xla=True``) XLA's
    ``xla_peak_bytes`` for the worst program, and a time estimate at ``mfu`` of
    ``peak_flops``. ``flops`` is what the device executes (padded rows and tokens,
    attention included); ``model_flops`` is 2 x non-embedding parameters x unique
    tokens, the usual numerator of MFU. Seeds repeat the same work with other demonstrations, so totals
    multiply the first seed's figures by the number of seeds.
    """
    import jax.numpy as jnp

    from .data import load_task, split_protocol
    from .experiment import seed_jobs
    from .loading import _DTYPES, load_config_and_tokenizer

    config, tokenizer = load_config_and_tokenizer(run_config.model)
    dtype = _DTYPES[run_config.dtype]
    import jax

    platform = "cpu" if device_memory is None and jax.default_backend() == "cpu" else "default"
    budget = device_memory or device_memory_bytes() or host_memory_bytes()
    files = dict(run_config.data_files)
    mesh = None
    if n_devices * model_shards > 1 and xla and len(jax.devices()) >= n_devices * model_shards:
        from .sharding import make_mesh

        mesh = make_mesh(n_devices, model=model_shards)
    out = dict(model=run_config.model, dtype=run_config.dtype, budget_bytes=int(budget),
               n_devices=n_devices, model_shards=model_shards,
               weight_bytes=weight_bytes(config, dtype, model_shards),
               kv_bytes_per_token=kv_bytes_per_token(config, dtype, model_shards),
               peak_flops=peak_flops, mfu=mfu,
               seeds=len(run_config.seeds), settings=[])
    for name in run_config.datasets:
        ds = load_task(name, data_file=files.get(name), data_dir=run_config.data_dir)
        for k in run_config.shots:
            if ds.n_classes > k:
                out["settings"].append(dict(dataset=name, k=k, skipped=True))
                continue
            split = split_protocol(ds, k=k, test_size=run_config.test_size, seed=run_config.seeds[0],
                                   test_seed=run_config.test_seed)
            sj = seed_jobs(tokenizer, ds, split, run_config, k)
            rows, all_calls = [], []
            nonembed = config.num_params() - config.vocab_size * config.hidden_size * (
                1 if config.tie_word_embeddings else 2)
            for tag, (ctx, pairs) in sj.jobs.items():
                e = _engine_calls(config, dtype, sj.pieces, ctx, pairs, run_config.mode,
                                  budget_bytes=budget, n_devices=n_devices, platform=platform,
                                  max_tokens_per_batch=run_config.max_tokens_per_batch,
                                  model_shards=model_shards)
                peak = peak_bytes(config, dtype, e["calls"], model_shards)
                flops = sum(_call_flops(config, c) for c in e["calls"])
                rows.append(dict(job=tag, size=int(ctx.shape[1]), contexts=int(len(ctx)),
                                 pairs=int(len(pairs)), unique_tokens=e["unique_tokens"],
                                 flat_tokens=e["flat_tokens"], flops=flops,
                                 padded_tokens=sum(c.count * c.B * c.T for c in e["calls"]),
                                 model_flops=2 * nonembed * e["unique_tokens"],
                                 chunks=sum(1 for c in e["calls"] if c.kind == "score"),
                                 micro_batches=sum(c.count for c in e["calls"]),
                                 programs=len({c.key for c in e["calls"]}),
                                 max_tokens_per_batch=e["tokens"], max_cache_tokens=e["cache"], **peak))
                all_calls += e["calls"]
                if progress:
                    log.info("  %s k=%d %s: %d pairs", name, k, tag, len(pairs))
            worst = max(rows, key=lambda r: r["peak_bytes"])
            setting = dict(dataset=name, k=k, jobs=rows,
                           pairs=sum(r["pairs"] for r in rows),
                           unique_tokens=sum(r["unique_tokens"] for r in rows),
                           flat_tokens=sum(r["flat_tokens"] for r in rows),
                           flops=sum(r["flops"] for r in rows),
                           model_flops=sum(r["model_flops"] for r in rows),
                           padded_tokens=sum(r["padded_tokens"] for r in rows),
                           micro_batches=sum(r["micro_batches"] for r in rows),
                           compiles=len({c.key for c in all_calls}),
                           peak_bytes=worst["peak_bytes"], worst_job=worst["job"])
            # The mesh's devices share the work: peak_flops is per device.
            setting["seconds_per_seed"] = setting["flops"] / (mfu * peak_flops * n_devices * model_shards)
            if xla and (mesh is not None or n_devices * model_shards == 1):
                ctx, pairs = sj.jobs[worst["job"]]
                e = _engine_calls(config, dtype, sj.pieces, ctx, pairs, run_config.mode,
                                  budget_bytes=budget, n_devices=n_devices, platform=platform,
                                  max_tokens_per_batch=run_config.max_tokens_per_batch,
                                  model_shards=model_shards)
                # XLA's figure for the planned worst call of the worst job (one compile
                # per distinct program would be too slow for 7B).
                def planned(c):
                    return peak_bytes(config, dtype, [c], model_shards)["peak_bytes"]

                worst_call = max(e["calls"], key=planned)
                x = xla_peak_bytes(config, dtype, [worst_call], mode=run_config.mode,
                                   n_labels=ds.n_classes, mesh=mesh)
                setting["xla_peak_bytes"] = x["xla_peak_bytes"]
                setting["planned_peak_of_that_call"] = planned(worst_call)
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
             f"{plan['model_shards']}; time at {plan['mfu']:.0%} MFU of {plan['peak_flops'] / 1e12:.0f} "
             "TFLOP/s per device", "",
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
    lines += ["", f"total over {plan['seeds']} seed(s): {plan['total_flops'] / 1e12:.1f} TFLOP, "
              f"about {plan['total_seconds'] / 60:.1f} min of forward passes at the stated MFU"]
    return "\n".join(lines)
