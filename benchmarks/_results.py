"""Where the benchmarks write their results, and the one header every result file has.

Each benchmark writes ``benchmarks/results/<benchmark>/<machine>.json`` (``.jsonl``
where it streams records), e.g. ``results/bench_solver/cpu_2core.json``, so a rerun on
the same kind of machine replaces the file it supersedes and git keeps the old one.
The header says what produced the numbers: the commit (``-dirty`` where sc_jax/ or a
benchmark script differed from it), the date, the machine, the JAX backend, the
jax and Python versions, the command and the dtype.

A JSON result is ``{"header": {...}, <the benchmark's fields>}``; a JSON-lines result
starts with one line ``{"header": {...}}``.

Only :func:`jax_machine` imports jax: the parents of the fresh-process benchmarks
(bench_cold_call, bench_models) must not start a backend, so they take the machine
their children report (:func:`machine` of plain values).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _cpu_model() -> str:
    """'Intel(R) Xeon(R) Processor (AVX-512)' from /proc/cpuinfo, else what platform knows."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    model = re.search(r"^model name\s*:\s*(.+)$", info, re.M)
    flags = re.search(r"^flags\s*:\s*(.+)$", info, re.M)
    flags = set(flags.group(1).split()) if flags else set()
    simd = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else None
    name = model.group(1).strip() if model else platform.machine()
    return f"{name} ({simd})" if simd else name


def machine(backend: str, device_kind: str = "cpu", device_count: int = 1) -> dict:
    """The machine in the two forms the results use: ``id`` names the file
    (``cpu_2core``, ``gpu_nvidia-h100-80gb-hbm3``, ``..._x8`` for 8 devices) and
    ``description`` goes into the header, with ``backend``. Pass ``jax.default_backend()``,
    ``jax.devices()[0].device_kind`` and ``jax.device_count()``."""
    cores, cpu = _cores(), _cpu_model()
    if backend == "cpu":
        return {"id": f"cpu_{cores}core", "description": f"{cores}-core {cpu}", "backend": backend}
    kind = re.sub(r"[^a-z0-9.]+", "-", device_kind.lower()).strip("-")
    count = f"_x{device_count}" if device_count > 1 else ""
    return {"id": f"{backend}_{kind}{count}", "backend": backend,
            "description": f"{device_count} x {device_kind}; host {cores}-core {cpu}"}


#: The machine of a result whose children died before reporting theirs.
UNREPORTED = {"id": "unreported", "description": "unreported (no child process said)",
              "backend": "unknown"}


def jax_machine() -> dict:
    """:func:`machine` of the devices this process sees (it starts jax's backend)."""
    import jax  # only where a backend may start; see the module docstring

    return machine(jax.default_backend(), jax.devices()[0].device_kind, jax.device_count())


def default_path(benchmark: str, machine_id: str, suffix: str = ".json") -> Path:
    """``benchmarks/results/<benchmark>/<machine_id><suffix>``."""
    return RESULTS / benchmark / f"{machine_id}{suffix}"


def command(script: str, argv: list[str] | None) -> str:
    """The command line that ran ``script`` (its ``__file__``) with ``argv`` (``None``:
    this process's own arguments), with the script's path from the repository root."""
    path = Path(script).resolve()
    try:
        path = path.relative_to(ROOT)
    except ValueError:
        pass
    return shlex.join(["python", str(path), *(sys.argv[1:] if argv is None else argv)])


def _commit() -> str:
    def git(*args):
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)

    try:
        head = git("rev-parse", "--short=7", "HEAD")
        if head.returncode:
            return "unknown"
        dirty = git("diff", "--quiet", "HEAD", "--", "sc_jax", "benchmarks/*.py").returncode
    except OSError:  # no git
        return "unknown"
    return head.stdout.strip() + ("-dirty" if dirty else "")


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "unknown"


def header(machine_info: dict, *, command: str, dtype, **extra) -> dict:
    """The header of a result file: commit, date (UTC), machine and backend (from
    :func:`machine`), jax, jaxlib and Python versions, command (:func:`command`) and
    dtype (a string; a list, or a mapping by section, where the benchmark runs
    several), then ``extra`` (a ``note``, settings the command does not show)."""
    return {"commit": _commit(),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": machine_info["description"], "backend": machine_info["backend"],
            "jax": _version("jax"), "jaxlib": _version("jaxlib"),
            "python": platform.python_version(), "command": command, "dtype": dtype,
            **extra}


def _is_result(path: Path) -> bool:
    """Whether ``path`` is a result this module wrote: a JSON object, or a JSON-lines
    file whose first line is one, holding a ``header`` object."""
    try:
        with open(path) as f:
            text = f.read() if path.suffix != ".jsonl" else f.readline()
        data = json.loads(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(data, dict) and isinstance(data.get("header"), dict)


def result_file(value: str) -> str:
    """argparse ``type`` of a benchmark's ``--out FILE``, checked before any work: not a
    directory, and not an existing file that no benchmark wrote (a user's file is never
    replaced; a result of ours is, as a rerun replaces its file)."""
    path = Path(value)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{value} is a directory; --out takes a file name")
    if path.is_file() and path.stat().st_size and not _is_result(path):
        raise argparse.ArgumentTypeError(
            f"{value} exists and no benchmark wrote it (not a result with a header): remove it "
            "or choose another --out")
    return value


def result_dir(value: str, names=("suite.json",)) -> str:
    """argparse ``type`` of a benchmark's ``--out DIR``: not a file, and no file of
    ``names`` in it that no benchmark wrote."""
    path = Path(value)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{value} is a file; --out takes a directory")
    for name in names:
        if (path / name).is_file() and not _is_result(path / name):
            raise argparse.ArgumentTypeError(
                f"{path / name} exists and no benchmark wrote it: choose another --out")
    return value


def write_json(path: str | os.PathLike, data: dict) -> Path:
    """Write ``data`` as indented JSON atomically: a kill mid-write leaves the
    previous file (a temporary file in the same directory, then ``os.replace``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
    os.replace(tmp, path)
    return path


def start_jsonl(path: str | os.PathLike, head: dict) -> Path:
    """Create a JSON-lines result with its header line, unless it exists (a run that
    resumes appends to the file it started, under that file's header)."""
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps({"header": head}) + "\n")
        os.replace(tmp, path)
    return path


def read_jsonl(path: str | os.PathLike) -> tuple[dict | None, list[dict]]:
    """A JSON-lines result: its header (None for a file without one) and its records."""
    head, records = None, []
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        if "header" in rec and len(rec) == 1:
            head = rec["header"]
        else:
            records.append(rec)
    return head, records


def last_line(text: str) -> str:
    """A child process's error in one line: the last non-blank line of its stderr."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "no message"
