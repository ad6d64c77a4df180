"""A run's plan (:class:`RunPlan`), built once (:func:`build_plan`) and handed to every
stage: ``sc-jax plan`` costs it, ``sc-jax run`` scores it, ``sc-jax demo`` scores its
in-memory sentences through it.

The plan holds the configuration, the model located once (its configuration and
tokenizer, no weights: :func:`sc_jax.models.sources.locate_model`; the weights load
from there), the datasets, the mesh, the memory policy and one :class:`SeedWork` per
(dataset, k, seed): the seed's split, its scoring jobs and the engine's packed schedule
of them. Building it runs the run's up-front checks (:mod:`sc_jax.experiment.protocol.preflight`)
and refuses, in one line, what would fail later: a prompt longer than the context
window, a schedule over the memory budget, a split that cannot be drawn, a run with
nothing to score.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from sc_jax.experiment.protocol.config import RunConfig, run_policy
from sc_jax.experiment.protocol.jobs import SeedJobs, draw_split, load_datasets, seed_jobs
from sc_jax.experiment.protocol.preflight import (check_first_seed, check_prompts,
                                                 refuse_nothing_to_run)
from sc_jax.experiment.protocol.splits import Split
from sc_jax.models.hub import HubModelNotCachedError
from sc_jax.models.loading import DTYPES
from sc_jax.models.sources import LocatedModel, locate_model
from sc_jax.runtime.multihost import is_multiprocess
from sc_jax.runtime.sharding import MODEL, axis_size, make_mesh, mesh_size
from sc_jax.scoring.cache import legacy_score_key, score_key
from sc_jax.scoring.memory import MemoryPolicy, PlanError, Planned, size_text, weights_fit

log = logging.getLogger(__name__)

__all__ = ["RunPlan", "SeedWork", "build_plan", "rows_passed_over", "run_mesh"]


@dataclasses.dataclass(frozen=True, eq=False)
class SeedWork:
    """What one (dataset, k, seed) scores, built once: its ``split``
    (:func:`sc_jax.experiment.protocol.jobs.draw_split`), its ``jobs``
    (:func:`sc_jax.experiment.protocol.jobs.seed_jobs`), the engine's packed schedule of every
    job together (``planned``, :meth:`sc_jax.scoring.memory.MemoryPolicy.plan`) and its
    longest prompt (tokens)."""

    dataset: str
    k: int
    seed: int
    split: Split
    jobs: SeedJobs
    planned: Planned
    longest_prompt: int

    @property
    def label(self) -> str:
        return f"[{self.dataset} k={self.k} seed={self.seed}]"

    def cache_keys(self, identity: str, mode: str) -> dict[str, str]:
        """Job tag -> its score-cache key (format 2, :func:`sc_jax.scoring.cache.score_key`)
        under the model ``identity`` (which hashes the weights' files, so it is known
        once they are read)."""
        return {tag: score_key(identity, mode, self.jobs.pieces, ctx, pairs)
                for tag, (ctx, pairs) in self.jobs.jobs.items()}

    def hidden_keys(self, identity: str, mode: str, tags) -> dict[str, str]:
        """Job tag -> the score-cache key of its pairs' last hidden states ``[N, D]``
        (keys of their own: the label log-probs' entries stay valid)."""
        return {tag: score_key(identity, mode, self.jobs.pieces, *self.jobs.jobs[tag], quantity="last_hidden")
                for tag in tags}

    def legacy_keys(self, identities, mode: str, tags, hidden: bool = False) -> dict[str, tuple[str, ...]]:
        """Job tag -> the format-1 keys of the same entries under each of the model's
        former ``identities`` (:attr:`sc_jax.models.loading.LoadedModel.legacy_identities`),
        tried where a format-2 key misses."""
        suffix = ":hidden" if hidden else ""
        return {tag: tuple(legacy_score_key(ident, mode, self.jobs.pieces, *self.jobs.jobs[tag], tag + suffix)
                           for ident in identities) for tag in tags}


@dataclasses.dataclass(frozen=True, eq=False)
class RunPlan:
    """Everything a run scores, decided before a weight is read (:func:`build_plan`).

    ``config``: the :class:`RunConfig`; ``model``: the located model
    (:class:`sc_jax.models.sources.LocatedModel`, no weights); ``datasets``: name ->
    :class:`sc_jax.experiment.tasks.spec.Dataset`; ``mesh``: the run's mesh (None: one
    device, or a plan for devices this machine lacks); ``policy``: the memory policy;
    ``work``: one :class:`SeedWork` per (dataset, k, seed), in the run's order;
    ``skipped``: ``(dataset, k, n_classes)`` with more classes than k (paper Appendix
    A); ``notes`` and ``left_out_rows``: :func:`rows_passed_over`."""

    config: RunConfig
    model: LocatedModel
    datasets: dict
    mesh: Any
    policy: MemoryPolicy
    work: tuple[SeedWork, ...]
    skipped: tuple[tuple[str, int, int], ...]
    notes: tuple[str, ...] = ()
    left_out_rows: dict = dataclasses.field(default_factory=dict)

    @property
    def dtype(self):
        return DTYPES[self.config.dtype]

    @property
    def settings(self) -> list[tuple[str, int]]:
        """The (dataset, k) scored, in the run's order."""
        return list(dict.fromkeys((w.dataset, w.k) for w in self.work))

    def seeds_of(self, name: str, k: int) -> tuple[SeedWork, ...]:
        return tuple(w for w in self.work if (w.dataset, w.k) == (name, k))

    def longest(self) -> SeedWork:
        """The seed holding the longest prompt (the first such, in the run's order)."""
        return max(self.work, key=lambda w: w.longest_prompt)

    def describe(self) -> str:
        """A few lines: the model, what is scored and skipped, the memory policy, the
        longest prompt against the context window, and the schedules' calls."""
        c, parts, p = self.config, self.model.parts, self.policy
        w = self.longest()
        calls = sum(sum(1 for _ in s.planned.schedule.calls()) for s in self.work)
        shapes = {s.planned.schedule.shape for s in self.work}
        widest = max(shapes, key=lambda sh: sh.B * sh.W)
        lines = [f"run plan: model {c.model} ({c.dtype}; tokenizer {parts.tokenizer_label}); "
                 f"{len(self.settings)} (dataset, k) x {len(c.seeds)} seed(s) = {len(self.work)} "
                 f"seeds to score",
                 f"memory: {size_text(p.budget_bytes)} per device "
                 f"({'enforced' if p.enforced else 'the host memory, not enforced'}), mesh data "
                 f"{p.n_devices} x model {p.model_shards}; {calls:,} packed calls in all, the "
                 f"largest {widest.B} x {widest.W} tokens after {widest.cache} cached keys",
                 f"checked {len(self.settings)} (dataset, k) x {len(c.seeds)} seeds: the longest "
                 f"prompt has {w.longest_prompt} tokens ({w.dataset} k={w.k} seed {w.seed}), the "
                 f"context window {parts.config.max_position_embeddings}"]
        lines += [f"skipped: {name} k={k} ({n} classes > {k} demonstrations)"
                  for name, k, n in self.skipped]
        return "\n".join(lines + list(self.notes))

    def __str__(self) -> str:
        return self.describe()


def run_mesh(config: RunConfig):
    """The run's mesh: the one its ``mesh_devices`` / ``mesh_model`` ask for; with
    several processes and no mesh asked, every process's devices on the data axis (a
    model that one device holds; with no mesh each process would score alone); else
    None."""
    if config.mesh_devices or config.mesh_model > 1 or is_multiprocess():
        return make_mesh(config.mesh_devices, model=config.mesh_model)
    return None


def build_plan(config: RunConfig, *, datasets: dict | None = None, mesh=None, agree: bool = True,
               fetch: bool = True) -> RunPlan:
    """The run's :class:`RunPlan`, with every up-front check, no weight read and no
    forward pass. In order: the model located without weights (a Hugging Face id
    missing from the hub cache fails here), the data (``datasets``, name -> Dataset,
    else :func:`sc_jax.experiment.protocol.jobs.load_datasets`: a bad name or file fails here),
    a named model not converted yet fetched and converted (``fetch``; else refused),
    the memory policy (:func:`run_policy` on ``mesh``, else on the config's mesh
    figures; ``agree``: see :meth:`MemoryPolicy.resolve`) and the weights against it,
    then every seed's work (:func:`_seed_work`).

    Raises ValueError or :class:`sc_jax.scoring.memory.PlanError`, one line naming the
    dataset, k, seed, job and data row where one is to blame."""
    located = _locate(config.model, fetch)
    datasets = load_datasets(config) if datasets is None else dict(datasets)
    if located is None:
        located = locate_model(config.model, weights=True)
    policy = run_policy(config, n_devices=None if mesh is None else mesh_size(mesh),
                        model_shards=None if mesh is None else axis_size(mesh, MODEL), agree=agree)
    # The weights are the same for every seed: their error names no dataset or seed.
    weights_fit(located.parts.config, DTYPES[config.dtype], policy.budget_bytes, policy.model_shards)
    work, skipped = _all_work(config, located, datasets, policy)
    if not work:
        refuse_nothing_to_run(skipped)
    notes, left_out = rows_passed_over(datasets)
    return RunPlan(config, located, datasets, mesh, policy, tuple(work), tuple(skipped),
                   tuple(notes), left_out)


def _locate(model: str, fetch: bool) -> LocatedModel | None:
    """The model located without its weights, or None where only a fetch gives its
    tokenizer (a named model not converted yet) and ``fetch`` allows one."""
    try:
        return locate_model(model, weights=False)
    except HubModelNotCachedError:
        raise
    except FileNotFoundError:
        if not fetch:
            raise
        return None


def _all_work(config: RunConfig, located: LocatedModel, datasets: dict, policy: MemoryPolicy):
    """Every (dataset, k, seed)'s :class:`SeedWork` in the run's order, and the
    ``(dataset, k, n_classes)`` skipped. Each seed's schedule keeps the call shape of
    the one before where its items fit, as the engine scoring them in this order does
    (so its programs compile once)."""
    work, skipped, prefer = [], [], None
    for name, ds in datasets.items():
        for k in config.shots:
            if ds.n_classes > k:
                skipped.append((name, k, ds.n_classes))
                continue
            for seed in config.seeds:
                w = _seed_work(config, located, policy, name, ds, k, seed, prefer)
                prefer = w.planned.schedule.shape
                work.append(w)
    return work, skipped


def _seed_work(config: RunConfig, located: LocatedModel, policy: MemoryPolicy, name: str, ds,
               k: int, seed: int, prefer) -> SeedWork:
    """One (dataset, k, seed): its split (a class short of rows fails here, not after
    earlier seeds were scored), its jobs, their prompts against the context window
    (the first seed also checks the labels and the test set's classes) and their
    packed schedule under ``policy``."""
    model_config = located.parts.config
    split = draw_split(ds, config, k, seed)
    sj = seed_jobs(located.parts.tokenizer, ds, split, config, k)
    if seed == config.seeds[0]:
        check_first_seed(name, ds, split, sj, config.mode)
    longest = check_prompts(name, ds, split, sj, config.mode, model_config.max_position_embeddings)
    try:
        planned = policy.plan(model_config, DTYPES[config.dtype], sj.pieces, list(sj.jobs.values()),
                              config.mode, prefer=prefer)
    except PlanError as e:
        raise PlanError(f"{name}, k={k}, seed {seed}: {e}") from None
    return SeedWork(name, k, seed, split, sj, planned, longest)


def rows_passed_over(datasets: dict) -> tuple[list[str], dict[str, list[int]]]:
    """The notes on the rows of ``datasets`` (name -> Dataset) that no seed draws, and
    results.json's ``left_out_rows``: per dataset, the file's rows (1-based) left out
    for their blank text, with which the splits are reproducible from the file alone."""
    notes = [f"{name}: {ds.duplicate_rows} of {len(ds)} rows repeat an earlier text; each "
             "text is drawn once, so no test query is also a demonstration"
             for name, ds in datasets.items() if ds.duplicate_rows]
    notes += [f"{name}: {len(ds.blank_rows)} of {len(ds)} rows have an empty or whitespace-only "
              "text and are left out of every draw (left_out_rows)"
              for name, ds in datasets.items() if ds.blank_rows]
    return notes, {name: [i + 1 for i in ds.blank_rows] for name, ds in datasets.items() if ds.blank_rows}
