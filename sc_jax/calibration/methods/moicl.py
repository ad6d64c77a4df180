"""MoICL, Mixtures of In-Context Learners (Hong, van Krieken, Ponti, Malkin and
Minervini, ACL 2025, arXiv:2411.02830; code: HongGiwon/Mixture-of-In-context-Learners,
the scalar-weight training of ``train_tweet_offensive`` in ``utils/train_eval.py``).

E experts, each a context of some of the demonstrations; ``l_e(x) = log P(y | x, C_e)``
are expert e's label log-probs. MoICL's scalar weighting, the authors' default without a
hypernetwork, sums the experts' label logits with one free weight each (a weighted
product of experts; a negative weight makes an anti-expert) and is trained by the
cross-entropy of labelled prompts, with Adam, one prompt per step::

    z(x)      = sum_e w_e l_e(x)                          w [E], started at 1/E
    P(y | x)  = softmax_y z(x)
    loss_r    = -log softmax(z(x_r))_{y_r}               one row r per Adam step

(The authors mix the LLM's raw logits at the label tokens; any per-expert shift of
``l_e`` adds ``sum_e w_e c_e`` to every label's z, so log-probs, renormalised or not, give
the same P and the same gradients. Their class-weighted ``CrossEntropyLoss`` on a batch of
one row is the plain cross-entropy: the weighted mean divides the row's weight out.)

**Here** the experts are the k demonstrations one by one (the authors' default of one
demonstration per expert): SC's test-time sub-contexts of size 1, which are the k single
demonstrations whenever ``m_1 = k`` (k >= 3 and ``--m-cap`` >= k). The labelled prompts
are the demonstrations themselves: demonstration j under expert e is SC's surrogate row
of size 1 with context (e) and query j, so MoICL scores nothing of its own. Row j has no
score under its own expert, so its logits sum over the experts A_j that do not hold it,
rescaled to the E experts a test query sums over::

    z_j = (E / |A_j|) sum_{e in A_j} w_e l_e(x_j)        A_j = {e : j not in C_e}

Departures from the paper: the training prompts are the k demonstrations (k rows an
epoch), not a separate training set scored under every expert; each row misses its own
expert (the rescaling above); the experts are single demonstrations, not a choice of
partition sizes; no development set picks the best epoch (the authors' ``--noeval``: the
last weights); the rows are in float64. 5 epochs at learning rate 0.1, the defaults of the
authors' ``run_moicl_classification.py``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from sc_jax.calibration.linc import epoch_orders
from sc_jax.calibration.methods.protocol import Method, register
from sc_jax.calibration.solvers.reference import _on_host

__all__ = ["MOICL_EPOCHS", "MOICL_LR", "METHOD", "moicl_fit", "moicl_predict", "moicl_rows", "moicl_steps"]

# The defaults of the authors' run_moicl_classification.py (--n_epoch 5, --lr 0.1).
MOICL_EPOCHS = 5
MOICL_LR = 0.1


def _logits(w, logp, avail):
    """``[R, n]`` rows' mixed logits: sum over each row's available experts, rescaled to E."""
    E = logp.shape[-2]
    held = jnp.sum(avail, axis=-1, keepdims=True)
    scale = E / jnp.maximum(held, 1)  # a row with no expert stays at z = 0 and gives no gradient
    return scale * jnp.einsum("e,ren->rn", w, jnp.where(avail[..., None], logp, 0.0))


def _row_loss(w, logp, avail, y):
    z = _logits(w, logp[None], avail[None])[0]
    return jax.nn.logsumexp(z) - z[y]


def moicl_steps(w0, logp, avail, labels, steps, lr):
    """Adam over the rows ``steps [S]``, one row a step (pure; jit-able).

    Args:
      w0: ``[E]`` the start.
      logp: ``[R, E, n]`` each row's label log-probs under each expert (any finite value
        where ``avail`` is False).
      avail: ``[R, E]`` bool, whether row r was scored under expert e.
      labels: ``[R]`` int, the rows' gold labels.
      steps: ``[S]`` int, the row of each step.
      lr: Adam's learning rate (betas 0.9, 0.999, eps 1e-8: torch's and optax's defaults).

    Returns:
      ``[E]`` the weights after the S steps.
    """
    opt = optax.adam(lr)

    def step(carry, r):
        w, state = carry
        grads = jax.grad(_row_loss)(w, logp[r], avail[r], labels[r])
        updates, state = opt.update(grads, state, w)
        return (optax.apply_updates(w, updates), state), None

    (w, _), _ = jax.lax.scan(step, (w0, opt.init(w0)), steps)
    return w


_steps_jit = jax.jit(moicl_steps)


def _check(name: str, logp: np.ndarray, avail: np.ndarray, labels: np.ndarray) -> None:
    if logp.ndim != 3 or avail.shape != logp.shape[:2] or labels.shape != logp.shape[:1]:
        raise ValueError(f"moicl: {name} must be [R, E, n] with avail [R, E] and labels [R], got shapes "
                         f"{logp.shape}, {avail.shape} and {labels.shape}")
    if not np.isfinite(logp[avail]).all():
        raise ValueError(f"moicl: the {name} hold NaN or infinite log-probs; check the model's scores "
                         "(--dtype float32)")
    n = logp.shape[-1]
    if labels.size and (labels.min() < 0 or labels.max() >= n):
        raise ValueError(f"moicl: labels must lie in 0..{n - 1}, got {labels.min()}..{labels.max()}")


def moicl_fit(logp, avail, labels, *, lr: float = MOICL_LR, epochs: int = MOICL_EPOCHS, seed: int = 0,
              orders=None) -> np.ndarray:
    """MoICL's expert weights fitted on labelled rows (module docstring).

    Args:
      logp: ``[R, E, n]`` label log-probs of R labelled prompts under E experts.
      avail: ``[R, E]`` bool, which experts scored each row (None: all).
      labels: ``[R]`` gold labels in 0..n-1.
      lr, epochs: Adam's step size and the passes over the rows.
      seed: the seed of the row orders (:func:`sc_jax.calibration.linc.epoch_orders`).
      orders: ``[epochs, R]`` row orders to use instead (another implementation's).

    Returns:
      ``[E]`` float64 weights w (started at 1/E).

    Raises:
      ValueError: non-finite scores, labels outside 0..n-1, bad shapes or settings.
    """
    logp = np.asarray(logp, np.float64)
    avail = np.ones(logp.shape[:2], bool) if avail is None else np.asarray(avail, bool)
    labels = np.asarray(labels)
    _check("training rows", logp, avail, labels)
    R, E, _ = logp.shape
    if R == 0 or E == 0 or epochs < 1 or not lr > 0:
        raise ValueError(f"moicl needs rows, experts, epochs >= 1 and lr > 0, got R = {R}, E = {E}, "
                         f"epochs = {epochs}, lr = {lr}")
    steps = epoch_orders(R, epochs, seed) if orders is None else np.asarray(orders)
    if steps.shape != (epochs, R):
        raise ValueError(f"moicl: orders must be [epochs, R] = [{epochs}, {R}], got {steps.shape}")
    with jax.enable_x64(True), _on_host():
        w = _steps_jit(jnp.full(E, 1.0 / E), jnp.asarray(np.where(avail[..., None], logp, 0.0)),
                       jnp.asarray(avail), jnp.asarray(labels, jnp.int32),
                       jnp.asarray(steps.reshape(-1), jnp.int32), jnp.asarray(lr, jnp.float64))
        return np.asarray(w)


def moicl_predict(w, logp) -> np.ndarray:
    """``[T, n]`` softmax_y sum_e w_e l_e(x) of ``logp [E, T, n]`` (every expert scored
    every test query)."""
    logp = np.asarray(logp, np.float64)
    w = np.asarray(w, np.float64)
    if logp.ndim != 3 or logp.shape[0] != len(w):
        raise ValueError(f"moicl: test log-probs must be [E = {len(w)}, T, n], got {logp.shape}")
    if not np.isfinite(logp).all():
        raise ValueError("moicl: the test log-probs hold NaN or infinite values; check the model's scores")
    z = np.einsum("e,etn->tn", w, logp)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def moicl_rows(s) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The seed's training rows ``(logp [k, k, n], avail [k, k], labels [k])``: row j is
    demonstration j, expert e the single demonstration e, from the surrogate rows of size 1.
    ValueError where the scores hold no size-1 data or ``m_1 < k``."""
    if s.demo_labels is None or s.surrogate_contexts is None or 1 not in s.surrogate or 1 not in s.test:
        raise ValueError("method moicl needs the surrogate and test-time scores of size 1 with their "
                         "contexts (score files written before them lack these): rerun `sc-jax run` "
                         "with moicl in --methods")
    k = len(s.demo_labels)
    if len(s.test[1]) != k:
        raise ValueError(f"method moicl takes the k = {k} single demonstrations as experts, but these scores "
                         f"hold {len(s.test[1])} test-time sub-contexts of size 1: use k >= 3 and "
                         f"--m-cap >= {k}")
    logp, _, queries = s.surrogate[1]
    experts = np.asarray(s.surrogate_contexts[1])[:, 0]
    rows = np.zeros((k, k, logp.shape[-1]))
    avail = np.zeros((k, k), bool)
    rows[queries, experts] = logp
    avail[queries, experts] = True
    return rows, avail, np.asarray(s.demo_labels)


def predict(s, fits, sizes, options) -> np.ndarray:
    logp, avail, labels = moicl_rows(s)
    return moicl_predict(moicl_fit(logp, avail, labels), s.test[1])


def _available(s, run_methods) -> bool:
    # Opt-in: recomputed from a run's score files only for a run that asked for it.
    return ("moicl" in run_methods and s.surrogate_contexts is not None and s.demo_labels is not None
            and 1 in s.test and len(s.test[1]) == len(s.demo_labels))


METHOD = register(Method("moicl", "MoICL", "#c49c94", predict, needs={"surrogate", "test"}, opt_in=True,
                         added=True, available=_available, doc=__doc__))
