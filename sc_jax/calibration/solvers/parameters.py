"""The solvers' vector of unknowns z; SC* (bias only) is handled here and nowhere else.

SC optimises z = (b, w), ``[2 (n-1)]``. SC* optimises z = b, ``[n-1]``, with the
slopes pinned at w = 1 (the paper's shift-only calibrator); its trust-region
constraint is kept, evaluated at (b, 1). Every other piece of the solvers works on
the full flat x = (b, w): :func:`expand` maps z there, :func:`restrict` maps
derivatives taken in x back to z, :func:`to_params` gives the :class:`Params`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sc_jax.calibration.objective import Params, params_from_flat
from sc_jax.calibration.solvers.geometry import project_cone

Array = jax.Array


def initial(n1: int, dtype, sc_star: bool) -> Array:
    """The identity calibrator (b = 0, w = 1) as z: feasible for every tau."""
    b = jnp.zeros(n1, dtype)
    return b if sc_star else jnp.concatenate([b, jnp.ones(n1, dtype)])


def expand(z: Array, sc_star: bool) -> Array:
    """z -> the full flat x = (b, w), ``[2 (n-1)]``."""
    return jnp.concatenate([z, jnp.ones_like(z)]) if sc_star else z


def restrict(g: Array, H: Array, sc_star: bool) -> tuple[Array, Array]:
    """A gradient ``[2 (n-1)]`` and Hessian taken in x -> those in z (for SC*, the
    b entries: w is not a variable)."""
    if not sc_star:
        return g, H
    n1 = g.shape[0] // 2
    return g[:n1], H[:n1, :n1]


def to_params(z: Array, sc_star: bool) -> Params:
    """z -> :class:`Params` (``w`` all ones for SC*)."""
    return params_from_flat(z, sc_star)


def project(z: Array, tau, sc_star: bool) -> Array:
    """Euclidean projection of z onto the per-class cones
    { (b_c, w_c) : w_c >= tau ||(b_c, w_c)|| } (:func:`project_bias_sc_star` for SC*,
    whose slopes are pinned)."""
    if sc_star:
        return project_bias_sc_star(z, tau)
    b, w = project_cone(params_from_flat(z), tau)
    return jnp.concatenate([b, w])


def project_bias_sc_star(b: Array, tau) -> Array:
    """The cone projection with w = 1: the box |b| <= sqrt(1/tau^2 - 1) for tau > 0
    and no restriction for tau <= 0."""
    tau = jnp.asarray(tau, b.dtype)
    safe_tau = jnp.where(tau > 0, tau, 1.0)
    radius = jnp.where(tau > 0, jnp.sqrt(jnp.maximum(1.0 / (safe_tau * safe_tau) - 1.0, 0.0)),
                       jnp.inf)
    return jnp.clip(b, -radius, radius)
