"""Per-sample records (sc_jax.experiment.reporting.samples): the file, its check against
results.json, paired tests, and records regenerated for a committed run from its score files."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from sc_jax.experiment.evaluation.results import ResultRow, load_results
from sc_jax.experiment.reporting import samples
from sc_jax.experiment.reporting.samples import (
    check_samples,
    paired_tests,
    read_samples,
    rows_from_samples,
    seed_records,
    text_hash,
    write_samples,
)

RUN = Path(__file__).resolve().parents[2] / "benchmarks/real_eval/qwen2.5-0.5b/k4"


def _records():
    gold = np.array([0, 1, 1, 0])
    probs = {"sc": np.array([[0.9, 0.1], [0.2, 0.8], [0.4, 0.6], [0.7, 0.3]]),
             "bc": np.array([[0.6, 0.4], [0.6, 0.4], [0.1, 0.9], [0.2, 0.8]])}
    per_size = {"sc": {1: probs["sc"], 2: probs["sc"][::-1]}}
    return seed_records("t", 4, 0, gold, probs, per_size, rows=[5, 6, 7, 8],
                        texts=["a", "b", "c", "d"])


def test_records_round_trip_plain_and_gzipped(tmp_path, monkeypatch):
    recs = _records()
    assert recs[1]["pred"] == {"sc": 1, "bc": 0} and recs[1]["gold"] == 1
    assert recs[2]["text_sha256"] == text_hash("c") and recs[2]["row"] == 7
    assert recs[3]["sc_sizes"]["sc"]["2"] == [0.9, 0.1]
    path = write_samples(tmp_path, recs)
    assert path.name == "samples.jsonl" and read_samples(tmp_path) == recs
    monkeypatch.setattr(samples, "GZIP_ABOVE", 10)
    path = write_samples(tmp_path, recs)
    assert path.name == "samples.jsonl.gz" and not (tmp_path / "samples.jsonl").exists()
    assert read_samples(tmp_path) == recs
    assert read_samples(tmp_path / "nowhere") is None
    path.write_bytes(b"not gzip")
    with pytest.raises(ValueError, match="unreadable sample log"):
        read_samples(tmp_path)


@pytest.mark.parametrize("name, data", [("samples.jsonl", b""), ("samples.jsonl", b"\n \n"),
                                        ("samples.jsonl.gz", None)])
def test_an_empty_sample_log_is_refused_not_read_as_absent(tmp_path, name, data):
    """An empty log was read as no log (None), so its check against results.json
    never ran. It is refused by name; a line that is no record too."""
    import gzip

    path = tmp_path / name
    path.write_bytes(gzip.compress(b"") if data is None else data)
    with pytest.raises(ValueError, match=f"^{path} is empty .*`sc-jax report DIR --log-samples`"):
        read_samples(tmp_path)
    path.unlink()
    (tmp_path / "samples.jsonl").write_text('{"dataset": "t"}\n')
    with pytest.raises(ValueError, match="samples.jsonl, record 1: not a sample record"):
        read_samples(tmp_path)


def test_check_and_paired_tests():
    recs = _records()
    ece = {r.method: r.ece for r in rows_from_samples(recs)}  # of the records' rounded probs
    rows = [ResultRow(dataset="t", shots=4, seed=0, method="sc", accuracy=1.0, macro_f1=1.0,
                      ece=ece["sc"]),
            ResultRow(dataset="t", shots=4, seed=0, method="bc", accuracy=0.5, macro_f1=0.5,
                      ece=ece["bc"])]
    assert check_samples(recs, rows) == []
    bad = check_samples(recs, [rows[1].replace(accuracy=0.75), rows[0].replace(seed=1)])
    assert bad[0].startswith("t k=4 seed 0 bc: accuracy 0.500000 from the records, 0.750000")
    assert bad[1] == "t k=4 seed 1 sc: no per-sample records"
    (c,) = paired_tests(recs, "sc", "bc")
    assert (c["queries"], c["seeds"], c["a_only"], c["b_only"]) == (4, [0], [2], [0])
    assert c["mcnemar_p"] == [pytest.approx(0.5)]  # exact McNemar: 2 * (1/2)^2
    # Three seeds of the same four queries: one McNemar test per seed, never pooled.
    other = seed_records("t", 4, 1, [0, 1, 1, 0], {"sc": np.eye(2)[[0, 0, 1, 0]],
                                                    "bc": np.eye(2)[[0, 1, 1, 1]]})
    (c,) = paired_tests(recs + other, "sc", "bc")
    assert (c["seeds"], c["a_only"], c["b_only"]) == ([0, 1], [2, 1], [0, 1])
    assert c["mcnemar_p"] == [pytest.approx(0.5), pytest.approx(1.0)]
    with pytest.raises(ValueError, match=r"probs\['x'\] must be \[2, n\]"):
        seed_records("t", 4, 0, [0, 1], {"x": np.ones((3, 2))})
    with pytest.raises(ValueError, match="texts must have one entry per test query"):
        seed_records("t", 4, 0, [0, 1], {"x": np.ones((2, 2))}, texts=["a"])


def test_regenerated_for_a_committed_run_from_its_score_files(tmp_path, monkeypatch):
    """A run committed before sample logs: `sc-jax report DIR --log-samples` writes
    them from DIR/scores and the params in results.json (no model, no refit); they
    reproduce every row, and add BC as the reference code computes it, LOOC and LinC."""
    from sc_jax import cli
    from sc_jax.experiment.evaluation import methods
    from sc_jax.experiment.evaluation.store import ADDED_METHODS
    from sc_jax.models import loading

    def refuse(*args, **kwargs):
        raise AssertionError("regenerating the records loaded a model or refitted")

    monkeypatch.setattr(loading, "load_model", refuse)
    monkeypatch.setattr(methods, "fit_batch", refuse)
    res = json.loads((RUN / "results.json").read_text())
    # As the run was committed before the methods added since (refitted runs have them).
    old = [m for m in res["config"]["methods"] if m not in ADDED_METHODS]
    res["config"].update(datasets=["ag_news", "sst2"], methods=old)
    res["rows"] = [r for r in res["rows"]
                   if r["dataset"] in ("ag_news", "sst2") and r["method"] in old]
    res["params"] = [p for p in res["params"]
                     if p["dataset"] in ("ag_news", "sst2") and p["method"] in old]
    res["splits"] = [s for s in res["splits"] if s["dataset"] in ("ag_news", "sst2")]
    (tmp_path / "results.json").write_text(json.dumps(res))
    (tmp_path / "scores").mkdir()
    for f in (RUN / "scores").glob("*.npz"):
        if f.name.startswith(("ag_news", "sst2")):
            shutil.copy(f, tmp_path / "scores" / f.name)
    assert cli.main(["report", str(tmp_path), "--log-samples"]) == 0
    recs = read_samples(tmp_path)
    assert len(recs) == 2 * 3 * 128  # datasets x seeds x test queries
    assert check_samples(recs, load_results(tmp_path).rows) == []
    assert {"bc_reference", "looc", "linc"} <= set(recs[0]["pred"])
    assert "sc_star_free" not in recs[0]["pred"]
    table = (tmp_path / "table.md").read_text()
    assert "match results.json" in table and "| BC (code) |" in table and "| LOOC |" in table
    assert "BC (code), LinC, LOOC: computed from the per-sample records" in table
    # compare_paper.py gives SC's margin over both forms of BC, bc_reference from the records.
    compare = _compare_paper()
    tasks, blocks = compare.blocks([tmp_path], {"macro_f1_k4": json.loads(
        (RUN.parents[1] / "paper_7b_tables.json").read_text())["macro_f1_k4"]}, 4, "macro_f1")
    text = compare.markdown(tasks, blocks[:1], "macro_f1", 4)
    assert "| SC - BC |" in text and "| SC - BC (code) |" in text and "| BC (code) |" in text
    assert "the guard fitted SC* at" in text and "SC against BC (code), win / tie / loss" in text
    # Where the run's data are at hand (the repository's shared datasets), the records
    # name the rows; elsewhere those fields are null and the rest is the same.
    if recs[0]["row"] is not None:
        assert len({r["text_sha256"] for r in recs if r["dataset"] == "sst2"}) == 128


def _compare_paper():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "compare_paper", RUN.parents[1] / "compare_paper.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reference_size_weighting_of_a_committed_seed():
    """method_probs with size_weighting="reference" weights each size's probabilities
    by min(P(k, i)(k - i), 15000) (k = 8: 56, 336, 1680, 6720, 15000), not by the rows
    the budget kept (300 per size in this run)."""
    from sc_jax.calibration import numpy_predict
    from sc_jax.experiment.evaluation import methods
    from sc_jax.experiment.evaluation.store import load_scores

    run = RUN.parents[1] / "smollm2-135m" / "k8"
    res = load_results(run)
    s = load_scores(run / "scores" / "ag_news-k8-seed0.npz")
    fits = {p.size: samples._fit_from_param(p, "augmented_lagrangian") for p in res.params
            if (p.dataset, p.seed, p.method) == ("ag_news", 0, "sc")}
    sizes = [1, 2, 3, 4, 5]
    assert [fits[i].num_rows for i in sizes] == [56, 300, 300, 300, 300]
    weights = np.array([56, 336, 1680, 6720, 15000], float)
    np.testing.assert_array_equal(numpy_predict.reference_size_weights(8, sizes), weights)
    per = methods.sc_size_probs(s, fits, sizes)
    got = methods.method_probs("sc", s, fits, sizes, size_weighting="reference", shots=8)
    want = sum(w * per[i] for w, i in zip(weights, sizes)) / weights.sum()
    np.testing.assert_allclose(got, want, rtol=1e-12)


COMMITTED_RUNS = sorted(p.parent for p in (RUN.parents[1]).glob("*/*/results.json"))


@pytest.mark.parametrize("run", COMMITTED_RUNS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_committed_run_has_sample_records_that_reproduce_it(run):
    """Each run under benchmarks/real_eval keeps per-sample records, and accuracy,
    macro-F1 and ECE recomputed from them are results.json's (exact for the first two,
    ECE to the records' rounding of the probabilities: check_samples' tolerances)."""
    records = read_samples(run)
    assert records, f"{run} has no samples.jsonl(.gz)"
    assert check_samples(records, load_results(run).rows) == []


def test_the_committed_runs_are_found():
    # The glob above must see every reported run, or the test above checks nothing.
    names = {f"{p.parent.name}/{p.name}" for p in COMMITTED_RUNS}
    assert {"smollm2-135m/k4", "smollm2-135m/k8", "qwen2.5-0.5b/k4", "qwen2.5-0.5b/k8"} <= names
