"""Start one command as several JAX processes on this machine.

    python -m sc_jax.runtime.launch --processes 2 --local-devices 4 -- sc-jax run --mesh data=2,model=4 ...

Each process gets ``SC_JAX_COORDINATOR=127.0.0.1:<free port>``,
``SC_JAX_NUM_PROCESSES`` and its ``SC_JAX_PROCESS_ID`` (what
:func:`sc_jax.runtime.multihost.initialize_distributed` reads), and with ``--local-devices N``
N simulated CPU devices (``--xla_force_host_platform_device_count``), so a
multi-host program runs, collectives included, on one machine. Output lines are
prefixed with ``[p<id>]``. When one process fails, the others are stopped at once
(on separate hosts JAX's heartbeat does this; see :mod:`sc_jax.runtime.multihost`) and the
exit status is the first failure's. On several hosts, set the three variables
yourself, or launch with ``srun`` / ``mpirun``, and run the same command on each.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_env(pid: int, processes: int, port: int, local_devices: int | None, base=None) -> dict:
    """The environment of process ``pid``."""
    env = dict(os.environ if base is None else base)
    env.update(SC_JAX_COORDINATOR=f"127.0.0.1:{port}", SC_JAX_NUM_PROCESSES=str(processes),
               SC_JAX_PROCESS_ID=str(pid), PYTHONUNBUFFERED="1")
    if local_devices:
        flags = [f for f in env.get("XLA_FLAGS", "").split()
                 if not f.startswith("--xla_force_host_platform_device_count")]
        env["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={local_devices}"])
        env["JAX_PLATFORMS"] = "cpu"
    return env


def _relay(pid: int, stream, out) -> None:
    for line in iter(stream.readline, b""):
        out.write(f"[p{pid}] {line.decode(errors='replace')}")
        out.flush()


def launch(command: list[str], processes: int, *, local_devices: int | None = None,
           timeout: float | None = None, env: dict | None = None, out=None) -> int:
    """Run ``command`` as ``processes`` processes; returns 0 if all succeed, else the
    first failure's exit status (124 when ``timeout`` seconds pass first)."""
    if processes < 1:
        raise ValueError(f"--processes must be at least 1, got {processes}")
    out = out or sys.stdout
    port = free_port()
    procs, relays = [], []
    for pid in range(processes):
        p = subprocess.Popen(command, env=process_env(pid, processes, port, local_devices, env),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        procs.append(p)
        relays.append(threading.Thread(target=_relay, args=(pid, p.stdout, out), daemon=True))
        relays[-1].start()
    rc = _wait(procs, timeout, out)
    for t in relays:
        t.join(timeout=5)
    return rc


def _wait(procs, timeout, out) -> int:
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        codes = [p.poll() for p in procs]
        failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
        late = deadline is not None and time.monotonic() > deadline
        if failed or late or all(c == 0 for c in codes):
            break
        time.sleep(0.1)
    if not failed and not late:
        return 0
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    if late:
        out.write(f"sc_jax.runtime.launch: stopped after {timeout:.0f} s\n")
        return 124
    i, c = failed[0]
    why = f"signal {-c}" if c < 0 else f"status {c}"
    out.write(f"sc_jax.runtime.launch: process {i} exited with {why}; the others were stopped\n")
    return c if c > 0 else 128 - c


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sc_jax.runtime.launch", description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", "-n", type=int, default=2, help="processes to start (default 2)")
    ap.add_argument("--local-devices", type=int, default=None,
                    help="simulated CPU devices per process (default: the machine's own devices)")
    ap.add_argument("--timeout", type=float, default=None, help="stop every process after this many seconds")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = ap.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("give the command to run after --")
    return launch(cmd, args.processes, local_devices=args.local_devices, timeout=args.timeout)


if __name__ == "__main__":
    sys.exit(main())
