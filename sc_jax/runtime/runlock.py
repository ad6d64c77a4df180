"""The lock of a run's output directory: one ``sc-jax run`` writes into an ``--out`` at a
time. Light on purpose (no JAX): tests race many processes over one lock.

The lock is an ``fcntl.flock`` on ``out/.lock`` held for the run's life. The kernel
releases it when the holder exits or dies, whatever its pid namespace (a container, a
sandbox), so a live run is never taken for a dead one because its pid means nothing
here, or because a dead run's pid was reused. The file also holds the holder's pid and
host, only so that the refusal can name them."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import socket
from pathlib import Path

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"


def _holder(path: Path) -> str:
    """The holder a lock file names, for messages: 'pid N on HOST', or '' if unreadable."""
    try:
        pid, _, host = path.read_text().strip().partition(" ")
        return f"pid {int(pid)}{' on ' + host if host else ''}"
    except (OSError, ValueError):
        return ""


def _in_use(out: str, path: Path) -> ValueError:
    who = _holder(path)
    return ValueError(f"{out} is in use by another sc-jax run ({who + '; ' if who else ''}"
                      f"lock file {path}): wait for it to finish, or choose another --out")


def _take(out: str, path: Path) -> int | None:
    """Open ``path`` and take its flock without waiting; returns the descriptor, or None
    on a filesystem without flock. Raises ValueError while another process holds it."""
    while True:
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise _in_use(out, path) from None
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                return None
            raise
        # A holder that was finishing may have unlinked the file between our open and
        # our flock: then we hold a lock on a name nobody else sees. Retry on the new file.
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


@contextlib.contextmanager
def run_lock(out: Path, name: str | None = None):
    """Hold the flock of ``out/.lock`` (the file naming this process's pid and host) while
    a run writes into ``out``; removed on exit, whatever the exit. A lock left by a run
    that died (SIGKILL, a crash, a container torn down) holds no flock and is taken
    over; a lock file that is empty or garbled is taken over too. Raises ValueError
    naming the holder when another live run holds ``out``, or the disk problem when the
    lock cannot be written.

    On a filesystem without ``flock`` (some network mounts) a run creates the file
    exclusively instead, and an existing lock file there cannot be judged: the refusal
    says to delete it once its run is known to have ended. ``name``: the folder as the
    messages call it (``--out OUT`` by default; ablate's folder when --out was not given)."""
    path = out / LOCK_FILE
    me = f"{os.getpid()} {socket.gethostname()}\n"
    shown = name or f"--out {out}"
    fd = _take(shown, path)
    if fd is None:
        existing = path.exists() and path.stat().st_size > 0
        if existing:
            who = _holder(path)
            raise ValueError(f"{shown}: its lock file {path} names {who or 'no process'} and "
                             "this filesystem has no flock to tell whether that run still runs: "
                             f"if it has ended, delete {path}; otherwise wait, or choose another --out")
    elif path.stat().st_size > 0:
        log.info("%s: taking over the lock of %s, whose run no longer runs", out,
                 _holder(path) or "no process")
    try:
        path.write_text(me)
    except OSError as e:
        path.unlink(missing_ok=True)
        if fd is not None:
            os.close(fd)
        raise ValueError(f"{shown}: could not write the lock file {path} "
                         f"({e.strerror or e}); free some space or choose another --out") from e
    try:
        yield
    finally:
        # Unlink before letting go of the flock: a run waiting on this inode then sees
        # it is no longer the lock file (see _take) and opens the new one.
        path.unlink(missing_ok=True)
        if fd is not None:
            os.close(fd)
