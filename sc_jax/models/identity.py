"""A checkpoint's identity, the score cache's key: the dtype and every file's name and
full-content sha256, each file's hash remembered in ``file_hashes.json`` so that a
second load of the same checkpoint does not read it again.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from sc_jax.runtime.wheel_files import cache_root, sha256_of


def text_hash(s: str) -> str:
    """A short (16 hex digits) sha256 of ``s``."""
    return hashlib.sha256(s.encode()).hexdigest()[:16]


#: Where :func:`file_sha256` remembers each file's hash (under :func:`sc_jax.runtime.wheel_files.cache_root`).
HASHES_FILE = "file_hashes.json"


def file_sha256(path) -> str:
    """The sha256 of the whole file at ``path``, remembered per file (absolute path,
    size, modification time, inode) in ``cache_root()/file_hashes.json``, so a second
    load of the same 15 GB checkpoint does not read it again, while a file rewritten
    in place (same size, new content) is hashed anew."""
    path = Path(path).resolve()
    st = path.stat()
    stamp = [st.st_size, st.st_mtime_ns, st.st_ino]
    store = cache_root() / HASHES_FILE
    try:
        known = json.loads(store.read_text())
    except (OSError, ValueError):
        known = {}
    hit = known.get(str(path)) if isinstance(known, dict) else None
    # An entry without a well-formed hash (hand-edited, or written by another tool) is
    # treated as stale and rehashed, not trusted or a KeyError.
    if isinstance(hit, dict) and hit.get("stamp") == stamp and _is_sha256(hit.get("sha256")):
        return hit["sha256"]
    digest = sha256_of(path)
    try:  # best effort: a read-only cache costs the next load a re-read, nothing else
        known = known if isinstance(known, dict) else {}
        known[str(path)] = {"stamp": stamp, "sha256": digest}
        store.parent.mkdir(parents=True, exist_ok=True)
        tmp = store.with_name(f"{HASHES_FILE}.{os.getpid()}")
        tmp.write_text(json.dumps(known))
        os.replace(tmp, store)
    except OSError:
        pass
    return digest


def _is_sha256(value) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def files_identity(files, dtype) -> str:
    """Identity of a checkpoint (the score cache's key): the dtype and every file's
    name and full-content sha256 (:func:`file_sha256`). Weights edited in place
    (fine-tuned and re-saved, re-quantised, a sign flipped) change it even when the
    sizes and the file ends do not."""
    h = hashlib.sha256(dtype.encode())
    for f in files:
        h.update(f"{Path(f).name}:{file_sha256(f)}".encode())
    return h.hexdigest()[:16]
