"""`sc-jax export-tasks DIR` writes the nine JSONL files in the format of the shipped
ones (shared/datasets), from `datasets.load_dataset`; here a stand-in `datasets` module
yields the rows (no hub in the tests)."""

from __future__ import annotations

import types

import pytest

from sc_jax import cli
from sc_jax.experiment.tasks.export import EXPORT_SPLITS, export_tasks
from sc_jax.experiment.tasks.spec import TASKS

# Lines of the shipped files, verbatim: ag_news.jsonl's first two (the AG News test
# split's first rows), an sst5.jsonl line with non-ASCII text, trec.jsonl's first line.
AG_NEWS = (
    '{"text": "Fears for T N pension after talks Unions representing workers at Turner   Newall say '
    'they are \'disappointed\' after talks with stricken parent firm Federal Mogul.", "label": 2}\n'
    '{"text": "The Race is On: Second Private Team Sets Launch Date for Human Spaceflight (SPACE.com) '
    'SPACE.com - TORONTO, Canada -- A second\\\\team of rocketeers competing for the  #36;10 million '
    'Ansari X Prize, a contest for\\\\privately funded suborbital space flight, has officially announced '
    'the first\\\\launch date for its manned rocket.", "label": 3}\n'
)
SST5 = ('{"text": "famuyiwa \'s feature deals with its subject matter in a tasteful , intelligent manner , '
        'rather than forcing us to endure every plot contrivance that the clich\\u00e9-riddled genre can '
        'offer .", "label": 3}\n')
TREC = '{"text": "What was the species of Winnie the Pooh ?", "label": 1}\n'


class _Split:
    """What `datasets.load_dataset(..., split=...)` returns, as far as the export reads it."""

    def __init__(self, columns):
        self.columns = columns
        self.column_names = list(columns)

    def __getitem__(self, name):
        return self.columns[name]


def _rows(text):
    import json
    return [json.loads(line) for line in text.splitlines()]


@pytest.fixture
def hub(monkeypatch):
    """A `datasets` module whose load_dataset serves the rows above, the source's own
    columns and label encodings (AG News: its label names), and records each call."""
    ag = _rows(AG_NEWS)
    trec = _rows(TREC)
    served = {
        ("ag_news", None, "test"): {"text": [r["text"] for r in ag], "label": ["Business", "Sci/Tech"]},
        ("SetFit/sst5", None, "train"): {"text": [_rows(SST5)[0]["text"]], "label": [3],
                                         "label_text": ["positive"]},
        ("CogComp/trec", None, "train"): {"text": [trec[0]["text"]], "coarse_label": [1], "fine_label": [5]},
        ("CogComp/trec", None, "test"): {"text": ["How far is it ?"], "coarse_label": ["NUM"],
                                         "fine_label": [40]},
    }
    calls = []

    def load_dataset(path, name=None, *, split):
        calls.append((path, name, split))
        return _Split(served[(path, name, split)])

    monkeypatch.setitem(__import__("sys").modules, "datasets",
                        types.SimpleNamespace(load_dataset=load_dataset))
    return calls


def test_export_writes_the_shipped_files_format(tmp_path, hub, capsys):
    assert cli.main(["export-tasks", str(tmp_path / "out"), "--tasks", "ag_news", "sst5", "trec"]) == 0
    out = tmp_path / "out"
    assert (out / "ag_news.jsonl").read_bytes() == AG_NEWS.encode()
    assert (out / "sst5.jsonl").read_bytes() == SST5.encode()
    # TREC: the train split, then the test split; the coarse label, by id or by name.
    assert (out / "trec.jsonl").read_text() == TREC + '{"text": "How far is it ?", "label": 5}\n'
    assert hub == [("ag_news", None, "test"), ("SetFit/sst5", None, "train"),
                   ("CogComp/trec", None, "train"), ("CogComp/trec", None, "test")]
    assert sorted(p.name for p in out.iterdir()) == ["ag_news.jsonl", "sst5.jsonl", "trec.jsonl"]
    assert "trec.jsonl: 2 rows from CogComp/trec, splits train + test" in capsys.readouterr().out
    # Existing files are refused before any load, unless --overwrite.
    with pytest.raises(ValueError, match="ag_news.jsonl exists"):
        export_tasks(out, ["ag_news"])
    assert export_tasks(out, ["ag_news"], overwrite=True, report=lambda _: None) == [out / "ag_news.jsonl"]


def test_export_covers_the_nine_and_needs_datasets(tmp_path, monkeypatch, capsys):
    assert tuple(EXPORT_SPLITS) == tuple(TASKS)
    assert all(TASKS[n].hf_id for n in EXPORT_SPLITS)
    monkeypatch.setitem(__import__("sys").modules, "datasets", None)
    assert cli.main(["export-tasks", str(tmp_path)]) != 0
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("sc_jax:")]
    assert len(err) == 1 and "pip install 'sc-jax[data]'" in err[0], err
    with pytest.raises(ValueError, match="unknown task 'imdb'"):
        export_tasks(tmp_path, ["imdb"])
