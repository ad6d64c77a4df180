"""What a seed's scores yield and what a run keeps of them: each method's fits and
probabilities (:mod:`.methods`), the metrics (:mod:`.metrics`), results.json's typed
records (:mod:`.results`), a run's files (:mod:`.store`) and files put in place
together, all or none (:mod:`.staging`).

Imports :mod:`sc_jax.experiment.tasks` and :mod:`sc_jax.experiment.protocol` only, of the
experiment's sub-packages.
"""
