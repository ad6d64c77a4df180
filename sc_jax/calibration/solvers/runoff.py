"""Run-offs: certifying that an infimum is not attained, and following it out.

Where the data are separable along a feasible direction, f falls towards an infimum
that no finite theta attains (f -> 0 as ||theta|| grows along it). The ray test of
:func:`not_attained` tells such an end point from a minimiser: scaling theta, or one
class's (b_c, w_c), leaves every cosine unchanged (up to the O(eps^2) smoothing),
so the rays are feasible; at a minimiser f rises along every ray (or, at
theta_c = 0, stays the same), along a ray of separation it keeps falling.

Every solver's UNBOUNDED status follows this one rule (:func:`ray_falls`, then
:func:`unbounded`). The augmented Lagrangian runs the test in each phase
(:func:`not_attained`, which also follows the run-off); the projected and SciPy
solvers, which have no follow-up, run it at their end point
(:func:`end_point_unbounded`), inside their own constraint set.
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

Array = jax.Array


class RayTest(NamedTuple):
    """What :func:`not_attained` found.

    unbounded: some ray fell at 2x and did not rise again at 4x.
    x, f: the point to report (the end of the followed run-off, or the input).
    cls: the class whose ray fell furthest (the largest ||theta_c|| where the whole
        of theta's ray did): the class a follow-up phase puts in polar form.
    f2x: ``[n]`` per ray (all of theta, then each class) f at 2x, NaN where the test
        did not run or the point left the constraint.
    """

    unbounded: Array
    x: Array
    f: Array
    cls: Array
    f2x: Array


class _Chain(NamedTuple):
    """The loop of :func:`_follow`: a pass evaluates f at one point."""

    i: Array  # pass; passes below m evaluate the rays' points one by one
    fs: Array  # [m] f at 2x and 4x along each ray
    flag: Array  # some ray ran off
    ray: Array  # [p] the ray being followed
    z: Array  # the chain's last point that fell, and f there
    fz: Array
    alive: Array  # the last doubling fell: keep doubling
    j: Array  # the next point is x + (2^j - 1) ray
    cls: Array  # see RayTest.cls


def rays_of(x: Array, n1: int) -> tuple[Array, Array]:
    """The rays of the test, ``[n, p]``: all of x, then each class's parameters alone;
    and per ray the class a follow-up would put in polar form (ray 0: the class of
    largest ||theta_c||)."""
    p = x.shape[0]
    cls = jnp.arange(p) % n1
    dirs = jnp.concatenate([jnp.ones((1, p), x.dtype),
                            (cls[None, :] == jnp.arange(n1)[:, None]).astype(x.dtype)])
    ray_class = jnp.concatenate([
        jnp.argmax(jnp.square(x[:n1]) + jnp.square(x[n1:]) if p == 2 * n1 else jnp.abs(x))[None],
        jnp.arange(n1)]).astype(jnp.int32)
    return dirs * x, ray_class


def ray_points(x: Array, rays: Array) -> Array:
    """``[n, 2, p]``: x + r and x + 3 r along each ray r of ``rays [n, p]`` (2x and 4x
    where r is x's own part)."""
    return x + rays[:, None, :] * jnp.asarray([1.0, 3.0], x.dtype)[None, :, None]


def ray_falls(f: Array, fs: Array, ok: Array) -> Array:
    """``[n]`` bool, per ray: f falls from x to 2x and does not rise again at 4x.

    f = f(x); fs ``[n, 2]`` f at 2x and 4x (:func:`ray_points`); ok ``[n]`` both
    points are feasible (only feasible rays count: for SC*, whose w is pinned,
    scaling b leaves the cone). Each fall is measured against the rounding of the
    value it falls from (f can shrink by hundreds of orders of magnitude along a ray,
    or underflow to 0). After the first fall, a second that is below rounding counts
    too: f tends to its infimum along the ray like exp(-kappa s), so once the class
    that separates has saturated, f(4x) = f(2x) to the last digit (a bowl whose
    minimum lies between 2x and 4x would need f(2x) = f(4x) to 100 eps by
    coincidence)."""
    r = 100.0 * jnp.finfo(fs.dtype).eps
    return ok & (fs[:, 0] < f * (1.0 - r)) & (fs[:, 1] <= fs[:, 0] * (1.0 + r))


def _judge(fs: Array, ok: Array, f: Array, x: Array, rays: Array, ray_class: Array,
           follow_rtol: float):
    """From f at 2x and 4x per ray: whether a ray ran off, the one that fell furthest,
    the chain's start, whether it is worth following, and the class to report
    (a fall: :func:`ray_falls`).
    """
    fs = fs.reshape(-1, 2)
    falls = ray_falls(f, fs, ok)
    flag = jnp.any(falls)
    k = jnp.argmin(jnp.where(falls, fs[:, 1], jnp.inf))
    # Without a run-off, the class whose ray fell furthest at 2x.
    k2 = jnp.argmin(jnp.where(ok, fs[:, 0], jnp.inf))
    # The chain starts at 2x (the first fall, known to be feasible); 4x is evaluated
    # again so that every step of it is judged the same way.
    alive0 = flag & (fs[k, 0] < f * (1.0 - follow_rtol))
    return (flag, rays[k], jnp.where(alive0, x + rays[k], x), jnp.where(alive0, fs[k, 0], f),
            alive0, jnp.where(flag, ray_class[k], ray_class[k2]))


def _follow(x: Array, f: Array, rays: Array, ray_class: Array, fun: Callable,
            feasible: Callable, *, doublings: int, follow_rtol: float, one_site: bool):
    """f at 2x and 4x along every ray, then the run-off's chain of doublings, in one
    loop of one evaluation of f per pass (with ``one_site`` the rays' points too, one
    per pass; otherwise they are one vmapped batch before the loop). A while_loop,
    not a scan: the chain ends at its first doubling that does not fall, so a ray
    whose class saturates costs one evaluation of f, not ``doublings``."""
    p = x.shape[0]
    scaled = ray_points(x, rays)
    pts = scaled.reshape(-1, p)  # f at 2x and 4x along each ray
    m = pts.shape[0]
    ok = jnp.all(jax.vmap(jax.vmap(feasible))(scaled), axis=1)
    judge = lambda fs: _judge(fs, ok, f, x, rays, ray_class, follow_rtol)  # noqa: E731

    def body(c: _Chain) -> _Chain:
        scan = c.i < m
        pt = jnp.where(scan, pts[jnp.minimum(c.i, m - 1)],
                       x + (2.0 ** c.j.astype(x.dtype) - 1.0) * c.ray)
        fp = fun(pt)
        fs = jnp.where(scan, c.fs.at[jnp.minimum(c.i, m - 1)].set(fp), c.fs)
        last = c.i == m - 1
        flag_n, ray_n, z0, f0, alive0, cl_n = judge(fs)
        grow = (fp < c.fz * (1.0 - follow_rtol)) & feasible(pt)
        return _Chain(
            c.i + 1, fs, jnp.where(last, flag_n, c.flag), jnp.where(last, ray_n, c.ray),
            jnp.where(scan, jnp.where(last, z0, c.z), jnp.where(grow, pt, c.z)),
            jnp.where(scan, jnp.where(last, f0, c.fz), jnp.where(grow, fp, c.fz)),
            jnp.where(scan, last & alive0, grow), jnp.where(scan, 2, c.j + 1),
            jnp.where(last, cl_n, c.cls))

    two = jnp.asarray(2, jnp.int32)
    if one_site:
        init = _Chain(jnp.asarray(0, jnp.int32), jnp.zeros(m, x.dtype), jnp.asarray(False),
                      jnp.zeros_like(x), x, f, jnp.asarray(False), two, ray_class[0])
    else:
        fs = jax.vmap(fun)(pts)
        flag0, ray0, z0, f0, alive0, cl0 = judge(fs)
        init = _Chain(jnp.asarray(m, jnp.int32), fs, flag0, ray0, z0, f0, alive0, two, cl0)
    out = jax.lax.while_loop(lambda c: (c.i < m) | (c.alive & (c.j <= doublings)), body, init)
    at2x = jnp.where(ok, out.fs.reshape(-1, 2)[:, 0], jnp.nan)
    return RayTest(out.flag, out.z, out.fz, out.cls, at2x)


def not_attained(x: Array, f: Array, hess: Array, fun: Callable, feasible: Callable,
                 n1: int, *, converged: Array, tol: float, doublings: int = 12,
                 follow_rtol: float = 1e-6, one_site: bool = False,
                 force: Array | bool = False) -> RayTest:
    """Whether f decreases when theta (or one class's (b_c, w_c)) is scaled by 2, and
    does not rise again when it is scaled by 4; with the point to report.

    x ``[p]`` (flat (b, w), or b for SC*), f = fun(x), hess ``[p, p]`` f's Hessian at
    x; fun and feasible map a point to f and to whether it meets the constraint.
    Where the infimum is not attained, the run-off is followed along the ray that
    fell furthest: the scale keeps doubling (up to 2^``doublings``) while each
    doubling lowers f by more than ``follow_rtol`` |f| and stays feasible, and the
    last such point is returned. A solve that stopped early in the slow valley of a
    run-off (in float32, where Newton's predicted decreases fall below rounding long
    before f is near its infimum) then reports a point whose f is as close to the
    infimum along the ray as float64's. In float32 the fall can be below the
    resolution of f, and the instance then reports CONVERGED or MAX_ITERATIONS.

    The 2 n evaluations of f are made only where they can succeed: after a solve
    that did not converge, or where f's curvature along some ray, r^T H r / ||r||^2,
    is below sqrt(tol). Along a ray of separation f behaves like A exp(-kappa s),
    whose curvature is kappa times its slope, and the slope is below the
    stationarity tolerance where the solve stopped. (``lax.cond``: skipped on CPU,
    where instances run one by one; under vmap both branches run.)

    one_site: evaluate the 2 n points one by one in the loop that follows the
    run-off instead of as one vmapped batch: the same result (a test compares them)
    with one copy of f's code in the program instead of two, for the solver that runs
    instances one by one anyway (:func:`sc_jax.calibration.solvers.batching.solve_slots`).

    force: test whatever the curvature and convergence say (the polar follow-up
    phase, whose Hessian is not in x's coordinates).
    """
    rays, ray_class = rays_of(x, n1)
    norm2 = jnp.sum(rays * rays, axis=1)
    curv = jnp.einsum("rp,pq,rq->r", rays, hess, rays) / jnp.maximum(
        norm2, jnp.finfo(x.dtype).tiny)
    gate = force | ~converged | jnp.any((norm2 > 0) & (curv <= jnp.sqrt(tol)))
    skipped = RayTest(jnp.asarray(False), x, f, ray_class[0], jnp.full(n1 + 1, jnp.nan, x.dtype))
    return jax.lax.cond(
        gate, lambda: _follow(x, f, rays, ray_class, fun, feasible, doublings=doublings,
                              follow_rtol=follow_rtol, one_site=one_site),
        lambda: skipped)


def unbounded(falls: Array, f: Array, has_rows: Array) -> Array:
    """The UNBOUNDED rule of every solver: the ray test found a fall (``falls``), or
    f = 0 with a real row (f is then a mean of strictly positive terms at every
    finite theta, so 0 is an infimum reached only by rounding, at the end of a
    run-off; an all-padding batch filler has f = 0 by definition)."""
    return has_rows & (falls | (f <= 0))


def end_point_unbounded(x: Array, f: Array, evaluate: Callable, n1: int,
                        has_rows: Array) -> Array:
    """:func:`unbounded` by the ray test at a solver's end point x ``[p]`` (flat (b, w),
    or b for SC*; f = f(x)), whatever the solver's own convergence test said: a
    solver that stops on a small gradient stops on a run-off too, where f falls
    exponentially along a ray and its slope is below any tolerance.

    evaluate: the points of the test ``[n, 2, p]`` (:func:`ray_points`; n = n1 + 1
    rays) -> (f there ``[n, 2]``, whether each lies in the solver's own constraint
    set ``[n, 2]``); it may run on the host (the SciPy reference's, whose two jitted
    pieces here compile once per shape). The end point is reported as it is: the
    run-off is not followed, so this costs the 2 n evaluations of f."""
    fs, ok = evaluate(_end_points(x, n1))
    return _end_verdict(f, fs, ok, has_rows)


@functools.partial(jax.jit, static_argnums=1)
def _end_points(x: Array, n1: int) -> Array:
    return ray_points(x, rays_of(x, n1)[0])


@jax.jit
def _end_verdict(f: Array, fs: Array, ok: Array, has_rows: Array) -> Array:
    return unbounded(jnp.any(ray_falls(f, fs, jnp.all(ok, axis=1))), f, has_rows)
