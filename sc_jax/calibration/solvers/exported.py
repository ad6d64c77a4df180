"""Solver programs kept as ``jax.export`` serialisations (:func:`set_export_dir`), so
that a later process deserialises a :func:`.batching.batched` program instead of
tracing and lowering it again; :class:`Batched` is that program, jitted, served from
its file where one is kept.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import logging
import os
import threading
from pathlib import Path
from typing import NamedTuple

import jax
import jaxlib

from sc_jax.calibration.objective import Params
from sc_jax.calibration.solvers.types import Solution

# Mutable module state, on purpose: the folder of exported solver programs (None: off),
# set once by the caller that owns the machine's caches (sc-jax, at startup).
_EXPORT_DIR: list = [None]


def set_export_dir(path: str | os.PathLike | None) -> None:
    """Serve :func:`.batching.solve_batch`'s CPU programs from ``jax.export``
    serialisations kept in ``path`` (None: off, the default).

    A process that meets a solver program (solver, options, bucket shape, dtype,
    backend) for the first time traces and lowers it once, serialises it there
    (``jax.export``), and compiles it; a later process deserialises it instead of
    tracing and lowering it again (about 1 s per program on a 2-core CPU), and with
    JAX's persistent compilation cache on it then reads the compiled program too. A
    file is keyed by everything the program depends on: the program's settings and
    shapes, the jax and jaxlib versions, 64-bit mode, and a hash of sc_jax's
    calibration sources, so an edited solver or an upgrade never serves a stale one.
    ``sc-jax`` puts it beside its compilation cache
    (:func:`sc_jax.cli.process.enable_compilation_cache`)."""
    _EXPORT_DIR[0] = None if path is None else os.fspath(path)


@functools.lru_cache(maxsize=1)
def _sources_hash() -> str:
    """A hash of the solver's sources (sc_jax/calibration), part of every export key."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


@functools.lru_cache(maxsize=None)
def _warn_once(message: str) -> None:
    logging.getLogger(__name__).warning(message)


class Spec(NamedTuple):
    """What a :func:`.batching.batched` program is built from (part of its export key)."""

    method: str
    sc_star: bool
    options: object  # SolverOptions or None
    batch_size: int | None
    backend: str
    compiler_options: tuple  # sorted (name, setting) pairs


class Batched:
    """A :func:`.batching.batched` solver: ``(problems, lambda_invs, taus) -> tuple of
    Solution``, as ``jit`` (``.jit``), or through an exported program where
    :func:`set_export_dir` gave a folder and the arguments are concrete."""

    def __init__(self, fn, jitted, spec: Spec):
        self.fn = fn
        self.jit = jitted
        self.spec = spec
        self._served: dict = {}
        self._lock = threading.Lock()

    def __call__(self, problems, lambda_invs, taus):
        folder = _EXPORT_DIR[0]
        args = (problems, lambda_invs, taus)
        leaves, tree = jax.tree.flatten(args)
        # CPU programs only: those a run's fits compile, on a GPU machine too, where the
        # small batches are solved on the host (.batching.fit_device); an accelerator's
        # export is not tested on this project's machines.
        if folder is None or self.spec.backend != "cpu" or any(
                isinstance(a, jax.core.Tracer) for a in leaves):
            return self.jit(*args)
        specs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in leaves]
        key = (folder, tuple((s.shape, str(s.dtype)) for s in specs), str(tree),
               bool(jax.config.jax_enable_x64))
        # One lock per program: threads solving other buckets export theirs meanwhile.
        with self._lock:
            entry = self._served.setdefault(key, [threading.Lock(), None])
        with entry[0]:
            if entry[1] is None:
                # Every bucket's Solution, rebuilt from the program's flat outputs.
                out_tree = jax.tree.structure(tuple(
                    Solution(Params(0, 0), *([0] * (len(Solution._fields) - 1)))
                    for _ in problems))
                entry[1] = (self._load_or_export(folder, key, specs, tree), out_tree)
        call, out_tree = entry[1]
        return jax.tree.unflatten(out_tree, call(*leaves))

    def _load_or_export(self, folder: str, key: tuple, specs: list, tree):
        name = hashlib.sha256(repr((tuple(self.spec), key[1:], jax.__version__,
                                    jaxlib.__version__, _sources_hash())).encode()).hexdigest()[:32]
        path = Path(folder) / f"{self.spec.method}-{name}.jaxexport"

        def plain(*xs):
            return jax.tree.leaves(self.jit(*jax.tree.unflatten(tree, xs)))

        if importlib.util.find_spec("flatbuffers") is None:  # jax.export serialises with it
            _warn_once("solver programs are not exported (pip install flatbuffers "
                       "to serve them to later processes without tracing)")
            return plain
        exported = None
        if path.exists():
            try:
                exported = jax.export.deserialize(bytearray(path.read_bytes()))
            except Exception:  # noqa: BLE001 - a torn or foreign file: export afresh
                exported = None
            # Checked against what it must be: the inputs it was exported for, this
            # platform (a file from elsewhere under this name is exported afresh).
            if exported is not None and (
                    [(a.shape, a.dtype) for a in exported.in_avals]
                    != [(s.shape, s.dtype) for s in specs]
                    or tuple(exported.platforms) != (self.spec.backend,)):
                exported = None
        if exported is None:
            def flat(*xs):
                return jax.tree.leaves(self.fn(*jax.tree.unflatten(tree, xs)))

            exported = jax.export.export(jax.jit(flat), platforms=[self.spec.backend])(*specs)
            tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp.write_bytes(exported.serialize())
                os.replace(tmp, path)  # atomic: a concurrent reader sees all or nothing
            except OSError as e:  # a full or read-only disk costs the next process a trace
                with contextlib.suppress(OSError):
                    tmp.unlink()
                _warn_once(f"solver programs are not kept for later processes ({e})")
        return jax.jit(exported.call, compiler_options=dict(self.spec.compiler_options) or None)
