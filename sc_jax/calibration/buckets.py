"""A batch of NumPy problems padded into JAX arrays: one common N per bucket of similar
row counts, so that batches of similar sizes share a compilation.

:func:`pack_batch` pads problems to one N; :func:`pack_buckets` groups them by padded N
first. :func:`sc_jax.calibration.numpy_fit.fit_batch` solves what they return.
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from sc_jax.calibration.objective import Problem
from sc_jax.calibration.validation import check_problem

__all__ = ["SMALL_BUCKET_ROWS", "bucket_rows", "checked_dtype", "pack_batch", "pack_buckets"]


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


def bucket_rows(n: int) -> int:
    """The padded row count of a problem of ``n`` rows in :func:`pack_buckets`:
    ``SMALL_BUCKET_ROWS`` up to that many rows, else a multiple of 1/4 of the next
    lower power of two (<= 25% padding; 4 buckets per octave). A bucket is a compiled
    solver, and the persistent compilation cache serves any later batch whose buckets
    it has seen, so the buckets depend on the row count alone, never on the other
    problems of a batch. A run's surrogate data (k = 4, 8, 16; budget 5,000 rows) fall
    in four of them: 512, 1,792, 3,584 and 5,120 rows."""
    if n <= SMALL_BUCKET_ROWS:
        return SMALL_BUCKET_ROWS
    step = 1 << (int(n).bit_length() - 3)
    return -(-n // step) * step


def pack_batch(problems: Sequence[tuple], dtype="float32", rows: int | None = None
               ) -> tuple[Problem, list[int]]:
    """Validate and pad ``[(features, labels, query_ids), ...]`` into one batched
    :class:`Problem` with a leading ``[B]`` axis.

    Rows are padded to a bucketed common N with mask 0 (``rows``, where given and at
    least the largest row count), query ids are renumbered to 0..G-1 per problem and G
    is bucketed, so batches whose sizes fall in the same buckets reuse one
    compilation. Returns the problem and each problem's row count. Must be called
    (and its result used) under x64 for float64.
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
    n_pad = max(_bucket_rows(max(sizes)) if rows is None else rows, max(sizes))
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
    # Cast on the host and put, not jnp.asarray: that compiles a conversion (or
    # staging) program per array shape, i.e. per problem count.
    problem = Problem(
        features=jax.device_put(feats.astype(dtype)),
        labels=jax.device_put(labels),
        query_ids=jax.device_put(qids),
        mask=jax.device_put(mask.astype(dtype)),
        num_queries=g_pad,
    )
    return problem, sizes


# Problems of at most this many rows share one bucket, padded to this many rows.
# Each bucket is a compiled solver of its own (0.8 s of XLA compile for a 1,792-row
# bucket when buckets shared one loop, more as a program of its own), while padding a
# small problem costs microseconds per evaluation. Sharing the k = 8 batch's 56- and
# 336-row buckets took its cold call (compile + run, bench_cold_call.py) from 9.2-9.8
# s to 7.7-8.2 s; sharing up to 2,048 rows (1,680 at k = 8) saved 1.3 s more but made
# the n = 3 benchmark batch's run 20-25% slower.
SMALL_BUCKET_ROWS = 512


def pack_buckets(problems: Sequence[tuple], dtype="float32"
                 ) -> tuple[list[list[int]], list[Problem], list[int]]:
    """Group problems by padded row count (:func:`bucket_rows`) and pack each group
    with :func:`pack_batch` to that row count; all problems of at most
    ``SMALL_BUCKET_ROWS`` rows go to one group.

    Returns (indices per bucket into ``problems``, one batched :class:`Problem` per
    bucket, each problem's row count). Buckets are ordered by padded N; k = 8
    surrogate data of sizes 1..5 (56 to 20,160 rows) give four buckets (56 and 336
    rows share one), where one common padding would make every problem cost 20,480
    rows. A bucket's shape depends on its own problems only (rows from
    :func:`bucket_rows`, query ids bucketed to a power of two); the solver pads the
    problem count (:func:`sc_jax.calibration.solvers.batching.run_parts`).
    """
    if len(problems) == 0:
        raise ValueError("no problems to fit")
    groups: dict[int, list[int]] = {}
    for k, prob in enumerate(problems):
        # Malformed tuples go to one bucket, where pack_batch reports them clearly.
        rows = np.shape(prob[1])[0] if len(prob) == 3 and np.ndim(prob[1]) >= 1 else 0
        groups.setdefault(bucket_rows(rows), []).append(k)
    indices, packed, sizes = [], [], [0] * len(problems)
    for key in sorted(groups):
        idx = groups[key]
        prob, rows = pack_batch([problems[k] for k in idx], dtype, rows=key)
        indices.append(idx)
        packed.append(prob)
        for k, r in zip(idx, rows):
            sizes[k] = r
    return indices, packed, sizes

