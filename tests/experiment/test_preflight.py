"""The up-front check of a whole run (sc_jax.experiment.protocol.preflight.check_run), shared by
`sc-jax plan` and `sc-jax run`: every (task, k, seed) drawn as the run draws it, every
stage's longest prompt against the context window, class counts against k and option
ranges, all refused in one `error:` line before any weight is read or score written."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sc_jax import cli
from sc_jax.experiment.protocol.config import RunConfig
from sc_jax.experiment.protocol.jobs import draw_split
from sc_jax.experiment.tasks.loading import load_task
from sc_jax.models.config import preset

MODEL = "random:tiny-llama"  # byte tokenizer: about a token per character
WINDOW = preset("tiny-llama").max_position_embeddings
WORDS = ["a", "gorgeous", "witty", "moving", "film", "the", "plot", "is", "a", "mess", "and",
         "jokes", "never", "land", "dull"]
# Four tokens per " word": more than the context window on its own.
LONG = " ".join(["word"] * (WINDOW // 4 + 50))


@pytest.fixture(autouse=True)
def _no_weights(monkeypatch):
    # cli.main turns on its own compilation cache; an empty value keeps the session's.
    monkeypatch.setenv("SC_JAX_XLA_CACHE", "")
    # Every case here must fail before the weights are read.
    monkeypatch.setattr("sc_jax.models.loading.load_model",
                        lambda *a, **k: pytest.fail("the model was loaded before the check"))


def _write(path, texts, labels):
    path.write_text("".join(json.dumps({"text": t, "label": int(y)}) + "\n"
                            for t, y in zip(texts, labels)))
    return path


def _short(n, seed=0):
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, 5)) + f" {j}" for j in range(n)]


def _run(argv, capsys):
    rc = cli.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if line.startswith("error:")]
    return rc, errors, err


ARGS = ["--model", MODEL, "--shots", "4", "--seeds", "2", "--test-size", "8", "--quiet"]


def test_a_long_demonstration_of_seed_1_only_fails_plan_and_run_naming_seed_and_row(
        tmp_path, capsys):
    texts, labels = _short(40), np.arange(40) % 2
    path = _write(tmp_path / "rt.jsonl", texts, labels)
    config = RunConfig(model=MODEL, shots=(4,), seeds=(0, 1), test_size=8)
    ds = load_task("rotten_tomatoes", data_file=path)
    s0, s1 = (draw_split(ds, config, 4, seed) for seed in (0, 1))
    row = int(next(r for r in s1.demo_indices if r not in s0.demo_indices))
    texts[row] = LONG  # the text's length does not change the draw
    _write(path, texts, labels)
    for command in (["plan", "--no-xla"], ["run", "--out", str(tmp_path / "out")]):
        rc, errors, _ = _run(command + ["--data-file", str(path)] + ARGS, capsys)
        assert rc == 2 and len(errors) == 1, errors
        assert errors[0].startswith("error: rotten_tomatoes, k=4, seed 1: a ")
        assert f"demonstration {list(s1.demo_indices).index(row) + 1} (row {row + 1} of {path})" \
            in errors[0] and f"context window of {WINDOW}" in errors[0] and "fewer shots" in errors[0]
    assert not (tmp_path / "out" / "scores").exists()


def test_a_long_test_query_is_named_as_a_test_query(tmp_path, capsys):
    texts, labels = _short(40), np.arange(40) % 2
    path = _write(tmp_path / "rt.jsonl", texts, labels)
    config = RunConfig(model=MODEL, shots=(4,), seeds=(0, 1), test_size=8)
    row = int(draw_split(load_task("rotten_tomatoes", data_file=path), config, 4, 0).test_indices[3])
    texts[row] = LONG
    _write(path, texts, labels)
    rc, errors, _ = _run(["run", "--out", str(tmp_path / "out"), "--data-file", str(path)] + ARGS,
                         capsys)
    assert rc == 2 and len(errors) == 1
    assert f"its longest text is the test query (row {row + 1} of {path})" in errors[0]
    assert "seed 0" in errors[0] and "fewer shots" not in errors[0]


def test_every_text_long_is_a_context_window_error_in_plan_not_a_memory_error(tmp_path, capsys):
    path = _write(tmp_path / "rt.jsonl", [LONG + f" {j}" for j in range(40)], np.arange(40) % 2)
    rc, errors, _ = _run(["plan", "--data-file", str(path)] + ARGS, capsys)
    assert rc == 2 and len(errors) == 1 and f"context window of {WINDOW}" in errors[0]
    # Texts of a third of the window: each fits, four of them in one prompt do not.
    third = LONG[:WINDOW // 3]
    path = _write(tmp_path / "rt.jsonl", [third + f" {j}" for j in range(40)], np.arange(40) % 2)
    rc, errors, _ = _run(["plan", "--data-file", str(path)] + ARGS, capsys)
    assert rc == 2 and len(errors) == 1
    assert "no one text is to blame (its longest, the " in errors[0]
    assert errors[0].endswith("use fewer shots or shorter texts")


def test_more_classes_than_shots_everywhere_is_an_error_not_an_empty_table(tmp_path, capsys):
    path = _write(tmp_path / "trec.jsonl", _short(60), np.arange(60) % 6)
    for command in (["plan", "--no-xla"], ["run", "--out", str(tmp_path / "out")]):
        rc, errors, _ = _run(command + ["--dataset", "trec", "--data-file", str(path)] + ARGS, capsys)
        assert rc == 2 and len(errors) == 1
        assert errors[0].startswith("error: nothing to run: trec has 6 classes, more than k=4")


@pytest.mark.parametrize("option, message", [
    (["--m-cap", "0"], "m_cap (--m-cap) must be at least 1, got 0"),
    (["--max-size", "0"], "max_size (--max-size) must be at least 1, got 0"),
    (["--budget", "0"], "budget (--budget) must be at least 1, got 0"),
    (["--shots", "100"], "shots (--shots) must be in [2, 32]"),
])
def test_option_ranges(tmp_path, capsys, option, message):
    path = _write(tmp_path / "rt.jsonl", _short(40), np.arange(40) % 2)
    for command in (["plan", "--no-xla"], ["run", "--out", str(tmp_path / "out")]):
        rc, errors, _ = _run(command + ["--data-file", str(path)] + ARGS + option, capsys)
        assert rc == 2 and len(errors) == 1 and message in errors[0], errors


def test_a_context_that_cannot_fit_the_memory_budget_fails_before_the_weights_load(tmp_path, capsys):
    # random:llama-2-7b in bfloat16: 12.55 GiB of weights leave 0.17 GiB of a 14.2 GiB
    # budget after one call's share, less than one k = 8 context's KV cache. Before,
    # the run loaded the weights (13 GB) and failed in the engine.
    path = _write(tmp_path / "rt.jsonl", _short(40), np.arange(40) % 2)
    argv = ["run", "--out", str(tmp_path / "out"), "--data-file", str(path), "--model",
            "random:llama-2-7b", "--dtype", "bfloat16", "--device-memory", "14.2GiB", "--shots",
            "8", "--seeds", "1", "--test-size", "8", "--quiet"]
    rc, errors, _ = _run(argv, capsys)
    assert rc == 2 and len(errors) == 1
    assert errors[0].startswith("error: rotten_tomatoes, k=8, seed 0: one context of ")
    assert "only 0.172 GiB per device remain after the weights (12.55 GiB)" in errors[0]
    # The weights alone: one line naming no dataset.
    rc, errors, _ = _run([a if a != "14.2GiB" else "8GiB" for a in argv], capsys)
    assert rc == 2 and errors[0].startswith("error: the weights need 12.55 GiB per device")
