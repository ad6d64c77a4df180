"""Test-wide set-up: eight simulated CPU devices, so sharded paths are exercised
on any machine. This must run before JAX initialises its backends."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")


import pytest  # noqa: E402


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
