"""Tables, CSV and plots rebuilt from a results dict (no model)."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from sc_jax.experiment.evaluation.results import ResultRow, RunResults, RunTiming, load_results
from sc_jax.experiment.reporting.report import markdown_tables, sc_against_best_baseline, summarize, write_report


def _results():
    rng = np.random.default_rng(0)
    rows = []
    for d in ("rotten_tomatoes", "sst2"):
        for k in (4, 8):
            for m in ("base", "cc", "sc"):
                for s in range(3):
                    rows.append(dict(dataset=d, model="m", shots=k, method=m, seed=s,
                                     accuracy=float(rng.uniform(0.5, 0.9)),
                                     macro_f1=float(rng.uniform(0.4, 0.9)), ece=0.1))
    params = [dict(dataset="sst2", shots=4, seed=s, size=i, method="sc", b=[0.1 * i], w=[1.0 - 0.1 * s])
              for s in range(3) for i in (1, 2, 3)]
    return {"config": {"model": "m", "seeds": [0, 1, 2], "test_size": 16, "mode": "first_token",
                       "solver": "augmented_lagrangian", "lambda_inv": 0.1},
            "rows": rows, "params": params, "notes": ["a note"]}


def _typed(res: dict) -> RunResults:
    return RunResults.from_json(res)


def _rows(rows: list[dict]) -> list[ResultRow]:
    return [ResultRow.from_json(r) for r in rows]


def test_summary_and_table():
    res = _typed(_results())
    summ = summarize(res.rows)
    vals = [r.macro_f1 for r in res.rows if (r.dataset, r.shots, r.method) == ("sst2", 8, "sc")]
    mean, std, n = summ[("sst2", 8, "sc")]["macro_f1"]
    assert n == 3 and mean == pytest.approx(np.mean(vals))
    assert std == pytest.approx(np.std(vals, ddof=1), rel=1e-12)  # the sample s.d.
    table = markdown_tables(res)
    assert "## Macro-F1, 4-shot: mean ± s.d. (ddof=1) over 3 seeds" in table
    assert "## Accuracy, 8-shot" in table and "## ECE (top-label, 10 bins" in table
    assert "| SC (guard) | 10.0 ± 0.0 | 10.0 ± 0.0 | 10.0 |" in table  # the ECE table
    assert f"{100 * mean:.1f} ± {100 * std:.1f}" in table
    assert "- a note" in table
    # A run resumed from its checkpoint holds the seeds as a tuple: the header reads
    # the same either way (a recheck once rewrote committed tables for this alone).
    res.config["seeds"] = (0, 1, 2)
    assert markdown_tables(res) == table


def test_sc_against_the_best_baseline_is_paired_over_seeds():
    def rows(sc, base, cc):
        out = []
        for m, vals in (("sc", sc), ("base", base), ("cc", cc)):
            out += [ResultRow(dataset="t", shots=4, method=m, seed=s, macro_f1=v, accuracy=v, ece=0.0)
                    for s, v in enumerate(vals)]
        return out

    # CC is the best baseline; SC beats it on every seed, by 0.05 to 0.06: a win, its
    # interval SciPy's t interval of the three per-seed differences.
    from scipy import stats

    (p,) = sc_against_best_baseline(rows([0.75, 0.66, 0.86], [0.5, 0.5, 0.5], [0.70, 0.60, 0.80]))
    assert p["best_baseline"] == "cc" and p["diff"] == pytest.approx((0.05 + 0.06 + 0.06) / 3)
    d = np.array([0.75, 0.66, 0.86]) - [0.70, 0.60, 0.80]
    want = stats.t.interval(0.95, 2, loc=d.mean(), scale=stats.sem(d))
    assert (p["ci_low"], p["ci_high"]) == pytest.approx(want, rel=1e-12) and p["ci_method"] == "t"
    assert p["outcome"] == "win"
    # Paired: large seed-to-seed spread shared by both methods does not hide a
    # consistent difference, but differences of both signs make a tie, and a
    # consistent deficit a loss.
    assert sc_against_best_baseline(rows([0.71, 0.59, 0.8], [0, 0, 0], [0.70, 0.60, 0.80]))[0][
        "outcome"] == "tie"
    assert sc_against_best_baseline(rows([0.6, 0.5, 0.7], [0, 0, 0], [0.70, 0.60, 0.80]))[0][
        "outcome"] == "loss"
    table = markdown_tables(RunResults(config={"model": "m", "seeds": [0, 1, 2], "test_size": 4,
                                               "mode": "first_token", "solver": "s"},
                                       rows=rows([0.6, 0.5, 0.7], [0, 0, 0], [0.70, 0.60, 0.80])))
    assert "| t | 4 | CC | -10.0 | [-10.0, -10.0] (t) | loss |" in table and "4-shot win / tie / loss over datasets: 0 / 0 / 1" in table
    assert table.startswith("# Results: m\n")  # a source that is not a named model: as given


def test_named_models_are_reported_under_their_own_names():
    from sc_jax.models.named_models import MODELS, display_name

    assert display_name("default") == "smollm2-135m" and "smollm2-135m" in MODELS
    assert display_name("qwen2.5-0.5b") == "qwen2.5-0.5b"
    assert display_name("models/my.gguf") == "models/my.gguf"
    table = markdown_tables(RunResults(config={"model": "default", "seeds": [0], "test_size": 4,
                                               "mode": "first_token", "solver": "s"},
                                       rows=_rows(_results()["rows"])))
    # A file made before results.json described its model: a named model's table entry.
    assert table.startswith("# Results: SmolLM2-135M-Instruct Q4_1 GGUF, dequantised to float32\n")


def test_tables_and_plots_name_the_model_results_json_describes():
    from sc_jax.experiment.reporting.figures import f1_bars_figure
    from sc_jax.experiment.reporting.report import latex_table

    res = _results()
    res["config"]["model"] = "qwen2.5-0.5b"
    res["model_description"] = {
        "name": "Qwen2.5-Coder-0.5B-Instruct", "variant": "Coder-Instruct", "quantisation": "Q4_K_M",
        "dtype": "bfloat16", "source": "6 PyPI wheels", "upstream": "Qwen/Qwen2.5-Coder-0.5B-Instruct",
        "licence": "Apache-2.0"}
    typed = _typed(res)
    label = "Qwen2.5-Coder-0.5B-Instruct Q4_K_M GGUF, dequantised to bfloat16"
    assert markdown_tables(typed).startswith(f"# Results: {label}\n")
    tex, escaped = latex_table(typed), label.replace("_", "\\_")
    assert f"\\caption{{{escaped}, 4-shot: macro-F1" in tex
    assert tex.startswith(f"% sc-jax report: {escaped},")
    assert f1_bars_figure(typed)._suptitle.get_text().startswith(f"{label}\nmacro-F1")


def test_write_report_from_dir(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps(_results()))
    paths = write_report(tmp_path)
    for name in ("table", "csv", "latex", "latex_accuracy", "latex_ece", "f1_bars", "sc_params"):
        assert paths[name].exists() and paths[name].stat().st_size > 0
    lines = paths["csv"].read_text().splitlines()
    assert lines[0] == "dataset,model,shots,method,seed,accuracy,macro_f1,ece,model_source"
    assert len(lines) == 1 + len(_results()["rows"])


def test_figures_and_tables_a_paper_can_use(tmp_path):
    """Per-dataset bars beside the average under the datasets' display names, a colour
    per method with SC marked and first in the legend, PDF and SVG beside PNG, booktabs
    LaTeX tables, and results.csv naming the model loaded rather than "default"."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from sc_jax.experiment.evaluation.results import METHOD_NAMES
    from sc_jax.experiment.reporting.figures import f1_bars_figure

    res = _results()
    res["config"]["model"] = "default"
    res["model_source"] = "/hub/smollm2-135m"
    for r in res["rows"]:
        r["model"] = "default"
    # Every method, the long names included, on every (dataset, k, seed).
    res["rows"] = [dict(r, method=m) for r in res["rows"] if r["method"] == "base"
                   for m in METHOD_NAMES]
    (tmp_path / "results.json").write_text(json.dumps(res))
    paths = write_report(tmp_path)
    for name in ("f1_bars", "sc_params"):
        for ext in ("pdf", "svg"):
            assert paths[f"{name}_{ext}"] == tmp_path / f"{name}.{ext}"
            assert paths[f"{name}_{ext}"].stat().st_size > 0
    assert (tmp_path / "f1_bars.pdf").read_bytes().startswith(b"%PDF")
    assert "<svg" in (tmp_path / "f1_bars.svg").read_text()
    fig = f1_bars_figure(_typed(res))
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible()]
    assert titles == ["Rotten Tomatoes", "SST-2", "Average over datasets"]
    FigureCanvasAgg(fig).draw()
    (legend,) = fig.legends
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels[0] == "SC (guard)" and sorted(labels) == sorted(METHOD_NAMES.values())
    bars = {c.get_label(): {(p.get_facecolor(), p.get_hatch()) for p in c.patches}
            for c in fig.axes[0].containers if hasattr(c, "patches")}  # method -> (colour, hatch) of its bars
    assert all(len(v) == 1 for v in bars.values())
    faces = {next(iter(v))[0] for v in bars.values()}
    assert len(faces) == len(METHOD_NAMES) == len(bars)  # one colour per method
    assert {h for _, h in bars["SC (guard)"]} == {"//"} and all(
        h is None for k, v in bars.items() if k != "SC (guard)" for _, h in v)
    tex = paths["latex"].read_text()
    assert "\\toprule" in tex and "\\midrule" in tex and "\\bottomrule" in tex
    assert "Method & Rotten Tomatoes & SST-2 & Average \\\\" in tex
    assert "SC (paper) & " in tex and "$\\pm$" in tex and "\\textbf{" in tex
    assert tex.count("\\begin{tabular}") == 2  # k = 4 and 8
    line = paths["csv"].read_text().splitlines()[1].split(",")
    assert line[1] == "smollm2-135m" and line[-1] == "/hub/smollm2-135m"


def test_without_matplotlib_the_report_is_written_without_plots(tmp_path, monkeypatch, caplog):
    # A machine without matplotlib (a bare GPU image) loses the plots, not the run.
    import sys

    from sc_jax.experiment.reporting.ablation_report import write_ablation

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises
    (tmp_path / "results.json").write_text(json.dumps(_results()))
    paths = write_report(tmp_path)
    assert sorted(paths) == ["csv", "latex", "latex_accuracy", "latex_ece", "table"]
    assert paths["table"].stat().st_size > 0
    rows = [dict(study="sc_n", dataset="d", shots=4, setting="SC-1", sizes=1, seed=0,
                 macro_f1=0.5, accuracy=0.6, ece=0.1)]
    assert sorted(write_ablation(rows, tmp_path / "ablation")) == ["csv", "table"]
    notes = [r.message for r in caplog.records if "matplotlib" in r.message]
    assert notes and all(n.endswith("(pip install matplotlib)") for n in notes)
    assert not list(tmp_path.rglob("*.png"))


def test_bad_results(tmp_path):
    with pytest.raises(FileNotFoundError, match="results.json"):
        load_results(tmp_path)
    (tmp_path / "results.json").write_text("{broken")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_results(tmp_path)
    (tmp_path / "results.json").write_text("{}")
    with pytest.raises(ValueError, match="not an sc_jax results file"):
        load_results(tmp_path)


def test_plots_leave_the_callers_matplotlib_alone(tmp_path):
    # A fresh process whose own backend is "svg": writing the report and the ablation
    # plots must neither switch it nor bring in pyplot's global figure registry.
    import subprocess
    import sys

    (tmp_path / "results.json").write_text(json.dumps(_results()))
    code = f"""
import sys, matplotlib
matplotlib.use("svg")
from sc_jax.experiment.reporting.report import write_report
from sc_jax.experiment.reporting.ablation_report import write_ablation
paths = write_report({str(tmp_path / "results.json")!r})
rows = [dict(study="sc_n", dataset="d", shots=4, setting=f"SC-{{n}}", sizes=n, seed=s,
             macro_f1=0.5 + 0.01 * n + 0.001 * s, accuracy=0.6, ece=0.1)
        for n in (1, 2) for s in (0, 1)]
files = write_ablation(rows, {str(tmp_path / "ablation")!r})
assert "sc_n_plot" in files, files
print(matplotlib.get_backend(), "matplotlib.pyplot" in sys.modules, sorted(paths))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[:2] == ["svg", "False"]
    assert (tmp_path / "f1_bars.png").stat().st_size > 0
    assert (tmp_path / "ablation" / "ablation_sc_n.png").stat().st_size > 0


def test_fits_that_did_not_converge_are_left_out_of_the_parameter_plot():
    # Every status but CONVERGED is treated alike: an UNBOUNDED fit (far out along a
    # ray) and one stopped by its iteration budget far out (not a minimum either) are
    # both left out and counted; a record without a status (older results) is a fit.
    from sc_jax.calibration.solvers import Status, is_converged
    from sc_jax.experiment.reporting.figures import params_figure

    assert [is_converged(s) for s in Status] == [s == Status.CONVERGED for s in Status]
    assert [is_converged(s.name) for s in Status] == [s == Status.CONVERGED for s in Status]
    assert is_converged(0) and not is_converged("STOPPED") and not is_converged(None)
    res = _results()
    res["config"]["model"] = "default"
    res["params"][0].update(status="UNBOUNDED", w=[3e8], b=[-1e9])  # far out along a ray
    res["params"][1].update(status="MAX_ITERATIONS", w=[-4e7], b=[2e8])
    res["params"][2].update(status="CONVERGED")
    fig = params_figure(_typed(res))
    ax = fig.axes[0]
    assert max(abs(x) for x in ax.get_xlim() + ax.get_ylim()) < 10
    assert ax.get_title() == "SST-2, 4-shot (2 fits not converged, not shown)"
    # The model, as it is: name, quantisation as stored, the dtype it ran in.
    assert fig._suptitle.get_text() == ("SC parameters\nSmolLM2-135M-Instruct Q4_1 GGUF, "
                                        "dequantised to float32")


def test_ablation_curves_have_integer_ticks_and_name_the_model():
    from sc_jax.experiment.reporting.ablation_report import curve_figure

    rows = [{"study": "sc_n", "dataset": "d", "shots": 4, "setting": f"SC-{n}", "sizes": n,
             "seed": s, "macro_f1": 0.5 + 0.01 * n + 0.001 * s, "accuracy": 0.6, "ece": 0.1}
            for n in (1, 2, 3) for s in (0, 1)]
    fig = curve_figure(rows, "sc_n", "sizes", "largest size N", model="default")
    ax = fig.axes[0]
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks
    assert ax.get_title().startswith("SmolLM2-135M-Instruct Q4_1: ")


def test_bc_reference_is_reported_beside_bc_but_never_the_best_baseline():
    rows = []
    for m, vals in (("sc", [0.70, 0.60, 0.80]), ("bc", [0.65, 0.55, 0.75]),
                    ("bc_reference", [0.90, 0.90, 0.90])):
        rows += [{"dataset": "t", "shots": 4, "method": m, "seed": s, "macro_f1": v,
                  "accuracy": v, "ece": 0.0} for s, v in enumerate(vals)]
    rows = _rows(rows)
    (p,) = sc_against_best_baseline(rows)
    assert p["best_baseline"] == "bc"  # the paper's BC, though BC (code) scores higher
    table = markdown_tables(RunResults(config={"model": "m", "seeds": [0, 1, 2], "test_size": 4,
                                               "mode": "first_token", "solver": "s"}, rows=rows))
    assert "| BC (code) | 90.0 ± 0.0 | 90.0 |" in table
    assert "## SC minus BC, as the paper defines it and as its code computes it" in table
    assert "| t | 4 | +5.0 |" in table and "| -20.0 |" in table


def _as_committed_before_added_methods(res: dict) -> dict:
    """A committed run's results.json as runs made before bc_reference, sc_star_free
    and sc_paper wrote it (a refitted run has them): their rows, params and methods removed."""
    from sc_jax.experiment.evaluation.store import ADDED_METHODS

    res["config"]["methods"] = [m for m in res["config"]["methods"] if m not in ADDED_METHODS]
    for key in ("rows", "params"):
        res[key] = [r for r in res[key] if r["method"] not in ADDED_METHODS]
    return res


def test_a_committed_run_without_bc_reference_still_reports(tmp_path):
    # Runs made before bc_reference existed: their results.json has no such rows and
    # no such method in its config; the report is written as before, without them.
    run = Path(__file__).resolve().parents[2] / "benchmarks/real_eval/qwen2.5-0.5b/k4"
    res = _typed(_as_committed_before_added_methods(load_results(run).to_json()))
    assert "bc_reference" not in res.config["methods"]
    paths = write_report(res, tmp_path)
    table = paths["table"].read_text()
    assert "| BC |" in table and "BC (code)" not in table
    assert "SC minus BC, as the paper" not in table


def _committed_subset(tmp_path, dataset="ag_news", seeds=(0,)):
    """A committed run (made before bc_reference, sc_star_free and sample logs),
    cut to one dataset and ``seeds`` so that refits stay quick: its results.json
    as committed but for the config's datasets and seeds, and those score files."""
    import shutil

    run = Path(__file__).resolve().parents[2] / "benchmarks/real_eval/qwen2.5-0.5b/k4"
    res = _as_committed_before_added_methods(json.loads((run / "results.json").read_text()))
    res["config"].update(datasets=[dataset], seeds=list(seeds))
    res["rows"] = [r for r in res["rows"] if r["dataset"] == dataset and r["seed"] in seeds]
    res["params"] = [p for p in res["params"] if p["dataset"] == dataset and p["seed"] in seeds]
    (tmp_path / "scores").mkdir()
    for s in seeds:
        name = f"{dataset}-k4-seed{s}.npz"
        shutil.copy(run / "scores" / name, tmp_path / "scores" / name)
    (tmp_path / "results.json").write_text(json.dumps(res))
    return tmp_path


def test_ablate_reads_a_committed_run_and_reports_both_bcs(tmp_path):
    from sc_jax.experiment.reporting import ablation
    from sc_jax.experiment.reporting.ablation_report import markdown

    run = _committed_subset(tmp_path)
    rows = ablation.ablate(run, lambda_invs=(None,), m_values=(1,))
    settings = {r["setting"] for r in rows if r["study"] == "lambda_trust"}
    assert {label for label, _ in ablation.BC_SETTINGS} <= settings
    # The paper's BC row reproduces the run's own BC result (same scores, same batches).
    bc = [r for r in rows if r["setting"] == ablation.BC_SETTINGS[0][0]]
    res = load_results(run)
    assert bc[0]["macro_f1"] == pytest.approx(next(r.macro_f1 for r in res.rows if r.method == "bc"))
    assert "BC (reference code" in markdown(rows)


def test_two_seeds_give_the_per_seed_differences_and_no_verdict():
    """Issue 64, case 5: with two seeds the table printed a "95% paired bootstrap
    interval" such as [+0.0, +0.0] and called SC's margin a loss or a tie. Now fewer
    than MIN_SEEDS_FOR_VERDICT seeds give the per-seed differences and no verdict, and
    the table says what ± is."""
    from sc_jax.experiment.reporting.report import MIN_SEEDS_FOR_VERDICT

    assert MIN_SEEDS_FOR_VERDICT == 3
    rows = []
    for m, vals in (("sc", [0.70, 0.60]), ("bc", [0.65, 0.62]), ("bc_reference", [0.5, 0.5])):
        rows += [{"dataset": "t", "shots": 4, "method": m, "seed": s, "macro_f1": v,
                  "accuracy": v, "ece": 0.0} for s, v in enumerate(vals)]
    rows = _rows(rows)
    (p,) = sc_against_best_baseline(rows)
    assert p["outcome"] is None and p["ci_low"] is None and p["diffs"] == pytest.approx([0.05, -0.02])
    table = markdown_tables(RunResults(config={"model": "m", "seeds": [0, 1], "test_size": 4,
                                               "mode": "first_token", "solver": "s"}, rows=rows))
    assert "| t | 4 | BC | +1.5 | per seed +5.0, -2.0 | none (2 seeds; needs 3) |" in table
    assert "4-shot win / tie / loss over datasets: 0 / 0 / 0 (1 without a verdict" in table
    assert "| t | 4 | +1.5 | per seed +5.0, -2.0 | +15.0 | per seed +20.0, +10.0 |" in table
    assert "[" not in table.split("## SC minus the best baseline")[1]  # no interval at all
    assert "mean ± s.d. (ddof=1) over the seeds" in table
    # One seed: its value alone, not "± 0.0".
    one = markdown_tables(RunResults(config={"model": "m", "seeds": [0], "test_size": 4,
                                             "mode": "first_token", "solver": "s"},
                                     rows=tuple(r for r in rows if r.seed == 0)))
    assert "| SC (guard) | 70.0 | 70.0 |" in one and "± 0.0" not in one


_REPORT_FILES = ("table.md", "results.csv", "results.tex", "results_accuracy.tex",
                 "results_ece.tex", "f1_bars.png", "f1_bars.pdf", "f1_bars.svg", "sc_params.png",
                 "sc_params.pdf", "sc_params.svg")
_RELIABILITY_FILES = ("reliability.png", "reliability.pdf", "reliability.svg")


def test_an_interrupted_report_leaves_the_earlier_files_as_they_were(tmp_path, monkeypatch):
    """Ctrl-C while the plots were drawn left new tables beside the old plots; now the
    files go in place together at the end, so all of them are still the old ones."""
    from sc_jax.experiment.reporting import report

    old = {name: f"old {name}".encode() for name in _REPORT_FILES}
    for name, data in old.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "results.json").write_text(json.dumps(_results()))

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "plot_f1_bars", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_report(tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name in old} == old
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*old, "results.json"])


def test_a_run_writes_the_same_files_and_tables(tmp_path, monkeypatch):
    """A run's outputs, put in place together: the same names as the report's plain
    pieces give (results.json, the tables, three formats of both figures, the records),
    the tables byte for byte what markdown_tables, write_csv and latex_table make, and
    an interrupt in the plots leaves the files of the run before as they were."""
    from sc_jax.experiment.execution.run import _write_outputs
    from sc_jax.experiment.reporting import report
    from sc_jax.experiment.reporting.samples import read_samples, seed_records
    from sc_jax.runtime.timing import Parts

    data = _typed(_results())
    probs = {"base": np.array([[0.6, 0.4], [0.3, 0.7]])}
    records = seed_records("sst2", 4, 0, [0, 1], probs)
    out = tmp_path / "run"
    out.mkdir()
    (out / "samples.jsonl.gz").write_bytes(b"an earlier run's records")  # replaced
    written, files = _write_outputs(out, data, records, True, Parts(),
                                    lambda: RunTiming(total_s=1.0), False)
    names = sorted([*_REPORT_FILES, *_RELIABILITY_FILES, "results.json", "samples.jsonl"])
    assert sorted(p.name for p in out.iterdir()) == names
    assert sorted(p.name for p in files.values()) == names
    assert sorted(files) == ["csv", "f1_bars", "f1_bars_pdf", "f1_bars_svg", "json", "latex",
                             "latex_accuracy", "latex_ece", "reliability", "reliability_pdf",
                             "reliability_svg", "samples", "sc_params", "sc_params_pdf",
                             "sc_params_svg", "table"]
    assert (json.loads((out / "results.json").read_text())
            == dict(_results(), timing=RunTiming(total_s=1.0).to_json()))
    assert written == data.replace(timing=RunTiming(total_s=1.0))
    logged = read_samples(out)
    assert logged == records
    assert (out / "table.md").read_text() == report.markdown_tables(data, logged)
    assert (out / "results.tex").read_text() == report.latex_table(data)
    assert (out / "results_ece.tex").read_text() == report.latex_table(data, "ece")
    report.write_csv(data, tmp_path / "plain.csv")
    assert (out / "results.csv").read_bytes() == (tmp_path / "plain.csv").read_bytes()

    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "plot_f1_bars", interrupted)
    data = data.replace(rows=(data.rows[0].replace(macro_f1=0.123), *data.rows[1:]))
    with pytest.raises(KeyboardInterrupt):
        _write_outputs(out, data, [], False, Parts(), RunTiming, False)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_an_interrupted_ablation_report_leaves_the_earlier_files(tmp_path, monkeypatch):
    """`ablate`'s files go in place together too: ablation.md and ablation.csv were
    rewritten before a Ctrl-C in the plots."""
    from sc_jax.experiment.reporting import ablation_report

    rows = [dict(study="sc_n", dataset="d", shots=4, setting="SC-1", sizes=1, seed=0,
                 macro_f1=0.5, accuracy=0.6, ece=0.1)]
    old = {"ablation.md": b"old table", "ablation.csv": b"old csv"}
    for name, data in old.items():
        (tmp_path / name).write_bytes(data)

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(ablation_report, "can_plot", lambda: True)
    monkeypatch.setattr(ablation_report, "_plot_curve", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ablation_report.write_ablation(rows, tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == old


def test_an_unlogged_run_cites_no_records_and_report_writes_the_same(tmp_path):
    """Without the records file (--no-log-samples), table.md names no records and no
    reliability diagram is drawn from records no file holds; `sc-jax report` on the
    folder then writes the same tables. With it, report redraws the diagram."""
    from sc_jax.experiment.execution.run import _write_outputs
    from sc_jax.experiment.reporting import report
    from sc_jax.experiment.reporting.samples import seed_records
    from sc_jax.runtime.timing import Parts

    data = _typed(_results())
    records = seed_records("sst2", 4, 0, [0, 1], {"base": np.array([[0.6, 0.4], [0.3, 0.7]])})
    out = tmp_path / "run"
    out.mkdir()
    _write_outputs(out, data, records, False, Parts(), lambda: RunTiming(total_s=1.0), False)
    table = (out / "table.md").read_text()
    assert "samples.jsonl" not in table and "Per-sample records" not in table
    assert not list(out.glob("reliability.*")) and not list(out.glob("samples.jsonl*"))
    report.write_report(out)
    assert (out / "table.md").read_text() == table
    # Logged: the table cites the file that is there, and report redraws the diagram.
    _write_outputs(out, data, records, True, Parts(), lambda: RunTiming(total_s=1.0), False)
    assert "records (samples.jsonl)" in (out / "table.md").read_text() and (out / "samples.jsonl").exists()
    (out / "reliability.png").write_bytes(b"stale")
    report.write_report(out)
    assert (out / "reliability.png").read_bytes().startswith(b"\x89PNG")


def test_two_seeds_give_the_spread_not_a_t_interval():
    from sc_jax.experiment.reporting.stats import seed_interval

    res = _results()
    res["rows"] = [r for r in res["rows"] if r["seed"] < 2]
    res["config"]["seeds"] = [0, 1]
    table = markdown_tables(_typed(res))
    assert "Macro-F1, 4-shot: 95% interval over seeds\n\nn/a (2 seeds): an interval over seeds needs at least 3" in table
    assert re.search(r"\[[-+]?\d+\.\d, [-+]?\d+\.\d\]", table) is None  # no interval anywhere
    assert seed_interval([0.5, 0.7]) is None and seed_interval([0.5, 0.7, 0.6]) is not None
    with pytest.raises(ValueError, match=r"^seed_interval: the values must be finite, got \[1.0, nan, 2.0\]$"):
        seed_interval([1, float("nan"), 2])
