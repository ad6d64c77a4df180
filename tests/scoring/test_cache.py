"""The on-disk score cache: round trip, key sensitivity, corrupt entries recomputed."""

import numpy as np
import pytest

from sc_jax.scoring.cache import ScoreCache, score_key
from sc_jax.scoring.prompts import PromptPieces


def _pieces(demo0=(5, 6)):
    return PromptPieces(demos=(demo0, (7, 8)), demo_labels=(0, 1), queries=((9,), (10, 11)),
                        labels=((3,), (4,)), sep=(1,), bos=())


def test_round_trip_and_hits(tmp_path):
    c = ScoreCache(tmp_path)
    calls = []
    arr = np.random.default_rng(0).normal(size=(4, 2)).astype(np.float32)
    f = lambda: calls.append(1) or arr  # noqa: E731
    a = c.get_or_compute("ab" * 32, f)
    b = c.get_or_compute("ab" * 32, f)
    assert len(calls) == 1 and c.hits == 1 and c.misses == 1
    np.testing.assert_array_equal(a, arr)
    np.testing.assert_array_equal(b, arr)
    assert not list(tmp_path.rglob(".tmp-*"))  # no temporary file left behind


def test_key_changes_with_every_input():
    p = _pieces()
    ctx, pairs = np.array([[0]]), np.array([[0, 1]])
    base = score_key("m1", "first_token", p, ctx, pairs)
    assert base == score_key("m1", "first_token", _pieces(), ctx, pairs)
    assert base != score_key("m2", "first_token", p, ctx, pairs)
    assert base != score_key("m1", "sequence", p, ctx, pairs)
    assert base != score_key("m1", "first_token", _pieces((5, 99)), ctx, pairs)
    assert base != score_key("m1", "first_token", p, np.array([[1]]), pairs)
    assert base != score_key("m1", "first_token", p, ctx, np.array([[0, 0]]))


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_corrupt_entry_is_recomputed(tmp_path, damage):
    c = ScoreCache(tmp_path)
    key = "cd" * 32
    c.put(key, np.arange(1000, dtype=np.float32))
    path = next(tmp_path.rglob("*.npz"))
    raw = bytearray(path.read_bytes())
    if damage == "truncate":
        raw = raw[: len(raw) // 2]
    else:  # flip bytes inside the stored array: the zip still opens, the checksum fails
        raw[400:404] = b"\xff\xff\xff\xff"
    path.write_bytes(bytes(raw))
    with pytest.warns(UserWarning, match="corrupt"):
        got = c.get_or_compute(key, lambda: np.full(3, 7.0, np.float32))
    np.testing.assert_array_equal(got, [7, 7, 7])
    assert c.corrupt == 1


def test_disabled_cache_computes_every_time():
    c = ScoreCache(None)
    n = []
    c.get_or_compute("x", lambda: n.append(1) or np.zeros(1))
    c.get_or_compute("x", lambda: n.append(1) or np.zeros(1))
    assert len(n) == 2


def test_an_entry_is_checked_against_its_key_and_rows(tmp_path):
    """A file copied or renamed under another key (its checksum still holds), or one
    whose rows are not the pairs asked for, is reported and recomputed; an entry written
    before keys were stored (no key field) is still read."""
    import io

    c = ScoreCache(tmp_path)
    a, b = "aa" * 32, "bb" * 32
    c.put(a, np.zeros((3, 2), np.float32))
    c._path(b).parent.mkdir(parents=True, exist_ok=True)
    c._path(a).replace(c._path(b))  # a's scores now sit under b's name
    with pytest.warns(UserWarning, match="holds the scores of key aaaaaaaaaaaa"):
        assert c.get(b) is None
    c.put(a, np.zeros((3, 2), np.float32))
    with pytest.warns(UserWarning, match="holds 3 rows for 4 pairs"):
        assert c.cached(a, rows=4) is None
    assert c.corrupt == 2
    # A legacy entry (value and checksum only) still loads.
    from sc_jax.scoring.cache import _digest

    arr = np.ones((2, 2), np.float32)
    buf = io.BytesIO()
    np.savez(buf, value=arr, sha256=np.asarray(_digest(arr)))
    c._path(b).write_bytes(buf.getvalue())
    np.testing.assert_array_equal(c.cached(b, rows=2), arr)
