"""Packing of the scoring engine's items into rows, on the host with NumPy (no model,
nothing on a device): where each token of a forward call of
:class:`sc_jax.scoring.engine.ScoringEngine` sits, and the shape every call shares.

Items (a demonstration's segment extending a trie node, or a query row read out at
its label positions: :mod:`sc_jax.scoring.schedule`) are packed into rows of ``W``
tokens, as packed training does: a row holds several items end to end; each item
attends to its own tokens (causally) and to the cached keys of its own node. A row's
cache holds up to ``m`` nodes side by side (slots), so the items of nodes with few
items share rows; a node with many items (a test-time context and its hundreds of
queries) fills rows of its own. ``B`` rows make one call. The padding left is the
end of each row and the rows of each depth's last call: with ``W`` a few times the
longest item and a few dozen calls per depth, a few percent of the unique tokens.

Shapes: every call of every schedule made under one memory policy has the same ``B``,
``W``, ``R`` and ``cache`` (cached keys per row, :class:`PackShape`): the shape
depends on the model, its dtype, the memory budget and the mesh
(:func:`sc_jax.scoring.memory.call_shape`), not on the seed or the dataset, so a run
compiles ONE model program, and a second run on the same machine finds it in the
persistent compilation cache. What varies per depth is how a row's ``cache`` keys are
cut into slots: depth d's items read level d - 1, whose nodes hold ``S`` tokens each,
so a row holds ``m = cache // S`` slots (many small nodes per row early in the trie,
few long ones late). The model program sees only ``m x S`` padded to ``cache``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

#: Smallest cache length bucket (depth 1's items read an empty cache of this length).
MIN_CACHE = 32


def round_up(x: int, m: int) -> int:
    """``x`` rounded up to a multiple of ``m``."""
    return -(-x // m) * m


def pow2_at_least(n: int) -> int:
    """The smallest power of two at least ``n`` (1 for ``n <= 1``)."""
    return 1 << max(0, (int(n) - 1).bit_length())


# ------------------------------------------------------------------ packing
@dataclasses.dataclass
class PackedDepth:
    """The items of one trie depth (continuing the nodes of depth ``depth - 1``), packed
    with ``m`` cache slots of ``S`` tokens per row.

    Per item, in packed order: ``kind`` (0 segment, 1 query row), ``ref`` (the demo,
    or the query row), ``length``, ``row``, ``off`` (first column), ``slot``,
    ``start`` (rotary position of its first token), ``node`` (segment: the node it
    makes at depth ``depth``; query row: -1), ``dest`` (query row: output index;
    segment: -1), ``cache`` (the node of depth ``depth - 1`` it continues).
    ``slot_nodes``: ``[rows, m]`` the node in each row's slots (0 where unused).
    """

    depth: int
    S: int
    m: int
    kind: np.ndarray
    ref: np.ndarray
    length: np.ndarray
    row: np.ndarray
    off: np.ndarray
    slot: np.ndarray
    start: np.ndarray
    node: np.ndarray
    dest: np.ndarray
    cache: np.ndarray
    slot_nodes: np.ndarray

    @property
    def rows(self) -> int:
        return len(self.slot_nodes)


def _next_fit(length: np.ndarray, cache: np.ndarray, W: int, m: int):
    """Next fit, item by item: (starts a new row, opens a new slot, column, slot)."""
    o, used, last = W, m, -1
    for ln, c in zip(length.tolist(), cache.tolist()):
        new_row = o + ln > W or (c != last and used == m)
        if new_row:
            o, used, last = 0, 0, -1
        new_slot = c != last
        if new_slot:
            used += 1
            last = c
        yield new_row, new_slot, o, used - 1
        o += ln


def pack(length: np.ndarray, cache: np.ndarray, W: int, m: int):
    """Next-fit packing of items (in order) into rows of ``W`` tokens with at most
    ``m`` distinct cache nodes per row. Returns (row, off, slot) per item and the
    nodes of each row's slots ``[rows, m]``."""
    n = len(length)
    if n and int(length.max()) > W:
        raise ValueError(f"an item of {int(length.max())} tokens does not fit a row of {W}")
    row = np.empty(n, np.int64)
    off = np.empty(n, np.int64)
    slot = np.empty(n, np.int64)
    slots: list[list[int]] = []
    C = cache.tolist()
    for j, (new_row, new_slot, o, sl) in enumerate(_next_fit(length, cache, W, m)):
        if new_row:
            slots.append([])
        if new_slot:
            slots[-1].append(C[j])
        row[j], off[j], slot[j] = len(slots) - 1, o, sl
    nodes = np.zeros((len(slots), m), np.int64)
    for i, s in enumerate(slots):
        nodes[i, :len(s)] = s
    return row, off, slot, nodes


def pack_depth(items, d: int, S: int, W: int, m: int) -> PackedDepth:
    """Items of depth ``d`` (:func:`sc_jax.scoring.schedule.depth_items`), packed by
    :func:`pack` into rows of ``W`` tokens with ``m`` slots of ``S`` cached tokens."""
    kind, ref, length, cache, start, node, dest = items
    row, off, slot, nodes = pack(length, cache, W, m)
    return PackedDepth(d, S, m, kind, ref, length, row, off, slot, start, node, dest, cache, nodes)


# ------------------------------------------------------------------ the call shape
@dataclasses.dataclass(frozen=True)
class PackShape:
    """The shape every call of a schedule shares: ``B`` rows of ``W`` tokens, each
    row after ``cache`` cached keys (its slots side by side, padded), ``R`` readouts,
    ``C`` children written per call, and ``labels`` label rows of the output
    embedding (the classes, padded; 0 in sequence mode, which reads the full
    vocabulary). Everything the model program's shapes depend on."""

    B: int
    W: int
    cache: int
    R: int = 8
    C: int = 8
    labels: int = 0

    @property
    def program(self) -> tuple[int, int, int, int, int]:
        """What tells one model program from another (:func:`sc_jax.scoring.programs.packed_call`;
        C only shapes the model-free writes)."""
        return (self.B, self.W, self.cache, self.R, self.labels)
