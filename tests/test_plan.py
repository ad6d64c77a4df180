"""The memory plan (sc_jax.plan) and `sc-jax plan`.

* The plan's schedule is the engine's: same forward calls, same unique tokens.
* An engine given a budget too small for one context fails before any compile.
* random:llama-2-7b in bfloat16 at k = 8 (abstract shapes, nothing allocated) with
  80 GiB and 24 GiB: the planned peak is within the budget, and XLA's own figure
  for the planned worst program (``memory_analysis()`` of the compiled program)
  is within the budget and agrees with the plan to within 10% plus one layer's
  weights in float32. That last term is a CPU artefact: XLA's CPU backend computes
  bfloat16 dots in float32, so its temporaries hold a float32 copy of the layer's
  weights and of the dot outputs, which a GPU does not.
"""

import json

import numpy as np
import pytest

import sc_jax
from sc_jax import cli, plan
from sc_jax.config import preset
from sc_jax.enumeration import all_contexts, surrogate_pairs
from sc_jax.experiment import RunConfig
from sc_jax.prompts import Template, build_pieces
from sc_jax.scoring import COMPILES, ScoringEngine

GIB = 2 ** 30
WORDS = "a gorgeous witty moving film the plot is a mess and jokes never land dull superb".split()


def _reviews(rng, n):
    # About 100 characters: the byte tokenizer of random presets makes ~100 tokens.
    return [" ".join(rng.choice(WORDS, 18)) for _ in range(n)]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(0)
    texts = _reviews(rng, 400)
    (d / "rotten_tomatoes.jsonl").write_text(
        "".join(json.dumps({"text": t, "label": i % 2}) + "\n" for i, t in enumerate(texts)))
    return d


def test_schedule_is_the_engines():
    model = sc_jax.load_model("random:tiny-llama", seed=1)
    rng = np.random.default_rng(0)
    k = 5
    short = [" ".join(rng.choice(WORDS, int(n))) for n in rng.integers(1, 6, k + 6)]
    demos = list(zip(short[:k], [0, 1, 0, 1, 2]))
    pieces = build_pieces(model.tokenizer, Template("review:", "sentiment:", ("neg", "pos", "mix")),
                          demos, short)
    # Several chunks (300 cached tokens hold few contexts) and several micro-batches.
    for i, tokens, cache in [(3, 512, 300)]:
        ctx = all_contexts(k, i)
        pairs = surrogate_pairs(ctx, k)
        eng = ScoringEngine(model, max_tokens_per_batch=tokens, max_cache_tokens=cache, progress=False)
        eng.score(pieces, ctx, pairs)
        e = plan.engine_calls(model.config, model.dtype, pieces, ctx, pairs, "first_token",
                              budget_bytes=GIB, n_devices=1, platform="cpu",
                              max_tokens_per_batch=tokens, max_cache_tokens=cache)
        assert sum(c.count for c in e["calls"]) == eng.stats.calls
        assert e["unique_tokens"] == eng.stats.tokens
        assert sum(1 for c in e["calls"] if c.kind == "score") > 1
        assert sum(c.count for c in e["calls"] if c.kind == "grow") > 3


def test_context_that_cannot_fit_fails_before_compiling():
    model = sc_jax.load_model("random:tiny-llama", seed=1)
    rng = np.random.default_rng(1)
    demos = list(zip(_reviews(rng, 4), [0, 1, 0, 1]))
    pieces = build_pieces(model.tokenizer, Template("review:", "sentiment:", ("neg", "pos")),
                          demos, [t for t, _ in demos])
    ctx = all_contexts(4, 3)
    before = dict(COMPILES)
    weights = plan.weight_bytes(model.config, model.dtype)
    eng = ScoringEngine(model, device_memory=int(weights * 1.2), progress=False)
    with pytest.raises(plan.PlanError, match="padded tokens needs"):
        eng.score(pieces, ctx, surrogate_pairs(ctx, 4))
    with pytest.raises(plan.PlanError, match="the weights need"):
        ScoringEngine(model, device_memory=weights // 2, progress=False).score(
            pieces, ctx, surrogate_pairs(ctx, 4))
    assert dict(COMPILES) == before


@pytest.mark.parametrize("budget_gib", [80, 24])
def test_llama_2_7b_bf16_k8_plan_fits_and_agrees_with_xla(data_dir, budget_gib):
    config = RunConfig(model="random:llama-2-7b", dtype="bfloat16", datasets=("rotten_tomatoes",),
                       data_dir=str(data_dir), shots=(8,), seeds=(0,), test_size=64, budget=None,
                       m_cap=24)
    budget = budget_gib * GIB
    p = plan.plan_run(config, device_memory=budget)
    s = p["settings"][0]
    assert s["peak_bytes"] <= budget
    assert s["xla_peak_bytes"] <= budget
    cfg = preset("llama-2-7b")
    per_layer = (cfg.num_params() - 2 * cfg.vocab_size * cfg.hidden_size) // cfg.num_layers
    margin = 0.10 * s["planned_peak_of_that_call"] + 4 * per_layer
    assert abs(s["xla_peak_bytes"] - s["planned_peak_of_that_call"]) <= margin, s
    # Full enumeration at k = 8: the trie computes far fewer tokens than flat prompts.
    assert s["pairs"] > 20160 and s["flat_tokens"] > 3 * s["unique_tokens"]


def test_cli_plan_writes_json(data_dir, tmp_path, capsys):
    out = tmp_path / "plan.json"
    rc = cli.main(["plan", "--model", "random:tiny-llama", "--dataset", "rotten_tomatoes",
                   "--data-dir", str(data_dir), "--shots", "4", "--seeds", "2", "--test-size", "16",
                   "--m-cap", "2", "--device-memory", "2GiB", "--json", str(out), "--quiet"])
    assert rc == 0
    p = json.loads(out.read_text())
    s = p["settings"][0]
    for key in ("pairs", "unique_tokens", "flat_tokens", "flops", "micro_batches", "compiles",
                "peak_bytes", "xla_peak_bytes", "seconds_per_seed"):
        assert s[key] > 0, key
    assert p["budget_bytes"] == 2 * GIB and p["seeds"] == 2
    assert "unique tokens" in capsys.readouterr().out


def test_cli_plan_too_small_is_one_line(data_dir, capsys):
    rc = cli.main(["plan", "--model", "random:llama-2-7b", "--dtype", "bfloat16", "--dataset",
                   "rotten_tomatoes", "--data-dir", str(data_dir), "--shots", "8", "--seeds", "1",
                   "--device-memory", "8GiB", "--no-xla", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: the weights need 12.55 GiB") and err.count("\n") == 1


def test_llama_2_70b_sharded_over_8_devices_plan_agrees_with_xla(data_dir):
    """The 70B preset, weights and KV heads split over a model axis of 8 simulated
    devices, 80 GiB each: planned and XLA's per-device peaks within the budget and
    within the same margin as above."""
    config = RunConfig(model="random:llama-2-70b", dtype="bfloat16", datasets=("rotten_tomatoes",),
                       data_dir=str(data_dir), shots=(8,), seeds=(0,), test_size=64, budget=None)
    budget = 80 * GIB
    p = plan.plan_run(config, device_memory=budget, n_devices=1, model_shards=8)
    s = p["settings"][0]
    cfg = preset("llama-2-70b")
    assert p["weight_bytes"] == cfg.num_params() * 2 // 8
    assert s["peak_bytes"] <= budget and s["xla_peak_bytes"] <= budget
    per_layer = (cfg.num_params() - 2 * cfg.vocab_size * cfg.hidden_size) // cfg.num_layers
    margin = 0.10 * s["planned_peak_of_that_call"] + 4 * per_layer // 8
    assert abs(s["xla_peak_bytes"] - s["planned_peak_of_that_call"]) <= margin, s


def test_plan_time_is_for_the_device_it_names(data_dir, tmp_path, capsys):
    """On a CPU the time estimate uses a matmul measured here, not an H100's peak
    (which promised a CPU run seconds where it took minutes); --accelerator names one."""
    argv = ["plan", "--model", "random:tiny-llama", "--dataset", "rotten_tomatoes", "--data-dir",
            str(data_dir), "--shots", "4", "--seeds", "1", "--test-size", "16", "--no-xla",
            "--quiet", "--json", str(tmp_path / "p.json")]
    assert cli.main(argv) == 0
    p = json.loads((tmp_path / "p.json").read_text())
    assert p["peak_source"] == "matmul measured on this cpu" and 1e8 < p["peak_flops"] < 1e14
    assert "(matmul measured on this cpu)" in capsys.readouterr().out.splitlines()[0]
    assert cli.main(argv + ["--accelerator", "h100"]) == 0
    p = json.loads((tmp_path / "p.json").read_text())
    assert p["peak_flops"] == 989e12 and p["peak_source"] == "H100 datasheet, dense bf16"
