"""On-disk cache of LLM label scores, so an interrupted run loses nothing.

Each entry is one NumPy array (label log-probs, or last hidden states, of a batch of
(context, query) pairs), keyed by :func:`score_key`: a SHA-256 of everything that
determines it and of nothing else. Key format :data:`KEY_FORMAT` (2) hashes

* a header: the format number, the model's identity (dtype, and every weight file's
  name and full-content sha256: :func:`sc_jax.models.identity.files_identity`), the
  scoring mode and the quantity stored (``"label_logprobs"`` or ``"last_hidden"``);
* the prompt pieces' token ids (separator, BOS or chat header, label words, the k
  demonstrations, and the queries the pairs use, with their indices), each sequence
  as its length and its int64 ids;
* the contexts ``[M, i]`` and pairs ``[N, 2]`` as int64 arrays with their shapes.

How the code names a job (``"surrogate3"``), the Python type holding the ids, or the
order jobs are built in do not enter it: two jobs asking for the same scores share an
entry, and a refactoring moves no key (``tests/scoring/test_cache_keys.py`` pins them).

Format 1 (sc_jax before this format) hashed ``repr`` of the pieces and the job's tag,
under a model identity that hashed each weight file whole, as now, or, in its older
caches, sampled it (its size and first and last MiB). A format-1 directory is served: an
entry missing under its format-2 key is looked up under the format-1 keys of the same
job (:func:`legacy_score_key`), with both identities, checked as any entry, and
rewritten under its format-2 key; the run names how many entries it took over
(:attr:`ScoreCache.migrated`). A directory marked with a newer format than this code
knows is named in one line; its entries are not read.

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
import json
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


#: The key format :func:`score_key` computes (the module docstring gives it).
KEY_FORMAT = 2
#: The file in a cache directory naming the newest key format written there.
FORMAT_FILE = "FORMAT"


def _ids(h, name: str, seqs) -> None:
    # Each sequence as its length and its int64 bytes: tuples, lists and arrays of the
    # same ids hash alike, and no two splits of the ids into sequences collide.
    seqs = list(seqs)
    h.update(f"{name}:{len(seqs)}\x00".encode())
    for seq in seqs:
        arr = np.ascontiguousarray(np.asarray(seq, np.int64).reshape(-1))
        h.update(f"{arr.size}:".encode())
        h.update(arr.tobytes())


def score_key(model_identity: str, mode: str, pieces, contexts, pairs,
              quantity: str = "label_logprobs") -> str:
    """SHA-256 (format :data:`KEY_FORMAT`) naming ``quantity`` (``"label_logprobs"``
    or ``"last_hidden"``) of ``pairs`` ``[N, 2]`` (context row, query index) under
    ``contexts`` ``[M, i]`` (demonstration indices) with the token ids of ``pieces``
    (:class:`sc_jax.scoring.prompts.PromptPieces`), scored by the model
    ``model_identity`` in ``mode``. Only the queries the pairs use enter it, so adding
    test queries elsewhere leaves the surrogate scores' keys as they were."""
    h = hashlib.sha256()
    header = {"format": KEY_FORMAT, "model": model_identity, "mode": mode, "quantity": quantity}
    h.update(json.dumps(header, sort_keys=True).encode())
    _ids(h, "sep", [pieces.sep])
    _ids(h, "bos", [pieces.bos])
    _ids(h, "labels", pieces.labels)
    _ids(h, "demos", pieces.demos)
    contexts = np.ascontiguousarray(np.asarray(contexts, np.int64))
    pairs = np.ascontiguousarray(np.asarray(pairs, np.int64))
    used = sorted(set(pairs[:, 1].tolist())) if pairs.size else []
    _ids(h, "query_index", [used])
    _ids(h, "queries", [pieces.queries[q] for q in used])
    for name, arr in (("contexts", contexts), ("pairs", pairs)):
        h.update(f"{name}:{arr.shape}".encode())
        h.update(arr.tobytes())
    return h.hexdigest()


def legacy_score_key(model_identity: str, mode: str, pieces, contexts, pairs, tag: str) -> str:
    """The format-1 key of the same scores: ``repr`` of the pieces' tuples and the
    job's ``tag`` (``"surrogate3"``; ``"surrogate3:hidden"`` for its states). Read
    only, to serve caches written before format 2."""
    h = hashlib.sha256()
    for part in (model_identity, mode, tag, repr(pieces.sep), repr(pieces.bos), repr(pieces.labels),
                 repr(pieces.demos)):
        h.update(part.encode())
        h.update(b"\x00")
    contexts = np.ascontiguousarray(np.asarray(contexts, np.int64))
    pairs = np.ascontiguousarray(np.asarray(pairs, np.int64))
    h.update(f"{contexts.shape}{pairs.shape}".encode())
    h.update(contexts.tobytes())
    h.update(pairs.tobytes())
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
        #: Entries served through a format-1 key and rewritten under their format-2 key.
        self.migrated = 0
        #: The directory's key format: :data:`KEY_FORMAT`, 1 (entries and no marker:
        #: written before format 2), a newer one, or None (empty, or no cache).
        self.format = self._read_format() if self.root is not None and is_writer() else None
        self._marked = self.format == KEY_FORMAT

    def _read_format(self) -> int | None:
        try:
            return int((self.root / FORMAT_FILE).read_text().strip())
        except FileNotFoundError:
            return 1 if next(self.root.glob("??/*.npz"), None) is not None else None
        except (OSError, ValueError):
            return None  # an unreadable marker: the entries' own checks still apply

    def describe_format(self) -> str | None:
        """One line on a directory written in another key format (None: this one)."""
        if self.format is None or self.format == KEY_FORMAT:
            return None
        if self.format > KEY_FORMAT:
            return (f"score cache {self.root} was made by key format {self.format} (a newer sc_jax); "
                    f"this one writes format {KEY_FORMAT} beside it and rescores what it needs")
        return (f"score cache {self.root} was made by key format {self.format}; its entries are "
                f"served through their old keys and rewritten under format {KEY_FORMAT}, and "
                "what they do not hold is rescored")

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
        if not self._marked:
            self._mark()
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

    def _mark(self) -> None:
        # The newest format written here; an older sc_jax ignores the file.
        if self.format is None or self.format <= KEY_FORMAT:
            (self.root / FORMAT_FILE).write_text(f"{KEY_FORMAT}\n")
        self._marked = True

    def _lookup(self, key: str, rows: int | None, legacy) -> np.ndarray | None:
        arr = self.get(key, rows)
        # A half-migrated directory (interrupted) is marked with this format already:
        # the old keys are tried wherever the new one misses. One empty when opened
        # (format None) holds nothing older: no old key is hashed or looked up.
        if arr is not None or self.format is None or self.format > KEY_FORMAT:
            return arr
        for old in legacy() if callable(legacy) else legacy:
            arr = self.get(old, rows)
            if arr is not None:
                self.put(key, arr)
                self.migrated += 1
                return arr
        return None

    def cached(self, key: str, rows: int | None = None, legacy=()) -> np.ndarray | None:
        """The entry ``key`` (of ``rows`` rows where given) or None, counted as a hit or
        a miss; ``legacy``: the same scores' format-1 keys (or a function giving them,
        called only then), tried where ``key`` misses (a hit is rewritten under ``key``). In a
        multi-process run process 0 reads it and every process gets what it read."""
        arr = from_writer(self._lookup(key, rows, legacy) if is_writer() else None)
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
