"""LOOC's own leave-one-out job: scheduled where a run's sub-context sizes stop below
k - 1, scored with the engine's prefix sharing and equal to the plain path, kept in the
score files, and read by the method."""

import json

import numpy as np
import pytest

from sc_jax import cli
from sc_jax.experiment.evaluation import methods, metrics
from sc_jax.experiment.evaluation.results import load_results
from sc_jax.experiment.evaluation.store import load_scores
from sc_jax.experiment.protocol.config import RunConfig
from sc_jax.experiment.protocol.jobs import leave_one_out_job
from sc_jax.experiment.protocol.runplan import build_plan
from sc_jax.models.loading import load_model
from sc_jax.scoring.reference import score_plain

ARGS = ["--model", "random:tiny-llama", "--shots", "4", "--seeds", "1", "--test-size", "8"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("looc") / "rt.jsonl"
    path.write_text("".join(json.dumps({"text": f"a fine film number {j}", "label": j % 2}) + "\n"
                            for j in range(40)))
    return path


def _config(data, **kw):
    return RunConfig(model="random:tiny-llama", shots=(4,), seeds=(0,), test_size=8,
                     data_files=(("rotten_tomatoes", str(data)),), datasets=("rotten_tomatoes",), **kw)


def test_the_job_is_scheduled_only_where_the_sizes_stop_below_k_minus_1(data):
    ctx, pairs = leave_one_out_job(4)
    assert ctx.tolist() == [[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2]]
    assert pairs.tolist() == [[0, 0], [1, 1], [2, 2], [3, 3]]

    def tags(**kw):
        return set(build_plan(_config(data, **kw)).work[0].jobs.jobs)

    assert "loo" in tags(max_size=2, methods=("base", "looc"))
    assert "loo" not in tags(max_size=3, methods=("base", "looc"))  # surrogate3 holds them
    assert "loo" not in tags(max_size=2, methods=("base", "sc"))


def test_a_run_scores_it_as_the_plain_path_does_and_looc_reads_it(data, tmp_path, monkeypatch):
    monkeypatch.setenv("SC_JAX_XLA_CACHE", "")  # keep the session's JAX configuration (cli.main)
    out = tmp_path / "run"
    assert cli.main(["run", "--out", str(out), "--data-file", str(data), *ARGS, "--quiet",
                     "--max-size", "2", "--methods", "base,looc"]) == 0
    (path,) = sorted((out / "scores").glob("*.npz"))
    s = load_scores(path)
    logp, labels, queries = s.loo
    assert queries.tolist() == [0, 1, 2, 3] and labels.tolist() == s.demo_labels.tolist()
    # The plain path: each prompt built and run whole, no shared prefix (float32; the two
    # sum the same terms in other orders, so they agree to rounding, 1e-5 absolute).
    work = build_plan(_config(data, max_size=2, methods=("base", "looc"))).work[0]
    model = load_model("random:tiny-llama")
    plain = score_plain(model, work.jobs.pieces, *work.jobs.jobs["loo"])
    np.testing.assert_allclose(logp, plain, atol=1e-5)
    (row,) = [r for r in load_results(out).rows if r.method == "looc"]
    p = methods.method_probs("looc", s, None, [])
    assert row.accuracy == metrics.accuracy(s.y_test, p.argmax(-1))
    # The same scores without their leave-one-out prompts (a run without looc, sizes
    # 1 and 2 at k = 4): LOOC refuses, naming what it lacks, and the samples written
    # again from the score files leave it out instead of building it from size 2.
    import dataclasses

    from sc_jax.experiment.reporting.samples import read_samples, regenerate_samples

    short = dataclasses.replace(s, loo=None)
    assert not methods.looc_scored(short) and methods.looc_scored(s)
    with pytest.raises(ValueError, match=r"^method looc needs each demonstration under the other k - 1 = 3; "
                                         r"these scores stop at size 2 \(--max-size\)"):
        methods.method_probs("looc", short, None, [])
    np.savez(path, **{k: v for k, v in np.load(path).items() if not k.startswith("loo")})
    regenerate_samples(out)
    assert all("looc" not in r["probs"] for r in read_samples(out))
