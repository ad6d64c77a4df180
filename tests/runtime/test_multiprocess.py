"""Several JAX processes on this machine (JAX's multi-controller runtime on CPU, gloo
collectives), started by ``python -m sc_jax.runtime.launch``: 2 processes x 4 simulated
devices against one process with 8.

* The engine and the flat path on meshes that span both processes give one
  process's label log-probs (float32, within 1e-4: the bound of the other engine
  tests; measured differences are about 1e-5 and below).
* ``sc-jax run`` launched once per process equals a one-process run on the same mesh
  (data 8) row for row, and only process 0 writes; ``sc-jax plan`` prints once.
* A process that cannot reach the coordinator stops with one line within
  SC_JAX_INIT_TIMEOUT; a killed process stops the other within
  SC_JAX_HEARTBEAT_TIMEOUT, and a rerun resumes from the score cache.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import multiprocess_worker as worker
from sc_jax.runtime.launch import free_port, process_env
from sc_jax.runtime.launch import main as launch_main

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

TOL = 1e-4
ROOT = Path(__file__).resolve().parents[2]
SC_JAX = [sys.executable, "-m", "sc_jax.cli"]


def _env():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env.pop("SC_JAX_COORDINATOR", None)
    return env


def _launch(command, timeout=420):
    """``command`` as 2 processes x 4 devices; (exit status, output)."""
    p = subprocess.run([sys.executable, "-m", "sc_jax.runtime.launch", "-n", "2", "--local-devices", "4",
                        "--timeout", str(timeout - 20), "--", *command],
                       env=_env(), capture_output=True, text=True, timeout=timeout, check=False)
    return p.returncode, p.stdout + p.stderr


def test_engine_across_processes_equals_one_process(tmp_path):
    import sc_jax

    rc, out = _launch([sys.executable, str(ROOT / "tests" / "runtime" / "multiprocess_worker.py"), str(tmp_path)])
    assert rc == 0, out[-3000:]
    one = sc_jax.load_model(worker.MODEL, seed=worker.SEED)  # one device, this process
    ref = {mode: worker.scores(one, mode)[0] for mode in ("first_token", "sequence")}
    got = [np.load(tmp_path / f"p{i}.npz") for i in (0, 1)]
    assert int(got[0]["devices"]) == 8
    for g in got:  # process 0's array, error and the minimum, in both processes
        assert g["from_writer"].dtype == np.float64 and np.array_equal(
            g["from_writer"], np.arange(6.0).reshape(2, 3) / 7)
        assert g["none"] and int(g["smallest"]) == 9 and str(g["error"]) == "only process 0 raised this"
    names = [n for n in got[0].files if n.startswith(("engine", "flat"))]
    assert len(names) == 8  # engine and flat on 3 meshes, both modes on 2 x 4
    for name in names:
        mode = "sequence" if name.endswith("sequence") else "first_token"
        assert np.array_equal(got[0][name], got[1][name]), name  # every process holds the result
        assert np.abs(got[0][name] - ref[mode]).max() <= TOL, name


# One seed and one calibrator (the solver's compiles are most of a tiny run's time).
RUN = ["run", "--model", "random:tiny-llama-8h", "--dataset", "rotten_tomatoes", "--shots", "4",
       "--seeds", "1", "--methods", "base,bc,sc", "--test-size", "8", "--m-cap", "2", "--budget", "30",
       "--max-size", "2", "--quiet"]


def _rows(path):
    res = json.loads((path / "results.json").read_text())
    return [(r["seed"], r["method"], r["accuracy"], r["macro_f1"], r["ece"]) for r in res["rows"]]


def _entries(out):
    return sorted(p.name for p in (out / "cache").rglob("*.npz") if not p.name.startswith(".tmp-"))


@pytest.fixture(scope="module")
def reference(rt_csv, tmp_path_factory):
    """The run in one process on a data mesh of 8 (what two processes of 4 devices
    build when no --mesh is given)."""
    from sc_jax.cli import main

    out = tmp_path_factory.mktemp("one") / "run"
    assert main(RUN + ["--data-file", str(rt_csv), "--mesh", "data=8", "--out", str(out)]) == 0
    return out


def test_plan_across_processes_prints_once(rt_csv):
    rc, text = _launch(SC_JAX + ["plan", *RUN[1:], "--data-file", str(rt_csv), "--no-xla",
                                 "--no-compile-time"])
    assert rc == 0, text[-3000:]
    assert "[p0]" in text and "[p1]" not in text.replace("[p1] sc_jax: process 1", "")


def test_unreachable_coordinator_is_one_line_within_the_timeout(rt_csv, tmp_path):
    env = process_env(1, 2, free_port(), 4, _env())  # process 1; no process 0 anywhere
    env["SC_JAX_INIT_TIMEOUT"] = "3"
    t = time.monotonic()
    p = subprocess.run(SC_JAX + RUN + ["--data-file", str(rt_csv), "--out", str(tmp_path / "x")],
                       env=env, capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == 2
    assert "cannot reach the coordinator at 127.0.0.1:" in p.stderr and "within 3 s" in p.stderr
    assert p.stderr.count("\n") <= 2 and "Traceback" not in p.stderr  # the join line and the error
    assert time.monotonic() - t < 60


def test_killed_process_stops_the_other_and_the_rerun_resumes(reference, rt_csv, tmp_path):
    """No launcher here (on separate hosts none would stop the survivor): process 1
    is killed once process 0 has cached a score; process 0 must stop by JAX's
    heartbeat. The rerun, launched as 2 processes, reuses every cached entry and
    equals the one-process reference row for row; process 0 alone writes and prints."""
    out, port = tmp_path / "run", free_port()
    cmd = SC_JAX + RUN + ["--data-file", str(rt_csv), "--out", str(out)]
    procs = []
    for pid in (0, 1):
        env = process_env(pid, 2, port, 4, _env())
        env["SC_JAX_HEARTBEAT_TIMEOUT"] = "5"
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    try:
        deadline = time.monotonic() + 240
        while not (out / "cache").exists() or not _entries(out):
            assert time.monotonic() < deadline and procs[0].poll() is None, procs[0].communicate()
            time.sleep(0.2)
        procs[1].kill()
        t = time.monotonic()
        _, err = procs[0].communicate(timeout=120)
        stopped = time.monotonic() - t
    finally:
        for p in procs:
            p.kill()
    assert procs[0].returncode != 0
    assert "distributed service detected fatal errors" in err or "heartbeat" in err, err[-2000:]
    print(f"process 0 stopped {stopped:.1f} s after process 1 was killed")
    assert stopped < 5 + 60  # the heartbeat timeout, then JAX's error polling
    kept = _entries(out)
    assert 0 < len(kept) < len(_entries(reference))
    # The rerun: every process launched again; the result is the one-process run's.
    rc, text = _launch(SC_JAX + RUN + ["--data-file", str(rt_csv), "--out", str(out)])
    assert rc == 0, text[-3000:]
    res = json.loads((out / "results.json").read_text())
    assert res["cache"]["hits"] >= len(kept)
    # The rerun scores only the jobs the killed run left, packed into other rows than
    # the reference's: float32 rounding of the label scores may differ (~1e-7), so the
    # metrics agree to that, not bitwise.
    got, want = _rows(out), _rows(reference)
    assert [r[:2] for r in got] == [r[:2] for r in want]
    assert np.allclose([r[2:] for r in got], [r[2:] for r in want], rtol=0, atol=1e-6)
    assert res["runtime"] == {"processes": 2, "devices": 8, "mesh": {"data": 8, "model": 1}}
    assert _entries(out) == _entries(reference)
    assert text.count("| SC (guard) |") >= 1 and "[p1] | SC (guard) |" not in text  # process 0 alone prints


def test_launch_settings_are_checked_before_jax_starts(monkeypatch):
    """Bad variables are one-line errors; a one-task SLURM step, or none, is one process."""
    from sc_jax.runtime.multihost import DistributedError, initialize_distributed

    for var in ("SC_JAX_COORDINATOR", "SLURM_STEP_NUM_TASKS", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    assert initialize_distributed() is False
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "1")
    assert initialize_distributed() is False
    monkeypatch.setenv("SC_JAX_COORDINATOR", "127.0.0.1:1234")
    monkeypatch.setenv("SC_JAX_NUM_PROCESSES", "1")
    monkeypatch.setenv("SC_JAX_PROCESS_ID", "0")
    assert initialize_distributed() is False  # a "group" of one
    for var, value, message in [("SC_JAX_PROCESS_ID", "2", r"must be in \[0, 1\)"),
                                ("SC_JAX_COORDINATOR", "localhost", "must be host:port"),
                                ("SC_JAX_INIT_TIMEOUT", "soon", "positive number of seconds")]:
        with monkeypatch.context() as m:
            m.setenv(var, value)
            with pytest.raises(DistributedError, match=message):
                initialize_distributed()
    with pytest.raises(SystemExit):
        launch_main(["-n", "2"])  # no command after --
