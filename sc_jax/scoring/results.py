"""What a call of :class:`sc_jax.scoring.engine.ScoringEngine` returns: the scores
of each job, what the call did (:class:`EngineStats`, with the forward calls' counts
:class:`CallCounts`) and the plan it ran (:class:`ScoreResult`).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from sc_jax.scoring.memory import Planned
from sc_jax.scoring.packing import PackShape


class CallCounts(NamedTuple):
    """What a run of forward calls did, summed call by call (:meth:`plus`): ``calls``,
    real ``tokens`` computed, ``padded_tokens`` executed (calls x B x W, padding
    included), trie ``nodes`` made, ``query_rows`` read out, and ``host_s``, the host's
    seconds building the calls' arrays and filing their results."""

    calls: int = 0
    tokens: int = 0
    padded_tokens: int = 0
    nodes: int = 0
    query_rows: int = 0
    host_s: float = 0.0

    def plus(self, **more) -> CallCounts:
        """These counts with ``more`` (field -> amount) added."""
        return self._replace(**{n: getattr(self, n) + x for n, x in more.items()})


@dataclasses.dataclass(frozen=True)
class EngineStats:
    """What one :meth:`sc_jax.scoring.engine.ScoringEngine.score_jobs` call did, made
    once when it ends: forward calls, real tokens computed (the trie's unique tokens
    plus query tokens), executed tokens (calls x B x W, padding included), trie nodes,
    query rows (:class:`CallCounts`), distinct model ``programs``,
    the call shape, and where its ``seconds`` went: ``plan_s`` (the schedule, on the
    host), ``compile_s`` (JAX compiles: the model program before the first call,
    the model-free gathers and writes as they come; ``compiled`` programs, of them
    ``model_compiled`` model programs, and ``cache_hits`` served by the persistent
    compilation cache), ``host_s`` (building each call's arrays and filing its
    results) and ``forward_s`` (dispatching the calls and waiting for the device);
    ``attention``: the packed calls' attention (:mod:`sc_jax.models.attention`), with
    the candidates timed on this device to choose it (``attention_trials``, one
    :meth:`sc_jax.scoring.attention_choice.Trial.to_json` each; empty where nothing was
    timed) and whether that decision was read from the decision file
    (``attention_from_cache``); the choosing is part of ``compile_s``."""

    calls: int = 0
    tokens: int = 0
    padded_tokens: int = 0
    nodes: int = 0
    query_rows: int = 0
    programs: int = 0
    shape: PackShape | None = None
    seconds: float = 0.0
    plan_s: float = 0.0
    compile_s: float = 0.0
    host_s: float = 0.0
    forward_s: float = 0.0
    compiled: int = 0
    model_compiled: int = 0
    cache_hits: int = 0
    attention: str = ""
    attention_trials: list = dataclasses.field(default_factory=list)
    attention_from_cache: bool = False


@dataclasses.dataclass(frozen=True)
class ScoreResult:
    """One :meth:`sc_jax.scoring.engine.ScoringEngine.score_jobs` call: ``scores``
    (tag -> ``[N, n_classes]`` label log-probs, in the jobs' order), ``stats`` (what
    the call did), ``plan`` (the schedule and the budgets it ran under; None
    where no job had a pair) and ``hidden`` (tag -> ``[N, D]`` float32 last hidden
    states, where the call asked for them; else None)."""

    scores: dict[str, np.ndarray]
    stats: EngineStats
    plan: Planned | None
    hidden: dict[str, np.ndarray] | None = None
