"""Tasks as data: a task's spec and the nine built-in ones (:mod:`.spec`, whose JSON
files are ``builtin_tasks/``), the loading of one task's labelled rows (:mod:`.loading`)
and the built-in tasks' JSONL files rebuilt (:mod:`.export`, ``sc-jax export-tasks``).

The first sub-package of :mod:`sc_jax.experiment`: imports none of the others.
"""
