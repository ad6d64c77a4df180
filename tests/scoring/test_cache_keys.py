"""Score-cache keys (format 2): pinned per job kind, blind to how the code names or
holds things, and caches of format 1 served and rewritten, or named in one line.

A golden key here fails when a key moves. A moved key costs every user their cache, so
the fix is never to update the digest alone: either the scores really change (and the
change says so in the CHANGELOG), or :func:`sc_jax.scoring.cache.score_key` must be
made to give the old key again, or KEY_FORMAT goes up with a migration.
"""

import numpy as np
import pytest

import sc_jax
from sc_jax.experiment.protocol.config import RunConfig
from sc_jax.experiment.protocol.runplan import build_plan
from sc_jax.experiment.tasks.loading import load_task
from sc_jax.models.identity import sampled_identity
from sc_jax.scoring.cache import FORMAT_FILE, KEY_FORMAT, ScoreCache, legacy_score_key, score_key
from sc_jax.scoring.prompts import PromptPieces


def _pieces(kind=tuple):
    return PromptPieces(demos=kind([kind([5, 6]), kind([7, 8])]), demo_labels=(0, 1),
                        queries=kind([kind([9]), kind([10, 11])]), labels=kind([kind([3]), kind([4])]),
                        sep=kind([1]), bos=kind([]))


CTX, PAIRS = np.array([[0], [1]]), np.array([[0, 1], [1, 1]])


def test_unit_keys_pinned():
    p = _pieces()
    assert KEY_FORMAT == 2
    assert score_key("m1", "first_token", p, CTX, PAIRS) == (
        "765c2f20925dd7f5c9333b81c7af8ee51a6f3b2ed81bf5cbca4f09adf59fb95c")
    assert score_key("m1", "first_token", p, CTX, PAIRS, quantity="last_hidden") == (
        "f97624381c5183c411cb6c3834334e04c342eb6c8664136978e2444fdea060f5")
    # Format 1, read only: the key the committed caches were written under (the
    # value sc_jax at 1f0abff computes for these pieces).
    assert legacy_score_key("m1", "first_token", p, CTX, PAIRS, "surrogate1") == (
        "6a22ca745357b04f471a5a833fdb2e9313fe6092e40404687d8ac48edcf66f16")


def test_key_blind_to_types_and_names():
    ref = score_key("m1", "first_token", _pieces(), CTX, PAIRS)
    # The same ids held as lists, or contexts as int32: the same scores, the same key.
    assert score_key("m1", "first_token", _pieces(list), CTX.astype(np.int32), PAIRS.tolist()) == ref
    # Ids split differently into sequences are other prompts.
    other = PromptPieces(demos=((5,), (6, 7, 8)), demo_labels=(0, 1), queries=((9,), (10, 11)),
                         labels=((3,), (4,)), sep=(1,), bos=())
    assert score_key("m1", "first_token", other, CTX, PAIRS) != ref
    # A query the pairs do not use is not in the key; one they use is.
    more = PromptPieces(demos=((5, 6), (7, 8)), demo_labels=(0, 1), queries=((99,), (10, 11)),
                        labels=((3,), (4,)), sep=(1,), bos=())
    assert score_key("m1", "first_token", more, CTX, PAIRS) == ref
    assert score_key("m1", "first_token", more, CTX, np.array([[0, 0]])) != score_key(
        "m1", "first_token", _pieces(), CTX, np.array([[0, 0]]))


@pytest.fixture(scope="module")
def tiny_work(rt_csv):
    config = RunConfig(model="random:tiny-llama", shots=(4,), seeds=(0,), test_size=6, m_cap=2,
                       budget=30, max_size=2, methods=("base", "cc", "dc", "sc", "looc", "hidden"))
    dataset = load_task("rotten_tomatoes", data_file=rt_csv)
    return config, build_plan(config, datasets={"rotten_tomatoes": dataset}).work[0]


# One key per job kind of a (rotten_tomatoes-format CSV, k = 4, seed 0) seed with the
# tiny random model: the split, the prompts' token ids, the job's contexts and pairs.
GOLDEN = {
    "base": "411e60dec5b32c7fc6fe7a64476643655f13cc884a7c2683abd09abb95f88b18",
    "cc": "5e904bc4e68ea0684e1c4b44f11f48285ca233635af31e4426c03ae72a8ef1a0",
    "dc": "6d05d8fee2cfdb46ea281be9c10024abd72d68e5a250854a71e79530c913a32e",
    "surrogate1": "789b7035aae668d208e99729d7466389e125307ae44552ec4f9a138f1135451d",
    "surrogate2": "e4f82cb09f2758c5e8d88823cb252a70e309f37a8014b30ac79a8a0e5a123fa5",
    "test1": "b346f5deec4432ac683f64a308b3fb40d9b0eae8e24ebf2ec6b106ebaa0bb190",
    "test2": "9ab3f637d7397b68d494ae9a106cb5f081ba18498f46b782f6aac7831cce61e9",
    "loo": "2761c47518fa5043f2be31b85b8475a22a88ca37239b24c87a5d7b6ef07bd65b",
}
GOLDEN_HIDDEN = {"surrogate2": "59a2afbb76ca0221c5bff2c7435b21775c857d00afd457801d8adf436463a1a0",
                 "test2": "d11785f1d563ddbbcb721e84ad4f46d005389761baf7d961a4d42531f602ecbd"}


def test_golden_keys_per_job_kind(tiny_work):
    config, work = tiny_work
    identity = sc_jax.load_model("random:tiny-llama").identity
    assert work.cache_keys(identity, config.mode) == GOLDEN
    assert work.hidden_keys(identity, config.mode, list(GOLDEN_HIDDEN)) == GOLDEN_HIDDEN


def test_sampled_identity_pinned(tmp_path):
    # The identity format-1 keys of real checkpoints were made with: size and the first
    # and last MiB of each file (3 MiB here, so a middle MiB it never reads).
    f = tmp_path / "model.safetensors"
    f.write_bytes(np.arange(3 << 18, dtype=np.uint32).tobytes())
    assert sampled_identity([f], "float32") == "b43e1e02035843ac"
    raw = bytearray(f.read_bytes())
    raw[3 << 19] ^= 1  # the middle MiB: format 1 could not tell
    f.write_bytes(bytes(raw))
    assert sampled_identity([f], "float32") == "b43e1e02035843ac"


def test_format1_directory_served_and_rewritten(tmp_path):
    p = _pieces()
    new = score_key("m", "first_token", p, CTX, PAIRS)
    old = legacy_score_key("m", "first_token", p, CTX, PAIRS, "surrogate1")
    arr = np.arange(4.0).reshape(2, 2)
    ScoreCache(tmp_path).put(old, arr)
    (tmp_path / FORMAT_FILE).unlink()  # as sc_jax before format 2 left it
    cache = ScoreCache(tmp_path)
    assert cache.format == 1
    assert cache.describe_format() == (
        f"score cache {tmp_path} was made by key format 1; its entries are served through their old "
        "keys and rewritten under format 2, and what they do not hold is rescored")
    got = cache.cached(new, rows=2, legacy=("0" * 64, old))
    np.testing.assert_array_equal(got, arr)
    assert (cache.hits, cache.misses, cache.migrated) == (1, 0, 1)
    assert (tmp_path / FORMAT_FILE).read_text() == "2\n"
    # Rewritten: the next run finds it under its own key, no migration.
    again = ScoreCache(tmp_path)
    assert again.describe_format() is None
    np.testing.assert_array_equal(again.cached(new, rows=2), arr)


def test_newer_format_named_and_not_read(tmp_path):
    p = _pieces()
    old = legacy_score_key("m", "first_token", p, CTX, PAIRS, "surrogate1")
    ScoreCache(tmp_path).put(old, np.zeros((2, 2)))
    (tmp_path / FORMAT_FILE).write_text("3\n")
    cache = ScoreCache(tmp_path)
    assert cache.describe_format() == (
        f"score cache {tmp_path} was made by key format 3 (a newer sc_jax); this one writes format 2 "
        "beside it and rescores what it needs")
    assert cache.cached(score_key("m", "first_token", p, CTX, PAIRS), rows=2, legacy=(old,)) is None
    cache.put("ab" * 32, np.zeros(1))
    assert (tmp_path / FORMAT_FILE).read_text() == "3\n"  # never lowered
