"""On-disk cache of LLM label scores, so an interrupted run loses nothing.

Each entry is one NumPy array (label log-probs of a batch of (context, query) pairs),
keyed by a SHA-256 of everything that determines it: the model's identity (weights and
dtype), the scoring mode, the prompt pieces' token ids (demonstrations, queries,
separator, BOS, label words) and the exact contexts and pairs. Change any of these and
the key changes; nothing stale is ever reused.

Writes are atomic (a temporary file in the same directory, fsync, ``os.replace``), so a
killed process leaves either the old state or the complete new entry. Each file stores
a checksum of its array and the key it was stored under; an entry that fails to load,
to verify, that names another key (a file copied or renamed into place) or whose rows
are not the pairs asked for, is reported, deleted and recomputed, never silently used.
Entries written before the key was stored (the committed caches' archives) are checked
by checksum and rows.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
import warnings
from pathlib import Path
from typing import Callable

import numpy as np

from sc_jax.runtime.multihost import from_writer, is_writer


def _digest(arr: np.ndarray) -> str:
    h = hashlib.sha256(f"{arr.dtype.str}{arr.shape}".encode())
    h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()


def score_key(model_identity: str, mode: str, pieces, contexts, pairs, extra: str = "") -> str:
    """SHA-256 naming the label scores of ``pairs`` under ``contexts`` with ``pieces``."""
    h = hashlib.sha256()
    for part in (model_identity, mode, extra, repr(pieces.sep), repr(pieces.bos), repr(pieces.labels),
                 repr(pieces.demos)):
        h.update(part.encode())
        h.update(b"\x00")
    contexts = np.ascontiguousarray(np.asarray(contexts, np.int64))
    pairs = np.ascontiguousarray(np.asarray(pairs, np.int64))
    h.update(f"{contexts.shape}{pairs.shape}".encode())
    h.update(contexts.tobytes())
    h.update(pairs.tobytes())
    # Only the queries actually used enter the key (so adding test queries elsewhere
    # does not invalidate surrogate scores).
    used = sorted(set(pairs[:, 1].tolist())) if pairs.size else []
    h.update(repr([(q, pieces.queries[q]) for q in used]).encode())
    return h.hexdigest()


class ScoreCache:
    """A directory of ``<key>.npz`` files. ``root=None`` disables caching."""

    def __init__(self, root: str | os.PathLike | None):
        self.root = None if root is None else Path(root)
        if self.root is not None and is_writer():
            self.root.mkdir(parents=True, exist_ok=True)
        self.hits = 0
        self.misses = 0
        self.corrupt = 0

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.npz"

    def get(self, key: str, rows: int | None = None) -> np.ndarray | None:
        """The entry stored under ``key``, checked (checksum, the key it names, ``rows``
        rows where given), or None."""
        if self.root is None:
            return None
        path = self._path(key)
        if not path.exists():
            return None
        try:
            with np.load(path, allow_pickle=False) as z:
                arr, check = z["value"], str(z["sha256"])
                stored_key = str(z["key"]) if "key" in z.files else None
            if _digest(arr) != check:
                raise ValueError("checksum mismatch")
            if stored_key is not None and stored_key != key:
                raise ValueError(f"it holds the scores of key {stored_key[:12]}..., not this one")
            if rows is not None and (arr.ndim < 1 or arr.shape[0] != rows):
                raise ValueError(f"it holds {arr.shape[0] if arr.ndim else 0} rows for {rows} pairs")
            return arr
        except Exception as e:  # a truncated zip, bad header, or wrong checksum
            self.corrupt += 1
            warnings.warn(f"score cache entry {path} is corrupt ({e}); recomputing it")
            path.unlink(missing_ok=True)
            return None

    def put(self, key: str, arr: np.ndarray) -> None:
        if self.root is None:
            return
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        np.savez(buf, value=arr, sha256=np.asarray(_digest(arr)), key=np.asarray(key))
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".npz")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(buf.getvalue())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def cached(self, key: str, rows: int | None = None) -> np.ndarray | None:
        """The entry ``key`` (of ``rows`` rows where given) or None, counted as a hit or
        a miss; in a multi-process run process 0 reads it and every process gets what
        it read."""
        arr = from_writer(self.get(key, rows) if is_writer() else None)
        if arr is None:
            self.misses += 1
        else:
            self.hits += 1
        return arr

    def store(self, key: str, arr) -> None:
        """Keep ``arr`` under ``key`` (process 0 writes; the others do nothing)."""
        if is_writer():
            self.put(key, np.asarray(arr))

    def get_or_compute(self, key: str, fn: Callable[[], np.ndarray]) -> np.ndarray:
        """The entry ``key``, or ``fn()`` stored under it. In a multi-process run
        process 0 alone reads and writes the directory and shares what it read, so
        every process takes the same branch (``fn`` runs collectives) and the other
        hosts need no copy of the cache."""
        arr = self.cached(key)
        if arr is None:
            arr = np.asarray(fn())
            self.store(key, arr)
        return arr
