"""Test-wide set-up: eight simulated CPU devices, so sharded paths are exercised
on any machine. This must run before JAX initialises its backends."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
