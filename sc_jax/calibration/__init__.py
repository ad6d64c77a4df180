"""Stage 3, from label log-odds to calibrated probabilities: the SC objective
(:mod:`~sc_jax.calibration.objective`, paper Eq. 3-6), input checks
(:mod:`~sc_jax.calibration.validation`), the defaults both entry points share
(:mod:`~sc_jax.calibration.defaults`: lambda_inv, the Appendix A tau schedule), and two
entry points:

* pure JAX, jit/vmap/grad-composable: :mod:`~sc_jax.calibration.jax_calibrate`
  (``calibrate``, ``Calibration``) and :mod:`~sc_jax.calibration.jax_predict`
  (``calibrated_log_probs``, ``ensemble_proba``);
* NumPy in, many problems in one compiled call: :mod:`~sc_jax.calibration.numpy_fit`
  (``fit``, ``fit_batch``), :mod:`~sc_jax.calibration.numpy_predict` (``FitResult``,
  ``predict_proba``) and the padding into buckets, :mod:`~sc_jax.calibration.buckets`.

Then the solvers (:mod:`sc_jax.calibration.solvers`), the baselines CC, DC and BC
(:mod:`~sc_jax.calibration.baselines`), LOOC (:mod:`~sc_jax.calibration.looc`) and
LinC (:mod:`~sc_jax.calibration.linc`), and synthetic surrogate data with a known truth
(:mod:`~sc_jax.calibration.synthetic`).

Needs no model: it imports :mod:`sc_jax.runtime` at most, never a later stage.
"""
