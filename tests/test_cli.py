"""The command line: named models are listed, and bad input (an unknown model, a missing
optional extra) ends in one `error:` line naming what to do, before any expensive work."""

from __future__ import annotations

import sys

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
