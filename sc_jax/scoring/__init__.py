"""Stage 2, from demonstrations to label log-probabilities: demonstrations and queries
become prompt pieces (:mod:`~sc_jax.scoring.prompts`), sub-contexts are enumerated
(:mod:`~sc_jax.scoring.enumeration`), the prefix trie is scheduled
(:mod:`~sc_jax.scoring.schedule`) in calls of one shape (:mod:`~sc_jax.scoring.packing`)
under a memory model (:mod:`~sc_jax.scoring.memory`), the engine runs them
(:mod:`~sc_jax.scoring.engine`, ``ScoringEngine``; its jitted programs in
:mod:`~sc_jax.scoring.programs`, what it returns in :mod:`~sc_jax.scoring.results`)
against the reference paths (:mod:`~sc_jax.scoring.reference`), what the calls cost
is counted (:mod:`~sc_jax.scoring.costs`, :mod:`~sc_jax.scoring.xla_costs`) and
scores are kept on disk (:mod:`~sc_jax.scoring.cache`).

Imports :mod:`sc_jax.runtime` and :mod:`sc_jax.models`, never a later stage.
"""
