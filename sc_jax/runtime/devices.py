"""A device's peaks, for the roofline of :mod:`sc_jax.scoring.costs`: dense
FLOP/s and memory bytes/s per device, from datasheets of known accelerators
(:data:`ACCELERATOR_PEAK_FLOPS`, :data:`ACCELERATOR_BANDWIDTH`) or measured on the
default device (:func:`measured_matmul_flops`, :func:`measured_bandwidth`).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

#: Dense bfloat16 peak of one H100 SXM (NVIDIA's datasheet).
H100_BF16_PEAK_FLOPS = 989e12
#: Dense bfloat16 peaks (datasheets) of accelerators by name, for `plan`'s time
#: estimate: `--accelerator NAME`, or the local device when its kind names one.
ACCELERATOR_PEAK_FLOPS = {"h100": H100_BF16_PEAK_FLOPS, "h200": H100_BF16_PEAK_FLOPS,
                          "a100": 312e12, "l4": 121e12, "v100": 125e12}


def measured_matmul_flops(dtype=jnp.float32, n: int | None = None, repeats: int = 5,
                          fastest: bool = False) -> float:
    """FLOP/s of a square matrix product on the default device: the median of
    ``repeats`` timings after one compile (``fastest``: the fastest of them, the one
    least slowed by other processes on a busy CPU), the best over the sizes tried.

    On a CPU one ``[n, n] @ [n, n]`` product per timing (``n`` 1024 by default; about
    0.3 s on 2 cores). On an accelerator 4096- and 8192-square products (``n`` is not
    used), 10 dispatched back to back per timing: a single 2048-square product is
    about 20 us there, no longer than its dispatch, and read as 115 TFLOP/s on an
    H200 whose bf16 products reach about 860.
    """
    if jax.default_backend() == "cpu":
        sizes, per_timing = (n or 1024,), 1
    else:
        sizes, per_timing = (4096, 8192), 10
    f = jax.jit(lambda x: x @ x)
    best = 0.0
    for size in sizes:
        a = jnp.full((size, size), 0.5, dtype)
        f(a).block_until_ready()
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            jax.block_until_ready([f(a) for _ in range(per_timing)])
            times.append((time.perf_counter() - t) / per_timing)
        best = max(best, 2 * size ** 3 / float(np.min(times) if fastest else np.median(times)))
    return best


#: Memory bandwidths (datasheets, bytes/s) of the accelerators of
#: :data:`ACCELERATOR_PEAK_FLOPS`, for the memory-bound parts of `plan`'s time estimate.
ACCELERATOR_BANDWIDTH = {"h100": 3.35e12, "h200": 4.8e12, "a100": 2.0e12, "l4": 0.3e12,
                         "v100": 0.9e12}
#: Device memory (datasheets, bytes; the larger variant where there are two) of the
#: accelerators of :data:`ACCELERATOR_PEAK_FLOPS`: ``sc-jax plan --accelerator``'s budget.
ACCELERATOR_MEMORY = {"h100": 80 * 2**30, "h200": 141 * 10**9, "a100": 80 * 2**30, "l4": 24 * 10**9,
                      "v100": 32 * 2**30}


def measured_bandwidth(mib: int = 256, repeats: int = 5, fastest: bool = False) -> float:
    """Memory bytes/s of the default device: ``x + 1`` over a float32 array of ``mib``
    MiB (read once, written once), the median of ``repeats`` timings after a compile (``fastest``: the fastest)."""
    n = mib * 2 ** 20 // 4
    f = jax.jit(lambda x: x + 1.0)
    x = jnp.zeros((n,), jnp.float32)
    f(x).block_until_ready()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        f(x).block_until_ready()
        times.append(time.perf_counter() - t)
    return 2 * n * 4 / float(np.min(times) if fastest else np.median(times))


def _datasheet(table: dict, accelerator: str | None) -> tuple[float, str] | None:
    """(figure, accelerator) from a datasheet ``table`` (by lower-case name): for
    ``accelerator``, else for the local accelerator when its kind names one; None on a
    CPU or an accelerator the table does not know."""
    if accelerator is not None:
        key = accelerator.lower()
        if key not in table:
            raise ValueError(f"unknown accelerator {accelerator!r}; known: {', '.join(table)} "
                             "(or give --peak-tflops and --bandwidth-gbs)")
        return table[key], key.upper()
    dev = jax.local_devices()[0]
    kind = str(getattr(dev, "device_kind", dev.platform))
    if dev.platform != "cpu":
        for key, figure in table.items():
            if key in kind.lower():
                return figure, kind
    return None


def device_bandwidth(accelerator: str | None = None) -> tuple[float, str]:
    """(memory bytes/s per device, where it comes from), as :func:`device_peak_flops`:
    the datasheet of ``accelerator`` or of the local accelerator, else measured here."""
    hit = _datasheet(ACCELERATOR_BANDWIDTH, accelerator)
    if hit is not None:
        return hit[0], f"{hit[1]} datasheet"
    return measured_bandwidth(), f"measured on this {jax.default_backend()}"

def device_peak_flops(accelerator: str | None = None, dtype=jnp.float32) -> tuple[float, str]:
    """(peak FLOP/s per device, where it comes from) for `plan`'s time estimate: the
    datasheet figure of ``accelerator`` (a key of :data:`ACCELERATOR_PEAK_FLOPS`), or
    of the local accelerator when its kind names one, else a matmul measured here
    (a CPU: an H100's figure would promise a CPU run hundreds of times too fast)."""
    hit = _datasheet(ACCELERATOR_PEAK_FLOPS, accelerator)
    if hit is not None:
        return hit[0], f"{hit[1]} datasheet, dense bf16"
    dev = jax.local_devices()[0]
    kind = str(getattr(dev, "device_kind", dev.platform))
    where = dev.platform if kind.lower() == dev.platform else f"{dev.platform} ({kind})"
    return measured_matmul_flops(dtype), f"matmul measured on this {where}"
