"""Surprise Calibration (sc_jax.calibration.surprise): the network against torch's
modules with the same weights (float32, max |difference| <= 1e-5 on O(1) values), its
training against torch's Adam step for step, and on synthetic data whose prior shift
is known exactly, the shift recovered."""

import itertools

import numpy as np
import pytest

import jax.numpy as jnp

from sc_jax.calibration import surprise as S

torch = pytest.importorskip("torch")

N_CLASSES, EMBED, HIDDEN = 3, 7, 11  # odd sizes so that a transposed weight shows


def _torch_net(seed=0):
    """The released code's network: Linear, LayerNorm, GRU (orthogonal weights, zero
    biases), Linear on the last hidden state."""
    torch.manual_seed(seed)
    net = torch.nn.ModuleDict({"inp": torch.nn.Linear(N_CLASSES, EMBED), "ln": torch.nn.LayerNorm(EMBED),
                               "gru": torch.nn.GRU(EMBED, HIDDEN, batch_first=True),
                               "out": torch.nn.Linear(HIDDEN, N_CLASSES)})
    for name, p in net["gru"].named_parameters():
        (torch.nn.init.orthogonal_ if "weight" in name else torch.nn.init.zeros_)(p.data)
    with torch.no_grad():  # LayerNorm off identity, so that its affine map is checked
        net["ln"].weight.uniform_(0.5, 1.5)
        net["ln"].bias.uniform_(-0.5, 0.5)
    return net


def _torch_calibrated(net, s, logp):
    h, _ = net["gru"](net["ln"](net["inp"](s)))
    return logp - net["out"](h[:, -1])


def _params_of(net) -> dict:
    g = {k: v.detach().numpy() for k, v in net["gru"].named_parameters()}
    return {"w_in": jnp.asarray(net["inp"].weight.detach().numpy()),
            "b_in": jnp.asarray(net["inp"].bias.detach().numpy()),
            "ln_scale": jnp.asarray(net["ln"].weight.detach().numpy()),
            "ln_bias": jnp.asarray(net["ln"].bias.detach().numpy()),
            "w_ih": jnp.asarray(g["weight_ih_l0"]), "w_hh": jnp.asarray(g["weight_hh_l0"]),
            "b_ih": jnp.asarray(g["bias_ih_l0"]), "b_hh": jnp.asarray(g["bias_hh_l0"]),
            "w_out": jnp.asarray(net["out"].weight.detach().numpy()),
            "b_out": jnp.asarray(net["out"].bias.detach().numpy())}


def _groups(rng, lengths=(2, 4), rows=9):
    out = []
    for i in lengths:
        labels = rng.integers(0, N_CLASSES, (rows, i))
        logp = rng.normal(size=(rows, N_CLASSES)).astype(np.float32)
        logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
        out.append((S.sign_surprise(labels, N_CLASSES), logp, rng.integers(0, N_CLASSES, rows)))
    return out


def test_sign_surprise_is_plus_one_at_the_gold_label_minus_one_elsewhere():
    s = S.sign_surprise(np.array([[2, 0]]), 3)
    np.testing.assert_array_equal(s, [[[-1, -1, 1], [1, -1, -1]]])


def test_network_equals_torch_modules():
    net = _torch_net()
    s, logp, _ = _groups(np.random.default_rng(1), lengths=(5,))[0]
    want = _torch_calibrated(net, torch.tensor(s), torch.tensor(logp)).detach().numpy()
    got = np.asarray(S.calibrated_logits(_params_of(net), jnp.asarray(s), jnp.asarray(logp)))
    assert np.abs(got - want).max() <= 1e-5


def test_training_equals_torch_adam_with_l2_weight_decay(exact_rows):
    """Five full-batch steps over rows of two context lengths (mean cross-entropy over
    all rows), torch.optim.Adam(lr, weight_decay) as the released code trains."""
    net = _torch_net(seed=3)
    params = _params_of(net)
    groups = _signed(exact_rows)
    lr, wd, steps = 0.05, 0.01, 5
    opt = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=wd)
    total = sum(len(y) for *_, y in groups)
    for _ in range(steps):
        opt.zero_grad()
        loss = sum(torch.nn.functional.cross_entropy(
            _torch_calibrated(net, torch.tensor(s), torch.tensor(lp)), torch.tensor(y),
            reduction="sum") for s, lp, y in groups) / total
        loss.backward()
        opt.step()
    settings = S.SurpriseSettings(embed_dim=EMBED, hidden_dim=HIDDEN, epochs=steps,
                                  learning_rate=lr, weight_decay=wd)
    got = S.fit(groups, N_CLASSES, settings, params=params)
    want = _params_of(net)
    # Adam's step is ~lr per coordinate, so float32 rounding in the gradients moves a
    # parameter by far less than 1e-4 over five steps.
    err = max(float(np.abs(np.asarray(got[k]) - np.asarray(want[k])).max()) for k in want)
    assert err <= 1e-4, err


SHIFT = 0.8


@pytest.fixture(scope="module")
def exact_rows():
    """Every context of one or two demonstrations, and per context queries whose
    calibrated distribution is each ordering of (0.5, 0.3, 0.2), labelled in exactly
    those proportions (ten rows per query); the model's log-probs are shifted by
    SHIFT * (how often each class labels the context). Per length: (context labels
    [N_i, i], logp [N_i, n] float32, labels [N_i]). Every test here trains on these
    rows, so that they share one compilation of the training loop."""
    dists = np.array(list(itertools.permutations([0.5, 0.3, 0.2])))
    rows = []
    for i in (1, 2):
        ctx, logp, y = [], [], []
        for c in itertools.product(range(N_CLASSES), repeat=i):
            shifted = np.log(dists) + SHIFT * np.eye(N_CLASSES)[list(c)].sum(0)  # [6, n]
            shifted -= np.log(np.exp(shifted).sum(-1, keepdims=True))
            for p, lp in zip(dists, shifted):
                for label, times in enumerate(np.rint(10 * p).astype(int)):
                    ctx += [c] * times
                    logp += [lp] * times
                    y += [label] * times
        rows.append((np.array(ctx), np.float32(logp), np.array(y)))
    return rows


def _signed(rows):
    return [(S.sign_surprise(c, N_CLASSES), lp, y) for c, lp, y in rows]


def test_training_recovers_a_known_prior_shift(exact_rows):
    """On :func:`exact_rows` the mean cross-entropy is minimised exactly by
    g(s) = SHIFT * counts + const, and the trained network must find it: centred over
    classes, within 1e-3 of the shift (it reaches ~1e-6)."""
    settings = S.SurpriseSettings(embed_dim=EMBED, hidden_dim=HIDDEN, epochs=300,
                                  learning_rate=3e-2, weight_decay=0.0)
    params = S.fit(_signed(exact_rows), N_CLASSES, settings)
    for i in (1, 2):
        ctx = np.array(list(itertools.product(range(N_CLASSES), repeat=i)))
        g = np.asarray(S.prior_logits(params, jnp.asarray(S.sign_surprise(ctx, N_CLASSES))))
        want = SHIFT * np.eye(N_CLASSES)[ctx].sum(1)
        err = np.abs((g - g.mean(-1, keepdims=True)) - (want - want.mean(-1, keepdims=True))).max()
        assert err <= 1e-3, (i, err)


def test_surprise_probs_divides_by_the_k_shot_contexts_prior(exact_rows):
    rng = np.random.default_rng(4)
    settings = S.SurpriseSettings(embed_dim=EMBED, hidden_dim=HIDDEN, epochs=3)
    test_logp = np.log(rng.dirichlet(np.ones(N_CLASSES), 4))
    p = S.surprise_probs(test_logp, np.array([0, 2, 1]), exact_rows, N_CLASSES, settings)
    params = S.fit(_signed(exact_rows), N_CLASSES, settings)
    g = np.asarray(S.prior_logits(params, jnp.asarray(S.sign_surprise(np.array([[0, 2, 1]]), N_CLASSES))))
    want = np.exp(test_logp - g) / np.exp(test_logp - g).sum(-1, keepdims=True)
    np.testing.assert_allclose(p, want, atol=1e-6)
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-12)


def test_no_training_rows_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^Surprise Calibration needs labelled rows"):
        S.fit([], N_CLASSES)
