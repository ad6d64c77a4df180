"""Tasks as data, the paper's nine tasks (Section 4.1, Appendix C) and the labelled
texts of one.

A `TaskSpec` is a task: its prompt `Template`, the Hugging Face dataset id and config
or a local data file, split names, text and label columns, and CC's content-free
inputs. One is built in Python (`TaskSpec.create`, from a template string and label
words) or read from a YAML or JSON task file (`read_task_file`, `sc-jax run
--task-file`). `TASKS` maps the nine built-in names to theirs, read from the JSON task
files shipped in ``builtin_tasks/``, with the templates of Appendix C
(`sc_jax.scoring.prompts.TEMPLATES`). Class ids follow the template's label words: class 0 is
`template.labels[0]`. The integer labels of all nine Hugging Face datasets are already
in that order; `TaskSpec.label_map` adds the sources' own label names ("ABBR",
"very negative", "Sci/Tech") so that files exported with string labels load too.

A `Dataset` holds one task's texts and class ids, however they were loaded
(:mod:`sc_jax.experiment.tasks.loading`); `normalise_text` is how the split protocol
(:mod:`sc_jax.experiment.protocol.splits`) compares two texts.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
import unicodedata
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from sc_jax.calibration.baselines import CONTENT_FREE_INPUTS
from sc_jax.scoring.prompts import Template

__all__ = ["BUILTIN_TASKS", "TASKS", "TASK_FILE_FIELDS", "Dataset", "TaskSpec", "normalise_text",
           "read_task_file"]


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """A task: where its data lives and how it is prompted.

    hf_id, hf_config: arguments of `datasets.load_dataset` (hf_id None: no hub source;
    the data comes from `data_file` or from Python). train_split: the pool that
    `split_protocol` draws demonstrations and test examples from. test_split: the
    source's own labelled evaluation split, for use outside the paper's protocol
    (GLUE's test labels are hidden, so SST-2 names "validation"). text_column,
    label_column: column names in the source and the default names in a local file.
    label_map: (raw label, class id) pairs for label values that are neither class ids
    in the template's order nor template label words; string keys match
    case-insensitively. content_free: CC's content-free inputs (Zhao et al.; DC keeps
    its random in-domain strings). data_file: a local CSV/JSONL/Parquet file holding
    the task's rows (a task file's own, resolved against the file's directory).
    origin: the task file it was read from ("" for one built in Python); not compared.

    Build one with :meth:`create` (a template string and label words), from a
    mapping (:meth:`from_dict`) or a YAML/JSON task file (:func:`read_task_file`).
    """

    name: str
    hf_id: str | None
    hf_config: str | None
    train_split: str
    test_split: str
    text_column: str
    label_column: str
    template: Template
    label_map: tuple[tuple[int | str, int], ...] = ()
    note: str = ""
    content_free: tuple[str, ...] = CONTENT_FREE_INPUTS
    data_file: str | None = None
    origin: str = dataclasses.field(default="", compare=False)

    def __post_init__(self):
        n = self.template.n_classes
        words = {w.lower(): c for c, w in enumerate(self.template.labels)}
        for raw, c in self.label_map:
            if not 0 <= c < n:
                raise ValueError(f"{self.name}: label_map sends {raw!r} to {c}, outside 0..{n - 1}")
            if isinstance(raw, str) and words.get(raw.lower(), c) != c:
                raise ValueError(f"{self.name}: label_map sends the label word {raw!r} to class {c}, "
                                 f"but the template puts it at class {words[raw.lower()]}")
        if not self.content_free or not all(isinstance(s, str) for s in self.content_free):
            raise ValueError(f"{self.name}: content_free must be one or more strings, "
                             f"got {self.content_free!r}")

    @classmethod
    def create(cls, name: str, template: str | Template, labels=None, **fields) -> TaskSpec:
        """A task from a template string (``"review: {text}\\nsentiment: {label}"``, see
        :meth:`Template.from_string`) and its label words, class 0 first, or from a
        :class:`Template`; ``fields``: any other field of a task file
        (:data:`TASK_FILE_FIELDS`: text_column, label_column, label_map, content_free,
        data_file, hf_id, hf_config, train_split, test_split, note). Raises ValueError
        naming the field at fault."""
        if isinstance(template, Template):
            labels = template.labels if labels is None else labels
            template = template.format
        return cls.from_dict({"name": name, "template": template, "labels": labels, **fields},
                             where=f"task {name!r}")

    @classmethod
    def from_dict(cls, fields: Mapping, *, where: str = "task", base: str | os.PathLike | None = None,
                  origin: str = "") -> TaskSpec:
        """The task a task file's mapping describes (:data:`TASK_FILE_FIELDS`); ``base``:
        the directory a relative ``data_file`` is read from. Raises ValueError, one line
        naming ``where`` and the field: unknown, missing, of the wrong type, label words
        not distinct, a template without its slots."""
        if not isinstance(fields, Mapping):
            raise ValueError(f"{where}: a task is a mapping of fields ({', '.join(TASK_FILE_FIELDS)}), "
                             f"got {type(fields).__name__}")
        unknown = [str(k) for k in fields if k not in TASK_FILE_FIELDS]
        if unknown:
            raise ValueError(f"{where}: unknown field {unknown[0]!r}; the fields are "
                             f"{', '.join(TASK_FILE_FIELDS)}")
        got = {}
        for key, (kind, default) in TASK_FILE_FIELDS.items():
            value = fields.get(key, default)
            if value is _REQUIRED:
                raise ValueError(f"{where}: field {key!r} is missing ({_KIND_TEXT[kind]})")
            got[key] = _field_value(value, kind, key, where)
        name, labels = got["name"], got["labels"]
        if not _NAME.fullmatch(name):
            raise ValueError(f"{where}: field 'name' is {name!r}: use letters, digits, '_', '-' and '.'")
        if len(labels) < 2 or len(set(labels)) != len(labels) or not all(w.strip() for w in labels):
            raise ValueError(f"{where}: field 'labels' must hold at least two distinct, non-blank "
                             f"label words, got {list(labels)}")
        _check_label_words(labels, where)
        try:
            template = Template.from_string(got["template"], labels)
        except ValueError as e:
            raise ValueError(f"{where}: field 'template': {e}") from None
        label_map = tuple((raw, _class_of(c, labels, raw, where)) for raw, c in got["label_map"])
        data_file = got["data_file"]
        if data_file is not None and base is not None:
            data_file = str(Path(base, data_file).expanduser())
        try:
            return cls(name, got["hf_id"], got["hf_config"], got["train_split"],
                       got["test_split"] or got["train_split"], got["text_column"],
                       got["label_column"], template, label_map, got["note"],
                       got["content_free"], data_file, origin)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None

    def to_dict(self) -> dict:
        """The task as a task file's mapping (:meth:`from_dict` gives it back), the
        fields that hold their defaults left out."""
        out = {"name": self.name, "template": self.template.format, "labels": list(self.labels)}
        values = {"text_column": self.text_column, "label_column": self.label_column,
                  "label_map": {raw: c for raw, c in self.label_map},
                  "content_free": list(self.content_free), "data_file": self.data_file,
                  "hf_id": self.hf_id, "hf_config": self.hf_config, "train_split": self.train_split,
                  "test_split": self.test_split, "note": self.note}
        for key, value in values.items():
            default = TASK_FILE_FIELDS[key][1]
            if key == "test_split":
                default = self.train_split
            if value != (list(default) if isinstance(default, tuple) else default) and value != {}:
                out[key] = value
        return out

    @property
    def labels(self) -> tuple[str, ...]:
        return self.template.labels

    @property
    def n_classes(self) -> int:
        return self.template.n_classes

    def resolve_split(self, split: str) -> str:
        """"train" and "test" name this task's `train_split` and `test_split`; any other
        name is the source's own split name."""
        return {"train": self.train_split, "test": self.test_split}.get(split, split)


_REQUIRED = object()
_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_INTEGER = re.compile(r"[+-]?\d+")

#: The fields of a task file (and of :meth:`TaskSpec.from_dict`): name -> (kind, default).
TASK_FILE_FIELDS: dict[str, tuple[str, Any]] = {
    "name": ("str", _REQUIRED),
    "template": ("str", _REQUIRED),
    "labels": ("strs", _REQUIRED),
    "text_column": ("str", "text"),
    "label_column": ("str", "label"),
    "label_map": ("map", {}),
    "content_free": ("strs", CONTENT_FREE_INPUTS),
    "data_file": ("str?", None),
    "hf_id": ("str?", None),
    "hf_config": ("str?", None),
    "train_split": ("str", "train"),
    "test_split": ("str?", None),
    "note": ("str", ""),
}
_KIND_TEXT = {"str": "a string", "str?": "a string", "strs": "a list of strings",
              "map": "a mapping of raw label -> class id or label word"}


def _field_value(value, kind: str, key: str, where: str):
    """A task file's field ``key`` as TaskSpec holds it; ValueError naming it if it is
    not of ``kind``."""
    if kind == "str?" and value is None:
        return None
    if kind in ("str", "str?") and isinstance(value, str):
        return value
    if kind == "strs":
        values = [value] if isinstance(value, str) else value
        if isinstance(values, (list, tuple)) and all(isinstance(v, str) for v in values):
            return tuple(values)
        if isinstance(values, (list, tuple)) and any(isinstance(v, bool) for v in values):
            raise ValueError(f"{where}: field {key!r} must be {_KIND_TEXT[kind]}, got {list(values)}: YAML "
                             "reads unquoted no, yes, off, on, false and true as booleans; quote them "
                             "(['no', 'yes'])")
    if kind == "map":
        pairs = list(value.items()) if isinstance(value, Mapping) else value
        if (isinstance(pairs, (list, tuple))
                and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in pairs)
                and all(isinstance(raw, (str, int)) and not isinstance(raw, bool) for raw, _ in pairs)):
            # JSON keys are strings: "1" names the integer label 1, as a YAML key 1 does.
            return tuple((int(raw) if isinstance(raw, str) and _INTEGER.fullmatch(raw.strip()) else raw, c)
                         for raw, c in pairs)
    raise ValueError(f"{where}: field {key!r} must be {_KIND_TEXT[kind]}, got {type(value).__name__} "
                     f"{str(value)[:40]!r}")


def _class_of(target, labels: tuple[str, ...], raw, where: str) -> int:
    """A label_map value, a class id or one of ``labels``, as the class id."""
    if isinstance(target, str) and target.lower() in [w.lower() for w in labels]:
        return [w.lower() for w in labels].index(target.lower())
    if isinstance(target, int) and not isinstance(target, bool) and 0 <= target < len(labels):
        return target
    raise ValueError(f"{where}: field 'label_map' sends {raw!r} to {target!r}, which is neither a "
                     f"class id 0..{len(labels) - 1} nor a label word ({', '.join(labels)})")


def _check_label_words(labels: tuple[str, ...], where: str) -> None:
    """Label words a data file's labels can be matched to one way only (the rule of
    :func:`sc_jax.experiment.tasks.loading.load_task`: a value is its class id, or a
    label word compared without case and surrounding spaces): no control character (a
    newline would break the prompt's lines), no two words that differ only in case or
    spaces, and no word that reads as another class's id ("1" at class 0)."""
    for word in labels:
        bad = [ch for ch in word if unicodedata.category(ch) == "Cc"]
        if bad:
            raise ValueError(f"{where}: field 'labels': the label word {word!r} holds a control "
                             f"character ({', '.join(map(repr, dict.fromkeys(bad)))}); a newline or tab "
                             "would break the prompt's lines: use a word without one")
    seen: dict[str, str] = {}
    for word in labels:
        key = word.strip().lower()
        if key in seen:
            raise ValueError(f"{where}: field 'labels': the label words {seen[key]!r} and {word!r} differ "
                             "only in case or surrounding spaces, so a data label could be either: make "
                             "them distinct words")
        seen[key] = word
    for c, word in enumerate(labels):
        if _INTEGER.fullmatch(word.strip()) and int(word) != c:
            raise ValueError(f"{where}: field 'labels': the label word {word!r} is class {c}, but a data "
                             f"label {word.strip()!r} (a CSV's) or {int(word)} (a JSON file's) reads as class "
                             f"id {int(word)}: order the words so that a number is its own class id, or "
                             "use other words with 'label_map'")


def _unique_keys(pairs, where: str) -> dict:
    """A mapping from ``(key, value)`` pairs; ValueError naming a key given twice (a
    second ``labels:`` line would otherwise swap the classes silently)."""
    out = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"{where}: field {key!r} is given twice; keep one")
        out[key] = value
    return out


def read_task_file(path: str | os.PathLike) -> TaskSpec:
    """The task a YAML (.yaml, .yml; needs pyyaml) or JSON (.json) file describes: one
    mapping of :data:`TASK_FILE_FIELDS`; a relative ``data_file`` is read from the file's
    directory. Raises ValueError (ImportError for YAML without pyyaml), one line naming
    the file and the field."""
    path = Path(path).expanduser()
    suffix = path.suffix.lower()
    if suffix not in (".yaml", ".yml", ".json"):
        raise ValueError(f"task file {path}: use a .yaml, .yml or .json file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"task file {path} cannot be read ({getattr(e, 'strerror', None) or e})") from None
    where = f"task file {path}"
    if suffix == ".json":
        try:
            fields = json.loads(text, object_pairs_hook=lambda pairs: _unique_keys(pairs, where))
        except json.JSONDecodeError as e:
            raise ValueError(f"task file {path}: not valid JSON ({e})") from None
    else:
        try:
            import yaml  # pyyaml: optional, for YAML task files only
        except ImportError:
            raise ImportError(f"task file {path}: reading YAML needs pyyaml: pip install pyyaml "
                              "(or write the task as a .json file)") from None
        class _Loader(yaml.SafeLoader):  # a key given twice is refused, not "the last wins"
            def construct_mapping(self, node, deep=False):
                pairs = [(self.construct_object(k, deep=deep), self.construct_object(v, deep=deep))
                         for k, v in node.value]
                return _unique_keys(pairs, where)

        _Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _Loader.construct_mapping)
        try:
            fields = yaml.load(text, Loader=_Loader)  # noqa: S506  (a SafeLoader subclass)
        except yaml.YAMLError as e:
            raise ValueError(f"task file {path}: not valid YAML ({' '.join(str(e).split())})") from None
    return TaskSpec.from_dict(fields, where=f"task file {path}", base=path.parent, origin=str(path))


# The paper's nine tasks (Section 4.1, Appendix C), in the order of `--dataset all`; each
# is the JSON task file builtin_tasks/<name>.json shipped with the package.
# Label orders: GLUE SST-2, Rotten Tomatoes, TweetEval-hate 0 = negative / non-hate;
# SetFit SST-5 "very negative".."very positive"; AG News World, Sports, Business,
# Sci/Tech; SetFit SUBJ objective, subjective; TREC coarse ABBR, ENTY, DESC, HUM, LOC,
# NUM; TweetEval-emotion anger, joy, optimism, sadness; Financial PhraseBank negative,
# neutral, positive. Each matches the template's label words class for class.
BUILTIN_TASKS = ("sst2", "sst5", "ag_news", "rotten_tomatoes", "subj", "trec", "tweet_eval_emotion",
                 "tweet_eval_hate", "financial_phrasebank")
BUILTIN_DIR = Path(__file__).parent / "builtin_tasks"


def _builtin(name: str) -> TaskSpec:
    path = BUILTIN_DIR / f"{name}.json"
    return TaskSpec.from_dict(json.loads(path.read_text(encoding="utf-8")), where=str(path))


TASKS: dict[str, TaskSpec] = {name: _builtin(name) for name in BUILTIN_TASKS}


@dataclasses.dataclass(frozen=True, eq=False)
class Dataset:
    """Labelled texts of one task.

    texts: N strings; labels: int64 array [N], class ids 0..n_classes-1 in the order
    of `task.template.labels` (read-only); source: where the rows came from.
    """

    texts: tuple[str, ...]
    labels: np.ndarray
    task: TaskSpec
    source: str = ""

    def __post_init__(self):
        labels = np.array(self.labels, dtype=np.int64).reshape(-1)
        labels.setflags(write=False)
        object.__setattr__(self, "texts", tuple(self.texts))
        object.__setattr__(self, "labels", labels)
        if len(self.texts) != labels.shape[0]:
            raise ValueError(f"{len(self.texts)} texts but {labels.shape[0]} labels")
        if labels.size and (labels.min() < 0 or labels.max() >= self.task.n_classes):
            raise ValueError(f"labels must lie in 0..{self.task.n_classes - 1}, "
                             f"got {labels.min()}..{labels.max()}")

    def __len__(self) -> int:
        return len(self.texts)

    @functools.cached_property
    def content_sha256(self) -> str:
        """The sha256 of the rows as the run reads them: each text (UTF-8) and class id
        in order, length-prefixed. An edited text or label, or a reordered file, changes
        it; the file's name or format does not."""
        h = hashlib.sha256()
        for text, label in zip(self.texts, self.labels.tolist()):
            raw = text.encode("utf-8")
            h.update(f"{len(raw)}:".encode() + raw + f"|{label};".encode())
        return h.hexdigest()

    def record(self) -> dict:
        """What results.json keeps of the task and its data (``tasks``): template,
        label words, columns, content-free inputs, source and :attr:`content_sha256`."""
        t = self.task
        return {"template": t.template.format, "labels": list(t.labels), "text_column": t.text_column,
                "label_column": t.label_column, "content_free": list(t.content_free),
                "source": self.source, "rows": len(self), "data_sha256": self.content_sha256}

    def content_record(self) -> dict:
        """The task by its content, not by where it was read: every field of its task file
        (defaults filled in) but ``data_file`` (where the rows lie), and the rows'
        :attr:`content_sha256`, as JSON holds them. A run keeps it for its task files'
        tasks, so that the same task resumes from another path or a copy of the file, and
        other content at the same path is refused (:func:`sc_jax.experiment.evaluation.store.refuse_other_config`)."""
        fields = {key: default for key, (_, default) in TASK_FILE_FIELDS.items()} | self.task.to_dict()
        del fields["data_file"]
        return json.loads(json.dumps({**fields, "data_sha256": self.content_sha256}))

    @property
    def template(self) -> Template:
        return self.task.template

    @property
    def n_classes(self) -> int:
        return self.task.n_classes

    @functools.cached_property
    def text_keys(self) -> tuple[str, ...]:
        """Each text as the protocol compares texts (`normalise_text`): [N] strings."""
        return tuple(normalise_text(t) for t in self.texts)

    @functools.cached_property
    def blank_rows(self) -> tuple[int, ...]:
        """Rows (0-based) whose text is empty once whitespace and invisible format
        characters (`is_blank`) are taken out: no example, never drawn."""
        return tuple(i for i, t in enumerate(self.texts) if is_blank(t))

    @functools.cached_property
    def passed_over(self) -> int:
        """Rows the protocol never draws: blank ones (`blank_rows`) and those whose text
        repeats an earlier row's."""
        return len(self.blank_rows) + self.duplicate_rows

    @functools.cached_property
    def duplicate_rows(self) -> int:
        """Rows whose text (`normalise_text`) repeats an earlier row's (blank rows apart)."""
        keys = [key for key in self.text_keys if key]
        return len(keys) - len(set(keys))

    def class_counts(self) -> np.ndarray:
        """Examples per class, int64 [n_classes]."""
        return np.bincount(self.labels, minlength=self.n_classes)

    def subset(self, indices) -> Dataset:
        """The rows at `indices` (int [M]), in that order."""
        indices = np.asarray(indices, dtype=np.int64)
        return Dataset(tuple(self.texts[i] for i in indices), self.labels[indices], self.task, self.source)


def is_blank(text: str) -> bool:
    """Whether ``text`` holds nothing but whitespace and invisible format characters
    (Unicode category Cf: zero-width spaces and joiners, the byte-order mark), which a
    tokenizer turns into tokens that show nothing."""
    return not "".join(c for c in str(text) if unicodedata.category(c) != "Cf").strip()


def normalise_text(text: str) -> str:
    """The form in which the protocol compares two texts: case folded, every run of
    whitespace one space (prompts normalise whitespace too, so two texts that differ
    only there are the same prompt); a blank text (`is_blank`) is "" ."""
    return "" if is_blank(text) else " ".join(str(text).split()).casefold()
