"""The experiment's scoring stage: every score a (dataset, k, seed) needs, cached."""

import numpy as np
import pytest

import sc_jax
from sc_jax.scoring.cache import FORMAT_FILE, ScoreCache
from sc_jax.experiment.tasks.loading import load_task
from sc_jax.calibration.baselines import CONTENT_FREE_INPUTS
from sc_jax.experiment.protocol.config import RunConfig
from sc_jax.experiment.protocol.jobs import hidden_tags, score_seed
from sc_jax.experiment.protocol.runplan import build_plan
from sc_jax.scoring.engine import ScoringEngine
from scipy.spatial.distance import cdist

from sc_jax import cli
from sc_jax.calibration.hidden import class_centroids, hidden_calibration
from sc_jax.experiment.evaluation.results import load_results
from sc_jax.experiment.evaluation.store import load_scores


@pytest.fixture(scope="module")
def dataset(rt_csv):
    return load_task("rotten_tomatoes", data_file=rt_csv)


def test_score_seed_shapes_and_cache(dataset, tmp_path):
    model = sc_jax.load_model("random:tiny-llama")
    config = RunConfig(model="random:tiny-llama", shots=(4,), seeds=(0,), test_size=6, m_cap=3,
                       budget=30)
    work = build_plan(config, datasets={"rotten_tomatoes": dataset}).work[0]
    split = work.split
    engine = ScoringEngine(model, progress=False)
    cache = ScoreCache(tmp_path / "cache")
    s, stats = score_seed(model, engine, cache, dataset, work, config, planned=work.planned)
    assert stats.calls > 0
    assert s.base.shape == (6, 2) and s.cc.shape == (len(CONTENT_FREE_INPUTS), 2) and s.dc.shape == (20, 2)
    assert sorted(s.surrogate) == [1, 2, 3] and sorted(s.test) == [1, 2, 3]
    lp, y, q = s.surrogate[2]
    assert lp.shape == (4 * 3 * 2, 2) and set(q) == {0, 1, 2, 3}
    np.testing.assert_array_equal(y, np.asarray(split.demo_labels)[q])
    # |T_1| = 12 rows -> m_1 = min(6, 3, 4) = 3 sub-contexts x 6 test queries.
    assert s.test[1].shape == (3, 6, 2)
    # Nine jobs' log-probs, and the last hidden states of the six Hidden Calibration
    # needs (the default methods include it).
    assert cache.misses == 3 + 2 * 3 + 2 * 3 and cache.hits == 0
    assert sorted(s.hidden) == [1, 2, 3] and s.hidden[1].shape == (3, 6, 2)
    # A second run (a resumed one) recomputes nothing and gives identical arrays.
    cache2 = ScoreCache(tmp_path / "cache")
    s2, stats2 = score_seed(model, engine, cache2, dataset, work, config, planned=work.planned)
    assert stats2.calls == 0  # served from the cache: no engine call
    assert cache2.hits == 15 and cache2.misses == 0
    np.testing.assert_array_equal(s.hidden[2], s2.hidden[2])
    np.testing.assert_array_equal(s.base, s2.base)
    np.testing.assert_array_equal(s.test[3], s2.test[3])
    # The same entries under their format-1 keys, as sc_jax before key format 2 left
    # them: served with no engine call, each rewritten under its format-2 key.
    legacy = ScoreCache(tmp_path / "format1")
    tags = hidden_tags(config, 4)
    for new, old in ((work.cache_keys(model.identity, config.mode),
                      work.legacy_keys(model.legacy_identities, config.mode, work.jobs.jobs)),
                     (work.hidden_keys(model.identity, config.mode, tags),
                      work.legacy_keys(model.legacy_identities, config.mode, tags, hidden=True))):
        for tag, key in new.items():
            legacy.put(old[tag][0], cache2.get(key))
    (tmp_path / "format1" / FORMAT_FILE).unlink()
    cache4 = ScoreCache(tmp_path / "format1")
    s4, stats4 = score_seed(model, engine, cache4, dataset, work, config, planned=work.planned)
    assert stats4.calls == 0 and (cache4.hits, cache4.migrated, cache4.misses) == (15, 15, 0)
    np.testing.assert_array_equal(s4.test[3], s.test[3])
    np.testing.assert_array_equal(s4.hidden[2], s.hidden[2])
    # The plan's schedule against the engine's own: the same calls, the same scores.
    s3, stats3 = score_seed(model, ScoringEngine(model, progress=False), None, dataset, work, config)
    assert stats3.shape == stats.shape and stats3.calls == stats.calls
    for a, b in ((s.base, s3.base), (s.cc, s3.cc), (s.dc, s3.dc), (s.test[2], s3.test[2]),
                 (s.surrogate[3][0], s3.surrogate[3][0])):
        np.testing.assert_array_equal(a, b)


def test_run_config_rejects_bad_input():
    with pytest.raises(ValueError, match=r"^methods \(--methods\) must be one of base, .*got .magic.$"):
        RunConfig(methods=("sc", "magic"))
    with pytest.raises(ValueError, match="tau"):
        RunConfig(tau=2.0)
    with pytest.raises(ValueError, match=r"^guard \(--guard\) must be one of none, bias_only, "
                                         r"bias_only_free, got 'always'$"):
        RunConfig(guard="always")
    with pytest.raises(ValueError, match="shots"):
        RunConfig(shots=(1,))
    with pytest.raises(ValueError, match="not among the datasets"):
        RunConfig(datasets=("sst2",), data_files=(("trec", "x.csv"),))


def test_hidden_calibration_end_to_end(rt_csv, tmp_path):
    """`sc-jax run --methods base,hidden`: results rows for both; the seed's saved
    distances are those of the cached hidden states' class centroids, and a cache of
    log-probs alone (a run without hidden) is rescored for its states only, its
    log-probs kept."""
    out = tmp_path / "run"
    tiny = ["--model", "random:tiny-llama", "--shots", "4", "--seeds", "1", "--test-size", "6",
            "--m-cap", "2", "--budget", "30", "--max-size", "2", "--quiet",
            "--data-file", str(rt_csv)]
    config = RunConfig(model="random:tiny-llama", shots=(4,), seeds=(0,), test_size=6, m_cap=2,
                       budget=30, max_size=2, methods=("base", "hidden"),
                       data_files=(("rotten_tomatoes", str(rt_csv)),))
    work = build_plan(config).work[0]
    identity = sc_jax.load_model("random:tiny-llama").identity
    cache = ScoreCache(out / "cache")
    logp = work.cache_keys(identity, config.mode)["surrogate2"]
    # SC reads the surrogate prompts' log-probs (a run of Base alone scores none).
    assert cli.main(["run", "--out", str(out), "--methods", "base,sc"] + tiny) == 0
    kept = cache.get(logp)
    assert kept is not None
    # The same run resumed with hidden (a method added since): states only are scored.
    assert cli.main(["run", "--out", str(out), "--methods", "base,sc,hidden"] + tiny) == 0
    assert np.array_equal(cache.get(logp), kept)
    res = load_results(out)
    rows = {r.method: r for r in res.rows}
    assert set(rows) == {"base", "sc", "hidden"} and 0 <= rows["hidden"].accuracy <= 1
    s = load_scores(next((out / "scores").rglob("*.npz")))
    assert sorted(s.hidden) == [1, 2] and s.hidden[2].shape == (2, 6, 2)
    # The states behind them, from the score cache: surrogate2's centroids, test2's
    # prompts (the seed's jobs as the run planned them).
    keys = work.hidden_keys(identity, config.mode, ["surrogate2", "test2"])
    sur, test = cache.get(keys["surrogate2"]), cache.get(keys["test2"])
    labels = np.asarray(work.split.demo_labels)[work.jobs.jobs["surrogate2"][1][:, 1]]
    want = cdist(test, class_centroids(sur, labels, 2)).reshape(2, 6, 2)
    np.testing.assert_allclose(s.hidden[2], want, rtol=1e-10)
    assert rows["hidden"].accuracy == np.mean(hidden_calibration([s.hidden[1], s.hidden[2]]).argmax(-1)
                                              == s.y_test)
