"""``sc-jax export-tasks DIR``: the nine built-in tasks' JSONL files (one
``{"text": ..., "label": <class id>}`` object a line, non-ASCII as JSON escapes, the
format of the team's ``shared/datasets``) rebuilt from the Hugging Face datasets that
:data:`sc_jax.experiment.tasks.spec.TASKS` names, through ``datasets.load_dataset`` (the
``[data]`` extra). :data:`EXPORT_SPLITS` gives the splits each file holds, in order;
the rows keep each split's order, and their labels are the class ids of the task's
template (the source's own ids or label names, through the task's ``label_map``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from sc_jax.experiment.tasks.loading import DataUnavailableError, _to_dataset, columns_of
from sc_jax.experiment.tasks.spec import TASKS, Dataset, TaskSpec

__all__ = ["EXPORT_SPLITS", "export_lines", "export_tasks"]

#: Per built-in task: the source's splits whose rows, one after the other, make its file
#: (AG News: its test split, 7,600 rows; TREC: train and test; TweetEval emotion: all
#: three; the others their train split).
EXPORT_SPLITS: dict[str, tuple[str, ...]] = {
    "sst2": ("train",),
    "sst5": ("train",),
    "ag_news": ("test",),
    "rotten_tomatoes": ("train",),
    "subj": ("train",),
    "trec": ("train", "test"),
    "tweet_eval_emotion": ("train", "validation", "test"),
    "tweet_eval_hate": ("train",),
    "financial_phrasebank": ("train",),
}


def export_lines(dataset: Dataset) -> str:
    """The JSONL text of ``dataset``: one ``{"text": ..., "label": <int>}`` a line,
    ``json.dumps``' defaults (ASCII, ", " and ": "), each line ending in a newline."""
    return "".join(json.dumps({"text": t, "label": int(y)}) + "\n"
                   for t, y in zip(dataset.texts, dataset.labels))


def _source(spec: TaskSpec, split: str) -> str:
    return f"{spec.hf_id}" + (f" (config {spec.hf_config})" if spec.hf_config else "") + f", split {split!r}"


def _load_split(datasets, spec: TaskSpec, split: str) -> Dataset:
    what = _source(spec, split)
    try:
        hf = datasets.load_dataset(spec.hf_id, spec.hf_config, split=split)
    except Exception as exc:  # offline, not cached, auth: datasets raises many kinds
        raise DataUnavailableError(f"could not load {what} from the Hugging Face hub or its cache: "
                                   f"{type(exc).__name__}: {' '.join(str(exc).split())}") from exc
    columns = columns_of(hf, f"hf:{what}", wanted=(spec.text_column, spec.label_column))
    return _to_dataset(columns, spec, spec.text_column, spec.label_column, f"hf:{what}", f"hf:{what}")


def export_tasks(out_dir: str | os.PathLike, names=None, *, overwrite: bool = False,
                 report=print) -> list[Path]:
    """Writes ``out_dir/<name>.jsonl`` for each of ``names`` (None: the nine, in
    :data:`EXPORT_SPLITS`' order) from the Hugging Face hub or its cache, and returns
    the paths. ``report``: called with one line per file written.

    Raises ImportError (no ``datasets``: ``pip install 'sc-jax[data]'``), ValueError (an
    unknown name, a file that exists without ``overwrite``: checked before any
    download) or DataUnavailableError (a split the hub cannot give)."""
    names = tuple(EXPORT_SPLITS) if names is None else tuple(names)
    unknown = [n for n in names if n not in EXPORT_SPLITS]
    if unknown:
        raise ValueError(f"export-tasks: unknown task {unknown[0]!r}; the tasks are "
                         f"{', '.join(EXPORT_SPLITS)}")
    out = Path(out_dir).expanduser()
    if out.exists() and not out.is_dir():
        raise ValueError(f"export-tasks: {out} is a file, not a directory")
    paths = [out / f"{name}.jsonl" for name in names]
    there = [p for p in paths if p.exists()]
    if there and not overwrite:
        raise ValueError(f"export-tasks: {there[0]} exists ({len(there)} of the files do): give "
                         "--overwrite to replace them, or another directory")
    try:
        import datasets  # the optional [data] extra
    except ImportError:
        raise ImportError("export-tasks loads the Hugging Face datasets with the optional package "
                          "`datasets`, which is not installed: pip install 'sc-jax[data]'") from None
    out.mkdir(parents=True, exist_ok=True)
    for name, path in zip(names, paths):
        spec = TASKS[name]
        parts = [_load_split(datasets, spec, split) for split in EXPORT_SPLITS[name]]
        text = "".join(export_lines(part) for part in parts)
        partial = path.with_suffix(".jsonl.partial")  # a file interrupted half-written is never taken
        partial.write_text(text, encoding="utf-8")
        partial.replace(path)
        rows = sum(len(p) for p in parts)
        report(f"{path}: {rows:,} rows from {spec.hf_id}"
               + (f" ({spec.hf_config})" if spec.hf_config else "")
               + f", split{'s' if len(parts) > 1 else ''} {' + '.join(EXPORT_SPLITS[name])}")
    return paths
