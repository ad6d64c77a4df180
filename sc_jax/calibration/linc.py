"""Linear probe calibration, LinC (Abbas et al., AISTATS 2024, "Enhancing In-context
Learning via Linear Probe Calibration"; code: mominabbass/LinC).

LinC learns a full affine map of the label probabilities, read as logits::

    z(x)     = W p(x) + b                     W [n, n], b [n]; p(x) = P(y | x, C) [n]
    LinC(x)  = softmax_y z(x),  prediction argmax_y z(x)

fitted by minimising the cross-entropy -log softmax(z(x_r))_{y_r} over labelled
prompts r with plain stochastic gradient descent, one prompt per step, the rows in a
fresh random order every epoch. The start is contextual calibration: W = diag(1 /
p_cf), b = 0, with p_cf the mean label probabilities of the content-free inputs
("N/A", "", "[MASK]") under the same context, renormalised. Those choices (SGD without
momentum, batch size 1, the CC start, a step skipped where its gradient is not finite)
are the authors' code's; its example commands use 15 to 100 epochs and learning rates
tuned per task and model, from 3e-4 to 1.35; :data:`LINC_EPOCHS` and :data:`LINC_LR`
are those of the command in its README.

The fit runs in float64 under a local ``jax.enable_x64`` scope, as one
``jax.lax.scan`` over the SGD steps (compiled once per shape).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from sc_jax.calibration.baselines import _probs, base
from sc_jax.calibration.solvers.reference import _on_host

__all__ = ["LINC_EPOCHS", "LINC_LR", "LinC", "epoch_orders", "linc_fit", "linc_init",
           "linc_predict"]

# The README command of the authors' code (SST-2, GPT-J): --epochs=15 --lr=0.015.
LINC_EPOCHS = 15
LINC_LR = 0.015


class LinC(NamedTuple):
    """A fitted LinC map: ``w [n, n]``, ``b [n]``; z = w p + b."""

    w: np.ndarray
    b: np.ndarray


def linc_init(content_free_probs) -> LinC:
    """The start W = diag(1 / p_cf), b = 0, from ``content_free_probs [S, n]`` (the label
    probabilities of the S content-free inputs; p_cf is their mean, renormalised, as the
    authors' code averages the unnormalised label probabilities and then normalises)."""
    cf = _probs(content_free_probs, "content_free_probs")
    if cf.ndim != 2:
        raise ValueError(f"content_free_probs must be [S, n], got shape {cf.shape}")
    p_cf = cf.mean(axis=0)
    if not p_cf.sum() > 0:  # W = diag(1 / p_cf) of 0 / 0: NaN predictions
        raise ValueError("LinC: the content-free inputs' label probabilities are all 0, so there is no "
                         "prior to start from; check the model's scores of the content-free inputs")
    p_cf = p_cf / p_cf.sum()
    return LinC(np.diag(1.0 / np.maximum(p_cf, np.finfo(np.float64).tiny)), np.zeros(len(p_cf)))


def epoch_orders(num_rows: int, epochs: int, seed: int = 0) -> np.ndarray:
    """``[epochs, num_rows]`` the order in which each epoch visits the rows: a fresh
    uniform permutation per epoch, deterministic given ``seed``."""
    rng = np.random.default_rng(seed)
    return np.stack([rng.permutation(num_rows) for _ in range(epochs)]).reshape(epochs, num_rows)


def _loss(params, x, y):
    w, b = params
    z = w @ x + b
    return jax.nn.logsumexp(z) - z[y]


@jax.jit
def _sgd(w0, b0, x, y, steps, lr):
    """Plain SGD over the rows ``steps [S]`` of ``x [N, n]``, ``y [N]``: one row a step."""
    opt = optax.sgd(lr)

    def step(carry, r):
        params, state = carry
        grads = jax.grad(_loss)(params, x[r], y[r])
        finite = jnp.all(jnp.isfinite(grads[0])) & jnp.all(jnp.isfinite(grads[1]))
        updates, state = opt.update(grads, state, params)
        # The authors' loop skips a step whose gradient holds a NaN.
        updates = jax.tree_util.tree_map(lambda u: jnp.where(finite, u, 0.0), updates)
        return (optax.apply_updates(params, updates), state), None

    params = (w0, b0)
    (params, _), _ = jax.lax.scan(step, (params, opt.init(params)), steps)
    return params


def linc_fit(probs, labels, content_free_probs, *, lr: float = LINC_LR,
             epochs: int = LINC_EPOCHS, seed: int = 0, orders=None) -> LinC:
    """Fit LinC's W, b on labelled prompts.

    Args:
      probs: ``[N, n]`` label probabilities of the training prompts (renormalised over
        the labels here).
      labels: ``[N]`` their gold labels in [0, n).
      content_free_probs: ``[S, n]`` the content-free inputs' label probabilities, for
        the start (:func:`linc_init`).
      lr, epochs: SGD's step size and number of passes over the rows.
      seed: the seed of the row orders (:func:`epoch_orders`).
      orders: ``[epochs, N]`` the row orders to use instead (e.g. another
        implementation's, to compare step by step).

    Returns:
      The :class:`LinC` map after ``epochs * N`` steps.
    """
    p = base(_probs(probs, "probs"))
    y = np.asarray(labels)
    if p.ndim != 2 or y.shape != p.shape[:1]:
        raise ValueError(f"probs must be [N, n] and labels [N], got shapes {p.shape} and {y.shape}")
    if len(p) == 0 or epochs < 1 or not lr > 0:
        raise ValueError(f"LinC needs rows, epochs >= 1 and lr > 0, got N = {len(p)}, "
                         f"epochs = {epochs}, lr = {lr}")
    if y.min() < 0 or y.max() >= p.shape[1]:
        raise ValueError(f"labels must lie in [0, {p.shape[1]}), got {y.min()}..{y.max()}")
    start = linc_init(content_free_probs)
    if start.b.shape != p.shape[1:]:
        raise ValueError(f"content_free_probs has {len(start.b)} labels, probs {p.shape[1]}")
    steps = epoch_orders(len(p), epochs, seed) if orders is None else np.asarray(orders)
    if steps.shape != (epochs, len(p)):
        raise ValueError(f"orders must be [epochs, N] = [{epochs}, {len(p)}], got {steps.shape}")
    with jax.enable_x64(True), _on_host():
        w, b = _sgd(jnp.asarray(start.w), jnp.asarray(start.b), jnp.asarray(p),
                    jnp.asarray(y, jnp.int32), jnp.asarray(steps.reshape(-1), jnp.int32),
                    jnp.asarray(lr, jnp.float64))
        return LinC(np.asarray(w), np.asarray(b))


def linc_predict(fit: LinC, probs) -> np.ndarray:
    """softmax_y(W p + b) of ``probs [..., T, n]`` (renormalised over the labels first):
    ``[..., T, n]``."""
    p = base(_probs(probs, "probs"))
    z = p @ np.asarray(fit.w).T + np.asarray(fit.b)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)
