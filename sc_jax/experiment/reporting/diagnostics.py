"""Why SC helps or hurts, per (dataset, shots, seed, size), from a finished run's saved
scores (``sc-jax ablate`` writes it as ``diagnostics.md`` and ``diagnostics.csv``):
the LLM on the surrogate data against the LLM at test time (:func:`diagnose`), and
their table (:func:`diagnostics_markdown`). No model and no forward pass.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from sc_jax.calibration.defaults import base_accuracy
from sc_jax.calibration.numpy_fit import fit_batch
from sc_jax.calibration.numpy_predict import predict_proba
from sc_jax.calibration.objective import log_odds
from sc_jax.calibration.solvers import is_converged
from sc_jax.experiment.evaluation import metrics
from sc_jax.experiment.evaluation.methods import fits_noted
from sc_jax.experiment.evaluation.store import load_run_scores
from sc_jax.experiment.reporting.ablation import surrogate_problems


DIAGNOSTIC_FIELDS = ("dataset", "shots", "seed", "size", "rows", "surrogate_accuracy",
                     "test_accuracy_same_size", "base_accuracy", "heldout_class_share",
                     "test_class_share", "tau", "mean_w", "status", "sc_size_accuracy")


def diagnose(run_dir, *, solver: str | None = None, dtype: str = "float32") -> list[dict]:
    """Why SC helps or hurts, per (dataset, shots, seed, size i), from saved scores:

    surrogate_accuracy: the LLM's in-sample accuracy on the surrogate data (what the
        Appendix A tau schedule reads); test_accuracy_same_size: its accuracy on the
        test queries under size-i sub-contexts (mean over the m_i of them): the two
        would agree if the surrogate data were representative of test time;
        base_accuracy: the full k-shot prompt's.
    heldout_class_share: mean over surrogate rows of the share of the held-out
        demonstration's own class among the other k - 1 demonstrations, which its
        sub-contexts are drawn from: (n_y - 1) / (k - 1) for n_y demonstrations of its
        class; test_class_share: the same for the test queries, whose sub-contexts
        come from all k: n_y / k. A model that copies the labels in its context sees
        the held-out class under-represented in the surrogate data only.
    tau, mean_w, status, sc_size_accuracy: SC fitted as the paper does (no guard; its tau
        from the schedule, mean slope, solver status) and its test accuracy alone.
    """
    results, runs = load_run_scores(Path(run_dir))
    lam = results.fit_lambda_inv
    solver = solver or results.solver
    rows = []
    for (name, k), per_seed in runs.items():
        keys, problems = surrogate_problems(per_seed)
        fits = dict(zip(keys, fit_batch(problems, lambda_inv=lam, tau=results.tau,
                                        solver=solver, dtype=dtype)))
        for (seed, i), (feats, y, q) in zip(keys, problems):
            s = per_seed[seed]
            demo_label = np.zeros(k, np.int64)  # the label of each held-out demonstration
            demo_label[q] = y
            per_class = np.bincount(demo_label, minlength=s.base.shape[-1])
            test_pred = s.test[i].argmax(-1)  # [m_i, T]
            fit_i = fits[(seed, i)]
            with fits_noted():
                pred = predict_proba([fit_i], [log_odds(s.test[i])]).argmax(-1)
            rows.append(dict(
                dataset=name, shots=k, seed=seed, size=i, rows=int(len(y)),
                surrogate_accuracy=base_accuracy(feats, y),
                test_accuracy_same_size=float(np.mean(test_pred == s.y_test[None])),
                base_accuracy=float(np.mean(s.base.argmax(-1) == s.y_test)),
                heldout_class_share=float(np.mean((per_class[y] - 1) / (k - 1))),
                test_class_share=float(np.mean(per_class[s.y_test] / k)),
                tau=float(fit_i.tau), mean_w=float(np.mean(fit_i.w)), status=fit_i.status.name,
                sc_size_accuracy=metrics.accuracy(s.y_test, pred)))
    return rows


def diagnostics_markdown(rows) -> str:
    """Per dataset and shots, one row per size: the :func:`diagnose` fields averaged
    over seeds (accuracies and shares in %)."""
    out = ["# Surrogate data against test time (the LLM alone, then SC of that size)", "",
           "Means over seeds. surrogate acc: the LLM's in-sample accuracy on the surrogate "
           "data; test acc: its accuracy on the test queries under sub-contexts of the "
           "same size; shares: the query's own class among the demonstrations its "
           "sub-contexts are drawn from (held-out rows: the other k - 1; test queries: "
           "all k).", ""]
    groups = defaultdict(list)
    for r in rows:
        groups[(r["dataset"], r["shots"], r["size"])].append(r)
    for d, k in sorted({(r["dataset"], r["shots"]) for r in rows}):
        out += [f"## {d}, {k}-shot", "",
                "| size | rows | surrogate acc | test acc (same size) | k-shot acc | held-out share "
                "| test share | tau | mean w | not converged | SC_i test acc |",
                "|---|---|---|---|---|---|---|---|---|---|---|"]
        for i in sorted({r["size"] for r in rows if r["dataset"] == d and r["shots"] == k}):
            rs = groups[(d, k, i)]

            def pct(field, rs=rs):
                return f"{100 * np.mean([r[field] for r in rs]):.1f}"

            bad = sum(not is_converged(r["status"]) for r in rs)
            out.append(f"| {i} | {rs[0]['rows']} | {pct('surrogate_accuracy')} | "
                       f"{pct('test_accuracy_same_size')} | {pct('base_accuracy')} | "
                       f"{pct('heldout_class_share')} | {pct('test_class_share')} | "
                       f"{np.mean([r['tau'] for r in rs]):.3f} | "
                       f"{np.mean([r['mean_w'] for r in rs]):.2f} | {bad}/{len(rs)} | "
                       f"{pct('sc_size_accuracy')} |")
        out.append("")
    return "\n".join(out)
