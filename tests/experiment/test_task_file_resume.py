"""A run of a --task-file task resumes by the task's content, not the file's path: from
another working directory and from a copy of the file (nothing rescored); other content
at the same path is refused in one line naming the file and what differs."""

from __future__ import annotations

import json
import shutil

import pytest

from sc_jax import cli
from sc_jax.experiment.evaluation.store import RUN_TASKS_FILE
from sc_jax.experiment.reporting.samples import regenerate_samples

TEMPLATE = "review: {text}\nverdict: {label}"
TINY = ["--model", "random:tiny-llama", "--shots", "2", "--seeds", "1", "--test-size", "8", "--quiet",
        "--methods", "base,cc"]


def _films(folder):
    rows = [{"text": f"film number {j} was {'great' if j % 2 else 'awful'}", "label": ["bad", "good"][j % 2]}
            for j in range(24)]
    folder.mkdir()
    (folder / "films.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = folder / "films.yaml"
    path.write_text(f"name: films\ntemplate: {json.dumps(TEMPLATE)}\nlabels: [bad, good]\ndata_file: films.jsonl\n")
    return path


def _run(task_file, out, capsys):
    code = cli.main(["run", "--task-file", str(task_file), *TINY, "--out", str(out)])
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("sc_jax:")]
    return code, err


def _calls(out) -> int:
    return sum(s["calls"] for s in json.loads((out / "results.json").read_text())["timing"]["seeds"])


def test_a_task_file_resumes_by_its_content(tmp_path, monkeypatch, capsys):
    first = _films(tmp_path / "a").parent
    out = tmp_path / "run"
    monkeypatch.chdir(first)
    assert _run("films.yaml", out, capsys) == (0, [])  # a path relative to the first directory
    assert _calls(out) > 0
    rows = json.loads((out / "results.json").read_text())["rows"]
    recorded = json.loads((out / RUN_TASKS_FILE).read_text())["films"]
    assert recorded["file"] == "films.yaml" and len(recorded["data_sha256"]) == 64

    # Another working directory, the same file by its absolute path: resumes, nothing rescored.
    monkeypatch.chdir(tmp_path)
    assert _run(first / "films.yaml", out, capsys) == (0, [])
    assert _calls(out) == 0 and json.loads((out / "results.json").read_text())["rows"] == rows
    # A copy elsewhere (its data beside it): the same.
    shutil.copytree(first, tmp_path / "b")
    assert _run(tmp_path / "b" / "films.yaml", out, capsys) == (0, [])
    assert _calls(out) == 0 and json.loads((out / RUN_TASKS_FILE).read_text())["films"]["file"] == \
        str(tmp_path / "b" / "films.yaml")

    # The same path, other content: a field, then a row, each refused in one line.
    copy = tmp_path / "b" / "films.yaml"
    copy.write_text(copy.read_text().replace("verdict:", "opinion:"))
    code, err = _run(copy, out, capsys)
    assert code != 0 and len(err) == 1, err
    assert f"task file {copy} is not the task 'films' the run in --out {out} read: field 'template'" in err[0]
    assert "'review: {text}\\nverdict: {label}' there" in err[0] and "--overwrite" in err[0]
    shutil.copy(first / "films.yaml", copy)
    data = tmp_path / "b" / "films.jsonl"
    data.write_text(data.read_text().replace("film number 3 ", "film number three "))
    code, err = _run(copy, out, capsys)
    assert code != 0 and len(err) == 1 and "its rows differ (data sha256" in err[0], err


def test_a_run_without_task_records_still_compares_paths(tmp_path, monkeypatch, capsys):
    """A run directory written before run_tasks.json (and results.json's ``tasks``): the
    path is what it has, so another path is another configuration, as before."""
    first = _films(tmp_path / "a")
    out = tmp_path / "run"
    assert _run(first, out, capsys) == (0, [])
    (out / RUN_TASKS_FILE).unlink()
    results = json.loads((out / "results.json").read_text())
    del results["tasks"]
    (out / "results.json").write_text(json.dumps(results))
    assert _run(first, out, capsys) == (0, [])  # the same path resumes
    (out / RUN_TASKS_FILE).unlink()
    results = json.loads((out / "results.json").read_text())
    del results["tasks"]
    (out / "results.json").write_text(json.dumps(results))
    shutil.copytree(first.parent, tmp_path / "b")
    code, err = _run(tmp_path / "b" / "films.yaml", out, capsys)
    assert code != 0 and "holds a run with another configuration (task_files:" in err[0], err


def test_report_finds_the_task_as_the_resume_does(tmp_path, monkeypatch, capsys):
    """`sc-jax report --log-samples` from another directory finds a task file given by a
    relative path where the run resolved it (texts filled in), and refuses one whose
    content changed since."""
    first = _films(tmp_path / "a").parent
    out = tmp_path / "run"
    monkeypatch.chdir(first)
    assert _run("films.yaml", out, capsys) == (0, [])
    monkeypatch.chdir(tmp_path)
    path, notes = regenerate_samples(out)
    texts = [json.loads(line).get("text_sha256") for line in path.read_text().splitlines()]
    assert notes == [] and texts and all(texts), notes
    (first / "films.yaml").write_text((first / "films.yaml").read_text().replace("verdict:", "opinion:"))
    with pytest.raises(ValueError, match=r"task file \S*films.yaml is not the task 'films' the run read: "
                                         r"field 'template' differs"):
        regenerate_samples(out)
