"""Files that a command writes together, all or none (:class:`Staging`): each is
written into a hidden folder beside its place, and all are renamed into place at the
end, with SIGINT and SIGTERM held for those few renames. An error or an interrupt
before then leaves the folder's earlier files as they were, so a table never stands
beside plots of another run.

:data:`COMMITTED` lists what this process has put in place, so that an interrupt's
message can say what was kept.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import threading
from pathlib import Path

#: The files every :class:`Staging` of this process has put in place, in order.
COMMITTED: list[Path] = []


class Staging:
    """``with Staging(out) as stage:`` write files into ``stage.dir`` (same file
    system as ``out``); when the block ends without an exception, each of them is moved
    to ``out`` under its name (:meth:`commit`), and ``remove`` names (files of ``out``
    that the new ones replace under another name) are deleted. On an exception
    (KeyboardInterrupt included) nothing in ``out`` changes. The staging folder is
    removed either way."""

    def __init__(self, out: str | Path, remove: tuple[str, ...] = ()):
        self.out = Path(out)
        self.remove = list(remove)
        self.dir: Path | None = None

    def __enter__(self) -> "Staging":
        self.out.mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix=".staging-", dir=self.out))
        return self

    def final(self, path: Path) -> Path:
        """Where ``path`` (a file in :attr:`dir`) lands."""
        return self.out / Path(path).name

    def __exit__(self, kind, value, tb) -> None:
        try:
            if kind is None:
                self.commit()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def commit(self) -> list[Path]:
        """Move every staged file into :attr:`out` (sorted by name) and delete
        :attr:`remove`; returns the files put in place."""
        staged = sorted(p for p in self.dir.iterdir() if p.is_file())
        done = []
        with interrupts_held():
            for path in staged:
                os.replace(path, self.final(path))
                done.append(self.final(path))
            for name in self.remove:
                (self.out / name).unlink(missing_ok=True)
            COMMITTED.extend(done)
        return done


@contextlib.contextmanager
def interrupts_held():
    """SIGINT and SIGTERM held while the block runs (a few renames), then delivered
    again to the handlers in place before it: a Ctrl-C lands before the first rename or
    after the last, never between them. Off the main thread (where no handler can be
    set) the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    previous = {n: signal.signal(n, lambda signum, frame: got.append(signum))
                for n in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for n, handler in previous.items():
            signal.signal(n, handler)
        if got:
            signal.raise_signal(got[0])
