"""sc_jax: Supervised Calibration for in-context learning, in JAX/Flax.

The top level is kept light: the public names below load their submodules (the
model, the solvers) on first use, so ``import sc_jax`` costs almost nothing.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# Progress and notes go to the "sc_jax" logger; silent unless the caller configures
# logging (the sc-jax command line shows INFO on stderr).
logging.getLogger("sc_jax").addHandler(logging.NullHandler())

# name -> submodule that defines it
_LAZY = {
    "load_model": "sc_jax.models.loading",
    "LoadedModel": "sc_jax.models.loading",
    "ModelConfig": "sc_jax.models.config",
    "Decoder": "sc_jax.models.model",
    "make_mesh": "sc_jax.runtime.sharding",
    # The pure-JAX entry point (jit/vmap/grad-composable) and its predictions.
    "calibrate": "sc_jax.calibration.jax_calibrate",
    "Calibration": "sc_jax.calibration.jax_calibrate",
    "calibrated_log_probs": "sc_jax.calibration.jax_predict",
    "ensemble_proba": "sc_jax.calibration.jax_predict",
    "tau_schedule": "sc_jax.calibration.defaults",
    "log_odds": "sc_jax.calibration.objective",
    # The NumPy batch entry point (many problems in one compiled call) and its predictions.
    "fit": "sc_jax.calibration.numpy_fit",
    "fit_batch": "sc_jax.calibration.numpy_fit",
    "predict_proba": "sc_jax.calibration.numpy_predict",
    "FitResult": "sc_jax.calibration.numpy_predict",
    # A fit's result code (CONVERGED, MAX_ITERATIONS, INFEASIBLE, NONFINITE, UNBOUNDED,
    # INVALID_INPUT): Calibration.status and FitResult.status compare to it.
    "Status": "sc_jax.calibration.solvers.types",
    # Static solver settings: calibrate(options=...), fit(options=...).
    "SolverOptions": "sc_jax.calibration.solvers.types",
    "ScoringEngine": "sc_jax.scoring.engine",
    "RunConfig": "sc_jax.experiment.protocol.config",
    "run_experiment": "sc_jax.experiment.execution.run",
}

__all__ = [
    "Calibration",
    "Decoder",
    "FitResult",
    "LoadedModel",
    "ModelConfig",
    "RunConfig",
    "ScoringEngine",
    "SolverOptions",
    "Status",
    "calibrate",
    "calibrated_log_probs",
    "ensemble_proba",
    "fit",
    "fit_batch",
    "load_model",
    "log_odds",
    "make_mesh",
    "predict_proba",
    "run_experiment",
    "tau_schedule",
]

# What IDEs and type checkers see of the names above; at run time they load lazily
# (tests/test_imports.py keeps these, _LAZY and __all__ the same).
if TYPE_CHECKING:
    from sc_jax.calibration.defaults import tau_schedule
    from sc_jax.calibration.jax_calibrate import Calibration, calibrate
    from sc_jax.calibration.jax_predict import calibrated_log_probs, ensemble_proba
    from sc_jax.calibration.numpy_fit import fit, fit_batch
    from sc_jax.calibration.numpy_predict import FitResult, predict_proba
    from sc_jax.calibration.objective import log_odds
    from sc_jax.calibration.solvers.types import SolverOptions, Status
    from sc_jax.experiment.execution.run import run_experiment
    from sc_jax.experiment.protocol.config import RunConfig
    from sc_jax.models.config import ModelConfig
    from sc_jax.models.loading import LoadedModel, load_model
    from sc_jax.models.model import Decoder
    from sc_jax.runtime.sharding import make_mesh
    from sc_jax.scoring.engine import ScoringEngine


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'sc_jax' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_LAZY))
