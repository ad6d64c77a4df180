"""The scoring engine's memory model and budgets, on the host with NumPy (no model,
nothing on a device): what :class:`sc_jax.scoring.ScoringEngine` needs on a device
for given inputs. The engine plans every call with :func:`plan_schedule` (the packed
schedule of :mod:`sc_jax.packing` within a memory budget) and checks the planned peak
against the budget before anything compiles; :mod:`sc_jax.plan` replays the same
schedule for a whole run.

What lives on a device while the engine runs:

* the weights, ``num_params x itemsize`` (divided over the ``model`` axis when the
  weights are sharded);
* KV caches of the trie, ``2 x L x K x Dh x itemsize`` bytes per cached token
  (:func:`kv_bytes_per_token`): while depth d grows, the parent level and the child
  level (written in place into one preallocated buffer) (:func:`level_peak_tokens`);
* one packed call's temporaries (:func:`packed_temp_bytes`): the gathered cache of
  its rows' slots, the scan's stacked new keys and values, and one layer's working
  set (attention scores in float32 over cache + packed tokens, the MLP).

:func:`plan_schedule` turns a memory budget into the engine's two knobs:
``max_tokens_per_batch`` (cap on B x W; the call shape is the cheapest whose
temporaries fit a quarter of what the weights leave) and ``max_cache_tokens`` (one
trie level: half of the rest, since two levels are alive at once).

The budget is ``device.memory_stats()["bytes_limit"]`` where the backend reports it
(GPUs, TPUs); otherwise (CPU) the host's physical memory, or what the caller passes.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np

from .packing import CostModel, build_schedule, cache_bucket, level_lengths
from .prompts import PromptPieces

#: Fraction of the budget left to the runtime (XLA workspace, fragmentation).
RESERVE = 0.10
#: Fraction of what the weights leave that one forward call's temporaries may use.
ACTIVATION_SHARE = 0.25
#: Largest token budget per call considered (CPU: batching beyond gains nothing).
MAX_TOKENS_PER_BATCH = {"cpu": 1 << 14, "default": 1 << 16}


# ------------------------------------------------------------------ query rows
def round_up(x: int, m: int) -> int:
    return -(-x // m) * m


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
    attention scores ``[B, H, W, m x S + W]`` in float32 twice (the cached and packed
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
        + BW * (H // model_shards) * (m * S + W) * (8 + e)
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

    schedule: "sc_jax.packing.Schedule"  # noqa: F821
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
