"""The lock of a run's output directory: one ``sc-jax run`` writes into an ``--out`` at a
time. Light on purpose (no JAX): tests race many processes over one lock."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
from pathlib import Path

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"
LOCK_GUARD_FILE = ".lock.guard"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


@contextlib.contextmanager
def _lock_guard(out: Path):
    """Serialise lock takeovers on this host: an advisory ``flock`` on
    ``out/.lock.guard`` around the read-judge-replace of :func:`run_lock`, so two runs
    that find the same stale lock cannot both take it (the kernel drops the flock of
    a process that dies)."""
    fd = os.open(out / LOCK_GUARD_FILE, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def run_lock(out: Path):
    """Hold ``out/.lock`` (holding this process's pid and host) while a run writes into
    ``out``; removed on exit, whatever the exit. A lock whose process is gone (a run
    killed with SIGKILL) or that holds no pid (a run that died, or a disk that filled,
    while writing it) is stale and taken over; the takeover is atomic (a complete file
    renamed into place, under :func:`_lock_guard`). Raises ValueError naming the pid
    when another live run holds ``out``, or the disk problem when the lock cannot be
    written."""
    path = out / LOCK_FILE
    me = f"{os.getpid()} {socket.gethostname()}"
    with _lock_guard(out):
        try:
            pid_text, _, host = path.read_text().strip().partition(" ")
            pid = int(pid_text)
        except FileNotFoundError:
            pid, host = None, None
        except (OSError, ValueError):
            pid, host = None, ""  # empty or garbled: stale
        # Another host's pid cannot be checked from here: treat it as alive.
        if pid is not None and (host not in ("", socket.gethostname()) or _pid_alive(pid)):
            raise ValueError(f"--out {out} is in use by another sc-jax run (pid {pid}"
                             f"{' on ' + host if host else ''}; lock file {path}): wait for "
                             "it to finish, or choose another --out")
        if host is not None:
            log.info("%s: taking over the lock %s, whose run no longer runs", out,
                     f"of pid {pid}" if pid is not None else "that names no process")
        tmp = out / f"{LOCK_FILE}.{os.getpid()}"
        try:
            tmp.write_text(me + "\n")
            os.replace(tmp, path)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise ValueError(f"--out {out}: could not write the lock file {path} "
                             f"({e.strerror or e}); free some space or choose another --out") from e
    try:
        yield
    finally:
        path.unlink(missing_ok=True)
