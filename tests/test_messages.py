"""Issue 64, items 8 and 9: inputs that gave a traceback or a line naming no option, file
or variable. Each is one line now, naming what to change (the CLI cases are in
test_cli.py and test_preflight.py)."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from sc_jax.models import loading


def test_a_file_hash_entry_without_its_hash_is_rehashed(tmp_path, monkeypatch):
    """file_hashes.json entry with a matching stamp and no sha256: KeyError 'sha256'."""
    monkeypatch.setenv("SC_JAX_CACHE", str(tmp_path / "cache"))
    f = tmp_path / "w.bin"
    f.write_bytes(b"weights")
    want = hashlib.sha256(b"weights").hexdigest()
    assert loading.file_sha256(f) == want
    store = tmp_path / "cache" / loading.HASHES_FILE
    known = json.loads(store.read_text())
    for broken in ({"stamp": known[str(f.resolve())]["stamp"]},
                   {"stamp": known[str(f.resolve())]["stamp"], "sha256": 7}):
        store.write_text(json.dumps({str(f.resolve()): broken}))
        assert loading.file_sha256(f) == want
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
