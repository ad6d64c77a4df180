"""Stage 4, the paper's protocol end to end: the tasks (:mod:`~sc_jax.experiment.tasks`),
their loading (:mod:`~sc_jax.experiment.task_loading`) and splits
(:mod:`~sc_jax.experiment.splits`), a run's configuration (:mod:`~sc_jax.experiment.config`),
its scoring jobs (:mod:`~sc_jax.experiment.jobs`), its plan built once
(:mod:`~sc_jax.experiment.runplan`) with the up-front checks
(:mod:`~sc_jax.experiment.preflight`), the demo (:mod:`~sc_jax.experiment.demo`), its files on disk (:mod:`~sc_jax.experiment.store`),
each method's fits and predictions (:mod:`~sc_jax.experiment.methods`), the driver
(:mod:`~sc_jax.experiment.run`, ``run_experiment``), metrics, per-sample records
(:mod:`~sc_jax.experiment.samples`), the report (:mod:`~sc_jax.experiment.results`,
:mod:`~sc_jax.experiment.report`, :mod:`~sc_jax.experiment.figures`), ablations
(:mod:`~sc_jax.experiment.ablation`, :mod:`~sc_jax.experiment.ablation_report`,
:mod:`~sc_jax.experiment.diagnostics`), and the dry run (:mod:`~sc_jax.experiment.plan`
with :mod:`~sc_jax.experiment.roofline` and :mod:`~sc_jax.scoring.costs`).

May import every earlier stage; only :mod:`sc_jax.cli` imports from here.
"""
