"""Surprise Calibration (Tan et al., EMNLP 2025, arXiv:2506.12796), as the authors'
released code computes it (yan-muzhou/Surprise-Calibration, ``SC.ipynb``).

A recurrent network reads the context's demonstrations in order, one surprise vector
``s_t`` per demonstration, and outputs the log class prior of that context; the query's
label log-probs are calibrated by subtracting it:

    s_t[c]    = +1 if c == y_t else -1                       (t = 1..i, c = 1..n)
    h_t       = GRU(LayerNorm(W_in s_t + b_in), h_{t-1}),    h_0 = 0
    g(s)      = W_out h_i + b_out                            (log prior, [n])
    P_SC(y|x) = softmax_y( log P(y | x, C) - g(s) )

The released code's surprise vector is the signed one-hot of the demonstration's gold
label (``multiclass_pointwise_surprise`` with ``surprise_true = 1``): it does not read
the model's probabilities at the demonstrations' label positions. The log form
``-log p_t(y_t)`` / ``log(1 - p_t(c))`` is commented out there and is not implemented
here (docs/methods.md says why). The network is trained on labelled (context, query)
pairs by cross-entropy of ``P_SC`` against the query's label, with torch's Adam (L2
weight decay added to the gradient), full batch. Defaults are the released code's:
embedding 768, hidden 1024, 200 epochs, learning rate 1e-4, weight decay 0.01.

Pure functions of arrays: :func:`sign_surprise`, :func:`init_params`,
:func:`prior_logits`, :func:`calibrated_logits`, :func:`fit` and :func:`surprise_probs`.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["SurpriseSettings", "calibrated_logits", "fit", "init_params", "prior_logits",
           "sign_surprise", "surprise_probs"]

LN_EPS = 1e-5  # torch.nn.LayerNorm's default
ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8  # torch.optim.Adam's default


@dataclasses.dataclass(frozen=True)
class SurpriseSettings:
    """The network and its training (defaults: the authors' released code)."""

    embed_dim: int = 768
    hidden_dim: int = 1024
    epochs: int = 200
    learning_rate: float = 1e-4
    weight_decay: float = 0.01
    seed: int = 0

    def __post_init__(self):
        if min(self.embed_dim, self.hidden_dim, self.epochs) < 1:
            raise ValueError("SurpriseSettings: embed_dim, hidden_dim and epochs must be >= 1")


def sign_surprise(labels: np.ndarray, n: int) -> np.ndarray:
    """Surprise vectors of demonstrations with gold ``labels`` ``[..., i]``:
    ``[..., i, n]`` float32, +1 at the gold class and -1 elsewhere."""
    onehot = np.eye(n, dtype=np.float32)[np.asarray(labels, np.int64)]
    return 2.0 * onehot - 1.0


def _uniform(key, shape, fan_in):
    # torch.nn.Linear's default initialisation: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
    bound = 1.0 / np.sqrt(fan_in)
    return jax.random.uniform(key, shape, jnp.float32, -bound, bound)


def init_params(key, n: int, embed_dim: int, hidden_dim: int) -> dict:
    """Parameters as the released ``GRUModel`` initialises them: torch's default for
    the two linear maps, orthogonal GRU weight matrices (``[3H, E]`` and ``[3H, H]``,
    gates ordered r, z, n as torch's), zero GRU biases, LayerNorm at identity."""
    k = jax.random.split(key, 6)
    ortho = jax.nn.initializers.orthogonal()
    E, H = embed_dim, hidden_dim
    return {"w_in": _uniform(k[0], (E, n), n), "b_in": _uniform(k[1], (E,), n),
            "ln_scale": jnp.ones(E, jnp.float32), "ln_bias": jnp.zeros(E, jnp.float32),
            "w_ih": ortho(k[2], (3 * H, E), jnp.float32), "w_hh": ortho(k[3], (3 * H, H), jnp.float32),
            "b_ih": jnp.zeros(3 * H, jnp.float32), "b_hh": jnp.zeros(3 * H, jnp.float32),
            "w_out": _uniform(k[4], (n, H), H), "b_out": _uniform(k[5], (n,), H)}


def prior_logits(params: dict, s: jax.Array) -> jax.Array:
    """``g(s)``: the log class prior ``[B, n]`` of contexts with surprise sequences
    ``s`` ``[B, i, n]`` (i >= 1), the GRU's last hidden state through the output map."""
    x = jnp.einsum("bin,en->bie", s, params["w_in"]) + params["b_in"]  # [B, i, E]
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    x = (x - mu) / jnp.sqrt(var + LN_EPS) * params["ln_scale"] + params["ln_bias"]
    gx = jnp.einsum("bie,ge->big", x, params["w_ih"]) + params["b_ih"]  # [B, i, 3H]
    H = params["w_hh"].shape[1]

    def step(h, gx_t):  # torch.nn.GRU's cell: r, z, n
        gh = h @ params["w_hh"].T + params["b_hh"]  # [B, 3H]
        r = jax.nn.sigmoid(gx_t[:, :H] + gh[:, :H])
        z = jax.nn.sigmoid(gx_t[:, H:2 * H] + gh[:, H:2 * H])
        c = jnp.tanh(gx_t[:, 2 * H:] + r * gh[:, 2 * H:])
        return (1.0 - z) * c + z * h, None

    h, _ = jax.lax.scan(step, jnp.zeros((s.shape[0], H), gx.dtype), jnp.swapaxes(gx, 0, 1))
    return h @ params["w_out"].T + params["b_out"]  # [B, n]


def calibrated_logits(params: dict, s: jax.Array, logp: jax.Array) -> jax.Array:
    """``log P(y | x, C) - g(s)`` ``[B, n]`` for queries' label log-probs ``logp``
    ``[B, n]`` under contexts with surprise sequences ``s`` ``[B, i, n]``."""
    return logp - prior_logits(params, s)


def _loss(params, groups):
    """Mean cross-entropy over every row of every group (one group per context length)."""
    total = sum(len(y) for _, _, y in groups)
    nll = 0.0
    for s, logp, y in groups:
        z = calibrated_logits(params, s, logp)
        nll = nll + (jax.nn.logsumexp(z, -1) - jnp.take_along_axis(z, y[:, None], -1)[:, 0]).sum()
    return nll / total


@jax.jit
def _train(params, groups, lr, wd, epochs):
    """``epochs`` full-batch steps of torch's Adam (L2 ``wd`` added to the gradient)."""
    b1, b2 = ADAM_BETAS
    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)

    def body(t, state):
        p, m, v = state
        g = jax.grad(_loss)(p, groups)
        g = jax.tree_util.tree_map(lambda gi, pi: gi + wd * pi, g, p)
        m = jax.tree_util.tree_map(lambda mi, gi: b1 * mi + (1 - b1) * gi, m, g)
        v = jax.tree_util.tree_map(lambda vi, gi: b2 * vi + (1 - b2) * gi * gi, v, g)
        step = t + 1.0
        c1, c2 = 1 - b1 ** step, 1 - b2 ** step
        p = jax.tree_util.tree_map(
            lambda pi, mi, vi: pi - lr * (mi / c1) / (jnp.sqrt(vi / c2) + ADAM_EPS), p, m, v)
        return p, m, v

    return jax.lax.fori_loop(0, epochs, body, (params, zeros, zeros))[0]


def fit(groups: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], n: int,
        settings: SurpriseSettings = SurpriseSettings(), params: dict | None = None) -> dict:
    """Train the network on labelled (context, query) rows: ``groups`` of
    ``(s [N_i, i, n], logp [N_i, n], y [N_i])``, one per context length i (rows of
    several lengths share one full batch). ``params``: the starting point (None: a
    fresh :func:`init_params` from ``settings.seed``). Returns the trained params."""
    groups = [(jnp.asarray(s, jnp.float32), jnp.asarray(lp, jnp.float32), jnp.asarray(y, jnp.int32))
              for s, lp, y in groups if len(y)]
    if not groups:
        raise ValueError("Surprise Calibration needs labelled rows to train on (surrogate "
                         "data of at least one size): use k >= 2")
    if params is None:
        params = init_params(jax.random.PRNGKey(settings.seed), n, settings.embed_dim,
                             settings.hidden_dim)
    return _train(params, tuple(groups), jnp.float32(settings.learning_rate),
                  jnp.float32(settings.weight_decay), settings.epochs)


def _check_inputs(test_logp, test_labels, train, n: int) -> None:
    """ValueError, naming the method, for what the paper's methods refuse too: scores
    that are NaN or infinite (log-probs may be -inf only where a label has probability
    0, never +inf or NaN) and labels outside 0..n-1."""
    def scores(x, what):
        x = np.asarray(x, np.float64)
        if x.ndim < 1 or x.shape[-1] != n or np.isnan(x).any() or np.isposinf(x).any():
            raise ValueError(f"Surprise Calibration: {what} must be [..., {n}] label log-probs without "
                             f"NaN or +inf, got shape {x.shape}")

    def labels(y, what):
        y = np.asarray(y)
        if y.size and (not np.issubdtype(y.dtype, np.integer) or y.min() < 0 or y.max() >= n):
            raise ValueError(f"Surprise Calibration: {what} must be class ids in 0..{n - 1}, got "
                             f"{np.unique(y).tolist()[:8]}")

    scores(test_logp, "the test scores")
    labels(test_labels, "the demonstrations' labels")
    for c, lp, y in train:
        scores(lp, "the surrogate scores")
        labels(c, "the surrogate contexts' labels")
        labels(y, "the surrogate rows' labels")


def surprise_probs(test_logp: np.ndarray, test_labels: np.ndarray,
                   train: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], n: int,
                   settings: SurpriseSettings = SurpriseSettings()) -> np.ndarray:
    """Surprise Calibration's ``[T, n]`` test probabilities.

    ``test_logp`` ``[T, n]``: the test queries' label log-probs under the k-shot
    context, whose demonstrations have gold labels ``test_labels`` ``[k]`` in prompt
    order; ``train``: the labelled rows ``(context labels [N_i, i], logp [N_i, n],
    query labels [N_i])`` the network learns from, one group per context size i."""
    _check_inputs(test_logp, test_labels, train, n)
    groups = [(sign_surprise(c, n), lp, y) for c, lp, y in train]
    params = fit(groups, n, settings)
    # Every test query shares the one k-shot context, hence one prior.
    g = np.asarray(prior_logits(params, jnp.asarray(sign_surprise(np.asarray(test_labels)[None], n))),
                   np.float64)  # [1, n]
    z = np.asarray(test_logp, np.float64) - g
    z = z - z.max(-1, keepdims=True)
    return np.exp(z) / np.exp(z).sum(-1, keepdims=True)
