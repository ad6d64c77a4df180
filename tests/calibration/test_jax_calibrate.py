"""sc_jax.calibrate and the other pure-JAX functions: batching, differentiation by
implicit differentiation, no host callbacks, and agreement with the NumPy layer.

float64 (the ``x64`` fixture) wherever exactness is checked. Tolerances:
* jit(vmap(calibrate)) against one-by-one solves: both stop at the same KKT point to
  the solver's tolerance (gradient 1e-9, cosine 1e-9), so parameters agree to 1e-6
  (the Hessian's smallest eigenvalue here is > 1e-3) and objectives to 1e-10.
* Gradients against central finite differences of the float64 solve with step 1e-5:
  the FD truncation error is O(h^2) ~ 1e-10 times third derivatives and the solve's
  own error ~ 1e-9 / h ~ 1e-4 relative in the worst case: relative 1e-4.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sc_jax
from sc_jax.calibration import defaults, jax_calibrate, numpy_fit, numpy_predict
from sc_jax.calibration import solvers
from sc_jax.calibration import synthetic
from sc_jax.calibration.objective import Problem
from sc_jax.calibration.solvers import Status
import scipy_best_references


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def _problem(seed, sizes=(1,), k=6):
    # Noisy enough that no class is separable: every optimum is finite.
    world = synthetic.World(3, (1.0, -0.4), beta=(0.3, -0.2), row_sd=1.5, seed=seed)
    return world.surrogate(k, sizes)


def test_jit_vmap_equals_one_by_one(x64, monkeypatch):
    probs = [_problem(s)[1] for s in range(3)]
    feats = jnp.stack([jnp.asarray(p[0]) for p in probs])
    labels = jnp.stack([jnp.asarray(p[1]) for p in probs])
    qids = jnp.stack([jnp.asarray(p[2]) for p in probs])
    taus = jnp.asarray([-1.0, 0.999, 0.95])
    def vmapped():  # the caller's vmap: calibrate's batching rule (lax.map on a CPU)
        return jax.jit(jax.vmap(lambda f, y, g, t: sc_jax.calibrate(f, y, g, tau=t,
                                                                    num_queries=6)))(
            feats, labels, qids, taus)

    batched = vmapped()
    leading = sc_jax.calibrate(feats, labels, qids, tau=taus)  # leading axes: lax.map on CPU
    # The accelerators' path for leading axes (vmapped, in lockstep), forced here; its
    # compiled program is dropped after, so that later calls trace the CPU's again.
    monkeypatch.setattr(jax_calibrate, "_lockstep", lambda: True)
    jax_calibrate._program.cache_clear()
    try:
        lockstep = sc_jax.calibrate(feats, labels, qids, tau=taus)
        lockstep_vmap = vmapped()  # the rule's accelerator branch: jax.vmap of the solve
    finally:
        jax_calibrate._program.cache_clear()
    # One compiled single-problem solve (tau traced), called per problem.
    single = jax.jit(lambda f, y, g, t: sc_jax.calibrate(f, y, g, tau=t, num_queries=6))
    for k, (x, y, g) in enumerate(probs):
        one = single(x, y, g, taus[k])
        ref = numpy_fit.fit(x, y, g, tau=float(taus[k]), dtype="float64")
        assert int(one.status) == Status.CONVERGED == ref.status
        for other in (batched, leading, lockstep, lockstep_vmap):
            assert int(other.status[k]) == Status.CONVERGED
            np.testing.assert_allclose(other.b[k], one.b, atol=1e-6)
            np.testing.assert_allclose(other.w[k], one.w, atol=1e-6)
            assert abs(float(other.objective[k] - one.objective)) <= 1e-10
        assert abs(float(one.objective) - ref.objective) <= 1e-10 * ref.objective


def test_calibrate_finds_the_best_basin_where_lambda_inv_reaches_one_half(x64):
    # The sweep's "mixture" seed 17: n = 2, 200 rows over 8 queries, lambda_inv 1, tau
    # 0.3. One start stops at the flat calibrator's basin (f = 2.07948, near
    # log 2 + 2 lambda_inv log 2); SciPy's best start and calibrate's default (its
    # 96 starts where a concrete lambda_inv >= 0.5) reach 2.05796. The solver's
    # stationarity tolerance is 1e-9, so equal KKT points agree to 1e-7 relative.
    x, y, g, lam, tau = synthetic.solver_instance("mixture", 17)
    assert (x.shape, lam, tau) == ((200, 1), 1.0, 0.3)
    default = sc_jax.calibrate(x, y, g, lambda_inv=lam, tau=tau)
    one = sc_jax.calibrate(x, y, g, lambda_inv=lam, tau=tau, options=solvers.SolverOptions())
    gid = np.unique(g, return_inverse=True)[1].astype(np.int32)
    ref = scipy_best_references.scipy_best(
        "mixture-17", Problem(x, y.astype(np.int32), gid, np.ones(len(y)), 8), lam, tau)
    assert int(default.status) == Status.CONVERGED == ref.status
    assert float(default.objective) <= ref.objective * (1 + 1e-7)
    assert float(one.objective) > ref.objective + 1e-2  # the worse basin, still there


@pytest.mark.parametrize("tau", [-1.0, 0.999])  # trust region inactive, active
def test_grad_matches_finite_differences(x64, tau):
    x, y, g = _problem(0)[1]
    test = jnp.asarray(np.random.default_rng(1).normal(size=(5, 2)))

    @jax.jit  # one compile for the finite differences' eight calls
    def downstream(features, lam, t):
        cal = sc_jax.calibrate(features, y, g, tau=t, lambda_inv=lam, num_queries=6)
        return jnp.sum(sc_jax.calibrated_log_probs(cal.b, cal.w, test)[:, 1]) + cal.w[0] ** 2

    cal = sc_jax.calibrate(x, y, g, tau=tau)
    assert int(cal.status) == Status.CONVERGED
    assert (float(cal.multiplier) > 0) == (tau > 0)  # the constraint binds at 0.999
    grads = jax.grad(downstream, argnums=(0, 1, 2))(jnp.asarray(x), 0.1, tau)
    direction = np.random.default_rng(3).normal(size=x.shape)
    h = 1e-5
    checks = [
        (jnp.sum(grads[0] * direction),
         (downstream(x + h * direction, 0.1, tau) - downstream(x - h * direction, 0.1, tau))),
        (grads[1], downstream(x, 0.1 + h, tau) - downstream(x, 0.1 - h, tau)),
    ]
    if tau > 0:  # tau has no effect where the constraint is inactive
        checks.append((grads[2], downstream(x, 0.1, tau + h) - downstream(x, 0.1, tau - h)))
    else:
        assert float(grads[2]) == 0.0
    for analytic, diff in checks:
        fd = float(diff) / (2 * h)
        assert abs(float(analytic) - fd) <= 1e-4 * max(abs(fd), 1e-3), (analytic, fd)


def test_no_host_callback_in_the_graph():
    x, y, g = _problem(0)[1]
    jaxpr = str(jax.make_jaxpr(
        lambda f: sc_jax.calibrate(f, y, g, num_queries=6).b)(jnp.asarray(x, jnp.float32)))
    assert "callback" not in jaxpr
    assert "while" in jaxpr  # the solve is in the graph, not on the host


def test_tau_schedule_and_ensemble_match_the_numpy_layer():
    for acc in (0.2, 0.5, 0.69, 0.7, 0.95):
        for n in (2, 3, 6):
            assert abs(float(sc_jax.tau_schedule(acc, n))
                       - defaults.tau_from_accuracy(acc, n)) <= 1e-6
    rng = np.random.default_rng(0)
    fits = [numpy_predict.FitResult(b=rng.normal(size=2), w=rng.normal(size=2), status=Status(0),
                                  iterations=0, outer_iterations=0, objective=0.0,
                                  constraint=0.0, violation=0.0, tau=0.0, lambda_inv=0.0,
                                  solver="x", sc_star=False, num_rows=10, base_accuracy=0.5)
            for _ in range(2)]
    feats = [rng.normal(size=(m, 7, 2)) for m in (3, 5)]
    p = numpy_predict.predict_proba(fits, feats)
    manual = np.mean([np.mean([f.predict_proba(x) for x in fx], 0)
                      for f, fx in zip(fits, feats)], 0)
    np.testing.assert_allclose(p, manual, atol=1e-12)


def test_float64_needs_x64():
    x, y, g = _problem(0)[1]
    if jax.config.jax_enable_x64:
        pytest.skip("x64 is on process-wide")
    with pytest.raises(ValueError, match="jax_enable_x64"):
        sc_jax.calibrate(x, y, g, dtype="float64")
    # The NumPy layer enables it for the solve instead: float64 precision, not float32.
    # (SciPy stops at its iteration limit on this instance, above our optimum.)
    fit = numpy_fit.fit(x, y, g, tau=0.999, dtype="float64")
    ref = numpy_fit.fit(x, y, g, tau=0.999, solver="scipy")
    assert fit.status == Status.CONVERGED and fit.violation <= 1e-9
    assert fit.objective <= ref.objective * (1 + 1e-7)


def test_fit_batch_groups_mixed_class_counts():
    w2 = synthetic.World(2, (1.0,), seed=0).surrogate(6, (1,))[1]
    w3 = synthetic.World(3, (1.0, 1.0), seed=1).surrogate(6, (1,))[1]
    fits = numpy_fit.fit_batch([w3, w2, w3])
    assert [f.num_classes for f in fits] == [3, 2, 3]
    for f, (x, y, _) in zip(fits, [w3, w2, w3]):
        expected = defaults.tau_from_accuracy(defaults.base_accuracy(x, y), f.num_classes)
        assert f.tau == pytest.approx(expected)


# ---------------------------------------------------------------------------------
# Bad input: a ValueError before anything compiles (concrete arrays), a status under
# jit (traced arrays), one set of rules shared with numpy_fit.fit.


def _bad_inputs(x, y, g):
    rows = np.arange(len(y))
    return {
        "labels out of range": (dict(labels=np.where(rows == 3, 7, y)), r"labels.* must be in \[0, 3\)"),
        "query id >= num_queries": (dict(num_queries=int(g.max())), r"query_ids.* must be in \[0, 5\)"),
        "negative query id": (dict(query_ids=g - 1), "query_ids.* must be >= 0"),
        "N = 0": (dict(features=x[:0], labels=y[:0], query_ids=g[:0]), "N = 0"),
        "every row masked": (dict(mask=np.zeros(len(y))), "N = 0"),
        "a class with no rows": (dict(labels=np.where(y == 2, 0, y)), r"class\(es\) \[2\]"),
        "one class only": (dict(labels=np.zeros_like(y)), r"class\(es\) \[1, 2\]"),
        "a NaN feature": (dict(features=np.where(rows[:, None] == 4, np.nan, x)), "NaN or infinite"),
        "an infinite feature": (dict(features=np.where(rows[:, None] == 4, np.inf, x)), "NaN or infinite"),
        "labels that disagree in shape": (dict(labels=y[:-1]), "shape"),
        "a mask that disagrees in shape": (dict(mask=np.ones(len(y) + 1)), "mask"),
        "a mask of other values": (dict(mask=np.full(len(y), 0.5)), "mask"),
        "tau = 2": (dict(tau=2.0), "tau must be"),
        "tau = NaN": (dict(tau=float("nan")), "tau must be"),
        # Issue 55, case 13: float16 reached LAPACK (NotImplementedError), bfloat16 was
        # "not real numbers", two lambda_inv for one problem failed inside JAX ("Cannot
        # broadcast"), 1e39 overflowed float32 into INVALID_INPUT.
        "float16 features": (dict(features=x.astype(np.float16)), "are float16: cast them to float32"),
        "bfloat16 features": (dict(features=x.astype(jnp.bfloat16)), "are bfloat16: cast them to float32"),
        "lambda_inv = 1e39": (dict(lambda_inv=1e39), r"at most 1e\+30"),
        "two lambda_inv for one problem": (dict(lambda_inv=np.array([0.1, 0.2])),
                                           "lambda_inv (must be one number|has 2 entries)"),
        "lambda_inv = -1": (dict(lambda_inv=-1.0), "lambda_inv"),
        "non-integer labels": (dict(labels=y + 0.5), "integers"),
        # num_queries=7.5 was truncated to 7 and gave INVALID_INPUT with NaN numbers.
        "num_queries = 7.5": (dict(num_queries=7.5), "num_queries must be a positive int"),
        "num_queries = True": (dict(num_queries=True), "num_queries must be a positive int"),
        "dtype float16": (dict(dtype="float16"), r'dtype.*float16'),
    }


def test_calibrate_refuses_bad_input_before_compiling(monkeypatch):
    x, y, g = (np.asarray(a) for a in _problem(0)[1])
    compiled = []
    monkeypatch.setattr(solvers, "augmented_lagrangian",
                        lambda *a, **k: compiled.append(a) or pytest.fail("reached the solver"))
    for name, (kw, match) in _bad_inputs(x, y, g).items():
        args = {**dict(features=x, labels=y, query_ids=g), **kw}
        with pytest.raises(ValueError, match=match):
            sc_jax.calibrate(args.pop("features"), args.pop("labels"), args.pop("query_ids"), **args)
        # numpy_fit.fit applies the same rules (it renumbers query ids itself, so
        # it has no num_queries, and no mask).
        if "num_queries" not in kw and "mask" not in kw:
            args = {**dict(features=x, labels=y, query_ids=g), **kw}
            with pytest.raises(ValueError, match=match):
                numpy_fit.fit(**args)
    # Leading batch axes: the error names the batch index of the bad problem.
    feats = np.stack([x, np.where(np.arange(len(y))[:, None] == 2, np.nan, x)])
    with pytest.raises(ValueError, match=r"batch index \(1,\)"):
        sc_jax.calibrate(feats, np.stack([y, y]), np.stack([g, g]))
    assert not compiled


@pytest.mark.parametrize("half", [np.float16, jnp.bfloat16], ids=["float16", "bfloat16"])
def test_half_precision_and_num_queries_are_refused_under_jit_too(half, monkeypatch):
    # The dtype and num_queries are static under jit, so they are checked at trace
    # time with the concrete path's message; float16 reached LAPACK there
    # (NotImplementedError), bfloat16 a while_loop carry-type TypeError, and
    # num_queries=7.5 was truncated into a solve.
    x, y, g = (np.asarray(a) for a in _problem(0)[1])
    monkeypatch.setattr(solvers, "augmented_lagrangian",
                        lambda *a, **k: pytest.fail("reached the solver"))
    with pytest.raises(ValueError, match="cast them to float32") as concrete:
        sc_jax.calibrate(jnp.asarray(x, half), y, g)
    with pytest.raises(ValueError) as traced:
        jax.jit(lambda f: sc_jax.calibrate(f, y, g, num_queries=6))(jnp.asarray(x, half))
    assert str(traced.value) == str(concrete.value)
    with pytest.raises(ValueError, match="num_queries must be a positive int.* got 7.5"):
        jax.jit(lambda f, y, g: sc_jax.calibrate(f, y, g, num_queries=7.5))(x, y, g)


def test_traced_bad_input_is_invalid_input_never_converged():
    x, y, g = (np.asarray(a, np.float32) if a.dtype.kind == "f" else np.asarray(a)
               for a in _problem(0)[1])
    rows = np.arange(len(y))
    fit = jax.jit(lambda x, y, g, m, lam, t: sc_jax.calibrate(
        x, y, g, mask=m, lambda_inv=lam, tau=t, num_queries=6))
    ones = np.ones(len(y), np.float32)
    good = (x, y, g, ones, 0.1, 0.9)
    cases = {
        "labels out of range": dict(y=np.where(rows == 3, 7, y)),
        "a class with no rows": dict(y=np.where(y == 2, 0, y)),
        "query ids out of range": dict(g=g + 1),
        "a NaN feature": dict(x=np.where(rows[:, None] == 4, np.nan, x)),
        "every row masked": dict(m=0 * ones),
        "a mask of other values": dict(m=0.5 * ones),
        "tau = 2": dict(t=2.0),
        "lambda_inv = -1": dict(lam=-1.0),
    }
    ok = fit(*good)
    assert int(ok.status) == Status.CONVERGED and np.all(np.isfinite(ok.b))
    for name, change in cases.items():
        args = dict(zip(("x", "y", "g", "m", "lam", "t"), good))
        args.update(change)
        out = fit(*args.values())
        assert int(out.status) == Status.INVALID_INPUT, name
        assert np.all(np.isnan(out.b)) and np.all(np.isnan(out.w)), name
    # Under vmap, only the bad problem of a batch is marked.
    batch = jax.jit(jax.vmap(lambda x, y: sc_jax.calibrate(x, y, g, tau=0.9, num_queries=6)))(
        np.stack([x, np.where(rows[:, None] == 4, np.nan, x)]), np.stack([y, y]))
    assert batch.status.tolist() == [Status.CONVERGED, Status.INVALID_INPUT]
    # float32, two programs that round differently, both stopped at the solver's
    # tolerance on a well-conditioned problem: agreement far inside 1e-4.
    np.testing.assert_allclose(batch.b[0], ok.b, atol=1e-4)


# ---------------------------------------------------------------------------------
# A hyperparameter tuned by gradient descent through the solve (optax), docs/calibration.md's
# research-code example: lambda_inv chosen by leave-one-demonstration-out NLL.


def test_optax_tunes_lambda_inv_through_the_implicit_derivatives(x64):
    import optax

    x, y, g = (jnp.asarray(a) for a in _problem(0)[1])
    k = 6
    folds = (jnp.arange(k)[:, None] != g[None, :]).astype(x.dtype)  # [k, N]: fold j leaves out j
    opt = optax.adam(0.2)
    traces = []

    def cv_nll(log_lam):
        stack = lambda a: jnp.broadcast_to(a, (k,) + a.shape)  # noqa: E731
        cal = sc_jax.calibrate(stack(x), stack(y), stack(g), mask=folds, num_queries=k,
                               lambda_inv=jnp.exp(log_lam))
        logp = jax.vmap(sc_jax.calibrated_log_probs, (0, 0, None))(cal.b, cal.w, x)
        nll = -jnp.take_along_axis(logp, stack(y)[..., None], -1)[..., 0]  # [k, N]
        return jnp.sum(nll * (1 - folds)) / jnp.sum(1 - folds)

    @jax.jit
    def step(log_lam, state):
        traces.append(1)
        loss, grad = jax.value_and_grad(cv_nll)(log_lam)
        updates, state = opt.update(grad, state)
        return optax.apply_updates(log_lam, updates), state, loss, grad

    start = jnp.asarray(np.log(1.0))
    log_lam, state = start, opt.init(start)
    losses = []
    for _ in range(6):
        log_lam, state, loss, grad = step(log_lam, state)
        losses.append(float(loss))
        if len(losses) == 1:
            first_grad = float(grad)
    # The derivative through the solve equals central differences of the same loss
    # (the step's own output at log_lam +- h: no other compile). Tolerance as in
    # test_grad_matches_finite_differences: relative 1e-4.
    h = 1e-4
    plus = float(step(start + h, opt.init(start))[2])
    minus = float(step(start - h, opt.init(start))[2])
    fd = (plus - minus) / (2 * h)
    assert abs(first_grad - fd) <= 1e-4 * max(abs(fd), 1e-3), (first_grad, fd)
    assert len(traces) == 1  # one compiled step for every call
    # Descent on a correct derivative lowers the loss at every step here: on this
    # problem the CV loss is 3.43 at lambda_inv = 1, 1.94 at 0.3, 1.67 at 0.1 (near its
    # minimum, the default) and 1.73 at 0.001; a wrong sign would climb from 3.43.
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert losses[-1] < losses[0] - 0.5 and float(jnp.exp(log_lam)) < 1.0


def test_the_functional_api_refuses_what_it_cannot_answer():
    """Issue 64, case 3: ensemble_proba with weights [0, 0] gave NaN and with [1, -2]
    "probabilities" 1.19 and -0.19; calibrated_log_probs broadcast 2-class parameters
    over 3-class rows into a 3-class answer; tau_schedule(0.5, 1) divided by zero. Each
    is now one ValueError naming the argument, before anything is compiled."""
    b, w = jnp.zeros((2, 1)), jnp.ones((2, 1))
    feats = [jnp.zeros((1, 3, 1)), jnp.zeros((2, 3, 1))]
    for weights in ([0.0, 0.0], [1.0, -2.0], [1.0, np.nan]):
        with pytest.raises(ValueError, match="weights must be finite, >= 0 and not all zero"):
            sc_jax.ensemble_proba(b, w, feats, jnp.asarray(weights))
    with pytest.raises(ValueError, match=r"weights must be \[S\] = \[2\]"):
        sc_jax.ensemble_proba(b, w, feats, jnp.ones(3))
    with pytest.raises(ValueError, match=r"features\[1\] must be \[m_i, T, 1\] with m_i >= 1"):
        sc_jax.ensemble_proba(b, w, [feats[0], jnp.zeros((0, 3, 1))])
    with pytest.raises(ValueError, match=r"b and w must be \[S, n-1\] with S = 2"):
        sc_jax.ensemble_proba(b[:1], w[:1], feats)
    np.testing.assert_allclose(sc_jax.ensemble_proba(b, w, feats, jnp.array([1.0, 0.0])),
                               np.full((3, 2), 0.5), atol=1e-6)
    with pytest.raises(ValueError, match=r"b and w are for 2 classes .* features have 2 log-odds"):
        sc_jax.calibrated_log_probs(jnp.zeros(1), jnp.ones(1), jnp.zeros((5, 2)))
    with pytest.raises(ValueError, match="b holds NaN"):
        sc_jax.calibrated_log_probs(jnp.array([np.nan]), jnp.ones(1), jnp.zeros((5, 1)))
    with pytest.raises(ValueError, match="features hold NaN"):
        sc_jax.calibrated_log_probs(jnp.zeros(1), jnp.ones(1), jnp.array([[np.nan]]))
    with pytest.raises(ValueError, match="b and w are for 2 classes"):  # shapes: even traced
        jax.jit(sc_jax.calibrated_log_probs)(jnp.zeros(1), jnp.ones(1), jnp.zeros((5, 2)))
    assert jax.jit(sc_jax.calibrated_log_probs)(jnp.zeros(1), jnp.ones(1),
                                                jnp.zeros((5, 1))).shape == (5, 2)
    for k in (1, 0, 2.0):
        with pytest.raises(ValueError, match="num_classes must be an integer >= 2"):
            sc_jax.tau_schedule(0.5, k)


def test_a_fit_that_did_not_converge_warns_and_status_is_an_exported_enum():
    """Issue 64, case 4: separable data end UNBOUNDED (NaN gradients) without a word, and
    the Status enum was not exported. Now calibrate warns where the status is concrete,
    calibrated_log_probs(cal, x) does too, and cal.status compares to sc_jax.Status."""
    x = np.array([[-2.0], [-1.0], [1.0], [2.0], [-1.5], [1.5]], np.float32)
    y, q = np.array([0, 0, 1, 1, 0, 1]), np.arange(6)
    with pytest.warns(RuntimeWarning, match="calibrate: the fit's status is UNBOUNDED"):
        cal = sc_jax.calibrate(x, y, q, tau=-1.0)
    assert sc_jax.Status is Status and issubclass(sc_jax.Status, int)
    assert bool(cal.status == sc_jax.Status.UNBOUNDED) and not bool(cal.converged)
    assert sc_jax.Status(int(cal.status)).name == "UNBOUNDED"
    with pytest.warns(RuntimeWarning, match="calibrated_log_probs: the fit's status is UNBOUNDED"):
        sc_jax.calibrated_log_probs(cal, jnp.zeros((2, 1)))


def test_public_functions_refuse_input_they_answered_with_garbage():
    """Issue 64, deliverable 2, found by trying each public function of sc_jax: log_odds
    returned NaN features for NaN scores and an empty answer for one class; tau_schedule
    read accuracy NaN as "below 0.5" and 2.0 as "above 0.9"; make_mesh(2.5) made a mesh
    of 2; calibrated_log_probs of strings was a TypeError."""
    for bad, match in ((np.array([[np.nan, 1.0]]), "logprobs hold 1 NaN"),
                       (np.array(0.3), r"logprobs must be \[..., n\]"),
                       (np.array([[0.0]]), "n >= 2 classes"),
                       (np.array([["a", "b"]]), "logprobs must be real numbers")):
        with pytest.raises(ValueError, match=match):
            sc_jax.log_odds(bad)
    np.testing.assert_allclose(sc_jax.log_odds(np.log([[0.25, 0.75]])), [[np.log(3.0)]])
    for acc in (np.nan, 2.0, -0.1):
        with pytest.raises(ValueError, match=r"accuracy must be a fraction in \[0, 1\]"):
            sc_jax.tau_schedule(acc, 3)
    assert jax.jit(sc_jax.tau_schedule, static_argnums=1)(0.95, 3).shape == ()  # traced: no check
    with pytest.raises(ValueError, match="data must be a whole number of devices, got 2.5"):
        sc_jax.make_mesh(2.5)
    with pytest.raises(ValueError, match="b must be real numbers"):
        sc_jax.calibrated_log_probs(np.array(["a"]), np.ones(1), np.zeros((2, 1)))


def test_last_logits_refuses_float_token_ids_and_rows_outside_the_vocabulary():
    """Float token ids were truncated (1.5 read as 1) and rows past the vocabulary
    clamped by the gather: logits of other tokens, without a word."""
    model = sc_jax.load_model("random:tiny-llama")
    with pytest.raises(ValueError, match="token ids must be integers, got 1.5"):
        model.last_logits([[1.5, 2]])
    with pytest.raises(ValueError, match="rows must be a list of integer token ids"):
        model.last_logits([[1, 2]], rows=[1.5])
    with pytest.raises(ValueError, match=r"rows name token ids outside the vocabulary \[0, 613\)"):
        model.last_logits([[1, 2]], rows=[10**6])
    assert model.last_logits([[1, 2]], rows=[3, 4]).shape == (1, 2)
