"""What one (dataset, k, seed) scores, and its scoring.

:func:`seed_jobs` lists every (context, query) pair of a seed (Base/BC's k-shot
prompt, CC's content-free inputs, DC's random strings, and per size i the surrogate
data of Algorithm 1 and the test-time sub-contexts of Algorithm 2), before any
forward pass; :func:`score_seed` scores one seed through the engine and the score
cache into :class:`SeedScores`. The run's up-front check over all seeds is
:func:`sc_jax.experiment.protocol.runplan.build_plan`, which builds every seed's jobs once.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from sc_jax.calibration import methods as calibration_methods
from sc_jax.calibration.baselines import random_domain_strings
from sc_jax.calibration.hidden import centroid_distances, class_centroids
from sc_jax.experiment.protocol.config import RunConfig
from sc_jax.experiment.protocol.splits import dc_pool, split_protocol
from sc_jax.experiment.tasks.loading import load_task
from sc_jax.experiment.tasks.spec import read_task_file
from sc_jax.scoring.enumeration import default_m, sample_contexts, surrogate_contexts, surrogate_pairs
from sc_jax.scoring.chat import chat_frame
from sc_jax.scoring.prompts import build_pieces
from sc_jax.scoring.results import EngineStats

log = logging.getLogger(__name__)


@dataclasses.dataclass
class SeedScores:
    """Label log-probs of one (dataset, k, seed). Shapes: T test queries, n classes.

    base: ``[T, n]`` under the full k-shot context; cc: ``[C, n]`` (the task's C
    content-free inputs, 3 by default); dc: ``[20, n]``;
    surrogate[i]: (logp ``[N_i, n]``, labels ``[N_i]``, query ids ``[N_i]``);
    test[i]: ``[m_i, T, n]`` under m_i sampled sub-contexts of size i;
    demo_labels: ``[k]`` the demonstrations' labels in the k-shot prompt's order;
    surrogate_contexts[i]: ``[N_i, i]`` the demonstrations of each surrogate row's
    context, in order (Surprise Calibration reads both; None in score files written
    before them);
    loo: (logp ``[k, n]``, labels ``[k]``, query ids ``[k]``), each demonstration under
    the other k - 1 in the k-shot prompt's order: LOOC's leave-one-out prompts, scored
    on their own where the run's sub-context sizes stop below k - 1 (else None: the
    surrogate prompts of size k - 1 are they).
    hidden[i]: ``[m_i, T, n]`` Hidden Calibration's Euclidean distances of test[i]'s
    prompts' last hidden states to the class centroids of surrogate[i]'s
    (:func:`hidden_distances`; empty where the run has no method ``hidden``).
    """

    base: np.ndarray
    cc: np.ndarray
    dc: np.ndarray
    surrogate: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]
    test: dict[int, np.ndarray]
    y_test: np.ndarray
    demo_labels: np.ndarray | None = None
    surrogate_contexts: dict[int, np.ndarray] | None = None
    loo: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    hidden: dict[int, np.ndarray] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class SeedJobs:
    """The scoring requests of one (dataset, k, seed), before any forward pass:
    ``pieces`` and, per tag ("base", "cc", "dc", "surrogate<i>", "test<i>"),
    ``(contexts [M, i], pairs [N, 2])``. ``sizes``, ``m`` (test-time sub-contexts
    per size) and the query index ranges say how the scores are assembled."""

    pieces: Any
    jobs: dict[str, tuple[np.ndarray, np.ndarray]]
    m: dict[int, int]
    n_test: int


def seed_jobs(tokenizer, dataset, split, config: RunConfig, k: int) -> SeedJobs:
    """Every (context, query) pair one (dataset, k, seed) scores (no model needed:
    ``sc-jax plan`` counts these)."""
    demos = split.demonstrations(dataset)
    tests = list(split.test_texts(dataset))
    dcs = random_domain_strings(dc_pool(dataset, split.test_indices), config.dc_strings, seed=split.seed)
    content_free = list(dataset.task.content_free)  # CC's inputs, the task's own where it names them
    queries = [t for t, _ in demos] + tests + content_free + dcs
    chat = chat_frame(tokenizer, config.model) if config.chat_template else None
    pieces = build_pieces(tokenizer, dataset.template, demos, queries, chat=chat)
    T = len(tests)
    q_test = np.arange(k, k + T)
    q_cc = np.arange(k + T, k + T + len(content_free))
    q_dc = np.arange(k + T + len(content_free), len(queries))
    full = np.arange(k)[None]  # the k demonstrations in their sampled order

    def with_full(qs):
        return np.stack([np.zeros(len(qs), np.int64), qs], axis=1)

    jobs = {"base": (full, with_full(q_test)), "cc": (full, with_full(q_cc)),
            "dc": (full, with_full(q_dc))}
    ms = {}
    # SC's surrogate and test-time prompts, only where a method of the run reads them
    # (`--methods base,bc` scores the k-shot prompts alone).
    sized = any(needed(config, need) for need in ("surrogate", "test", "hidden"))
    for i in config.sizes(k) if sized else ():
        ctx = surrogate_contexts(k, i, config.budget, seed=split.seed * 1000 + i)
        pairs = surrogate_pairs(ctx, k)
        jobs[f"surrogate{i}"] = (ctx, pairs)
        m = ms[i] = default_m(len(pairs), k, i, cap=config.m_cap)
        tctx = sample_contexts(k, i, m, seed=split.seed * 1000 + 500 + i)
        jobs[f"test{i}"] = (tctx, np.stack([np.repeat(np.arange(m), T), np.tile(q_test, m)], axis=1))
    if needed(config, "loo") and k >= 2 and k - 1 not in config.sizes(k):
        jobs["loo"] = leave_one_out_job(k)
    return SeedJobs(pieces, jobs, ms, T)


def leave_one_out_job(k: int) -> tuple[np.ndarray, np.ndarray]:
    """LOOC's k prompts (Reif & Schwartz 2024): demonstration j as the query after the
    other k - 1 in the k-shot prompt's order. ``(contexts [k, k - 1], pairs [k, 2])``;
    prefixes of the k-shot prompt, so the engine's prefix sharing scores them for little
    more than their last demonstration and query."""
    contexts = np.array([[d for d in range(k) if d != j] for j in range(k)], np.int64)
    return contexts, np.stack([np.arange(k), np.arange(k)], axis=1)


def load_datasets(config: RunConfig, names=None) -> dict:
    """name -> :class:`sc_jax.experiment.tasks.spec.Dataset` of every dataset of ``config`` (of
    ``names`` alone, where given), from its ``--data-file``, ``--data-dir`` or default
    source; a ``--task-file`` task from its ``--data-file``, else its file's data_file or
    hf_id."""
    files = dict(config.data_files)
    defined = {spec.name: spec for spec in map(read_task_file, config.task_files)}
    return {name: load_task(defined.get(name, name), data_file=files.get(name),
                            data_dir=None if name in defined else config.data_dir,
                            text_column=config.text_column, label_column=config.label_column,
                            strict=config.strict_data)
            for name in (config.datasets if names is None else names)}


def task_file_records(config: RunConfig, datasets: dict | None = None) -> dict:
    """name -> ``{"file": the path given, "resolved": it made absolute,
    **Dataset.content_record()}`` of each
    ``--task-file`` task of ``config``: what a run keeps of them (``run_tasks.json``) to
    know them again by content. ``datasets``: those loaded already (else loaded here)."""
    files = {read_task_file(f).name: str(f) for f in config.task_files}
    if datasets is None:
        datasets = load_datasets(config, tuple(files))
    # "resolved": where a later `sc-jax report` from another directory finds the file.
    return {name: {"file": file, "resolved": str(Path(file).expanduser().resolve()),
                   **datasets[name].content_record()} for name, file in files.items()}


def draw_split(dataset, config: RunConfig, k: int, seed: int):
    """The :class:`sc_jax.experiment.protocol.splits.Split` of one (dataset, k, seed) as the run
    draws it.
    The run's plan (:func:`sc_jax.experiment.protocol.runplan.build_plan`) draws each seed
    through here, once, for the run, its check and ``sc-jax plan`` alike."""
    return split_protocol(dataset, k=k, test_size=config.test_size, seed=seed,
                          test_seed=config.test_seed)


def job_name(tag: str) -> str:
    """A job tag of :func:`seed_jobs`, as a person reads it."""
    named = {"base": "k-shot prompt (Base, BC)", "cc": "k-shot prompt of CC",
             "dc": "k-shot prompt of DC", "loo": "leave-one-out prompt (LOOC)"}
    if tag in named:
        return named[tag]
    if tag.startswith("surrogate"):
        return f"surrogate prompt of size {tag[len('surrogate'):]}"
    return f"test-time prompt of size {tag[len('test'):]}"


def needed(config: RunConfig, need: str) -> bool:
    """Whether a method of the run needs ``need`` (:data:`sc_jax.calibration.methods.NEEDS`)."""
    return any(need in calibration_methods.get(m).needs for m in config.methods)


def hidden_tags(config: RunConfig, k: int) -> list[str]:
    """The jobs whose last hidden states the run needs: Hidden Calibration's
    calibration prompts (surrogate<i>) and test prompts (test<i>) of every size."""
    if not needed(config, "hidden"):
        return []
    return [f"{kind}{i}" for i in config.sizes(k) for kind in ("surrogate", "test")]


def hidden_distances(surrogate_states, surrogate_labels, test_states, n: int) -> np.ndarray:
    """One size's ``[m, T, n]`` distances of the test prompts' states ``[m, T, D]`` to
    the class centroids of the surrogate prompts' states ``[N, D]`` (labels ``[N]``:
    the held-out demonstrations')."""
    return centroid_distances(test_states, class_centroids(surrogate_states, surrogate_labels, n))


def score_seed(model, engine, cache, dataset, work, config: RunConfig, *,
               label: str | None = None, planned=None) -> tuple[SeedScores, EngineStats]:
    """Every LLM score one (dataset, k, seed) needs (``work``: its
    :class:`sc_jax.experiment.protocol.runplan.SeedWork`, split and jobs as planned), from the
    score ``cache`` where present (None: no cache), and what its engine call did (empty
    stats where the cache served every job). ``planned``: the schedule of all of the
    seed's jobs (the work's), used where none came from the cache. With a ``label``
    (e.g. ``"[sst2 k=4 seed=0]"``) each job logs one line: its prompts, and whether
    they came from the cache or how long scoring took."""
    sj, split, k = work.jobs, work.split, work.k
    pieces = sj.pieces
    keys = work.cache_keys(model.identity, config.mode)
    hkeys = work.hidden_keys(model.identity, config.mode, hidden_tags(config, k))
    former = getattr(model, "legacy_identities", (model.identity,))

    def old(tag, hidden=False):  # a job's format-1 keys, hashed only where its key misses
        return lambda: work.legacy_keys(former, config.mode, [tag], hidden=hidden)[tag]

    # An entry must hold one row per pair of its job: the key names the pairs, and a
    # file that disagrees is reported and rescored (ScoreCache.get).
    got = {tag: None if cache is None else cache.cached(key, rows=len(sj.jobs[tag][1]), legacy=old(tag))
           for tag, key in keys.items()}
    states = {tag: None if cache is None else cache.cached(key, rows=len(sj.jobs[tag][1]),
                                                          legacy=old(tag, hidden=True))
              for tag, key in hkeys.items()}
    lacking = {tag for tag, h in states.items() if h is None}  # rescored for their states
    missing = {tag: sj.jobs[tag] for tag, arr in got.items() if arr is None or tag in lacking}
    if label:
        for tag in got:
            if tag not in missing:
                log.info("%s %s: %d prompts, from the cache", label, job_name(tag), len(sj.jobs[tag][1]))
    if missing:
        # Every missing job of the seed in one engine call (one trie, packed calls);
        # each is stored as soon as its last query is scored, so an interrupted run
        # keeps the jobs that finished.
        t = time.perf_counter()

        def done(tag, arr, h=None):
            if got[tag] is None:  # a job rescored for its states keeps its cached log-probs
                got[tag] = arr
                if cache is not None:
                    cache.store(keys[tag], arr)
            if tag in lacking:
                states[tag] = h
                if cache is not None:
                    cache.store(hkeys[tag], h)
            if label:
                log.info("%s %s: %d prompts, scored (%.1f s into the seed's scoring)", label,
                         job_name(tag), len(sj.jobs[tag][1]), time.perf_counter() - t)

        whole = len(missing) == len(sj.jobs)  # else the jobs left have a schedule of their own
        stats = engine.score_jobs(pieces, missing, config.mode, on_done=done,
                                  planned=planned if whole else None,
                                  hidden=bool(lacking)).stats
    else:
        stats = EngineStats()  # served from the cache: no engine call

    def scored(tag):
        return got[tag]

    # NaN label log-probs come from the model (overflowing weights, a bad checkpoint),
    # not from the data: the fit's "features contain NaN ... clip the probabilities"
    # sent the user to the wrong place.
    nan = [(tag, int(np.isnan(a).any(axis=-1).sum()), len(a)) for tag, a in got.items()
           if np.isnan(np.asarray(a, np.float64)).any()]
    if nan:
        where = ", ".join(f"{job_name(tag)}: {bad} of {rows} prompts" for tag, bad, rows in nan[:3])
        raise ValueError(f"{label + ' ' if label else ''}the model produced NaN scores ({where}): "
                         f"check its checkpoint ({model.source or 'the model'}) and dtype "
                         "(--dtype float32); the scores are not usable")

    base, cc, dc = scored("base"), scored("cc"), scored("dc")
    surrogate, test, contexts, hidden = {}, {}, {}, {}
    labels = np.asarray(split.demo_labels)
    n = base.shape[-1]
    for i in sorted(sj.m):  # the sizes the run scored (none without a method that reads them)
        ctx, pairs = sj.jobs[f"surrogate{i}"]
        surrogate[i] = (scored(f"surrogate{i}"), labels[pairs[:, 1]], pairs[:, 1].copy())
        contexts[i] = ctx[pairs[:, 0]]
        test[i] = scored(f"test{i}").reshape(sj.m[i], sj.n_test, -1)
        if states:
            hidden[i] = hidden_distances(states[f"surrogate{i}"], surrogate[i][1],
                                         states[f"test{i}"].reshape(sj.m[i], sj.n_test, -1), n)
    loo = None
    if "loo" in sj.jobs:
        pairs = sj.jobs["loo"][1]
        loo = (scored("loo"), labels[pairs[:, 1]], pairs[:, 1].copy())
    return SeedScores(base, cc, dc, surrogate, test, np.asarray(split.test_labels(dataset)),
                      demo_labels=labels, surrogate_contexts=contexts, hidden=hidden, loo=loo), stats
