"""Where a run's time goes, and the compile paid once: the model program depends on
the model, dtype, memory budget and mesh, not on the seed or the dataset."""

import csv

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sc_jax import cli
from sc_jax.cli import parser
from sc_jax.experiment.execution.run import run_experiment
from sc_jax.experiment.protocol.config import RunConfig, run_policy
from sc_jax.scoring.memory import MemoryPolicy
from sc_jax.scoring.packing import ROW_SIZES
from sc_jax.scoring.programs import COMPILES
from sc_jax.runtime.timing import CompileMeter, Parts


def test_compile_meter_counts_compiles_not_cached_calls():
    @jax.jit
    def f(x):
        return jnp.sin(x) * 3.0 + x.sum()

    x = jnp.arange(7.0)
    with CompileMeter() as meter:
        f(x).block_until_ready()
        f(x).block_until_ready()  # the in-memory cache: no compile
    compiled, _ = meter.count("jit(f)")
    assert compiled + meter.hits["jit(f)"] == 1 and meter.seconds > 0
    y = x + 1  # an eager op compiles too: outside the meter
    with CompileMeter() as again:
        f(y).block_until_ready()
    assert again.count() == (0, 0) and again.seconds == 0.0
    parts = Parts()
    with parts("a"):
        pass
    with parts("a"):
        pass
    assert set(parts.seconds) == {"a"} and parts.seconds["a"] >= 0


@pytest.fixture
def long_csv(tmp_path):
    """A four-class dataset with longer texts than rt_csv's (another dataset)."""
    rng = np.random.default_rng(3)
    words = "the market rose fell sharply after results quarter profit loss shares".split()
    path = tmp_path / "fin.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        for j in range(60):
            w.writerow([" ".join(rng.choice(words, 9)), j % 4])
    return path


def test_run_timing_adds_up_and_later_runs_compile_no_model_program(rt_csv, long_csv, tmp_path):
    """results.json's timing: the parts add up to the wall time within 5%, each seed
    splits into compile, forward and host seconds. A second run with other seeds
    compiles no model program and no fit program; a run on another dataset (other lengths, four
    classes) at most one model program per call size (its items are longer than a CPU's row)."""
    cfg = dict(model="random:tiny-llama", data_files=(("rotten_tomatoes", str(rt_csv)),), shots=(4,),
               seeds=(0,), test_size=6, m_cap=2, budget=30, max_size=2)
    first = run_experiment(RunConfig(**cfg), tmp_path / "a", progress=False).data.timing
    for t in (first,):
        parts = t.load_s + t.scoring_s + t.fitting_s + t.metrics_s + t.report_s
        assert abs(t.total_s - parts) == pytest.approx(abs(t.unaccounted_s))
        assert abs(t.unaccounted_s) <= 0.05 * t.total_s, t
        seed = t.seeds[0]
        assert seed.forward_s > 0 and seed.calls > 0 and seed.seed == 0
        assert seed.compile_s + seed.forward_s + seed.host_s == pytest.approx(seed.wall_s)
        assert 0 <= seed.engine_host_s <= seed.host_s
        assert t.fit_compile_s + t.fit_solve_s == pytest.approx(t.fits[0].wall_s)
        assert t.scoring_s == pytest.approx(sum(s.wall_s for s in t.seeds), rel=0.05)
    packed = COMPILES["packed"]
    second = run_experiment(RunConfig(**dict(cfg, seeds=(3, 4))), tmp_path / "b",
                            progress=False).data.timing
    assert COMPILES["packed"] == packed and second.model_programs == 0
    assert second.programs == 0  # nor any other of the engine's (pool, gathers, writes)
    assert [f.programs for f in second.fits] == [0]  # fit programs: row buckets seen
    assert [s.shape for s in second.seeds] == [first.seeds[0].shape] * 2
    other = run_experiment(RunConfig(**dict(cfg, datasets=("ag_news",),
                                            data_files=(("ag_news", str(long_csv)),),
                                            shots=(6,))), tmp_path / "c", progress=False).data.timing
    assert COMPILES["packed"] - packed <= ROW_SIZES and other.model_programs <= ROW_SIZES


def test_one_memory_policy_for_engine_check_and_plan():
    """The run's policy is resolved in one place: a given budget is enforced and
    planned as an accelerator's; none given on a CPU is the host's, not enforced."""
    run = RunConfig(model="random:tiny-llama", device_memory=3 * 2 ** 30, mesh_model=1)
    p = run_policy(run)
    assert p == MemoryPolicy.resolve(3 * 2 ** 30) and p.enforced and p.budget_bytes == 3 * 2 ** 30
    assert p.platform == "default"
    host = run_policy(RunConfig(model="random:tiny-llama"))
    assert not host.enforced and host.platform == "cpu" and host.budget_bytes > 2 ** 30


@pytest.mark.parametrize("text,gib", [("60", 60), ("80GiB", 80), ("24GB", 24), ("1.5", 1.5)])
def test_device_memory_bare_number_is_gib(text, gib):
    assert parser._bytes(text) == int(gib * 2 ** 30)
    assert parser._bytes("512MiB") == 512 * 2 ** 20 and parser._bytes("4096B") == 4096


def test_device_memory_help_says_gib(capsys):
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    assert "a bare number is GiB" in " ".join(capsys.readouterr().out.split())
