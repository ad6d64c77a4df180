"""Stage 3, from label log-odds to calibrated probabilities: the SC objective
(:mod:`~sc_jax.calibration.objective`, paper Eq. 3-6), input checks
(:mod:`~sc_jax.calibration.validation`), the jit/vmap/grad-composable API
(:mod:`~sc_jax.calibration.functional`, ``calibrate``), the NumPy-facing fits
(:mod:`~sc_jax.calibration.calibrators`, ``fit``, ``fit_batch``, ``predict_proba``), the
solvers (:mod:`sc_jax.calibration.solvers`), the baselines CC, DC and BC
(:mod:`~sc_jax.calibration.baselines`) and synthetic surrogate data with a known truth
(:mod:`~sc_jax.calibration.synthetic`).

Needs no model: it imports :mod:`sc_jax.runtime` at most, never a later stage.
"""
