"""LOOC and LinC (sc_jax.calibration.looc, .linc) on synthetic data with a known answer,
and their dispatch from a run's scores (sc_jax.experiment.evaluation.methods.method_probs).

All in float64: the LOOC identities hold to rounding (1e-12); LinC's compiled SGD
agrees with a plain NumPy loop of the same steps to 1e-10 (two epochs of 20 rows,
each step O(1) flops, so the two differ by a few ulps per step); against SciPy's
minimiser of the same convex loss the tolerances are set by SGD's constant step size
(the measured gaps are below a tenth of them)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.optimize
import scipy.special

from sc_jax.calibration import baselines
from sc_jax.calibration.linc import LinC, epoch_orders, linc_fit, linc_init, linc_predict
from sc_jax.calibration.looc import leave_one_out_calibration, looc_prior
from sc_jax.experiment.evaluation.methods import method_probs
from sc_jax.experiment.protocol.jobs import SeedScores

PRIOR = np.array([0.5, 0.3, 0.2])


def _loo_rows(rng):
    """Leave-one-out rows whose per-label means are PRIOR + d_l with sum_l d_l = 0,
    from unbalanced labels (5, 1 and 2 demonstrations) and an unequal number of
    context orderings per demonstration (as a budget's sample leaves them): LOOC's
    prior is PRIOR exactly, the plain mean of the rows is not."""
    shifts = np.array([[0.2, -0.1, -0.1], [-0.15, 0.2, -0.05], [-0.05, -0.1, 0.15]])

    def centred(rows, scale):  # rows summing to 0, with mean 0 over the rows
        x = rng.normal(0, scale, (rows, 3))
        x -= x.mean(axis=1, keepdims=True)
        return x - x.mean(axis=0)

    probs, labels, queries, q = [], [], [], 0
    for label, count in enumerate((5, 1, 2)):
        for q_j in PRIOR + shifts[label] + centred(count, 0.02):  # this label's q_j
            orders = int(rng.integers(1, 5))
            probs.append(q_j + centred(orders, 0.01))  # its rows average to q_j
            labels += [label] * orders
            queries += [q] * orders
            q += 1
    return np.concatenate(probs), np.array(labels), np.array(queries)


def test_looc_prior_recovers_the_bias_whatever_the_label_counts():
    probs, labels, queries = _loo_rows(np.random.default_rng(0))
    assert np.allclose(probs.sum(axis=1), 1.0, atol=1e-12) and (probs > 0).all()
    np.testing.assert_allclose(looc_prior(probs, labels, queries), PRIOR, rtol=0, atol=1e-12)
    # The row mean is tilted towards label 0 (5 of 8 demonstrations): LOOC's averaging
    # per label is what removes it.
    assert abs(probs.mean(axis=0)[0] - PRIOR[0]) > 0.05
    # One row per demonstration (the paper's prompts): query ids change nothing.
    first = np.unique(queries, return_index=True)[1]
    q = np.stack([probs[queries == j].mean(axis=0) for j in np.unique(queries)])
    np.testing.assert_allclose(looc_prior(q, labels[first]), PRIOR, rtol=0, atol=1e-12)


def test_looc_removes_a_known_prior_from_the_test_predictions():
    rng = np.random.default_rng(1)
    truth = rng.dirichlet(np.ones(3), 7)           # the unbiased predictions [T, n]
    biased = truth * PRIOR * 3.7                   # scaled by the prior, unnormalised
    probs, labels, queries = _loo_rows(rng)
    out = leave_one_out_calibration(biased, probs, labels, queries)
    np.testing.assert_allclose(out, truth, rtol=1e-12)


def test_linc_sgd_is_the_plain_loop_step_by_step():
    rng = np.random.default_rng(2)
    p, y = rng.dirichlet(np.ones(3), 20), rng.integers(0, 3, 20)
    cf = rng.dirichlet(np.ones(3), 3)
    orders = epoch_orders(20, 2, seed=5)
    fit = linc_fit(p, y, cf, lr=0.3, epochs=2, orders=orders)
    w, b = linc_init(cf)
    for r in orders.reshape(-1):  # SGD on -log softmax(W p + b)_y, one row a step
        g = scipy.special.softmax(w @ p[r] + b)
        g[y[r]] -= 1.0
        w, b = w - 0.3 * np.outer(g, p[r]), b - 0.3 * g
    np.testing.assert_allclose(fit.w, w, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(fit.b, b, rtol=1e-10, atol=1e-12)


def test_linc_starts_at_contextual_calibration():
    rng = np.random.default_rng(3)
    p, cf = rng.dirichlet(np.ones(4), 50), rng.dirichlet(np.ones(4), 3) * 0.2
    start = linc_init(cf)
    p_cf = cf.mean(axis=0) / cf.mean(axis=0).sum()
    np.testing.assert_allclose(start.w, np.diag(1 / p_cf), rtol=1e-14)
    np.testing.assert_array_equal(start.b, 0.0)
    # softmax(p / p_cf) ranks the labels as CC does (same argmax)
    np.testing.assert_array_equal(linc_predict(start, p).argmax(-1),
                                  baselines.contextual_calibration(p, cf).argmax(-1))


def test_linc_reaches_the_minimiser_of_its_convex_loss():
    """Labels drawn from softmax(W* p + b*): after 300 epochs at lr 0.003 the SGD's mean
    cross-entropy is within 1e-4 of SciPy's minimum (measured 6e-6 on 1,500 rows) and
    its probabilities within 0.01 of the minimiser's (measured 0.0025)."""
    rng = np.random.default_rng(0)
    n, N = 3, 1500
    w_true = np.array([[4.0, -1.0, 0.0], [0.0, 3.0, -1.0], [-2.0, 0.0, 5.0]])
    p = rng.dirichlet(np.ones(n), N)
    z = p @ w_true.T + np.array([0.3, -0.2, 0.1])
    y = (rng.random(N)[:, None] > np.cumsum(scipy.special.softmax(z, axis=1), axis=1)).sum(1)

    def loss_grad(x):
        w, b = x[:n * n].reshape(n, n), x[n * n:]
        z = p @ w.T + b
        g = scipy.special.softmax(z, axis=1)
        g[np.arange(N), y] -= 1.0
        loss = np.mean(scipy.special.logsumexp(z, axis=1) - z[np.arange(N), y])
        return loss, np.concatenate([(g.T @ p).ravel(), g.sum(0)]) / N

    best = scipy.optimize.minimize(loss_grad, np.r_[np.eye(n).ravel(), np.zeros(n)], jac=True,
                                   method="BFGS", options={"gtol": 1e-10})
    # The loss is flat along W + v 1^T, b - v (p sums to 1), so BFGS may stop on
    # "precision loss": its gradient at the end is what says it is the minimum.
    assert np.linalg.norm(loss_grad(best.x)[1]) < 1e-7
    fit = linc_fit(p, y, np.full((3, n), 1 / n), lr=0.003, epochs=300)
    assert loss_grad(np.r_[fit.w.ravel(), fit.b])[0] - best.fun < 1e-4
    at_best = linc_predict(LinC(best.x[:n * n].reshape(n, n), best.x[n * n:]), p)
    np.testing.assert_allclose(linc_predict(fit, p), at_best, atol=0.01)


def _scores(rng, k=4, n=3, T=6):
    """A seed's scores at k = 4 with surrogate sizes 1..3 (size 3: leave-one-out)."""
    surrogate = {}
    for i in (1, 2, 3):
        rows = 12 * (k - i)
        queries = rng.integers(0, k, rows)
        surrogate[i] = (np.log(rng.dirichlet(np.ones(n), rows)).astype(np.float32),
                        queries % n, queries)
    logp = np.log(rng.dirichlet(np.ones(n), T))
    return SeedScores(base=logp, cc=np.log(rng.dirichlet(np.ones(n), 3)),
                      dc=np.log(rng.dirichlet(np.ones(n), 20)), surrogate=surrogate, test={},
                      y_test=np.zeros(T, int))


def test_method_probs_looc_and_linc_read_the_runs_surrogate_scores():
    s = _scores(np.random.default_rng(4))
    p = np.exp(s.base)
    logp, labels, queries = s.surrogate[3]  # LOOC: the leave-one-out size, k - 1
    np.testing.assert_allclose(
        method_probs("looc", s, None, []),
        leave_one_out_calibration(p, np.exp(logp.astype(np.float64)), labels, queries), rtol=1e-14)
    rows = [s.surrogate[i] for i in (1, 2, 3)]  # LinC: every size's rows
    fit = linc_fit(np.exp(np.concatenate([r[0] for r in rows]).astype(np.float64)),
                   np.concatenate([r[1] for r in rows]), np.exp(s.cc))
    np.testing.assert_allclose(method_probs("linc", s, None, []), linc_predict(fit, p), rtol=1e-12)
    empty = SeedScores(s.base, s.cc, s.dc, {}, {}, s.y_test)
    for method in ("looc", "linc"):
        with pytest.raises(ValueError, match=f"{method} needs surrogate scores"):
            method_probs(method, empty, None, [])
