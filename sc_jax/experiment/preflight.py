"""The run's up-front check (:func:`check_run`): every seed's prompts tried against the
context window and the memory budget before a weight is read or a forward pass made.

``sc-jax run`` calls it before loading the weights and ``sc-jax plan`` before
planning; both draw the seeds' splits and jobs as the run does
(:func:`sc_jax.experiment.jobs.draw_split`, :func:`sc_jax.experiment.jobs.seed_jobs`).
"""

from __future__ import annotations

import logging

import numpy as np

from sc_jax.calibration.baselines import CONTENT_FREE_INPUTS
from sc_jax.experiment.config import RunConfig, run_policy
from sc_jax.experiment.jobs import SeedJobs, draw_split, job_name, seed_jobs
from sc_jax.models import loading
from sc_jax.scoring.reference import check_mode
from sc_jax.scoring.memory import MemoryPolicy, PlanError, weights_fit

log = logging.getLogger(__name__)

__all__ = ["check_run"]


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
    head = (f"{name}, k={split.k}, seed {split.seed}: a {job_name(tag)} has {n} tokens, more than "
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
    :class:`sc_jax.scoring.engine.ScoringEngine` makes it) cannot fit the budget; None
    where the run gives ``max_tokens_per_batch`` (the engine then derives nothing). The weights alone
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
    tokens of the scoring mode, and every job's longest prompt (:func:`seed_jobs`:
    surrogate, baselines, test-time) against ``model_config.max_position_embeddings``,
    and each job's memory plan under the run's memory ``policy`` (default
    :func:`run_policy`), as the engine would make it.

    ``datasets``: name -> :class:`sc_jax.experiment.tasks.Dataset`. Returns one dict per (dataset,
    k): ``dataset``, ``k``, ``skipped`` (more classes than k) and, when run,
    ``longest_prompt`` (tokens, over all seeds and jobs) and ``longest_seed``.
    Raises ValueError (one line naming dataset, k, seed, job and data row) for a
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
