"""results.json's typed records (sc_jax.experiment.evaluation.results): each record's to_json and
from_json round trip, every committed run loads and re-serialises to the dict on disk
(byte for byte where written in today's order), and a malformed record is one line."""

import dataclasses
import json
import math
from pathlib import Path

import pytest

from sc_jax.experiment.evaluation.results import (
    CacheCounts,
    FitRecord,
    FitTiming,
    ResultRow,
    RunResults,
    RunTiming,
    SeedTiming,
    SkippedSetting,
    SplitRecord,
    load_results,
)
from sc_jax.experiment.execution.grid import MeasuredRates

COMMITTED = sorted((Path(__file__).resolve().parents[2] / "benchmarks").glob("**/results.json"))


def _seed(seed: int) -> SeedTiming:
    return SeedTiming(dataset="sst2", shots=4, seed=seed, wall_s=2.5, compile_s=1.0, programs=3,
                      model_programs=2, cache_hits=1, forward_s=1.0, host_s=0.5, engine_host_s=0.25,
                      calls=4, tokens=100, executed_tokens=128, shape={"B": 2, "W": 64},
                      attention="dense", attention_trials=({"name": "dense", "seconds": 1e-3},),
                      attention_from_cache=False)


def _run() -> RunResults:
    """A run's results as run_experiment builds them: every record kind, every key."""
    rows = tuple(ResultRow(dataset="sst2", model="m", shots=4, method=m, seed=s, accuracy=0.75,
                           macro_f1=0.5, ece=0.125) for m in ("base", "sc") for s in (0, 1))
    params = tuple(FitRecord(dataset="sst2", shots=4, seed=s, size=1, method="sc", b=[0.5],
                             w=[1.25], status="CONVERGED", tau=0.99, lambda_inv=0.1,
                             objective=0.25, base_accuracy=0.75, rows=12, guarded=False)
                   for s in (0, 1))
    fit = FitTiming(dataset="sst2", shots=4, seeds=[0, 1], wall_s=1.5, compile_s=1.0,
                    solve_s=0.5, programs=2, cache_hits=0, problems=2)
    timing = RunTiming(total_s=10.0, load_s=2.0, scoring_s=5.0, compile_s=2.0, forward_s=2.0,
                       host_s=1.0, fitting_s=1.5, fit_compile_s=1.0, fit_solve_s=0.5,
                       metrics_s=0.5, report_s=0.5, unaccounted_s=0.5, model_programs=4,
                       programs=6, cache_hits=2, seeds=(_seed(0), _seed(1)), fits=(fit,))
    return RunResults(
        config={"model": "m", "datasets": ["sst2", "ag_news"], "shots": [4], "seeds": [0, 1],
                "test_size": 8, "mode": "first_token", "solver": "augmented_lagrangian",
                "methods": ["base", "sc"]},
        lambda_inv=0.1, model_identity="abc", model_source="/m",
        model_description={"name": "m", "variant": None, "quantisation": "none", "dtype": "float32",
                           "source": "Hugging Face directory /m", "upstream": None, "licence": None},
        versions={"jax": "0.10.2"},
        rows=rows, params=params,
        splits=tuple(SplitRecord(dataset="sst2", shots=4, seed=s, demo_indices=[1, 2, 3, 4],
                                 test_size=8, test_hash="ff") for s in (0, 1)),
        skipped=(SkippedSetting(dataset="ag_news", shots=4),), notes=("a note",), timing=timing,
        left_out_rows={"sst2": [3]}, cache=CacheCounts(hits=1, misses=2, corrupt=0),
        runtime={"processes": 1, "devices": 1, "mesh": {"data": 1, "model": 1}},
        memory_policy={"device_memory": 1 << 30})


# The keys in the order the run has written them: a new file's bytes are an older
# version's for the same run.
_RUN_KEYS = ["config", "lambda_inv", "model_identity", "model_source", "model_description",
             "versions", "rows",
             "params", "splits", "skipped", "notes", "timing", "left_out_rows", "cache",
             "runtime", "memory_policy", "tasks"]
_ROW_KEYS = ["dataset", "model", "shots", "method", "seed", "accuracy", "macro_f1", "ece"]
_TIMING_KEYS = ["total_s", "load_s", "scoring_s", "compile_s", "forward_s", "host_s",
                "fitting_s", "fit_compile_s", "fit_solve_s", "metrics_s", "report_s",
                "unaccounted_s", "model_programs", "programs", "cache_hits", "seeds", "fits"]


def test_every_record_round_trips_through_json():
    run = _run()
    data = json.loads(json.dumps(run.to_json()))
    assert RunResults.from_json(data) == run
    assert RunResults.from_json(data).to_json() == data
    assert list(data) == _RUN_KEYS and list(data["rows"][0]) == _ROW_KEYS
    assert list(data["timing"]) == _TIMING_KEYS
    for record in (run.rows[0], run.params[0], run.splits[0], run.skipped[0], run.cache,
                   run.timing, run.timing.seeds[0], run.timing.fits[0]):
        assert type(record).from_json(json.loads(json.dumps(record.to_json()))) == record
    # The typed timing is what the grid projection reads.
    rates = MeasuredRates.from_timing(run.timing)
    assert rates.forward_tokens_per_s == 256 / 2.0 and rates.fit_solve_per_seed_s == 0.25


def test_keys_an_older_file_lacks_stay_absent_and_newer_keys_are_kept():
    old = {"config": {"model": "m", "seeds": [0]}, "rows": [
        {"dataset": "t", "shots": 4, "method": "sc", "seed": 0, "accuracy": 0.5, "macro_f1": 0.5,
         "ece": 0.0, "added_later": [1]}],
        "params": [{"dataset": "t", "shots": 4, "seed": 0, "size": 1, "method": "sc", "b": [0.0],
                    "w": [1.0]}],
        "timing": {"scoring_s": 1.0, "fitting_s": 0.5, "total_s": 2.0}}
    res = RunResults.from_json(old)
    assert res.to_json() == old
    assert res.rows[0].model is None and res.rows[0].extra == {"added_later": [1]}
    # What an older file means by a key's absence: a fit without a status converged.
    assert res.params[0].status == "CONVERGED" and math.isnan(res.params[0].tau)
    assert res.guard == "none" and res.timing.seeds == () and res.timing.load_s is None
    assert res.config_lambda_inv is None and res.fit_lambda_inv == 0.1
    # A key set on an older file's record is written from then on.
    assert res.replace(model_source="/m").to_json() == dict(old, model_source="/m")


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: str(p.parent.relative_to(p.parents[2])))
def test_committed_runs_load_and_reserialise_as_they_are(path):
    raw = json.loads(path.read_text())
    res = load_results(path)
    assert res.to_json() == raw
    assert RunResults.from_json(res.to_json()) == res
    assert len(res.rows) == len(raw["rows"]) and isinstance(res.rows[0], ResultRow)
    if list(raw.get("timing", {})) == _TIMING_KEYS:  # written by today's run_timing
        assert json.dumps(res.to_json(), indent=1) == path.read_text()


@pytest.mark.parametrize("change, problem", [
    ({"splits": [3]}, "splits[0] is not an object"),
    ({"timing": {"seeds": [{"dataset": "t", "shots": 4}]}}, "timing['seeds'][0] has no 'seed'"),
    ({"timing": {"fits": {"a": 1}}}, "timing['fits'] is not a list"),
    ({"skipped": [{"dataset": "t"}]}, "skipped[0] has no 'shots'"),
])
def test_a_malformed_record_is_one_line_naming_it(tmp_path, change, problem):
    data = dict(_run().to_json(), **change)
    (tmp_path / "results.json").write_text(json.dumps(data))
    with pytest.raises(ValueError) as e:
        load_results(tmp_path)
    assert str(e.value) == f"{tmp_path / 'results.json'} is not an sc_jax results file: {problem}"


def test_records_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        _run().rows[0].seed = 3


def test_timing_line_gives_the_share_spent_compiling():
    from sc_jax.experiment.execution.run import compile_share, timing_line

    timing = _run().timing  # 10 s in all: scoring compiled 2 s, the fits 1 s
    assert compile_share(timing) == pytest.approx(0.3)
    assert timing_line(timing).startswith("time: 10.0 s (30% of it compiling) = load 2.0 + ")
    # A file from before the parts were timed has no share to give.
    assert compile_share(RunTiming()) is None
