"""The roofline a plan's forward time is costed on (:class:`Rates`: a share of the
device's peak FLOP/s and its memory bandwidth, and the attention costed), and the run's
forward-pass estimate before scoring starts (:func:`forward_estimate`), from the run's
plan (:class:`sc_jax.experiment.protocol.runplan.RunPlan`) with no model program compiled.
"""

from __future__ import annotations

import dataclasses
import math
import os

import jax
import jax.numpy as jnp

from sc_jax.experiment.protocol.runplan import RunPlan
from sc_jax.models import attention as attn
from sc_jax.runtime.devices import (device_bandwidth, device_peak_flops, measured_bandwidth,
                                    measured_matmul_flops)
from sc_jax.scoring.costs import Roofline, replay

__all__ = ["Rates", "check_rates", "forward_estimate", "plan_rates"]


@dataclasses.dataclass(frozen=True)
class Rates:
    """The plan's roofline: ``mfu`` of ``peak_flops`` and ``bandwidth`` per device (each
    with where it comes from), the ``attention`` costed, and whether its pace is
    measured here (``calibrate``: a plan for this machine's own backend)."""

    peak_flops: float
    peak_source: str
    bandwidth: float
    bandwidth_source: str
    mfu: float
    attention: str
    calibrate: bool

    def roofline(self, devices: int) -> Roofline:
        # The mesh's devices share the work: the peaks are per device.
        return Roofline(self.mfu * self.peak_flops * devices, self.bandwidth * devices)


def check_rates(*, peak_flops, mfu, bandwidth) -> None:
    """A plan's roofline arguments (:func:`sc_jax.experiment.execution.plan.plan_run`'s), each
    refused in one line before any work (NaN, 0 or a negative would print "about nan
    min" or divide by zero after the whole plan)."""
    if not 0 < mfu <= 1:
        raise ValueError(f"mfu (--mfu) is the fraction of the peak reached, in (0, 1], got {mfu}")
    for option, value, unit in (("peak_flops (--peak-tflops)", peak_flops, 1e12),
                                ("bandwidth (--bandwidth-gbs)", bandwidth, 1e9)):
        if value is not None and not 0 < value < math.inf:
            raise ValueError(f"{option} must be a positive number, got {value / unit:g}")


def plan_rates(dtype, *, peak_flops, mfu, accelerator, bandwidth, attention) -> Rates:
    """The roofline of a plan's arguments (checked by :func:`check_rates`): the
    attention ("auto": :func:`sc_jax.models.attention.choose`) and the device's peaks
    where not given (:func:`device_peak_flops`, :func:`device_bandwidth`)."""
    if attention == "auto":
        attention = attn.choose("gpu" if accelerator else jax.default_backend())
    # The attention's time is measured on this backend when the plan is for it (no
    # named accelerator, no given peak); else it is the roofline's.
    calibrate = accelerator is None and peak_flops is None and bandwidth is None
    if calibrate and attention == "cudnn" and jax.default_backend() != "gpu":
        # Timing it here ended in "RuntimeError: cuDNN is not detected" and a traceback.
        raise ValueError(f"--attention cudnn runs on an NVIDIA GPU only and this machine's "
                         f"backend is {jax.default_backend()}: plan for a GPU with --accelerator "
                         "(e.g. --accelerator h100), or choose another --attention")
    peak, peak_source = (peak_flops, "given") if peak_flops is not None \
        else device_peak_flops(accelerator, dtype)
    bw, bw_source = (bandwidth, "given") if bandwidth is not None else device_bandwidth(accelerator)
    return Rates(peak, peak_source, bw, bw_source, mfu, attention, calibrate)


def forward_estimate(plan: RunPlan, *, mfu: float = 0.4) -> tuple[float, str]:
    """``(seconds, line)``: the forward passes of every seed of ``plan`` on this
    machine's roofline (``mfu`` of the device's datasheet peak, else of a small matmul
    and copy timed here; the default attention's FLOPs and bytes counted per call, not
    measured), as :func:`sc_jax.experiment.execution.plan.plan_run` projects them: each (dataset, k)'s first seed's
    schedule replayed, times the seeds. No program of the model is compiled."""
    policy, config, dtype = plan.policy, plan.model.parts.config, plan.dtype
    devices = policy.n_devices * policy.model_shards
    cpu = jax.default_backend() == "cpu"
    # On a CPU the fastest of five timings: other processes slow some of them, never
    # speed one up, so the fastest is the machine's own rate (a median read a busy
    # 2-core machine's as 4x slower than the run then went).
    load = _load_per_core() if cpu else None
    peak, peak_source = device_peak_flops(None, dtype) if not cpu else \
        (measured_matmul_flops(dtype, n=512, repeats=5, fastest=True), "a matmul timed here")
    bw, bw_source = device_bandwidth(None) if not cpu else (measured_bandwidth(mib=32, repeats=5, fastest=True),
                                                             "a copy timed here")
    rates = Rates(peak, peak_source, bw, bw_source, mfu, attn.choose(jax.default_backend()), False)
    roof, seconds = rates.roofline(devices), 0.0
    for name, k in plan.settings:
        work = plan.seeds_of(name, k)
        r = replay(work[0].planned.schedule, config, attention=rates.attention,
                   platform=policy.platform, itemsize=jnp.dtype(dtype).itemsize, mode=plan.config.mode)
        seconds += len(work) * (roof.seconds(r["dense_flops"], r["dense_bytes"])
                                + roof.seconds(r["attention_flops"], r["attention_bytes"]))
    line = (f"forward passes: about {_duration(seconds)} for {len(plan.work)} seed(s) on a roofline "
            f"of {mfu:.0%} of {peak / 1e12:.3g} TFLOP/s ({peak_source}) and {bw / 1e9:,.0f} GB/s "
            f"({bw_source}) per device x {devices}, {rates.attention} attention (`sc-jax plan` "
            "details it)")
    if load is not None and load > 0.75:
        line += (f"; timed while the machine was busy (load average {load * os.cpu_count():.1f} on "
                 f"{os.cpu_count()} cores), so it may run slower or faster than this")
    if cpu and seconds > 3600:
        line += ("; that is hours on a CPU: fewer --seeds, --shots or --test-size, a smaller "
                 "--m-cap or --budget, or a GPU")
    return seconds, line


def _load_per_core() -> float | None:
    """The 1-minute load average per core, or None where the system gives none."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except (AttributeError, OSError):  # Windows
        return None


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.1f} s"
