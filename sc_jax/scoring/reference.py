"""Label scoring of (context, query) pairs without the engine: the up-front checks
every path runs, the plain path (one prompt per forward pass, the reference) and
flat batches of full prompts (no prefix sharing).

Label modes (paper Section 3.2.1 features come from their output):

* ``first_token``: log-probability of each label word's first token, renormalised
  over the labels. The full-vocabulary normaliser cancels in that renormalisation,
  so only the label rows of the output embedding are ever projected. Two labels
  with the same first token are refused.
* ``sequence``: sum of the log-probabilities of each label's full token sequence,
  renormalised over the labels (SST-5's "very negative", TREC's multi-word labels).
  Steps after the first need the full softmax normaliser, so the full vocabulary is
  projected at those few positions only (never ``[B, T, V]``).

All paths (and :class:`sc_jax.scoring.engine.ScoringEngine`) return ``[N, n_classes]``
float32 label log-probabilities for N pairs; :func:`sc_jax.calibration.objective.log_odds`
turns them into the features m_c = log p_c - log p_0.
"""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np

from sc_jax.models.loading import LoadedModel, bucket_batch
from sc_jax.runtime.multihost import to_host
from sc_jax.scoring.enumeration import index_array
from sc_jax.scoring.memory import query_rows
from sc_jax.scoring.packing import round_up
from sc_jax.scoring.programs import flat_call, last_states
from sc_jax.scoring.prompts import PromptPieces

MODES = ("first_token", "sequence")



def _renorm(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return (x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))).astype(np.float32)


def check_mode(mode: str, pieces: PromptPieces) -> None:
    """Refuse an unknown mode, and first-token scoring of labels that share a first token."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode == "first_token":
        first = [ids[0] for ids in pieces.labels]
        dup = [t for t, c in Counter(first).items() if c > 1]
        if dup:
            which = [j for j, ids in enumerate(pieces.labels) if ids[0] in dup]
            raise ValueError(f"labels {which} share their first token {dup}: first_token "
                             "scoring cannot separate them; use mode='sequence'")


def check_inputs(model: LoadedModel, pieces: PromptPieces, contexts, pairs, mode: str):
    """Validate everything before any forward pass; returns ``contexts [M, i]`` and
    ``pairs [N, 2]`` as integer arrays."""
    check_mode(mode, pieces)
    contexts = index_array("contexts", contexts)
    pairs = index_array("pairs", pairs)
    k = len(pieces.demos)
    if k == 0:
        raise ValueError("the demonstration set is empty")
    if contexts.ndim != 2 or contexts.shape[1] < 1:
        raise ValueError(f"contexts must be [M, i] with i >= 1, got shape {contexts.shape}")
    if contexts.shape[1] > k:
        raise ValueError(f"context size {contexts.shape[1]} exceeds the {k} demonstrations")
    if contexts.size and (contexts.min() < 0 or contexts.max() >= k):
        raise ValueError(f"context entries must index the {k} demonstrations")
    # A sub-context is an ordered selection of distinct demonstrations (paper Section 3):
    # one that repeats a demonstration is no such context, and the trie would score it.
    if contexts.shape[1] > 1:
        ordered = np.sort(contexts, axis=1)
        repeats = np.flatnonzero((ordered[:, 1:] == ordered[:, :-1]).any(axis=1))
        if repeats.size:
            raise ValueError(f"context {int(repeats[0])} ({contexts[repeats[0]].tolist()}) repeats a "
                             f"demonstration ({repeats.size} contexts do): a sub-context holds each "
                             "demonstration at most once")
    if pairs.ndim != 2 or pairs.shape[1] != 2:
        raise ValueError(f"pairs must be [N, 2] (context index, query index), got {pairs.shape}")
    if pairs.size and (pairs[:, 0].min() < 0 or pairs[:, 0].max() >= len(contexts)):
        raise ValueError("a pair names a context index out of range")
    if pairs.size and (pairs[:, 1].min() < 0 or pairs[:, 1].max() >= len(pieces.queries)):
        raise ValueError("a pair names a query index out of range")
    if any(len(q) == 0 for q in pieces.queries):
        raise ValueError("a query tokenizes to nothing")
    # The longest prompt must fit the context window (and any sliding window).
    lengths = pieces.prompt_lengths(contexts, pairs, mode)
    limit = model.config.max_position_embeddings
    if lengths.size and lengths.max() > limit:
        r = int(lengths.argmax())
        c, q = (int(x) for x in pairs[r])
        qpart = f"demonstration {q}" if q < k else f"query {q}"
        raise ValueError(f"the longest prompt (context {contexts[c].tolist()}, {qpart}) has "
                         f"{int(lengths[r])} tokens, more than the model's context window of "
                         f"{limit}; shorten or drop its longest text, or use fewer demonstrations")
    # Sliding windows need no check: masking by position honours them in cached paths.
    return contexts, pairs


# ------------------------------------------------------------------ label log-probs
def label_logprobs(out: np.ndarray, mode: str, n: int) -> np.ndarray:
    """Engine/flat outputs -> renormalised label log-probs ``[N, n]``. first_token:
    out is ``[N, n]`` label-row logits; sequence: ``[N * n]`` summed log-probs."""
    if mode == "first_token":
        return _renorm(out)
    return _renorm(out.reshape(-1, n))


# ------------------------------------------------------------------ plain path
def score_plain(model: LoadedModel, pieces: PromptPieces, contexts, pairs, mode: str = "first_token") -> np.ndarray:
    """The reference way: one prompt per forward pass, batch 1, context recomputed,
    through :meth:`LoadedModel.last_logits`. Returns ``[N, n_classes]``."""
    contexts, pairs = check_inputs(model, pieces, contexts, pairs, mode)
    n = len(pieces.labels)
    out = np.zeros((len(pairs), n), np.float64)
    first = np.asarray([l[0] for l in pieces.labels], np.int32)
    for r, (c, q) in enumerate(pairs):
        ids = pieces.prompt(contexts[c], q)
        if mode == "first_token":
            out[r] = model.last_logits([ids], rows=first)[0]
            continue
        for cls, lab in enumerate(pieces.labels):
            total = 0.0
            for j, tok in enumerate(lab):
                logits = model.last_logits([ids + list(lab[:j])])[0].astype(np.float64)
                total += logits[tok] - (logits.max() + np.log(np.exp(logits - logits.max()).sum()))
            out[r, cls] = total
    return _renorm(out)


def states_plain(model: LoadedModel, pieces: PromptPieces, contexts, pairs,
                 mode: str = "first_token") -> np.ndarray:
    """The plain path of the engine's hidden states: one whole prompt per forward pass
    (batch 1, no cache), the final-norm hidden state at its last token (the query's),
    float32 ``[N, D]`` (the same in both modes: the label tokens come after it)."""
    contexts, pairs = check_inputs(model, pieces, contexts, pairs, mode)
    out = np.zeros((len(pairs), model.config.hidden_size), np.float32)
    for r, (c, q) in enumerate(pairs):
        tokens, valid, last = model.pad([pieces.prompt(contexts[c], q)])
        out[r] = to_host(last_states(model.graphdef, model.state, model.put(tokens),
                                     model.put(valid), model.put(last)))[0]
    return out


def _pack(rows, T: int, side: str):
    """Rows of ids -> (tokens [B, T], valid [B, T], start [B]): each row's first
    index. Vectorised: the row-major order of the valid mask is the order of the
    concatenated rows."""
    B = len(rows)
    lengths = np.fromiter(map(len, rows), np.int64, B)
    flat = np.fromiter(itertools.chain.from_iterable(rows), np.int32, int(lengths.sum()))
    start = np.zeros(B, np.int64) if side == "right" else T - lengths
    col = np.arange(T)
    valid = (col >= start[:, None]) & (col < (start + lengths)[:, None])
    tokens = np.zeros((B, T), np.int32)
    tokens[valid] = flat
    return tokens, valid, start.astype(np.int32)


def _gather_arrays(gathers, targets, start, P: int):
    """Per-row gather offsets (relative to the row start) and targets, P at most
    per row -> ``[B, P]`` absolute positions, targets and mask."""
    B = len(gathers)
    n = np.fromiter(map(len, gathers), np.int64, B)
    m = np.arange(P) < n[:, None]
    g = np.zeros((B, P), np.int32)
    t = np.zeros((B, P), np.int32)
    g[m] = np.fromiter(itertools.chain.from_iterable(gathers), np.int64, int(n.sum()))
    t[m] = np.fromiter(itertools.chain.from_iterable(targets), np.int64, int(n.sum()))
    g = np.where(m, g + np.asarray(start, np.int32)[:, None], 0)
    return g, t, m




# ------------------------------------------------------------------ flat batches
def flat_length(n: int) -> int:
    """Padded length of a flat prompt: multiples of 32 (less padding than powers
    of two; the prompts of one run span a few hundred tokens, so a handful of
    compiles)."""
    return max(32, round_up(n, 32))


def score_flat(model: LoadedModel, pieces: PromptPieces, contexts, pairs, mode: str = "first_token",
               *, max_tokens_per_batch: int = 16384, side: str = "right") -> np.ndarray:
    """Flat batches of full prompts (no prefix sharing): every prompt is recomputed in
    full, but many at a time, the way a careful user would batch them: sorted by
    length, padded to multiples of 32 tokens, power-of-two batches of at most
    ``max_tokens_per_batch`` padded tokens, each result fetched after the next batch
    is dispatched. Returns ``[N, n_classes]``."""
    contexts, pairs = check_inputs(model, pieces, contexts, pairs, mode)
    n = len(pieces.labels)
    seq = mode == "sequence"
    ctx_rows = [list(pieces.bos) + [t for j in c for t in pieces.segment(int(j))] for c in contexts]
    q_rows, q_gathers, q_targets = query_rows(pieces, mode, range(len(pieces.queries)))
    nr = n if seq else 1
    # Row r * nr + j: pair r, label j (sequence mode).
    rows, gathers, targets = [], [], []
    for c, q in pairs:
        prefix = ctx_rows[c]
        for j in range(nr):
            rows.append(prefix + q_rows[q * nr + j])
            gathers.append([len(prefix) + x for x in q_gathers[q * nr + j]])
            targets.append(q_targets[q * nr + j])
    P = 1 if not seq else max(len(l) for l in pieces.labels)
    rows_arg = None if seq else model.replicate([l[0] for l in pieces.labels])
    lengths = np.fromiter(map(len, rows), np.int64, len(rows))
    order = np.argsort(lengths, kind="stable")
    padded = np.asarray([flat_length(int(x)) for x in lengths[order]])
    out = np.zeros((len(rows), n) if not seq else (len(rows),), np.float32)
    pending = None
    s = 0
    while s < len(order):
        T = int(padded[s])
        B = round_up(1 << (max(1, max_tokens_per_batch // T).bit_length() - 1), model.n_devices)
        e = min(int(np.searchsorted(padded, T, side="right")), s + B)
        idx = order[s:e]
        Bp = min(B, bucket_batch(len(idx), model.n_devices))
        fill = np.r_[idx, np.full(Bp - len(idx), idx[0])]
        tokens, valid, start = _pack([rows[j] for j in fill], T, side)
        g, t, msk = _gather_arrays([gathers[j] for j in fill], [targets[j] for j in fill], start, P)
        put = model.put
        res = flat_call(model.graphdef, model.state, put(tokens), put(valid), put(g),
                        put(t), put(msk), rows_arg, sequence=seq)
        if pending is not None:
            out[pending[1]] = to_host(pending[0])[:len(pending[1])]
        pending = (res, idx)
        s = e
    if pending is not None:
        out[pending[1]] = to_host(pending[0])[:len(pending[1])]
    return label_logprobs(out, mode, n)
