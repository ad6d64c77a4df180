"""Every refusal names its subject: the option, field or file at fault and what to do,
in one line, before any model is loaded or any prompt scored. Ranges are defined once
(sc_jax.runtime.ranges) and checked the same through RunConfig, the API's constructors and the
command line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sc_jax import cli
from sc_jax.experiment.protocol.config import RunConfig
from test_cli import TINY, _data, _one_error, _stop_at_the_model


# ------------------------------------------------------------------ RunConfig
@pytest.mark.parametrize("fields, message", [
    # accepted, then refused by the fit after every seed was scored, naming no option
    (dict(lambda_inv=1e40), "lambda_inv (--lambda-inv) must be in [0, 1e+30]"),
    # got the explanation meant for tau = 1
    (dict(tau=float("nan")), "tau (--tau) must be a number in [-1, 1), got nan"),
    (dict(test_size=7.5), "test_size (--test-size) must be an integer, got 7.5"),
    (dict(m_cap=True), "m_cap (--m-cap) must be an integer, got True"),
    (dict(shots=(4.0,)), "shots (--shots) must be an integer, got 4.0"),  # named files "k4.0"
    (dict(dtype="float16"), "dtype (--dtype) must be one of float32, bfloat16, got 'float16'"),
    (dict(mesh_model=0), "mesh_model (--mesh) must be at least 1, got 0"),
    (dict(data_files=(("rotten_tomatoes", ""),)), "--data-file rotten_tomatoes= names no file"),
])
def test_run_config_refuses_each_range_naming_its_option(fields, message):
    with pytest.raises(ValueError) as err:
        RunConfig(**fields)
    assert str(err.value).startswith(message), str(err.value)


def test_run_config_takes_one_value_or_a_list_for_its_list_fields():
    """datasets="sst2" was split into four letters (then refused as 's' twice), shots=4
    was a TypeError, and lists made the frozen config unhashable."""
    config = RunConfig(datasets="sst2", shots=4, seeds=[0, 1], methods=["sc"])
    assert (config.datasets, config.shots, config.seeds, config.methods) == (("sst2",), (4,), (0, 1), ("sc",))
    assert hash(config) == hash(RunConfig(datasets=("sst2",), shots=(4,), seeds=(0, 1), methods=("sc",)))
    with pytest.raises(ValueError, match=r"^data_files takes \(dataset, file\) pairs"):
        RunConfig(data_files="rt.jsonl")


def test_one_range_serves_the_config_the_api_and_the_parser():
    from sc_jax.runtime import ranges

    rng = ranges.RANGES["max_tokens_per_batch"]
    assert rng.problem(0) == "must be at least 1, got 0" and rng.problem(1) is None
    parse = ranges.arg_type("seed")
    assert parse("3") == 3
    with pytest.raises(Exception, match="must be 0 or more, got -1"):
        parse("-1")


# ------------------------------------------------------------------ the API's constructors
@pytest.fixture(scope="module")
def tiny():
    import sc_jax

    return sc_jax.load_model("random:tiny-llama", seed=1)


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_tokens_per_batch=0), "max_tokens_per_batch (--max-tokens-per-batch) must be at least 1, got 0"),
    (dict(max_cache_tokens=-5), "max_cache_tokens (--max-cache-tokens) must be at least 1, got -5"),
    (dict(device_memory=0), "device_memory (bytes per device) must be at least 1, got 0"),
])
def test_scoring_engine_refuses_what_the_cli_refuses(tiny, kwargs, message):
    from sc_jax.scoring.engine import ScoringEngine

    with pytest.raises(ValueError) as err:
        ScoringEngine(tiny, progress=False, **kwargs)
    assert str(err.value).startswith(message), str(err.value)


def test_a_budget_below_the_weights_is_named_in_units_that_show_it(tiny):
    """ScoringEngine(device_memory=1) planned against "0.00 GiB usable of a 0.00 GiB
    budget"."""
    from sc_jax.scoring.engine import ScoringEngine
    from sc_jax.scoring.memory import PlanError
    from sc_jax.scoring.prompts import Template, build_pieces

    pieces = build_pieces(tiny.tokenizer, Template("review:", "sentiment:", ("neg", "pos")),
                          [("a film", 1), ("bad", 0)], ["fine"])
    with pytest.raises(PlanError, match=r"^the weights need \d+ bytes per device, more than the 0 "
                                        r"bytes usable of a 1 bytes budget \(device_memory, --device-memory;"):
        ScoringEngine(tiny, device_memory=1, progress=False).score_jobs(
            pieces, {"x": (np.array([[0]]), np.array([[0, 0]]))})


def test_load_model_refuses_float16_as_the_cli_does():
    import sc_jax

    with pytest.raises(ValueError, match=r"^dtype \(--dtype\) must be one of float32, bfloat16, got 'float16'$"):
        sc_jax.load_model("random:tiny-llama", dtype="float16")


def test_pieces_and_contexts_name_what_is_wrong(tiny):
    from sc_jax.scoring.engine import ScoringEngine
    from sc_jax.scoring.prompts import Template, build_pieces

    template = Template("review:", "sentiment:", ("negative", "positive"))
    # a bare "invalid literal for int() with base 10: 'positive'"
    with pytest.raises(ValueError, match=r"^demonstration 0 has label 'positive': labels are class ids"):
        build_pieces(tiny.tokenizer, template, [("a film", "positive")], ["q"])
    pieces = build_pieces(tiny.tokenizer, template, [("a film", 1), ("bad", 0), ("ok", 1)], ["fine"])
    # scored as if demonstration 0 could appear twice in one sub-context
    with pytest.raises(ValueError, match=r"^context 1 \(\[2, 2\]\) repeats a demonstration"):
        ScoringEngine(tiny, progress=False).score_jobs(
            pieces, {"x": (np.array([[0, 1], [2, 2]]), np.array([[0, 2], [1, 0]]))})


# ------------------------------------------------------------------ the command line
@pytest.mark.parametrize("argv, message", [
    # "expected non-negative integer" (NumPy's), after the model loaded
    (["demo", "--seed", "-1"], "argument --seed: must be 0 or more, got -1"),
    (["demo", "--k", "9"], "argument --k: must be in [2, 8]"),
    # "data file . is a directory"
    (["run", "--data-file", "rotten_tomatoes=", "--out", "{tmp}/o"], "--data-file rotten_tomatoes= names no file"),
    # said to re-run `sc-jax run`, though the file was the wrong one
    (["report", "{tmp}/table.md"], "{tmp}/table.md is a file, not a run's output directory"),
    # mentioned an --out that was not given
    (["ablate", "{tmp}/table.md"], "{tmp}/table.md is a file, not a run's output directory"),
    # refused by the refit with the fit's own line, after reading every score file
    (["ablate", "{tmp}", "--lambda-inv", "1e40"], "lambda_inv (--lambda-inv) must be in [0, 1e+30]"),
])
def test_cli_refusals_name_their_subject(tmp_path, capsys, monkeypatch, argv, message):
    _stop_at_the_model(monkeypatch)
    (tmp_path / "table.md").write_text("| a table |\n")
    argv = [a.format(tmp=tmp_path) for a in argv]
    if argv[0] == "run":
        argv += TINY
    with pytest.raises(SystemExit) if argv[0] == "demo" else _no_exit():
        rc = cli.main(argv)
        assert rc == 2
    err = capsys.readouterr().err
    assert message.format(tmp=tmp_path) in err and "Traceback" not in err, err


class _no_exit:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# ------------------------------------------------------------------ data rows
def test_blank_texts_are_left_out_with_one_warning_and_recorded(tmp_path, capsys, caplog):
    """A file with rows of empty, whitespace-only or zero-width-space-only text (the
    paper's tweet_eval_hate export has 7) was refused whole; a text of zero-width spaces
    alone was accepted as a text. They are left out of every draw now, with one warning
    naming the rows, and results.json lists them; --strict-data refuses them."""
    from sc_jax.experiment.protocol.runplan import rows_passed_over
    from sc_jax.experiment.protocol.splits import split_protocol
    from sc_jax.experiment.tasks.loading import load_task

    path = _data(tmp_path)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[3]["text"], rows[7]["text"], rows[11]["text"] = "", " \t ", "\u200b\u200b"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["run", "--data-file", str(path), "--out", str(tmp_path / "run"), "--strict-data"] + TINY
    assert cli.main(argv) == 2
    assert _one_error(capsys) == (f"error: {path}: 3 rows have an empty or whitespace-only text "
                                  "(rows [4, 8, 12]); remove them, or leave out --strict-data to "
                                  "pass over them")
    with caplog.at_level("WARNING", logger="sc_jax"):
        ds = load_task("rotten_tomatoes", data_file=path)
    warned = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(warned) == 1 and "3 rows have an empty or whitespace-only text (rows [4, 8, 12])" in warned[0]
    assert ds.blank_rows == (3, 7, 11) and len(ds) == 40
    for seed in range(8):  # 37 usable rows: 4 demonstrations and 28 test queries, none blank
        split = split_protocol(ds, k=4, test_size=28, seed=seed, test_seed=seed + 100)
        assert not {3, 7, 11} & set(split.demo_indices.tolist() + split.test_indices.tolist())
    with pytest.raises(ValueError, match="fewer than k"):  # 38 would need a blank row
        split_protocol(ds, k=4, test_size=34, seed=0, test_seed=1)
    notes, left_out = rows_passed_over({"rotten_tomatoes": ds})
    assert left_out == {"rotten_tomatoes": [4, 8, 12]} and "left out of every draw" in notes[0]


def test_a_projection_from_a_run_that_scored_nothing_is_refused():
    """A resumed run (every seed from its score cache) has no forward time to rate: the
    projection divided by zero."""
    from sc_jax.experiment.evaluation.results import FitTiming, RunTiming, SeedTiming
    from sc_jax.experiment.execution.grid import MeasuredRates

    seed = SeedTiming(dataset="sst2", shots=4, seed=0, wall_s=0.1, compile_s=0.0,
                      executed_tokens=0, forward_s=0.0, host_s=0.1)
    fit = FitTiming(dataset="sst2", shots=4, seeds=[0], wall_s=0.1, solve_s=0.1, compile_s=0.0)
    timing = RunTiming(seeds=(seed,), fits=(fit,), metrics_s=0.0, load_s=1.0, report_s=0.5,
                       unaccounted_s=0.0)
    with pytest.raises(ValueError, match=r"^the run scored no token \(every seed came from its score cache\)"):
        MeasuredRates.from_timing(timing)
