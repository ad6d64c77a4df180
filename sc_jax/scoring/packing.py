"""Packing of the scoring engine's items into rows, on the host with NumPy (no model,
nothing on a device): where each token of a forward call of
:class:`sc_jax.scoring.engine.ScoringEngine` sits, and the shape every call shares.

Items (a demonstration's segment extending a trie node, or a query row read out at
its label positions: :mod:`sc_jax.scoring.schedule`) are packed into rows of ``W``
tokens, as packed training does: a row holds several items end to end; each item
attends to its own tokens (causally) and to the cached keys of its own node. A row's
cache holds up to ``m`` nodes side by side (slots), so the items of nodes with few
items share rows; a node with many items (a test-time context and its hundreds of
queries) fills rows of its own. ``B`` rows make one call, or ``B / 2`` or ``B / 4``
(:func:`row_ladder`, :func:`split_rows`). The padding left is the end of each row
and less than ``B / 4`` rows per depth: with ``W`` a few times the longest item, a
few percent of the unique tokens.

Shapes: every call of every schedule made under one memory policy has the same ``W``,
``cache`` (cached keys per row) and label rows, and one of three ``B`` with their
``R`` (:class:`PackShape`): the shapes depend on the model, its dtype, the memory
budget and the mesh (:func:`sc_jax.scoring.memory.call_shape`), not on the seed or
the dataset, so a run compiles three model programs, whatever the data, and a second
run on the same machine finds them in the persistent compilation cache. What varies per depth is how a row's ``cache`` keys are
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
#: Call sizes: a call runs ``B``, ``B / 2`` or ``B / 4`` rows (:func:`row_ladder`), so the
#: last call of a depth is not padded to ``B`` rows. Each size is one more model program
#: (compiled once per machine, shared by every dataset); on Qwen2-7B's Rotten Tomatoes
#: seed (B = 32) executed/unique tokens go from 1.17 with one size to 1.07 with three,
#: and a fourth size gains 0.02 more.
ROW_SIZES = 3


@dataclasses.dataclass(frozen=True)
class PackShape:
    """The shape of a call: ``B`` rows of ``W`` tokens, each row after ``cache``
    cached keys (its slots side by side, padded), ``R`` readouts and ``labels``
    label rows of the output embedding (the classes, padded; 0 in sequence mode,
    which reads the full vocabulary). Everything the model program's shapes depend
    on."""

    B: int
    W: int
    cache: int
    R: int = 8
    labels: int = 0

    @property
    def program(self) -> tuple[int, int, int, int, int]:
        """What tells one model program from another (:func:`sc_jax.scoring.programs.packed_call`)."""
        return (self.B, self.W, self.cache, self.R, self.labels)


def row_ladder(shape: PackShape, n_devices: int = 1) -> tuple[PackShape, ...]:
    """The call shapes of a schedule, largest first: ``shape`` and up to
    :data:`ROW_SIZES` - 1 halvings of its rows (each a multiple of ``n_devices``),
    readouts scaled with the rows. A function of ``shape`` alone, so every dataset
    shares them."""
    out = [shape]
    while len(out) < ROW_SIZES and out[-1].B % (2 * n_devices) == 0:
        b = out[-1]
        out.append(dataclasses.replace(b, B=b.B // 2, R=max(8, b.R // 2)))
    return tuple(out)


def split_rows(rows: int, sizes) -> list[int]:
    """Rows of each call covering ``rows`` packed rows, from the call sizes ``sizes``
    (largest first): full calls of the largest, then the rest by the smallest size
    that holds it with less padding than the smallest size, else the largest size
    it fills. Padding: less than the smallest size."""
    out, r = [], int(rows)
    big, small = sizes[0], sizes[-1]
    while r > 0:
        holds = [b for b in sizes if b >= r]
        if r >= big:
            b = big
        elif holds and holds[-1] - r < small:
            b = holds[-1]
        else:
            b = max(b for b in sizes if b <= r)
        out.append(b)
        r -= b
    return out
