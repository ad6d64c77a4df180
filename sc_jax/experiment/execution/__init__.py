"""The commands that take a run's plan: ``sc-jax run`` scores it (:mod:`.run`,
``run_experiment``, which ends by writing the report), ``sc-jax demo`` runs one in
miniature (:mod:`.demo`), and ``sc-jax plan`` costs it without scoring (:mod:`.plan`,
on the rates of :mod:`.roofline`, the whole grid projected by :mod:`.grid`).

The last sub-package of :mod:`sc_jax.experiment`: it may import all the others.
"""
