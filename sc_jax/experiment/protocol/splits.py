"""The paper's evaluation protocol (Section 4.1): one seed's demonstrations and test set.

Protocol (`split_protocol`). Per seed: one permutation of the dataset; its first
`test_size` (256 in the paper) examples are the test set; from the rest, k
class-balanced demonstrations (floor(k/n) per class, the remainder k mod n to distinct
random classes), shuffled into prompt order. The test set of a seed does not depend on
k, so results for different shot counts are on the same queries. All methods of a run
share one split. The demonstrations and the test set come from the same pool (the
loaded split, "train" by default), as in the paper, which holds out 256 test examples
per dataset. Texts are drawn once each: a row whose text (case- and
whitespace-insensitively, `normalise_text`) repeats one drawn before it in the
permutation is passed over, and no demonstration repeats a test query's text (real
data repeats texts; `load_task` logs how many rows do). Data without repeated texts
draws exactly the rows it drew before this rule.
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from sc_jax.experiment.tasks.spec import Dataset
from sc_jax.scoring.prompts import Template

__all__ = ["DEFAULT_TEST_SEED", "Split", "dc_pool", "fixed_test_indices", "split_protocol",
           "test_set_hash"]


@dataclasses.dataclass(frozen=True, eq=False)
class Split:
    """One seed's demonstrations and test set.

    demo_indices: int64 [k], rows of the dataset in prompt order; test_indices: int64
    [test_size], disjoint from them; demo_labels: int64 [k]; missing_classes: classes
    with no demonstration (non-empty only when k < n_classes; the paper skips such
    settings, Appendix A).
    """

    demo_indices: np.ndarray
    test_indices: np.ndarray
    demo_labels: np.ndarray
    n_classes: int
    seed: int
    missing_classes: tuple[int, ...]
    test_seed: int | None = None

    def test_hash(self) -> str:
        """First 16 hex digits of the sha256 of the test indices (int64): two runs
        with the same hash score the same test queries."""
        return test_set_hash(self.test_indices)

    @property
    def k(self) -> int:
        return int(self.demo_indices.shape[0])

    @property
    def covers_all_classes(self) -> bool:
        return not self.missing_classes

    def demonstrations(self, dataset: Dataset) -> list[tuple[str, int]]:
        """[(text, label)] * k, in prompt order (the input of `prompts.build_pieces`)."""
        return [(dataset.texts[i], int(dataset.labels[i])) for i in self.demo_indices]

    def test_texts(self, dataset: Dataset) -> tuple[str, ...]:
        return tuple(dataset.texts[i] for i in self.test_indices)

    def test_labels(self, dataset: Dataset) -> np.ndarray:
        """int64 [test_size]."""
        return dataset.labels[self.test_indices]

    def missing_labels(self, template: Template) -> tuple[str, ...]:
        """Label words of `missing_classes`, for a warning."""
        return tuple(template.labels[c] for c in self.missing_classes)


# The seed from which `sc-jax run` draws each dataset's one test set by default
# (RunConfig.test_seed): seeds then vary the demonstrations and sub-contexts only.
DEFAULT_TEST_SEED = 12345


def test_set_hash(indices) -> str:
    """First 16 hex digits of the sha256 of int64 test indices."""
    return hashlib.sha256(np.asarray(indices, np.int64).tobytes()).hexdigest()[:16]


def fixed_test_indices(n_rows: int, test_size: int, test_seed: int) -> np.ndarray:
    """The first `test_size` rows of `np.random.default_rng(test_seed).permutation(n_rows)`:
    a test set that depends on the dataset's size and `test_seed` alone."""
    return np.random.default_rng(test_seed).permutation(n_rows)[:test_size].astype(np.int64)


def split_protocol(dataset: Dataset, *, k: int, test_size: int = 256, seed: int,
                   test_seed: int | None = None) -> Split:
    """The paper's per-seed split (Section 4.1; FIELD_NOTES "Demo sampling").

    One permutation of the N rows from `np.random.default_rng(seed)`. With
    `test_seed` None its first `test_size` rows are the test set (redrawn with every
    seed) and the other N - test_size rows are the pool for demonstrations. With a
    `test_seed` the test set is `fixed_test_indices(N, test_size, test_seed)`, the
    same for every seed (the paper's fixed test set; `sc-jax run`'s default), and
    the pool is the other rows in the seed's permutation order. Class c gets floor(k/n) demonstrations, plus one for each of
    k mod n distinct classes drawn at random among those with a spare example; each
    class's demonstrations are the first of its rows in permutation order, and the k
    are then shuffled into prompt order. Identical (dataset, k, test_size, seed) give
    identical splits, and the test set does not depend on k.

    Rows with a blank text (`Dataset.blank_rows`) and rows whose text repeats an
    earlier drawn one (`normalise_text`) are passed over in
    both the test set and the pool, and the pool holds no test query's text, so no
    test query is also a demonstration and no two test queries are the same text; on
    data without repeated texts nothing is passed over.

    When k < n, n - k classes get no demonstration; this is returned, not raised:
    see `Split.missing_classes`.

    Raises:
      ValueError: k < 1, test_size < 0, N < k + test_size, or a class with fewer rows
        outside the test set than it needs.
    """
    k, test_size = int(k), int(test_size)
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if test_size < 0:
        raise ValueError(f"test_size must be non-negative, got {test_size}")
    n_rows, n = len(dataset), dataset.n_classes
    n_distinct = n_rows - dataset.passed_over
    if n_distinct < k + test_size:
        what = f"{n_rows} examples" + (f" ({n_distinct} distinct texts)" if n_distinct < n_rows else "")
        raise ValueError(f"{dataset.task.name}: {what}, fewer than k + test_size = "
                         f"{k} + {test_size}; lower test_size or k, or load more data")
    rng = np.random.default_rng(seed)
    order = rng.permutation(n_rows).astype(np.int64)
    if test_seed is None:
        order = _first_of_each_text(dataset, order)
        test = order[:test_size]
        pool = order[test_size:]
    else:
        test = fixed_test_indices(n_rows, test_size, test_seed)
        if dataset.passed_over:
            perm = np.random.default_rng(test_seed).permutation(n_rows).astype(np.int64)
            test = _first_of_each_text(dataset, perm)[:test_size]
        pool = order[~np.isin(order, test)]
        pool = _first_of_each_text(dataset, pool, seen={dataset.text_keys[i] for i in test})
    pool_labels = dataset.labels[pool]
    by_class = [pool[pool_labels == c] for c in range(n)]  # each in permutation order
    available = np.array([len(rows) for rows in by_class])

    base, extra = divmod(k, n)
    counts = np.full(n, base)
    short = np.flatnonzero(available < base)
    if short.size:
        c = int(short[0])
        raise ValueError(
            f"{dataset.task.name}: class {c} ({dataset.template.labels[c]!r}) has {available[c]} examples "
            f"outside the {test_size} test examples, fewer than the {base} demonstrations per class that "
            f"k = {k} needs (seed {seed}); lower k or test_size, or load more data")
    spare = np.flatnonzero(available > base)
    if spare.size < extra:
        raise ValueError(
            f"{dataset.task.name}: k = {k} needs {extra} classes with more than {base} examples outside "
            f"the test set, but only {spare.size} have them (seed {seed}); lower k or test_size")
    counts[rng.choice(spare, size=extra, replace=False)] += 1

    demos = np.concatenate([rows[:m] for rows, m in zip(by_class, counts)])
    demos = demos[rng.permutation(k)]
    demo_labels = dataset.labels[demos]
    missing = tuple(int(c) for c in np.flatnonzero(counts == 0))
    for a in (demos, test, demo_labels):
        a.setflags(write=False)
    return Split(demos, test, demo_labels, n, int(seed), missing,
                 None if test_seed is None else int(test_seed))


def _first_of_each_text(dataset: Dataset, rows: np.ndarray, seen: set | None = None) -> np.ndarray:
    """``rows`` (int64 [M], in draw order) without those whose text (`normalise_text`)
    is in ``seen`` (texts of rows outside ``rows``) or repeats an earlier one of
    ``rows``: int64 [M' <= M]. On data without repeated texts this is ``rows`` itself, so such data
    draws exactly the rows it drew before duplicates were handled."""
    if not dataset.passed_over:  # ``seen`` holds texts of other rows: none can match
        return rows
    seen = set(seen or ()) | {""}  # a blank text (normalised to "") is never drawn
    keys = dataset.text_keys
    keep = []
    for r in rows.tolist():
        if keys[r] not in seen:
            seen.add(keys[r])
            keep.append(r)
    return np.asarray(keep, np.int64)


def dc_pool(dataset: Dataset, test_indices) -> tuple[str, ...]:
    """The unlabelled test texts from which Domain-Context calibration draws its random
    in-domain words (Appendix A: "we use the test set as the unlabeled corpus");
    `test_indices`: int [test_size]. Labels are never looked at."""
    return tuple(dataset.texts[i] for i in np.asarray(test_indices, dtype=np.int64))
