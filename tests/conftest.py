"""Test-wide set-up: eight simulated CPU devices, so sharded paths are exercised
on any machine. This must run before JAX initialises its backends."""

import os
import tempfile


def _jaxlib_version() -> tuple:
    """(major, minor) of the installed jaxlib, read without importing JAX."""
    from importlib.metadata import version

    return tuple(int(p) for p in version("jaxlib").split(".")[:2])


def _xla_flags():
    """The suite's XLA flags for this jaxlib.

    The suite is dominated by compiling many small programs, each run a few times, so
    XLA's CPU code is optimised less than by default: LLVM level 0 (measured on the
    2-core CI machine, one file at a time with an empty compilation cache:
    calibration/test_jax_calibrate.py 87 -> 63 s, test_scoring.py + test_resume.py
    192 -> 149 s). HLO passes still run; only the machine-code optimisation is
    reduced, so every tolerance holds as at level 2."""
    if _jaxlib_version() >= (0, 11):
        return "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
    # jaxlib 0.10: XLA's classic CPU emitters, which the augmented Lagrangian's own
    # programs use there anyway (solvers.batching.COMPILER_OPTIONS), compile the
    # solvers faster than the MLIR fusion emitters (three compile-heavy solver tests on
    # a 2-core AMD EPYC: 90 s at level 0 with the default emitters, 73 s this way). Not
    # at level 0: the vmapped projected-gradient program compiled that way never
    # finished its loop; at level 1 it does.
    return ("--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=1 "
            "--xla_cpu_use_fusion_emitters=false")


os.environ.setdefault("XLA_FLAGS", _xla_flags())
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent XLA compilation cache for the whole run, read by JAX from these
# variables: the two xdist workers, and the subprocesses some tests start, compile
# many of the same programs (solvers per class count, the tiny models). Entries are
# keyed by the program, the JAX version and the flags, so a stale one is never used.
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"sc_jax_tests_xla_{os.getuid()}"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _no_exported_programs_after():
    """No test leaves solver programs served from ``jax.export`` files to the tests after
    it: ``cli.main`` turns them on with the compilation cache
    (``sc_jax.cli.process.enable_compilation_cache``), process-wide, and a later test
    that counts traces (``solvers.trace_counts``) would find files of earlier runs."""
    yield
    from sc_jax.calibration.solvers import exported  # noqa: PLC0415 - after JAX's set-up

    exported.set_export_dir(None)


@pytest.fixture(scope="module")
def no_persistent_cache_writes():
    """No persistent-cache writes on jaxlib 0.11 and later while a module runs.

    jaxlib 0.12.0.1 (Python 3.13, the newest leg) segfaults inside
    Executable.serialize, the persistent compilation cache's write, after programs are
    compiled again under another trace context (``jax.default_device`` entered on a CPU
    backend): tests/calibration/test_solvers.py aborted at its 61st test, deterministically, and
    passes whole with the writes off. The compiled programs and every result are the
    same either way; only these modules' cache entries are not written. jaxlib 0.10
    keeps its writes."""
    import jax

    if _jaxlib_version() < (0, 11):
        yield
        return
    old = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1e9)
    try:
        yield
    finally:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", old)


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


# Longest files first. With `--dist loadfile` each worker takes the next whole file;
# in alphabetical order the longest (test_solvers.py, several minutes) came last, so
# one worker ran it alone while the other sat idle. Longest-first keeps the two
# workers' loads even, and starts the model downloads of test_qwen2.py and
# test_gguf.py early, beside CPU-bound work. Order within a file is unchanged.
_LONGEST_FIRST = ("test_solvers.py", "test_solver_families.py", "test_qwen2.py", "test_gguf.py",
                  "test_multiprocess.py", "test_scoring.py", "test_model.py", "test_jax_calibrate.py", "test_examples.py",
                  "test_accelerator_suite.py", "test_resume.py", "test_experiment.py",
                  "test_numpy_fit.py", "test_plan.py")


# `pytest -m quick`: a few minutes of the suite for a change's first check (README,
# docs/development.md), every stage's cheaper files and the equalities everything rests
# on (the prefix-shared engine against the plain path, the calibrator's implicit
# derivatives against finite differences). CI runs the whole suite. Node-id prefixes
# under tests/.
_QUICK = ("test_imports.py", "test_quick.py", "runtime/test_timing.py::test_compile_meter",
          "runtime/test_timing.py::test_one_memory_policy", "runtime/test_timing.py::test_device_memory",
          "models/test_config_checks.py", "models/test_presets.py", "models/test_families.py",
          "models/test_attention.py",
          "scoring/test_enumeration.py", "scoring/test_cache.py", "scoring/test_engine_state.py",
          "scoring/test_scoring.py::test_engine_equals_plain[1-first_token]",
          "scoring/test_scoring.py::test_prompt_longer_than_context_window",
          "calibration/test_objective.py", "calibration/test_baselines.py",
          "calibration/test_numpy_predict.py",
          "calibration/test_jax_calibrate.py::test_grad_matches_finite_differences",
          "experiment/test_metrics.py", "experiment/test_report.py",
          "experiment/test_experiment.py", "experiment/test_preflight.py",
          "cli/test_refusals.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(_LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
    quick = tuple(f"tests/{q}" for q in _QUICK)
    for item in items:
        if item.nodeid.startswith(quick):
            item.add_marker(pytest.mark.quick)
