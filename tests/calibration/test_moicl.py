"""MoICL (sc_jax.calibration.methods.moicl): the weights on synthetic experts whose right
weights are known, against the minimiser of the same convex loss, against a NumPy
transcription of the authors' scalar-weight training step, its input checks, and one
`sc-jax run --methods base,moicl` end to end."""

import json

import numpy as np
import pytest
import scipy.optimize

from sc_jax import cli
from sc_jax.calibration.methods import moicl as M
from sc_jax.experiment.protocol.jobs import SeedScores


def one_hot_logp(labels, n, p_gold):
    """``[R, n]`` log-probs putting ``p_gold`` on each row's label, the rest spread evenly."""
    out = np.full((len(labels), n), np.log((1 - p_gold) / (n - 1)))
    out[np.arange(len(labels)), labels] = np.log(p_gold)
    return out


def experts_case(R, n=3, seed=0):
    """Expert 0 always right (0.9 on the gold label), expert 1 always wrong (0.1 on it),
    experts 2 and 3 noise independent of the labels: ``(logp [R, 4, n], labels [R])``."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, n, R)
    logp = np.log(rng.dirichlet(np.ones(n), (R, 4)))
    logp[:, 0] = one_hot_logp(y, n, 0.9)
    logp[:, 1] = one_hot_logp(y, n, 0.1)
    return logp, y


def test_the_weight_goes_to_the_right_expert_and_away_from_the_wrong_one():
    logp, y = experts_case(120)
    w = M.moicl_fit(logp, None, y)
    # dloss/dw_0 = -(l_0(y) - E_P l_0) < 0 on every row (the gold label is expert 0's
    # largest log-prob) and dloss/dw_1 > 0 on every row (its smallest), so every Adam
    # update raises w_0 and lowers w_1; the first moves each by lr exactly (m/sqrt(v) =
    # sign(g) at t = 1, eps aside): w_0 >= 1/4 + lr and w_1 <= 1/4 - lr hold by construction.
    assert w[0] >= 0.25 + M.MOICL_LR - 1e-9 and w[1] <= 0.25 - M.MOICL_LR + 1e-9
    # Measured: w = [2.26, -1.76, 0.13, -0.09]; the noise experts' gradients change sign
    # from row to row, so Adam leaves them near the start (bound 0.5; their drift, measured, 0.34 at most).
    assert w[1] < 0  # an anti-expert: the free weights of the authors' scalar MoICL
    assert np.all(np.abs(w[2:] - 0.25) < 0.5)
    test_logp, test_y = experts_case(200, seed=1)
    assert np.array_equal(M.moicl_predict(w, test_logp.transpose(1, 0, 2)).argmax(-1), test_y)


def full_batch_minimiser(logp, y):
    """The minimiser of the mean cross-entropy over all rows (convex in w: z is linear in w)."""
    def loss(w):
        z = np.einsum("e,ren->rn", w, logp)
        lse = np.logaddexp.reduce(z, axis=-1)
        p = np.exp(z - lse[:, None])
        p[np.arange(len(y)), y] -= 1
        return np.mean(lse - z[np.arange(len(y)), y]), np.einsum("rn,ren->e", p, logp) / len(y)

    return scipy.optimize.minimize(loss, np.zeros(logp.shape[1]), jac=True, method="BFGS", tol=1e-12).x


def test_a_planted_mixture_is_recovered():
    """Labels drawn from softmax(sum_e w*_e l_e) of three random experts: the Adam iterate
    lands near the full-batch minimiser of the same loss and that minimiser near w*.
    Adam one row a step does not converge to the minimiser: it wanders about it by
    several lr (measured 0.09 at lr 0.01, 0.016 at lr 0.001 over 5 epochs: bound 0.05 at
    lr 0.001); the minimiser, the MLE over 3,000 rows, is 0.022 from w* (bound 0.1, about
    three of its standard errors)."""
    rng = np.random.default_rng(3)
    R, n, w_star = 3000, 3, np.array([1.5, -0.5, 0.0])
    logp = np.log(rng.dirichlet(np.ones(n) * 0.5, (R, 3)))
    z = np.einsum("e,ren->rn", w_star, logp)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    y = (rng.random(R)[:, None] > np.cumsum(p, -1)).sum(-1)
    w_hat = full_batch_minimiser(logp, y)
    w = M.moicl_fit(logp, None, y, lr=0.001, epochs=5)
    assert np.max(np.abs(w - w_hat)) < 0.05
    assert np.max(np.abs(w_hat - w_star)) < 0.1


def test_an_expert_that_scored_no_row_keeps_its_start():
    """Masked out of every row, expert 3 gets a zero gradient and Adam a zero update
    (0 / (0 + eps)): its weight is 1/E exactly. A row's sum over its |A_j| experts is
    rescaled by E / |A_j|."""
    logp, y = experts_case(40)
    avail = np.ones((40, 4), bool)
    avail[:, 3] = False
    avail[::2, 2] = False
    w = M.moicl_fit(logp, avail, y)
    assert w[3] == 0.25
    z = M._logits(w, logp, avail)  # float32 here (no x64 scope)
    want = np.einsum("e,ren->rn", w, np.where(avail[..., None], logp, 0)) * 4 / avail.sum(-1, keepdims=True)
    np.testing.assert_allclose(np.asarray(z), want, rtol=1e-5, atol=1e-5)


def authors_scalar_training(logits, labels, orders, lr):
    """A NumPy transcription of the authors' scalar-weight loop (``train_tweet_offensive``,
    HongGiwon/Mixture-of-In-context-Learners, utils/train_eval.py), LLM calls replaced by
    the given label logits ``[R, E, 2]``: weights ones(E, 1) / E; per training instance
    ``weighted_sum = sum(weights * logits, 0)``, ``nn.CrossEntropyLoss(weight=len / count)``
    on that one row, ``torch.optim.Adam(lr)`` (betas 0.9, 0.999, eps 1e-8) step; the
    weights after the last epoch (their ``--noeval``)."""
    R, E, _ = logits.shape
    class_w = np.array([R / np.sum(labels == c) for c in (0, 1)])
    w, m, v, t = np.ones((E, 1)) / E, np.zeros((E, 1)), np.zeros((E, 1)), 0
    for r in orders.reshape(-1):
        z = np.sum(w * logits[r], axis=0)
        p = np.exp(z - np.logaddexp.reduce(z))
        # Weighted CE over a batch of one: class_w[y] * nll / class_w[y].
        dz = class_w[labels[r]] * (p - np.eye(2)[labels[r]]) / class_w[labels[r]]
        g = logits[r] @ dz[:, None]
        t += 1
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        denom = np.sqrt(v) / np.sqrt(1 - 0.999 ** t) + 1e-8
        w = w - lr / (1 - 0.9 ** t) * m / denom
    return w[:, 0]


def test_the_authors_training_step_gives_the_same_weights():
    """Same rows, same orders, their raw label logits against our log-probs (each expert
    shifted by its own constant, which softmax and the gradients ignore): the weights
    agree to 1e-12 (measured 2.8e-16, float64 both) and so do the argmax predictions."""
    rng = np.random.default_rng(7)
    R, E, epochs, lr = 48, 6, 5, 0.05
    labels = rng.integers(0, 2, R)
    logits = rng.normal(0, 2, (R, E, 2)) + rng.normal(0, 5, (1, E, 1))
    logits[:, 0] += 1.5 * np.eye(2)[labels]  # one informative expert
    orders = np.stack([rng.permutation(R) for _ in range(epochs)])
    theirs = authors_scalar_training(logits, labels, orders, lr)
    logp = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
    ours = M.moicl_fit(logp, None, labels, lr=lr, epochs=epochs, orders=orders)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-12)
    test = rng.normal(0, 2, (E, 30, 2))
    assert np.array_equal(M.moicl_predict(ours, test).argmax(-1), np.einsum("e,etn->tn", theirs, test).argmax(-1))


def test_bad_inputs_are_refused_naming_the_method():
    logp, y = experts_case(10)
    bad = logp.copy()
    bad[3, 1, 0] = np.nan
    with pytest.raises(ValueError, match="moicl: the training rows hold NaN or infinite"):
        M.moicl_fit(bad, None, y)
    bad[3, 1, 0] = np.inf
    with pytest.raises(ValueError, match="moicl: the training rows hold NaN or infinite"):
        M.moicl_fit(bad, None, y)
    with pytest.raises(ValueError, match=r"moicl: labels must lie in 0\.\.2, got 0\.\.3"):
        M.moicl_fit(logp, None, np.where(y == 2, 3, y))
    with pytest.raises(ValueError, match=r"moicl: labels must lie in 0\.\.2, got -1\.\.2"):
        M.moicl_fit(logp, None, np.where(y == 0, -1, y))
    with pytest.raises(ValueError, match="moicl: the test log-probs hold NaN"):
        M.moicl_predict(np.ones(4), np.full((4, 2, 3), np.nan))
    # m_1 < k: the single demonstrations are not all experts (k = 2 draws one).
    s = SeedScores(base=np.zeros((2, 2)), cc=np.zeros((1, 2)), dc=np.zeros((1, 2)),
                   surrogate={1: (np.zeros((2, 2)), np.array([0, 1]), np.array([1, 0]))},
                   test={1: np.zeros((1, 2, 2))}, y_test=np.array([0, 1]), demo_labels=np.array([0, 1]),
                   surrogate_contexts={1: np.array([[0], [1]])})
    with pytest.raises(ValueError, match="method moicl takes the k = 2 single demonstrations as experts"):
        M.predict(s, None, [1], None)


def test_a_run_with_moicl(tmp_path, monkeypatch):
    """`sc-jax run --methods base,moicl` on random:tiny-llama: a MoICL row whose
    accuracy is the fit of the score file's size-1 rows, recomputed here."""
    from sc_jax.experiment.evaluation.results import load_results
    from sc_jax.experiment.evaluation.store import load_scores

    monkeypatch.setenv("SC_JAX_XLA_CACHE", "")  # keep the session's JAX configuration (cli.main)
    data = tmp_path / "rt.jsonl"
    data.write_text("".join(json.dumps({"text": f"a fine film number {j}", "label": j % 2}) + "\n"
                            for j in range(30)))
    out = tmp_path / "run"
    assert cli.main(["run", "--out", str(out), "--data-file", str(data), "--model", "random:tiny-llama",
                     "--shots", "4", "--seeds", "1", "--test-size", "6", "--max-size", "1", "--m-cap", "4",
                     "--quiet", "--methods", "base,moicl"]) == 0
    (row,) = [r for r in load_results(out).rows if r.method == "moicl"]
    (path,) = (out / "scores").glob("*.npz")
    s = load_scores(path)
    logp, avail, labels = M.moicl_rows(s)
    assert avail.sum() == 4 * 3 and not avail[np.arange(4), np.arange(4)].any()  # each demo under the 3 others
    pred = M.moicl_predict(M.moicl_fit(logp, avail, labels), s.test[1]).argmax(-1)
    assert row.accuracy == pytest.approx(float(np.mean(pred == s.y_test)), abs=1e-12)
