"""Progress on stderr (:mod:`sc_jax.runtime.progress`): on a terminal, bars with the log
lines written above them, never onto a bar; elsewhere (a file, a pipe, CI) no bar and no
``\\r`` at all, one plain line per seed with the count and the time left; with
``enabled=False`` (library use) nothing. No model: the bars are driven as the run and
the engine drive them, through the command line's own log handler."""

from __future__ import annotations

import io
import logging
import re
import sys

import pytest

from sc_jax.cli import process
from sc_jax.runtime.progress import Bar, RunProgress

log = logging.getLogger("sc_jax.experiment.execution.run")


class _Terminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.fixture
def stderr(monkeypatch):
    """``make(tty)``: sys.stderr replaced by a fresh stream, with the command line's
    handler on the ``sc_jax`` logger (as ``sc-jax`` sets it up) and no other."""
    logger = logging.getLogger("sc_jax")
    monkeypatch.setattr(logger, "handlers", [logging.NullHandler()])
    monkeypatch.setattr(logger, "level", logging.NOTSET)

    def make(tty: bool) -> io.StringIO:
        stream = _Terminal() if tty else io.StringIO()
        monkeypatch.setattr(sys, "stderr", stream)
        process.show_log_messages()
        return stream
    return make


def _run(seeds: int, enabled: bool = True) -> None:
    """A run of ``seeds`` seeds as run_experiment drives it: per seed an engine bar of
    query rows with a job's log line in the middle of it, then the seed's line."""
    with RunProgress(seeds, enabled=enabled, logger=log) as bar:
        for seed in range(seeds):
            rows = Bar(total=8, unit="query", desc="scoring", leave=False, mininterval=0) \
                if enabled else None  # as the engine makes it
            for i in range(8):
                if rows is not None:
                    rows.update()
                if i == 3:
                    log.info("[seed=%d] k-shot prompt: 8 prompts, scored", seed)
            if rows is not None:
                rows.close()
            bar.seed_done(f"[seed={seed}] 1.0 s: compile 0.5 s, forward 0.5 s")


def test_off_a_terminal_one_plain_line_per_seed_and_no_carriage_return(stderr):
    err = stderr(tty=False)
    _run(3)
    out = err.getvalue()
    assert "\r" not in out and "\x1b" not in out
    lines = out.splitlines()
    assert len(lines) == 6  # per seed: the job's line, the seed's line
    done = [line for line in lines if " seeds in " in line]
    assert len(done) == 3
    for i, line in enumerate(done):
        assert re.fullmatch(rf"sc_jax: \[seed={i}\] 1\.0 s: compile 0\.5 s, forward 0\.5 s; "
                            rf"{i + 1} of 3 seeds in \d\d:\d\d, about \d\d:\d\d left", line), line
    assert done[-1].endswith("about 00:00 left")


def _line_starts(out: str) -> list[str]:
    """The character before each ``sc_jax:`` log line, ANSI cursor moves left out (a
    bar is redrawn after ``\\x1b[A``, cursor up, which keeps the column)."""
    plain = re.sub(r"\x1b\[\d*[A-Za-z]", "", out)
    return [plain[m.start() - 1] if m.start() else "\n" for m in re.finditer("sc_jax: ", plain)]


def test_on_a_terminal_log_lines_are_written_above_the_bars(stderr):
    err = stderr(tty=True)
    _run(2)
    out = err.getvalue()
    assert "seeds: 100%" in out and "scoring:" in out  # the bars were drawn
    # Each log line starts a line (after \r or \n), not after a bar's text.
    starts = _line_starts(out)
    assert len(starts) == 4 and set(starts) <= {"\r", "\n"}, repr(out)
    # The bar tells the count and time; the seed's line is as it was.
    assert "sc_jax: [seed=1] 1.0 s: compile 0.5 s, forward 0.5 s\n" in out
    # The handlers are the command line's again after the run.
    handlers = logging.getLogger("sc_jax").handlers
    assert [type(h) for h in handlers] == [logging.NullHandler, process.StderrHandler]


def test_a_bar_without_the_redirect_glues_the_line_onto_it(stderr):
    """The check above can fail: a plain tqdm bar, as the engine drew it, does."""
    from tqdm.auto import tqdm

    err = stderr(tty=True)
    rows = tqdm(total=8, mininterval=0, file=sys.stderr)
    rows.update(3)
    log.info("glued")
    rows.close()
    (start,) = _line_starts(err.getvalue())
    assert start not in "\r\n", repr(err.getvalue())


def test_disabled_progress_is_silent_even_on_a_terminal(stderr):
    err = stderr(tty=True)
    _run(2, enabled=False)
    assert err.getvalue() == "sc_jax: [seed=0] k-shot prompt: 8 prompts, scored\n" \
                             "sc_jax: [seed=1] k-shot prompt: 8 prompts, scored\n"


def test_a_bar_adds_no_handler_where_the_caller_has_none(monkeypatch):
    """Library use in a terminal: the bar is drawn, and a logger with no console
    handler (``sc_jax`` with its NullHandler) gets none added for the bar's time."""
    logger = logging.getLogger("sc_jax")
    monkeypatch.setattr(logger, "handlers", [logging.NullHandler()])
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    monkeypatch.setattr(sys, "stderr", _Terminal())
    bar = Bar(total=2)
    assert not bar.disable
    assert [type(h) for h in logger.handlers] == [logging.NullHandler]
    assert logging.getLogger().handlers == []
    bar.close()
    assert [type(h) for h in logger.handlers] == [logging.NullHandler]
