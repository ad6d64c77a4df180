"""Progress that tells the time, on stderr.

On a terminal (or in a notebook): tqdm bars, one over a run's seeds with tqdm's rate
and time left (:class:`RunProgress`) and the engine's bar of query rows inside it
(:class:`Bar`), with the console's log lines written above the bars
(``tqdm.contrib.logging``) instead of onto them. Where stderr is a file, a pipe or a
CI log, a redraw would be kept as it is (hundreds of ``\\r`` updates per seed): no bar
then, but one plain line per finished seed with the count done and the time left.
"""

from __future__ import annotations

import logging
import sys
import time

from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

__all__ = ["Bar", "RunProgress"]


def _console_loggers() -> list[logging.Logger]:
    """The loggers (``sc_jax``'s, the root's) that have a handler writing to stdout or
    stderr: only their records go through ``tqdm.write``. A logger without one gets
    none added (``logging_redirect_tqdm`` would add one), so a library caller's own
    logging set-up is left as it is."""
    return [logger for logger in (logging.getLogger("sc_jax"), logging.getLogger())
            if any(isinstance(h, logging.StreamHandler) and h.stream in (sys.stdout, sys.stderr)
                   for h in logger.handlers)]


class Bar(tqdm):
    """A tqdm bar (``tqdm.auto``) shown only on a terminal or in a notebook: tqdm's
    ``disable=None`` turns it off where stderr is not a terminal. While shown, the
    console's log lines are written above the bars (``tqdm.write``); :meth:`close`
    puts the handlers back. Bars nest: an inner one closes before its outer one."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("disable", None)
        self._redirect = None
        super().__init__(*args, **kwargs)
        if not self.disable:
            self._redirect = logging_redirect_tqdm(_console_loggers(), tqdm_class=type(self))
            self._redirect.__enter__()

    def close(self) -> None:
        try:
            super().close()
        finally:
            # tqdm's __del__ closes too, possibly before __init__ set the attribute.
            redirect, self._redirect = getattr(self, "_redirect", None), None
            if redirect is not None:
                redirect.__exit__(None, None, None)


class RunProgress:
    """Progress over a run's ``total`` seeds, each a (dataset, k, seed), used as
    ``with RunProgress(total, enabled=..., logger=log) as bar:`` around the run, with
    :meth:`seed_done` as each seed's scoring ends.

    ``enabled`` False (library use): silent, no bar and no line. Else on a terminal a
    bar of seeds with tqdm's elapsed time, rate and time left, the seed's line logged
    above it; elsewhere the seed's line with ``"; 3 of 18 seeds in 01:02, about 02:53
    left"``, the time left being the time per seed so far (compiles, fits of earlier
    (dataset, k) included) times the seeds left.
    """

    def __init__(self, total: int, *, enabled: bool = True, logger: logging.Logger | None = None):
        self.total = total
        self.enabled = enabled
        self.done = 0
        self.log = logger or logging.getLogger(__name__)
        self._bar: Bar | None = None
        self._start = time.perf_counter()

    def __enter__(self) -> "RunProgress":
        self._start = time.perf_counter()
        if self.enabled:
            bar = Bar(total=self.total, unit="seed", desc="seeds", dynamic_ncols=True)
            self._bar = None if bar.disable else bar
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    @property
    def shown(self) -> bool:
        """Whether the bar is on screen (a terminal or a notebook)."""
        return self._bar is not None

    def seed_done(self, line: str) -> None:
        """One seed scored: ``line`` (its summary) logged, above the bar where it is
        shown, else followed by the count and the time left."""
        self.done += 1
        if not self.enabled:
            return
        if self._bar is not None:
            self.log.info("%s", line)
            self._bar.update()
            return
        self.log.info("%s; %s", line, self.time_note())

    def time_note(self) -> str:
        """``"3 of 18 seeds in 01:02, about 02:53 left"``: elapsed since the start, and
        the time left at the mean time per seed so far."""
        elapsed = time.perf_counter() - self._start
        left = elapsed / self.done * (self.total - self.done) if self.done else 0.0
        return (f"{self.done} of {self.total} seeds in {tqdm.format_interval(elapsed)}, "
                f"about {tqdm.format_interval(left)} left")
