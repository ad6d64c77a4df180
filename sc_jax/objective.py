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
