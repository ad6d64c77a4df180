"""The one timer of the benchmarks: a call timed once, or a median over repeats with the
first (compiling) run apart.

Every script that times a repeated call uses :func:`timed` or :func:`first_and_timed`,
so "median of N runs" and "compile = first run minus the median" mean the same in every
result file. Standard library only: the parents of the fresh-process benchmarks
(bench_cold_call, bench_models, bench_seed) must not start a JAX backend. The caller's
``fn`` must wait for its own result (``jax.block_until_ready`` or a host copy): JAX's
dispatch is asynchronous, and a timer cannot know what to wait on.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any, Callable


@dataclasses.dataclass(frozen=True)
class Timing:
    """``median_s`` of ``runs_s`` (seconds of each timed run, in order); ``out``: the
    last run's return value; ``first_s``: the untimed-for-the-median first run
    (compiles included) where one was made, else None."""

    median_s: float
    runs_s: list[float]
    out: Any = None
    first_s: float | None = None

    @property
    def compile_s(self) -> float | None:
        """The first run minus the median: what compiling (and first-touch) cost."""
        return None if self.first_s is None else self.first_s - self.median_s


def once(fn: Callable[[], Any]) -> tuple[float, Any]:
    """(seconds, return value) of one call of ``fn``."""
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def timed(fn: Callable[[], Any], repeats: int) -> Timing:
    """``fn`` called ``repeats`` times (at least once); the median of their seconds."""
    runs, out = [], None
    for _ in range(max(1, repeats)):
        seconds, out = once(fn)
        runs.append(seconds)
    return Timing(statistics.median(runs), runs, out)


def first_and_timed(fn: Callable[[], Any], repeats: int) -> Timing:
    """One first run of ``fn`` (it compiles; timed apart, ``first_s``), then
    :func:`timed` over ``repeats`` runs."""
    first_s, _ = once(fn)
    return dataclasses.replace(timed(fn, repeats), first_s=first_s)
