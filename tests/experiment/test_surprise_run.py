"""`sc-jax run --methods base,surprise` end to end on a tiny random model: its rows, the
inputs its score files keep for it, and score files written before it."""

import json

import numpy as np
import pytest

from sc_jax.calibration.methods import surprise as surprise_method
from sc_jax.calibration.surprise import SurpriseSettings
from sc_jax import cli
from sc_jax.experiment.evaluation import methods, metrics
from sc_jax.experiment.evaluation.results import load_results
from sc_jax.experiment.evaluation.store import load_scores
from sc_jax.experiment.protocol.config import RunConfig

# The network at a test's size: the method's code path, not the authors' 5.5M parameters.
SMALL = SurpriseSettings(embed_dim=5, hidden_dim=7, epochs=3)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("surprise")
    data = tmp / "rt.jsonl"
    data.write_text("".join(json.dumps({"text": f"a fine film number {j}", "label": j % 2}) + "\n"
                            for j in range(40)))
    out = tmp / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(surprise_method, "SETTINGS", SMALL)
        mp.setenv("SC_JAX_XLA_CACHE", "")  # keep the session's JAX configuration (cli.main)
        assert cli.main(["run", "--out", str(out), "--data-file", str(data), "--model",
                              "random:tiny-llama", "--shots", "4", "--seeds", "1", "--test-size",
                              "8", "--quiet", "--methods", "base,surprise"]) == 0
    return out


def test_run_reports_surprise_from_its_score_files(run_dir, monkeypatch):
    res = load_results(run_dir)
    assert sorted({r.method for r in res.rows}) == ["base", "surprise"]
    (row,) = [r for r in res.rows if r.method == "surprise"]
    (path,) = sorted((run_dir / "scores").glob("*.npz"))
    s = load_scores(path)
    # The score file keeps what the method reads: each surrogate row's context (never
    # holding its own query) and the demonstrations' labels in prompt order.
    assert sorted(s.surrogate_contexts) == sorted(s.surrogate) == [1, 2, 3]
    for i, (lp, y, q) in s.surrogate.items():
        ctx = s.surrogate_contexts[i]
        assert ctx.shape == (len(q), i) and not (ctx == q[:, None]).any()
        np.testing.assert_array_equal(y, s.demo_labels[q])
    monkeypatch.setattr(surprise_method, "SETTINGS", SMALL)
    p = methods.method_probs("surprise", s, None, [])
    assert p.shape == s.base.shape
    assert row.accuracy == metrics.accuracy(s.y_test, p.argmax(-1))


def test_score_files_written_before_it_load_and_refuse_it_in_one_line(run_dir, tmp_path):
    (path,) = sorted((run_dir / "scores").glob("*.npz"))
    with np.load(path) as z:
        old = {k: z[k] for k in z.files if k != "demo_labels" and not k.endswith("_contexts")}
    np.savez(tmp_path / "old.npz", **old)
    s = load_scores(tmp_path / "old.npz")
    assert s.demo_labels is None and s.surrogate_contexts is None
    np.testing.assert_array_equal(s.base, load_scores(path).base)
    with pytest.raises(ValueError, match=r"^these scores predate Surprise Calibration"):
        methods.method_probs("surprise", s, None, [])


def test_surprise_runs_only_when_named():
    assert "surprise" not in RunConfig().methods
    assert RunConfig(methods=("base", "surprise")).methods == ("base", "surprise")


def test_metrics_say_that_surprise_trains_and_how_long(run_dir, monkeypatch, caplog):
    import logging

    from sc_jax.experiment.execution import run

    (path,) = sorted((run_dir / "scores").glob("*.npz"))
    config = RunConfig.from_json(run_dir / "run_config.json")
    monkeypatch.setattr(surprise_method, "SETTINGS", SMALL)
    monkeypatch.setattr(run, "SLOW_METHOD_S", -1.0)  # every method counts as slow here
    with caplog.at_level(logging.INFO, logger="sc_jax.experiment.execution.run"):
        rows, _ = run._metric_rows({config.seeds[0]: load_scores(path)}, {}, "rotten_tomatoes", 4, 2, config,
                                   progress=True)
    msgs = [r.getMessage() for r in caplog.records]
    assert msgs[0] == ("[rotten_tomatoes k=4] predicting 2 methods for 1 seed(s); Surprise "
                       "trains on each seed's scores first")
    assert [m.split(": predicted in ")[0] for m in msgs[1:]] == [
        f"[rotten_tomatoes k=4 seed={config.seeds[0]}] Base", f"[rotten_tomatoes k=4 seed={config.seeds[0]}] Surprise"]
    assert len(rows) == 2
