"""Tables, CSV and plots rebuilt from a results dict (no model)."""

import json

import numpy as np
import pytest

from sc_jax.report import load_results, markdown_tables, summarize, write_report


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


def test_summary_and_table():
    res = _results()
    summ = summarize(res["rows"])
    vals = [r["macro_f1"] for r in res["rows"] if (r["dataset"], r["shots"], r["method"]) == ("sst2", 8, "sc")]
    mean, std, n = summ[("sst2", 8, "sc")]["macro_f1"]
    assert n == 3 and mean == pytest.approx(np.mean(vals)) and std == pytest.approx(np.std(vals))
    table = markdown_tables(res)
    assert "## Macro-F1, 4-shot" in table and "## Accuracy, 8-shot" in table
    assert f"{100 * mean:.1f} ± {100 * std:.1f}" in table
    assert "- a note" in table


def test_write_report_from_dir(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps(_results()))
    paths = write_report(tmp_path)
    for name in ("table", "csv", "f1_bars", "sc_params"):
        assert paths[name].exists() and paths[name].stat().st_size > 0
    lines = paths["csv"].read_text().splitlines()
    assert lines[0] == "dataset,model,shots,method,seed,accuracy,macro_f1,ece"
    assert len(lines) == 1 + len(_results()["rows"])


def test_bad_results(tmp_path):
    with pytest.raises(FileNotFoundError, match="results.json"):
        load_results(tmp_path)
    (tmp_path / "results.json").write_text("{broken")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_results(tmp_path)
    (tmp_path / "results.json").write_text("{}")
    with pytest.raises(ValueError, match="not an sc_jax results file"):
        load_results(tmp_path)
