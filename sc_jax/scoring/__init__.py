"""Stage 2, from demonstrations to label log-probabilities: demonstrations and queries
become prompt pieces (:mod:`~sc_jax.scoring.prompts`), sub-contexts are enumerated
(:mod:`~sc_jax.scoring.enumeration`), the prefix trie is packed into calls of one shape
(:mod:`~sc_jax.scoring.packing`) under a memory policy (:mod:`~sc_jax.scoring.schedule`),
the engine runs them (:mod:`~sc_jax.scoring.engine`, ``ScoringEngine``) and scores are
kept on disk (:mod:`~sc_jax.scoring.cache`).

Imports :mod:`sc_jax.runtime` and :mod:`sc_jax.models`, never a later stage.
"""
