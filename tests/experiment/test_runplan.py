"""The run's plan (sc_jax.experiment.protocol.runplan) is built once: a run and a dry run draw
each seed's split, build its jobs and plan its schedule exactly once, and locate the
model (and read its tokenizer) once; the weights load from the plan's located source."""

from __future__ import annotations

import json
import logging
from collections import Counter

import numpy as np
import pytest

from sc_jax.experiment.execution import plan, roofline, run

from sc_jax.experiment.protocol import jobs
from sc_jax.experiment.protocol.config import RunConfig
from sc_jax.models import sources
from sc_jax.scoring import memory

MODEL = "random:tiny-llama"
SEEDS = (0, 1)


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    rng = np.random.default_rng(0)
    words = ["a", "fine", "dull", "film", "plot", "cast", "warm", "flat"]
    path = tmp_path_factory.mktemp("data") / "rt.jsonl"
    path.write_text("".join(json.dumps({"text": " ".join(rng.choice(words, 4)) + f" {j}",
                                        "label": j % 2}) + "\n" for j in range(40)))
    return path


def _config(data_file) -> RunConfig:
    return RunConfig(model=MODEL, data_files=(("rotten_tomatoes", str(data_file)),), shots=(4,),
                     seeds=SEEDS, test_size=6, methods=("base",), budget=8, m_cap=1,
                     dc_strings=2, max_size=1)


def _count(monkeypatch, where, name, counts: Counter):
    """Count the calls of ``where.name`` (a module-level function, called through its
    module by every caller), under ``name``."""
    real = getattr(where, name)

    def counted(*a, **k):
        counts[name] += 1
        return real(*a, **k)

    monkeypatch.setattr(where, name, counted)


@pytest.fixture
def counts(monkeypatch):
    c = Counter()
    # The bottom of each step, reached through its module whoever calls it: a split
    # (draw_split), a seed's jobs (seed_jobs tokenises its pieces), a schedule (the
    # memory policy's and the engine's), locating the model and reading its tokenizer.
    _count(monkeypatch, jobs, "split_protocol", c)
    _count(monkeypatch, jobs, "build_pieces", c)
    _count(monkeypatch, memory, "plan_schedule", c)
    _count(monkeypatch, sources, "_random_source", c)
    _count(monkeypatch, sources, "preset_vocabulary", c)
    return c


def test_a_run_builds_each_seed_once_and_locates_its_model_once(data_file, tmp_path, counts):
    results = run.run_experiment(_config(data_file), tmp_path / "out", progress=False)
    n = len(SEEDS)
    assert counts == Counter(split_protocol=n, build_pieces=n, plan_schedule=n,
                             _random_source=1, preset_vocabulary=1), counts
    assert {r.seed for r in results.rows} == set(SEEDS)


def test_a_dry_run_builds_each_seed_once(data_file, counts, monkeypatch):
    # The Qwen2 vocabulary, where this machine has it, tokenises the first seed again
    # to measure the stand-in: left out here.
    monkeypatch.setattr(plan, "_reference_tokenizer", lambda: (None, "left out"))
    p = plan.plan_run(_config(data_file), xla=False, compile_time=False, peak_flops=1e12,
                      bandwidth=1e11)
    n = len(SEEDS)
    assert counts == Counter(split_protocol=n, build_pieces=n, plan_schedule=n,
                             _random_source=1, preset_vocabulary=1), counts
    assert [s["k"] for s in p["settings"]] == [4] and p["settings"][0]["longest_prompt"] > 0


def test_the_plan_describes_itself_and_estimates_its_forward_passes(data_file, monkeypatch, caplog):
    # Here: the counts above run on any tree.
    from sc_jax.experiment.protocol.runplan import build_plan

    rp = build_plan(_config(data_file))
    assert [(w.dataset, w.k, w.seed) for w in rp.work] == [("rotten_tomatoes", 4, s) for s in SEEDS]
    text = str(rp)
    assert text.startswith(f"run plan: model {MODEL}") and "the longest prompt has" in text
    monkeypatch.setattr(roofline.os, "getloadavg", lambda: (0.1, 0.1, 0.1))
    seconds, line = roofline.forward_estimate(rp)
    assert 0 < seconds < 3600 and line.startswith("forward passes: about ")
    assert "hours on a CPU" not in line and "busy" not in line
    # Timed on a busy machine: the line says so, with the load it measured.
    cores = roofline.os.cpu_count()
    monkeypatch.setattr(roofline.os, "getloadavg", lambda: (3.0 * cores, 1.0, 1.0))
    assert f"busy (load average {3.0 * cores:.1f} on {cores} cores)" in roofline.forward_estimate(rp)[1]
    # A CPU a million times slower: the same line warns.
    slow = roofline.measured_matmul_flops(n=64, repeats=1) * 1e-6
    monkeypatch.setattr(roofline, "measured_matmul_flops", lambda *a, **k: slow)
    seconds, line = roofline.forward_estimate(rp)
    assert seconds > 3600 and "hours on a CPU" in line
    with caplog.at_level(logging.INFO, logger="sc_jax.experiment.execution.run"):
        monkeypatch.setattr(run.loading, "load_model", lambda *a, **k: "loaded")
        assert run._load_planned(rp, progress=True) == "loaded"
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "hours on a CPU" in warned[0].getMessage()
