"""The benchmark scripts' own logic, without a model: the shared timer
(benchmarks/_timing.py), the paper comparison of benchmarks/real_eval/compare_paper.py and
the workbench table of benchmarks/real_eval/workbench_table.py.
The scripts that need a model are run by their own tests (test_accelerator_suite,
test_gpu_check) and by tests/legs.sh (``--smoke``)."""

import importlib.util
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _script(path: Path):
    """A benchmark script loaded as a module (benchmarks/ on sys.path for its helpers)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = sys.modules[path.stem] = importlib.util.module_from_spec(spec)  # dataclasses look it up
    spec.loader.exec_module(module)
    return module


def test_timer_median_of_repeats_and_first_run_apart():
    timing = _script(ROOT / "benchmarks" / "_timing.py")
    calls = []

    def slow_first():
        time.sleep(0.2 if not calls else 0.01)
        calls.append(len(calls))
        return len(calls)

    t = timing.first_and_timed(slow_first, 3)
    assert len(calls) == 4 and t.out == 4 and len(t.runs_s) == 3
    assert t.first_s >= 0.2 and t.median_s < 0.1 and t.compile_s == t.first_s - t.median_s
    t = timing.timed(lambda: 7, 0)  # at least one run
    assert t.out == 7 and len(t.runs_s) == 1 and t.first_s is None and t.compile_s is None
    seconds, out = timing.once(lambda: "x")
    assert out == "x" and seconds >= 0


def test_compare_paper_margin_intervals():
    """SC minus a baseline over seeds: SciPy's t interval of the per-seed differences
    (three seeds), per task and of the per-seed average over tasks; a constant
    difference gives the point; a task without the baseline gives none."""
    from scipy import stats

    compare = _script(ROOT / "benchmarks" / "real_eval" / "compare_paper.py")
    seeds = {"sc": {"a": {0: 60.0, 1: 70.0, 2: 80.0}, "b": {0: 50.0, 1: 50.0, 2: 50.0}},
             "bc": {"a": {0: 50.0, 1: 50.0, 2: 50.0}, "b": {0: 55.0, 1: 45.0, 2: 52.0}}}
    ci = compare.margin_intervals(seeds, "bc", ["a", "b"])

    def t_ci(d):
        return stats.t.interval(0.95, len(d) - 1, loc=np.mean(d), scale=stats.sem(d))

    for key, d in (("a", [10, 20, 30]), ("b", [-5, 5, -2]), ("avg", [2.5, 12.5, 14])):
        assert (ci[key].low, ci[key].high) == pytest.approx(t_ci(d), rel=1e-12), key
        assert ci[key].method == "t"
    assert compare.margin_intervals(seeds, "bc_reference", ["a"]) is None
    same = {"sc": {"a": {0: 61.0, 1: 61.0, 2: 61.0}}, "bc": {"a": {0: 60.0, 1: 60.0, 2: 60.0}}}
    avg = compare.margin_intervals(same, "bc", ["a"])["avg"]
    assert (avg.low, avg.high) == (pytest.approx(1.0),) * 2
    # Two seeds: no interval (a t interval with one degree of freedom spans the scale).
    two = {"sc": {"a": {0: 61.0, 1: 62.0}}, "bc": {"a": {0: 60.0, 1: 60.0}}}
    assert compare.margin_intervals(two, "bc", ["a"]) is None


def test_workbench_table_blocks_and_margins():
    """The workbench table on a committed run: one block per (model, k); each method's
    per-seed average over the tasks every method covers; SC's margin against BC is
    SciPy's t interval of the per-seed differences (three seeds); win / tie / loss
    counts the tasks."""
    from scipy import stats

    table = _script(ROOT / "benchmarks" / "real_eval" / "workbench_table.py")
    run = ROOT / "benchmarks" / "real_eval" / "smollm2-135m" / "k4"
    (b,) = table.blocks([run], "macro_f1")
    rows = table.load_results(run).rows
    f1 = {(r.method, r.dataset, r.seed): r.macro_f1 for r in rows}
    assert b["shots"] == [4] and len(b["tasks"]) == 7 and b["seeds"] == [0, 1, 2]
    for m in ("sc", "bc"):
        assert b["per_seed"][m] == pytest.approx(
            [np.mean([f1[m, t, s] for t in b["tasks"]]) for s in b["seeds"]], rel=1e-12)
    s = table.summarise(b, lower_is_better=False)
    d = np.subtract(b["per_seed"]["sc"], b["per_seed"]["bc"])
    iv = s["diff"]["bc"]["interval"]
    assert (iv["low"], iv["high"]) == pytest.approx(
        stats.t.interval(0.95, 2, loc=d.mean(), scale=stats.sem(d)), rel=1e-12)
    assert sum(len(v) for v in s["outcomes"]["bc"].values()) == 7
    assert set().union(*s["outcomes"]["bc"].values()) == set(b["tasks"])


def test_the_readme_workbench_table_is_the_committed_runs():
    """The README's workbench block is workbench_table.py's output on the committed
    runs (every run under benchmarks/real_eval/workbench/ with a results.json): a run
    added or a number changed without regenerating it fails here."""
    table = _script(ROOT / "benchmarks" / "real_eval" / "workbench_table.py")
    _, _, block = table.render(table.committed_runs(), ["macro_f1", "ece"])
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert table.replace_block(readme, block) == readme, (
        "README.md's workbench table is stale: python benchmarks/real_eval/workbench_table.py --committed "
        "--out benchmarks/real_eval/workbench/table.md --readme README.md")
