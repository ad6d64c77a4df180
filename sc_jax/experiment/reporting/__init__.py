"""What is made from a finished run, with no model: the names and colours of datasets
and methods (:mod:`.names`), the statistics (:mod:`.stats`), the figures
(:mod:`.figures`), the per-sample records (:mod:`.samples`), the report's tables
(:mod:`.report`), and ``sc-jax ablate``'s refits from the saved scores
(:mod:`.ablation`, :mod:`.diagnostics`, :mod:`.ablation_report`).

Imports the experiment's earlier sub-packages (tasks, protocol, evaluation), never
:mod:`sc_jax.experiment.execution`.
"""
