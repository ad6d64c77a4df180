"""The two Newton steps of the augmented Lagrangian (:mod:`.augmented_lagrangian`).

* :func:`trust_region_step`: the trust-region subproblem, solved exactly (at most 10
  parameters: one eigendecomposition per step).
* :func:`sqp_step`: Newton's step on the KKT conditions with the constraint active
  (a joint primal-dual, SQP, step), and :func:`kkt_residual`, the merit it is
  backtracked on.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array

_SECULAR_STEPS = 60


def trust_region_step(g: Array, H: Array, radius: Array) -> tuple[Array, Array]:
    """argmin_s g.s + s.H.s / 2 subject to ||s|| <= radius, and its predicted decrease.

    g ``[p]``, H ``[p, p]`` symmetric (any inertia), radius > 0. Exact up to rounding
    (More & Sorensen 1983, via one eigendecomposition, affordable for p <= 10): the
    Newton step -H^-1 g when H is positive definite and the step fits; otherwise
    s(l) = -(H + l I)^-1 g with l > max(0, -lambda_min) solving ||s(l)|| = radius by
    safeguarded Newton on 1/||s(l)|| - 1/radius (a few steps, at most
    ``_SECULAR_STEPS``), plus a component along the lowest
    eigenvector in the "hard case" where g has none. Returns (s, -(g.s + s.H.s/2)).
    """
    dtype = g.dtype
    eps = jnp.finfo(dtype).eps
    lam, Qm = jnp.linalg.eigh(H)  # ascending
    gt = Qm.T @ g
    scale = jnp.maximum(jnp.max(jnp.abs(lam)), jnp.finfo(dtype).tiny)
    floor = 10.0 * eps * scale  # eigenvalues below this count as zero
    lo = jnp.maximum(0.0, -lam[0])
    gnorm = jnp.linalg.norm(g)

    def norms(l):
        den = jnp.maximum(lam + l, floor)
        s = -gt / den
        return s, jnp.linalg.norm(s), jnp.sum(gt * gt / den**3)

    s0, n0, _ = norms(0.0)
    newton = (lam[0] > floor) & (n0 <= radius)

    def boundary():
        # Secular equation on (lo, hi]: ||s(hi)|| <= ||g|| / (lam_min + hi) <= radius.
        hi = lo + gnorm / radius + floor
        rtol = 10.0 * eps

        # From the left of the root, where 1/||s(l)|| is concave, Newton's iterates
        # rise monotonically to it (More & Sorensen); the bracket guards against
        # rounding. A few steps usually; at most _SECULAR_STEPS.
        def cond(c):
            a, b, l, ns, k = c
            return (k < _SECULAR_STEPS) & (jnp.abs(ns - radius) > rtol * radius)

        def body(c):
            a, b, l, _, k = c
            _, ns, q = norms(l)
            a = jnp.where(ns > radius, l, a)
            b = jnp.where(ns > radius, b, l)
            # More-Sorensen: l += (||s|| / ||q||)^2 (||s|| - radius) / radius with
            # ||q||^2 = s.(H + l I)^-1 s = sum gt^2 / (lam + l)^3.
            step = (ns * ns / jnp.maximum(q, jnp.finfo(dtype).tiny)) * (ns - radius) / radius
            cand = l + step
            cand = jnp.where((cand > a) & (cand < b), cand, 0.5 * (a + b))
            # ns belongs to l: a converged l is kept (the bracket excludes it).
            l = jnp.where(jnp.abs(ns - radius) > rtol * radius, cand, l)
            return a, b, l, ns, k + 1

        inf = jnp.asarray(jnp.inf, dtype)
        _, _, l, _, _ = jax.lax.while_loop(
            cond, body, (lo, hi, lo + floor, inf, jnp.zeros((), jnp.int32)))
        s, ns, _ = norms(l)
        # Hard case: g (nearly) orthogonal to the lowest eigenvector of an indefinite
        # H, so ||s(l)|| < radius for every l > lo: move along that eigenvector to
        # the boundary (it lowers the model there), on the side where g does not rise.
        hard = (lam[0] < -floor) & (ns < radius * (1.0 - 1e-6))
        edge = jnp.sqrt(jnp.maximum(radius * radius - ns * ns + s[0] * s[0], 0.0))
        return s.at[0].set(jnp.where(hard, jnp.where(gt[0] > 0, -edge, edge), s[0]))

    # Interior Newton steps (most of them) skip the secular solve; under vmap the
    # cond becomes a select and both branches run.
    s = jax.lax.cond(newton, lambda: s0, boundary)
    pred = -(jnp.dot(gt, s) + 0.5 * jnp.dot(lam * s, s))
    return Qm @ s, pred


def kkt_residual(gf: Array, c: Array, gc: Array, mu: Array) -> Array:
    """||(grad f - mu grad c, c)||_2: the residual of the KKT conditions with the
    (scaled) constraint c active, whose Newton step :func:`sqp_step` is. Newton's
    direction descends on it (its directional derivative is minus itself), so a
    backtracking line search on it always succeeds where the KKT matrix is regular."""
    return jnp.sqrt(jnp.sum((gf - mu * gc) ** 2) + c * c)


def sqp_step(gf: Array, hf: Array, c: Array, gc: Array, hc: Array, mu: Array):
    """Newton's step on the KKT conditions grad f - mu grad c = 0, c = 0:

        [H_L  -gc] [dx    ]   [-grad f]
        [gc^T   0] [mu_new] = [  -c   ],   H_L = hess f - mu hess c.

    Returns (dx [p], mu_new, valid): valid where the solve is finite, mu_new > 0 (the
    constraint stays active) and the KKT matrix has the inertia (p, 1) of a strict
    local minimiser (H_L positive definite on the constraint's tangent space)."""
    p = gf.shape[0]
    kkt = jnp.block([[hf - mu * hc, -gc[:, None]], [gc[None, :], jnp.zeros((1, 1), gf.dtype)]])
    sol = jnp.linalg.solve(kkt, -jnp.concatenate([gf, c[None]]))
    # The symmetric form (last row negated) has the inertia of the KKT system.
    sym = kkt.at[p].multiply(-1.0)
    lam = jnp.linalg.eigvalsh(sym)
    floor = 1e3 * jnp.finfo(gf.dtype).eps * jnp.max(jnp.abs(lam))
    valid = (jnp.all(jnp.isfinite(sol)) & (sol[p] > 0)
             & (jnp.sum(lam < -floor) == 1) & (jnp.sum(lam > floor) == p))
    return sol[:p], sol[p], valid

