"""SC*: SC with w = 1, the bias alone (the paper's ablation), with the run's trust
region; and SC* (no trust region), the bias-only fit as the paper describes it and the
reference code fits it (tau = -1)."""

from sc_jax.calibration.methods._ensemble import sc_ensemble
from sc_jax.calibration.methods.protocol import Method, SCFit, register

SC_NEEDS = {"surrogate", "test", "sc_fit"}

METHOD = register(Method("sc_star", "SC*", "#9467bd", sc_ensemble, needs=SC_NEEDS, sc_fit=SCFit(sc_star=True),
                         doc="SC* with the run's trust region (at tau = 0.997 and w = 1 it bounds |b| near 0.08)."))
FREE = register(Method("sc_star_free", "SC* (no trust region)", "#c5b0d5", sc_ensemble, needs=SC_NEEDS,
                       sc_fit=SCFit(sc_star=True, tau=-1.0), added=True,
                       doc="SC* as the paper describes it and the reference code fits it: no trust region."))
