"""Several processes, one program: JAX's multi-controller runtime.

A multi-process run starts the same command once per process (one per host, or
several on one machine). :func:`initialize_distributed` joins them through
``jax.distributed.initialize``; from then on ``jax.devices()`` lists every process's
devices and a mesh over them (:func:`sc_jax.runtime.sharding.make_mesh`) spans the processes.
Every process executes every step of the run in the same order (SPMD): the jitted
forward passes are single programs over the global mesh, XLA inserts the
cross-process collectives (NCCL on GPUs, gloo on CPUs), and every process ends up
holding the same label scores. Which process writes what is decided here:
:func:`is_writer` (process 0 writes results, tables, plots and the score cache).

How the processes find each other, in this order:

* ``SC_JAX_COORDINATOR=host:port``, ``SC_JAX_NUM_PROCESSES`` and ``SC_JAX_PROCESS_ID``
  (the plain case, and what ``python -m sc_jax.runtime.launch`` sets on one machine);
* a SLURM step (``srun``) or an Open MPI launch (``mpirun``) of more than one task:
  ``jax.distributed.initialize()`` reads the scheduler's variables itself;
* otherwise one process, and nothing is initialised.

Time limits (seconds, environment variables): ``SC_JAX_INIT_TIMEOUT`` (default 300)
for every process to join; ``SC_JAX_HEARTBEAT_TIMEOUT`` (default 100) after which a
process that stopped answering (died, killed, preempted) is declared lost and JAX
ends every other process with "Terminating process because the JAX distributed
service detected fatal errors". A rerun resumes from the score cache.
"""

from __future__ import annotations

import logging
import os
import socket
import time

import jax
import numpy as np
from jax.experimental import multihost_utils

log = logging.getLogger("sc_jax")

INIT_TIMEOUT = 300
HEARTBEAT_TIMEOUT = 100


class DistributedError(ValueError):
    """A multi-process launch that cannot start (a one-line error for the CLI)."""


def _env_seconds(name: str, default: int) -> int:
    text = os.environ.get(name)
    if not text:
        return default
    if not text.strip().isdigit() or int(text) < 1:
        raise DistributedError(f"{name} must be a positive number of seconds, got {text!r}")
    return int(text)


def _scheduler_tasks() -> int:
    """Tasks of a SLURM step or an Open MPI job that launched this process (1: none)."""
    for var in ("SLURM_STEP_NUM_TASKS", "OMPI_COMM_WORLD_SIZE"):
        text = os.environ.get(var, "")
        if text.isdigit():
            return int(text)
    return 1


def _explicit() -> tuple[str, int, int] | None:
    addr = os.environ.get("SC_JAX_COORDINATOR")
    if not addr:
        return None
    try:
        n, pid = int(os.environ["SC_JAX_NUM_PROCESSES"]), int(os.environ["SC_JAX_PROCESS_ID"])
    except (KeyError, ValueError):
        raise DistributedError("SC_JAX_COORDINATOR is set: SC_JAX_NUM_PROCESSES and SC_JAX_PROCESS_ID "
                               "must be integers too") from None
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise DistributedError(f"SC_JAX_COORDINATOR must be host:port, got {addr!r}")
    if n < 1 or not 0 <= pid < n:
        raise DistributedError(f"SC_JAX_PROCESS_ID must be in [0, {n}) for SC_JAX_NUM_PROCESSES={n}, "
                               f"got {pid}")
    return addr, n, pid


def wait_for_coordinator(addr: str, timeout: float) -> None:
    """Block until a TCP connection to ``host:port`` succeeds, or raise
    :class:`DistributedError` after ``timeout`` seconds. JAX's own client aborts the
    process (a C++ fatal error, not an exception) when it cannot register, so a
    process other than the coordinator checks the address first."""
    host, _, port = addr.rpartition(":")
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=2):
                return
        except OSError as e:
            if time.monotonic() >= deadline:
                raise DistributedError(
                    f"cannot reach the coordinator at {addr} within {timeout:.0f} s ({e.strerror or e}); "
                    "start process 0 (SC_JAX_PROCESS_ID=0) on that host, check the address and that "
                    "the port is open, or raise SC_JAX_INIT_TIMEOUT") from None
            time.sleep(0.25)


def initialize_distributed() -> bool:
    """Join the processes of a multi-process run (see the module docstring for how
    they are found); returns False, having done nothing, for a single process.
    Call it before anything else touches JAX's devices."""
    init = _env_seconds("SC_JAX_INIT_TIMEOUT", INIT_TIMEOUT)
    beat = _env_seconds("SC_JAX_HEARTBEAT_TIMEOUT", HEARTBEAT_TIMEOUT)
    explicit = _explicit()
    if explicit is None and _scheduler_tasks() <= 1:
        return False
    if jax.distributed.is_initialized():
        return True
    kw = {"initialization_timeout": init, "heartbeat_timeout_seconds": beat}
    if explicit is not None:
        addr, n, pid = explicit
        if n == 1:
            return False
        if pid != 0:
            wait_for_coordinator(addr, init)
        log.info("process %d of %d: joining at %s (up to %d s)", pid, n, addr, init)
        jax.distributed.initialize(coordinator_address=addr, num_processes=n, process_id=pid, **kw)
    else:
        jax.distributed.initialize(**kw)  # SLURM or Open MPI: JAX reads their variables
    log.info("process %d of %d joined: %d devices in all, %d here", jax.process_index(),
             jax.process_count(), jax.device_count(), jax.local_device_count())
    return True


def is_writer() -> bool:
    """True in the one process that writes files (process 0)."""
    return jax.process_index() == 0


def is_multiprocess() -> bool:
    return jax.process_count() > 1


def put_global(x, sharding) -> jax.Array:
    """A host array that every process holds whole -> a global ``jax.Array`` with
    ``sharding``. Each process transfers only the shards of its own devices, so the
    same call serves one process or many; shapes never depend on the process."""
    if not is_multiprocess():
        return jax.device_put(x, sharding)
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def to_host(x) -> np.ndarray:
    """A (possibly global) array -> NumPy, the whole array in every process."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


_SHARED_DTYPES = ("float32", "float64", "int32", "int64", "bool")


def from_writer(value: np.ndarray | None) -> np.ndarray | None:
    """Process 0's ``value`` in every process (identity for one process). ``value``
    may be None in process 0 (nothing to share: None everywhere); the other
    processes pass anything (ignored). Shape and dtype travel first, so the others
    need not know them. Dtypes: those of :data:`_SHARED_DTYPES`, up to 8 dimensions."""
    if not is_multiprocess():
        return value
    head = np.zeros(10, np.int64)
    if is_writer() and value is not None:
        value = np.ascontiguousarray(value)
        if value.dtype.name not in _SHARED_DTYPES or value.ndim > 8:
            raise ValueError(f"from_writer shares {', '.join(_SHARED_DTYPES)} arrays of at most 8 "
                             f"dimensions, got {value.dtype.name} with {value.ndim}")
        head[0], head[1] = 1 + value.ndim, _SHARED_DTYPES.index(value.dtype.name)
        head[2:2 + value.ndim] = value.shape
    # 64-bit values would be cut to 32 bits on the way without x64.
    with jax.enable_x64(True):
        head = np.asarray(multihost_utils.broadcast_one_to_all(head))
        if head[0] == 0:
            return None
        ndim, dtype = int(head[0]) - 1, np.dtype(_SHARED_DTYPES[int(head[1])])
        mine = value if is_writer() else np.zeros(tuple(int(s) for s in head[2:2 + ndim]), dtype)
        return np.asarray(multihost_utils.broadcast_one_to_all(mine)).astype(dtype, copy=False)


def smallest(value: int) -> int:
    """The smallest ``value`` over the processes: a memory budget that every host
    can hold, so that all of them plan the same batches (identity for one process)."""
    if not is_multiprocess():
        return int(value)
    with jax.enable_x64(True):
        return int(np.min(multihost_utils.process_allgather(np.int64(value))))


def on_writer(fn):
    """``fn()`` in process 0 only (file-system work: creating, locking and checking
    the output directory, a download); its result there, None elsewhere. An
    exception it raises is raised in process 0 and, as a :class:`DistributedError`
    with its message, in every other process, so that all stop together instead of
    the others waiting for process 0 in the next collective."""
    if not is_multiprocess():
        return fn()
    result, error, text = None, None, b""
    if is_writer():
        try:
            result = fn()
        except Exception as e:  # noqa: BLE001  (shared, then raised again below)
            error, text = e, str(e).encode()
    # A flag first (2: failed), then the message, which may be empty.
    flag = b"\x02" if error is not None else b"\x01"
    shared = from_writer(np.frombuffer(flag + text, np.uint8).astype(np.int32))
    if shared[0] == 2:
        if error is not None:
            raise error
        raise DistributedError(bytes(shared[1:].astype(np.uint8)).decode(errors="replace") or
                               "process 0 stopped with an error")
    return result


def writer_first(fn):
    """``fn()`` in process 0, then in the other processes once it has finished; its
    result in every process (one call in each). For fetches and conversions into a
    cache the processes may share: process 0 does the work once, the others find it
    done. An exception in process 0 stops every process (:func:`on_writer`)."""
    result = on_writer(fn)
    return result if is_writer() else fn()
