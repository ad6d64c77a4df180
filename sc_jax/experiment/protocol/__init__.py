"""What a run does, decided before any weight is read: the splits (:mod:`.splits`), the
configuration (:mod:`.config`), each seed's scoring jobs (:mod:`.jobs`), the plan built
once (:mod:`.runplan`) and its up-front checks (:mod:`.preflight`).

Imports :mod:`sc_jax.experiment.tasks` only, of the experiment's sub-packages.
"""
