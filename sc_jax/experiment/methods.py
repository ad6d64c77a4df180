"""Each method's test-set probabilities from one seed's scores: the baselines (Base,
CC, DC, BC, LOOC, LinC, Surprise Calibration) and the SC fits of every size, combined by Algorithm 2's two-level ensemble
(:func:`method_probs`), and the batched SC / SC* fits of a (dataset, k) (:func:`fit_sc`).
"""

from __future__ import annotations

import contextlib
import warnings

import numpy as np

from sc_jax.calibration import baselines, surprise
from sc_jax.calibration.baselines import BC_BATCH_SIZE
from sc_jax.calibration.hidden import hidden_calibration
from sc_jax.calibration.linc import linc_fit, linc_predict
from sc_jax.calibration.looc import leave_one_out_calibration
from sc_jax.calibration.numpy_fit import fit_batch
from sc_jax.calibration.numpy_predict import predict_proba
from sc_jax.calibration.objective import log_odds
from sc_jax.experiment.config import SC_FITS, RunConfig
from sc_jax.experiment.jobs import SeedScores
from sc_jax.experiment.results import FitRecord

# Surprise Calibration's network and training: the authors' released defaults.
SURPRISE_SETTINGS = surprise.SurpriseSettings()


def method_probs(method: str, s: SeedScores, fits: dict | None, sizes, *,
                 bc_batch: int = BC_BATCH_SIZE, size_weighting: str = "uniform",
                 shots: int | None = None) -> np.ndarray:
    """``[T, n]`` probabilities of ``method`` (one of :data:`METHODS`) on one seed's
    test queries, from its scores ``s``; ``fits`` maps size -> FitResult for the SC
    methods (None for the baselines); ``shots`` k is needed by the reference size
    weighting."""
    p = np.exp(s.base.astype(np.float64))
    if method == "base":
        return baselines.base(p)
    if method == "cc":
        return baselines.contextual_calibration(p, np.exp(s.cc.astype(np.float64)))
    if method == "dc":
        return baselines.domain_context_calibration(p, np.exp(s.dc.astype(np.float64)))
    if method == "bc":
        return baselines.batch_calibration(p, bc_batch)
    if method == "bc_reference":
        return baselines.batch_calibration_reference(p, bc_batch)
    if method == "hidden":
        return hidden_probs(s, sizes)
    if method == "looc":
        return looc_probs(s, p)
    if method == "linc":
        return linc_probs(s, p)
    if method == "surprise":
        return surprise_method_probs(s)
    with fits_noted():
        return predict_proba([fits[i] for i in sizes], [log_odds(s.test[i]) for i in sizes],
                             size_weights="uniform" if size_weighting == "uniform" else "reference",
                             shots=shots, sizes=sizes)


def hidden_probs(s: SeedScores, sizes) -> np.ndarray:
    """Hidden Calibration's ``[T, n]`` (:func:`sc_jax.calibration.hidden.hidden_calibration`)
    from the seed's centroid distances of every size."""
    missing = [i for i in sizes if i not in s.hidden]
    if missing:
        raise ValueError(f"method hidden: these scores hold no hidden-state distances of sizes "
                         f"{missing} (scored without it); rerun `sc-jax run` with hidden in "
                         "--methods")
    return hidden_calibration([s.hidden[i] for i in sizes])


def looc_probs(s: SeedScores, p: np.ndarray) -> np.ndarray:
    """LOOC (:mod:`sc_jax.calibration.looc`) of the test probabilities ``p [T, n]``, its
    prior from the leave-one-out prompts: the run's own ``loo`` job where its sizes stop
    below k - 1, else the surrogate prompts of size k - 1 (the same prompts, under every
    ordering the budget scored)."""
    if s.loo is not None:
        logp, labels, queries = s.loo
    elif s.surrogate:
        if not looc_scored(s):
            k = len(s.demo_labels)
            raise ValueError(f"method looc needs each demonstration under the other k - 1 = {k - 1}; these "
                             f"scores stop at size {max(s.surrogate)} (--max-size) and hold no leave-one-out "
                             "prompts: rerun `sc-jax run` with looc in --methods (it scores them)")
        logp, labels, queries = s.surrogate[max(s.surrogate)]
    else:
        raise ValueError("looc needs surrogate scores (k >= 2); drop it from --methods")
    return leave_one_out_calibration(p, np.exp(logp.astype(np.float64)), labels, queries)


def looc_scored(s: SeedScores) -> bool:
    """Whether ``s`` holds LOOC's prompts: its own leave-one-out job, or surrogate
    prompts of size k - 1 (a score file that predates the demonstrations' labels is
    taken at its word: such runs scored every size)."""
    if s.loo is not None:
        return True
    if not s.surrogate:
        return False
    return s.demo_labels is None or max(s.surrogate) == len(s.demo_labels) - 1


def linc_probs(s: SeedScores, p: np.ndarray) -> np.ndarray:
    """LinC (:mod:`sc_jax.calibration.linc`) fitted on the surrogate rows of every size
    (SC's training data), started from the content-free scores under the full context,
    and applied to the test probabilities ``p [T, n]`` under that context."""
    if not s.surrogate:
        raise ValueError("linc needs surrogate scores (k >= 2); drop it from --methods")
    sizes = sorted(s.surrogate)
    logp = np.concatenate([s.surrogate[i][0] for i in sizes]).astype(np.float64)
    labels = np.concatenate([s.surrogate[i][1] for i in sizes])
    fit = linc_fit(np.exp(logp), labels, np.exp(s.cc.astype(np.float64)))
    return linc_predict(fit, p)


def surprise_method_probs(s: SeedScores) -> np.ndarray:
    """Surprise Calibration's ``[T, n]`` test probabilities: its network trained on the
    seed's surrogate rows (each held-out demonstration under a sub-context of the
    others, every size), then applied to the k-shot context's demonstrations."""
    if s.demo_labels is None or s.surrogate_contexts is None:
        raise ValueError("these scores predate Surprise Calibration (no demonstration labels "
                         "or surrogate contexts): rerun `sc-jax run` with the same --out to "
                         "rewrite them from the score cache")
    labels = np.asarray(s.demo_labels)
    train = [(labels[s.surrogate_contexts[i]], lp, y) for i, (lp, y, _) in sorted(s.surrogate.items())]
    return surprise.surprise_probs(s.base.astype(np.float64), s.demo_labels, train,
                                   n=s.base.shape[-1], settings=SURPRISE_SETTINGS)


@contextlib.contextmanager
def fits_noted():
    """Silence the API's warning on fits that did not converge: a run counts them once
    in its notes (``run._fit_notes``) and ablate in its tables, instead of warning at
    every prediction."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*not CONVERGED", category=RuntimeWarning)
        yield


def sc_size_probs(s: SeedScores, fits: dict, sizes) -> dict[int, np.ndarray]:
    """Per size i, the ``[T, n]`` probabilities (1/m_i) sum_j f(m(x; C_i^(j)); theta_i)
    that SC's ensemble averages (Algorithm 2, Part 2)."""
    with fits_noted():
        return {i: fits[i].predict_proba(log_odds(s.test[i])).mean(axis=0) for i in sizes}


def fit_sc(scores: dict[int, SeedScores], name: str, k: int, config: RunConfig,
            lam: float) -> tuple[dict, list[FitRecord]]:
    """SC, SC*, SC* without trust region and the paper's SC (those of ``config.methods``;
    :data:`SC_FITS`) for every (seed, size) of one (dataset, k): method -> {(seed, size):
    fit}, and one param record per fit."""
    # Every (seed, size) of this (dataset, k) in one batched solver call.
    keys = [(seed, i) for seed in config.seeds for i in config.sizes(k)]
    problems = [(log_odds(scores[seed].surrogate[i][0]), scores[seed].surrogate[i][1],
                 scores[seed].surrogate[i][2]) for seed, i in keys]
    fits, params, solved = {}, [], {}
    for method, (star, tau, guard) in SC_FITS.items():
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
