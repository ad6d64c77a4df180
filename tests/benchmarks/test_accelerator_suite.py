"""`benchmarks/accelerator_suite.py --smoke`: the GPU suite's code paths on CPU with a
tiny preset, so the suite cannot rot before a GPU runs it. Checks what the suite
itself checks (engine against batch 1 within 1e-4 in float32, solver gaps and
statuses) and that the JSON and tables are written. The suite's third section, one SC
seed as a fresh `sc-jax run` process (bench_seed's cold phase, which
tests/benchmarks/test_gpu_check.py and gpu_check's smoke also run), is skipped here:
tests/legs.sh's gpu-image leg runs the whole smoke suite and checks that section."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _suite():
    spec = importlib.util.spec_from_file_location("accelerator_suite",
                                                  ROOT / "benchmarks" / "accelerator_suite.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_smoke(tmp_path, capsys):
    suite = _suite()
    assert suite.main(["--smoke", "--skip", "end_to_end", "--out", str(tmp_path)]) == 0
    out = json.loads((tmp_path / "suite.json").read_text())
    s = out["scoring"]
    assert s["max_abs_diff_engine_vs_plain"] <= 1e-4
    assert s["prompts"] == 6 + 6  # k = 3: P(3,1) x 2 + P(3,2) x 1 surrogate pairs
    assert s["unique_tokens"] < s["prompt_tokens"] and 0 < s["engine_mfu"] < 1
    assert s["planned_peak_bytes"] > 0 and "unfinished" not in s
    for r in out["solvers"]:
        assert r["jax_not_converged"] == 0 and r["max_rel_gap"] <= 1e-4, r
    assert "end_to_end" not in out
    assert "batch-1/engine" in (tmp_path / "suite.md").read_text()
    assert "wrote" in capsys.readouterr().out


def test_interrupted_section_keeps_its_finished_phases(tmp_path, monkeypatch):
    # A lease can end inside a section: the phases it finished must be in the JSON.
    import sc_jax.scoring.reference

    suite = _suite()

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt("lease over")

    monkeypatch.setattr(sc_jax.scoring.reference, "score_plain", stopped)  # the last phase, batch 1
    with pytest.raises(KeyboardInterrupt):
        suite.main(["--smoke", "--skip", "solvers", "end_to_end", "--out", str(tmp_path)])
    s = json.loads((tmp_path / "suite.json").read_text())["scoring"]
    assert s["unfinished"] and s["c_s"] > 0 and s["b_s"] > 0 and s["unique_tokens"] > 0
    assert "a_s" not in s and "engine_mfu" not in s
