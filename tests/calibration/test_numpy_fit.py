"""The calibrator API: the hidden-truth behaviour check, the tau schedule, the
ensemble, compile counting and input validation. Runs in float32 (the default)."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sc_jax.calibration import baselines

from sc_jax.calibration import buckets, defaults, numpy_fit, numpy_predict

from sc_jax.experiment.evaluation import metrics
from sc_jax.experiment.evaluation.methods import fit_sc
from sc_jax.experiment.protocol.config import RunConfig
from sc_jax.experiment.protocol.jobs import SeedScores
from sc_jax.runtime.timing import CompileMeter

from sc_jax.calibration import solvers

from sc_jax.calibration import synthetic
from sc_jax.scoring.enumeration import default_m
from sc_jax.calibration.defaults import tau_from_accuracy
from sc_jax.calibration.numpy_fit import fit, fit_batch
from sc_jax.calibration.numpy_predict import FitResult, calibrated_proba, predict_proba
from sc_jax.calibration.solvers import Status


def World(slopes, seed):  # noqa: N802  (reads like the class it builds)
    """Hidden truth with s = 2.5 (see :class:`sc_jax.calibration.synthetic.World`): a slope < 0
    points that class the wrong way (paper Figure 1)."""
    return synthetic.World(len(slopes) + 1, slopes, s=2.5, seed=seed)


SIZES = (1, 2)
K = 16  # 240 and 3360 surrogate rows


def _evaluate(world, test_size=4000):
    """Fit SC and SC* on the surrogate data, then score fresh samples: SC with the
    two-level ensemble, Base / CC / BC on the full context."""
    sur = list(world.surrogate(K, SIZES).values())
    fits = fit_batch(sur)
    fits_star = fit_batch(sur, sc_star=True)
    assert all(f.converged for f in fits + fits_star)
    x, y = world.sample(test_size)
    feats = [np.stack([world.llm(x, world.context())
                       for _ in range(default_m(len(s[1]), K, i))]) for s, i in zip(sur, SIZES)]
    identity = (np.zeros(world.n - 1), np.ones(world.n - 1))
    delta = world.context()
    p_base = calibrated_proba(*identity, world.llm(x, delta))
    # Content-free input: a point where the truth is indifferent (t = 0), same context.
    x_cf = np.full((len(baselines.CONTENT_FREE_INPUTS), world.n - 1), world.s / 2)
    p_cf = calibrated_proba(*identity, world.llm(x_cf, delta))
    acc = {
        "bayes": metrics.accuracy(y, world.bayes(x)),
        "base": metrics.accuracy(y, p_base.argmax(1)),
        "sc": metrics.accuracy(y, predict_proba(fits, feats).argmax(1)),
        "sc_star": metrics.accuracy(y, predict_proba(fits_star, feats).argmax(1)),
        "cc": metrics.accuracy(y, baselines.contextual_calibration(p_base, p_cf).argmax(1)),
        "bc": metrics.accuracy(y, baselines.batch_calibration(p_base).argmax(1)),
    }
    return acc, fits


@pytest.mark.parametrize("seed", [0, 1])
def test_sc_recovers_a_misoriented_class(seed):
    # Class 1's log-odds point the wrong way. Shift-only methods (CC, BC, SC*) cannot
    # turn them around; SC can, by learning w_1 < 0 (tau = -1 from the schedule, since
    # the base model is below 50% on the surrogate data).
    acc, fits = _evaluate(World((-0.3, 1.0), seed))
    chance = 1 / 3
    assert acc["sc"] >= 0.9 * acc["bayes"], acc
    for name in ("cc", "bc", "sc_star"):
        assert abs(acc[name] - chance) <= 0.10, (name, acc)
    assert all(f.tau == -1.0 and f.w[0] < 0 < f.w[1] for f in fits)


@pytest.mark.parametrize("seed", [0, 1])
def test_sc_keeps_a_well_aligned_model(seed):
    acc, fits = _evaluate(World((1.0, 1.0), seed))
    assert acc["base"] >= 0.9 * acc["bayes"]
    assert acc["sc"] >= acc["base"] - 0.01, acc
    assert all(f.tau > 0.99 for f in fits)  # in-sample accuracy >= 0.7: a tight region


def test_tau_schedule():
    # Appendix A: alpha = 20^(1/(K-1)), 45^(1/(K-1)), 90^(1/(K-1)) degrees, or 180.
    cos = lambda deg: math.cos(math.radians(deg))  # noqa: E731
    assert tau_from_accuracy(0.95, 2) == pytest.approx(cos(20))
    assert tau_from_accuracy(0.9, 2) == pytest.approx(cos(20))
    assert tau_from_accuracy(0.8, 2) == pytest.approx(cos(45))
    assert tau_from_accuracy(0.6, 2) == pytest.approx(cos(90), abs=1e-12)
    assert tau_from_accuracy(0.49, 2) == -1.0
    assert tau_from_accuracy(0.95, 5) == pytest.approx(cos(20 ** 0.25))
    assert tau_from_accuracy(0.7, 3) == pytest.approx(cos(45 ** 0.5))
    assert tau_from_accuracy(0.5, 6) == pytest.approx(cos(90 ** 0.2))
    with pytest.raises(ValueError):
        tau_from_accuracy(1.5, 3)


def _fit_result(b, w, rows):
    return FitResult(b=np.asarray(b, float), w=np.asarray(w, float), status=Status.CONVERGED,
                     iterations=1, outer_iterations=1, objective=0.0, constraint=1.0,
                     violation=0.0, tau=0.0, lambda_inv=0.0, solver="projected",
                     sc_star=False, num_rows=rows, base_accuracy=1.0)


def test_two_level_ensemble():
    rng = np.random.default_rng(0)
    fits = [_fit_result([0.5, -0.2], [1.2, 0.7], 56), _fit_result([0.1, 0.3], [0.8, 1.5], 20160)]
    feats = [rng.normal(size=(3, 10, 2)), rng.normal(size=(5, 10, 2))]
    per_size = [calibrated_proba(f.b, f.w, x).mean(0) for f, x in zip(fits, feats)]
    np.testing.assert_allclose(predict_proba(fits, feats), (per_size[0] + per_size[1]) / 2)
    # The reference code's a_i = min(P(k, i)(k - i), 15000), from k and i alone: at
    # k = 8, sizes 1 and 5 have 56 and min(20160, 15000) rows before any budget, however
    # many rows the fits kept (the second fit was truncated to 5000 by the budget).
    fits[1] = dataclasses.replace(fits[1], num_rows=5000)
    weights = np.array([56, 15000]) / (56 + 15000)
    np.testing.assert_allclose(predict_proba(fits, feats, size_weights="reference", shots=8,
                                             sizes=[1, 5]),
                               weights[0] * per_size[0] + weights[1] * per_size[1])
    np.testing.assert_array_equal(numpy_predict.reference_size_weights(8, [1, 2, 3, 4, 5]),
                                  [56, 336, 1680, 6720, 15000])
    np.testing.assert_array_equal(numpy_predict.reference_size_weights(4, [1, 2, 3]), [12, 24, 24])
    with pytest.raises(ValueError, match="needs shots"):
        predict_proba(fits, feats, size_weights="reference")
    with pytest.raises(ValueError, match="sizes must lie in 1..k-1"):
        numpy_predict.reference_size_weights(4, [1, 4])
    # Each m_i sub-context counts once within its size: averaging within sizes first is
    # not the same as pooling all sub-contexts.
    pooled = np.concatenate([calibrated_proba(f.b, f.w, x) for f, x in zip(fits, feats)]).mean(0)
    assert not np.allclose(predict_proba(fits, feats), pooled)
    with pytest.raises(ValueError, match="one feature array per fitted size"):
        predict_proba(fits, feats[:1])
    with pytest.raises(ValueError, match="size_weights"):
        predict_proba(fits, feats, size_weights="paper")


def test_predict_proba_refuses_what_it_cannot_answer_and_warns_on_a_fit_that_did_not_converge():
    """Issue 64, cases 3 and 4: a size with no sub-contexts gave all-NaN probabilities,
    NaN parameters NaN ones, and a fit's status was never read."""
    import warnings
    rng = np.random.default_rng(0)
    fits = [_fit_result([0.5, -0.2], [1.2, 0.7], 56), _fit_result([0.1, 0.3], [0.8, 1.5], 20)]
    feats = [rng.normal(size=(3, 4, 2)), rng.normal(size=(2, 4, 2))]
    with pytest.raises(ValueError, match=r"features\[1\] has no sub-contexts \(m_i = 0"):
        predict_proba(fits, [feats[0], np.zeros((0, 4, 2))])
    nan_fit = dataclasses.replace(fits[0], b=np.array([np.nan, 0.0]), status=Status.NONFINITE)
    with pytest.raises(ValueError, match=r"fits\[0\] has NaN or infinite parameters \(status NONFINITE"):
        predict_proba([nan_fit, fits[1]], feats)
    with pytest.raises(ValueError, match="b holds NaN"), pytest.warns(RuntimeWarning, match="NONFINITE"):
        nan_fit.predict_proba(feats[0])
    with pytest.raises(ValueError, match=r"features\[0\] must be \[m_i, T, 2\]"):
        predict_proba(fits, [rng.normal(size=(3, 4, 3)), feats[1]])
    unbounded = dataclasses.replace(fits[1], status=Status.UNBOUNDED)
    with pytest.warns(RuntimeWarning, match=r"fits\[1\].*status is UNBOUNDED, not CONVERGED"):
        out = predict_proba([fits[0], unbounded], feats)
    assert np.all(np.isfinite(out))
    with pytest.warns(RuntimeWarning, match="MAX_ITERATIONS"):
        dataclasses.replace(fits[0], status=Status.MAX_ITERATIONS).predict_proba(feats[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        predict_proba(fits, feats)  # converged fits: no warning
    # Found by trying predict_proba's other arguments: an AttributeError, and a size of
    # 1.5 weighted as size 1.
    with pytest.raises(ValueError, match=r"fits\[1\] must be a FitResult \(from fit or fit_batch\), got NoneType"):
        predict_proba([fits[0], None], feats)
    with pytest.raises(ValueError, match=r"sizes must be integers, got \[1, 1.5\]"):
        predict_proba(fits, feats, size_weights="reference", shots=4, sizes=[1, 1.5])


def test_compilations_do_not_grow_with_batch_contents():
    world = World((1.0, 0.5), 3)
    sur = list(world.surrogate(8, (1, 2, 3)).values())  # 56, 336, 1680 rows
    before = dict(solvers.trace_counts)
    fit_batch(sur, solver="projected")
    first = solvers.trace_counts["projected"] - before["projected"]
    assert first <= 2  # one program per row bucket: 512 (56, 336 rows) and 1,792
    # New data, new taus and lambdas, other row counts in the same bucket, other query
    # ids: no recompilation.
    other = list(World((0.7, 1.2), 4).surrogate(8, (1, 2, 3)).values())
    other[2] = tuple(a[:1670] for a in other[2])  # 1680 and 1670 share the 1792 bucket
    other[1] = (other[1][0], other[1][1], other[1][2] + 100)
    fit_batch(other, solver="projected", tau=[0.3, -1.0, 0.9], lambda_inv=[0.0, 1.0, 5.0])
    fit_batch(sur, solver="projected", tau=0.5, lambda_inv=0.0)
    assert solvers.trace_counts["projected"] - before["projected"] == first
    # A larger row bucket is a new shape: exactly one more compilation (the counter works).
    bigger = list(World((1.0, 0.5), 5).surrogate(8, (1, 4)).values())
    fit_batch(bigger, solver="projected")
    assert solvers.trace_counts["projected"] - before["projected"] == first + 1


def test_fit_one_problem_and_solver_choice():
    x, y, g = World((1.0, 0.5), 6).surrogate(8, (2,))[2]
    al = fit(x, y, g, tau=0.95)
    assert isinstance(al, FitResult) and al.converged and al.solver == "augmented_lagrangian"
    assert al.b.shape == (2,) and al.num_rows == len(y) and al.tau == 0.95
    assert al.predict_proba(x).shape == (len(y), 3)
    ref = fit(x, y, g, tau=0.95, solver="scipy")
    assert ref.converged
    # float32 solve versus the float64 reference.
    assert abs(al.objective - ref.objective) <= 1e-5 * abs(ref.objective)
    star = fit(x, y, g, tau=0.95, sc_star=True, solver="scipy")
    np.testing.assert_array_equal(star.w, 1.0)
    assert star.objective >= ref.objective - 1e-9  # SC* is SC restricted to w = 1


def test_bad_input_is_rejected_before_any_solve(monkeypatch):
    def no_solve(*a, **k):
        raise AssertionError("a solver ran on bad input")

    monkeypatch.setattr(solvers, "solve_batch", no_solve)
    monkeypatch.setattr(solvers, "scipy", no_solve)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(30, 2))
    y = np.arange(30) % 3
    g = np.arange(30) % 5
    cases = [
        (dict(features=x, labels=np.r_[y[:-1], 3], query_ids=g), "labels .* must be in"),
        (dict(features=x, labels=np.r_[y[:-1], -1], query_ids=g), "labels .* must be in"),
        (dict(features=np.where(np.arange(30)[:, None] == 4, np.nan, x), labels=y,
              query_ids=g), "NaN or infinite"),
        (dict(features=np.where(np.arange(30)[:, None] == 4, np.inf, x), labels=y,
              query_ids=g), "NaN or infinite"),
        (dict(features=x, labels=np.where(y == 2, 0, y), query_ids=g), r"class\(es\) \[2\]"),
        (dict(features=x, labels=y, query_ids=g, tau=1.5), "tau must be"),
        (dict(features=x, labels=y, query_ids=g, tau=-1.01), "tau must be"),
        (dict(features=x, labels=y, query_ids=g, tau=float("nan")), "tau must be"),
        (dict(features=np.zeros((0, 2)), labels=np.zeros(0, int), query_ids=np.zeros(0, int)),
         "N = 0"),
        (dict(features=x, labels=y[:-1], query_ids=g), "shape"),
        (dict(features=x[:, 0], labels=y, query_ids=g), r"\[N, n-1\]"),
        (dict(features=x, labels=y, query_ids=g, lambda_inv=-1.0), "lambda_inv"),
        (dict(features=x, labels=y, query_ids=g, solver="lbfgs"), "unknown solver"),
        (dict(features=x, labels=y + 0.5, query_ids=g), "integers"),
    ]
    for kwargs, match in cases:
        with pytest.raises(ValueError, match=match):
            fit(**kwargs)
    # Mixed class counts are grouped, one solver per n (tests/calibration/test_jax_calibrate.py);
    # pack_batch itself still refuses them.
    with pytest.raises(ValueError, match="same number of classes"):
        buckets.pack_batch([(x, y, g), (x[:, :1], y % 2, g)])
    with pytest.raises(ValueError, match="no problems"):
        fit_batch([])
    with pytest.raises(ValueError, match="tau has 3 entries for 2 problems"):
        fit_batch([(x, y, g)] * 2, tau=[0.1, 0.2, 0.3])
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="batch_size must be"):
            fit_batch([(x, y, g)] * 2, batch_size=bad)


def test_bucketed_equals_padded_and_unbucketed():
    # The fast path (fit_batch's default: one compiled call per row bucket and
    # instance, batching.run_parts) and the vmapped one (parts of a bucket padded to a
    # power-of-two count with filler instances) against the plain ones: every problem
    # padded to the largest N (bucketed=False) and the unbucketed fit, one program
    # over the batch as given (no count buckets, no fillers; solve_batch under jit).
    # The same problems, so the same optima and statuses. Padding changes only the
    # summation order (float64), so iterates may part in the last bits: objectives
    # to 1e-10, parameters to 1e-7 and calibrated probabilities to 1e-8. Classes
    # overlap (s = 1, row noise 1) so that every optimum is finite: on separable
    # data the scale drifts along a flat direction and two runs stop at different
    # points of it.
    problems = []
    for seed in (0, 1):
        world = synthetic.World(3, (1.0, 0.6), s=1.0, row_sd=1.0, seed=seed)
        problems += list(world.surrogate(8, (1, 2, 3)).values())
    taus = [0.99, -1.0, 0.95, 0.9, 0.999, -1.0]
    lams = [0.1, 0.0, 1.0, 0.1, 0.0, 0.1]
    options = solvers.SolverOptions()  # one start at every lambda_inv: comparable paths
    settings = dict(tau=taus, lambda_inv=lams, dtype="float64", options=options)
    bucketed = fit_batch(problems, **settings)
    padded = fit_batch(problems, bucketed=False, **settings)
    vmapped = fit_batch(problems, batch_size=None, threads=3, **settings)
    with jax.enable_x64(True):
        one, _ = buckets.pack_batch(problems, "float64")
        plain = jax.jit(lambda p, lam, tau: solvers.solve_batch(p, lam, tau, options=options))(
            one, jnp.asarray(lams), jnp.asarray(taus))
    assert [f.num_rows for f in bucketed] == [56, 336, 1680] * 2
    # Problems of at most SMALL_BUCKET_ROWS share one bucket of that many rows (one
    # compiled solver fewer): 56 and 336 rows padded to 512, 1,680 to 1,792.
    indices, packed, _ = buckets.pack_buckets(problems)
    assert [p.features.shape[:2] for p in packed] == [(4, 512), (2, 1792)]
    assert sorted(sum(indices, [])) == list(range(6)) and indices[1] == [2, 5]
    for k, (a, b, c) in enumerate(zip(bucketed, padded, vmapped)):
        ref = float(plain.objective[k])
        assert a.status == b.status == c.status == int(plain.status[k]) == Status.CONVERGED
        for f in (a, b, c):
            assert abs(f.objective - ref) <= 1e-10 * abs(ref)
            np.testing.assert_allclose(f.b, plain.params.b[k], rtol=0, atol=1e-7)
            np.testing.assert_allclose(f.w, plain.params.w[k], rtol=0, atol=1e-7)
    for (x, _, _), a, b, c in zip(problems, bucketed, padded, vmapped):
        np.testing.assert_allclose(a.predict_proba(x), b.predict_proba(x), atol=1e-8)
        np.testing.assert_allclose(a.predict_proba(x), c.predict_proba(x), atol=1e-8)


def _seed_scores(seed: int) -> SeedScores:
    """What a run's fit reads of one seed's scores: the surrogate log-probs of sizes
    1..3 at k = 8 (n = 2), their row counts cut as a surrogate budget would, by seed."""
    sur = synthetic.World(2, (1.0,), seed=seed).surrogate(8, (1, 2, 3))
    cut = {1: 56, 2: 336 - 7 * seed, 3: 1680 - 13 * seed}  # rows: in the same buckets
    surrogate = {}
    for i, (x, y, g) in sur.items():
        logp = -np.logaddexp(0.0, np.concatenate([x, -x], axis=1))  # log softmax([0, m])
        surrogate[i] = (logp[:cut[i]], y[:cut[i]], g[:cut[i]])
    empty = np.zeros((1, 2))
    return SeedScores(empty, empty, empty, surrogate, {}, np.zeros(1, int))


def test_later_runs_with_more_seeds_compile_no_fit_program():
    """A run's fits (every SC / SC* fit of a (dataset, k), as run.py makes them) for 2
    and then 3 seeds, after those of 1 seed: more problems, other row counts in the
    same row buckets. They compile no program at all: each fit
    program is shaped by one row bucket and a power-of-two instance count, so the
    programs of the first run serve them (and, through the persistent compilation
    cache, a later process)."""
    scores = {seed: _seed_scores(seed) for seed in range(3)}
    config = RunConfig(shots=(8,), seeds=(0,), max_size=3)
    fit_sc(scores, "synthetic", 8, config, 0.1)
    before = dict(solvers.trace_counts)
    for seeds in ((0, 1), (0, 1, 2)):
        with CompileMeter() as meter:
            fits, _ = fit_sc(scores, "synthetic", 8, dataclasses.replace(config, seeds=seeds), 0.1)
        assert len(fits["sc"]) == 3 * len(seeds)
        assert meter.count() == (0, 0), dict(meter.compiled)
    assert solvers.trace_counts == before


def test_guard_fits_bias_only_where_the_surrogate_data_are_below_chance():
    """guard="bias_only": a size whose surrogate data the LLM scores below chance
    (here 2 of 12 rows right, a model oriented against the labels) is fitted as SC*
    and marked guarded; a size above chance is fitted as the paper does, unchanged."""
    rng = np.random.default_rng(3)
    y = np.repeat([0, 1], 6)
    q = np.tile(np.arange(4), 3)
    against = ((1.0 - 2.0 * y) * rng.uniform(0.5, 2.0, 12))[:, None]  # sign opposite to y
    against[:2] *= -1.0  # two rows right: accuracy 2/12, below 1/2
    along = -against
    assert numpy_fit.below_chance(defaults.base_accuracy(against, y), 2)
    assert not numpy_fit.below_chance(defaults.base_accuracy(along, y), 2)
    problems = [(against, y, q), (along, y, q)]
    paper = fit_batch(problems)
    guarded = fit_batch(problems, guard="bias_only")
    star = fit_batch(problems, sc_star=True)
    assert paper[0].w[0] < 0 and not paper[0].guarded  # the paper's SC reverses the model
    assert guarded[0].guarded and guarded[0].sc_star and guarded[0].w[0] == 1.0
    # The same SC* problem solved in another batch: float32, solver tol 1e-6 -> 1e-5.
    np.testing.assert_allclose(guarded[0].b, star[0].b, atol=1e-5)
    assert not guarded[1].guarded and not guarded[1].sc_star
    np.testing.assert_allclose(guarded[1].b, paper[1].b, atol=1e-5)
    np.testing.assert_allclose(guarded[1].w, paper[1].w, atol=1e-5)
    with pytest.raises(ValueError, match="guard must be one of"):
        fit_batch(problems, guard="always")


def test_sc_star_without_trust_region_and_the_free_guard():
    """SC* with w = 1 and tau = 0.997 keeps mean_c 1/||(b_c, 1)|| >= tau, so |b| <= about
    0.078; the unconstrained bias-only fit (tau = -1, the reference code's SC*) is free
    to remove a large shift. guard="bias_only_free" fits that form where below chance."""
    rng = np.random.default_rng(5)
    y = np.repeat([0, 1], 40)
    q = np.tile(np.arange(8), 10)
    x = ((2.0 * y - 1.0) * rng.uniform(0.5, 1.5, 80) + 3.0)[:, None]  # shifted by +3
    bound = np.sqrt(1 / 0.997 ** 2 - 1)
    kept = fit_batch([(x, y, q)], sc_star=True, tau=0.997)[0]
    free = fit_batch([(x, y, q)], sc_star=True, tau=-1.0)[0]
    assert abs(kept.b[0]) <= bound + 1e-4 and free.b[0] < -2.0
    assert kept.w[0] == free.w[0] == 1.0
    # Below chance (the model reversed, accuracy near 0): the guard's SC* keeps or
    # drops the trust region; sizes above chance are fitted as SC either way.
    reversed_ = ((1.0 - 2.0 * y) * rng.uniform(0.5, 1.5, 80) + 0.3)[:, None]
    problems = [(reversed_, y, q), (x - 3.0, y, q)]
    kept_guard = fit_batch(problems, guard="bias_only", tau=0.997)
    free_guard = fit_batch(problems, guard="bias_only_free", tau=0.997)
    assert kept_guard[0].guarded and kept_guard[0].tau == 0.997
    assert free_guard[0].guarded and free_guard[0].sc_star and free_guard[0].tau == -1.0
    np.testing.assert_allclose(free_guard[0].b, fit_batch(problems[:1], sc_star=True,
                                                          tau=-1.0)[0].b, atol=1e-5)
    assert not free_guard[1].guarded and free_guard[1].tau == 0.997
    np.testing.assert_allclose(free_guard[1].w, kept_guard[1].w, atol=1e-5)
    with pytest.raises(ValueError, match="guard must be one of"):
        fit_batch(problems, guard="free")
