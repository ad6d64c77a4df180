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
import numpy as np

from sc_jax.calibration.validation import concrete

Array = jax.Array
ArrayLike = jax.typing.ArrayLike


class Params(NamedTuple):
    """Affine-logit calibration parameters (paper Eq. affine_logit_model_formal).

    b: ``[n-1]`` intercepts b_c.   w: ``[n-1]`` slopes w_c.
    The identity map (the base model) is b = 0, w = 1.
    """

    b: Array
    w: Array


def params_from_flat(x: Array, sc_star: bool = False) -> Params:
    """A solver's flat vector -> :class:`Params`.

    x: ``[2 (n-1)]`` as (b, w) for SC, or ``[n-1]`` (b alone) for SC*, whose slopes
    are pinned at w = 1 (the paper's bias-only calibrator). Works on batched x too
    (``[..., p]``), the last axis being the flat one.
    """
    if sc_star:
        return Params(x, jnp.ones_like(x))
    n1 = x.shape[-1] // 2
    return Params(x[..., :n1], x[..., n1:])


def flat_from_params(params: Params, sc_star: bool = False) -> Array:
    """:class:`Params` -> the flat vector of :func:`params_from_flat` (``[..., p]``);
    for SC* the slopes are dropped (they are 1 by definition)."""
    if sc_star:
        return params.b
    return jnp.concatenate([params.b, params.w], axis=-1)


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


def log_odds(logprobs: ArrayLike) -> Array | np.ndarray:
    """Features m_c = log p_c - log p_0 for c = 1..n-1: ``[..., n] -> [..., n-1]``.

    A JAX array in (a traced one too: under ``jit``, ``vmap``, ``grad``) gives a JAX
    array of its dtype, computed in the graph; anything else (a NumPy array, a list)
    gives a NumPy array, computed on the host, as the NumPy fits read it.

    ValueError naming ``logprobs`` for what has no log-odds: fewer than 2 classes on
    the last axis (a scalar, or ``[..., 1]`` gave an empty answer), other than real
    numbers, or NaN (which came back as NaN features; checked where the values are
    concrete: a traced NaN gives NaN features)."""
    xp = jnp if isinstance(logprobs, jax.Array) else np
    logprobs = xp.asarray(logprobs)
    if logprobs.ndim < 1 or logprobs.shape[-1] < 2:
        raise ValueError(f"logprobs must be [..., n] log-probabilities of n >= 2 classes, got shape "
                         f"{logprobs.shape}")
    if not (np.issubdtype(logprobs.dtype, np.floating) or np.issubdtype(logprobs.dtype, np.integer)):
        raise ValueError(f"logprobs must be real numbers, got dtype {logprobs.dtype}")
    host = concrete(logprobs)
    if host is not None and np.isnan(host[0]).any():
        raise ValueError(f"logprobs hold {int(np.isnan(host[0]).sum())} NaN values: the scores "
                         "that produced them are not usable")
    return logprobs[..., 1:] - logprobs[..., :1]


def calibrated_logits(params: Params, features: Array) -> Array:
    """``[..., n-1]`` log-odds -> ``[..., n]`` calibrated logits, class 0 pinned at 0."""
    z = features * params.w + params.b  # [..., n-1]
    return jnp.concatenate([jnp.zeros_like(z[..., :1]), z], axis=-1)


def affine_log_probs(params: Params, features: Array) -> Array:
    """log f(m; theta) of Eq. affine_logit_model_formal: ``[..., n-1]`` -> ``[..., n]``
    log-probabilities, unchecked, on :class:`Params` (the objective's inner form; the
    public, checked form on (b, w) or a Calibration is
    :func:`sc_jax.calibration.jax_predict.calibrated_log_probs`)."""
    return jax.nn.log_softmax(calibrated_logits(params, features), axis=-1)


def _num_rows(mask: Array) -> Array:
    # max(.., 1) keeps an all-padding instance (a batch filler) finite: its loss is 0.
    return jnp.maximum(jnp.sum(mask), 1.0)


def mean_nll(params: Params, problem: Problem, log_probs: Array | None = None) -> Array:
    """Mean negative log-likelihood over the unmasked rows (paper Eq. mle_external / N)."""
    if log_probs is None:
        log_probs = affine_log_probs(params, problem.features)  # [N, n]
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
        log_probs = affine_log_probs(params, problem.features)  # [N, n]
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
    log_probs = affine_log_probs(params, problem.features)
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


# ---------------------------------------------------------------------------------
# Exact value, gradient and Hessian in one pass, for the second-order solvers.


# Rows per block of the derivative passes. A block's intermediates (a few dozen
# numbers per row) stay in a core's cache; one pass over all 20,160 rows of a k = 8
# problem did not (n = 3 float64 on the 2-core CPU: the 25-problem benchmark batch
# took 305 ms in one block, 221 ms in blocks of 8,192 and 228 ms of 4,096 rows, with
# the solver of that time). With today's solver, which evaluates all rows 3 to 4
# times per large instance, 4,096 rows ran that batch in 34 ms against 37 ms (2
# threads; 55 against 58 ms on one), alternated three times in one process, and
# left n = 2, 4, 5, 6 within noise.
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
    query_ids: ``[B, C]`` int32 query id of each row (0 for padding), to read group
        sums back at the rows (a gather is much cheaper than a product with the
        one-hot on CPU).
    mask: ``[B, C]`` 1 for real rows.
    row_counts: ``[B, C]`` size M of each row's query group (0 for padding).
    row_xsums: ``[B, n-1, C]`` sum of the features over each row's query group.
    counts: ``[G]`` rows per query group.

    The last four depend on the data alone, not on theta, so they are computed here
    once instead of at every evaluation.
    """

    features: Array
    labels: Array
    groups: Array
    query_ids: Array
    mask: Array
    row_counts: Array
    row_xsums: Array
    counts: Array


def design_arrays(features: Array, labels: Array, groups: Array, *,
                  query_ids: Array | None = None, mask: Array | None = None) -> Design:
    """:class:`Design` from ``features [N, n-1]``, masked one-hot ``labels [n, N]``
    and masked one-hot ``groups [N, G]`` (differentiable in every argument).
    ``query_ids [N]`` (0 on padded rows) and ``mask [N]``, where the caller has
    them, save reading them back from the one-hot ``groups``."""
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

    if mask is None:
        mask = jnp.sum(groups, axis=1)  # [N]
    if query_ids is None:
        query_ids = jnp.argmax(groups, axis=1).astype(jnp.int32)  # padding: 0, masked
    counts = jnp.sum(groups, axis=0)  # [G]
    xsums = features.T @ groups  # [n-1, G]
    row_counts = counts[query_ids] * mask
    row_xsums = xsums[:, query_ids] * mask
    return Design(block(features.T, 1), block(labels, 1), block(groups, 0),
                  block(query_ids, 0), block(mask, 0), block(row_counts, 0),
                  block(row_xsums, 1), counts)


def design(problem: Problem) -> Design:
    """:class:`Design` of one unbatched :class:`Problem`."""
    n = problem.num_classes
    dtype = problem.features.dtype
    mask = problem.mask.astype(dtype)
    labels = jax.nn.one_hot(problem.labels, n, dtype=dtype, axis=0) * mask  # [n, N]
    groups = jax.nn.one_hot(problem.query_ids, problem.num_queries, dtype=dtype) \
        * mask[:, None]  # [N, G]
    query_ids = jnp.where(mask > 0, problem.query_ids, 0).astype(jnp.int32)
    return design_arrays(problem.features, labels, groups, query_ids=query_ids, mask=mask)


def _over_blocks(fn, blocks: tuple, *args):
    """sum_b fn(*(a[b] for a in blocks), *args), unrolled over the B blocks (B is at
    most a few). A ``lax.scan`` over the blocks compiles a little faster but runs
    markedly slower inside the solver's loop (``benchmarks/RESULTS.md``)."""
    total = None
    for k in range(blocks[0].shape[0]):
        out = fn(*(a[k] for a in blocks), *args)
        total = out if total is None else jax.tree.map(jnp.add, total, out)
    return total


def _softmax_rows(x: Array, X: Array, with_rest: bool = False):
    """Calibrated probabilities and log-probabilities of one block, ``[n, C]`` each;
    ``with_rest``: also 1 - P to full relative precision (``[n, C]``) and the mask
    ``[n, C]`` of each row's largest probability."""
    n1 = X.shape[0]
    b, w = x[:n1], x[n1:]
    L = jnp.concatenate([jnp.zeros_like(X[:1]), X * w[:, None] + b[:, None]], axis=0)
    top = jnp.max(L, axis=0)  # [C]
    e = jnp.exp(L - top)  # the largest is exactly 1
    # log(sum e) = log1p(rest), with rest the sum of the other terms: where the
    # data are separable, log-probabilities near 0 keep their digits (-rest, not a
    # rounded 0), so f keeps falling along a ray of separation (see
    # sc_jax.calibration.solvers.runoff) instead of stalling at exactly 0.
    first = jnp.arange(n1 + 1)[:, None] == jnp.argmax(L, axis=0)
    rest = jnp.sum(jnp.where(first, 0.0, e), axis=0)
    lp = L - top - jnp.log1p(rest)
    P = e / (1.0 + rest)
    if not with_rest:
        return P, lp
    # 1 - P for the largest probability is rest / (1 + rest): formed as 1 - P it
    # keeps only an absolute eps, and on a class that runs off (its P near 1 on many
    # rows) the Hessian's P (1 - P) terms are then all rounding error, which the
    # follow-up phase's polar chain rule multiplies by ||theta_c||^2 (float32 took
    # H_phiphi = 1.14 for 0.0055 at ||theta_c|| = 8.6e3 and stalled).
    return P, lp, jnp.where(first, rest / (1.0 + rest), 1.0 - P), first


def _group_pass(X, Y, OH, mask, x):
    """Per-block group sums u = sum_a P_a and v = sum_a l_a (one product with the
    one-hot, ``[2n, G]``) and the row sums sum_a y_a.l_a, sum_a P_a.l_a."""
    P, lp = _softmax_rows(x, X)
    grouped = jnp.concatenate([P * mask, lp * mask], axis=0) @ OH
    return grouped, jnp.stack([jnp.sum(Y * lp), jnp.sum(P * lp * mask)])


def _row_pass(X, Y, qid, mask, M, XS, x, uv, n_eff, lam):
    """Per-block row sums of the gradient and Hessian (see :func:`value_grad_hess`):
    the part of the Hessian that is a Gram matrix over rows as one product
    ``[p, C] @ [C, p]``, the rest (gradient, per-class 2 x 2 blocks) as row sums."""
    n = X.shape[0] + 1
    P, lp, R, first = _softmax_rows(x, X, with_rest=True)
    back = jnp.take(uv, qid, axis=1)  # [2n, C]: the group sums at each row
    u, v = back[:n], back[n:]
    z = lp - v
    zP = z * P
    Pz = jnp.sum(zP, axis=0)  # [C]
    # z_c - P.z = sum_j P_j (z_c - z_j): for the largest P_c summed over the other
    # classes (small terms, full precision), elsewhere as the difference.
    z_top = jnp.sum(jnp.where(first, z, 0.0), axis=0)
    dz = jnp.where(first, jnp.sum(jnp.where(first, 0.0, P * (z_top - z)), axis=0), z - Pz)
    Pr, zPr, Rr, Yr = P[1:], zP[1:], R[1:], Y[1:]
    lm = lam * mask
    a = mask / n_eff + lm * (1.0 + M)  # coefficient of J_a in Q_a
    # P - y as P (1 - y) - y (1 - P): no cancellation where P is near y = 1.
    grad_L = (Pr * (mask - Yr) - Yr * Rr) / n_eff + lm * (zPr - Pz * Pr - u[1:] + M * Pr)
    t = lm * Pr
    A = jnp.concatenate([Pr, Pr * X], axis=0)  # [p, C]: rows (1, m_ac) P_ac
    q = lm * zPr
    F = 0.5 * (a - 2.0 * lm * Pz) * A + jnp.concatenate([q - t * M, q * X - t * XS], axis=0)
    # A class's own 2 x 2 block is summed here in closed form, not as diagonal terms
    # minus the Gram product's same-class entries (P_c - P_c^2 and the like, all
    # rounding where P_c is near 1): per row, the J_a parts give P_c (1 - P_c) times
    # a, and times -lambda (M, XS + m M, m XS) for the group's other rows, and the
    # D_a(l_a - v) part P_c (z_c - P.z) (1 - 2 P_c). value_grad_hess masks those
    # entries of the Gram product.
    diag = a * Pr * Rr + lm * Pr * dz[1:] * (1.0 - 2.0 * Pr)
    t2 = lm * Pr * Rr
    sums = jnp.concatenate([grad_L, grad_L * X, diag, diag * X, diag * X * X,
                            t2 * M, t2 * (XS + X * M), t2 * X * XS], axis=0)
    return F @ A.T, jnp.sum(sums, axis=1)


def _scales(d: Design, lambda_inv):
    n_eff = jnp.maximum(jnp.sum(d.counts), 1.0)
    pairs = jnp.sum(d.counts * (d.counts - 1.0)) / 2.0
    lam = jnp.where(pairs > 0, lambda_inv / jnp.maximum(pairs, 1.0), 0.0)
    return n_eff, lam


def value_grad_hess(x: Array, d: Design, lambda_inv: Array) -> tuple[Array, Array, Array]:
    """f(theta), its gradient ``[p]`` and Hessian ``[p, p]`` at x = (b, w), ``p = 2(n-1)``.

    f is :func:`objective` (mean NLL + lambda_inv * mean pairwise symmetric
    cross-entropy); the result equals ``jax.hessian`` of it (a test checks this to
    1e-12 in float64) at a fraction of the cost: the calibrated logits are linear in
    theta, L_ac = w_c m_ac + b_c, so every derivative is a per-row quantity in logit
    space contracted with the rows' (1, m_ac). Two passes over the row blocks: group
    sums, then row sums that read them.

    With P_a = softmax(L_a), l_a = log P_a, J_a = diag(P_a) - P_a P_a^T and, per query
    group g, u = sum_a P_a, v = sum_a l_a, M = |g|, the group's pair sum
    T_g = -u.v + sum_a P_a.l_a has (using P_a . dl_a = 0 and J_a 1 = 0)

        dT/dL_a        = J_a (l_a - v) - u + M P_a
        d2T/dL_a dL_b  = delta_ab [D_a(l_a - v) + (1 + M) J_a] - J_a - J_b,

    where D_a(z) is the Hessian of z . softmax(L_a) for fixed z. The NLL adds
    (P_a - e_y) / N and J_a / N. Padded rows (mask 0) contribute nothing.

    Every term of the Hessian is diagonal in the classes (a 2 x 2 block per class)
    or of the form sum_a (s_a P_ac)(t_a P_ad) Z_ac Z_ad^T: with A_a the ``[p]``
    vector (P_ac, P_ac m_ac)_c, the latter is the Gram product F^T A of two ``[C, p]``
    matrices, one small matrix product per block instead of p^2 row sums.
    """
    n1 = d.features.shape[1]
    n = n1 + 1
    n_eff, lam = _scales(d, lambda_inv)
    grouped, terms = _over_blocks(_group_pass, (d.features, d.labels, d.groups, d.mask), x)
    U, V = grouped[:n], grouped[n:]  # [n, G]
    gram, sums = _over_blocks(
        _row_pass, (d.features, d.labels, d.query_ids, d.mask, d.row_counts, d.row_xsums),
        x, grouped, n_eff, lam)
    f = -terms[0] / n_eff + lam * (terms[1] - jnp.sum(U * V))
    grad = sums[:2 * n1]
    diag, diag_x, diag_xx, t_m, t_x, t_xx = sums[2 * n1:].reshape(6, n1)
    # The per-class 2 x 2 blocks as one block matrix of diagonals, not four scatters
    # (each a scatter loop of its own at every evaluation on CPU); its off-diagonal
    # zeros leave the Gram part's entries exactly as they are.
    cross = jnp.diag(diag_x - t_x)
    idx = np.arange(2 * n1) % n1
    gram = jnp.where(idx[:, None] == idx[None, :], 0.0, gram)  # see _row_pass
    H = -(gram + gram.T) + jnp.block([[jnp.diag(diag - 2.0 * t_m), cross],
                                      [cross, jnp.diag(diag_xx - 2.0 * t_xx)]])
    return f, grad, H


def value(x: Array, d: Design, lambda_inv: Array) -> Array:
    """f(theta) at flat x = (b, w) on a :class:`Design`: :func:`objective` without
    the derivatives (one pass, cheaper than :func:`value_grad_hess`)."""
    n = d.features.shape[1] + 1
    n_eff, lam = _scales(d, lambda_inv)
    grouped, terms = _over_blocks(_group_pass, (d.features, d.labels, d.groups, d.mask), x)
    return -terms[0] / n_eff + lam * (terms[1] - jnp.sum(grouped[:n] * grouped[n:]))
