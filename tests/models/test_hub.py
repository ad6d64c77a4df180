"""Models by Hugging Face id, from a local hub cache built in tmp_path the way
huggingface_hub lays it out (``models--org--name/{blobs,snapshots/<commit>,refs}``), with
HF_HUB_CACHE and HF_HUB_OFFLINE set by monkeypatch after huggingface_hub was imported
(sc_jax reads them at every call).

Parity with transformers PyTorch (float32, max |logit difference| <= 1e-4, as in
tests/models/test_model.py) needs torch; every other test runs without it.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import huggingface_hub
import numpy as np
import pytest
from hf_models import VOCAB, hf_logits, make_checkpoint, write_numpy_checkpoint

import sc_jax
from sc_jax import cli
from sc_jax.models.hub import (
    HubId,
    HubModelNotCachedError,
    hub_cache_dir,
    hub_snapshot,
    parse_hub_id,
)
from sc_jax.models.sources import load_config_and_tokenizer

REPO = "tiny-org/tiny-llama"
OLD, NEW = (hashlib.sha1(s.encode()).hexdigest() for s in ("old", "new"))  # 40-hex commits
TOL = 1e-4


def put_in_hub_cache(cache: Path, repo_id: str, files: Path, commit: str, refs=("main",)) -> Path:
    """The files of directory ``files`` as revision ``commit`` of model ``repo_id`` in the
    hub cache ``cache``: blobs named by content, snapshot entries linking to them, and
    ``refs/<ref>`` holding the commit. Returns the snapshot directory."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True)
    for f in sorted(files.iterdir()):
        blob = repo / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.copyfile(f, blob)
        (snapshot / f.name).symlink_to(Path("../..") / "blobs" / blob.name)
    for ref in refs:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture(autouse=True)
def _keep_jax_config(monkeypatch):
    monkeypatch.setenv("SC_JAX_XLA_CACHE", "")  # cli.main leaves JAX's configuration alone


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    return [write_numpy_checkpoint(root / f"w{seed}", seed=seed) for seed in (0, 1)]


@pytest.fixture
def hub(tmp_path, monkeypatch, checkpoints):
    """An offline hub cache holding REPO at two commits: OLD (tag v1) and NEW (main)."""
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    put_in_hub_cache(cache, REPO, checkpoints[0], OLD, refs=("v1",))
    put_in_hub_cache(cache, REPO, checkpoints[1], NEW, refs=("main",))
    return cache


def _snapshot(cache: Path, commit: str) -> str:
    return str(cache / "models--tiny-org--tiny-llama" / "snapshots" / commit)


def test_load_by_id_from_the_offline_cache(hub, checkpoints):
    model = sc_jax.load_model(REPO)
    assert model.source == _snapshot(hub, NEW)
    # The identity (score-cache key) hashes the files: the same weights by id or by
    # path share it.
    by_path = sc_jax.load_model(checkpoints[1])
    assert model.identity == by_path.identity
    prompts = [[5, 17, 300], [3, 4]]
    np.testing.assert_array_equal(model.last_logits(prompts), by_path.last_logits(prompts))
    # Planning reads the configuration and tokenizer the same way.
    config, tokenizer = load_config_and_tokenizer(REPO)
    assert config == model.config and tokenizer.encode("ab") == model.tokenizer.encode("ab")


def test_weights_edited_in_place_change_the_identity(tmp_path, monkeypatch):
    """Issue 55, case 1: the identity (the score cache's key) hashed names, sizes and
    the first and last MiB of each file, so weights edited in place (same size: a sign
    flipped in the middle) reused every cached score. Now it hashes the whole content,
    remembered per file (size, modification time, inode) so a second load reads nothing."""
    from safetensors.numpy import load_file, save_file

    from sc_jax.models import identity

    monkeypatch.setenv("SC_JAX_CACHE", str(tmp_path / "cache"))
    path = write_numpy_checkpoint(tmp_path / "m", seed=0, vocab_size=12000)  # 5.8 MB
    weights = path / "model.safetensors"
    before = sc_jax.load_model(path)
    tensors = load_file(str(weights))
    tensors["lm_head.weight"][6000] *= -1  # 1.4 MB into the file: neither its first nor last MiB
    size = weights.stat().st_size
    save_file(tensors, str(weights), metadata={"format": "pt"})
    assert weights.stat().st_size == size > 3 << 20
    after = sc_jax.load_model(path)
    assert after.identity != before.identity
    assert not np.array_equal(after.last_logits([[5, 17, 300]]), before.last_logits([[5, 17, 300]]))
    monkeypatch.setattr(identity, "sha256_of", lambda p: pytest.fail(f"read {p} again"))
    assert sc_jax.load_model(path).identity == after.identity


def test_revision_by_commit_by_ref_and_spelled_in_the_id(hub, checkpoints):
    old = sc_jax.load_model(checkpoints[0]).identity
    assert sc_jax.load_model(REPO, revision=OLD).source == _snapshot(hub, OLD)
    assert sc_jax.load_model(REPO, revision="v1").identity == old
    assert sc_jax.load_model(f"{REPO}@v1").identity == old
    assert sc_jax.load_model(f"{REPO}@{OLD}").source == _snapshot(hub, OLD)
    assert sc_jax.load_model(f"{REPO}@main").source == _snapshot(hub, NEW)
    with pytest.raises(ValueError, match="names revision 'main' but revision='v1'"):
        sc_jax.load_model(f"{REPO}@main", revision="v1")
    with pytest.raises(ValueError, match="no revision after '@'"):
        sc_jax.load_model(f"{REPO}@")
    with pytest.raises(ValueError, match="is a local path"):
        sc_jax.load_model(checkpoints[0], revision="v1")
    with pytest.raises(ValueError, match="is a random preset"):
        sc_jax.load_model("random:tiny-llama", revision="v1")


def test_id_spelling():
    assert parse_hub_id("org/name") == HubId("org/name")
    assert parse_hub_id("org/name@v1.0") == HubId("org/name", "v1.0")
    assert parse_hub_id("org/name", "dev") == HubId("org/name", "dev")
    assert str(HubId("org/name", "dev")) == "org/name@dev"
    # Not ids: these stay local paths (and their error, when missing, says so).
    for path in ("name", "a/b/c", "/abs/dir", "./org/name", "~/models", "org/na--me", "org/.x"):
        assert parse_hub_id(path) is None, path


def test_missing_model_is_one_line_through_the_cli(hub, capsys):
    with pytest.raises(HubModelNotCachedError):  # a FileNotFoundError
        sc_jax.load_model("tiny-org/absent")
    assert cli.main(["info", "tiny-org/absent"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("error: model 'tiny-org/absent' is not a local directory, and as a "
                          f"Hugging Face id it is not in the local hub cache {hub}; HF_HUB_OFFLINE")
    assert "`hf download tiny-org/absent`" in err and "unset HF_HUB_OFFLINE" in err
    # A revision the cache lacks, through `plan` (which reads no weights).
    assert cli.main(["plan", "--model", f"{REPO}@v9", "--no-xla", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"`hf download {REPO} --revision v9`" in err


def test_partial_snapshot_names_what_is_missing(tmp_path, monkeypatch, checkpoints):
    # Configuration and tokenizer only (what `sc-jax plan` fetches): enough to plan,
    # not to load.
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    partial = tmp_path / "partial"
    partial.mkdir()
    for name in ("config.json", "tokenizer.json"):
        shutil.copyfile(checkpoints[0] / name, partial / name)
    put_in_hub_cache(cache, REPO, partial, OLD)
    assert load_config_and_tokenizer(REPO)[0].vocab_size == VOCAB
    with pytest.raises(HubModelNotCachedError, match=r"has no model\.safetensors .*hf download"):
        sc_jax.load_model(REPO)


def test_unreachable_hub_falls_back_to_the_cache(hub, monkeypatch):
    # Online mode with a hub that refuses connections (a closed local port): the cached
    # main revision is used; an uncached model says the hub could not be reached.
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HTTP_PROXY", "HTTPS_PROXY",
                 "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")
    assert str(hub_snapshot(HubId(REPO))) == _snapshot(hub, NEW)
    with pytest.raises(HubModelNotCachedError, match="the hub could not be reached") as e:
        hub_snapshot(HubId("tiny-org/absent"))
    assert "HF_HUB_OFFLINE" not in str(e.value) and "\n" not in str(e.value)


def test_local_directory_spelled_like_an_id_wins(hub, checkpoints, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(checkpoints[0], tmp_path / REPO)
    model = sc_jax.load_model(REPO)
    assert model.source == REPO and model.identity == sc_jax.load_model(checkpoints[0]).identity
    assert model.identity != sc_jax.load_model(_snapshot(hub, NEW)).identity


def test_info_lists_the_hub_cache(hub, tmp_path, monkeypatch, capsys):
    # A dataset in the same cache is not a model and is not listed.
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text("{}\n")
    put_in_hub_cache(hub, "org/a-dataset", data, OLD)
    (hub / "models--org--a-dataset").rename(hub / "datasets--org--a-dataset")
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert f"models in the local Hugging Face hub cache {hub}" in out
    line = next(s for s in out.splitlines() if s.strip().startswith(REPO))
    assert f"{NEW[:12]} (main)" in line and f"{OLD[:12]} (v1)" in line
    assert "a-dataset" not in out and "smollm2-135m (default)" in out

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    (tmp_path / "empty").mkdir()
    assert cli.main(["info"]) == 0
    assert f"hub cache {tmp_path / 'empty'} holds no models" in capsys.readouterr().out
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "absent"))
    assert cli.main(["info"]) == 0
    assert f"hub cache {tmp_path / 'absent'} does not exist" in capsys.readouterr().out


def test_cache_directory_follows_the_environment_at_call_time(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert hub_cache_dir() == tmp_path / "home" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    assert hub_cache_dir() == tmp_path / "cache"


def test_parity_with_transformers_by_id(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    torch.set_num_threads(2)
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hf = make_checkpoint("qwen2", tmp_path / "qwen2", seed=3)  # save_pretrained: safetensors
    put_in_hub_cache(cache, "tiny-org/tiny-qwen2", tmp_path / "qwen2", NEW)
    model = sc_jax.load_model("tiny-org/tiny-qwen2")
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(3, VOCAB, size=n)) for n in (1, 6, 13)]
    ref = np.stack([hf_logits(hf, p)[-1] for p in prompts])
    worst = float(np.abs(model.last_logits(prompts) - ref).max())
    print(f"by id: max |logit diff| vs transformers = {worst:.2e}")
    assert worst <= TOL


def test_run_and_plan_by_id(hub, tmp_path, monkeypatch, rt_csv, capsys):
    # A model missing from the cache stops `run` before any dataset is read...
    monkeypatch.setattr("sc_jax.experiment.protocol.jobs.load_datasets", lambda *a: pytest.fail("data read"))
    assert cli.main(["run", "--model", "tiny-org/absent", "--out", str(tmp_path / "run"),
                     "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not in the local hub cache" in err
    # ... and a cached one plans by id (configuration and tokenizer only; the byte-level
    # tokenizer's label words share their first token, hence sequence scoring).
    assert cli.main(["plan", "--model", f"{REPO}@v1", "--data-file", str(rt_csv), "--shots", "4",
                     "--seeds", "1", "--test-size", "8", "--mode", "sequence", "--no-xla",
                     "--quiet", "--peak-tflops", "1", "--no-compile-time"]) == 0
    assert f"{REPO}@v1" in capsys.readouterr().out
