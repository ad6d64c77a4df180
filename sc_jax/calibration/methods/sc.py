"""SC (guard): Supervised Calibration as the run fits it, each size's affine map of the
label log-odds fitted on its surrogate data (paper Eq. final_opt_problem) and combined by
the two-level ensemble (Algorithm 2); the run's --guard (default bias_only) fits SC* at
a size whose surrogate accuracy is below chance, a deviation from the paper."""

from sc_jax.calibration.methods._ensemble import sc_ensemble
from sc_jax.calibration.methods.protocol import Method, SCFit, register

METHOD = register(Method("sc", "SC (guard)", "#d62728", sc_ensemble, needs={"surrogate", "test", "sc_fit"},
                         sc_fit=SCFit(), subject=True, doc=__doc__))
