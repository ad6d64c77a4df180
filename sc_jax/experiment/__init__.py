"""Stage 4, the paper's protocol end to end, in five sub-packages in the order their
imports run (each imports only earlier ones; ``tests/test_imports.py`` enforces it):

1. :mod:`~sc_jax.experiment.tasks`: what is scored. A task's spec
   (:mod:`~sc_jax.experiment.tasks.spec`: ``TaskSpec``, the nine built-in ``TASKS`` read
   from the JSON files of ``builtin_tasks/``), its loading
   (:mod:`~sc_jax.experiment.tasks.loading`) and the export of the built-in tasks' files
   (:mod:`~sc_jax.experiment.tasks.export`).
2. :mod:`~sc_jax.experiment.protocol`: what a run does, decided before any weight is read.
   Its splits (:mod:`~sc_jax.experiment.protocol.splits`), its configuration
   (:mod:`~sc_jax.experiment.protocol.config`, ``RunConfig``), each seed's scoring jobs
   (:mod:`~sc_jax.experiment.protocol.jobs`), and its plan built once
   (:mod:`~sc_jax.experiment.protocol.runplan`) with the up-front checks
   (:mod:`~sc_jax.experiment.protocol.preflight`).
3. :mod:`~sc_jax.experiment.evaluation`: what the scores yield and what is kept of them.
   Each method's fits and probabilities (:mod:`~sc_jax.experiment.evaluation.methods`),
   the metrics (:mod:`~sc_jax.experiment.evaluation.metrics`), the typed records of
   results.json (:mod:`~sc_jax.experiment.evaluation.results`), a run's files on disk
   (:mod:`~sc_jax.experiment.evaluation.store`) and files put in place together
   (:mod:`~sc_jax.experiment.evaluation.staging`).
4. :mod:`~sc_jax.experiment.reporting`: what is made from a finished run, with no model.
   Names and colours (:mod:`~sc_jax.experiment.reporting.names`), statistics
   (:mod:`~sc_jax.experiment.reporting.stats`), figures
   (:mod:`~sc_jax.experiment.reporting.figures`), per-sample records
   (:mod:`~sc_jax.experiment.reporting.samples`), the report
   (:mod:`~sc_jax.experiment.reporting.report`), and the refits of ``sc-jax ablate``
   (:mod:`~sc_jax.experiment.reporting.ablation`,
   :mod:`~sc_jax.experiment.reporting.diagnostics`,
   :mod:`~sc_jax.experiment.reporting.ablation_report`).
5. :mod:`~sc_jax.experiment.execution`: the commands that take a plan. The run
   (:mod:`~sc_jax.experiment.execution.run`, ``run_experiment``: it scores the plan and
   ends by writing the report, so it sits above reporting), the demo
   (:mod:`~sc_jax.experiment.execution.demo`) and the dry run
   (:mod:`~sc_jax.experiment.execution.plan`, costed on
   :mod:`~sc_jax.experiment.execution.roofline` and :mod:`~sc_jax.scoring.costs`, the whole
   grid projected by :mod:`~sc_jax.experiment.execution.grid`).

May import every earlier stage; only :mod:`sc_jax.cli` imports from here. The public
names (``RunConfig``, ``run_experiment``) load from :mod:`sc_jax`.
"""
