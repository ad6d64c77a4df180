"""A calibration method is one file: a toy method registered from this test file alone
(the demonstrations' label prior, known to be right here by construction) runs through
`sc-jax run`, `report` and `ablate` with no other file changed."""

import json

import numpy as np
import pytest

from sc_jax import cli
from sc_jax.calibration import methods as registry
from sc_jax.experiment.evaluation.results import load_results
from sc_jax.experiment.protocol.config import RunConfig
from sc_jax.experiment.reporting.samples import read_samples


def prior_predict(s, fits, sizes, options):
    """The demonstrations' label frequencies (add-one smoothed), the same for every
    test query: a method that reads nothing but the k-shot prompt's labels."""
    n = s.base.shape[-1]
    counts = np.bincount(np.asarray(s.demo_labels), minlength=n) + 1.0
    return np.tile(counts / counts.sum(), (len(s.base), 1))


@pytest.fixture
def label_prior():
    method = registry.register(registry.Method("label_prior", "Label prior", "#123456", prior_predict,
                                               needs={"k_shot"}, added=True))
    yield method
    registry.unregister("label_prior")


def test_a_method_registered_from_a_test_file_runs_end_to_end(label_prior, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SC_JAX_XLA_CACHE", "")  # keep the session's JAX configuration (cli.main)
    data = tmp_path / "rt.jsonl"
    data.write_text("".join(json.dumps({"text": f"a fine film number {j}", "label": j % 2}) + "\n"
                            for j in range(30)))
    out = tmp_path / "run"
    argv = ["run", "--out", str(out), "--data-file", str(data), "--model", "random:tiny-llama", "--shots", "4",
            "--seeds", "1", "--test-size", "6", "--max-size", "1", "--m-cap", "2", "--quiet",
            "--methods", "base,sc,label_prior"]
    assert cli.main(argv) == 0
    res = load_results(out)
    (row,) = [r for r in res.rows if r.method == "label_prior"]
    # Every query gets the demonstrations' majority class (the first on a tie).
    from sc_jax.experiment.evaluation.store import load_scores

    (path,) = (out / "scores").glob("*.npz")
    s = load_scores(path)
    majority = int(np.argmax(np.bincount(s.demo_labels, minlength=2)))
    assert row.accuracy == pytest.approx(float(np.mean(s.y_test == majority)), abs=1e-12)
    # Its records, from the registry's predict, and its name in the tables.
    recs = read_samples(out)
    assert all(len(r["probs"]["label_prior"]) == 2 for r in recs)
    table = (out / "table.md").read_text()
    assert "| Label prior |" in table
    capsys.readouterr()
    assert cli.main(["report", str(out), "--log-samples"]) == 0
    assert "| Label prior |" in (out / "table.md").read_text()
    assert cli.main(["ablate", str(out), "--lambda-inv", "run", "--m-values", "1", "--quiet"]) == 0
    assert (out / "ablation" / "ablation.md").exists()
    # Unregistered, the name is unknown again: one line naming the registered methods.
    registry.unregister("label_prior")
    with pytest.raises(ValueError, match=r"^methods \(--methods\) must be one of base, .*got 'label_prior'$"):
        RunConfig(methods=("label_prior",))
    with pytest.raises(ValueError, match=r"results.json is not an sc_jax results file: rows\[2\] has an unknown "
                                         r"method 'label_prior'"):
        load_results(out)
    registry.register(label_prior)


def test_a_method_declares_what_it_is():
    with pytest.raises(ValueError, match="unknown needs \\['weights'\\]"):
        registry.Method("x", "X", "#000000", prior_predict, needs={"weights"})
    with pytest.raises(ValueError, match="sc_fit and the need 'sc_fit' go together"):
        registry.Method("x", "X", "#000000", prior_predict, needs={"k_shot", "sc_fit"})
    with pytest.raises(ValueError, match="method 'base' is registered already"):
        registry.register(registry.get("base"))
    # Each built-in method is a module of its own, registered in the tables' order.
    assert registry.names() == ("base", "cc", "dc", "bc", "bc_reference", "sc_star", "sc_star_free", "sc",
                                "sc_paper", "looc", "linc", "surprise", "hidden", "moicl")


def test_the_docs_show_the_registry():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "methods.md").read_text()
    assert registry.markdown_table() in page



def test_a_run_scores_only_what_its_methods_need(tmp_path, monkeypatch):
    """`--methods base,bc` scores the k-shot prompts alone: no surrogate or test-time
    job (at this size 87 prompts instead of 1,939). (Such runs end to end: the test of
    results.json's task record runs one.)"""
    from sc_jax.experiment.protocol.runplan import build_plan

    monkeypatch.setenv("SC_JAX_XLA_CACHE", "")
    data = tmp_path / "rt.jsonl"
    data.write_text("".join(json.dumps({"text": f"a fine film number {j}", "label": j % 2}) + "\n"
                            for j in range(200)))

    def jobs(methods):
        config = RunConfig(model="random:tiny-llama", shots=(4,), seeds=(0,), test_size=64, methods=methods,
                           data_files=(("rotten_tomatoes", str(data)),))
        return build_plan(config).work[0].jobs.jobs

    assert sorted(jobs(("base", "bc"))) == ["base", "cc", "dc"]
    assert sum(len(p) for _, p in jobs(("base", "bc")).values()) == 64 + 3 + 20
    assert {"surrogate1", "test3"} <= set(jobs(("base", "sc")))
    assert {"surrogate1", "test1"} <= set(jobs(("base", "hidden")))


def test_no_module_branches_on_a_method_name():
    """Outside the methods' own modules (sc_jax/calibration/methods/), no comparison in
    sc_jax is against a registered method's name (``m == "sc"``, ``m in ("bc", ...)``):
    what sets a method apart is read from the registry (its needs, its SC fit, its
    role: ``subject``, ``paired``, ``paper_baseline``)."""
    import ast
    from pathlib import Path

    import sc_jax

    names = set(registry.names())
    root = Path(sc_jax.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        if "methods" in path.relative_to(root).parts[:2] and path.parent.name == "methods":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Compare):
                continue
            for side in [node.left, *node.comparators]:
                consts = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                hits = [c.value for c in consts if isinstance(c, ast.Constant) and c.value in names]
                if hits:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {hits}")
    assert not found, found
    # The roles the stages read instead.
    assert registry.subject() == "sc" and registry.paired() == ("bc", "bc_reference")
    assert registry.paper_baselines() == ("base", "cc", "dc", "bc")


def test_a_second_subject_is_refused():
    with pytest.raises(ValueError, match="subject method already"):
        registry.register(registry.Method("other_sc", "Other", "#000000", prior_predict, subject=True))
    assert "other_sc" not in registry.names()
