"""Issue 64, items 8 and 9: inputs that gave a traceback or a line naming no option, file
or variable. Each is one line now, naming what to change (the CLI cases are in
test_cli.py and test_preflight.py)."""

from __future__ import annotations

import hashlib
import json

import pytest

from sc_jax.models import identity


def test_a_file_hash_entry_without_its_hash_is_rehashed(tmp_path, monkeypatch):
    """file_hashes.json entry with a matching stamp and no sha256: KeyError 'sha256'."""
    monkeypatch.setenv("SC_JAX_CACHE", str(tmp_path / "cache"))
    f = tmp_path / "w.bin"
    f.write_bytes(b"weights")
    want = hashlib.sha256(b"weights").hexdigest()
    assert identity.file_sha256(f) == want
    store = tmp_path / "cache" / identity.HASHES_FILE
    known = json.loads(store.read_text())
    for broken in ({"stamp": known[str(f.resolve())]["stamp"]},
                   {"stamp": known[str(f.resolve())]["stamp"], "sha256": 7}):
        store.write_text(json.dumps({str(f.resolve()): broken}))
        assert identity.file_sha256(f) == want
        assert json.loads(store.read_text())[str(f.resolve())]["sha256"] == want


def test_a_config_field_that_is_not_a_number_is_named_with_its_file(tmp_path):
    """rms_norm_eps: "abc" said only "could not convert string to float: 'abc'"."""
    from hf_models import write_numpy_checkpoint

    import sc_jax

    d = write_numpy_checkpoint(tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    for key, value, what in (("rms_norm_eps", "abc", "a number"), ("hidden_size", 60.5, "an integer"),
                             ("num_hidden_layers", True, "an integer")):
        (d / "config.json").write_text(json.dumps({**cfg, key: value}))
        with pytest.raises(ValueError, match=f"^{d / 'config.json'}: field '{key}' must be {what}, "
                                             f"got {json.dumps(value)}$"):
            sc_jax.load_model(str(d))


# ------------------------------------------------------------------ the command line
from cli.test_cli import TINY, _data, _one_error, _stop_at_the_model  # noqa: E402

from sc_jax import cli  # noqa: E402


@pytest.mark.parametrize("extra, env, message", [
    (["--test-seed", "-1"], {}, "error: test_seed (--test-seed) must be 0 or more, got -1"),
    (["--budget", "1", "--shots", "3"], {},
     "error: budget (--budget) must be at least the largest --shots k = 3 (each size's surrogate "
     "data must hold every demonstration out at least once), got 1"),
    (["--device-memory", "1KiB"], {},
     "error: device_memory (--device-memory) of 1024 bytes is below 64 MiB, too small for any "
     "model: give the memory per device, e.g. 80GiB (a bare number is GiB)"),
    ([], {"SC_JAX_SOLVER_THREADS": "abc"},
     "error: SC_JAX_SOLVER_THREADS must be a positive integer (solver threads), got 'abc': fix it "
     "or unset it"),
])
def test_run_options_are_refused_before_the_model_naming_the_option(tmp_path, capsys, monkeypatch,
                                                                   extra, env, message):
    """Each was refused only after scoring (--budget, SC_JAX_SOLVER_THREADS), or named no
    option (--test-seed: "expected non-negative integer"; --device-memory 1KiB: "0.00 GiB
    ... more than the 0.00 GiB usable")."""
    _stop_at_the_model(monkeypatch)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    argv = ["run", "--out", str(tmp_path / "run"), "--data-file", str(_data(tmp_path))] + TINY + extra
    assert cli.main(argv) == 2
    assert _one_error(capsys) == message


def test_plan_of_cudnn_attention_on_a_cpu_is_one_line(tmp_path, capsys):
    """`sc-jax plan --attention cudnn` on a CPU without --accelerator: a RuntimeError
    traceback ("cuDNN is not detected")."""
    argv = ["plan", "--no-xla", "--no-compile-time", "--attention", "cudnn", "--data-file",
            str(_data(tmp_path))] + TINY
    assert cli.main(argv) == 2
    assert _one_error(capsys).startswith("error: --attention cudnn runs on an NVIDIA GPU only and "
                                         "this machine's backend is cpu: plan for a GPU with "
                                         "--accelerator")


def test_a_model_axis_larger_than_the_devices_names_the_device_count():
    """--mesh model=3 on one device said "a mesh of data 0 x model 3"."""
    import jax

    from sc_jax.runtime.sharding import make_mesh

    with pytest.raises(ValueError, match=r"^a model axis of 3 needs 3 devices; 1 is available: use "
                                         r"--mesh model=1 or fewer$"):
        make_mesh(devices=jax.devices()[:1], model=3)


def test_nan_model_scores_are_named_as_the_model_s(tmp_path, capsys, monkeypatch):
    """NaN scores from the model were reported as "features contain NaN ... clip the
    probabilities", as if the data were at fault."""
    import numpy as np

    from sc_jax.scoring.engine import ScoringEngine

    real = ScoringEngine.score_jobs

    def nan_scores(self, pieces, jobs, mode="first_token", on_done=None, **kwargs):
        def done(tag, arr, *states):  # states: with hidden=True (Hidden Calibration)
            on_done(tag, np.full_like(arr, np.nan), *states)

        return real(self, pieces, jobs, mode, on_done=done if on_done else None, **kwargs)

    monkeypatch.setattr(ScoringEngine, "score_jobs", nan_scores)
    argv = ["run", "--out", str(tmp_path / "run"), "--data-file", str(_data(tmp_path))] + TINY
    assert cli.main(argv) == 2
    line = _one_error(capsys)
    assert "the model produced NaN scores (" in line and "clip" not in line, line


def test_an_unwritable_sc_jax_cache_is_named_before_any_work(tmp_path, capsys, monkeypatch):
    """An unwritable $SC_JAX_CACHE ended in "the scores computed so far are saved ...; run
    the same command to resume", which failed the same way, without naming the variable."""
    _stop_at_the_model(monkeypatch)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("SC_JAX_CACHE", str(blocker / "cache"))  # under a file: never writable
    argv = ["run", "--out", str(tmp_path / "run"), "--data-file", str(_data(tmp_path))] + TINY
    assert cli.main(argv) == 2
    line = _one_error(capsys)
    assert line.startswith(f"error: $SC_JAX_CACHE ({blocker / 'cache'}) cannot be written (") and \
        line.endswith("set SC_JAX_CACHE to a writable directory, or unset it for ~/.cache/sc_jax"), line
    assert not (tmp_path / "run").exists()
