"""The JAX solvers on randomised problem families and near the apex, against SciPy's
best trust-constr start (float64), and the terminal step's bookkeeping. Split from
test_solvers.py so that two workers share the solver suite (one file runs on one
xdist worker); the tolerances are stated per test.

float64 is switched on per test by the ``x64`` fixture: ``jax.enable_x64`` is a
context manager scoped to the test, so other test modules keep float32.
"""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sc_jax.calibration import numpy_fit, solvers, synthetic
from sc_jax.calibration.buckets import pack_batch
from sc_jax.calibration.objective import (
    Params,
    objective,
    params_from_flat,
)
from sc_jax.calibration.solvers import (
    SolverOptions,
    Status,
    lagrangian,
)
import scipy_best_references
from test_solvers import _problem64, realistic

# jaxlib 0.12's crash in the persistent cache's write (conftest.no_persistent_cache_writes).
pytestmark = pytest.mark.usefixtures("no_persistent_cache_writes")


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


# ---------------------------------------------------------------------------------
# Randomised families (issue 11): one instance of every family and the known misses
# here, the sweep of 216 instances in benchmarks/sweep_solver.py (its table is in
# benchmarks/RESULTS.md).


def _family_subset(max_rows=1500):
    """The first seed of every family of ``synthetic.solver_instance`` with at most
    ``max_rows`` rows (a fixed rule, not a pick of instances that pass; larger N is
    covered by the parity tests above), then those of the known misses
    (FAMILY_FIXED) that the rule did not take."""
    out = []
    # "mixture" stays out: with its instances in this module's batch, jaxlib 0.12's CPU
    # compiler aborts on a later compile in this module (strong_invariance-7's solve);
    # jaxlib 0.10 does not. It is tested through calibrate (test_jax_calibrate) and the
    # sweep.
    for fam in (f for f in synthetic.FAMILIES if f != "mixture"):
        seed = 0
        while len(synthetic.solver_instance(fam, seed)[1]) > max_rows:
            seed += 1
        out.append((fam, seed, synthetic.solver_instance(fam, seed)))
    out += [(fam, seed, synthetic.solver_instance(fam, seed))
            for fam, seed in FAMILY_FIXED
            if (fam, seed) not in {(f, s) for f, s, _ in out}]
    return out


# Former misses, kept as regression tests: flipped seed 1 (n = 4, 30 rows, tau
# 0.99694) stopped 3.7e-4 above float64 in float32 until run-offs were followed;
# flipped seed 0 (n = 4, 120 rows, lambda_inv 10, no trust region) ended one start at
# a KKT point 1.57 above SciPy's best start until fit_batch gave lambda_inv >= 1 its
# NONCONVEX_STARTS. Instances that miss today (the sweep's list in
# benchmarks/RESULTS.md) are left to the sweep: which of several KKT points a
# trajectory reaches can change with the CPU's rounding, and a strict xfail must not.
FAMILY_FIXED = [("flipped", 1), ("flipped", 0)]
FAMILY_SUBSET = _family_subset()


@pytest.fixture(scope="module")
def family_fits():
    problems = [inst[:3] for _, _, inst in FAMILY_SUBSET]
    lams = [inst[3] for _, _, inst in FAMILY_SUBSET]
    taus = [inst[4] for _, _, inst in FAMILY_SUBSET]
    # One fit_batch per dtype for the whole subset (float64 enables x64 for the solve).
    return {dtype: numpy_fit.fit_batch(problems, lambda_inv=lams, tau=taus, dtype=dtype,
                                         bucketed=False)
            for dtype in ("float64", "float32")}


@pytest.mark.parametrize("index", [
    pytest.param(k, id=f"{fam}-{seed}") for k, (fam, seed, _) in enumerate(FAMILY_SUBSET)])
def test_families_reach_the_best_scipy_optimum(family_fits, index):
    # float64: CONVERGED (or UNBOUNDED, with f falling along a ray), violation <= 1e-9,
    # objective at most 1e-7 relative above the best of five SciPy trust-constr
    # starts (identity, slopes 3 and 0.3, two random points; stored, see
    # scipy_best_references). The solver's
    # stationarity tolerance (1e-9 on the gradient) puts its own objective error near
    # 1e-18, SciPy's gtol 1e-11 lower still: 1e-7 is the bound, with room.
    # float32: the float32 parameters' objective (in float64) at most 1e-4 relative
    # above the float64 solution's: float32 stops at a gradient of 1e-5, an objective
    # error of order 1e-10 / curvature, and rounds the parameters at 6e-8 relative.
    fam, seed, (x, y, g, lam, tau) = FAMILY_SUBSET[index]
    r64, r32 = family_fits["float64"][index], family_fits["float32"][index]
    # UNBOUNDED (an infimum not attained): the same bounds times max(1, |f|), since
    # both solvers stop somewhere on the way down to it (near f = 0 for separable
    # data, where a relative gap says nothing); a run-off from a worse basin fails.
    assert r64.status in (Status.CONVERGED, Status.UNBOUNDED), r64
    assert r64.violation <= 1e-9, r64.violation
    with jax.enable_x64(True):
        ref = scipy_best_references.scipy_best(f"families/{fam}-{seed}", _problem64(x, y, g),
                                               lam, tau, seed=seed)
        f32 = float(objective(Params(jnp.asarray(r32.b), jnp.asarray(r32.w)),
                              _problem64(x, y, g), lam))
    unb = r64.status == Status.UNBOUNDED
    scale64 = max(1.0, abs(ref.objective)) if unb else abs(ref.objective)
    scale32 = max(1.0, abs(r64.objective)) if unb else abs(r64.objective)
    assert (r64.objective - ref.objective) / scale64 <= 1e-7, (r64.objective, ref.objective)
    assert (f32 - r64.objective) / scale32 <= 1e-4, (f32, r64.objective)


def test_terminal_step_matches_the_evaluated_end(x64, monkeypatch):
    # The terminal step (fast path: the last Newton step taken without a pass over
    # the rows) against solves that end on an evaluated point (_TERMINAL_FRACTION =
    # 0), float64, no subsample level, on 1,680 rows: (a) the constraint active
    # (tau 0.997: primal-dual steps), (b) no trust region (tau -1: full Newton steps
    # on f). Each takes one evaluation fewer and ends at the same optimum. The rule
    # triggers with margin to spare on any CPU's rounding: residual cuts of 1.4e-4
    # and 1.2e-3 (the rule needs <= 1e-2), predicted residuals 9e-17 and 3e-13
    # (<= 1e-10), and the step before predicted 1.3e-7 and 2.5e-7, far above it.
    from sc_jax.calibration.objective import design, trust_region, value_grad_hess

    opts = SolverOptions(coarse_rows=0)
    tol, feas_tol = opts.tolerances(jnp.float64)
    cases = [(realistic(3, 3, 0), 0.1, 0.997), (realistic(3, 3, 1), 0.1, -1.0)]
    probs = [jax.tree.map(lambda a: a[0], pack_batch([data], "float64")[0])
             for data, _, _ in cases]

    def solve_cases():
        # A fresh jit: _TERMINAL_FRACTION is read while tracing. lambda_inv and tau are
        # arguments, so that both cases (the same shapes) run one program.
        solve = jax.jit(lambda p, lam, tau: solvers.augmented_lagrangian(p, lam, tau, options=opts))
        return [solve(p, lam, tau) for p, (_, lam, tau) in zip(probs, cases)]

    fast = solve_cases()
    monkeypatch.setattr(lagrangian, "_TERMINAL_FRACTION", 0.0)
    plain = solve_cases()
    for prob, (_, lam, tau), a, b in zip(probs, cases, fast, plain):
        assert int(a.status) == int(b.status) == Status.CONVERGED
        assert int(a.iterations) == int(b.iterations) - 1  # the path was taken
        # The same end point: the plain solve evaluates it once more. Equal to
        # rounding (observed: bitwise); the bounds allow the two compiled programs
        # to round the step differently (Hessian eigenvalues >= 2e-2 here).
        np.testing.assert_allclose(a.params.w, b.params.w, atol=1e-10)
        np.testing.assert_allclose(a.params.b, b.params.b, atol=1e-10)
        assert abs(float(a.objective) - float(b.objective)) <= 1e-13
        # The unevaluated end point, evaluated: the model's f is exact to rounding
        # (observed 1e-16; its error is third order in a step of about 1e-7), and
        # the point is stationary to tol (observed 3e-13) and feasible to feas_tol,
        # as its status says.
        z = jnp.concatenate([a.params.b, a.params.w])
        f, gf, _ = value_grad_hess(z, design(prob), lam)
        assert abs(float(f) - float(a.objective)) <= 1e-13
        gc = jax.grad(lambda v: trust_region(params_from_flat(v, False)))(z)
        assert float(jnp.max(jnp.abs(gf - a.multiplier * gc))) <= tol
        assert float(a.violation) <= feas_tol
    assert float(fast[0].multiplier) > 0 and float(fast[1].multiplier) == 0


def test_compiler_options_are_only_those_this_jaxlib_accepts(monkeypatch):
    # jaxlib 0.10 has the classic CPU emitters (the option is kept), jaxlib 0.11 and later
    # refuse the option ("No such compile option"); an unknown option is always dropped.
    import jaxlib

    wanted = {**solvers.COMPILER_OPTIONS["cpu"], "xla_no_such_option_in_any_jaxlib": True}
    monkeypatch.setitem(solvers.COMPILER_OPTIONS, "cpu", wanted)
    solvers.compiler_options.cache_clear()
    try:
        got = solvers.compiler_options("cpu")
    finally:
        solvers.compiler_options.cache_clear()
    classic = tuple(int(p) for p in jaxlib.__version__.split(".")[:2]) < (0, 11)
    assert got == ({"xla_cpu_use_fusion_emitters": False} if classic else {})


# ---------------------------------------------------------------------------------
# Near the apex. Where the constraint binds within a few COSINE_EPS of theta_c = 0,
# a first phase crawls along the boundary, which bends on that scale, to the
# iteration limit: MAX_ITERATIONS, at or a little above SciPy's best start (with 96
# starts, the lowest of many such crawls). The follow-up in cosine form
# (SolverOptions.follow_apex) finishes it. The references are SciPy's best of five
# trust-constr starts (solvers.scipy_best), stored: near the apex trust-constr takes
# 1,000 to 3,000 iterations per start. Bounds as in the family test: float64 at most
# 1e-7 relative above the reference, float32 (its parameters' objective in float64)
# at most 1e-4 above float64.


def _fit_both(x, y, g, lam, tau, **kw):
    out = {dt: numpy_fit.fit_batch([(x, y, g)], lambda_inv=lam, tau=tau, dtype=dt, **kw)[0]
           for dt in ("float64", "float32")}
    with jax.enable_x64(True):
        r32 = out["float32"]
        f32 = float(objective(Params(jnp.asarray(r32.b), jnp.asarray(r32.w)),
                              _problem64(x, y, g), lam))
    return out["float64"], r32, f32


@pytest.mark.parametrize("family, seed, ref, kw", [
    # n = 2, 56 rows, lambda_inv 0.5, tau 0.5, one start. Balanced labels make f flat
    # to fourth order in b at w = 0; the optimum is the smoothed cone's vertex,
    # b = 0, w = COSINE_EPS / sqrt(3). Without the follow-up the solve stops
    # MAX_ITERATIONS 4.7e-6 above it.
    pytest.param("near_apex", 17, 1.3863027332590498, {"options": SolverOptions()},
                 id="near_apex-17-one-start"),
    # n = 4, 12 rows, lambda_inv 10, tau 0, 96 starts: the invariance term switches
    # class 1 off (theta_1 within 1e-5 of 0). Without the follow-up no start
    # converges (the best 2.2e-6 above SciPy); with it they do, one 8.9e-4 below
    # SciPy's best.
    pytest.param("multiclass_strong", 16, 5.475305647611087, {}, id="multiclass_strong-16"),
    # n = 2, 200 rows over 8 queries, lambda_inv 1, tau 0.5, 96 starts: the optimum is
    # the apex; without the follow-up the lowest start crawls to 3.9e-8 above it and
    # none converges.
    pytest.param("strong_invariance", 7, 2.0794521607305816, {}, id="strong_invariance-7"),
])
def test_near_apex_solves_converge_at_the_best_scipy_optimum(family, seed, ref, kw):
    x, y, g, lam, tau = synthetic.solver_instance(family, seed)
    r64, r32, f32 = _fit_both(x, y, g, lam, tau, **kw)
    for r in (r64, r32):
        assert r.status == Status.CONVERGED, r
    assert r64.violation <= 1e-9
    assert (r64.objective - ref) / ref <= 1e-7, (r64.objective, ref)
    assert (f32 - r64.objective) / r64.objective <= 1e-4, (f32, r64.objective)


def test_apex_follow_up_is_what_converges(x64):
    # The follow-up against the first phase alone (follow_apex=False) on near_apex 17:
    # the same start ends MAX_ITERATIONS there, above the follow-up's end point; the
    # follow-up spends its own budget (at most max_iter passes more).
    x, y, g, lam, tau = synthetic.solver_instance("near_apex", 17)
    kw = {"lambda_inv": lam, "tau": tau, "dtype": "float64"}
    on = numpy_fit.fit(x, y, g, options=SolverOptions(), **kw)
    off = numpy_fit.fit(x, y, g, options=SolverOptions(follow_apex=False), **kw)
    assert off.status == Status.MAX_ITERATIONS and on.status == Status.CONVERGED
    assert on.objective < off.objective
    assert off.iterations == SolverOptions().max_iter < on.iterations <= 2 * off.iterations


def test_near_apex_gets_the_multistart_from_lambda_inv_one_half(x64):
    # near_apex 20: n = 3, 120 rows, lambda_inv 0.5, tau 0.5. One start converges to
    # a KKT point 1.8e-3 above SciPy's best start; at lambda_inv >= NONCONVEX_LAMBDA
    # (0.5, where f's curvature in b at the flat calibrators turns negative)
    # fit_batch's default solves from NONCONVEX_STARTS and reaches it.
    x, y, g, lam, tau = synthetic.solver_instance("near_apex", 20)
    assert lam == 0.5 >= solvers.NONCONVEX_LAMBDA
    ref = 2.183771889300907
    one = numpy_fit.fit(x, y, g, lambda_inv=lam, tau=tau, dtype="float64",
                          options=SolverOptions())
    assert (one.objective - ref) / ref > 1e-4  # the other KKT point
    r = numpy_fit.fit_batch([(x, y, g)], lambda_inv=lam, tau=tau, dtype="float64")[0]
    assert r.status == Status.CONVERGED, r
    assert (r.objective - ref) / ref <= 1e-7, (r.objective, ref)
