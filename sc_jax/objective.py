"""The Supervised Calibration objective for one context size (paper Eq. final_opt_problem).

For one context size i the surrogate data are N rows: log-odds features X ``[N, n-1]``
(``X[:, c-1] = m_c = log p_c / p_0``, class 0 is the reference), labels y ``[N]`` and
query ids g ``[N]`` (which held-out demonstration each row queried). The parameters
theta = (b, w), each ``[n-1]``, give calibrated logits

    L_0 = 0,    L_c = w_c X_c + b_c    (c = 1..n-1),    P = softmax(L)

and the problem is

    min_theta  mean-NLL(theta) + lambda_inv * InvPenalty(theta)
    s.t.       (1/(n-1)) sum_c w_c / ||(b_c, w_c)|| >= tau.

Two departures from the paper's sums, both deliberate:

* The NLL is the *mean* over rows, not the sum.
* InvPenalty is the *mean* over all unordered pairs of rows that share a query id of
  the symmetric cross-entropy -(P_a . log P_b + P_b . log P_a), not the sum. The
  reference code's summed, unnormalised penalty swamped the NLL and collapsed its
  predictions; with means, lambda_inv weighs two terms of the same scale. Scaling the
  objective does not move the optimum of the NLL-only problem, so lambda_inv = 0
  problems are exactly the paper's.

Everything here is a pure function of a :class:`Params` pytree and a :class:`Problem`
pytree, padded to a common N with a row mask so that batches of problems can be
``vmap``-ped.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

Array = jax.Array


class Params(NamedTuple):
    """Affine-logit calibration parameters (paper Eq. affine_logit_model_formal).

    b: ``[n-1]`` intercepts b_c.   w: ``[n-1]`` slopes w_c.
    The identity map (the base model) is b = 0, w = 1.
    """

    b: Array
    w: Array


def identity_params(num_classes: int, dtype=jnp.float32) -> Params:
    """b = 0, w = 1: the base model, feasible for every tau in [-1, 1]."""
    return Params(jnp.zeros(num_classes - 1, dtype), jnp.ones(num_classes - 1, dtype))


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["features", "labels", "query_ids", "mask"],
    meta_fields=["num_queries"],
)
@dataclasses.dataclass(frozen=True)
class Problem:
    """Surrogate data of one context size, padded to N rows.

    features:  ``[N, n-1]`` float, log-odds against class 0.
    labels:    ``[N]`` int32 in [0, n).
    query_ids: ``[N]`` int32 in [0, num_queries).
    mask:      ``[N]`` float, 1 for real rows and 0 for padding.
    num_queries: static number of query-id segments (a bound; empty segments are fine).

    A batch of problems has a leading axis ``[B, ...]`` on every array field and one
    shared static ``num_queries``.
    """

    features: Array
    labels: Array
    query_ids: Array
    mask: Array
    num_queries: int

    @property
    def num_classes(self) -> int:
        return self.features.shape[-1] + 1


def calibrated_logits(params: Params, features: Array) -> Array:
    """``[..., n-1]`` log-odds -> ``[..., n]`` calibrated logits, class 0 pinned at 0."""
    z = features * params.w + params.b  # [..., n-1]
    return jnp.concatenate([jnp.zeros_like(z[..., :1]), z], axis=-1)


def calibrated_log_probs(params: Params, features: Array) -> Array:
    """log f(m; theta): ``[..., n-1]`` -> ``[..., n]`` log-probabilities."""
    return jax.nn.log_softmax(calibrated_logits(params, features), axis=-1)


def _num_rows(mask: Array) -> Array:
    # max(.., 1) keeps an all-padding instance (a batch filler) finite: its loss is 0.
    return jnp.maximum(jnp.sum(mask), 1.0)


def mean_nll(params: Params, problem: Problem, log_probs: Array | None = None) -> Array:
    """Mean negative log-likelihood over the unmasked rows (paper Eq. mle_external / N)."""
    if log_probs is None:
        log_probs = calibrated_log_probs(params, problem.features)  # [N, n]
    ll = jnp.take_along_axis(log_probs, problem.labels[:, None], axis=-1)[:, 0]  # [N]
    return -jnp.sum(problem.mask * ll) / _num_rows(problem.mask)


def invariance_penalty(params: Params, problem: Problem,
                       log_probs: Array | None = None) -> Array:
    """Mean symmetric cross-entropy over unordered pairs of rows sharing a query id.

    Paper Eq. total_inv_penalty_def divided by the number of pairs. For the M rows of
    one query, sum_{a<b} H(P_a, P_b) = -[(sum_a P_a) . (sum_b log P_b) - sum_a P_a . log P_a],
    so per-query segment sums give the whole penalty in O(N) without enumerating
    pairs. Zero when no query has two rows.
    """
    if log_probs is None:
        log_probs = calibrated_log_probs(params, problem.features)  # [N, n]
    mask = problem.mask
    probs = jnp.exp(log_probs) * mask[:, None]  # [N, n], padding rows zeroed
    masked_log_probs = log_probs * mask[:, None]  # [N, n]
    seg = functools.partial(jax.ops.segment_sum, segment_ids=problem.query_ids,
                            num_segments=problem.num_queries)
    sum_p = seg(probs)  # [G, n]
    sum_logp = seg(masked_log_probs)  # [G, n]
    counts = seg(mask)  # [G]
    self_terms = jnp.sum(probs * log_probs)  # sum over rows of P_a . log P_a
    pair_sum = -(jnp.sum(sum_p * sum_logp) - self_terms)
    num_pairs = jnp.sum(counts * (counts - 1.0)) / 2.0
    return jnp.where(num_pairs > 0, pair_sum / jnp.maximum(num_pairs, 1.0), 0.0)


def objective(params: Params, problem: Problem, lambda_inv: Array) -> Array:
    """mean-NLL + lambda_inv * InvPenalty: the objective of Eq. final_opt_problem (means)."""
    log_probs = calibrated_log_probs(params, problem.features)
    nll = mean_nll(params, problem, log_probs)
    return nll + lambda_inv * invariance_penalty(params, problem, log_probs)


# Smoothing radius of the cosine's norm, sqrt(b^2 + w^2 + eps^2). The exact cosine
# is homogeneous of degree 0 and undefined at theta_c = 0, so whenever the data pull a
# class towards the apex (a class the base model orients the wrong way, under a tight
# tau) the infimum is approached along a ray into the apex and never attained: SciPy
# then runs out of iterations and a penalty method drifts. With eps the constraint is
# smooth, equals 0 at the apex, and the optimum is attained at ||theta_c|| = O(eps),
# which leaves predictions unchanged to O(eps |m|). Elsewhere it lowers the cosine by
# a relative eps^2 / (2 ||theta_c||^2): 5e-7 at ||theta_c|| = 1, 0.07% of the slack
# 1 - tau at the tightest tau of the Appendix A schedule (K = 5, alpha = 2.1 degrees).
# 1e-4 left degenerate problems too ill-conditioned for SciPy; 1e-2 moved tight-tau
# optima visibly (see the module tests).
COSINE_EPS = 1e-3


def class_cosines(params: Params) -> Array:
    """``[n-1]`` cosine between (b_c, w_c) and the identity direction v = (0, 1).

    w_c / sqrt(b_c^2 + w_c^2 + eps^2) with eps = ``COSINE_EPS``: the paper's
    cos(theta_c, v) away from the origin, and 0 (with a finite gradient) at it.
    """
    sq = params.b * params.b + params.w * params.w + COSINE_EPS**2
    return params.w * jax.lax.rsqrt(sq)


def trust_region(params: Params) -> Array:
    """Directional trust-region value (1/(n-1)) sum_c w_c / ||theta_c||; feasible iff >= tau."""
    return jnp.mean(class_cosines(params))


def trust_region_violation(params: Params, tau: Array) -> Array:
    """max(0, tau - trust_region(params)): 0 exactly when the constraint holds."""
    return jnp.maximum(tau - trust_region(params), 0.0)


def _safe_norm(b: Array, w: Array) -> Array:
    # sqrt with a zero gradient (instead of NaN) at the origin.
    sq = b * b + w * w
    nonzero = sq > 0
    return jnp.where(nonzero, jnp.sqrt(jnp.where(nonzero, sq, 1.0)), 0.0)


def cone_margins(params: Params, tau: Array) -> Array:
    """``[n-1]`` w_c - tau ||(b_c, w_c)||: >= 0 iff theta_c lies in the per-class cone.

    The exact (unsmoothed) per-class form of the trust region, a closed set that
    contains the apex theta_c = 0; this is the constraint the projected solver keeps.
    """
    return params.w - tau * _safe_norm(params.b, params.w)


def cone_violation(params: Params, tau: Array) -> Array:
    """max_c max(0, tau - cos(theta_c, v)) with the exact cosine, 0 at the apex."""
    norm = _safe_norm(params.b, params.w)
    excess = jnp.maximum(-cone_margins(params, tau), 0.0)
    return jnp.max(jnp.where(norm > 0, excess / jnp.where(norm > 0, norm, 1.0), 0.0))


def accuracy_of_argmax(params: Params, problem: Problem) -> Array:
    """Masked in-sample accuracy of the calibrated argmax (identity params: the base model)."""
    pred = jnp.argmax(calibrated_logits(params, problem.features), axis=-1)
    return jnp.sum(problem.mask * (pred == problem.labels)) / _num_rows(problem.mask)


# ---------------------------------------------------------------------------------
# Exact value, gradient and Hessian in one pass, for the second-order solvers.


# Rows per block of the one-pass derivatives. A block's intermediates (about 40
# numbers per row for n = 4) stay in a core's cache; one pass over all 20,160 rows of
# a k = 8 problem did not (12 ms per pass against 1.6 ms for 7,168 rows on the 2-core
# CPU, n = 4 float64).
ROW_BLOCK = 4096


class Design(NamedTuple):
    """A :class:`Problem` laid out for :func:`value_grad_hess` (built once per solve),
    in B blocks of C rows (B = 1 and C = N up to ``ROW_BLOCK`` rows; padded rows of
    the last block have zero groups, labels and mask).

    features: ``[B, n-1, C]`` log-odds, class-major, so that every per-class
        operation runs along the long row axis (XLA's CPU code vectorises that axis;
        with ``[N, n-1]`` and n - 1 = 1..5 it does not).
    labels: ``[B, n, C]`` one-hot labels times the row mask.
    groups: ``[B, C, G]`` one-hot query ids times the row mask: segment sums become
        matrix products.
    """

    features: Array
    labels: Array
    groups: Array


def design_arrays(features: Array, labels: Array, groups: Array) -> Design:
    """:class:`Design` from ``features [N, n-1]``, masked one-hot ``labels [n, N]``
    and masked one-hot ``groups [N, G]`` (differentiable in every argument)."""
    num_rows = features.shape[0]
    # As few blocks as ROW_BLOCK allows, of equal size (a multiple of 8 rows).
    num_blocks = max(-(-num_rows // ROW_BLOCK), 1)
    size = num_rows if num_blocks == 1 else -(-num_rows // (8 * num_blocks)) * 8
    pad = num_blocks * size - num_rows

    def block(a, axis):  # rows on `axis` -> [B, ..., C] with C where the rows were
        a = jnp.pad(a, [(0, pad if k == axis else 0) for k in range(a.ndim)])
        a = jnp.moveaxis(a, axis, 0).reshape((num_blocks, size) + a.shape[:axis]
                                             + a.shape[axis + 1:])
        return jnp.moveaxis(a, 1, axis + 1)

    return Design(block(features.T, 1), block(labels, 1), block(groups, 0))


def design(problem: Problem) -> Design:
    """:class:`Design` of one unbatched :class:`Problem`."""
    n = problem.num_classes
    dtype = problem.features.dtype
    mask = problem.mask.astype(dtype)
    labels = jax.nn.one_hot(problem.labels, n, dtype=dtype, axis=0) * mask  # [n, N]
    groups = jax.nn.one_hot(problem.query_ids, problem.num_queries, dtype=dtype) \
        * mask[:, None]  # [N, G]
    return design_arrays(problem.features, labels, groups)


def _over_blocks(fn, d: Design, *args):
    """sum_b fn(block_b, *args): a Python call for one block, else a scan whose
    carry is the running sum (every block's work stays in cache)."""
    blocks = (d.features, d.labels, d.groups)
    if d.features.shape[0] == 1:
        return fn(*(a[0] for a in blocks), *args)
    first = jax.eval_shape(lambda: fn(*(a[0] for a in blocks), *args))
    init = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), first)

    def step(acc, blk):
        return jax.tree.map(jnp.add, acc, fn(*blk, *args)), None

    return jax.lax.scan(step, init, blocks)[0]


def _softmax_rows(x: Array, X: Array):
    """Calibrated log-probabilities and probabilities of one block, ``[n, C]`` each."""
    n1 = X.shape[0]
    b, w = x[:n1], x[n1:]
    Lr = X * w[:, None] + b[:, None]  # [n-1, C]
    # log-softmax with class 0 pinned at 0.
    top = jnp.maximum(jnp.max(Lr, axis=0), 0.0)  # [C]
    lse = top + jnp.log(jnp.exp(-top) + jnp.sum(jnp.exp(Lr - top), axis=0))  # [C]
    lp = jnp.concatenate([-lse[None], Lr - lse], axis=0)  # [n, C]
    return lp, jnp.exp(lp)


def _group_pass(X, Y, OH, x, hessian: bool):
    """Per-block group sums (one product with the one-hot) and row sums: u, v, the
    group sums of J_a Z_a (Hessian cross terms, if ``hessian``), of X and of the
    mask; and sum_a y_a.l_a, sum_a P_a.l_a."""
    n1 = X.shape[0]
    mask = jnp.sum(OH, axis=1)  # [C]
    lp, P = _softmax_rows(x, X)
    parts = [P * mask, lp * mask]
    if hessian:
        Pr = P[1:]
        J = jnp.eye(n1, dtype=X.dtype)[:, :, None] * Pr[:, None] - Pr[:, None] * Pr[None]
        Jm = J * mask
        parts += [Jm.reshape(n1 * n1, -1), (Jm * X[None]).reshape(n1 * n1, -1), X]
    grouped = jnp.concatenate(parts + [mask[None]], axis=0) @ OH
    terms = jnp.stack([jnp.sum(Y * lp), jnp.sum(P * mask * lp)])
    return grouped, terms


def _row_pass(X, Y, OH, x, back_groups, n_eff, lam):
    """Per-block row sums of the gradient and of the row-diagonal Hessian blocks."""
    n1 = X.shape[0]
    n = n1 + 1
    dtype = X.dtype
    mask = jnp.sum(OH, axis=1)
    # Query id of each row, for gathering group sums back to rows (a gather is much
    # cheaper than a product with the [G, C] one-hot on CPU); padded rows read
    # group 0 and are masked.
    qid = jnp.argmax(OH, axis=1)
    lp, P = _softmax_rows(x, X)
    Pr = P[1:]
    eye = jnp.eye(n1, dtype=dtype)[:, :, None]
    J = eye * Pr[:, None] - Pr[:, None] * Pr[None]  # [n-1, n-1, C] softmax Jacobian
    back = jnp.take(back_groups, qid, axis=1)
    u_a, v_a, M_a = back[:n], back[n:2 * n], back[2 * n]  # [n, C], [n, C], [C]
    z = lp - v_a
    Pz = jnp.sum(P * z, axis=0)  # [C]
    gL = ((P * mask - Y) / n_eff + lam * mask * (P * (z - Pz) - u_a + M_a * P))[1:]
    zP = (z * P)[1:]  # [n-1, C]
    D = (eye * (zP - Pz * Pr)[:, None] - zP[:, None] * Pr[None] - Pr[:, None] * zP[None]
         + 2.0 * Pz * Pr[:, None] * Pr[None])
    Q = mask * (J / n_eff + lam * (D + (1.0 + M_a) * J))  # per-row Hessian blocks
    # Every row sum (gradient, row-diagonal Hessian) in one product.
    rows = jnp.concatenate([gL, gL * X, Q.reshape(n1 * n1, -1),
                            (Q * X[None]).reshape(n1 * n1, -1),
                            (Q * X[:, None] * X[None]).reshape(n1 * n1, -1)], axis=0)
    return rows @ jnp.ones(X.shape[1], dtype)


def value_grad_hess(x: Array, d: Design, lambda_inv: Array) -> tuple[Array, Array, Array]:
    """f(theta), its gradient ``[p]`` and Hessian ``[p, p]`` at x = (b, w), ``p = 2(n-1)``.

    f is :func:`objective` (mean NLL + lambda_inv * mean pairwise symmetric
    cross-entropy); the result equals ``jax.hessian`` of it (a test checks this to
    1e-12 in float64) at a fraction of the cost: the calibrated logits are linear in
    theta, L_ac = w_c m_ac + b_c, so every derivative is a per-row quantity in logit
    space contracted with the rows' (1, m_ac), and all row sums are matrix products.
    Two passes over the row blocks: group sums, then row sums that read them.

    With P_a = softmax(L_a), l_a = log P_a, J_a = diag(P_a) - P_a P_a^T and, per query
    group g, u = sum_a P_a, v = sum_a l_a, M = |g|, the group's pair sum
    T_g = -u.v + sum_a P_a.l_a has (using P_a . dl_a = 0 and J_a 1 = 0)

        dT/dL_a        = J_a (l_a - v) - u + M P_a
        d2T/dL_a dL_b  = delta_ab [D_a(l_a - v) + (1 + M) J_a] - J_a - J_b,

    where D_a(z) is the Hessian of z . softmax(L_a) for fixed z. The NLL adds
    (P_a - e_y) / N and J_a / N. Padded rows (mask 0) contribute nothing.
    """
    n1 = d.features.shape[1]
    n = n1 + 1
    grouped, terms = _over_blocks(functools.partial(_group_pass, hessian=True), d, x)
    U, V = grouped[:n], grouped[n:2 * n]  # [n, G]
    S1 = jnp.concatenate([grouped[2 * n:2 * n + n1 * n1].reshape(n1, n1, -1),
                          grouped[2 * n + n1 * n1:2 * n + 2 * n1 * n1].reshape(n1, n1, -1)],
                         axis=1)  # [n-1 (row class), p, G]
    XG, counts = grouped[-n1 - 1:-1], grouped[-1]  # [n-1, G], [G]
    n_eff = jnp.maximum(jnp.sum(counts), 1.0)
    pairs = jnp.sum(counts * (counts - 1.0)) / 2.0
    lam = jnp.where(pairs > 0, lambda_inv / jnp.maximum(pairs, 1.0), 0.0)
    back_groups = jnp.concatenate([U, V, counts[None]], axis=0)
    sums = _over_blocks(_row_pass, d, x, back_groups, n_eff, lam)
    f = -terms[0] / n_eff + lam * (terms[1] - jnp.sum(U * V))
    grad = sums[:2 * n1]
    Hbb, Hbw, Hww = (sums[2 * n1 + k * n1 * n1: 2 * n1 + (k + 1) * n1 * n1]
                     .reshape(n1, n1) for k in range(3))
    H = jnp.block([[Hbb, Hbw], [Hbw.T, Hww]])
    # Cross terms -sum_g (S1^T S0 + S0^T S1) between the rows of one group; S0 (the
    # group sums of Z_a) of column (kind, c) is nonzero only in row class c.
    S0 = jnp.stack([jnp.broadcast_to(counts, XG.shape), XG])  # [2, n-1, G]
    C = jnp.einsum("cpg,kcg->pkc", S1, S0).reshape(2 * n1, 2 * n1)
    H = H - lam * (C + C.T)
    return f, grad, H


def value(x: Array, d: Design, lambda_inv: Array) -> Array:
    """f(theta) at flat x = (b, w) on a :class:`Design`: :func:`objective` without
    the derivatives (one pass, cheaper than :func:`value_grad_hess`)."""
    n = d.features.shape[1] + 1
    grouped, terms = _over_blocks(functools.partial(_group_pass, hessian=False), d, x)
    U, V, counts = grouped[:n], grouped[n:2 * n], grouped[-1]
    n_eff = jnp.maximum(jnp.sum(counts), 1.0)
    pairs = jnp.sum(counts * (counts - 1.0)) / 2.0
    lam = jnp.where(pairs > 0, lambda_inv / jnp.maximum(pairs, 1.0), 0.0)
    return -terms[0] / n_eff + lam * (terms[1] - jnp.sum(U * V))
