"""The reports' statistics against SciPy called directly, the reliability bins against
the ECE metric, the display names and colours, and the LaTeX tables."""

import re

import numpy as np
import pytest
from scipy import stats as sps

from sc_jax.experiment.evaluation.metrics import calibration_bins, expected_calibration_error
from sc_jax.experiment.evaluation.results import METHOD_NAMES, ResultRow, RunResults
from sc_jax.experiment.reporting import stats


def test_mean_sd_is_the_sample_standard_deviation():
    x = [0.61, 0.7, 0.64, 0.58]
    mean, sd, n = stats.mean_sd(x)
    assert (mean, n) == (pytest.approx(np.mean(x), rel=1e-15), 4)
    assert sd == pytest.approx(np.std(x, ddof=1), rel=1e-15) and sd != pytest.approx(np.std(x))
    assert np.isnan(stats.mean_sd([0.5])[1])  # one seed: no spread


def test_few_seeds_get_scipys_t_interval():
    x = np.array([0.05, 0.06, 0.062])
    ci = stats.seed_interval(x)
    want = sps.t.interval(0.95, 2, loc=x.mean(), scale=sps.sem(x))
    assert (ci.low, ci.high) == pytest.approx(want, rel=1e-14) and ci.method == "t"
    assert stats.seed_interval([0.3, 0.3, 0.3]) == stats.Interval(0.3, 0.3, "t")  # SciPy: NaN
    assert stats.seed_interval([0.3]) is None


def test_ten_seeds_get_scipys_bca_bootstrap_on_the_same_draws():
    x = np.random.default_rng(3).normal(0.02, 0.03, stats.BOOTSTRAP_MIN_SEEDS)
    ci = stats.seed_interval(x, seed=7, n_resamples=2000)
    want = sps.bootstrap((x,), np.mean, confidence_level=0.95, method="BCa",
                         n_resamples=2000, **stats._rng_kwarg(7)).confidence_interval
    assert (ci.low, ci.high) == (want.low, want.high) and ci.method == "BCa bootstrap"
    assert ci.low < x.mean() < ci.high
    # One seed fewer: the t interval.
    assert stats.seed_interval(x[:-1]).method == "t"


def test_mcnemar_is_scipys_exact_binomial_test_on_the_discordant_pairs():
    for a, b in ((7, 2), (0, 5), (13, 13), (1, 0)):
        assert stats.mcnemar_exact_p(a, b) == sps.binomtest(a, a + b, 0.5).pvalue
    assert stats.mcnemar_exact_p(10, 0) == pytest.approx(2 * 0.5 ** 10, rel=1e-12)
    assert stats.mcnemar_exact_p(0, 0) == 1.0


def test_signed_rank_over_queries_averages_the_seeds_first():
    rng = np.random.default_rng(0)
    a = rng.random((3, 40)) < 0.7
    b = rng.random((3, 40)) < 0.5
    d = (a.astype(float) - b).mean(axis=0)
    assert stats.query_signed_rank_p(a, b) == sps.wilcoxon(d[d != 0]).pvalue
    assert stats.query_signed_rank_p(a, a) == 1.0
    with pytest.raises(ValueError, match=r"\[seeds, queries\]"):
        stats.query_signed_rank_p(a, b[:, :3])


def test_reliability_bins_are_the_ece_metrics():
    from sc_jax.experiment.reporting.figures import pooled_calibration_bins

    rng = np.random.default_rng(1)
    probs = rng.dirichlet(np.ones(3), 200)
    probs[0] = [1.0, 0.0, 0.0]  # confidence 1 in the last bin
    labels = rng.integers(0, 3, 200)
    count, acc, conf = calibration_bins(probs, labels, 10)
    assert count.sum() == 200 and np.isnan(acc[count == 0]).all()
    full = count > 0
    ece = np.sum(count[full] / 200 * np.abs(acc[full] - conf[full]))
    assert ece == pytest.approx(expected_calibration_error(probs, labels, 10), abs=1e-14)
    top = probs.max(1)
    in_last = top > 0.9
    assert conf[-1] == pytest.approx(top[in_last].mean(), rel=1e-14)
    assert acc[-1] == pytest.approx(np.mean(probs[in_last].argmax(1) == labels[in_last]), rel=1e-14)
    # Pooled over datasets of 3 and 2 classes: the counts add up, weighted means.
    recs = [{"dataset": "a", "gold": int(g), "probs": {"sc": p.tolist()}}
            for p, g in zip(probs, labels)]
    two = rng.dirichlet(np.ones(2), 50)
    gold2 = rng.integers(0, 2, 50)
    recs += [{"dataset": "b", "gold": int(g), "probs": {"sc": p.tolist()}}
             for p, g in zip(two, gold2)]
    pc, pa, pf = pooled_calibration_bins(recs, "sc", 10)
    c2, a2, f2 = calibration_bins(two, gold2, 10)
    assert (pc == count + c2).all()
    both = (count > 0) & (c2 > 0)
    assert pa[both] == pytest.approx((acc * count + a2 * c2)[both] / pc[both], rel=1e-12)
    assert pf[both] == pytest.approx((conf * count + f2 * c2)[both] / pc[both], rel=1e-12)


def test_display_names_and_colours():
    from sc_jax.experiment.reporting.names import (
        METHOD_COLOURS,
        dataset_name,
        method_colour,
        method_name,
        order_methods,
    )

    assert dataset_name("rotten_tomatoes") == "Rotten Tomatoes" and dataset_name("mine") == "mine"
    assert method_name("sc_star") == "SC*" and method_name("hidden") == "Hidden Calibration"
    assert method_name("new_method") == "new_method"
    known = {*METHOD_NAMES, "looc", "linc", "surprise", "hidden"}
    assert len({method_colour(m) for m in known}) == len(known)  # no two alike
    assert known <= set(METHOD_COLOURS)
    assert method_colour("zz") == method_colour("zz")  # fixed by the name
    assert method_colour("zz") not in METHOD_COLOURS.values()
    assert order_methods(["zz", "sc", "base", "looc", "aa"]) == ["base", "sc", "looc", "aa", "zz"]
    assert order_methods(["base", "sc", "looc"], sc_first=True) == ["sc", "base", "looc"]


def _run(methods=("base", "bc", "sc", "looc"), datasets=("my_task", "sst2")) -> RunResults:
    rng = np.random.default_rng(2)
    rows = [ResultRow(dataset=d, shots=4, seed=s, method=m, accuracy=float(rng.uniform(0.5, 0.9)),
                      macro_f1=float(rng.uniform(0.4, 0.9)), ece=float(rng.uniform(0.01, 0.3)))
            for d in datasets for m in methods for s in range(3)]
    return RunResults(config={"model": "m_1", "seeds": [0, 1, 2], "test_size": 8,
                              "mode": "first_token", "solver": "s"}, rows=tuple(rows))


def test_latex_tables_are_escaped_balanced_and_bold_the_best():
    from sc_jax.experiment.reporting.report import latex_table, summarize

    res = _run()
    summ = summarize(res.rows)
    for metric in ("macro_f1", "accuracy", "ece"):
        tex = latex_table(res, metric)
        body = re.sub(r"\\[{}_%$&#]", "", tex)  # escaped characters
        assert body.count("{") == body.count("}")
        assert "_" not in body.replace("\\label{tab:sc-jax-", "")  # every underscore escaped
        assert tex.count("\\begin{table}") == tex.count("\\end{table}") == 1
        assert "Method & my\\_task & SST-2 & Average \\\\" in tex
        assert "\nLOOC & " in tex and "(ddof = 1) over 3 seeds" in tex
        pick = min if metric == "ece" else max
        best = pick(summ[("sst2", 4, m)][metric][0] for m in ("base", "bc", "sc", "looc"))
        assert f"\\textbf{{{100 * best:.1f} $\\pm$" in tex


def test_tables_name_their_statistics_and_take_unknown_methods():
    from sc_jax.experiment.reporting.figures import f1_bars_figure
    from sc_jax.experiment.reporting.report import interval_table, markdown_tables

    res = _run()
    table = markdown_tables(res)
    assert "| LOOC |" in table and "| SST-2 | my_task |" not in table
    assert "mean ± s.d. (ddof=1) over 3 seeds" in table and "Student t interval" in table
    assert "## Macro-F1, 4-shot: mean and 95% t interval over 3 seeds" in table
    lines, used = interval_table(res.rows, "macro_f1", 4, ["sc"], ["sst2"])
    vals = [r.macro_f1 for r in res.rows if r.method == "sc" and r.dataset == "sst2"]
    ci = stats.seed_interval(vals)
    assert used == {"t"} and lines[2].startswith(
        f"| SC (guard) | {100 * np.mean(vals):.1f} [{100 * ci.low:.1f}, {100 * ci.high:.1f}] |")
    fig = f1_bars_figure(res)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["SC (guard)", "Base", "BC", "LOOC"]


def test_reliability_diagram_writes_its_files(tmp_path):
    from sc_jax.experiment.reporting.figures import plot_reliability, reliability_figure
    from sc_jax.experiment.reporting.samples import seed_records

    rng = np.random.default_rng(4)
    recs = []
    for d, n in (("sst2", 2), ("ag_news", 4)):
        for seed in range(2):
            probs = {m: rng.dirichlet(np.ones(n), 16) for m in ("sc", "bc", "looc")}
            recs += seed_records(d, 4, seed, rng.integers(0, n, 16), probs)
    paths = plot_reliability(recs, tmp_path / "reliability.png", "m")
    assert sorted(paths) == ["pdf", "png", "svg"]
    assert all(p.stat().st_size > 0 for p in paths.values())
    fig = reliability_figure([r for r in recs if r["dataset"] == "sst2"])
    title = fig.axes[0].get_title()
    probs = np.array([r["probs"]["sc"] for r in recs if r["dataset"] == "sst2"])
    gold = [r["gold"] for r in recs if r["dataset"] == "sst2"]
    assert title == f"SC (guard): ECE {100 * expected_calibration_error(probs, gold):.1f}%"
    assert reliability_figure([]) is None
