"""The JAX solvers against SciPy trust-constr (float64), batched against one-by-one,
and their status codes.

Parity tolerances (issue 4): objective within 1e-6 relative, constraint violation
<= 1e-7, parameters within 1e-4 (every instance here has a unique optimum: the
NLL-only problems are strictly convex and the others are checked to match), identical
argmax predictions. The augmented Lagrangian is compared with SciPy on the paper's
mean-cosine constraint, the projected solver with SciPy on the per-class cones.

float64 is switched on per test by the ``x64`` fixture: ``jax.enable_x64`` is a
context manager scoped to the test, so other test modules keep float32.
"""

import functools
import itertools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sc_jax.calibration import defaults, numpy_fit

from sc_jax.calibration import solvers

from sc_jax.calibration import synthetic
from sc_jax.calibration.buckets import pack_batch
from sc_jax.calibration.objective import (
    Params,
    Problem,
    calibrated_logits,
    class_cosines,
    objective,
    params_from_flat,
    trust_region,
)
from sc_jax.calibration.solvers import (
    SolverOptions,
    Status,
    batching,
    charts,
    geometry,
    lagrangian,
    multistart,
    parameters,
    runoff,
    steps,
)
import scipy_best_references


# jaxlib 0.12's crash in the persistent cache's write (conftest.no_persistent_cache_writes).
pytestmark = pytest.mark.usefixtures("no_persistent_cache_writes")


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


# ---------------------------------------------------------------------------------
# Instances.


def realistic(n, i, seed, k=8):
    """Algorithm 1 on k demonstrations of a hidden model: class-conditional Gaussians
    (true log-odds affine), reported by the "LLM" rescaled per class, with a label bias,
    a per-context shift and per-row noise."""
    rng = np.random.default_rng(seed)
    y = np.arange(k) % n
    rng.shuffle(y)
    mu = np.zeros((n, n - 1))
    mu[1:] = 2.0 * np.eye(n - 1)
    x = mu[y] + rng.normal(size=(k, n - 1))
    t = 2.0 * x - 2.0
    slope = rng.uniform(0.5, 1.5, n - 1)
    bias = rng.normal(size=n - 1) * 0.5
    feats, labels, qids = [], [], []
    for ctx in itertools.permutations(range(k), i):
        q = [j for j in range(k) if j not in ctx]
        shift = rng.normal(size=n - 1) * 0.5
        feats.append(slope * t[q] + bias + shift + rng.normal(size=(len(q), n - 1)) * 1.2)
        labels += list(y[q])
        qids += q
    return np.concatenate(feats), np.array(labels), np.array(qids)


def random_instance(n, rows, seed, groups=10):
    """Gaussian features, labels drawn from a softmax of a random positive-slope
    affine model (so the optimum is interior and finite), random query ids."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, n - 1)) * 1.5 + rng.normal(size=n - 1)
    z = np.concatenate([np.zeros((rows, 1)), x * rng.uniform(0.3, 1.5, n - 1)
                        + rng.normal(size=n - 1) * 0.5], 1)
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    y = np.array([rng.choice(n, p=pi) for pi in p])
    y[:n] = np.arange(n)  # every class present
    return x, y, rng.integers(0, groups, rows)


# (kind, size, tau, lambda_inv, whether the constraint is active at the optimum)
SMALL = [
    ("random", 50, -1.0, 0.0, False),
    ("realistic", 2, 0.995, 0.1, True),
    ("random", 600, 0.99, 0.5, True),
    ("realistic", 3, 0.0, 0.0, False),
]
LARGE_N = 3
LARGE = [("realistic", 5, 0.9995, 0.0, True), ("realistic", 5, 0.0, 0.1, False)]


def _instances(n, cases, seed0):
    out = []
    for j, (kind, size, *_rest) in enumerate(cases):
        seed = 100 * n + seed0 + j
        out.append(realistic(n, size, seed) if kind == "realistic"
                   else random_instance(n, size, seed))
    return out


def _scipy_all(packed, sizes, lams, taus, per_class):
    """SciPy on each problem, on the padded arrays (the mask drops the padding): one
    shape, so its JAX derivatives compile once."""
    out = []
    for k in range(len(sizes)):
        one = Problem(packed.features[k], packed.labels[k], packed.query_ids[k],
                      packed.mask[k], packed.num_queries)
        out.append(solvers.scipy(one, lams[k], taus[k], per_class=per_class))
    return out


def _check_parity(sol, refs, packed, sizes, cases, per_class, report):
    for k, (ref, case) in enumerate(zip(refs, cases)):
        active = case[-1]
        assert ref.status == Status.CONVERGED, (k, ref)
        assert int(sol.status[k]) == Status.CONVERGED, (k, sol)
        # The instance is what it claims: constraint active or not at the optimum.
        tau = case[2]
        if per_class:
            cos = np.asarray(ref.params.w) / np.hypot(ref.params.b, ref.params.w)
            assert (np.min(cos) - tau < 1e-6) == active, (k, cos, tau)
        else:
            assert (ref.constraint - tau < 1e-6) == active, (k, ref.constraint, tau)
        f, f_ref = float(sol.objective[k]), float(ref.objective)
        gap = abs(f - f_ref) / abs(f_ref)
        viol = float(sol.violation[k])
        params = np.concatenate([np.asarray(sol.params.b[k]), np.asarray(sol.params.w[k])])
        params_ref = np.concatenate([ref.params.b, ref.params.w])
        dpar = float(np.max(np.abs(params - params_ref)))
        report.append((gap, viol, dpar))
        assert gap <= 1e-6, (k, f, f_ref)
        assert viol <= 1e-7, (k, viol)
        assert dpar <= 1e-4, (k, params, params_ref)
        n_rows = sizes[k]
        x = packed.features[k, :n_rows]
        pred = np.argmax(calibrated_logits(Params(sol.params.b[k], sol.params.w[k]), x), -1)
        pred_ref = np.argmax(calibrated_logits(
            Params(jnp.asarray(ref.params.b), jnp.asarray(ref.params.w)), x), -1)
        np.testing.assert_array_equal(pred, pred_ref)


PARITY = {}  # method -> [(gap, violation, param diff)], printed by the last test


# n = 3 is covered by the large instances, n = 5 by bench_solver.py and
# sweep_solver.py (each n costs a compile and eight SciPy solves; CI's budget).
@pytest.mark.parametrize("n", [2, 4, 6])
def test_parity_with_scipy_small(x64, n):
    problems = _instances(n, SMALL, 0)
    packed, sizes = pack_batch(problems, "float64")
    lams = [c[3] for c in SMALL]
    taus = [c[2] for c in SMALL]
    sols = {}
    for method, per_class in (("augmented_lagrangian", False), ("projected", True)):
        sol = solvers.solve_batch(packed, jnp.asarray(lams), jnp.asarray(taus), method=method)
        refs = _scipy_all(packed, sizes, lams, taus, per_class)
        _check_parity(sol, refs, packed, sizes, SMALL, per_class,
                      PARITY.setdefault(method, []))
        sols[method] = sol
    # The per-class problem has the smaller feasible set (up to the O(eps^2) smoothing
    # of the mean form's cosine), so the projected optimum is never lower; where the
    # constraint binds, the mean form lets some class leave its own cone.
    al, pg = sols["augmented_lagrangian"], sols["projected"]
    assert np.all(np.asarray(pg.objective) >= np.asarray(al.objective) * (1 - 1e-5))
    k = 1  # realistic, tau active
    cos_al = np.asarray(class_cosines(Params(al.params.b[k], al.params.w[k])))
    if n > 2:
        assert np.min(cos_al) < taus[k] - 1e-4
        assert float(pg.objective[k]) > float(al.objective[k]) * (1 + 1e-6)


def test_parity_with_scipy_large(x64):
    problems = _instances(LARGE_N, LARGE, 50)
    packed, sizes = pack_batch(problems, "float64")
    assert min(sizes) == 20160
    lams = [c[3] for c in LARGE]
    taus = [c[2] for c in LARGE]
    for method, per_class in (("augmented_lagrangian", False), ("projected", True)):
        sol = solvers.solve_batch(packed, jnp.asarray(lams), jnp.asarray(taus), method=method)
        refs = _scipy_all(packed, sizes, lams, taus, per_class)
        _check_parity(sol, refs, packed, sizes, LARGE, per_class,
                      PARITY.setdefault(method, []))
    for method, rows in PARITY.items():
        gap, viol, dpar = np.max(np.array(rows), axis=0)
        print(f"\nparity {method}: {len(rows)} instances, max rel objective gap {gap:.1e}, "
              f"max violation {viol:.1e}, max param diff {dpar:.1e}")


@pytest.mark.parametrize("method,batch_size", [
    ("augmented_lagrangian", 4),  # one vmap of the whole batch (the accelerator default)
    ("augmented_lagrangian", 3),  # lax.map over vmapped chunks of 3, and a remainder of 1
    ("projected", 4),
    ("projected", None),  # the backend default: on CPU lax.map, one after another
])
def test_vmapped_equals_one_by_one(x64, method, batch_size):
    n = 4  # the shapes of a parity batch: its compilation is reused
    problems = _instances(n, SMALL, 0)
    packed, _ = pack_batch(problems, "float64")
    lams = jnp.asarray([c[3] for c in SMALL])
    taus = jnp.asarray([c[2] for c in SMALL])
    fn = {"augmented_lagrangian": solvers.augmented_lagrangian,
          "projected": solvers.projected}[method]
    batched = solvers.solve_batch(packed, lams, taus, method=method,
                                  batch_size=batch_size, threads=1)
    single = jax.jit(fn)
    for k in range(len(SMALL)):
        one = jax.tree.map(lambda a: a[k], packed)
        sol = single(one, lams[k], taus[k])
        # Batched reductions may round differently, so iterates can part at the
        # last bits; both must stop at the same optimum, to within the solver
        # tolerance, with the same status.
        assert int(sol.status) == int(batched.status[k]) == Status.CONVERGED
        f, fb = float(sol.objective), float(batched.objective[k])
        assert abs(f - fb) <= 1e-10 * abs(f)
        np.testing.assert_allclose(sol.params.b, batched.params.b[k], atol=1e-6)
        np.testing.assert_allclose(sol.params.w, batched.params.w[k], atol=1e-6)


@pytest.mark.parametrize("sc_star", [False, True])
def test_constraint_derivatives_equal_autodiff(x64, sc_star):
    # The closed-form value, gradient and Hessian of the scaled mean-cosine
    # constraint against jax.grad / jax.hessian of the same function, at points near
    # the apex (where the smoothed cosine's curvature is 1 / COSINE_EPS^2), at unit
    # scale and far out. Both are float64 evaluations of the same derivatives in a
    # different order of operations: 1e-12 relative to the largest entry (observed
    # below 2e-14).
    rng = np.random.default_rng(7)
    tau = jnp.float64(0.3)

    def con(z):
        cos = trust_region(params_from_flat(z, sc_star))
        return (cos - tau) * jnp.sqrt(1.0 + jnp.dot(z, z))

    @jax.jit
    def closed_form(x):
        # The pieces the solver composes (lagrangian_state.derivatives): the margin and
        # the mean cosine's derivatives in the full x, restricted to z for SC*.
        full = parameters.expand(x, sc_star)
        _, gm, hm = geometry.mean_cosine_derivatives(full)
        return geometry.scale_constraint(geometry.cosine_margin(full, tau),
                                         *parameters.restrict(gm, hm, sc_star), x)

    # Compiled once per size: op-by-op autodiff compiled every primitive on its own.
    auto = jax.jit(lambda z: (con(z), jax.grad(con)(z), jax.hessian(con)(z)))
    for n1 in (1, 2, 5):
        for scale in (1e-4, 1.0, 30.0):
            x = jnp.asarray(rng.normal(size=n1 if sc_star else 2 * n1) * scale)
            for ours, ref in zip(closed_form(x), auto(x)):
                big = float(jnp.max(jnp.abs(ref)))
                assert float(jnp.max(jnp.abs(ours - ref))) <= 1e-12 * max(big, 1.0)


def test_polar_coordinates_chain_rule_equals_autodiff(x64):
    # The follow-up phase's coordinates: one class as (phi, s = log r). The closed-form
    # chain rule (charts.polar_chain) of f's and of the mean cosine's gradient and
    # Hessian against jax.grad / jax.hessian of the composed function, at unit scale
    # and along a run-off (r = e^8); cls = -1 leaves them unchanged. float64, the same
    # derivatives in a different order of operations. The chain rule's terms are of
    # order r ||g_x|| and r^2 ||H_x|| and may cancel (a saturated class: f flat in it),
    # so the bound is 1e-12 of that scale (observed: at most 5e-15 of it, errors up
    # to 9e-8 at a scale of 2e7).
    rng = np.random.default_rng(3)
    x, y, g = realistic(3, 2, 0, k=4)
    prob = jax.tree.map(lambda a: a[0], pack_batch([(x, y, g)], "float64")[0])
    from sc_jax.calibration.objective import design, value_grad_hess

    d = design(prob)
    n1 = 2

    def composed(fn):
        return lambda v, c: fn(charts.from_polar(v, c, n1))

    # One compilation each (the class is an argument, not a constant): op-by-op
    # autodiff compiled every primitive of the objective's Hessian on its own.
    pairs = [(jax.jit(derivs), jax.jit(jax.grad(composed(fn))), jax.jit(jax.hessian(composed(fn))))
             for fn, derivs in ((lambda v: value_grad_hess(v, d, 0.1)[0],
                                 lambda v: value_grad_hess(v, d, 0.1)),
                                (lambda v: trust_region(params_from_flat(v, False)),
                                 geometry.mean_cosine_derivatives))]
    chain = jax.jit(charts.polar_chain, static_argnums=2)
    for cls in (0, 1):
        for s_val in (0.0, 8.0):
            z = jnp.asarray(rng.normal(size=4) * 0.3).at[n1 + cls].set(s_val)
            xz = charts.from_polar(z, jnp.int32(cls), n1)
            assert jnp.allclose(charts.to_polar(xz, jnp.int32(cls), n1), z, atol=1e-12)
            for derivs, grad, hess in pairs:
                _, gx, hx = derivs(xz)
                gz, hz = chain(z, jnp.int32(cls), n1, gx, hx)
                r = float(jnp.exp(z[n1 + cls]))
                scale = 1.0 + r * float(jnp.max(jnp.abs(gx))) + r * r * float(jnp.max(jnp.abs(hx)))
                c = jnp.int32(cls)
                for ours, ref in ((gz, grad(z, c)), (hz, hess(z, c))):
                    big = float(jnp.max(jnp.abs(ref)))
                    assert float(jnp.max(jnp.abs(ours - ref))) <= 1e-12 * max(big, scale)
                same = charts.polar_chain(z, jnp.int32(-1), n1, gx, hx)
                assert jnp.array_equal(same[0], gx) and jnp.array_equal(same[1], hx)


def test_cosine_coordinates_chain_rule_equals_autodiff(x64):
    # The apex follow-up's chart: classes near theta_c = 0 as (b_c, t_c = cos_c). The
    # closed-form chain rule (charts.cosine_chain) of f's gradient and Hessian against
    # jax.grad / jax.hessian of f composed with charts.from_cosine, and the mean
    # cosine's (charts.cosine_constraint_chain: exactly 1 / n1 along t_c, no
    # curvature) against autodiff of the composed mean cosine, at classes from 1e-5
    # to 0.1 from their apex with cosines from -0.9 to 0.95, one class or both in
    # cosine form; the margin read in this chart equals the margin of the same point
    # in (b, w), and the chart round-trips. float64, the same derivatives in another
    # order of operations: the chain rule's terms are up to ||g_x|| / (1 - t^2)^2.5
    # and ||H_x|| R^2 / (1 - t^2)^3 (R = sqrt(b^2 + eps^2)), so the bound is 1e-12 of
    # that scale.
    from sc_jax.calibration.objective import design, value_grad_hess

    rng = np.random.default_rng(5)
    x, y, g = realistic(3, 2, 0, k=4)
    d = design(jax.tree.map(lambda a: a[0], pack_batch([(x, y, g)], "float64")[0]))
    n1, tau = 2, jnp.float64(0.3)

    def f_of(v, apex):
        return value_grad_hess(charts.from_cosine(v, apex, n1), d, 0.1)[0]

    def cos_of(v, apex):
        return trust_region(params_from_flat(charts.from_cosine(v, apex, n1), False))

    # One compilation each (apex is an argument, not a constant).
    auto = {name: (jax.jit(jax.grad(fn)), jax.jit(jax.hessian(fn)))
            for name, fn in (("f", f_of), ("cos", cos_of))}
    for apex in ([True, False], [True, True], [False, True]):
        apex = jnp.asarray(apex)
        chart = charts.cosine(apex)
        for rb, t in ((1e-5, 0.5), (1e-3, -0.9), (0.1, 0.95), (3e-3, 0.02)):
            z = jnp.asarray(np.concatenate([rng.normal(size=n1) * rb,
                                            np.where(apex, t, rng.normal(size=n1))]))
            xz = charts.to_x(z, chart, n1)
            np.testing.assert_allclose(charts.from_x(xz, chart, n1), z, rtol=1e-12, atol=1e-15)
            np.testing.assert_allclose(charts.margin(z, chart, tau, n1),
                                       geometry.cosine_margin(xz, tau), rtol=0, atol=1e-14)
            _, gx, hx = value_grad_hess(xz, d, 0.1)
            _, gm, hm = geometry.mean_cosine_derivatives(xz)
            gz, hz, gmz, hmz = charts.carry(z, chart, n1, gx, hx, gm, hm)
            k = 1.0 / (1.0 - t * t) ** 3
            scale = 1.0 + k * (float(jnp.max(jnp.abs(gx))) + float(jnp.max(jnp.abs(hx))))
            for ours, ref in ((gz, auto["f"][0](z, apex)), (hz, auto["f"][1](z, apex))):
                assert float(jnp.max(jnp.abs(ours - ref))) <= 1e-12 * scale
            big = 1.0 + float(jnp.max(jnp.abs(hm)))
            for ours, ref in ((gmz, auto["cos"][0](z, apex)), (hmz, auto["cos"][1](z, apex))):
                assert float(jnp.max(jnp.abs(ours - ref))) <= 1e-12 * big
            # The plain chart leaves every derivative as it is.
            same = charts.carry(z, charts.plain(n1), n1, gx, hx, gm, hm)
            for a, b in zip(same, (gx, hx, gm, hm)):
                assert jnp.array_equal(a, b)


@pytest.mark.parametrize("sc_star", [False, True])
def test_one_loop_over_buckets_equals_each_alone(x64, sc_star):
    # Under jit the CPU default (batch_size 1) solves all buckets with one copy of the loop,
    # reading rows through a switch on the bucket (solvers.solve_slots). Against
    # each instance solved alone: buckets of unequal counts (a skipped slot), one
    # with a subsample level and one without (coarse_rows 64: levels where N > 128),
    # and two starts (the multi-start's vmap around the switch). Each instance runs
    # the same arithmetic as alone, so the bound is the vmapped test's: the same
    # status, the objective to 1e-10 relative (float64), parameters to 1e-6.
    n = 3
    problems = _instances(n, SMALL[:3], 2)
    small, _ = pack_batch(problems[:1], "float64")  # 50 rows: no subsample level
    large, _ = pack_batch(problems[1:], "float64")  # 336 and 600 rows: one level
    opts = solvers.SolverOptions(coarse_rows=64, num_starts=2)
    assert opts.coarse_levels(small.features.shape[1]) == []
    assert opts.coarse_levels(large.features.shape[1]) == [64]
    lams = [jnp.asarray([c[3] for c in SMALL[:1]]), jnp.asarray([c[3] for c in SMALL[1:3]])]
    taus = [jnp.asarray([c[2] for c in SMALL[:1]]), jnp.asarray([c[2] for c in SMALL[1:3]])]
    # Traced arguments: the caller's program holds every bucket (concrete ones are
    # solved one bucket per program, batching.run_parts).
    together = jax.jit(lambda p, lam, tau: solvers.solve_batch(
        p, lam, tau, sc_star=sc_star, options=opts, batch_size=1))([small, large], lams, taus)
    single = jax.jit(functools.partial(solvers.augmented_lagrangian, sc_star=sc_star,
                                       options=opts))
    for packed, lam, tau, sols in zip((small, large), lams, taus, together):
        assert sols.objective.shape == lam.shape
        for k in range(lam.shape[0]):
            sol = single(jax.tree.map(lambda a, k=k: a[k], packed), lam[k], tau[k])
            assert int(sol.status) == int(sols.status[k]) == Status.CONVERGED
            f, fb = float(sol.objective), float(sols.objective[k])
            assert abs(f - fb) <= 1e-10 * abs(f)
            np.testing.assert_allclose(sol.params.b, sols.params.b[k], atol=1e-6)
            np.testing.assert_allclose(sol.params.w, sols.params.w[k], atol=1e-6)


def test_sc_star_parity(x64):
    problems = _instances(5, SMALL[1:3], 0)
    packed, sizes = pack_batch(problems, "float64")
    lams, taus = [0.1, 0.0], [0.999, -1.0]
    for method, per_class in (("augmented_lagrangian", False), ("projected", True)):
        sol = solvers.solve_batch(packed, jnp.asarray(lams), jnp.asarray(taus), method=method,
                                  sc_star=True)
        np.testing.assert_array_equal(sol.params.w, 1.0)
        for k in range(2):
            one = Problem(packed.features[k], packed.labels[k], packed.query_ids[k],
                          packed.mask[k], packed.num_queries)
            ref = solvers.scipy(one, lams[k], taus[k], sc_star=True, per_class=per_class)
            assert int(sol.status[k]) == Status.CONVERGED == ref.status
            assert abs(float(sol.objective[k]) - ref.objective) <= 1e-6 * abs(ref.objective)
            np.testing.assert_allclose(sol.params.b[k], ref.params.b, atol=1e-4)


def test_status_codes(x64):
    # Two Newton steps cannot solve anything here (MAX_ITERATIONS, and INFEASIBLE where
    # the constraint binds); with the full budget every instance converges, tau = -1
    # on its first subproblem and an active tau after several multiplier updates.
    # After two steps f usually still falls along a ray, which starts the run-off
    # follow-up: a phase with a budget of max_iter of its own.
    problems = _instances(4, SMALL, 0)
    packed, _ = pack_batch(problems, "float64")
    lams = jnp.zeros(4)
    taus = jnp.asarray([-1.0, 0.995, 0.99, -1.0])
    tight = solvers.solve_batch(packed, lams, taus,
                                options=SolverOptions(max_iter=2, follow_runoffs=False))
    assert np.all(np.asarray(tight.status) != Status.CONVERGED)
    assert np.all(np.asarray(tight.iterations) == 2)
    followed = solvers.solve_batch(packed, lams, taus, options=SolverOptions(max_iter=2))
    assert np.all(np.isin(np.asarray(followed.iterations), [2, 4]))
    full = solvers.solve_batch(packed, lams, taus)
    assert np.all(np.asarray(full.status) == Status.CONVERGED)
    assert list(np.asarray(full.outer_iterations)[[0, 3]]) == [1, 1]
    assert np.all(np.asarray(full.outer_iterations)[1:3] > 1)
    assert np.all(np.asarray(full.multiplier)[[0, 3]] == 0)
    assert np.all(np.asarray(full.multiplier)[1:3] > 0)
    # Three projected-gradient steps converge nowhere either. The ray test that every
    # solver applies at its end point can find f still falling at 2x and 4x of an
    # iterate far short of the optimum (instance 3, tau = -1): UNBOUNDED, as the
    # augmented Lagrangian's first phase reports such a stop; the others MAX_ITERATIONS.
    pg = solvers.solve_batch(packed, lams, taus, method="projected",
                             options=SolverOptions(max_pg_iter=3, pg_restart=3))
    assert set(np.asarray(pg.status)[:3]) == {Status.MAX_ITERATIONS}
    assert int(pg.status[3]) in (Status.MAX_ITERATIONS, Status.UNBOUNDED)
    assert np.all(np.asarray(pg.iterations) == 3)


def test_nonfinite_status():
    # An instance whose data overflow float32 reports NONFINITE instead of raising.
    prob = Problem(jnp.full((1, 64, 1), 3e38, jnp.float32), jnp.zeros((1, 64), jnp.int32),
                   jnp.zeros((1, 64), jnp.int32), jnp.ones((1, 64), jnp.float32), 8)
    prob = jax.tree.map(lambda a: a.at[0, 0].set(1) if a.dtype == jnp.int32 else a, prob)
    sol = solvers.solve_batch(prob, jnp.zeros(1), jnp.full(1, -1.0), method="projected")
    assert int(sol.status[0]) == Status.NONFINITE


def test_split_parts_deals_every_instance_once_into_equal_shapes():
    counts, rows = [5, 1, 3, 8], [64, 20480, 1792, 352]
    for parts in (1, 2, 3, 4, 9):
        slots, assign = solvers.split_parts(counts, rows, parts)
        assert slots == [-(-c // parts) for c in counts]
        for j, count in enumerate(counts):
            dealt = sorted(i for t in range(parts) for i in assign[t][j])
            assert dealt == list(range(count))
            assert all(len(assign[t][j]) <= slots[j] for t in range(parts))
        # Balanced: the most loaded part exceeds the least by at most one instance
        # of the largest bucket (the greedy deal's bound with equal-size slots).
        loads = [sum(len(assign[t][j]) * (rows[j] + 256) for j in range(len(counts)))
                 for t in range(parts)]
        if parts <= 2:
            assert max(loads) - min(loads) <= max(rows) + 256


@pytest.mark.parametrize("method", ["augmented_lagrangian", "projected"])
def test_threaded_parts_equal_one_call(x64, method):
    # Buckets of 3 and 1 instances over 3 threads: parts with fillers, one instance
    # alone in its bucket. Each instance runs the same loop as in one call (they
    # agree to the last bit on the 2-core AMD machine); a part is another program
    # shape, so the bound is the vmapped test's: the same status, the objective to
    # 1e-10 relative (float64; a worker that lost the caller's jax.enable_x64 would
    # solve in float32 and miss by ~1e-7), parameters to 1e-6.
    n = 3
    problems = _instances(n, SMALL, 1)
    packed_a, _ = pack_batch(problems[:3], "float64")
    packed_b, _ = pack_batch(problems[3:], "float64")
    lams = [jnp.asarray([c[3] for c in SMALL[:3]]), jnp.asarray([SMALL[3][3]])]
    taus = [jnp.asarray([c[2] for c in SMALL[:3]]), jnp.asarray([SMALL[3][2]])]
    one = solvers.solve_batch([packed_a, packed_b], lams, taus, method=method, threads=1)
    three = solvers.solve_batch([packed_a, packed_b], lams, taus, method=method, threads=3)
    for a, b in zip(one, three):
        assert b.objective.dtype == jnp.float64
        np.testing.assert_array_equal(a.status, b.status)
        np.testing.assert_allclose(b.objective, a.objective, rtol=1e-10)
        np.testing.assert_allclose(b.params.w, a.params.w, atol=1e-6)
        np.testing.assert_allclose(b.params.b, a.params.b, atol=1e-6)
    assert np.all(np.asarray(one[0].status) == Status.CONVERGED)


def test_multistart_batch_runs_on_one_thread(monkeypatch):
    # Concurrent calls of a vmapped multi-start deadlocked in XLA's CPU thread pool
    # (solve_batch), so with num_starts > 1 the calls run on one host thread, whatever
    # `threads` says; with one start on as many as asked (the check can fail).
    calls = []
    real = batching.run_parts
    monkeypatch.setattr(batching, "run_parts", lambda *a: calls.append(a[4]) or real(*a))
    packed, _ = pack_batch(_instances(2, SMALL[:2], 1), "float32")
    lam, tau = jnp.asarray([1.0, 1.0]), jnp.asarray([-1.0, -1.0])
    multi = solvers.solve_batch(packed, lam, tau, threads=2,
                                options=SolverOptions(num_starts=2))
    assert calls == [1] and multi.objective.shape == (2,)
    solvers.solve_batch(packed, lam, tau, threads=2, options=SolverOptions(num_starts=1))
    assert calls == [1, 2]


def test_threads_default_and_checks(monkeypatch):
    monkeypatch.delenv(solvers.THREADS_ENV, raising=False)
    expected = len(os.sched_getaffinity(0)) if jax.default_backend() == "cpu" else 1
    assert solvers.resolve_threads(None) == expected
    assert solvers.resolve_threads(np.int64(3)) == 3
    monkeypatch.setenv(solvers.THREADS_ENV, "1")
    assert solvers.resolve_threads(None) == 1
    bad_envs = ("two", "0") if jax.default_backend() == "cpu" else ()  # read on CPU only
    for bad, env in [(0, None), (True, None)] + [(None, e) for e in bad_envs]:
        if env is not None:
            monkeypatch.setenv(solvers.THREADS_ENV, env)
        with pytest.raises(ValueError, match="must be a positive int"):
            solvers.resolve_threads(bad)
    with pytest.raises(ValueError, match="threads must be"):
        numpy_fit.fit_batch([realistic(2, 1, 0)], threads=0)


def test_batch_size_default_follows_backend():
    # CPU: one instance after another (lockstep only adds waiting there); GPU/TPU:
    # the whole bucket in one vmap. Explicit sizes pass through.
    expected = 1 if jax.default_backend() == "cpu" else None
    assert solvers.resolve_batch_size(None) == expected
    assert solvers.resolve_batch_size(np.int64(3)) == 3
    with pytest.raises(ValueError, match="batch_size must be"):
        solvers.resolve_batch_size(0)


def test_unknown_method():
    with pytest.raises(ValueError, match="unknown JAX solver"):
        solvers.solve_batch(None, None, None, method="bfgs")


def test_separable_infeasible_direction_does_not_run_off():
    # 56 rows of k = 8 surrogate data (size 1) that an affine map separates along a
    # direction just outside the trust region (mean cosine 0.98 < tau = 0.9989). The
    # first subproblem's penalty on the plain cosine is bounded on rays, so its
    # infimum lies at infinity along that direction; the scaled constraint
    # (cosine x sqrt(1 + ||x||^2)) makes the penalty grow there. Without the scaling
    # this solve ends INFEASIBLE; now it converges to SciPy's optimum in both dtypes.
    rng = np.random.default_rng(1002)
    world = synthetic.World(4, rng.uniform(0.5, 1.5, 3), beta=rng.normal(size=3) * 0.5,
                            seed=2)
    x, y, g = world.surrogate(8, (1,))[1]
    acc = defaults.base_accuracy(x, y)
    tau = defaults.tau_from_accuracy(acc, 4)
    assert len(y) == 56 and acc < 1 and tau > 0.998
    ref = numpy_fit.fit(x, y, g, tau=tau, solver="scipy")
    f64 = numpy_fit.fit(x, y, g, tau=tau, dtype="float64")
    assert f64.status == Status.CONVERGED and f64.violation <= 1e-9
    assert f64.objective <= ref.objective * (1 + 1e-7)
    # float32: within 1e-4 of the float64 optimum (its tolerance is 1e-5 on the
    # gradient and 1e-6 on the cosine; the objective is O(1)).
    f32 = numpy_fit.fit(x, y, g, tau=tau)
    assert f32.status == Status.CONVERGED and f32.violation <= 1e-6
    assert abs(f32.objective - f64.objective) <= 1e-4 * f64.objective


def test_rejected_step_below_rounding_shrinks_the_radius():
    # A real surrogate problem (SmolLM2-135M-Instruct, SST-2, k = 4, seed 102, size 1: 12
    # rows) whose optimum is the apex theta = 0 (the LLM is anti-informative there and
    # tau = cos 90 deg). float32 reaches a point where the step's predicted decrease
    # is below the rounding of f (100 eps |L_A|) and the step is rejected: the radius
    # did not shrink then, the same trial came back every pass, and the fit ended
    # MAX_ITERATIONS after 200. Each rejection now shrinks the radius.
    x = np.array([-2.6642838, -2.1440563, 1.7712517, -2.2794876, -1.3384476, 1.7430305,
                  1.1588364, 2.616272, 2.261942, 2.9940777, 3.4085026, 2.6681194])[:, None]
    y = np.array([0, 1, 1, 0, 1, 1, 0, 0, 1, 0, 0, 1])
    g = np.array([1, 2, 3, 0, 2, 3, 0, 1, 3, 0, 1, 2])
    acc = defaults.base_accuracy(x, y)
    tau = defaults.tau_from_accuracy(acc, 2)
    assert 0.5 <= acc < 0.7 and abs(tau) < 1e-15
    f64 = numpy_fit.fit(x, y, g, tau=tau, dtype="float64")
    assert f64.status == Status.CONVERGED and np.hypot(f64.b, f64.w).max() < 1e-6
    f32 = numpy_fit.fit(x, y, g, tau=tau)
    assert f32.status == Status.CONVERGED and f32.violation <= 1e-6
    # Within 1e-4 of the float64 optimum (float32 tolerances: 1e-5 on the gradient,
    # 1e-6 on the cosine; f is O(1)).
    assert abs(f32.objective - f64.objective) <= 1e-4 * f64.objective


def test_separable_along_the_identity_is_unbounded(x64):
    # Every class's log-odds separate the labels perfectly (the base model is 100%
    # right in-sample), so scaling w along the identity keeps the constraint and
    # drives the objective to 0: no finite minimiser. The status says so.
    rng = np.random.default_rng(0)
    y = np.arange(60) % 3
    x = np.stack([(y == 1) * 3.0 - 1.5, (y == 2) * 3.0 - 1.5], 1) + rng.uniform(-0.3, 0.3, (60, 2))
    g = np.arange(60) % 6
    for tau in (-1.0, 0.9):
        sol = numpy_fit.fit(x, y, g, tau=tau, lambda_inv=0.0, dtype="float64")
        assert sol.status == Status.UNBOUNDED, sol
        assert sol.violation <= 1e-9 and sol.objective < 1e-6
    # A finite optimum is not: flip a few labels.
    y2 = y.copy()
    y2[:6] = (y2[:6] + 1) % 3
    sol = numpy_fit.fit(x, y2, g, tau=0.9, lambda_inv=0.0, dtype="float64")
    assert sol.status == Status.CONVERGED


# Qwen2.5-Coder-0.5B-Instruct, k = 4, Financial Phrasebank, seed 1, context size 1: the 12 surrogate
# rows (log-odds of classes 1 and 2 against class 0, exact float32 values) from
# benchmarks/real_eval/qwen2.5-0.5b/k4/scores/financial_phrasebank-k4-seed1.npz.
FPB_ROWS = np.asarray([
    [-2.624812126159668, -0.10481834411621094], [-2.5123281478881836, -0.3521566390991211],
    [-2.1752986907958984, -0.1653156280517578], [-3.0191574096679688, -0.43535327911376953],
    [-3.216289520263672, -1.0158758163452148], [-2.3370132446289062, -0.7048664093017578],
    [-0.16124826669692993, -0.2785549759864807], [-1.1951169967651367, 0.03365993499755859],
    [-0.26567935943603516, -0.6214427947998047], [-2.572962760925293, -0.36794281005859375],
    [-2.496318817138672, -0.1346302032470703], [-2.467409133911133, -0.40059375762939453]])
FPB_LABELS = np.asarray([2, 1, 0, 0, 1, 0, 0, 2, 0, 0, 2, 1])
FPB_QUERIES = np.asarray([1, 2, 3, 0, 2, 3, 0, 1, 3, 0, 1, 2])


def test_float32_run_off_on_real_rows_is_not_stopped_by_rounding_noise():
    # Class 2 runs off along its ray (the infimum is not attained) while the
    # constraint (tau 0.98632 from the Appendix A schedule) binds. float32 once grew
    # rho to 100 on the constraint measure's rounding noise (about 1e-6, its
    # feas_tol) and then crawled, ending MAX_ITERATIONS at f = 0.8730, 41% above
    # float64. It now ends UNBOUNDED at 0.61669 (see the next test); the bound 0.62
    # (5e-3 relative) sits far below the failure. The status is not pinned: along a run-off float32
    # may legitimately stop where its falls drop below f's rounding and report
    # CONVERGED or MAX_ITERATIONS (runoff.not_attained), and which it reports
    # follows the rounding of the CPU's vector code.
    sol = numpy_fit.fit(FPB_ROWS, FPB_LABELS, FPB_QUERIES, lambda_inv=0.1, dtype="float32")
    assert abs(sol.tau - 0.98632) < 1e-5  # the schedule's value for this base accuracy
    assert sol.status in (Status.UNBOUNDED, Status.CONVERGED, Status.MAX_ITERATIONS), sol
    assert sol.objective <= 0.62 and sol.violation <= 1e-6, sol


def test_run_off_follow_up_reaches_scipy_on_real_rows(x64):
    # The same 12 real rows: class 2 runs off while class 1's slope must shrink to keep
    # the mean cosine, so the run-off is not a straight ray. SciPy's best start ends
    # at f = 0.616677 (MAX_ITERATIONS, still running off). Without the follow-up
    # phase float64 stopped UNBOUNDED at 0.616824 (1.5e-4 above, at w_2 = 1.6e3);
    # with the class in polar coordinates it walks on to w_2 = 6.9e6 and 0.616675.
    # Bounds: the sweep's for an unattained infimum (1e-7 and 1e-4 times max(1, |f|));
    # the run without the phase must miss by more than 1e-5 (observed 1.5e-4), so the
    # test fails if the phase stops doing the work.
    def f64(sol):
        return float(objective(Params(jnp.asarray(sol.b, jnp.float64), jnp.asarray(sol.w, jnp.float64)),
                               _problem64(FPB_ROWS, FPB_LABELS, FPB_QUERIES), 0.1))

    tau = defaults.tau_from_accuracy(defaults.base_accuracy(FPB_ROWS, FPB_LABELS), 3)
    ref = scipy_best_references.scipy_best(
        "run_off_real_rows", _problem64(FPB_ROWS, FPB_LABELS, FPB_QUERIES), 0.1, tau)
    fits = {(dtype, follow): numpy_fit.fit(
        FPB_ROWS, FPB_LABELS, FPB_QUERIES, lambda_inv=0.1, dtype=dtype,
        options=SolverOptions(follow_runoffs=follow))
        for dtype, follow in (("float64", True), ("float64", False), ("float32", True))}
    r64 = fits["float64", True]
    assert r64.status == Status.UNBOUNDED and r64.violation <= 1e-9, r64
    assert r64.objective - ref.objective <= 1e-7 * max(1.0, abs(ref.objective))
    assert fits["float64", False].objective - ref.objective > 1e-5
    r32 = fits["float32", True]
    assert r32.violation <= 1e-6
    assert f64(r32) - r64.objective <= 1e-4 * max(1.0, abs(r64.objective))


@pytest.mark.parametrize("one_site", [False, True])
def test_ray_test_follows_a_fall_of_many_orders_of_magnitude(x64, one_site):
    # Along a ray of separation f behaves like A exp(-kappa s): from 1e-60, f at 2x and
    # 4x is 1e-120 and 1e-240. Each fall must be judged against the rounding of the
    # value it falls from; judged against f's (1e-74) the second fall went unseen, and
    # a 4-start fit of near_separable seed 2 (f = 1.1e-60) ended CONVERGED.
    x = jnp.asarray([69.0, 69.0])
    fun = lambda z: jnp.exp(-jnp.sum(z))  # noqa: E731
    feasible = lambda z: jnp.asarray(True)  # noqa: E731
    hess = jax.hessian(fun)(x)
    assert runoff.not_attained(x, fun(x), hess, fun, feasible, 2, converged=jnp.asarray(True),
                               tol=1e-9, one_site=one_site).unbounded
    # A fall that underflows to 0 counts; a value that stays put does not.
    x = jnp.asarray([300.0, 300.0])
    assert fun(2 * x) == 0 and runoff.not_attained(
        x, fun(x), jax.hessian(fun)(x), fun, feasible, 2, converged=jnp.asarray(True), tol=1e-9,
        one_site=one_site)[0]
    # The run-off is followed while each doubling lowers f by more than 1e-6 |f|:
    # from x = (1, 1), f = e^-2, the end point lies far out along a ray...
    x = jnp.asarray([1.0, 1.0])
    rt = runoff.not_attained(x, fun(x), jax.hessian(fun)(x), fun, feasible, 2,
                             converged=jnp.asarray(False), tol=1e-9, one_site=one_site)
    assert rt.unbounded and float(rt.f) == float(fun(rt.x)) and float(rt.f) < 1e-100
    # One evaluation per pass (one_site) and the vmapped batch follow the same chain.
    other = runoff.not_attained(x, fun(x), jax.hessian(fun)(x), fun, feasible, 2,
                                converged=jnp.asarray(False), tol=1e-9, one_site=not one_site)
    assert bool(other.unbounded) and bool(jnp.all(other.x == rt.x))
    assert float(other.f) == float(rt.f)
    # ... but a saturated one (f falls by 1e-12 when scaled) does not move.
    sat = lambda z: 1.0 + 1e-12 * jnp.exp(-jnp.sum(z))  # noqa: E731
    rt = runoff.not_attained(x, sat(x), jax.hessian(sat)(x), sat, feasible, 2,
                             converged=jnp.asarray(False), tol=1e-9, one_site=one_site)
    assert rt.unbounded and bool(jnp.all(rt.x == x)) and float(rt.f) == float(sat(x))
    flat = lambda z: jnp.asarray(1e-60) + 0.0 * jnp.sum(z)  # noqa: E731
    assert not runoff.not_attained(x, flat(x), jnp.zeros((2, 2)), flat, feasible, 2,
                                   converged=jnp.asarray(True), tol=1e-9,
                                   one_site=one_site).unbounded


def test_an_end_point_outside_the_constraint_is_moved_onto_it(x64):
    # The mean cosine of informative seed 2's last iterate (one class running off, b
    # = -55.7, w = 2566) is 2.2e-9 below tau, over feas_tol = 1e-9: a few Gauss-Newton
    # steps on the cosine alone put it on the constraint, and f is evaluated there.
    b = jnp.asarray([0.233, -0.356, -55.712, 0.0, 0.311])
    w = jnp.asarray([4.603, 6.371, 2565.89, 0.094, 5.72])
    x = jnp.concatenate([b, w])
    h0 = float(trust_region(Params(b, w)))
    tau = h0 + 2.2e-9
    h = lambda z: trust_region(Params(z[:5], z[5:])) - tau  # noqa: E731
    fun = lambda z: jnp.sum(z**2)  # noqa: E731
    z, fz = geometry.restore_feasibility(x, jnp.asarray(-1.0), h, fun, 1e-9)
    # f at z (not the -1 passed in), to rounding: the two programs may sum the ten
    # squares in other orders (observed bitwise equal with some XLA settings, one ulp
    # apart with others), at most 10 eps relative; 1e-14 leaves margin.
    assert float(h(z)) >= -1e-9 and abs(float(fz) - float(fun(z))) <= 1e-14 * float(fun(z))
    assert float(jnp.max(jnp.abs(z - x))) < 1e-5  # a correction, not a new point
    # Inside the tolerance: nothing moves and f is not re-evaluated.
    z, fz = geometry.restore_feasibility(x, jnp.asarray(-1.0), lambda z: h(z) + 1.5e-9, fun, 1e-9)
    assert bool(jnp.all(z == x)) and float(fz) == -1.0


def test_multistart_keeps_a_run_off_and_reports_it(x64):
    # near_separable seed 2 (n = 6, 30 rows, lambda_inv 1, tau 0.9995): the data separate
    # along the identity, the infimum 0 is not attained. With four starts the lowest
    # feasible end is kept and reported UNBOUNDED, never CONVERGED at f ~ 1e-60.
    x, y, g, lam, tau = synthetic.solver_instance("near_separable", 2)
    sol = numpy_fit.fit(x, y, g, lambda_inv=lam, tau=tau, dtype="float64",
                          options=SolverOptions(num_starts=4))
    assert sol.status == Status.UNBOUNDED, sol
    assert sol.violation <= 1e-9 and sol.objective < 1e-12


def test_every_solver_reports_a_run_off_unbounded():
    # World(3, slopes=[1.0, 0.5], seed=0) at k = 8: the 56 rows of context size 1
    # separate along a direction inside the trust region (tau 0.99696 from the
    # schedule), so f falls towards 0 and no finite theta attains it. The default
    # solver reported UNBOUNDED; the projected solver stopped on its small gradient
    # mapping at w = [54, 101], f = 7e-6 (float32), and trust-constr on its gtol at
    # w = [97, 202], both CONVERGED. All three now apply the one ray test at their end
    # point. The 336 rows of size 2 are not separable: all keep CONVERGED there.
    # Both sizes padded to one shape, so each solver compiles once.
    sizes = synthetic.World(3, slopes=[1.0, 0.5], seed=0).surrogate(k=8, sizes=[1, 2])
    problems = [sizes[1], sizes[2]]
    proj = numpy_fit.fit_batch(problems, solver="projected", bucketed=False)
    assert [f.status for f in proj] == [Status.UNBOUNDED, Status.CONVERGED], proj
    assert proj[0].objective < 1e-4 and proj[0].violation <= 1e-6
    taus = [defaults.tau_from_accuracy(defaults.base_accuracy(x, y), 3) for x, y, _ in problems]
    with jax.enable_x64(True):
        packed, _ = pack_batch(problems, "float64")
        ref = _scipy_all(packed, [0, 0], [0.1, 0.1], taus, per_class=False)
    assert [int(r.status) for r in ref] == [Status.UNBOUNDED, Status.CONVERGED], ref
    assert ref[0].objective < 1e-8 and ref[0].violation <= 1e-9


def test_end_point_ray_test_is_the_rule_of_the_run_off_test(x64):
    # The projected and SciPy solvers' test (no follow-up, run whatever the solver's
    # convergence) gives the default solver's verdict on the same point: a fall of many
    # orders of magnitude, f = 0 itself (on real rows only: an all-padding filler has
    # f = 0 by definition), a minimiser, and a ray that leaves the constraint set.
    fun = lambda z: jnp.exp(-jnp.sum(z))  # noqa: E731
    bowl = lambda z: 1.0 + jnp.sum((z - 3.0) ** 2)  # noqa: E731
    anywhere = lambda z: jnp.asarray(True)  # noqa: E731
    inside = lambda z: jnp.sum(z) <= 5.0  # noqa: E731

    @functools.partial(jax.jit, static_argnums=(1, 2))
    def verdicts(x, f, feasible, has_rows):
        def evaluate(pts):
            return jax.vmap(jax.vmap(f))(pts), jax.vmap(jax.vmap(feasible))(pts)
        rt = runoff.not_attained(x, f(x), jax.hessian(f)(x), f, feasible, 2,
                                 converged=jnp.asarray(False), tol=1e-9)
        return (runoff.end_point_unbounded(x, f(x), evaluate, 2, has_rows),
                runoff.unbounded(rt.unbounded, f(x), has_rows))

    for x, f, feasible, want in [
            (jnp.asarray([69.0, 69.0]), fun, anywhere, True),
            (jnp.asarray([400.0, 400.0]), fun, anywhere, True),  # f(x) = 0
            (jnp.asarray([3.0, 3.0]), bowl, anywhere, False),
            (jnp.asarray([2.0, 2.0]), fun, inside, False)]:
        assert [bool(v) for v in verdicts(x, f, feasible, True)] == [want, want], (x, f(x))
    assert not any(verdicts(jnp.asarray([400.0, 400.0]), fun, anywhere, False))


def test_start_points_are_static_and_checked():
    # The identity first (so num_starts=1 is the plain solve), the fixed points in
    # their documented order, then drawn points that depend on (n - 1, count) only.
    pts = solvers.start_points(2, 8)
    np.testing.assert_array_equal(pts[:6], [[0, 0, 1, 1], [0, 0, 3, 3], [0, 0, .3, .3],
                                            [0, 0, -1, -1], [2, 2, .3, .3], [-2, -2, .3, .3]])
    np.testing.assert_array_equal(pts, solvers.start_points(2, 8))
    np.testing.assert_array_equal(pts, solvers.start_points(2, 24)[:8])
    assert len({tuple(p) for p in solvers.start_points(3, 24)}) == 24
    np.testing.assert_array_equal(solvers.start_points(2, 3, sc_star=True),
                                  [[0, 0], [1, 1], [-1, -1]])
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="num_starts"):
            solvers.start_points(2, bad)


def test_strong_invariance_gets_the_multistart_by_default(x64):
    # apex seed 33 (n = 2, 30 uninformative rows, lambda_inv 10, tau 0): two collapsed
    # optima, b = +5.39 (f = 3.2711959) and b = -5.39 (f = 3.2711132, SciPy's best
    # start). The identity start ends at the worse one; fit_batch's default
    # (NONCONVEX_STARTS at lambda_inv >= NONCONVEX_LAMBDA) reaches the better, also
    # when the batch mixes it with a lambda_inv = 0.1 problem, which keeps its single
    # start.
    x, y, g, lam, tau = synthetic.solver_instance("apex", 33)
    assert lam == 10.0 and abs(tau) < 1e-12  # cos(90 degrees)
    ref = scipy_best_references.scipy_best("apex-33", _problem64(x, y, g), lam, tau, seed=33)
    one = numpy_fit.fit(x, y, g, lambda_inv=lam, tau=tau, dtype="float64",
                          options=SolverOptions())
    assert (one.objective - ref.objective) / ref.objective > 1e-5  # the other optimum
    mixed = numpy_fit.fit_batch([(x, y, g)] * 2, lambda_inv=[0.1, lam], tau=tau,
                                  dtype="float64")
    assert mixed[1].status == Status.CONVERGED, mixed[1]
    assert (mixed[1].objective - ref.objective) / ref.objective <= 1e-7
    assert mixed[1].b[0] < 0 < one.b[0]
    plain = numpy_fit.fit(x, y, g, lambda_inv=0.1, tau=tau, dtype="float64",
                            options=SolverOptions())
    np.testing.assert_allclose(mixed[0].b, plain.b, rtol=1e-9)
    np.testing.assert_allclose(mixed[0].w, plain.w, rtol=1e-9)


@pytest.mark.parametrize("one_site", [False, True], ids=["vmapped", "mapped"])
def test_multistart_is_the_best_of_its_starts_solved_alone(x64, monkeypatch, one_site):
    # The multi-start, its starts vmapped (an accelerator's lockstep) or mapped (a
    # CPU's, one_site), against its plain path: each of its six start points solved
    # alone (one-start solves with start_points patched), on apex seed 33, whose
    # starts end at two different optima. Same arithmetic per start, so the
    # objectives agree to float64 rounding of the lowest end.
    x, y, g, lam, tau = synthetic.solver_instance("apex", 33)
    prob = _problem64(x, y, g)
    multi = jax.jit(lambda p: solvers.augmented_lagrangian(
        p, lam, tau, options=SolverOptions(num_starts=6), one_site=one_site))(prob)
    pts = solvers.start_points(1, 6)

    def one_start(p, pt):  # the start point an argument: one program for the six
        monkeypatch.setattr(multistart, "start_points", lambda n1, c, s=False: pt[None])
        return solvers.augmented_lagrangian(p, lam, tau, options=SolverOptions(num_starts=1))

    alone_fn = jax.jit(one_start)
    alone = [float(alone_fn(prob, pts[i]).objective) for i in range(6)]
    assert max(alone) - min(alone) > 1e-5  # two optima among the starts
    assert abs(float(multi.objective) - min(alone)) <= 1e-12 * min(alone)


def test_multistart_follows_up_each_start_before_comparing(monkeypatch):
    # tight_tau seed 20 (n = 6, 56 rows, lambda_inv 10, tau 0.9995): a class runs
    # off to a minimiser far out (||theta_c|| ~ 3,900 in float64). Three starts: the
    # identity, whose follow-up ends in a basin at f = 15.0009, and starts 7 and 89,
    # the two of the 96 whose follow-ups reach float64's optimum 14.957285 (the
    # sweep's float64 fit; two, so that the test does not hang on one float32
    # trajectory, which another CPU's rounding may change). In float32 the first
    # phases crawl along the run-off in (b, w), and those of 7 and 89 end higher
    # (15.34 and 15.35 against 15.12): comparing first phases and following up the
    # winner alone stopped 2.9e-3 above the optimum. Each start is now followed up
    # first. Bound: the float32 tolerance, 1e-4 relative; the other basin is
    # 2.9e-3 above.
    x, y, g, lam, tau = synthetic.solver_instance("tight_tau", 20)
    pts = solvers.start_points(5, 90)[[0, 7, 89]]
    monkeypatch.setattr(multistart, "start_points", lambda n1, c, s=False: pts[:c])
    sol = numpy_fit.fit(x, y, g, lambda_inv=lam, tau=tau, dtype="float32",
                          options=SolverOptions(num_starts=3))
    assert sol.violation <= 1e-7, sol
    assert abs(sol.objective - 14.957284957) <= 1e-4 * 14.957284957, sol.objective


def test_trust_region_step_is_the_exact_subproblem_solution(x64):
    # Against a brute-force minimisation of the model over the ball (SciPy SLSQP from
    # many starts), for definite, indefinite and hard-case matrices.
    import scipy.optimize as so

    rng = np.random.default_rng(0)
    for case in range(12):
        p = int(rng.integers(2, 11))
        a = rng.normal(size=(p, p))
        h = a @ a.T if case % 3 == 0 else a + a.T
        g = rng.normal(size=p)
        if case % 4 == 3:  # hard case: g orthogonal to the lowest eigenvector
            v = np.linalg.eigh(h)[1][:, 0]
            g -= (g @ v) * v
        radius = float(rng.uniform(0.1, 3.0))
        s, pred = solvers.trust_region_step(jnp.asarray(g), jnp.asarray(h), jnp.asarray(radius))
        s = np.asarray(s)
        model = lambda z: g @ z + 0.5 * z @ h @ z  # noqa: E731
        assert np.linalg.norm(s) <= radius * (1 + 1e-9)
        assert abs(float(pred) + model(s)) <= 1e-10 * max(1.0, abs(model(s)))
        def inside(z):  # SLSQP may end a hair outside the ball: pull it back
            return z * min(1.0, radius / np.linalg.norm(z))

        best = min(model(inside(so.minimize(
            model, rng.normal(size=p) * radius / np.sqrt(p), method="SLSQP",
            constraints=[{"type": "ineq", "fun": lambda z: radius**2 - z @ z}]).x))
            for _ in range(8))
        assert model(s) <= best + 1e-7 * max(1.0, abs(best)), (case, model(s), best)


def test_subsample_start_reaches_the_plain_solution(x64):
    # The fast path (solve on a 256-row subsample, then on 1,024 rows, then on all
    # rows, with joint primal-dual steps after each hand-over where the constraint is
    # active) against the plain one (all rows from the start), on 6,720 rows with the
    # constraint active and inactive. Both end at KKT points of the same optimum,
    # each within feas_tol = 1e-9 of the constraint (in the cosine) and tol = 1e-9 in
    # the gradient: the objectives then differ by at most about multiplier x 2e-9
    # (the constraint's price) plus O(tol^2), and the parameters by O(1e-9 /
    # curvature); bounds 1e-12 + 4e-9 multiplier and 1e-6.
    x, y, g = realistic(3, 4, 7)
    packed, _ = pack_batch([(x, y, g)] * 2, "float64")
    lams, taus = jnp.asarray([0.1, 0.1]), jnp.asarray([0.999, -1.0])
    assert SolverOptions(coarse_rows=(256, 1024)).coarse_levels(6720) == [256, 1024]
    assert SolverOptions(coarse_rows=(256, 1024)).coarse_levels(1000) == [256]
    for bad in (-1, "2048", (256, 2048.0)):
        with pytest.raises(ValueError, match="coarse_rows"):
            SolverOptions(coarse_rows=bad)
    fast = solvers.solve_batch(packed, lams, taus,
                               options=SolverOptions(coarse_rows=(256, 1024)))
    plain = solvers.solve_batch(packed, lams, taus, options=SolverOptions(coarse_rows=0))
    assert np.all(np.asarray(fast.status) == Status.CONVERGED)
    assert np.all(np.asarray(plain.status) == Status.CONVERGED)
    assert float(fast.multiplier[0]) > 0  # the constraint binds in the first
    bound = 1e-12 + 4e-9 * np.maximum(np.asarray(fast.multiplier), np.asarray(plain.multiplier))
    assert np.all(np.abs(np.asarray(fast.objective) - np.asarray(plain.objective)) <= bound)
    np.testing.assert_allclose(fast.params.w, plain.params.w, atol=1e-6)
    np.testing.assert_allclose(fast.params.b, plain.params.b, atol=1e-6)
    # The subsample level ran (its evaluations count in the total).
    assert np.all(np.asarray(fast.iterations) != np.asarray(plain.iterations))


def test_primal_dual_mode_at_multiplier_updates_reaches_the_plain_solution(x64, monkeypatch):
    # The joint primal-dual mode begun at multiplier updates (fast path) against the
    # augmented Lagrangian alone (_SQP_ENTRIES = 0), without subsample levels, on
    # (a) 1,680 rows with the constraint active (tau 0.997) and (b) a 12-row tight-tau
    # instance (informative 35) where halved primal-dual steps once crawled to the
    # iteration limit (the mode now ends after a step that does not halve the KKT
    # residual). Both end at KKT points of the same optimum: bounds as in
    # test_subsample_start_reaches_the_plain_solution.
    from sc_jax.calibration.synthetic import solver_instance

    x, y, g = realistic(3, 3, 0)
    xs, ys, gs, lam_s, tau_s = solver_instance("informative", 35)
    cases = [((x, y, g), 0.1, 0.997), ((xs, ys, gs), lam_s, tau_s)]
    opts = SolverOptions(coarse_rows=0)

    def solve(data, lam, tau):
        prob = jax.tree.map(lambda a: a[0], pack_batch([data], "float64")[0])
        # A fresh jit: _SQP_ENTRIES is read while tracing.
        return jax.jit(lambda p: solvers.augmented_lagrangian(p, lam, tau, options=opts))(prob)

    fast = [solve(*c) for c in cases]
    monkeypatch.setattr(lagrangian, "_SQP_ENTRIES", 0)
    plain = [solve(*c) for c in cases]
    for a, b in zip(fast, plain):
        assert int(a.status) == int(b.status) == Status.CONVERGED
        assert float(a.multiplier) > 0  # the constraint binds
        bound = 1e-12 + 4e-9 * max(float(a.multiplier), float(b.multiplier))
        assert abs(float(a.objective) - float(b.objective)) <= bound
    # Parameters on (a) only: in (b) one class nearly separates (w_3 about 300), f
    # is flat along its ray to 1e-9, and two converged ends lie 100 apart on it.
    np.testing.assert_allclose(fast[0].params.w, plain[0].params.w, atol=1e-6)
    np.testing.assert_allclose(fast[0].params.b, plain[0].params.b, atol=1e-6)
    # On the 1,680 rows the mode replaces the alternation of subproblem steps and
    # multiplier updates: 13 evaluations against 18 when this was written.
    assert int(fast[0].iterations) < int(plain[0].iterations)


def test_sqp_step_converges_quadratically_and_checks_inertia(x64):
    # Newton's step on the KKT conditions (the subsample levels' hand-over) from a
    # point 1e-3 away from a solution with the constraint active: float64, exact
    # derivatives, so the residual r falls quadratically, r' <= C r^2. Observed here:
    # 3.2e-4 -> 1.9e-7 -> 3.8e-14 -> 2.8e-16 (C about 2); the bound C = 1e3 leaves
    # a wide margin, and the end is at float64's rounding floor (bound 1e-12).
    from sc_jax.calibration.objective import design, trust_region, value_grad_hess

    x, y, g = realistic(3, 3, 0)
    prob = pack_batch([(x, y, g)], "float64")[0]
    prob = jax.tree.map(lambda a: a[0], prob)
    tau, lam = 0.997, 0.1
    sol = solvers.augmented_lagrangian(prob, lam, tau, options=SolverOptions(coarse_rows=0))
    assert int(sol.status) == Status.CONVERGED and float(sol.multiplier) > 0
    d = design(prob)

    def con(z):  # the solver's scaled constraint
        return (trust_region(params_from_flat(z, False)) - tau) * jnp.sqrt(1.0 + z @ z)

    @jax.jit
    def kkt_parts(z):
        _, gf, hf = value_grad_hess(z, d, lam)
        return gf, hf, con(z), jax.grad(con)(z), jax.hessian(con)(z)

    xs = jnp.concatenate([sol.params.b, sol.params.w])
    mu = sol.multiplier / jnp.sqrt(1.0 + xs @ xs)  # the scaled constraint's multiplier
    z = xs + 1e-3 * jnp.asarray(np.random.default_rng(0).normal(size=xs.shape))
    mu = mu * 1.001
    residuals = []
    for _ in range(4):
        gf, hf, c, gc, hc = kkt_parts(z)
        residuals.append(float(steps.kkt_residual(gf, c, gc, mu)))
        dx, mu, valid = steps.sqp_step(gf, hf, c, gc, hc, mu)
        assert bool(valid)
        z = z + dx
    for r, r_next in zip(residuals[:2], residuals[1:3]):
        assert r_next <= 1e3 * r * r, residuals
    assert residuals[3] <= 1e-12, residuals
    assert float(jnp.max(jnp.abs(z - xs))) <= 1e-6  # the solver's own end: tol 1e-9
    # The inertia test: with the Hessian's sign flipped (a maximiser's curvature)
    # the step is refused, and so is one whose multiplier would turn negative.
    gf, hf, c, gc, hc = kkt_parts(z)
    assert not bool(steps.sqp_step(gf, -hf, c, gc, -hc, mu)[2])
    assert not bool(steps.sqp_step(-gf, hf, c, gc, hc, mu)[2])


def test_value_grad_hess_equals_autodiff(x64, monkeypatch):
    # The solvers' one-pass derivatives against jax.grad / jax.hessian of the
    # objective, with padding rows and an invariance term; float64, so rounding only.
    # With ROW_BLOCK = 64, the 150-row instance runs in three blocks (the last one
    # padded) and the 50-row ones in one, as 20,160 rows do at the default 8,192.
    from sc_jax.calibration import objective as objective_module
    from sc_jax.calibration.objective import (
        design,
        design_arrays,
        objective,
        value,
        value_grad_hess,
    )

    monkeypatch.setattr(objective_module, "ROW_BLOCK", 64)
    rng = np.random.default_rng(0)
    for n, rows in ((2, 50), (3, 50), (6, 50), (4, 150)):
        prob = Problem(jnp.asarray(rng.normal(size=(rows, n - 1)) * 2),
                       jnp.asarray(rng.integers(0, n, rows), jnp.int32),
                       jnp.asarray(rng.integers(0, 7, rows), jnp.int32),
                       jnp.asarray((rng.uniform(size=rows) > 0.2).astype(float)), 8)
        x = jnp.asarray(rng.normal(size=2 * (n - 1)))
        ref = lambda z: objective(Params(z[:n - 1], z[n - 1:]), prob, 0.7)  # noqa: E731
        d = design(prob)
        assert d.features.shape[0] == (3 if rows > 64 else 1)
        # design() passes the query ids and mask it has; read back from the
        # one-hot groups (design_arrays' own way) they are the same.
        mask = prob.mask[:, None]
        slow = design_arrays(prob.features, jax.nn.one_hot(prob.labels, n, axis=0) * mask.T,
                             jax.nn.one_hot(prob.query_ids, 8) * mask)
        for a, b in zip(d, slow):
            np.testing.assert_array_equal(a, b)
        # Everything jitted, two programs per case: op-by-op dispatch of jax.hessian
        # made this test slow, and then one compile per function (16 in all) did.
        f, g, h, v = jax.jit(lambda x, d: (*value_grad_hess(x, d, 0.7), value(x, d, 0.7)))(x, d)
        rf, rg, rh = jax.jit(lambda x: (ref(x), jax.grad(ref)(x), jax.hessian(ref)(x)))(x)
        assert abs(float(f - rf)) <= 1e-12 and abs(float(v - rf)) <= 1e-12
        np.testing.assert_allclose(g, rg, atol=1e-12)
        np.testing.assert_allclose(h, rh, atol=1e-12)



def test_cosine_margin_keeps_its_digits_near_one(x64):
    # The constraint's margin mean(cos) - tau where every cosine is within 1e-6 of 1
    # (tau 0.99999): formed as that difference, float32 keeps an absolute eps (1.2e-7,
    # 1% of this margin); summed as (1 - tau) - mean(1 - cos) with 1 - cos in closed
    # form, its error is a few eps of the 1 - cos terms, 1e-6 of it at most (observed
    # about 1e-7). float64: the same value as the plain difference, to rounding.
    rng = np.random.default_rng(2)
    b = rng.uniform(-1e-3, 1e-3, 4) * np.array([1.0, 2.0, 0.5, 1.0])
    w = rng.uniform(0.5, 2.0, 4)
    x = np.concatenate([b, w])
    tau = 0.99999
    with jax.enable_x64(True):
        ref = float(geometry.cosine_margin(jnp.asarray(x), jnp.asarray(tau)))
        plain = float(trust_region(Params(jnp.asarray(b), jnp.asarray(w)))) - tau
    assert abs(ref - plain) <= 1e-13, (ref, plain)
    f32 = float(geometry.cosine_margin(jnp.asarray(x, jnp.float32),
                                       jnp.asarray(tau, jnp.float32)))
    # tau itself rounds to float32 (6e-8 absolute): compare against float64's margin
    # at the rounded tau.
    with jax.enable_x64(True):
        ref32 = float(geometry.cosine_margin(jnp.asarray(x),
                                             jnp.asarray(np.float32(tau), jnp.float64)))
    assert abs(f32 - ref32) <= 1e-6 * abs(1.0 - np.float32(tau)), (f32, ref32)
    # mixed signs: a class pointing away (w < 0) takes the plain form
    x2 = x.copy()
    x2[4] = -0.7
    with jax.enable_x64(True):
        a = float(geometry.cosine_margin(jnp.asarray(x2), jnp.asarray(0.5)))
        p = float(trust_region(Params(jnp.asarray(x2[:4]), jnp.asarray(x2[4:])))) - 0.5
    assert abs(a - p) <= 1e-13

def test_float32_hessian_keeps_a_saturated_class_block(x64):
    # A class whose probability is within 1e-3 to 1e-7 of 1 on every row (a run-off
    # on its way out): its 2 x 2 Hessian block is a sum of P (1 - P) terms, small
    # against the P and P^2 it was once formed from. Formed as their difference,
    # float32 kept only an absolute eps (3.2e-4 relative error here; in the follow-up
    # phase the polar chain rule multiplies it by ||theta_c||^2). Summed in closed
    # form with 1 - P taken from the other classes' terms, the block's error is that
    # of a float32 sum of 60 such terms: at most about 60 eps = 7e-6 relative
    # (observed 7e-8). Reference: the same evaluation in float64.
    from sc_jax.calibration.objective import design, value_grad_hess

    rng = np.random.default_rng(5)
    rows, n = 60, 3
    feats = np.abs(rng.normal(size=(rows, n - 1))) + 0.5
    labels = np.where(rng.uniform(size=rows) < 0.9, 1, rng.integers(0, n, rows))
    groups = rng.integers(0, 6, rows)
    x = np.array([1.0, 0.3, 14.0, 0.8])  # class 1's logits 1 + 14 m >= 8 on every row
    hess = {}
    for dt in (jnp.float32, jnp.float64):
        prob = Problem(jnp.asarray(feats, dt), jnp.asarray(labels, jnp.int32),
                       jnp.asarray(groups, jnp.int32), jnp.ones(rows, dt), 6)
        hess[dt] = np.asarray(jax.jit(value_grad_hess)(
            jnp.asarray(x, dt), design(prob), jnp.asarray(0.1, dt))[2], np.float64)
    block = np.ix_([0, 2], [0, 2])
    ref = hess[jnp.float64][block]
    err = np.max(np.abs(hess[jnp.float32][block] - ref)) / np.max(np.abs(ref))
    assert err <= 2e-5, err


def _problem64(x, y, g):
    g = np.unique(g, return_inverse=True)[1]
    return Problem(np.asarray(x, np.float64), np.asarray(y, np.int32), g.astype(np.int32),
                   np.ones(len(y)), int(g.max()) + 1)
