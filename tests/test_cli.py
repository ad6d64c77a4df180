"""The command line: named models are listed, and bad input (an unknown model, a missing
optional extra) ends in one `error:` line naming what to do, before any expensive work."""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys

import numpy as np
import pytest

from sc_jax import cli


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
    assert out.count("not converted yet") == 2 and "6 wheels, 491 MB" in out
    assert not any(tmp_path.iterdir())  # listing fetches nothing


def test_unknown_model_is_one_line(capsys):
    assert cli.main(["info", "no-such-model"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: model source 'no-such-model' is neither") and "qwen2.5-0.5b" in err
    assert "Traceback" not in err


def test_missing_gguf_extra_is_one_line_before_any_download(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SC_JAX_CACHE", str(tmp_path))
    monkeypatch.setitem(sys.modules, "gguf", None)  # as if not installed
    monkeypatch.delitem(sys.modules, "sc_jax.gguf", raising=False)
    assert cli.main(["info", "qwen2.5-0.5b"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: Reading .gguf files needs") and "pip install 'sc-jax[gguf]'" in err
    assert "\n" not in err and not any(tmp_path.iterdir())


def test_missing_data_extra_names_the_install_before_the_model_loads(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "datasets", None)
    loaded = []
    monkeypatch.setattr("sc_jax.loading.load_model", lambda *a, **k: loaded.append(a) or pytest.fail("loaded"))
    assert cli.main(["run", "--dataset", "sst2", "--out", str(tmp_path / "run"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: Loading task 'sst2'") and "pip install 'sc-jax[data]'" in err.splitlines()[0]
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

    from sc_jax import experiment

    # As in a fresh process: without what cli.main set up in earlier tests.
    logger = logging.getLogger("sc_jax")
    monkeypatch.setattr(logger, "handlers", [h for h in logger.handlers
                                             if not isinstance(h, cli.StderrHandler)])
    monkeypatch.setattr(logger, "level", logging.NOTSET)
    # The library: a record on a module logger under "sc_jax", nothing printed.
    with caplog.at_level(logging.INFO, logger="sc_jax"):
        experiment.log.info("a note")
    assert [r.name for r in caplog.records] == ["sc_jax.experiment"]
    assert capsys.readouterr().err == ""
    # The command line shows INFO records on stderr, whatever sys.stderr is then.
    cli.show_log_messages()
    cli.show_log_messages()  # idempotent: one handler
    assert sum(isinstance(h, cli.StderrHandler) for h in logger.handlers) == 1
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
    monkeypatch.setattr("sc_jax.loading.load_model", lambda *a, **k: pytest.fail("loaded"))
    file = tmp_path / "taken"
    file.write_text("")
    out = {"file": file, "under": file / "run", "proc": "/proc/sc-jax-test"}[where]
    assert cli.main(["run", "--out", str(out), "--data-file", str(_data(tmp_path))] + TINY) == 2
    assert _one_error(capsys).startswith(message.format(out=out, file=file))


def _results(tmp_path, **change):
    config = {"model": "random:tiny-llama", "datasets": ["rotten_tomatoes"], "shots": [4],
              "seeds": [0], "test_size": 8, "mode": "first_token", "solver": "augmented_lagrangian"}
    row = {"dataset": "rotten_tomatoes", "model": "random:tiny-llama", "shots": 4, "method": "base",
           "seed": 0, "accuracy": 0.5, "macro_f1": 0.5, "ece": 0.1}
    data = {"config": config, "rows": [row], "params": [], **change}
    (tmp_path / "results.json").write_text(json.dumps(data))
    return tmp_path


@pytest.mark.parametrize("change, problem", [
    ({"config": {}}, "config has no 'model'"),
    ({"rows": [{"dataset": "rotten_tomatoes"}]}, "rows[0] has no 'shots'"),
    ({"rows": [{"dataset": "rt", "model": "m", "shots": 4, "method": "base", "seed": 0,
                "accuracy": "0.5", "macro_f1": 0.5, "ece": 0.1}]},
     "rows[0]['accuracy'] is '0.5', not a number"),
    ({"rows": {"a": 1}}, "no 'config' object or no 'rows' list"),
])
def test_report_on_a_results_file_of_the_wrong_shape_is_one_line(tmp_path, capsys, change, problem):
    run = _results(tmp_path, **change)
    assert cli.main(["report", str(run)]) == 2
    assert _one_error(capsys) == (f"error: {run / 'results.json'} is not an sc_jax results file: "
                                  f"{problem}")


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


def test_column_hint_names_options_that_exist(tmp_path, capsys):
    path = _data(tmp_path, text="sentence", label="y")
    assert cli.main(["plan", "--no-xla", "--data-file", str(path)] + TINY) == 2
    assert "--text-column / --label-column" in _one_error(capsys)
    assert cli.main(["plan", "--no-xla", "--data-file", str(path), "--text-column", "sentence",
                     "--label-column", "y"] + TINY) == 0


def test_ctrl_c_during_a_run_is_one_line_naming_the_cache_and_the_command(tmp_path, capsys,
                                                                         monkeypatch):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "run_experiment", interrupted)
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

    monkeypatch.setattr("sc_jax.loading.load_model", stop)


def test_a_second_run_into_a_locked_out_is_refused_and_a_stale_lock_is_taken_over(
        tmp_path, capsys, monkeypatch):
    _stop_at_the_model(monkeypatch)
    out = tmp_path / "run"
    out.mkdir()
    argv = ["run", "--out", str(out), "--data-file", str(_data(tmp_path))] + TINY
    live = subprocess.Popen(["sleep", "60"])  # another run, still going
    try:
        (out / ".lock").write_text(f"{live.pid} {socket.gethostname()}\n")
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


def test_a_rerun_with_another_configuration_is_refused_unless_overwrite(tmp_path, capsys,
                                                                      monkeypatch):
    _stop_at_the_model(monkeypatch)
    out = tmp_path / "run"
    out.mkdir()
    argv = ["run", "--out", str(out), "--data-file", str(_data(tmp_path))] + TINY
    first = cli._run_config(cli.build_parser().parse_args(argv)).to_json()
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
