"""The ``sc-jax`` process around a command: its log handler, JAX's persistent
compilation cache, SIGINT and SIGTERM, a multi-process launch, and the one ``error:``
line (and exit status) that bad input, a failed write or an interrupt ends in.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import sys
import threading
from pathlib import Path

import jax

from sc_jax.calibration.solvers.batching import threads_from_env
from sc_jax.calibration.solvers.exported import set_export_dir
from sc_jax.cli.parser import build_parser
from sc_jax.experiment.evaluation import staging
from sc_jax.experiment.evaluation.store import probe_writable
from sc_jax.experiment.tasks.loading import DataUnavailableError
from sc_jax.runtime.multihost import initialize_distributed, is_writer
from sc_jax.runtime.wheel_files import WheelFileError


class StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of each record (not the stream
    of the moment the handler was made), so a replaced stderr is followed."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _):
        pass


def show_log_messages() -> None:
    """The command line shows the library's INFO messages (downloads, conversions,
    per-job progress) on stderr; the library itself only logs to ``sc_jax``."""
    logger = logging.getLogger("sc_jax")
    if not any(isinstance(h, StderrHandler) for h in logger.handlers):
        handler = StderrHandler()
        handler.setFormatter(logging.Formatter("sc_jax: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def compilation_cache_dir() -> str | None:
    """Where ``sc-jax`` keeps JAX's persistent compilation cache: ``$SC_JAX_XLA_CACHE``
    if set (an empty value turns the cache off), else ``~/.cache/sc_jax/xla``."""
    path = os.environ.get("SC_JAX_XLA_CACHE")
    if path is None:
        return os.path.join(os.path.expanduser("~"), ".cache", "sc_jax", "xla")
    return path or None


def enable_compilation_cache() -> str | None:
    """Turn on JAX's persistent compilation cache, so that a second ``sc-jax`` process
    reuses the first one's compiled solvers and forward passes (each solver and row
    bucket costs seconds to compile on a 2-core CPU), and keep the solver programs
    exported beside it (:func:`sc_jax.calibration.solvers.set_export_dir`), so that
    it does not trace and lower them again either."""
    path = compilation_cache_dir()
    if path:
        jax.config.update("jax_compilation_cache_dir", path)
        # Cache every program: a run compiles dozens of small gathers and writes beside
        # the model program, each tens of milliseconds on a CPU and more on a GPU; read
        # back, they cost a second process next to nothing.
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
        # The solver programs, exported: a later process neither traces nor lowers them.
        set_export_dir(os.path.join(path, "sc_jax_exports"))
    return path


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's stop, ``kill``), handled as Ctrl-C is: locks released,
    one line, what was kept and how to resume."""


class Interrupts:
    """SIGINT and SIGTERM while one command runs, handled (on the main thread) from
    ``with`` to its end: each raised (KeyboardInterrupt, :class:`Terminated`) and
    recorded in :attr:`received`, since one raised inside a garbage-collection
    callback (JAX registers one) is printed as "Exception ignored" and lost. The
    previous handlers and ``sys.unraisablehook`` are restored on the way out."""

    def __init__(self):
        self.received: list[int] = []
        self._previous: dict = {}
        self._hook = None

    def _on_signal(self, signum, frame):
        self.received.append(signum)
        raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()

    def __enter__(self) -> "Interrupts":
        if threading.current_thread() is threading.main_thread():
            self._previous = {n: signal.signal(n, self._on_signal)
                              for n in (signal.SIGINT, signal.SIGTERM)}
        self._hook, sys.unraisablehook = sys.unraisablehook, _unraisable
        return self

    def __exit__(self, *exc) -> None:
        sys.unraisablehook = self._hook
        for n, h in self._previous.items():
            signal.signal(n, h)


def _unraisable(info):
    """sys.unraisablehook: an interrupt lost in a callback is reported by its signal's
    line at the end (:attr:`Interrupts.received`), not as a traceback; anything else
    as Python would."""
    if isinstance(info.exc_value, KeyboardInterrupt):
        return
    sys.__unraisablehook__(info)


def _kept(args, argv, what: str) -> str:
    """``what``, then what is kept and, for `run`, how to resume: the score cache is
    named only where it holds a score (an interrupt in the up-front check or the
    model's load comes before the cache folder is made)."""
    if args.command != "run":
        if staging.COMMITTED:  # interrupted after its files were all in place
            names = ", ".join(p.name for p in staging.COMMITTED)
            return (f"{what} after `sc-jax {args.command}` wrote {names} into "
                    f"{staging.COMMITTED[-1].parent}")
        return f"{what}: nothing of `sc-jax {args.command}` was kept"
    command = shlex.join(["sc-jax", *(sys.argv[1:] if argv is None else argv)])
    cache = Path(args.out) / "cache"
    if not _holds_scores(cache):
        return f"{what}: no score was saved yet; run the same command to start again: {command}"
    return (f"{what}: the scores computed so far are saved in {cache}; "
            f"run the same command to resume from them: {command}")


def _holds_scores(cache: Path) -> bool:
    """Whether the score cache folder ``cache`` holds one complete entry (its writes in
    progress are hidden ``.tmp-*`` files); stops at the first."""
    try:
        return any(not p.name.startswith(".tmp-") for p in cache.glob("*/*.npz"))
    except OSError:
        return False


#: Commands that run on several processes when launched so (:mod:`sc_jax.runtime.multihost`).
MULTIPROCESS_COMMANDS = ("run", "plan")


def main(argv=None) -> int:
    """``sc-jax ARGS``: parse, run the command, return its exit status (0; 2 for one
    ``error:`` line; 130 for Ctrl-C, 143 for SIGTERM)."""
    args = build_parser().parse_args(argv)
    # The options given on the command line (a default cannot tell "--dtype float32"
    # from nothing): `plan --accelerator` fills in the others (commands.plan_command).
    args.given = {a.split("=", 1)[0] for a in (sys.argv[1:] if argv is None else argv) if a.startswith("--")}
    staging.COMMITTED.clear()  # what this command puts in place (:func:`_kept`)
    show_log_messages()
    enable_compilation_cache()
    with Interrupts() as interrupts:
        rc = _dispatch(args, argv, interrupts.received)
        if interrupts.received and rc == 0:  # the interrupt was lost where it was raised
            rc = _report_signal(args, argv, interrupts.received[-1])
    if rc and jax.distributed.is_initialized():
        # JAX's exit handler would wait at a shutdown barrier for processes still
        # working; leaving now lets them see this one gone (heartbeat) and stop.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    return rc


def _report_signal(args, argv, signum) -> int:
    """The one line for Ctrl-C (exit 130) or SIGTERM (exit 143): what is kept and, for
    `run`, how to resume (every score written so far is complete: the cache writes
    atomically)."""
    if signum == signal.SIGTERM:
        print(f"error: {_kept(args, argv, 'terminated (SIGTERM)')}", file=sys.stderr)
        return 143
    print(f"error: {_kept(args, argv, 'interrupted')}", file=sys.stderr)
    return 130


def _dispatch(args, argv, received: list[int]) -> int:
    """Run ``args.fn``; ``received``: the signals seen so far (:class:`Interrupts`)."""
    try:
        if args.command in MULTIPROCESS_COMMANDS and initialize_distributed() and not is_writer():
            logging.getLogger("sc_jax").setLevel(logging.WARNING)  # process 0 reports
        # Read at the first fit, after all the scoring: checked before any work.
        threads_from_env()
        if args.command in ("run", "plan"):  # the commands that download into it
            _check_cache_env()
        return args.fn(args)
    except BrokenPipeError:
        # `sc-jax plan | head`: the reader has gone, and Python would report the flush
        # of stdout at exit as a second error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt as e:
        # Ctrl-C or SIGTERM: one line, not JAX's 65-line traceback.
        return _report_signal(args, argv, signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT)
    except (ValueError, FileNotFoundError, WheelFileError, DataUnavailableError, ImportError,
            OSError) as e:
        if received:
            # The signal's exception, raised inside a library's callback (JAX's pytree
            # comparison, say), came out wrapped in another one: still the signal.
            return _report_signal(args, argv, received[-1])
        return _one_line_error(args, argv, e)


def _cache_env_line(e: OSError) -> str | None:
    """The line for a failed write under ``$SC_JAX_CACHE``, naming the variable (the
    run's "scores are saved ...; run the same command to resume" would fail the same
    way), or None for a write elsewhere."""
    env = os.environ.get("SC_JAX_CACHE")
    if not env or not e.filename:
        return None
    root = Path(env).expanduser().absolute()
    target = Path(str(e.filename)).expanduser().absolute()
    if target != root and root not in target.parents:
        return None
    return (f"error: $SC_JAX_CACHE ({env}) cannot be written ({target}: {e.strerror or e}): "
            "set SC_JAX_CACHE to a writable directory, or unset it for ~/.cache/sc_jax")


def _check_cache_env() -> None:
    """A ``$SC_JAX_CACHE`` that cannot be created or written, refused before any work
    (it holds downloaded data and models, file hashes, attention choices)."""
    env = os.environ.get("SC_JAX_CACHE")
    if not env:
        return
    root = Path(env).expanduser()
    try:
        probe_writable(root)
    except OSError as e:
        if e.filename is None:
            e.filename = str(root)
        raise _CacheEnvError(_cache_env_line(e) or f"error: $SC_JAX_CACHE ({env}): {e}") from None


class _CacheEnvError(ValueError):
    """An unusable ``$SC_JAX_CACHE``: its message is the whole line."""


def _one_line_error(args, argv, e: Exception) -> int:
    """Exit 2 with one ``error:`` line for bad input or a failed write."""
    if isinstance(e, _CacheEnvError):
        print(str(e), file=sys.stderr)
        return 2
    if isinstance(e, OSError) and _cache_env_line(e):
        print(_cache_env_line(e), file=sys.stderr)
        return 2
    if isinstance(e, OSError) and not isinstance(e, FileNotFoundError):
        # A full disk (ENOSPC) or a directory made unwritable while a command writes:
        # one line naming the file; the run's lock is released on the way out.
        where = f"{e.filename}: " if e.filename else ""
        print(f"error: {_kept(args, argv, where + (e.strerror or str(e)))}", file=sys.stderr)
        return 2
    # PlanError (memory) and DistributedError are ValueErrors: their messages name the
    # numbers; a missing optional extra's ImportError names the pip install to run.
    print(f"error: {e}", file=sys.stderr)
    return 2
