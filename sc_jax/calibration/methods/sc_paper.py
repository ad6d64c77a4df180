"""SC (paper): SC as the paper fits it (guard none), beside the run's SC so that every
table shows what the guard changed; with --guard none the two are the same fits."""

from sc_jax.calibration.methods._ensemble import sc_ensemble
from sc_jax.calibration.methods.protocol import Method, SCFit, register

METHOD = register(Method("sc_paper", "SC (paper)", "#ff9896", sc_ensemble, needs={"surrogate", "test", "sc_fit"},
                         sc_fit=SCFit(guard="none"), added=True, doc=__doc__))
