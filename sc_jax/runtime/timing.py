"""Where a run's time goes: JAX's compiles, counted and timed as they happen
(:class:`CompileMeter`), and named parts of the wall time (:class:`Parts`).

JAX reports each compile through :mod:`jax.monitoring`: tracing, lowering to MLIR,
and the backend compile, which is a read of the persistent compilation cache where
that cache holds the program (a "hit"). The meter listens while it is active and
adds those seconds up, so a caller can tell compile time from the work around it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter

import jax

_TRACE = "/jax/core/compile/jaxpr_trace_duration"
_LOWER = "/jax/core/compile/jaxpr_to_mlir_module_duration"
_BACKEND = "/jax/core/compile/backend_compile_duration"
_CACHE_HIT = "/jax/compilation_cache/cache_hits"


class CompileMeter:
    """JAX compiles while the meter is active (``with CompileMeter() as meter``).

    ``seconds``: tracing + lowering + backend compiles (persistent-cache reads
    included); ``compiled``: per function name (``jit(packed_step)``...), the programs
    XLA compiled; ``hits``: per function name, the programs read from the persistent
    compilation cache instead. Counts are per thread-correct: a hit is matched to the
    backend compile it happened in on the same thread.
    """

    def __init__(self):
        self.seconds = 0.0
        self.compiled: Counter = Counter()
        self.hits: Counter = Counter()
        self._lock = threading.Lock()
        self._hit = threading.local()

    def _event(self, name, **_):
        if name == _CACHE_HIT:
            self._hit.pending = True

    def _duration(self, name, secs, **kw):
        if name not in (_TRACE, _LOWER, _BACKEND):
            return
        with self._lock:
            self.seconds += secs
            if name == _BACKEND:
                fun = str(kw.get("fun_name", "?"))
                (self.hits if getattr(self._hit, "pending", False) else self.compiled)[fun] += 1
        if name == _BACKEND:
            self._hit.pending = False

    def __enter__(self) -> CompileMeter:
        jax.monitoring.register_event_listener(self._event)
        jax.monitoring.register_event_duration_secs_listener(self._duration)
        return self

    def __exit__(self, *exc):
        jax.monitoring.unregister_event_listener(self._event)
        jax.monitoring.unregister_event_duration_listener(self._duration)

    def count(self, what: str = "") -> tuple[int, int]:
        """(programs compiled, persistent-cache hits) of the functions whose name
        contains ``what`` (all by default)."""
        return (sum(v for f, v in self.compiled.items() if what in f),
                sum(v for f, v in self.hits.items() if what in f))

    def summary(self) -> dict:
        """``compile_s``, ``programs`` (compiled), ``cache_hits``, ``model_programs`` and
        ``model_cache_hits`` (the scoring engine's model programs, ``packed_step``: a
        call's gather, model and write in one)."""
        programs, hits = self.count()
        model, model_hits = self.count("packed_step")
        return {"compile_s": self.seconds, "programs": programs, "cache_hits": hits,
                "model_programs": model, "model_cache_hits": model_hits}


class Parts:
    """Named parts of a wall time, in seconds: ``with parts("fit"): ...`` adds the
    block's time to ``parts.seconds["fit"]``."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    def add(self, name: str, secs: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + secs

    @contextlib.contextmanager
    def __call__(self, name: str):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t)
