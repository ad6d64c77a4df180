"""The run's up-front checks, with their one-line errors: every seed's prompts against
the context window (:func:`check_prompts`), the labels against the scoring mode and the
test set's classes (:func:`check_first_seed`), and a run with nothing to score
(:func:`refuse_nothing_to_run`), before a weight is read or a forward pass made.

:func:`sc_jax.experiment.protocol.runplan.build_plan` runs them as it builds each seed's work,
once, for ``sc-jax run``, ``sc-jax plan`` and ``sc-jax demo`` alike.
"""

from __future__ import annotations

import logging

import numpy as np

from sc_jax.experiment.protocol.jobs import SeedJobs, job_name
from sc_jax.scoring.reference import check_mode

log = logging.getLogger(__name__)

__all__ = ["check_first_seed", "check_prompts", "refuse_nothing_to_run"]


def _text_of(dataset, split, q: int, n_test: int) -> str:
    """Query ``q`` of :func:`seed_jobs`' pieces (demonstrations, then test queries, then
    CC's content-free inputs, then DC's strings), named by its data row where it has one."""
    k = split.k
    if q < k:
        return f"demonstration {q + 1} (row {int(split.demo_indices[q]) + 1} of {dataset.source})"
    if q < k + n_test:
        return f"test query (row {int(split.test_indices[q - k]) + 1} of {dataset.source})"
    if q < k + n_test + len(dataset.task.content_free):
        return "a content-free input of CC"
    return "a random in-domain string of DC"


def _too_long(name, dataset, split, sj: SeedJobs, tag: str, r: int, n: int, limit: int) -> str:
    """The one-line error for prompt ``r`` of job ``tag`` (``n`` tokens > ``limit``):
    which text of it is longest, by data row."""
    ctx, pairs = sj.jobs[tag]
    c, q = (int(x) for x in pairs[r])
    pieces = sj.pieces
    parts = [(len(pieces.segment(j)), _text_of(dataset, split, int(j), sj.n_test)) for j in ctx[c]]
    parts.append((len(pieces.queries[q]), _text_of(dataset, split, q, sj.n_test)))
    m, what = max(parts, key=lambda p: p[0])
    head = (f"{name}, k={split.k}, seed {split.seed}: a {job_name(tag)} has {n} tokens, more than "
            f"the model's context window of {limit}")
    if n - m > limit:
        # Even without its longest text the prompt is too long: many long texts, not one.
        return (f"{head}, and no one text is to blame (its longest, the {what}, has {m}): "
                "use fewer shots or shorter texts")
    fix = "shorten or drop that row" + (", or use fewer shots" if what.startswith("demo") else "")
    return f"{head}; its longest text is the {what}, {m} tokens: {fix}"


def warn_missing_test_classes(name: str, ds, split, seed: int) -> None:
    """A test set without some class: macro-F1 averages every class's F1, and an absent
    class's is 0, so no method can score above present / n. Said once, up front."""
    present = np.unique(ds.labels[split.test_indices])
    if len(present) < ds.n_classes:
        missing = sorted(set(range(ds.n_classes)) - set(present.tolist()))
        log.warning("%s: the test set (seed %d) holds no query of class(es) %s of %d, so "
                    "macro-F1 is at most %.0f%% for every method; draw a larger --test-size "
                    "or check the labels", name, seed, missing, ds.n_classes,
                    100 * len(present) / ds.n_classes)


def check_prompts(name: str, ds, split, sj: SeedJobs, mode: str, limit: int) -> int:
    """The longest prompt (tokens) of one seed's jobs (:func:`seed_jobs`: surrogate,
    baselines, test-time), each job's against the context window ``limit``; raises
    ValueError (one line naming dataset, k, seed, job and data row) for a longer one."""
    longest = 0
    for tag, (ctx, pairs) in sj.jobs.items():
        lengths = sj.pieces.prompt_lengths(ctx, pairs, mode)
        if not lengths.size:
            continue
        r = int(lengths.argmax())
        if lengths[r] > limit:
            raise ValueError(_too_long(name, ds, split, sj, tag, r, int(lengths[r]), limit))
        longest = max(longest, int(lengths[r]))
    return longest


def check_first_seed(name: str, ds, split, sj: SeedJobs, mode: str) -> None:
    """What the first seed of a (dataset, k) shows for all: labels the scoring
    ``mode`` can separate (:func:`check_mode`), and a test set missing a class (a
    warning)."""
    if mode == "first_token":
        first = [ids[0] for ids in sj.pieces.labels]
        shared = [w for w, t in zip(ds.task.labels, first) if first.count(t) > 1]
        if shared:  # the words and the command-line fix, not token ids and Python syntax
            raise ValueError(f"task {name!r}: the label words {', '.join(map(repr, shared))} begin with the "
                             "same token, so first-token scoring cannot tell them apart: use --mode sequence "
                             "(mode='sequence' in Python), or label words that begin differently")
    check_mode(mode, sj.pieces)
    warn_missing_test_classes(name, ds, split, split.seed)


def refuse_nothing_to_run(skipped) -> None:
    """A run in which every (dataset, k) is skipped (``(dataset, k, n_classes)``
    each, more classes than k) is refused in one line."""
    why = "; ".join(f"{name} has {n} classes, more than k={k}" for name, k, n in skipped)
    raise ValueError(f"nothing to run: {why} (a class would have no demonstration; the "
                     "paper skips such settings, Appendix A): use --shots at least the "
                     "number of classes")
