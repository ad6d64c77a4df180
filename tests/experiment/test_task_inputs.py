"""Task inputs as strict as model inputs (issue 81): label words matched one way only,
task files and data read strictly, RunConfig's types checked at construction, and the
newer methods refusing what the paper's refuse. Each case gave a silent wrong result or
a traceback at c2172a5."""

import json

import numpy as np
import pytest

from sc_jax.calibration import hidden, linc, surprise
from sc_jax.experiment.protocol.config import RunConfig
from sc_jax.experiment.tasks.loading import load_task
from sc_jax.experiment.tasks.spec import TaskSpec, read_task_file

TEMPLATE = "q: {text}\na: {label}"


@pytest.mark.parametrize("labels, message", [
    (["Good", "good"], "the label words 'Good' and 'good' differ only in case or surrounding spaces"),
    (["good", "good "], "the label words 'good' and 'good ' differ only in case or surrounding spaces"),
    (["1", "0"], "the label word '1' is class 0, but a data label '1' \\(a CSV's\\) or 1 \\(a JSON file's\\) "
                 "reads as class id 1"),
    (["bad\nworse", "good"], "the label word 'bad\\\\nworse' holds a control character \\('\\\\n'\\)"),
])
def test_label_words_that_data_could_match_two_ways_are_refused(labels, message):
    with pytest.raises(ValueError, match=f"^task 'c': field 'labels': {message}"):
        TaskSpec.create("c", TEMPLATE, labels)


def test_numbers_as_words_follow_one_rule_whatever_the_file():
    task = TaskSpec.create("c", TEMPLATE, ["0", "1"])
    # A CSV gives strings, a JSON file integers: the same classes either way.
    got = load_task(task, data={"text": ["a", "b", "c", "d"], "label": ["1", 1, "0", 0]}).labels
    assert got.tolist() == [1, 1, 0, 0]
    words = TaskSpec.create("c", TEMPLATE, ["bad", "good"])
    assert load_task(words, data={"text": ["x", "y", "z"], "label": ["Good", " bad", 1]}).labels.tolist() == [1, 0, 1]


def _task_file(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_field_given_twice_is_refused(tmp_path):
    body = '{"name": "c", "template": "q: {text}\\na: {label}", "labels": ["a", "b"], "labels": ["b", "a"]}'
    path = _task_file(tmp_path, "c.json", body)
    with pytest.raises(ValueError, match=f"^task file {path}: field 'labels' is given twice; keep one$"):
        read_task_file(path)
    yaml_path = _task_file(tmp_path, "c.yaml", "name: c\ntemplate: \"q: {text}\\na: {label}\"\n"
                                              "labels: [a, b]\nlabels: [b, a]\n")
    with pytest.raises(ValueError, match=f"^task file {yaml_path}: field 'labels' is given twice"):
        read_task_file(yaml_path)


def test_yaml_booleans_in_a_label_list_get_a_hint(tmp_path):
    path = _task_file(tmp_path, "c.yaml", "name: c\ntemplate: \"q: {text}\\na: {label}\"\nlabels: [no, yes]\n")
    with pytest.raises(ValueError, match=r"field 'labels' must be a list of strings, got \[False, True\]: "
                                         r"YAML reads unquoted no, yes, off, on, false and true as booleans; "
                                         r"quote them"):
        read_task_file(path)


class _Frame:
    """A pandas-like table (``columns`` and ``frame[name]``) with a column named twice."""

    columns = ["text", "text", "label"]

    def __getitem__(self, name):
        return [["a", "b"], ["c", "d"]] if name == "text" else [0, 1]


class _Split:
    column_names = ["text", "label"]


def test_data_with_a_column_twice_or_several_splits_is_refused():
    task = TaskSpec.create("c", TEMPLATE, ["bad", "good"])
    with pytest.raises(ValueError, match=r"column 'text' appears more than once; rename or drop the copies"):
        load_task(task, data=_Frame())
    with pytest.raises(ValueError, match=r"a dict of splits \(train, test\), not one table: pick a split, "
                                         r"e.g. data=data\['train'\]"):
        load_task(task, data={"train": _Split(), "test": _Split()})


def test_a_task_files_named_column_is_never_swapped_for_another(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"text": f"t{j}", "label": j % 2}) + "\n" for j in range(6)))
    path = _task_file(tmp_path, "c.json", json.dumps({
        "name": "c", "template": TEMPLATE, "labels": ["a", "b"], "label_column": "sentiment",
        "data_file": str(data)}))
    with pytest.raises(ValueError, match=f"has no label column 'sentiment' \\(the field 'label_column' of {path}\\)"):
        load_task(read_task_file(path))


@pytest.mark.parametrize("fields, message", [
    ({"chat_template": "false"}, "chat_template \\(--chat-template\\) must be true or false, got str 'false'"),
    ({"strict_data": "no"}, "strict_data \\(--strict-data\\) must be true or false, got str 'no'"),
    ({"data_dir": 5}, "data_dir \\(--data-dir\\) must be a string or None, got int 5"),
    ({"model": None}, "model \\(--model\\) must be a string, got NoneType None"),
    ({"test_size": True}, "test_size \\(--test-size\\) must be an integer, got True"),
])
def test_run_config_types_are_checked_at_construction(fields, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        RunConfig(**fields)
    with pytest.raises(ValueError, match=f"^{message}$"):
        RunConfig.from_json(dict(RunConfig().to_json(), **fields))


def test_run_config_takes_paths_and_numpy_integers():
    from pathlib import Path

    config = RunConfig(data_dir=Path("/data"), seeds=np.arange(2), test_size=np.int64(8))
    assert config.data_dir == "/data" and config.seeds == (0, 1) and type(config.test_size) is int


def _surprise_inputs():
    rng = np.random.default_rng(0)
    logp = np.log(rng.dirichlet([1, 1], 6))
    train = [(rng.integers(0, 2, (6, 1)), np.log(rng.dirichlet([1, 1], 6)), rng.integers(0, 2, 6))]
    return logp, np.array([0, 1, 1, 0]), train


@pytest.mark.parametrize("damage, message", [
    ("nan", "the test scores must be \\[..., 2\\] label log-probs without NaN or \\+inf"),
    ("label -1", "the demonstrations' labels must be class ids in 0..1, got \\[-1, 0, 1\\]"),
    ("label 2", "the demonstrations' labels must be class ids in 0..1, got \\[0, 1, 2\\]"),
])
def test_surprise_refuses_what_the_papers_methods_refuse(damage, message):
    logp, labels, train = _surprise_inputs()
    if damage == "nan":
        logp[1, 0] = np.nan
    else:
        labels[0] = -1 if damage == "label -1" else 2
    with pytest.raises(ValueError, match=f"^Surprise Calibration: {message}"):
        surprise.surprise_probs(logp, labels, train, n=2, settings=surprise.SurpriseSettings(epochs=1))


def test_linc_and_hidden_refuse_degenerate_inputs():
    with pytest.raises(ValueError, match="^LinC: the content-free inputs' label probabilities are all 0"):
        linc.linc_init(np.zeros((3, 2)))
    states = np.ones((4, 3))
    states[2, 1] = np.nan
    with pytest.raises(ValueError, match="^Hidden Calibration: the calibration prompts' hidden states hold NaN"):
        hidden.class_centroids(states, np.array([0, 1, 0, 1]), 2)
    with pytest.raises(ValueError, match="^Hidden Calibration: the test prompts' centroid distances hold NaN"):
        hidden.hidden_calibration([np.full((2, 3, 2), np.nan)])


def test_the_same_task_file_twice_is_named(tmp_path, capsys):
    from sc_jax import cli

    path = _task_file(tmp_path, "films.json", json.dumps({"name": "films", "template": TEMPLATE,
                                                         "labels": ["bad", "good"]}))
    assert cli.main(["run", "--task-file", str(path), "--task-file", str(path), "--out", str(tmp_path / "o")]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert err == [f"error: task file {path} is given twice (--task-file): give each file once"]


def test_results_record_the_task_and_report_refuses_edited_data(tmp_path, monkeypatch, capsys):
    from sc_jax import cli
    from sc_jax.experiment.evaluation.results import load_results

    monkeypatch.setenv("SC_JAX_XLA_CACHE", "")  # keep the session's JAX configuration (cli.main)
    data = tmp_path / "rt.jsonl"
    data.write_text("".join(json.dumps({"text": f"a fine film number {j}", "label": j % 2}) + "\n"
                            for j in range(30)))
    out = tmp_path / "run"
    assert cli.main(["run", "--out", str(out), "--data-file", str(data), "--model", "random:tiny-llama",
                     "--shots", "2", "--seeds", "1", "--test-size", "6", "--quiet", "--methods", "base,bc"]) == 0
    task = load_results(out).tasks["rotten_tomatoes"]
    dataset = load_task("rotten_tomatoes", data_file=data)
    assert task == dict(dataset.record(), chat_template=False)
    assert task["labels"] == ["negative", "positive"] and task["rows"] == 30 and len(task["data_sha256"]) == 64
    assert cli.main(["report", str(out), "--log-samples"]) == 0  # the same data: fine
    capsys.readouterr()
    data.write_text(data.read_text().replace("number 3\"", "number three\""))  # one text edited
    assert cli.main(["report", str(out), "--log-samples"]) == 2
    (err,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert err.startswith(f"error: rotten_tomatoes: the data here ({data}) are not the rows the run read")


def test_a_missing_builtin_task_is_one_line_and_offline_means_no_hub_retries(monkeypatch):
    import sys
    import types

    from sc_jax.experiment.tasks import loading as task_loading

    monkeypatch.setitem(sys.modules, "datasets", None)  # not installed
    with pytest.raises(task_loading.DataUnavailableError) as err:
        load_task("sst2")
    assert str(err.value) == (
        "task 'sst2' has no local data and its hub copy (glue (config sst2), split 'train') needs the optional "
        "package `datasets` (pip install 'sc-jax[data]'): give --data-dir DIR holding sst2.jsonl (`sc-jax "
        "export-tasks DIR` writes the nine tasks' files on a machine that reaches the hub; data_dir=... in "
        "Python), or --data-file sst2=FILE (CSV, JSONL or Parquet with a column 'sentence' or 'text' and a "
        "column 'label': 0..1 or negative, positive)")
    # Installed but offline: the load is told so (no ~30 s of retries), and fails in one line.
    seen = {}

    def load_dataset(*args, **kwargs):
        seen.update(env=os.environ.get("HF_HUB_OFFLINE"), config=fake.config.HF_HUB_OFFLINE)
        raise ConnectionError("Couldn't reach 'glue' on the Hub (LocalEntryNotFoundError)")

    import os

    fake = types.SimpleNamespace(load_dataset=load_dataset, config=types.SimpleNamespace(HF_HUB_OFFLINE=False))
    monkeypatch.setitem(sys.modules, "datasets", fake)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(task_loading, "_hub_reachable", lambda timeout=2.0: False)
    with pytest.raises(task_loading.DataUnavailableError) as err:
        load_task("sst2")
    assert seen == {"env": "1", "config": True} and "HF_HUB_OFFLINE" not in os.environ
    assert fake.config.HF_HUB_OFFLINE is False and "\n" not in str(err.value)
    assert str(err.value).startswith("task 'sst2' has no local data and the hub is not reachable and its cache "
                                     "lacks glue (config sst2), split 'train' (ConnectionError: ")


def test_a_7b_plan_for_an_accelerator_works_in_one_command_on_a_cpu(tmp_path, capsys):
    """`sc-jax plan --model random:qwen2-7b --accelerator h100`: the H100's memory and
    the dtype a GPU run takes (bfloat16), where float32 weights (28 GiB) would not fit
    this machine's budget; --dtype and --device-memory still win where given."""
    from sc_jax import cli

    data = tmp_path / "rt.jsonl"
    data.write_text("".join(json.dumps({"text": f"a fine film number {j}", "label": j % 2}) + "\n"
                            for j in range(80)))
    base = ["plan", "--data-file", str(data), "--shots", "4", "--seeds", "1", "--test-size", "16",
            "--model", "random:qwen2-7b", "--no-xla", "--no-compile-time", "--quiet"]
    assert cli.main(base + ["--accelerator", "h100"]) == 0
    out = capsys.readouterr().out
    assert "model random:qwen2-7b (bfloat16)" in out and "budget 80.0 GiB per device" in out
    assert cli.main(base + ["--accelerator", "h100", "--dtype", "float32", "--device-memory", "20GiB"]) == 2
    assert "the weights need 28.37 GiB per device" in capsys.readouterr().err
