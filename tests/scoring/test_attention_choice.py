"""Choosing the packed attention by measurement (sc_jax.scoring.attention_choice) and the
engine's fallback when the chosen one fails in the whole program: candidates that fail to
compile, fail when they run, or disagree with the dense path are never chosen; the
decision is kept per device and call shape and read back instead of timed again; the
engine falls back on a failure at run time as well as at compile time and still scores
what the plain path scores (float32: <= 1e-4, the tolerance of tests/scoring/test_scoring.py).

The failing candidates are planted in the attention registry: "broken" raises
while tracing (a kernel that does not build), "fails_at_run" calls back into Python and
raises there (a kernel that builds and then fails, as cuDNN without execution plans
does), "wrong" returns twice the right answer.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sc_jax
from sc_jax.models import attention as attn
from sc_jax.scoring import attention_choice as ac
from sc_jax.scoring import engine as engine_mod
from sc_jax.scoring.enumeration import all_contexts, surrogate_pairs
from sc_jax.scoring.packing import PackShape
from sc_jax.scoring.prompts import Template, build_pieces

SHAPE = PackShape(B=2, W=64, cache=128, R=8, labels=8)
PLANTED = ("broken", "fails_at_run", "wrong")


def _raise(x):
    raise RuntimeError("no execution plan for this graph")


def planted(name):
    """A planted candidate: the dense path's inputs, and its output broken as ``name`` says."""
    dense = attn.REGISTRY["dense"]

    def attend(q, k, v, ck, cv, inputs, window):
        if name == "broken":
            raise ValueError("Mosaic GPU cannot lower this kernel")
        out = dense.attend(q, k, v, ck, cv, inputs, window)
        if name == "wrong":
            return out * 2
        spec = jax.ShapeDtypeStruct(out.shape, out.dtype)
        return out + jax.pure_callback(_raise, spec, out)
    return attn.Implementation(dense.inputs, attend)


@pytest.fixture
def plant(monkeypatch):
    for name in PLANTED:
        monkeypatch.setitem(attn.REGISTRY, name, planted(name))
    monkeypatch.setattr(attn, "IMPLEMENTATIONS", attn.IMPLEMENTATIONS + PLANTED)


@pytest.fixture(scope="module")
def config():
    return sc_jax.load_model("random:tiny-llama", seed=1).config


def test_trials_record_each_failure_and_agree_where_they_ran(config, plant):
    trials = {t.name: t for t in ac.time_attention(config, jnp.float32, SHAPE,
                                                   ("blocked", "dense") + PLANTED, repeats=2)}
    assert trials["dense"].ok and trials["dense"].max_diff == 0.0
    assert trials["blocked"].ok and trials["blocked"].max_diff <= 1e-5
    assert trials["blocked"].seconds > 0
    assert not trials["broken"].compiled and "cannot lower" in trials["broken"].error
    fails = trials["fails_at_run"]
    assert fails.compiled and not fails.ran and not fails.ok and fails.error
    wrong = trials["wrong"]
    assert wrong.ran and not wrong.ok and wrong.max_diff > 0.5
    assert json.loads(json.dumps(wrong.to_json()))["name"] == "wrong"


def test_layer_call_packs_items_after_their_slots(config):
    """The timed layer's input is a packed call: items continue the slot whose keys sit in
    the row's cache, in order along the row, and the end of each row is padding."""
    _, tokens = ac.layer_call(config, jnp.float32, SHAPE)
    g = {n: np.asarray(x) for n, x in tokens._asdict().items()}
    for r in range(SHAPE.B):
        real = g["q_valid"][r]
        assert real.sum() > SHAPE.W // 2 and not real[-1]
        assert np.all(np.diff(g["slot"][r][real]) >= 0)
        for j in np.unique(g["slot"][r][real]):
            prefix = g["c_valid"][r] & (g["c_slot"][r] == j)
            first = np.flatnonzero(real & (g["slot"][r] == j))[0]
            assert g["q_pos"][r, first] == prefix.sum()  # positions continue the prefix


def test_choice_is_the_fastest_good_trial_and_is_kept(config, plant, monkeypatch, tmp_path):
    monkeypatch.setattr(ac, "candidates", lambda platform, dtype, devices=1: PLANTED + ("blocked", "dense"))
    name, trials, cached = ac.choose_attention(config, jnp.float32, SHAPE, platform="gpu",
                                               cache_dir=str(tmp_path), repeats=2)
    good = sorted((t for t in trials if t.ok), key=lambda t: t.seconds)
    assert not cached and name == good[0].name and name in ("blocked", "dense")
    assert {t.name for t in trials if not t.ok} == set(PLANTED)
    kept = json.loads((tmp_path / ac.CHOICES_FILE).read_text())
    (key, record), = kept.items()
    assert record["chosen"] == name and "gpu|" in key and "W 64 cache 128" in key

    def no_timing(*a, **k):
        raise AssertionError("timed again")
    monkeypatch.setattr(ac, "time_attention", no_timing)
    again, trials2, cached = ac.choose_attention(config, jnp.float32, SHAPE, platform="gpu",
                                                 cache_dir=str(tmp_path))
    assert cached and again == name and trials2 == trials
    # Another call shape is another decision.
    with pytest.raises(AssertionError, match="timed again"):
        ac.choose_attention(config, jnp.float32, PackShape(4, 64, 128, 8, 8), platform="gpu",
                            cache_dir=str(tmp_path))


def test_a_kept_decision_is_checked_before_it_is_used(config, plant, tmp_path):
    """A decision file edited by hand or written by another version (a trial without
    its figures, a chosen name that did not pass) is timed again, not trusted."""
    name, trials, _ = ac.choose_attention(config, jnp.float32, SHAPE, platform="gpu",
                                          cache_dir=str(tmp_path), repeats=1)
    path = tmp_path / ac.CHOICES_FILE
    (key, record), = json.loads(path.read_text()).items()
    assert ac._from_record(record) == (name, trials)
    partial = dict(record, trials=[dict(t, tolerance=None) for t in record["trials"]])
    failed = dict(record, chosen="cudnn")
    for bad in (partial, failed, {"chosen": name}, [1, 2]):
        assert ac._from_record(bad) is None
    path.write_text(json.dumps({key: partial}))
    again, _, cached = ac.choose_attention(config, jnp.float32, SHAPE, platform="gpu",
                                           cache_dir=str(tmp_path), repeats=1)
    assert not cached and again in ac.candidates("gpu", jnp.float32)
    assert ac._from_record(json.loads(path.read_text())[key]) is not None  # written whole again
    assert not list(tmp_path.glob(".attention*.tmp"))


def test_cpu_keeps_blocked_without_timing(config, monkeypatch):
    monkeypatch.setattr(ac, "time_attention", lambda *a, **k: pytest.fail("timed on a CPU"))
    assert ac.choose_attention(config, jnp.float32, SHAPE, platform="cpu") == ("blocked", [], False)
    assert ac.fallbacks("dense", []) == [] and ac.fallbacks("cudnn", []) == ["blocked", "dense"]
    # A Pallas call has no rule to be split over a mesh: timed on one device only.
    assert "pallas" in ac.candidates("gpu", jnp.bfloat16)
    assert "pallas" not in ac.candidates("gpu", jnp.bfloat16, devices=2)


def test_tpu_times_the_mosaic_kernel_against_the_xla_paths(config, monkeypatch, tmp_path):
    """On a TPU (the platform named, not present) "auto" times the Pallas kernel, which
    is Mosaic there, beside the block-sparse and dense XLA paths, on one device only,
    and keeps the fastest; the timing itself is stubbed (the kernel runs on a TPU)."""
    timed = []

    def timing(config, dtype, shape, names, **kw):
        timed.append(names)
        return [ac.Trial(n, True, True, 1e-4 * (i + 1), 0.0, 3e-2) for i, n in enumerate(names)]
    monkeypatch.setattr(ac, "time_attention", timing)
    name, trials, cached = ac.choose_attention(config, jnp.bfloat16, SHAPE, platform="tpu",
                                               cache_dir=str(tmp_path))
    assert timed == [("pallas", "blocked", "dense")] and not cached
    assert name == "pallas" and [t.name for t in trials] == list(timed[0])
    (key,) = json.loads((tmp_path / ac.CHOICES_FILE).read_text())
    assert key.startswith("tpu|")
    assert ac.candidates("tpu", jnp.float32) == ("pallas", "blocked", "dense")
    assert ac.candidates("tpu", jnp.bfloat16, devices=4) == ("blocked", "dense")


def test_engine_falls_back_when_the_chosen_attention_fails_at_run_time(plant, monkeypatch):
    model = sc_jax.load_model("random:tiny-llama", seed=1)
    rng = np.random.default_rng(0)
    words = "good bad movie plot fine dull".split()
    texts = [" ".join(rng.choice(words, 4)) for _ in range(4)]
    pieces = build_pieces(model.tokenizer, Template("review:", "sentiment:", ("negative", "positive")),
                          [(t, i % 2) for i, t in enumerate(texts)], texts)
    ctx = all_contexts(4, 2)
    pairs = surrogate_pairs(ctx, 4)
    trials = [ac.Trial("fails_at_run", True, True, 1e-4, 0.0, 1e-4),
              ac.Trial("dense", True, True, 3e-4, 0.0, 1e-4)]
    monkeypatch.setattr(ac, "choose_attention", lambda *a, **k: ("fails_at_run", trials, False))
    eng = engine_mod.ScoringEngine(model, attention="auto", progress=False)
    with pytest.warns(RuntimeWarning, match="'fails_at_run' does not compile or run here.*using 'dense'"):
        result = eng.score_jobs(pieces, {"job": (ctx, pairs)})
    got, st = result.scores["job"], result.stats
    assert st.attention == "dense" and eng.attention == "auto"
    assert [t["name"] for t in st.attention_trials] == ["fails_at_run", "dense"]
    want = engine_mod.ScoringEngine(model, attention="blocked", progress=False).score(pieces, ctx, pairs)
    assert np.abs(got - want).max() <= 1e-4


def test_seed_line_names_the_attention_and_what_was_timed():
    from sc_jax.experiment.evaluation.results import SeedTiming
    from sc_jax.experiment.execution.run import _seed_line

    t = SeedTiming(dataset="d", shots=4, seed=0, wall_s=9.0, compile_s=2.0, programs=3,
                   model_programs=1, cache_hits=2, forward_s=5.0, host_s=2.0, calls=10,
                   tokens=5000, attention="pallas", attention_from_cache=False,
                   attention_trials=(ac.Trial("pallas", True, True, 4e-4, 0.01, 0.03).to_json(),
                                     ac.Trial("cudnn", True, error="XlaRuntimeError: no plan").to_json()))
    line = _seed_line(t)
    assert line.endswith("attention pallas (per layer: pallas 0.40 ms, cudnn failed)")
    assert "decision kept" in _seed_line(t.replace(attention_from_cache=True))
    assert "attention" not in _seed_line(t.replace(attention="", attention_trials=()))
