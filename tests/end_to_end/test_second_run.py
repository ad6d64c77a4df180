"""A second ``sc-jax run`` on the same machine with other seeds compiles nothing: every
program, the model's, the engine's gathers and writes and the fits' (served from their
``jax.export`` files), is read from the persistent caches the first run filled."""

import json
import os
import subprocess
import sys


def _run(tmp_path, data, seed, cache):
    out = tmp_path / f"seed{seed}"
    subprocess.run([sys.executable, "-m", "sc_jax.cli", "run", "--model", "random:tiny-llama",
                    "--shots", "4", "--seed-list", str(seed), "--test-size", "4",
                    "--max-size", "2", "--m-cap", "1",
                    # One fit program kind (SC's) and the model's programs with and
                    # without hidden states: each kind the cache must serve, once.
                    "--methods", "base,sc,hidden",
                    "--data-file", str(data), "--out", str(out), "--quiet"],
                   env={**os.environ, "SC_JAX_XLA_CACHE": str(cache)}, check=True,
                   capture_output=True, text=True, timeout=600)
    return json.loads((out / "results.json").read_text())["timing"]


def test_a_second_run_with_other_seeds_compiles_no_program(tmp_path):
    data = tmp_path / "films.jsonl"
    data.write_text("".join(json.dumps({"text": f"a {'fine' if j % 2 else 'dull'} film, "
                                                f"number {j}" + " long" * (j % 5),
                                        "label": j % 2}) + "\n" for j in range(40)))
    cache = tmp_path / "xla"
    first = _run(tmp_path, data, 0, cache)
    assert first["programs"] > 0 and sum(f["programs"] for f in first["fits"]) > 0
    assert list((cache / "sc_jax_exports").glob("*.jaxexport"))  # the fits, exported
    second = _run(tmp_path, data, 1, cache)
    # Scoring: every program a persistent-cache hit; the fits: the same.
    assert second["programs"] == 0 and second["cache_hits"] > 0, second
    assert [f["programs"] for f in second["fits"]] == [0] * len(second["fits"]), second["fits"]
    assert all(f["cache_hits"] > 0 for f in second["fits"])
