"""An interrupted run (SIGKILL mid-scoring) resumes from its score cache and gives
results identical to an uninterrupted run; an end-to-end run on a small random model."""

import csv
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from sc_jax.experiment.evaluation.results import load_results
from sc_jax.experiment.execution.run import run_experiment
from sc_jax.experiment.protocol.config import RunConfig

SCRIPT = """
import sys
from sc_jax.experiment.protocol.config import RunConfig
from sc_jax.experiment.execution.run import run_experiment
cfg = RunConfig(**{cfg!r})
run_experiment(cfg, sys.argv[1], progress=False)
"""


@pytest.fixture(scope="module")
def config(rt_csv):
    path = rt_csv
    return dict(model="random:tiny-llama", data_files=(("rotten_tomatoes", str(path)),), shots=(4,),
                seeds=(0, 1), test_size=6, m_cap=2, budget=30, max_size=2)


def _entries(out):
    # Complete entries only: a write in progress is a hidden ".tmp-*" file.
    return [p for p in (out / "cache").rglob("*.npz") if not p.name.startswith(".tmp-")]


def _numbers(res):
    return [(r.seed, r.method, r.accuracy, r.macro_f1, r.ece) for r in res.rows]


def _same_numbers(got, want):
    """The rows of two runs agree: the same seeds and methods, the metrics to 1e-6. A
    resumed seed scores only the jobs the killed run left, packed into other rows of
    the engine's calls, so its float32 label scores may round differently (~1e-7)."""
    got, want = _numbers(got), _numbers(want)
    assert [r[:2] for r in got] == [r[:2] for r in want]
    assert np.allclose([r[2:] for r in got], [r[2:] for r in want], rtol=0, atol=1e-6)


def test_killed_run_resumes_identically(config, tmp_path, monkeypatch, capsys):
    reference = run_experiment(RunConfig(**config), tmp_path / "ref", progress=False)
    assert reference.data.cache.misses > 0 and reference.data.cache.hits == 0
    # The records are written by default, and the reliability diagram and the tables'
    # per-query tests are drawn from that file.
    for name in ("table", "csv", "f1_bars", "sc_params", "reliability", "json", "samples"):
        assert reference.files[name].exists()

    out = tmp_path / "killed"
    env = dict(os.environ)
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT.format(cfg=config), str(out)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline and len(_entries(out)) < 3:
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = len(_entries(out))
    assert not (out / "results.json").exists(), "the run finished before it could be killed"
    assert done >= 3

    resumed = run_experiment(RunConfig(**config), out, progress=False)
    assert resumed.data.cache.hits >= done  # nothing already scored is recomputed
    _same_numbers(resumed.data, reference.data)
    saved = load_results(out)
    _same_numbers(saved, reference.data)
    # The paper's protocol: one test set for both seeds, recorded with the demos.
    splits = saved.splits
    assert [s.seed for s in splits] == [0, 1] and splits[0].test_size == 6
    assert splits[0].test_hash == splits[1].test_hash
    assert splits[0].demo_indices != splits[1].demo_indices

    # Ablations refit from the saved scores: no model load, no forward pass.
    from sc_jax import cli
    from sc_jax.experiment.reporting import ablation
    from sc_jax.experiment.reporting.diagnostics import diagnose
    from sc_jax.models import loading
    from sc_jax.scoring import engine as scoring

    def refuse(*args, **kwargs):
        raise AssertionError("ablate loaded a model or ran a forward pass")

    monkeypatch.setattr(scoring.ScoringEngine, "score", refuse)
    monkeypatch.setattr(loading, "load_model", refuse)
    # m = 4 is above the 2 the run scored (m_cap 2): left out, with a warning.
    rows = ablation.ablate(out, lambda_invs=(0.0, None, "paper"), m_values=(1, 2, 4))
    assert {r["study"] for r in rows} == set(ablation.STUDIES)
    # The run's own settings reproduce its SC numbers in every study.
    sc = {r.seed: r.accuracy for r in reference.rows if r.method == "sc"}
    base = {r.seed: r.accuracy for r in reference.rows if r.method == "base"}
    star = {r.seed: r.accuracy for r in reference.rows if r.method == "sc_star"}
    free = {r.seed: r.accuracy for r in reference.rows if r.method == "sc_star_free"}
    paper = {r.seed: r.accuracy for r in reference.rows if r.method == "sc_paper"}
    assert set(free) == set(paper) == {0, 1}  # SC* both ways and the paper's SC by default
    fitted = [p for p in reference.data.params if p.method == "sc_paper"]
    assert fitted and not any(p.guarded for p in fitted)  # fitted with guard "none"
    run_lam = reference.data.lambda_inv
    for seed in (0, 1):
        mine = {r["setting"]: r["accuracy"] for r in rows if r["seed"] == seed}
        assert mine[f"lambda_inv={float(run_lam)}, trust region on"] == sc[seed]
        assert mine["SC-2"] == sc[seed] and mine["m=2"] == sc[seed]  # sizes 1..2, m_cap 2
        assert mine["uncalibrated"] == base[seed]
        # The run has the default guard: the guard study's guard row is its SC, its
        # last row SC*.
        assert reference.data.guard == "bias_only"
        assert mine["guard: SC* where below chance"] == sc[seed]
        assert mine["SC* at every size"] == star[seed]
        assert mine["SC* without trust region at every size"] == free[seed]
        # The run's sc_paper is the guard study's unguarded fit, refitted apart.
        assert mine["paper (no guard)"] == paper[seed]
        assert "m=4" not in mine and {"SC_1", "SC_2", "m=1"} <= set(mine)
    # lambda_inv "paper" is 10 P / N per problem: 4 queries x 3 contexts of size 1.
    assert ablation.paper_lambda_inv(np.repeat(np.arange(4), 3)) == 10.0 * 12 / 12
    # Diagnostics: k = 4 on a two-class task gives 2 + 2 demonstrations, so a
    # held-out row's class has 1 of the other 3 and a test query's 2 of the 4.
    diag = diagnose(out)
    assert len(diag) == 2 * 2  # seeds x sizes
    for r in diag:
        assert r["heldout_class_share"] == pytest.approx(1 / 3)
        assert r["test_class_share"] == pytest.approx(1 / 2)
        assert r["base_accuracy"] == base[r["seed"]]
        assert 0.0 <= r["surrogate_accuracy"] <= 1.0 and r["rows"] == {1: 12, 2: 24}[r["size"]]
    assert cli.main(["ablate", str(out), "--quiet", "--lambda-inv", "0", "run",
                     "--m-values", "1", "2"]) == 0
    assert "SC-N" in capsys.readouterr().out
    for name in ("ablation.md", "ablation.csv", "ablation_sc_n.png", "ablation_m.png",
                 "diagnostics.md", "diagnostics.csv"):
        assert (out / "ablation" / name).exists()


def test_skips_when_classes_exceed_shots(config, tmp_path, caplog):
    cfg = dict(config, shots=(2,), seeds=(0,))
    # 2 classes, k=2 runs; then a 3-class file with k=2 is skipped with a note.
    rng = np.random.default_rng(1)
    path = tmp_path / "fin.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        for j in range(60):
            w.writerow([" ".join(rng.choice(["up", "down", "flat"], 3)), j % 3])
    fin = (("financial_phrasebank", str(path)),)
    with caplog.at_level(logging.INFO, logger="sc_jax"):
        res = run_experiment(RunConfig(**dict(cfg, datasets=("rotten_tomatoes", "financial_phrasebank"),
                                              data_files=cfg["data_files"] + fin)),
                             tmp_path / "run", progress=True)
    # Progress a person can follow: the plan and its check, its forward passes' time,
    # then one line per stage, the fit, the report.
    lines = [r.getMessage() for r in caplog.records
             if r.name in ("sc_jax.experiment.execution.run", "sc_jax.experiment.protocol.jobs")]
    plan = lines[0].splitlines()
    assert plan[0].startswith("run plan: model random:tiny-llama (float32; ")
    assert plan[2].startswith("checked 1 (dataset, k) x 1 seeds: the longest prompt has ")
    assert "skipped: financial_phrasebank k=2 (3 classes > 2 demonstrations)" in plan
    assert lines[1].startswith("forward passes: about ") and "1 seed(s)" in lines[1]
    del lines[:2]
    assert lines[0].startswith("loading the model random:tiny-llama")
    seed0 = "[rotten_tomatoes k=2 seed=0]"
    assert lines[1] == f"{seed0} scoring (seed 1 of 1)"
    # One line per stage as it is scored (all of a seed's stages run in one engine
    # call; the smaller contexts finish first).
    stages = ["k-shot prompt (Base, BC): 6 prompts, scored (", "k-shot prompt of CC: 3 prompts, ",
              "k-shot prompt of DC: 20 prompts, ", "surrogate prompt of size 1: 2 prompts, ",
              "test-time prompt of size 1: 6 prompts, "]
    for stage in stages:
        assert sum(line.startswith(f"{seed0} {stage}") for line in lines[2:7]) == 1, (stage, lines)
    assert lines[2].startswith(f"{seed0} surrogate prompt of size 1")
    # Where the seed's time went, then the fits: SC, SC*, SC* without trust region and
    # the paper's SC, four fits of the one size; then the report and the run's time.
    assert lines[-5].startswith(f"{seed0} ") and "compile" in lines[-5] and "forward" in lines[-5]
    # Off a terminal (pytest's stderr), with the count of the run's seeds and the time left.
    assert re.search(r"; 1 of 1 seeds in \d\d:\d\d, about 00:00 left$", lines[-5]), lines[-5]
    assert lines[-4] == ("[rotten_tomatoes k=2] fitting SC / SC* (1 seeds x 1 sizes; a new problem "
                         "shape compiles first)")
    assert lines[-3].startswith("[rotten_tomatoes k=2] fitted 4 SC / SC* problems (1 seeds x 1 sizes)")
    assert lines[-2] == f"writing the tables and plots into {tmp_path / 'run'}"
    assert lines[-1].startswith("time: ") and "+ fitting " in lines[-1]
    assert {r.dataset for r in res.rows} == {"rotten_tomatoes"}
    assert any("3 classes > 2 demonstrations" in note for note in res.data.notes)
    # A run in which every (dataset, k) would be skipped is refused, not an empty table.
    with pytest.raises(ValueError, match="nothing to run: financial_phrasebank has 3 classes"):
        run_experiment(RunConfig(**dict(cfg, datasets=("financial_phrasebank",), data_files=fin)),
                       tmp_path / "none", progress=False)
    assert not (tmp_path / "none" / "results.json").exists()


def test_m_study_subsets_are_uniform_and_nested():
    """The m_i ablation keeps m of the m_i scored sub-contexts. Those are stored in
    lexicographic order, so the subset must be random: over many seeds every one of
    the 8 is kept about equally often (a first-m rule keeps indices 0 and 1 only)."""
    from sc_jax.experiment.reporting.ablation import context_subset

    counts = np.zeros(8)
    for seed in range(400):
        two = context_subset(8, 2, seed, size=2)
        assert len(set(two)) == 2 and set(two) <= set(context_subset(8, 4, seed, size=2))
        counts[two] += 1
    # Each index is kept with probability 1/4: 100 of 400 expected, binomial sd 8.7;
    # 55..145 is more than 5 sd either side.
    assert counts.min() > 55 and counts.max() < 145
    np.testing.assert_array_equal(context_subset(4, 8, 0, size=1), np.arange(4))


@pytest.fixture(scope="module")
def logged_run(config, tmp_path_factory):
    """A finished two-seed run with --log-samples: its RunConfig and Results."""
    cfg = RunConfig(**dict(config, shots=(3,)))
    return cfg, run_experiment(cfg, tmp_path_factory.mktemp("logged") / "run", progress=False,
                               log_samples=True)


def test_results_json_and_table_describe_the_model_loaded(logged_run):
    import json

    _, res = logged_run
    raw = json.loads((res.out_dir / "results.json").read_text())
    assert raw["model_description"] == {
        "name": "random:tiny-llama", "variant": "random weights", "quantisation": "none",
        "dtype": "float32", "source": "random weights of the preset 'tiny-llama'",
        "upstream": None, "licence": None}
    table = (res.out_dir / "table.md").read_text()
    assert table.startswith("# Results: random:tiny-llama (random weights), float32\n")


def test_log_samples_writes_records_that_reproduce_the_rows(config, logged_run):
    """`run --log-samples`: one record per (seed, test query), naming its data row and
    text, whose predictions and probabilities give back every row of results.json;
    regenerating them from the score files (no model) gives the same records."""
    import hashlib

    from sc_jax.experiment.tasks.loading import load_task

    from sc_jax.experiment.reporting import samples

    cfg, res = logged_run
    run = res.out_dir
    recs = samples.read_samples(run)
    assert res.files["samples"] == run / samples.SAMPLES_FILE
    assert len(recs) == len(cfg.seeds) * cfg.test_size
    assert samples.check_samples(recs, res.rows) == []
    assert set(recs[0]["probs"]) == set(cfg.methods) == set(recs[0]["pred"])
    assert set(recs[0]["sc_sizes"]) == {"sc", "sc_star", "sc_star_free", "sc_paper"}
    assert set(recs[0]["sc_sizes"]["sc"]) == {"1", "2"}
    ds = load_task("rotten_tomatoes", data_file=config["data_files"][0][1])
    for r in recs:
        text = ds.texts[r["row"]]
        assert r["text_sha256"] == hashlib.sha256(text.encode()).hexdigest()[:16]
        assert r["gold"] == ds.labels[r["row"]]
    # A wrong prediction in the log is caught.
    flipped = [dict(r, pred=dict(r["pred"], sc=1 - r["pred"]["sc"])) if r["index"] == 0 else r
               for r in recs]
    assert any("sc: accuracy" in p for p in samples.check_samples(flipped, res.rows))
    first = (run / samples.SAMPLES_FILE).read_bytes()
    samples.regenerate_samples(run)
    assert (run / samples.SAMPLES_FILE).read_bytes() == first


def _copy_run(res, tmp_path):
    """A copy of a finished run's folder (its cache left behind) to damage."""
    import shutil

    dst = tmp_path / "run"
    shutil.copytree(res.out_dir, dst, ignore=shutil.ignore_patterns("cache", ".lock"))
    return dst


def _errors(capsys):
    return [ln for ln in capsys.readouterr().err.splitlines() if not ln.startswith("sc_jax:")]


def _resave(path, src=None, **meta):
    """Rewrite score file ``path`` with the arrays of ``src`` (default: its own), its
    record of what it holds changed by ``meta``, or dropped (``drop=True``)."""
    with np.load(src or path) as z:
        arrays = {name: z[name] for name in z.files}
    record = json.loads(str(arrays.pop("meta")))
    if not meta.get("drop"):
        arrays["meta"] = np.asarray(json.dumps({**record, **meta}))
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def test_score_files_name_what_they_hold_and_a_renamed_one_is_refused(logged_run, tmp_path,
                                                                      capsys, monkeypatch):
    """`cp scores/T-k3-seed0.npz scores/T-k3-seed1.npz` made `ablate` count seed 0
    twice (exit 0) and `report --log-samples` only note the disagreement. Each score file
    records its dataset, k, seed, demonstration and test rows and the model, checked
    against results.json; a file written before these records is checked by its
    content (its Base, CC and DC rows) and refused when that does not match."""
    import shutil

    from sc_jax import cli
    from sc_jax.experiment.evaluation.store import scores_path
    from sc_jax.experiment.reporting import ablation

    monkeypatch.setenv("SC_JAX_XLA_CACHE", "")
    run = _copy_run(logged_run[1], tmp_path)
    seed0, seed1 = (scores_path(run, "rotten_tomatoes", 3, s) for s in (0, 1))
    shutil.copyfile(seed0, seed1)
    redo = ("rerun the `sc-jax run` command of results.json with the same --out to rewrite it "
            "from the score cache")
    for argv in (["ablate", str(run), "--quiet"], ["report", str(run), "--log-samples"]):
        assert cli.main(argv) == 2
        assert _errors(capsys) == [
            f"error: {seed1} holds the scores of rotten_tomatoes k=3 seed 0, not results.json's "
            f"rotten_tomatoes k=3 seed 1 (its seed: 0 here, 1 in results.json): {redo}"]
    original = scores_path(logged_run[1].out_dir, "rotten_tomatoes", 3, 1)
    with np.load(original) as z:
        record = json.loads(str(z["meta"]))
    splits = [s.to_json() for s in load_results(run).splits]
    assert record["seed"] == 1 and record["demo_indices"] == splits[1]["demo_indices"]
    assert len(record["test_indices"]) == 6
    assert record["model_identity"] == logged_run[1].data.model_identity
    # Another model's scores under the right names.
    _resave(seed1, seed0, seed=1, demo_indices=splits[1]["demo_indices"], model_identity="other")
    with pytest.raises(ValueError, match=r"seed1.npz holds the scores of rotten_tomatoes k=3 "
                                         r"seed 1, not .* \(its model: other here, "):
        ablation.ablate(run)
    # Files without a record: seed 1's own scores are taken (they give its rows back),
    # seed 0's under seed 1's name are refused.
    _resave(seed0, drop=True)
    _resave(seed1, original, drop=True)
    assert {r["seed"] for r in ablation.ablate(run, lambda_invs=(None,))} == {0, 1}
    shutil.copyfile(seed0, seed1)
    with pytest.raises(ValueError, match=r"seed1.npz does not record what it holds .* and its "
                                         r"base (accuracy|macro_f1|ece) "):
        ablation.ablate(run)


def test_an_empty_sample_log_is_refused_by_name(logged_run, tmp_path, capsys, monkeypatch):
    """An empty samples.jsonl was read as no log at all: `report` exited 0 without
    the records' check. It is refused by name, up front by a resumed run too."""
    from sc_jax import cli
    from sc_jax.experiment.reporting.samples import SAMPLES_FILE

    monkeypatch.setenv("SC_JAX_XLA_CACHE", "")
    run = _copy_run(logged_run[1], tmp_path)
    (run / SAMPLES_FILE).write_text("")
    assert cli.main(["report", str(run)]) == 2
    assert _errors(capsys) == [
        f"error: {run / SAMPLES_FILE} is empty (a sample log holds one record per test query): "
        "rewrite it with `sc-jax report DIR --log-samples`, or delete it"]
    with pytest.raises(ValueError, match="is empty"):  # before any model or score
        run_experiment(logged_run[0], run, progress=False, log_samples=False)
    assert cli.main(["report", str(run), "--log-samples"]) == 0  # rewritten from the scores
    assert (run / SAMPLES_FILE).stat().st_size > 0
