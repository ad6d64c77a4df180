"""What the engine's calls cost, counted without running them: the cost model of a
packed call (:class:`CostModel`) and a device's pace (:class:`Roofline`), the keys
its attention scores (:func:`attention_reads`, :func:`call_trips`), tokens and FLOPs
of a schedule call by call (:func:`replay`), and one layer's attention measured on
this backend (:func:`measured_attention`). XLA's own figures of the model program
are in :mod:`sc_jax.scoring.xla_costs`, the device's peaks in
:mod:`sc_jax.runtime.devices`; :mod:`sc_jax.experiment.execution.plan` assembles them into a
dry run of ``sc-jax run``.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import numpy as np

from sc_jax.models import attention as attn
from sc_jax.scoring.attention_choice import layer_call
from sc_jax.scoring.memory import query_rows
from sc_jax.scoring.packing import PackedDepth, PackShape
from sc_jax.scoring.schedule import Schedule


# ------------------------------------------------------------------ the cost model
@dataclasses.dataclass(frozen=True)
class CostModel:
    """FLOPs and memory traffic of a packed call, per part.

    FLOPs: ``token`` per executed token (2 x non-embedding parameters), ``key`` per
    (token, scored key) (4 x L x H x Dh: q.k and p.v). Bytes: the dense work reads the weights once per call (``weights``) and moves
    ``act`` bytes of activations per executed token (each layer's hidden states, q, k,
    v, attention output and MLP gate, up and product, written and read once); the
    attention reads every scored key's K and V once per query block (``kv`` bytes per
    key and layer) and moves, per (token, head, scored key), scores and probabilities: XLA's paths write the float32 scores, read them for the
    maximum and again for the exponentials, and write and read the probabilities in the
    value dtype (12 + 2 x itemsize bytes); cuDNN's fused kernel keeps them on chip and
    reads only the mask's bias (itemsize bytes). The readout (:meth:`readout`) is the
    unembedding of the call's ``R`` readout positions, against the label rows or the
    whole vocabulary. Times follow from a :class:`Roofline`.
    """

    token: float
    key: float
    weights: float = 0.0
    act: float = 0.0
    kv: float = 0.0
    itemsize: int = 4
    layers: int = 1
    heads: int = 1
    hidden: int = 0
    vocab: int = 0

    @classmethod
    def of(cls, config, itemsize: int = 4) -> CostModel:
        """The costs of ``config`` with weights and activations of ``itemsize`` bytes."""
        c, e = config, int(itemsize)
        embed = c.vocab_size * c.hidden_size * (1 if c.tie_word_embeddings else 2)
        token = 2.0 * (c.num_params() - embed)
        act = c.num_layers * e * (6 * c.hidden_size + 3 * c.intermediate_size
                                  + 2 * (c.num_heads + 2 * c.num_kv_heads) * c.head_dim)
        return cls(token, 4.0 * c.num_layers * c.num_heads * c.head_dim,
                   weights=float((c.num_params() - embed) * e), act=float(act),
                   kv=2.0 * c.num_kv_heads * c.head_dim * e, itemsize=e, layers=c.num_layers,
                   heads=c.num_heads, hidden=c.hidden_size, vocab=c.vocab_size)

    def dense(self, B: int, W: int) -> tuple[float, float]:
        """(FLOPs, bytes) of a call's dense work: projections, MLP, norms."""
        return B * W * self.token, self.weights + B * W * self.act

    def readout(self, R: int, labels: int, sequence: bool) -> tuple[float, float]:
        """(FLOPs, bytes) of a call's readout: ``R`` hidden states ``[R, D]`` against
        the output embedding. First-token mode multiplies the ``labels`` rows of the
        table alone (``[R, labels]`` float32 logits); sequence mode the whole table
        ``[V, D]`` (read once per call), its float32 logits ``[R, V]`` written, then
        read by the log-softmax's maximum and its sum, and its result written and read
        by the gather of the targets."""
        rows = self.vocab if sequence else labels
        flops = 2.0 * R * self.hidden * rows
        passes = 5 if sequence else 1
        return flops, rows * self.hidden * self.itemsize + passes * R * rows * 4.0

    def attention(self, B: int, W: int, scored: float, reads: float, implementation: str) -> tuple[float, float]:
        """(FLOPs, bytes) of a call's attention: ``scored`` keys per token, ``reads`` key
        reads per row (K and V of each key, once per query block that scores it)."""
        # The fused kernels keep their scores on chip; the XLA paths write and read them.
        score_bytes = self.itemsize if implementation in ("cudnn", "pallas") else 12 + 2 * self.itemsize
        traffic = self.layers * (B * W * scored * self.heads * score_bytes + B * reads * self.kv)
        return B * W * scored * self.key, traffic


@dataclasses.dataclass(frozen=True)
class Roofline:
    """A device's pace: ``flops`` (FLOP/s at the stated utilisation) and ``bytes``
    (memory bytes/s), and where they come from. A part of a call takes
    max(FLOPs / flops, bytes / bytes): compute-bound or memory-bound."""

    flops: float
    bytes: float
    source: str = ""

    def seconds(self, flops: float, nbytes: float) -> float:
        return max(flops / self.flops, nbytes / self.bytes)


def attention_reads(implementation: str, *, W: int, C: int, scored: float, bq: int = 0,
                    G: int = 1, platform: str = "default") -> tuple[float, float]:
    """(scored keys per token, key reads per row) of one call: the dense paths score
    all ``C + W`` keys and read them once per row (cuDNN: once per 128-query tile);
    the block-sparse path (``scored`` keys per query block of ``bq``; on an
    accelerator every key, ``scored = C + W``) reads them once per block, the Pallas
    kernel once per block and query head of a group of ``G`` (on a TPU once per row:
    its Mosaic form keeps a row's keys in VMEM across the row's query blocks)."""
    if implementation == "pallas" and platform == "tpu":
        return scored, float(C + W)
    if implementation in ("blocked", "pallas"):
        return scored, (W // bq) * scored * (G if implementation == "pallas" else 1)
    tiles = -(-W // 128) if implementation == "cudnn" else 1
    return float(C + W), float(tiles * (C + W))


def call_trips(st: PackedDepth, r0: int, B: int, W: int, C: int, bq: int, bk: int) -> int:
    """Keys the block-sparse attention scores per token in the call of rows ``r0 ..
    r0 + B`` of ``st``: its loop trips over cached blocks of ``bk`` and packed blocks
    of ``bq``, the largest over the call's query blocks (as
    :func:`sc_jax.models.attention.block_ranges` finds them on the device)."""
    a, b = np.searchsorted(st.row, [r0, r0 + B])
    if a == b:
        return bk + bq
    row, off, ln, slot = st.row[a:b] - r0, st.off[a:b], st.length[a:b], st.slot[a:b]
    first, last = off // bq, (off + ln - 1) // bq
    n = last - first + 1
    item = np.repeat(np.arange(len(off)), n)
    qb = first[item] + np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
    key = row[item] * (W // bq) + qb
    nb = B * (W // bq)
    lo = np.full(nb, C, np.int64)
    hi = np.zeros(nb, np.int64)
    start = np.full(nb, W, np.int64)
    np.minimum.at(lo, key, slot[item] * st.S)
    np.maximum.at(hi, key, (slot[item] + 1) * st.S)
    np.minimum.at(start, key, off[item])
    used = hi > 0
    c_lo = np.minimum(lo[used] // bk, C // bk - 1)
    c_n = int((-(-np.minimum(hi[used], C) // bk) - c_lo).max())
    n_n = int((np.arange(nb)[used] % (W // bq) - start[used] // bq + 1).max())
    return c_n * bk + n_n * bq


# ------------------------------------------------------------------ a schedule, call by call
def depth_name(depth: int) -> str:
    """``"d=3"``: the items that continue the nodes of depth 2 (segments making
    depth-3 nodes, and query rows after contexts of 2 demonstrations)."""
    return f"d={depth}"


def replay(sched: Schedule, config, *, attention: str = "dense", platform: str = "default",
           itemsize: int = 4, mode: str = "first_token") -> dict[str, Any]:
    """Every call of ``sched`` as the engine runs it, counted: ``calls``, ``rows``
    (rows holding at least one item), ``unique_tokens`` (the items' real tokens: each
    trie node's segment once per chunk, every query row), ``executed_tokens`` (each
    call's B x W), ``padding_tokens``, ``call_sizes`` (rows per call -> calls),
    ``programs`` (distinct model programs: one per call size,
    :attr:`sc_jax.scoring.schedule.Schedule.programs`), and
    what the calls cost (:class:`CostModel`, activations of ``itemsize`` bytes, the
    packed calls' ``attention`` with ``platform``'s blocks): ``dense_flops``,
    ``dense_bytes`` (projections, MLP and the readout, of which ``readout_flops`` and
    ``readout_bytes``: every call's ``R`` readouts against the label rows, or in
    ``mode`` "sequence" the whole vocabulary), ``attention_flops``, ``attention_bytes``, ``scored_keys`` (keys
    scored per executed token, on average) and ``flops`` (their sum); per depth
    (``depths``, by :func:`depth_name`, in depth order) the same with ``segment_tokens`` /
    ``query_tokens`` (the unique tokens of each kind), the depth's slot length ``S``
    and slots per row ``m``."""
    sh = sched.shape
    cost = CostModel.of(config, itemsize)
    # The kernel's blocks for "pallas", the XLA blocked path's for the rest.
    bq, bk = attn.blocks("pallas" if attention == "pallas" else "blocked", platform, sh.W, sh.cache)
    G = config.num_heads // config.num_kv_heads
    depths: dict[str, dict] = {}
    for _, st, r0, sh in sched.calls():  # W and cache are those of every call size
        a, b = np.searchsorted(st.row, [r0, r0 + sh.B])
        lens = st.length[a:b]
        seg = int(lens[st.kind[a:b] == 0].sum())
        acc = depths.setdefault(depth_name(st.depth), {
            "S": st.S, "m": st.m, "calls": 0, "rows": 0, "unique_tokens": 0, "segment_tokens": 0,
            "query_tokens": 0, "executed_tokens": 0, "padding_tokens": 0, "flops": 0.0,
            "dense_flops": 0.0, "dense_bytes": 0.0, "attention_flops": 0.0, "attention_bytes": 0.0,
            "readout_flops": 0.0, "readout_bytes": 0.0, "scored_keys": 0.0, "call_sizes": {}})
        acc["call_sizes"][sh.B] = acc["call_sizes"].get(sh.B, 0) + 1
        if attention == "pallas" or (attention == "blocked" and platform == "cpu"):
            trips = call_trips(st, r0, sh.B, sh.W, sh.cache, bq, bk)
        else:  # the accelerator's blocked path visits every key block (static loops)
            trips = sh.cache + sh.W
        scored, reads = attention_reads(attention, W=sh.W, C=sh.cache, scored=trips, bq=bq, G=G,
                                        platform=platform)
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
    for acc in depths.values():
        acc["padding_tokens"] = acc["executed_tokens"] - acc["unique_tokens"]
        acc["scored_keys"] /= max(acc["executed_tokens"], 1)
    depths = dict(sorted(depths.items(), key=lambda kv: int(kv[0][2:])))
    total = {key: sum(s[key] for s in depths.values()) for key in (
        "calls", "rows", "unique_tokens", "executed_tokens", "padding_tokens", "flops", "dense_flops",
        "dense_bytes", "attention_flops", "attention_bytes", "readout_flops", "readout_bytes")}
    total["call_sizes"] = {}
    for s in depths.values():
        for b, n in s["call_sizes"].items():
            total["call_sizes"][b] = total["call_sizes"].get(b, 0) + n
    total["scored_keys"] = sum(s["scored_keys"] * s["executed_tokens"] for s in depths.values()) \
        / max(total["executed_tokens"], 1)
    return dict(total, programs=len(sched.programs), attention=attention, depths=depths)


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
    (q, k, v, ck, cv), tokens = layer_call(config, dtype, shape, rows=B)
    inputs = attn.packed_inputs(tokens, implementation=attention, windows=False, platform=platform)
    f = jax.jit(lambda *a: attn.packed_attention(*a, implementation=attention))
    f(q, k, v, ck, cv, inputs, 0).block_until_ready()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        f(q, k, v, ck, cv, inputs, 0).block_until_ready()
        times.append(time.perf_counter() - t)
    # The keys it scored, counted as replay() counts them: the traced trips of the CPU's
    # blocked path and of the kernel, every key for the rest (the accelerator's blocked
    # path loops over every block).
    sparse = attention == "pallas" or (attention == "blocked" and jax.default_backend() == "cpu")
    scored = float(C + W)
    if sparse:
        bq, bk = attn.blocks(attention, platform, W, C)
        trips = attn.block_ranges(tokens.q_valid, tokens.slot, tokens.segment, tokens.c_slot, bq, bk)[3]
        scored = float(trips[0] * bk + trips[1] * bq)
    return float(np.median(times)) / (B * W * c.num_heads * scored)


def non_embedding_params(config) -> int:
    """Parameters of ``config`` outside the token embedding and the output embedding."""
    return config.num_params() - config.vocab_size * config.hidden_size * (
        1 if config.tie_word_embeddings else 2)
