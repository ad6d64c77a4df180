"""Each method's test-set probabilities from one seed's scores (:func:`method_probs`:
the registered method's ``predict``, :mod:`sc_jax.calibration.methods`), and the batched
SC-family fits of a (dataset, k) (:func:`fit_sc`: every registered method with an
``sc_fit``).
"""

from __future__ import annotations

import numpy as np

from sc_jax.calibration import methods as registry
from sc_jax.calibration.baselines import BC_BATCH_SIZE
from sc_jax.calibration.methods._ensemble import fits_noted
from sc_jax.calibration.methods.hidden import hidden_probs
from sc_jax.calibration.methods.linc import linc_probs
from sc_jax.calibration.methods.looc import looc_probs, looc_scored
from sc_jax.calibration.methods.surprise import surprise_method_probs
from sc_jax.calibration.numpy_fit import fit_batch
from sc_jax.calibration.objective import log_odds
from sc_jax.experiment.evaluation.results import FitRecord
from sc_jax.experiment.protocol.config import RunConfig, sc_fits
from sc_jax.experiment.protocol.jobs import SeedScores

__all__ = ["fit_sc", "fits_noted", "hidden_probs", "linc_probs", "looc_probs", "looc_scored", "method_probs",
           "param_record", "sc_size_probs", "surprise_method_probs"]


def method_probs(method: str, s: SeedScores, fits: dict | None, sizes, *,
                 bc_batch: int = BC_BATCH_SIZE, size_weighting: str = "uniform",
                 shots: int | None = None) -> np.ndarray:
    """``[T, n]`` probabilities of the registered ``method`` on one seed's test
    queries, from its scores ``s``; ``fits`` maps size -> FitResult for an SC-family
    method (None for the others); ``shots`` k is needed by the reference size
    weighting."""
    options = registry.PredictOptions(bc_batch=bc_batch, size_weighting=size_weighting, shots=shots)
    return registry.get(method).predict(s, fits, list(sizes), options)


def sc_size_probs(s: SeedScores, fits: dict, sizes) -> dict[int, np.ndarray]:
    """Per size i, the ``[T, n]`` probabilities (1/m_i) sum_j f(m(x; C_i^(j)); theta_i)
    that SC's ensemble averages (Algorithm 2, Part 2)."""
    with fits_noted():
        return {i: fits[i].predict_proba(log_odds(s.test[i])).mean(axis=0) for i in sizes}


def fit_sc(scores: dict[int, SeedScores], name: str, k: int, config: RunConfig,
            lam: float) -> tuple[dict, list[FitRecord]]:
    """SC, SC*, SC* without trust region and the paper's SC (those of ``config.methods``;
    :func:`sc_jax.experiment.protocol.config.sc_fits`) for every (seed, size) of one (dataset, k): method -> {(seed, size):
    fit}, and one param record per fit."""
    if not sc_fits(config.methods):
        return {}, []  # no SC-family method: nothing to fit (and no surrogate scores)
    # Every (seed, size) of this (dataset, k) in one batched solver call.
    keys = [(seed, i) for seed in config.seeds for i in config.sizes(k)]
    problems = [(log_odds(scores[seed].surrogate[i][0]), scores[seed].surrogate[i][1],
                 scores[seed].surrogate[i][2]) for seed, i in keys]
    fits, params, solved = {}, [], {}
    for method, (star, tau, guard) in sc_fits(config.methods).items():
        if method in config.methods:
            how = (star, config.tau if tau is None else tau, guard or config.guard)
            if how not in solved:  # sc_paper under --guard none is sc: fitted once
                solved[how] = fit_batch(problems, lambda_inv=lam, tau=how[1],
                                        solver=config.solver, sc_star=star, guard=how[2])
            res = solved[how]
            fits[method] = dict(zip(keys, res))
            params += [param_record(name, k, seed, i, method, r) for (seed, i), r in zip(keys, res)]
    return fits, params


def param_record(name: str, k: int, seed: int, size: int, method: str, r) -> FitRecord:
    """What results.json keeps of one fit (a :class:`sc_jax.calibration.numpy_predict.FitResult`)."""
    return FitRecord(dataset=name, shots=k, seed=seed, size=size, method=method,
                     b=r.b.tolist(), w=r.w.tolist(), status=r.status.name,
                     tau=r.tau, lambda_inv=r.lambda_inv, objective=r.objective,
                     base_accuracy=r.base_accuracy, rows=r.num_rows, guarded=r.guarded)
