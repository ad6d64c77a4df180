"""benchmarks/gpu_check.py's runner with fake phases (no model, no jax in the children):
a child past its deadline is killed with its process group and recorded, a failing child
is recorded with its exit code, the next phase still runs, and the JSON holds every phase
after each one. The phases themselves run in tests/legs.sh's gpu-image leg (--smoke)."""

import importlib.util
import json
import sys
import time
from pathlib import Path

from sc_jax.experiment.evaluation.results import RunTiming

ROOT = Path(__file__).resolve().parents[2]


def _gpu_check():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_run_child_kills_the_group_at_the_deadline_and_reports_a_failure():
    gc = _gpu_check()
    sleeper = "import subprocess, time; subprocess.Popen(['sleep', '60']); time.sleep(60)"
    t = time.perf_counter()
    rec, _ = gc.bench_seed.run_child([sys.executable, "-c", sleeper], 0.5)
    assert rec["status"] == "timeout" and time.perf_counter() - t < 10, rec
    rec, out = gc.bench_seed.run_child(
        [sys.executable, "-c", "import sys; print('partial'); sys.exit('broken: 3')"], 30)
    assert rec["status"] == "failed" and rec["exit_code"] == 1, rec
    assert "broken: 3" in rec["stderr_tail"] and out == "partial\n"


def test_a_phase_past_its_deadline_is_recorded_and_the_next_runs(tmp_path, monkeypatch):
    gc = _gpu_check()
    monkeypatch.setattr(gc, "FLOOR", 0.2)
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    written = []

    def own_child(name, args, out, timeout, env):
        if name == "attention":  # share 0.25 of a 4 s budget: killed after 1 s
            return gc.bench_seed.run_child(sleeper, timeout)[0]
        return {"status": "ok", "seconds": 0.0, "machine": gc._results.machine("cpu")}

    def phase(name, seed, run_args, out, xla, timeout):
        written.append(json.loads((tmp_path / "g.json").read_text())["phases"])
        return {"status": "failed", "exit_code": 3, "stderr_tail": "x", "seconds": 0.0,
                "attention": "blocked"} if name == "cold" else {"status": "ok", "seconds": 0.0}

    summary = gc._summary  # the fakes' ok records hold none of the real ones' figures
    monkeypatch.setattr(gc, "_summary", lambda n, r: "" if r["status"] == "ok" else summary(n, r))
    monkeypatch.setattr(gc, "own_child", own_child)
    monkeypatch.setattr(gc.bench_seed, "phase", phase)
    monkeypatch.setattr(gc, "peer", lambda args, out, timeout, env, chosen: {
        "status": "skipped", "why": f"chose {chosen}"})
    assert gc.main(["--budget-s", "4", "--skip", "--out", str(tmp_path / "g.json")]) == 1
    assert [sorted(p) for p in written] == [["attention", "stack"], ["attention", "cold", "stack"]]
    data = json.loads((tmp_path / "g.json").read_text())
    p = data["phases"]
    assert [p[n]["status"] for n in gc.PHASES] == ["ok", "timeout", "failed", "ok", "ok", "skipped"]
    assert 0.9 < p["attention"]["seconds"] < 5 and p["attention"]["deadline_s"] == 1.0
    assert p["cold"]["exit_code"] == 3 and p["peer"]["why"] == "chose blocked"
    assert data["header"]["machine"] and "gpu_check.py" in data["header"]["command"]
    # By default the peer phase is left out, and the deadlines count only the phases that
    # run: the last one that runs may take the rest of the budget.
    assert gc.main(["--budget-s", "4", "--out", str(tmp_path / "g.json")]) == 1
    p = json.loads((tmp_path / "g.json").read_text())["phases"]
    assert p["peer"] == {"status": "skipped", "why": "left out (--skip)"}
    assert gc.deadline("grid", 100, 50, ("cold", "grid")) == 50
    assert gc.deadline("cold", 100, 30, ("cold", "grid")) == 30 - gc.FLOOR
    assert gc.deadline("cold", 100, 30) == 30 - 3 * gc.FLOOR  # second, grid and peer after it


def test_grid_records_and_a_grid_phase_killed_in_its_plan_keeps_them(tmp_path, monkeypatch):
    """The grid phase's records per dataset come from a run's timing (seconds = the seed's
    scoring and its fit; MFU = 2 x non-embedding parameters x unique tokens / forward s /
    peak); a grid child past its deadline after its run keeps the records it wrote."""
    gc = _gpu_check()
    timing = RunTiming.from_json({
        "seeds": [dict(dataset="a", shots=8, seed=0, wall_s=10.0, compile_s=3.0, forward_s=5.0,
                       host_s=2.0, programs=4, model_programs=1, cache_hits=2, calls=7, tokens=1000,
                       executed_tokens=1200, attention="pallas")],
        "fits": [dict(dataset="a", shots=8, seeds=[0], wall_s=1.5, compile_s=1.0, solve_s=0.5,
                      programs=3)]})
    (r,) = gc.grid_records(timing, nonembed=50, peak=1e5)
    assert r["seconds"] == 11.5 and r["mfu"] == 2 * 50 * 1000 / 5.0 / 1e5
    assert (r["programs"], r["model_programs"], r["fit_programs"]) == (4, 1, 3)

    def run_child(cmd, timeout, env):  # a child that wrote its records, then was killed
        out = Path(cmd[cmd.index("--child-out") + 1])
        out.write_text(json.dumps({"datasets": [1], "unfinished": "the plan"}))
        return {"status": "timeout", "seconds": timeout, "deadline_s": timeout}, ""

    monkeypatch.setattr(gc.bench_seed, "run_child", run_child)
    args = gc.argparse.Namespace(smoke=True, data_dir="x")
    rec = gc.own_child("grid", args, tmp_path / "grid.json", 0.5, {})
    assert rec["status"] == "timeout" and rec["datasets"] == [1] and rec["unfinished"] == "the plan"


def test_benchmarks_never_replace_a_users_file(tmp_path, capsys):
    """Every benchmark's --out is checked by argparse, before any work: a directory, or an
    existing file that no benchmark wrote (no result header), is refused; a result of
    ours is replaced as a rerun does."""
    import pytest

    gc = _gpu_check()
    mine = tmp_path / "notes.json"
    mine.write_text('{"my": "notes"}\n')
    ours = tmp_path / "old.json"
    ours.write_text(json.dumps({"header": {"commit": "abc", "command": "x"}, "phases": {}}))
    for bad, match in [(mine, "no benchmark wrote it"), (tmp_path, "is a directory")]:
        t = time.perf_counter()
        with pytest.raises(SystemExit) as e:
            gc.main(["--out", str(bad)])
        assert e.value.code == 2 and time.perf_counter() - t < 1
        assert match in capsys.readouterr().err
    assert mine.read_text() == '{"my": "notes"}\n'
    assert gc._results.result_file(str(ours)) == str(ours)
    assert gc._results.result_file(str(tmp_path / "new.json")) == str(tmp_path / "new.json")
    # A JSON-lines result (sweep_solver's) is ours by its header line.
    lines = tmp_path / "sweep.jsonl"
    lines.write_text(json.dumps({"header": {"commit": "abc"}}) + "\n{\"n\": 2}\n")
    assert gc._results.result_file(str(lines)) == str(lines)
