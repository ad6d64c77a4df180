"""Stage 4, the paper's protocol end to end: datasets and splits
(:mod:`~sc_jax.experiment.data`), a run's configuration (:mod:`~sc_jax.experiment.config`),
its scoring jobs and up-front check (:mod:`~sc_jax.experiment.jobs`), its files on disk
(:mod:`~sc_jax.experiment.store`), each method's predictions
(:mod:`~sc_jax.experiment.predictions`), the driver (:mod:`~sc_jax.experiment.run`,
``run_experiment``), metrics, per-sample records, reports, ablations, and the dry run
(:mod:`~sc_jax.experiment.plan` with :mod:`~sc_jax.scoring.costs`).

May import every earlier stage; only :mod:`sc_jax.cli` imports from here.
"""
