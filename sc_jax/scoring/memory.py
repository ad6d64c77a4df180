"""The scoring engine's memory model and budgets, on the host with NumPy (no model,
nothing on a device): what :class:`sc_jax.scoring.engine.ScoringEngine` needs on a device
for given inputs. The engine plans every call with :func:`plan_schedule` (the packed
schedule of :mod:`sc_jax.scoring.schedule` within a memory budget) and checks the planned peak
against the budget before anything compiles; :mod:`sc_jax.experiment.execution.plan` replays
the same schedule for a whole run.

What lives on a device while the engine runs:

* the weights, ``num_params x itemsize`` (divided over the ``model`` axis when the
  weights are sharded);
* KV caches of the trie, ``2 x L x K x Dh x itemsize`` bytes per cached token
  (:func:`kv_bytes_per_token`): one token pool, preallocated, holding every node's
  own tokens (:func:`level_peak_tokens`);
* one packed call's temporaries (:func:`packed_temp_bytes`): the gathered cache of
  its rows' slots, the scan's stacked new keys and values, and one layer's working
  set (attention scores in float32 over cache + packed tokens, the MLP).

:func:`plan_schedule` turns a memory budget into the engine's two knobs:
``max_tokens_per_batch`` (cap on B x W; the call shape is the cheapest whose
temporaries fit a quarter of what the weights leave) and ``max_cache_tokens`` (the
token pool: the rest; on a CPU, whose budget is the host's memory, at most
:data:`POOL_CAP`). Both follow from the model and the budget alone, so every dataset
gets the same programs.

The budget is ``device.memory_stats()["bytes_limit"]`` where the backend reports it
(GPUs, TPUs); otherwise (CPU) the host's physical memory, or what the caller passes.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np

from sc_jax.runtime import ranges

from sc_jax.runtime.multihost import smallest
from sc_jax.scoring.packing import PackShape, pow2_at_least
from sc_jax.scoring.schedule import Schedule, build_schedule, schedule_geometry
from sc_jax.scoring.prompts import PromptPieces

#: Fraction of the budget left to the runtime (XLA workspace, fragmentation).
RESERVE = 0.10
#: Fraction of what the weights leave that one forward call's temporaries may use.
ACTIVATION_SHARE = 0.25
#: Largest token budget per call considered (CPU: batching beyond gains nothing).
MAX_TOKENS_PER_BATCH = {"cpu": 1 << 10, "default": 1 << 16}
#: Row width W of a call: long enough for any demonstration or query of the usual
#: datasets (wider where one is longer), short enough that a row's packed keys stay a
#: small part of its attention. A CPU runs small models, whose attention weighs more.
ROW_WIDTH = {"cpu": 128, "default": 512}
#: Cached keys per row in units of W: early depths put many small nodes in one row, and
#: a deep one still a few (on Qwen2-7B's Rotten Tomatoes plan, 2 x W left 22% of the
#: executed tokens empty, 4 x W 10%, for 6% more attention FLOPs); a node of k = 8
#: demonstrations of up to 256 tokens fits (W = 512), so seeds whose demonstrations
#: differ in length share the program. A CPU runs small models, whose attention weighs
#: more against their dense work: 2 x W there (a node of k = 4 demonstrations of up to
#: 64 tokens; k = 8 takes 512 keys, the next power of two).
CACHE_ROWS = {"cpu": 2, "default": 4}
#: A CPU's token pool (its budget is the host's memory, not a device's): at most this
#: many tokens and bytes, a power of two of tokens (tiny models: 2^16 tokens; a 135M
#: model in float32: 2^14 tokens of 46 KB).
POOL_CAP = {"tokens": 1 << 16, "bytes": 1 << 30}
#: Readouts (query rows' label positions) per call allowed for in units of B x W: one
#: per 8 tokens (a query row holds the template's prefixes and a text; SST-2's short
#: sentences needed one per 10); a schedule needing more grows R.
READOUT_SPACING = 8


# ------------------------------------------------------------------ query rows
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


class PlanError(ValueError):
    """The model or a single context does not fit the memory budget."""


# ------------------------------------------------------------------ the packed engine's plan
def schedule_inputs(pieces: PromptPieces, mode: str) -> dict:
    """What :func:`sc_jax.scoring.schedule.build_schedule` needs of the prompts: segment
    lengths (no BOS), BOS length, query-row lengths and readouts per query row."""
    k = len(pieces.demos)
    rows, gathers, _ = query_rows(pieces, mode, range(len(pieces.queries)))
    return dict(seg_len=np.asarray([len(pieces.segment(j)) for j in range(k)], np.int64),
                n_bos=len(pieces.bos), qlen=np.asarray([len(r) for r in rows], np.int64),
                readouts=np.asarray([len(g) for g in gathers], np.int64))


def packed_temp_bytes(config, dtype, B: int, W: int, keys: int, *, R: int = 0,
                      sequence: bool = False, model_shards: int = 1) -> int:
    """Estimated temporaries of one packed call on one device.

    The gathered cache ``[L, B, keys, K, Dh] x 2`` (the model program's input); the
    scan's stacked new keys and values ``[L, B, W, K, Dh] x 2`` (its output); one
    layer's working set: hidden states, q/k/v with their float32 rotary copies,
    attention scores ``[B, H, W, keys + W]`` in float32 twice (the cached and packed
    keys' scores, then their concatenation) plus probabilities, the MLP's
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
        + BW * (H // model_shards) * (keys + W) * (8 + e)
    vocab = 2 * R * c.vocab_size * 4 // model_shards if sequence else 0
    return int(B * keys * kv_row + BW * kv_row + layer + BW * D * e + vocab)


@dataclasses.dataclass(frozen=True)
class Budgets:
    """The engine's knobs from a memory budget, and the figures behind them:
    ``max_tokens_per_batch`` caps B x W, ``max_cache_tokens`` the token pool;
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

    schedule: Schedule
    budgets: Budgets


def level_peak_tokens(sched) -> int:
    """Cached tokens on a device: the token pool the engine allocates
    (:attr:`sc_jax.scoring.schedule.Schedule.pool`), held for the whole run."""
    return int(sched.pool)


def pool_budget(free_bytes: int, kvb: int, platform: str) -> int:
    """Tokens of the engine's token pool from the bytes the weights and one call leave
    (``free_bytes``): all of them (a multiple of 1024 tokens), on a CPU at most
    :data:`POOL_CAP` (a power of two)."""
    tokens = int(free_bytes // kvb) // 1024 * 1024
    if platform == "cpu":
        cap = min(POOL_CAP["tokens"], POOL_CAP["bytes"] // kvb)
        tokens = min(tokens, 1 << (cap.bit_length() - 1))
    return max(tokens, 1)


def size_text(nbytes: int) -> str:
    """``nbytes`` in GiB, or in MiB or bytes where GiB would print 0.00."""
    if nbytes >= 2 ** 28:
        return f"{nbytes / 2 ** 30:.2f} GiB"
    return f"{nbytes / 2 ** 20:.2f} MiB" if nbytes >= 2 ** 20 else f"{int(nbytes)} bytes"


def weights_fit(config, dtype, budget_bytes: int, model_shards: int = 1) -> int:
    """Bytes of the weights per device; :class:`PlanError` where they leave nothing
    of the budget (after :data:`RESERVE`)."""
    w = weight_bytes(config, dtype, model_shards)
    usable = int(budget_bytes * (1 - RESERVE))
    if w >= usable:
        raise PlanError(f"the weights need {size_text(w)} per device, more than the "
                        f"{size_text(usable)} usable of a {size_text(budget_bytes)} budget "
                        f"(device_memory, --device-memory; after a {RESERVE:.0%} reserve): give "
                        "a larger budget, shard the weights over more devices or use a "
                        "smaller dtype")
    return w


def call_shape(*, longest: int, deepest: int, mode: str, n_labels: int, max_tokens: int,
               n_devices: int = 1, platform: str = "default", fits=None) -> PackShape:
    """The engine's call shape: a function of the model, its dtype and the memory budget
    (through ``max_tokens`` and ``fits``) and of the mesh (``n_devices``), not of the
    seed or the dataset (``longest`` and ``deepest`` only widen it), so that
    every seed and dataset of a run, and the next run on the machine, use one model
    program (:attr:`PackShape.program`).

    ``W``: :data:`ROW_WIDTH` (a power of two at least ``longest``, the longest item,
    where that is longer); ``cache``: :data:`CACHE_ROWS` x W cached keys per row (a
    power of two at least ``deepest``, the deepest level's tokens per node, where
    that is longer); ``B``: the most rows, ``n_devices`` times a power of two, with
    B x W <= ``max_tokens`` and ``fits(shape)`` (the call's temporaries within the
    budget's share); ``R``: one readout per :data:`READOUT_SPACING` tokens; ``labels``:
    the classes padded to a power of two, at least 8 (first-token mode)."""
    W = max(ROW_WIDTH.get(platform, ROW_WIDTH["default"]), pow2_at_least(longest))
    cache = max(CACHE_ROWS.get(platform, CACHE_ROWS["default"]) * W, pow2_at_least(deepest))
    labels = 0 if mode == "sequence" else max(8, pow2_at_least(n_labels))

    def shape(B):
        R = max(8, pow2_at_least(B * W // READOUT_SPACING))
        return PackShape(B, W, cache, R, labels)

    best = shape(n_devices)
    B = n_devices * 2
    while B * W <= max_tokens and (fits is None or fits(shape(B))):
        best = shape(B)
        B *= 2
    return best


@dataclasses.dataclass(frozen=True)
class MemoryPolicy:
    """Where the memory budget and the call shape are decided, once, and handed to the
    engine (:class:`sc_jax.scoring.engine.ScoringEngine`), to the run's up-front check and to
    ``sc-jax plan``.

    ``budget_bytes`` per device, and whether it is ``enforced`` (a budget given or
    reported by the device is; the host's memory standing in for a CPU's is not);
    the mesh (``n_devices`` on the data axis, ``model_shards``); the backend
    ``platform`` ("cpu" or "default"); the knobs a user may fix
    (``max_tokens_per_batch``, ``max_cache_tokens``; None: derived from the budget).
    """

    budget_bytes: int
    enforced: bool
    n_devices: int = 1
    model_shards: int = 1
    platform: str = "default"
    max_tokens_per_batch: int | None = None
    max_cache_tokens: int | None = None

    @classmethod
    def resolve(cls, device_memory: int | None = None, *, n_devices: int = 1, model_shards: int = 1,
                max_tokens_per_batch: int | None = None, max_cache_tokens: int | None = None,
                platform: str | None = None, agree: bool = True) -> MemoryPolicy:
        """The policy of this process's devices: ``device_memory`` bytes per device if
        given, else the device's ``bytes_limit`` (the smallest over the processes of a
        multi-process run, which all plan the same calls), else the host's memory,
        not enforced. ``platform``: default from the backend (a given budget on a
        CPU plans as an accelerator would, for ``sc-jax plan``'s figures). ``agree``:
        take the smallest figure over the processes (a collective every process must
        reach; a dry run that only reports may leave it). Each given figure is checked
        against its range (:mod:`sc_jax.runtime.ranges`) first."""
        ranges.check("device_memory_bytes", device_memory, field="device_memory")
        ranges.check("max_tokens_per_batch", max_tokens_per_batch)
        ranges.check("max_cache_tokens", max_cache_tokens)
        dev = device_memory_bytes()
        least = smallest if agree else int
        if device_memory is not None:
            budget, enforced = int(device_memory), True
        elif dev is not None:
            budget, enforced = least(dev), True
        else:
            budget, enforced = least(host_memory_bytes()), False
        if platform is None:
            platform = "cpu" if jax.default_backend() == "cpu" and device_memory is None else "default"
        return cls(budget, enforced, int(n_devices), int(model_shards), platform,
                   None if max_tokens_per_batch is None else int(max_tokens_per_batch),
                   None if max_cache_tokens is None else int(max_cache_tokens))

    def plan(self, config, dtype, pieces: PromptPieces, jobs, mode: str, *, prefer=None) -> Planned:
        """The packed schedule of ``jobs`` (``(contexts [M, i], pairs [N, 2])`` each)
        under this policy: :func:`plan_schedule`. Jobs with no pairs are left out, as
        the engine leaves them; the engine, the run's check and ``sc-jax plan`` all plan
        through here."""
        jobs = [(np.asarray(c, np.int64), np.asarray(p, np.int64).reshape(-1, 2)) for c, p in jobs]
        jobs = [(c, p) for c, p in jobs if len(p)]
        return plan_schedule(config, dtype, pieces, jobs, mode, budget_bytes=self.budget_bytes,
                             n_devices=self.n_devices, model_shards=self.model_shards,
                             platform=self.platform, max_tokens_per_batch=self.max_tokens_per_batch,
                             max_cache_tokens=self.max_cache_tokens, enforce=self.enforced,
                             prefer=prefer)


def plan_schedule(config, dtype, pieces: PromptPieces, jobs, mode: str, *, budget_bytes: int,
                  n_devices: int = 1, model_shards: int = 1, platform: str = "default",
                  max_tokens_per_batch: int | None = None, max_cache_tokens: int | None = None,
                  enforce: bool = True, prefer: PackShape | None = None) -> Planned:
    """The engine's packed schedule of ``jobs`` (``(contexts, pairs)`` each) within
    ``budget_bytes`` per device. Knobs left as None are derived: the call shape
    (:func:`call_shape`) is the largest whose temporaries fit a share
    (:data:`ACTIVATION_SHARE`) of what the weights leave, and the token pool the rest
    (:func:`pool_budget`). ``prefer``: an earlier schedule's shape, kept where it holds
    these jobs (so a process that met a longer item keeps its wider program). Raises
    :class:`PlanError`, naming the numbers, when the weights or one context with its
    smallest call cannot fit, or (``enforce``) when the planned peak is over budget."""
    w = weights_fit(config, dtype, budget_bytes, model_shards)
    kvb = kv_bytes_per_token(config, dtype, model_shards)
    gib = 2 ** 30
    avail = int(budget_bytes * (1 - RESERVE)) - w
    share = ACTIVATION_SHARE * avail
    inputs = schedule_inputs(pieces, mode)
    seq = mode == "sequence"
    longest, deepest = schedule_geometry(jobs, seg_len=inputs["seg_len"], n_bos=inputs["n_bos"],
                                         qlen=inputs["qlen"])

    def temp(sh: PackShape) -> int:
        return packed_temp_bytes(config, dtype, sh.B, sh.W, sh.cache, R=sh.R, sequence=seq,
                                 model_shards=model_shards)

    cache = max_cache_tokens or pool_budget(avail - share, kvb, platform)
    if max_cache_tokens is None and cache < deepest:
        raise PlanError(
            f"one context of {deepest} padded tokens needs "
            f"{deepest * kvb / gib:.3f} GiB of KV cache, "
            f"but only {(avail - share) / gib:.3f} GiB per device remain after the weights "
            f"({w / gib:.2f} GiB) and one call's share in a {budget_bytes / gib:.2f} GiB budget")
    tokens = max_tokens_per_batch or MAX_TOKENS_PER_BATCH.get(platform, MAX_TOKENS_PER_BATCH["default"])
    fits = None if max_tokens_per_batch else (lambda sh: temp(sh) <= share)
    shape = call_shape(longest=longest, deepest=deepest, mode=mode,
                       n_labels=len(pieces.labels), max_tokens=tokens, n_devices=n_devices,
                       platform=platform, fits=fits)
    if prefer is not None and prefer.W >= longest and prefer.cache >= deepest \
            and prefer.labels == shape.labels and prefer.B % n_devices == 0 \
            and prefer.B * prefer.W <= max(tokens, prefer.W * n_devices) \
            and (fits is None or fits(prefer)):
        shape = prefer
    sched = build_schedule(jobs, shape=shape, nr=len(pieces.labels) if seq else 1,
                           max_cache_tokens=cache, n_devices=n_devices, **inputs)
    t = temp(sched.shape)
    levels = level_peak_tokens(sched) * kvb
    b = Budgets(int(budget_bytes), w, kvb, int(tokens), int(cache), t, w + levels + t, levels)
    if enforce and b.peak_bytes > budget_bytes:
        raise PlanError(
            f"the planned peak is {b.peak_bytes / gib:.2f} GiB per device (weights "
            f"{w / gib:.2f}, KV caches {levels / gib:.2f}, one call's temporaries "
            f"{t / gib:.2f}), over the {budget_bytes / gib:.2f} GiB budget: lower "
            f"max_tokens_per_batch ({tokens}) or max_cache_tokens ({cache})")
    return Planned(sched, b)
