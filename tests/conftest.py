"""Test-wide set-up: eight simulated CPU devices, so sharded paths are exercised
on any machine. This must run before JAX initialises its backends."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")


import pytest  # noqa: E402


# Session fixtures shared by the GGUF and default-model tests: the default model is
# fetched and converted once, and transformers' GGUF model (slow to load) is built once.
@pytest.fixture(scope="session")
def default_dir():
    from sc_jax.default_model import default_model_dir

    return default_model_dir()


@pytest.fixture(scope="session")
def default_gguf(default_dir):
    from sc_jax.default_model import default_gguf_path

    return default_gguf_path()


@pytest.fixture(scope="session")
def hf_gguf_model(default_gguf):
    import importlib.util

    if importlib.util.find_spec("accelerate") is None:
        pytest.fail("transformers needs `accelerate` to load a GGUF model: "
                    "pip install accelerate (it is in the test extra)")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(default_gguf.parent), gguf_file=default_gguf.name, dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="session")
def rt_csv(tmp_path_factory):
    """A small synthetic Rotten-Tomatoes-format CSV (text,label): 60 three-word
    reviews, alternating labels."""
    import csv

    import numpy as np

    rng = np.random.default_rng(0)
    words = "good bad fine dull fun great poor".split()
    path = tmp_path_factory.mktemp("data") / "rt.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        for j in range(60):
            w.writerow([" ".join(rng.choice(words, 3)), j % 2])
    return path
