"""A run's configuration (:class:`RunConfig`, paper Section 4.1 and Appendix A): the
methods, datasets, shots, seeds, solver settings and memory knobs, checked when it is
built, and the memory policy it resolves to (:func:`run_policy`), the one object the
engine, the up-front check and ``sc-jax plan`` share.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from sc_jax.calibration.numpy_fit import GUARDS
from sc_jax.experiment.splits import DEFAULT_TEST_SEED
from sc_jax.scoring.memory import MemoryPolicy

# bc_reference: BC as the reference code computes it (sc_jax.calibration.baselines
# .batch_calibration_reference), reported beside the paper's BC ("bc"), which stays the
# baseline that SC is compared with.
# sc_star: SC* as fit_batch(sc_star=True) fits it, with the run's trust region (at
# tau = 0.997 and w = 1 it bounds |b| near 0.08); sc_star_free: the bias-only fit of the
# paper's description and the reference code, with no trust region (tau = -1).
# sc_paper: SC as the paper fits it (guard "none"), reported beside the run's SC so that
# a table shows what the guard changed; with --guard none the two are the same fits.
METHODS = ("base", "cc", "dc", "bc", "bc_reference", "sc_star", "sc_star_free", "sc",
           "sc_paper")


# Per SC method of METHODS: fit SC* (w = 1) or not, its tau and its guard (None: the run's).
SC_FITS = {"sc": (False, None, None), "sc_star": (True, None, None),
           "sc_star_free": (True, -1.0, None), "sc_paper": (False, None, "none")}


# The run's guard (sc_jax.calibration.numpy_fit.fit_batch): SC* for a size whose surrogate data
# the LLM scores below chance. A deviation from the paper, chosen on the development
# tasks (Rotten Tomatoes, SST-2, AG News; seeds 100-104; benchmarks/real_eval/README.md),
# where the paper's fit reverses the LLM at those sizes; guard="none" is the paper's SC.
DEFAULT_GUARD = "bias_only"


LABEL_MODES = ("first_token", "sequence")


# The largest k a run accepts: the paper's largest is 16. Above a few dozen, the k-shot
# prompt outgrows small models' context windows and a run compiles for minutes before
# its first score, so a typo such as --shots 100 is refused instead.
MAX_SHOTS = 32


#: The least --device-memory accepted: below it no model's weights and activations fit,
#: and a figure that small is a unit typo (1KiB for 1GiB).
MIN_DEVICE_MEMORY = 64 << 20


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Everything a run depends on (written into results.json)."""

    model: str = "default"
    dtype: str = "float32"
    datasets: tuple[str, ...] = ("rotten_tomatoes",)
    data_files: tuple[tuple[str, str], ...] = ()  # (dataset, local file)
    data_dir: str | None = None  # DIR/<dataset>.jsonl (or .csv, .parquet) for the rest
    text_column: str | None = None  # None: the task's own, else "text" (sc_jax.experiment.task_loading.load_task)
    label_column: str | None = None  # None: the task's own, else "label"
    shots: tuple[int, ...] = (4, 8)
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    methods: tuple[str, ...] = METHODS
    test_size: int = 256
    # One test set per dataset, drawn from this seed and kept across seeds (the
    # paper's protocol); None redraws it with every seed.
    test_seed: int | None = DEFAULT_TEST_SEED
    mode: str = "first_token"
    max_size: int = 5  # sizes i = 1..min(max_size, k-1)
    lambda_inv: float | None = None  # None: sc_jax.calibration.defaults.DEFAULT_LAMBDA_INV (0.1)
    tau: float | None = None  # None: the paper's schedule from in-sample accuracy
    # "none": SC as the paper fits it; "bias_only": SC* (with the trust region) for a
    # size whose surrogate data the LLM scores below chance; "bias_only_free": the
    # same with SC* unconstrained (sc_jax.calibration.numpy_fit.fit_batch).
    guard: str = DEFAULT_GUARD
    solver: str = "augmented_lagrangian"
    budget: int | None = 5000  # surrogate (context, query) pairs per size
    m_cap: int = 24
    size_weighting: str = "uniform"  # or "reference": min(P(k, i)(k - i), 15000)
    mesh_devices: int | None = None  # devices on the data axis (None: no mesh unless mesh_model > 1)
    mesh_model: int = 1  # devices on the model axis (weights sharded when > 1)
    max_tokens_per_batch: int | None = None  # None: planned from the device's memory
    device_memory: int | None = None  # bytes per device; None: the device's own figure
    bc_batch: int = 128
    dc_strings: int = 20

    def __post_init__(self):
        bad = [m for m in self.methods if m not in METHODS]
        if bad:
            raise ValueError(f"unknown method(s) {bad}; choose from {', '.join(METHODS)}")
        if self.mode not in LABEL_MODES:
            raise ValueError(f"mode must be one of {LABEL_MODES}, got {self.mode!r}")
        if not self.shots or min(self.shots) < 2:
            raise ValueError(f"shots must be >= 2 (SC needs a held-out demonstration), got {self.shots}")
        if max(self.shots) > MAX_SHOTS:
            raise ValueError(f"shots must be at most {MAX_SHOTS} (the paper uses 4, 8 and 16; "
                             f"SC's sub-contexts grow with k), got {max(self.shots)}")
        if not self.seeds:
            raise ValueError("at least one seed is needed")
        # A value given twice would be run (or reported) twice and counted as two:
        # means and intervals "over 4 seeds" from 2.
        for name, option, values in (("seeds", "--seed-list", self.seeds), ("methods", "--methods", self.methods),
                                     ("shots", "--shots", self.shots), ("datasets", "--dataset", self.datasets)):
            twice = sorted({v for v in values if list(values).count(v) > 1}, key=str)
            if twice:
                raise ValueError(f"{name} ({option}) list {', '.join(map(str, twice))} more than once "
                                 f"in {list(values)}; give each once")
        if min(self.seeds) < 0:
            raise ValueError(f"seeds (--seed-list) must be 0 or more, got {min(self.seeds)}")
        # Each of these would run without a word and record a value it did not use
        # (m_cap 0 still draws one sub-context) or fail only after the scoring.
        for name, value in (("m_cap", self.m_cap), ("max_size", self.max_size),
                            ("budget", self.budget), ("bc_batch", self.bc_batch),
                            ("dc_strings", self.dc_strings),
                            ("max_tokens_per_batch", self.max_tokens_per_batch)):
            if value is not None and value < 1:
                raise ValueError(f"{name} (--{name.replace('_', '-')}) must be at least 1, got {value}")
        if self.test_seed is not None and self.test_seed < 0:
            # NumPy's "expected non-negative integer" named no option.
            raise ValueError(f"test_seed (--test-seed) must be 0 or more, got {self.test_seed}")
        if self.budget is not None and self.budget < max(self.shots):
            # Below k, the largest size i = k - 1 keeps fewer than its k contexts (one held-out
            # demonstration each): a demonstration's class can go unseen, and the fit failed
            # only after all the scoring, without naming --budget.
            raise ValueError(f"budget (--budget) must be at least the largest --shots k = "
                             f"{max(self.shots)} (each size's surrogate data must hold every "
                             f"demonstration out at least once), got {self.budget}")
        if self.device_memory is not None and self.device_memory < MIN_DEVICE_MEMORY:
            # 1KiB planned against "0.00 GiB usable": a typo for GiB, not a device.
            raise ValueError(f"device_memory (--device-memory) of {self.device_memory} bytes is "
                             f"below {MIN_DEVICE_MEMORY >> 20} MiB, too small for any model: give "
                             "the memory per device, e.g. 80GiB (a bare number is GiB)")
        if self.test_size < 1:
            raise ValueError(f"test_size must be positive, got {self.test_size}")
        if self.tau is not None and not -1.0 <= self.tau < 1.0:
            # tau = 1 admits b = 0 alone, which the smoothed cosine of the constraint
            # (sc_jax.calibration.objective.COSINE_EPS) only approaches: every fit ended INFEASIBLE.
            raise ValueError(f"tau (--tau) must lie in [-1, 1): at 1 the trust region admits "
                             f"only b = 0, which its smoothed cosine never reaches (every fit "
                             f"would end INFEASIBLE); use e.g. 0.9999, got {self.tau}")
        # NaN passes any comparison that refuses by "<": it would be scored with, written
        # into run_config.json and only then fail.
        if self.lambda_inv is not None and not 0 <= self.lambda_inv < math.inf:
            raise ValueError(f"lambda_inv (--lambda-inv) must be a finite number >= 0, got {self.lambda_inv}")
        if self.guard not in GUARDS:
            raise ValueError(f"guard must be one of {GUARDS}, got {self.guard!r}")
        if self.size_weighting not in ("uniform", "reference"):
            raise ValueError("size_weighting must be 'uniform' (paper) or 'reference' (code)")
        if not self.datasets:
            raise ValueError("at least one dataset is needed")
        known = set(self.datasets)
        names = [name for name, _ in self.data_files]
        for name in sorted({n for n in names if names.count(n) > 1}):
            files = [f for n, f in self.data_files if n == name]
            raise ValueError(f"--data-file gives {len(files)} files for {name!r} ({', '.join(files)}); "
                             "give one per dataset")
        for name, _ in self.data_files:
            if name not in known:
                raise ValueError(f"--data-file given for {name!r}, which is not among the datasets")

    def sizes(self, k: int) -> list[int]:
        return list(range(1, min(self.max_size, k - 1) + 1))

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def run_policy(config: RunConfig, *, n_devices: int | None = None,
               model_shards: int | None = None, agree: bool = True) -> MemoryPolicy:
    """The run's memory policy (:class:`sc_jax.scoring.memory.MemoryPolicy`): its
    ``device_memory`` (else the device's figure, else the host's, not enforced), its
    mesh (``n_devices`` / ``model_shards``: the loaded model's, where known) and its
    ``max_tokens_per_batch``. The engine, the up-front check and ``sc-jax plan`` all
    take this one object (``agree``: see :meth:`MemoryPolicy.resolve`)."""
    return MemoryPolicy.resolve(
        config.device_memory, n_devices=n_devices or config.mesh_devices or 1,
        model_shards=model_shards or config.mesh_model,
        max_tokens_per_batch=config.max_tokens_per_batch, agree=agree)
