"""What one (dataset, k, seed) scores, before any forward pass, and the run's up-front
check over all of them.

:func:`seed_jobs` lists every (context, query) pair of a seed (Base/BC's k-shot
prompt, CC's content-free inputs, DC's random strings, and per size i the surrogate
data of Algorithm 1 and the test-time sub-contexts of Algorithm 2);
:func:`check_run` tries every seed's prompts against the context window and the
memory budget before a weight is read; :func:`score_seed` scores one seed through the
engine and the score cache into :class:`SeedScores`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import numpy as np

from sc_jax.calibration.baselines import CONTENT_FREE_INPUTS, random_domain_strings
from sc_jax.experiment.config import RunConfig, run_policy
from sc_jax.experiment.data import dc_pool, load_task, split_protocol
from sc_jax.models import loading
from sc_jax.scoring.cache import score_key
from sc_jax.scoring.enumeration import default_m, sample_contexts, surrogate_contexts, surrogate_pairs
from sc_jax.scoring.memory import MemoryPolicy, PlanError, weights_fit
from sc_jax.scoring.prompts import build_pieces
from sc_jax.scoring.reference import check_mode
from sc_jax.scoring.results import EngineStats

log = logging.getLogger(__name__)


# ------------------------------------------------------------------ scoring stage
@dataclasses.dataclass
class SeedScores:
    """Label log-probs of one (dataset, k, seed). Shapes: T test queries, n classes.

    base: ``[T, n]`` under the full k-shot context; cc: ``[3, n]``; dc: ``[20, n]``;
    surrogate[i]: (logp ``[N_i, n]``, labels ``[N_i]``, query ids ``[N_i]``);
    test[i]: ``[m_i, T, n]`` under m_i sampled sub-contexts of size i.
    """

    base: np.ndarray
    cc: np.ndarray
    dc: np.ndarray
    surrogate: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]
    test: dict[int, np.ndarray]
    y_test: np.ndarray


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
    queries = [t for t, _ in demos] + tests + list(CONTENT_FREE_INPUTS) + dcs
    pieces = build_pieces(tokenizer, dataset.template, demos, queries)
    T = len(tests)
    q_test = np.arange(k, k + T)
    q_cc = np.arange(k + T, k + T + len(CONTENT_FREE_INPUTS))
    q_dc = np.arange(k + T + len(CONTENT_FREE_INPUTS), len(queries))
    full = np.arange(k)[None]  # the k demonstrations in their sampled order

    def with_full(qs):
        return np.stack([np.zeros(len(qs), np.int64), qs], axis=1)

    jobs = {"base": (full, with_full(q_test)), "cc": (full, with_full(q_cc)),
            "dc": (full, with_full(q_dc))}
    ms = {}
    for i in config.sizes(k):
        ctx = surrogate_contexts(k, i, config.budget, seed=split.seed * 1000 + i)
        pairs = surrogate_pairs(ctx, k)
        jobs[f"surrogate{i}"] = (ctx, pairs)
        m = ms[i] = default_m(len(pairs), k, i, cap=config.m_cap)
        tctx = sample_contexts(k, i, m, seed=split.seed * 1000 + 500 + i)
        jobs[f"test{i}"] = (tctx, np.stack([np.repeat(np.arange(m), T), np.tile(q_test, m)], axis=1))
    return SeedJobs(pieces, jobs, ms, T)


def load_datasets(config: RunConfig) -> dict:
    """name -> :class:`sc_jax.experiment.data.Dataset` of every dataset of ``config``, from its
    ``--data-file``, ``--data-dir`` or default source."""
    files = dict(config.data_files)
    return {name: load_task(name, data_file=files.get(name), data_dir=config.data_dir,
                            text_column=config.text_column, label_column=config.label_column)
            for name in config.datasets}


def draw_split(dataset, config: RunConfig, k: int, seed: int):
    """The :class:`sc_jax.experiment.data.Split` of one (dataset, k, seed) as the run draws it.
    The run, its up-front check (:func:`check_run`) and ``sc-jax plan`` all draw
    through here, so the check sees the rows the run will score."""
    return split_protocol(dataset, k=k, test_size=config.test_size, seed=seed,
                          test_seed=config.test_seed)


def _stage(tag: str) -> str:
    """A job tag of :func:`seed_jobs`, as a person reads it."""
    named = {"base": "k-shot prompt (Base, BC)", "cc": "k-shot prompt of CC",
             "dc": "k-shot prompt of DC"}
    if tag in named:
        return named[tag]
    if tag.startswith("surrogate"):
        return f"surrogate prompt of size {tag[len('surrogate'):]}"
    return f"test-time prompt of size {tag[len('test'):]}"


def _text_of(dataset, split, q: int, n_test: int) -> str:
    """Query ``q`` of :func:`seed_jobs`' pieces (demonstrations, then test queries, then
    CC's content-free inputs, then DC's strings), named by its data row where it has one."""
    k = split.k
    if q < k:
        return f"demonstration {q + 1} (row {int(split.demo_indices[q]) + 1} of {dataset.source})"
    if q < k + n_test:
        return f"test query (row {int(split.test_indices[q - k]) + 1} of {dataset.source})"
    if q < k + n_test + len(CONTENT_FREE_INPUTS):
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
    head = (f"{name}, k={split.k}, seed {split.seed}: a {_stage(tag)} has {n} tokens, more than "
            f"the model's context window of {limit}")
    if n - m > limit:
        # Even without its longest text the prompt is too long: many long texts, not one.
        return (f"{head}, and no one text is to blame (its longest, the {what}, has {m}): "
                "use fewer shots or shorter texts")
    fix = "shorten or drop that row" + (", or use fewer shots" if what.startswith("demo") else "")
    return f"{head}; its longest text is the {what}, {m} tokens: {fix}"


def _memory_check(config: RunConfig, model_config, policy: MemoryPolicy | None = None):
    """A function ``(pieces, jobs)`` that raises :class:`PlanError` where the
    engine's packed schedule of one seed's jobs (``policy.plan``, as
    :class:`ScoringEngine` makes it) cannot fit the budget; None where the run
    gives ``max_tokens_per_batch`` (the engine then derives nothing). The weights alone
    not fitting raise here, once. ``policy``: default :func:`run_policy`."""
    if config.max_tokens_per_batch is not None:
        return None
    dtype = loading.DTYPES[config.dtype]
    policy = policy or run_policy(config)

    def check(pieces, jobs):
        policy.plan(model_config, dtype, pieces, list(jobs.values()), config.mode)

    # The weights are the same for every job: their error names no dataset or seed.
    weights_fit(model_config, dtype, policy.budget_bytes, policy.model_shards)
    return check


def _warn_missing_test_classes(name: str, ds, split, seed: int) -> None:
    """A test set without some class: macro-F1 averages every class's F1, and an absent
    class's is 0, so no method can score above present / n. Said once, up front."""
    present = np.unique(ds.labels[split.test_indices])
    if len(present) < ds.n_classes:
        missing = sorted(set(range(ds.n_classes)) - set(present.tolist()))
        log.warning("%s: the test set (seed %d) holds no query of class(es) %s of %d, so "
                    "macro-F1 is at most %.0f%% for every method; draw a larger --test-size "
                    "or check the labels", name, seed, missing, ds.n_classes,
                    100 * len(present) / ds.n_classes)


def check_run(config: RunConfig, model_config, tokenizer, datasets: dict, *,
              policy: MemoryPolicy | None = None) -> list[dict]:
    """The whole run checked up front, with no weights and no forward pass: for every
    (dataset, k, seed) the run will score, the split it draws (:func:`draw_split`: a
    class short of rows fails here, not after earlier seeds were scored), the label
    tokens of the scoring mode, and every stage's longest prompt (:func:`seed_jobs`:
    surrogate, baselines, test-time) against ``model_config.max_position_embeddings``,
    and each job's memory plan under the run's memory ``policy`` (default
    :func:`run_policy`), as the engine would make it.

    ``datasets``: name -> :class:`sc_jax.experiment.data.Dataset`. Returns one dict per (dataset,
    k): ``dataset``, ``k``, ``skipped`` (more classes than k) and, when run,
    ``longest_prompt`` (tokens, over all seeds and stages) and ``longest_seed``.
    Raises ValueError (one line naming dataset, k, seed, stage and data row) for a
    prompt longer than the context window, a split that cannot be drawn, or a run in
    which every (dataset, k) would be skipped.
    """
    limit = model_config.max_position_embeddings
    memory = _memory_check(config, model_config, policy)
    out = []
    for name, ds in datasets.items():
        for k in config.shots:
            if ds.n_classes > k:
                out.append({"dataset": name, "k": k, "skipped": True, "n_classes": ds.n_classes})
                continue
            worst = (0, None)
            for seed in config.seeds:
                split = draw_split(ds, config, k, seed)
                sj = seed_jobs(tokenizer, ds, split, config, k)
                if seed == config.seeds[0]:
                    check_mode(config.mode, sj.pieces)
                    _warn_missing_test_classes(name, ds, split, seed)
                for tag, (ctx, pairs) in sj.jobs.items():
                    lengths = sj.pieces.prompt_lengths(ctx, pairs, config.mode)
                    r = int(lengths.argmax())
                    if lengths[r] > limit:
                        raise ValueError(_too_long(name, ds, split, sj, tag, r, int(lengths[r]), limit))
                    worst = max(worst, (int(lengths[r]), seed), key=lambda w: w[0])
                if memory is not None:
                    try:
                        memory(sj.pieces, sj.jobs)
                    except PlanError as e:
                        raise PlanError(f"{name}, k={k}, seed {seed}: {e}") from None
            out.append({"dataset": name, "k": k, "skipped": False, "longest_prompt": worst[0],
                        "longest_seed": worst[1], "context_window": limit})
    if all(s["skipped"] for s in out):
        why = "; ".join(f"{s['dataset']} has {s['n_classes']} classes, more than k={s['k']}"
                        for s in out)
        raise ValueError(f"nothing to run: {why} (a class would have no demonstration; the "
                         "paper skips such settings, Appendix A): use --shots at least the "
                         "number of classes")
    return out


def score_seed(model, engine, cache, dataset, split, config: RunConfig, k: int, *,
               label: str | None = None) -> tuple[SeedScores, EngineStats]:
    """Every LLM score one (dataset, k, seed) needs, from the cache where present,
    and what its engine call did (empty stats where the cache served every job).
    With a ``label`` (e.g. ``"[sst2 k=4 seed=0]"``) each stage logs one line: its
    prompts, and whether they came from the cache or how long scoring took."""
    sj = seed_jobs(model.tokenizer, dataset, split, config, k)
    pieces = sj.pieces
    keys = {tag: score_key(model.identity, config.mode, pieces, ctx, pairs, extra=tag)
            for tag, (ctx, pairs) in sj.jobs.items()}
    # An entry must hold one row per pair of its job: the key names the pairs, and a
    # file that disagrees is reported and rescored (ScoreCache.get).
    got = {tag: cache.cached(key, rows=len(sj.jobs[tag][1])) for tag, key in keys.items()}
    missing = {tag: sj.jobs[tag] for tag, arr in got.items() if arr is None}
    if label:
        for tag in got:
            if tag not in missing:
                log.info("%s %s: %d prompts, from the cache", label, _stage(tag), len(sj.jobs[tag][1]))
    if missing:
        # Every missing job of the seed in one engine call (one trie, packed calls);
        # each is stored as soon as its last query is scored, so an interrupted run
        # keeps the jobs that finished.
        t = time.perf_counter()

        def done(tag, arr):
            cache.store(keys[tag], arr)
            got[tag] = arr
            if label:
                log.info("%s %s: %d prompts, scored (%.1f s into the seed's scoring)", label,
                         _stage(tag), len(sj.jobs[tag][1]), time.perf_counter() - t)

        stats = engine.score_jobs(pieces, missing, config.mode, on_done=done).stats
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
        where = ", ".join(f"{_stage(tag)}: {bad} of {rows} prompts" for tag, bad, rows in nan[:3])
        raise ValueError(f"{label + ' ' if label else ''}the model produced NaN scores ({where}): "
                         f"check its checkpoint ({model.source or 'the model'}) and dtype "
                         "(--dtype float32); the scores are not usable")

    base, cc, dc = scored("base"), scored("cc"), scored("dc")
    surrogate, test = {}, {}
    labels = np.asarray(split.demo_labels)
    for i in config.sizes(k):
        pairs = sj.jobs[f"surrogate{i}"][1]
        surrogate[i] = (scored(f"surrogate{i}"), labels[pairs[:, 1]], pairs[:, 1].copy())
        test[i] = scored(f"test{i}").reshape(sj.m[i], sj.n_test, -1)
    return SeedScores(base, cc, dc, surrogate, test, np.asarray(split.test_labels(dataset))), stats
