"""LOOC and LinC against their authors' code on one small synthetic case each: the
difference, printed and written as JSON.

* LOOC: ``compute_task_calibration_parameters`` of schwartz-lab-NLP/label-bias
  (``src/superni/compute_metrics.py``), called with the leave-one-out prompts' label
  probabilities and gold labels, against :func:`sc_jax.calibration.looc.looc_prior`
  (its 1 / p_bar) and the calibrated test probabilities.
* LinC: ``eval_accuracy(mode="diagonal_W")`` of mominabbass/LinC
  (``run_classification.py``: its torch SGD loop and its prediction), with p_cf from its
  ``get_p_content_free``, against :func:`sc_jax.calibration.linc.linc_fit` given the
  same row orders (sklearn's ``shuffle(random_state=0)`` each epoch, as their loop does).
  Their module's ``utils`` and ``data_utils`` load models and data sets at import; they
  are replaced by stand-ins that hand over the synthetic probabilities instead of
  querying a model, and that capture the calibrated probabilities their loop passes to
  ``expected_calibration_error``. The SGD and the prediction that run are theirs.

Needs local checkouts (e.g. ``git clone`` of each, or ``git archive`` of a mirror) and
the peers' imports: torch, pandas, scikit-learn and matplotlib::

    PYTHONPATH=.:/path/to/site-packages python benchmarks/peer_methods.py \\
        --looc-repo /tmp/peers/label-bias --linc-repo /tmp/peers/linc
"""

from __future__ import annotations

import argparse
import importlib
import sys
import types

import numpy as np

import _results
from sc_jax.calibration.linc import linc_fit, linc_predict
from sc_jax.calibration.looc import leave_one_out_calibration, looc_prior


def synthetic(rng, rows: int, n: int, labels=None):
    """Label probabilities of ``rows`` prompts with a label prior the model leans to:
    Dirichlet rows concentrated on the gold label, times a bias, renormalised."""
    labels = rng.integers(0, n, rows) if labels is None else np.asarray(labels)
    probs = rng.dirichlet(np.ones(n), rows) + 0.8 * np.eye(n)[labels]
    probs *= np.linspace(2.0, 0.5, n)
    return probs / probs.sum(axis=1, keepdims=True), labels


def looc_case(repo: str, rng) -> dict:
    sys.path.insert(0, repo)
    import pandas as pd
    peer = importlib.import_module("src.superni.compute_metrics")
    n, k, T = 3, 8, 64
    # one leave-one-out prompt per demonstration; unbalanced labels (5, 1 and 2)
    loo, labels = synthetic(rng, k, n, labels=[0, 0, 0, 0, 0, 1, 2, 2])
    test, _ = synthetic(rng, T, n)
    as_series = pd.Series([dict(enumerate(row)) for row in loo])
    params = peer.compute_task_calibration_parameters(
        as_series, np.zeros(k, int), gold_labels=labels)[0]  # one task
    theirs = test * params
    theirs /= theirs.sum(axis=1, keepdims=True)
    ours = leave_one_out_calibration(test, loo, labels)
    return {"case": f"k = {k} leave-one-out prompts (labels {np.bincount(labels).tolist()}), "
                    f"n = {n} labels, T = {T} test rows, float64",
            "max_abs_diff_inverse_prior": float(np.abs(1 / looc_prior(loo, labels) - params).max()),
            "max_abs_diff_probs": float(np.abs(ours - theirs).max()),
            "same_predictions": bool((ours.argmax(1) == theirs.argmax(1)).all())}


def linc_case(repo: str, rng, epochs: int, lr: float) -> dict:
    from sklearn.utils import shuffle
    n, N, T = 3, 100, 64                         # their README's val_size = 100
    val, val_labels = synthetic(rng, N, n)
    test, test_labels = synthetic(rng, T, n)
    cf = synthetic(rng, 3, n)[0] * 0.3           # unnormalised, as their p_cf input is
    queue, captured = [cf, val], {}

    def get_model_response(*args, **kwargs):
        return None, queue.pop(0)

    def expected_calibration_error(probs, labels, M=10):
        captured["probs"] = np.asarray(probs)
        return (0.0,)

    utils = types.ModuleType("utils")
    utils.np = np
    utils.deepcopy = __import__("copy").deepcopy
    utils.random_sampling = lambda *a, **k: (None, None)
    utils.get_model_response = get_model_response
    utils.expected_calibration_error = expected_calibration_error
    data_utils = types.ModuleType("data_utils")
    data_utils.load_dataset_custom = None
    sys.modules.update(utils=utils, data_utils=data_utils)
    sys.path.insert(0, repo)
    peer = importlib.import_module("run_classification")
    p_cf = peer.get_p_content_free({}, None, None, None, None, None, None, None)
    peer.eval_accuracy(test, test_labels, None, None, None, val_labels, {"num_shots": 0},
                       lr, epochs, 0, mode="diagonal_W", p_cf=p_cf)
    theirs = captured["probs"]
    order, orders = np.arange(N), []
    for _ in range(epochs):                      # their loop reshuffles the shuffled rows
        order = shuffle(order, random_state=0)
        orders.append(order)
    fit = linc_fit(val, val_labels, cf, lr=lr, epochs=epochs, orders=np.stack(orders))
    ours = linc_predict(fit, test)
    return {"case": f"N = {N} labelled prompts, n = {n} labels, T = {T} test rows, "
                    f"{epochs} epochs at lr {lr}; theirs float32 torch, ours float64",
            "max_abs_diff_probs": float(np.abs(ours - theirs).max()),
            "same_predictions": bool((ours.argmax(1) == theirs.argmax(1)).all())}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--looc-repo", required=True, help="checkout of schwartz-lab-NLP/label-bias")
    parser.add_argument("--linc-repo", required=True, help="checkout of mominabbass/LinC")
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--lr", type=float, default=0.015)
    parser.add_argument("--out", type=_results.result_file, default=None)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    out = {"looc": looc_case(args.looc_repo, rng),
           "linc": linc_case(args.linc_repo, rng, args.epochs, args.lr)}
    for name, r in out.items():
        diffs = ", ".join(f"{k} {v:.3g}" for k, v in r.items() if k.startswith("max"))
        print(f"{name:5s} {r['case']}\n      {diffs}; same predictions: {r['same_predictions']}")
    machine = _results.machine("cpu")
    path = _results.write_json(
        args.out or _results.default_path("peer_methods", machine["id"]),
        dict(header=_results.header(machine, command=_results.command(__file__, argv),
                                    dtype="float64"), **out))
    print(f"wrote {path}")
    return out


if __name__ == "__main__":
    main()
