"""A batch of NumPy problems padded into JAX arrays: one common N per bucket of similar
row counts, so that batches of similar sizes share a compilation.

:func:`pack_batch` pads problems to one N; :func:`pack_buckets` groups them by padded N
first. :func:`sc_jax.calibration.numpy_fit.fit_batch` solves what they return.
"""

from __future__ import annotations

import math
from typing import Sequence

import jax.numpy as jnp
import numpy as np

from sc_jax.calibration.objective import Problem
from sc_jax.calibration.validation import check_problem

__all__ = ["SMALL_BUCKET_ROWS", "checked_dtype", "pack_batch", "pack_buckets"]


def checked_dtype(dtype):
    """``dtype`` as a ``jnp.dtype``, once it is float32 or float64 (what the solvers take)."""
    dtype = jnp.dtype(dtype)
    if dtype not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.float64)):
        raise ValueError(f"dtype must be float32 or float64, got {dtype}")
    return dtype


def _bucket_rows(n: int) -> int:
    """Round up to a multiple of 1/8 of the next lower power of two (<= 12.5% padding),
    at least 64."""
    if n <= 64:
        return 64
    step = 1 << max(int(math.floor(math.log2(n))) - 3, 0)
    return -(-n // step) * step


def _bucket_queries(g: int) -> int:
    return max(8, 1 << max(g - 1, 0).bit_length())


def pack_batch(problems: Sequence[tuple], dtype="float32") -> tuple[Problem, list[int]]:
    """Validate and pad ``[(features, labels, query_ids), ...]`` into one batched
    :class:`Problem` with a leading ``[B]`` axis.

    Rows are padded to a bucketed common N with mask 0, query ids are renumbered to
    0..G-1 per problem and G is bucketed, so batches whose sizes fall in the same
    buckets reuse one compilation. Returns the problem and each problem's row count.
    Must be called (and its result used) under x64 for float64.
    """
    dtype = checked_dtype(dtype)
    if len(problems) == 0:
        raise ValueError("no problems to fit")
    checked = []
    for k, prob in enumerate(problems):
        if len(prob) != 3:
            raise ValueError(f"problem {k} must be (features, labels, query_ids)")
        checked.append(check_problem(*prob, where=str(k), batch_axes=False)[:3])
    n1 = {x.shape[1] for x, _, _ in checked}
    if len(n1) != 1:
        raise ValueError(f"all problems in a batch must have the same number of classes, "
                         f"got n-1 in {sorted(n1)}; batch each class count separately")
    n1 = n1.pop()
    sizes = [x.shape[0] for x, _, _ in checked]
    n_pad = _bucket_rows(max(sizes))
    remapped = [np.unique(g, return_inverse=True)[1].reshape(-1) for _, _, g in checked]
    g_pad = _bucket_queries(max(int(r.max()) + 1 for r in remapped))
    b = len(checked)
    feats = np.zeros((b, n_pad, n1), np.float64)
    labels = np.zeros((b, n_pad), np.int32)
    qids = np.zeros((b, n_pad), np.int32)
    mask = np.zeros((b, n_pad), np.float64)
    for k, ((x, y, _), g) in enumerate(zip(checked, remapped)):
        n = x.shape[0]
        feats[k, :n], labels[k, :n], qids[k, :n], mask[k, :n] = x, y, g, 1.0
    problem = Problem(
        features=jnp.asarray(feats, dtype),
        labels=jnp.asarray(labels),
        query_ids=jnp.asarray(qids),
        mask=jnp.asarray(mask, dtype),
        num_queries=g_pad,
    )
    return problem, sizes


# Problems of at most this many rows share one bucket, padded to the largest of them.
# Each bucket adds its own copies of the evaluations of f to the solver's compilation
# (the loop itself is compiled once, solvers.solve_slots): 0.8 s for a 1,792-row
# bucket, 1.7 s for 20,480 rows on the 2-core CPU, while padding a small problem costs
# microseconds per evaluation. When every bucket had its own copy of the whole loop,
# sharing the k = 8 batch's 56- and 336-row buckets took its cold call (compile + run,
# bench_cold_call.py) from 9.2-9.8 s to 7.7-8.2 s; sharing up to 2,048 rows (1,680 at
# k = 8) saved 1.3 s more but made the n = 3 benchmark batch's run 20-25% slower.
SMALL_BUCKET_ROWS = 512


def pack_buckets(problems: Sequence[tuple], dtype="float32"
                 ) -> tuple[list[list[int]], list[Problem], list[int]]:
    """Group problems by padded row count (:func:`_bucket_rows`) and pack each group
    with :func:`pack_batch`; all problems of at most ``SMALL_BUCKET_ROWS`` rows go
    to one group.

    Returns (indices per bucket into ``problems``, one batched :class:`Problem` per
    bucket, each problem's row count). Buckets are ordered by padded N; k = 8
    surrogate data of sizes 1..5 (56 to 20,160 rows) give four buckets (56 and 336
    rows share one), where one common padding would make every problem cost 20,480
    rows.
    """
    if len(problems) == 0:
        raise ValueError("no problems to fit")
    groups: dict[int, list[int]] = {}
    for k, prob in enumerate(problems):
        # Malformed tuples go to one bucket, where pack_batch reports them clearly.
        rows = np.shape(prob[1])[0] if len(prob) == 3 and np.ndim(prob[1]) >= 1 else 0
        groups.setdefault(_bucket_rows(rows), []).append(k)
    small = sorted(key for key in groups if key <= SMALL_BUCKET_ROWS)
    for key in small[:-1]:
        groups[small[-1]] += groups.pop(key)
    indices, packed, sizes = [], [], [0] * len(problems)
    for key in sorted(groups):
        idx = groups[key]
        prob, rows = pack_batch([problems[k] for k in idx], dtype)
        indices.append(idx)
        packed.append(prob)
        for k, r in zip(idx, rows):
            sizes[k] = r
    return indices, packed, sizes

