"""Batches of problems: ``jit(vmap(.))`` on accelerators, one instance after another
on CPU, parts of a batch on host threads, the XLA options of the solver program, and
the device a batch is solved on (:func:`fit_device`: small batches on the host CPU).

:func:`solve_batch` runs a JAX solver over a batch padded to one N, or over buckets
each padded to its own N, one compiled program per bucket and instance count bucket
(:func:`run_parts`), so that later batches of other counts and sizes reuse the
programs. On CPU by default ``jit(lax.map(.))`` over one instance per call, the calls
made from one host thread per core (:func:`resolve_batch_size`,
:func:`resolve_threads`). Under a caller's ``jit`` the batch is one program, in which
the augmented Lagrangian holds one copy of its loop for all buckets
(:func:`solve_slots`).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Literal, Sequence, get_args

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np

from sc_jax.calibration.objective import Params, Problem, value
from sc_jax.calibration.solvers import multistart
from sc_jax.calibration.solvers.exported import Batched, Spec
from sc_jax.calibration.solvers.levels import Rows, level_designs, level_evaluator
from sc_jax.calibration.solvers.projected import projected
from sc_jax.calibration.solvers.types import Solution, SolverOptions

_JAX_METHODS: dict[str, Callable[..., Solution]] = {
    "augmented_lagrangian": multistart.augmented_lagrangian,
    "projected": projected,
}

# Mutable module state, on purpose: how often each batched solver has been traced
# (compiled). Tracing happens inside jax.jit, which hands nothing else back to count it
# by; tests read it to prove that a batch's contents never trigger a recompilation.
trace_counts: dict[str, int] = {name: 0 for name in _JAX_METHODS}
_TRACE_LOCK = threading.Lock()


def resolve_batch_size(batch_size: int | None, backend: str | None = None) -> int | None:
    """The number of instances solved in lockstep by one ``vmap``.

    ``None`` picks by ``backend``, the platform the solve runs on (None: JAX's default
    backend): 1 on CPU, where a vmapped solve does the instances' arithmetic one
    after another anyway but makes every instance wait, at each loop step, for the
    batch's slowest (the nested while_loops run to the largest iteration count of
    the batch; several times slower on the benchmark batches, ``benchmarks/RESULTS.md``);
    the whole bucket (returned as None) on GPU and TPU, where the lockstep
    is what fills the device. An int >= 1 is used as given.
    """
    if batch_size is None:
        return 1 if (backend or jax.default_backend()) == "cpu" else None
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
            or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int or None, got {batch_size!r}")
    return int(batch_size)


THREADS_ENV = "SC_JAX_SOLVER_THREADS"


def threads_from_env(env: str | None = None) -> int | None:
    """``$SC_JAX_SOLVER_THREADS`` as a positive int (None where unset); ValueError naming
    the variable otherwise. ``sc-jax`` calls it at startup, so a typo is refused before
    any scoring rather than at the first fit."""
    env = os.environ.get(THREADS_ENV) if env is None else env
    if env is None:
        return None
    try:
        threads = int(env)
    except ValueError:
        threads = 0
    if threads < 1:
        raise ValueError(f"{THREADS_ENV} must be a positive integer (solver threads), got {env!r}: "
                         f"fix it or unset it")
    return threads


def resolve_threads(threads: int | None, backend: str | None = None) -> int:
    """Host threads that solve parts of a batch at once in :func:`solve_batch`.

    XLA's CPU backend runs one compiled solver call on one core (pinning it to one
    core does not slow it), but it runs calls of one executable made from several
    host threads at the same time (dispatching them from one thread did not overlap
    them). The gain on a 2-core machine is real but below 2x (the cores share
    memory bandwidth); the measurements are in ``benchmarks/RESULTS.md``.

    ``None``: where ``backend``, the platform the solve runs on (None: JAX's default
    backend), is the CPU, the number of cores this process may run on
    (``os.sched_getaffinity``), or the environment variable ``SC_JAX_SOLVER_THREADS``
    where it is set; 1 on GPU and TPU, where one vmapped call is what fills the
    device. An int >= 1 is used as given.
    """
    if threads is None:
        if (backend or jax.default_backend()) != "cpu":
            return 1
        env = os.environ.get(THREADS_ENV)
        if env is None:
            return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
                else (os.cpu_count() or 1)
        threads, where = threads_from_env(env), THREADS_ENV
    else:
        where = "threads"
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 1:
        raise ValueError(f"{where} must be a positive int or None, got {threads!r}")
    return int(threads)


# Where a solve may run (:func:`fit_device`): the policy, the host, the default device.
DeviceName = Literal["auto", "cpu", "default"]
DEVICES: tuple[DeviceName, ...] = get_args(DeviceName)

# "auto" solves a batch on the host CPU below this many cells (padded rows x (n - 1)
# in all buckets, times the starts the augmented Lagrangian vmaps). A solve is a
# chain of dependent while-loop steps, each a few kernel launches on an accelerator,
# so the accelerator's time hardly grows with the rows while the CPU's grows in
# proportion. On an NVIDIA H200 the 25-problem benchmark batches (150,720 padded
# rows; 1.5e5 cells at n = 2 to 4.5e5 at n = 4, benchmarks/RESULTS.md) took the AL
# 3-10x and PG about 1.2x the time of a 2-core CPU; extrapolated in proportion to
# the cells, the 2-core CPU breaks even near 5e5 cells for PG and 4e6 for the AL
# (the default), and a host with more cores moves both up. 1e6 keeps a seed's
# problems (1e4 to 1e5 cells) and such batches on the host, and leaves the
# accelerator larger batches and the 96-start multi-start, whose vmapped starts
# multiply the CPU's work per step but hardly the accelerator's.
HOST_CELLS = 1_000_000


def fit_device(device: DeviceName | jax.Device = "auto", problems: Problem | Sequence[Problem] = (),
               num_starts: int = 1) -> jax.Device | None:
    """The device a batch of problems is solved on, or None for the default device
    (no context entered, no transfer: the solve runs as it would without this).

    device: "auto": where JAX's default backend is the CPU, None; on an accelerator,
        the first CPU device for a batch of fewer than :data:`HOST_CELLS` cells
        (``problems``' padded rows x (n - 1), summed, times ``num_starts``), else
        None; with no CPU backend loaded (``JAX_PLATFORMS=cuda``) None. "cpu": the
        first CPU device. "default": None. A ``jax.Device``: that device.
        Where the default backend is the CPU, its first device is the default one,
        and None is returned for it: a ``jax.default_device`` context there only
        compiles the same programs again under another trace context (see
        ``sc_jax.calibration.solvers.reference``).
    problems: batched :class:`Problem` buckets (only their shapes are read).
    Raises ValueError for any other ``device``.
    """
    if isinstance(device, jax.Device):
        chosen = device
    elif isinstance(device, str) and device in DEVICES:
        on_cpu = jax.default_backend() == "cpu"
        if device == "default" or (device == "auto" and on_cpu):
            return None
        if device == "auto":
            buckets = (problems,) if isinstance(problems, Problem) else tuple(problems)
            cells = sum(math.prod(p.features.shape) for p in buckets) * num_starts
            if cells >= HOST_CELLS:
                return None
            try:
                return jax.local_devices(backend="cpu")[0]
            except RuntimeError:  # no CPU backend loaded
                return None
        chosen = jax.local_devices(backend="cpu")[0]
    else:
        raise ValueError(f"device must be one of {DEVICES} or a jax.Device, got {device!r}")
    if jax.default_backend() == "cpu" and chosen == jax.local_devices(backend="cpu")[0]:
        return None
    return chosen


def _on(device: jax.Device | None):
    """``jax.default_device(device)``, or no context for None."""
    return contextlib.nullcontext() if device is None else jax.default_device(device)


def split_parts(counts: Sequence[int], rows: Sequence[int], parts: int):
    """Deal the instances of buckets (``counts[j]`` instances of ``rows[j]`` padded
    rows each) to ``parts`` parts of one shape: every part holds
    ``slots[j] = ceil(counts[j] / parts)`` instances of bucket j, real ones or
    fillers, so that one compiled program serves them all. Largest buckets first,
    each instance goes to the least loaded part with a free slot (load: padded rows,
    plus 256 for each evaluation's fixed cost), so that the parts take about equally
    long. Returns ``slots`` and ``assign[t][j]``, the instance indices of bucket j in
    part t (at most ``slots[j]``; the rest of the slots are fillers).
    """
    slots = [-(-c // parts) for c in counts]
    assign = [[[] for _ in counts] for _ in range(parts)]
    load = [0] * parts
    for j in sorted(range(len(counts)), key=lambda j: -rows[j]):
        for i in range(counts[j]):
            t = min((t for t in range(parts) if len(assign[t][j]) < slots[j]),
                    key=lambda t: load[t])
            assign[t][j].append(i)
            load[t] += rows[j] + 256
    return slots, assign


def bucket_count(count: int) -> int:
    """Instances per compiled call rounded up to a power of two: the problem-count
    bucket, so that batches of other sizes reuse the programs compiled for earlier
    ones."""
    return 1 << max(int(count) - 1, 0).bit_length()


def bucket_calls(count: int, rows: int, batch_size: int | None, threads: int
                 ) -> tuple[int, list[list[int]]]:
    """How one bucket of ``count`` instances of ``rows`` padded rows is solved:
    ``(slots, calls)``, each call the instance indices it solves (at most ``slots``;
    the rest of its slots are fillers). ``batch_size`` 1 (the CPU default, one
    instance after another): one call per instance, so the program never depends on
    the count and host threads take the instances as they free up. Otherwise
    ``min(count, threads)`` parts (:func:`split_parts`), ``slots`` the part size
    rounded up by :func:`bucket_count`."""
    if batch_size == 1:
        return 1, [[i] for i in range(count)]
    parts = max(min(count, threads), 1)
    slots, assign = split_parts([count], [rows], parts)
    return bucket_count(slots[0]), [a[0] for a in assign if a[0]]


# Mutable module state, on purpose: one ThreadPoolExecutor per process and its size,
# kept across calls (and only grown), since starting and joining threads on every call
# costs a noticeable share of a small batch's solve.
_POOL: list = [None, 0]


def _thread_pool(threads: int) -> ThreadPoolExecutor:
    """A pool of at least ``threads`` workers, the one in ``_POOL`` if it is large
    enough, else a larger one that replaces it."""
    if _POOL[1] < threads:
        if _POOL[0] is not None:
            _POOL[0].shutdown(wait=False)
        _POOL[:] = [ThreadPoolExecutor(threads, thread_name_prefix="sc_jax_solve"), threads]
    return _POOL[0]


# Mutable module state, on purpose: per program (solver, shapes, device), a lock that
# the first call holds while it compiles, and whether that call has returned. Two
# threads calling one jitted function with a new shape at once would both trace and
# compile it; the second waits instead and then finds it compiled.
_FIRST_CALLS: dict = {}
_FIRST_LOCK = threading.Lock()


def _first_call(key) -> threading.Lock | None:
    """The lock a call of program ``key`` takes, or None once the program has run."""
    with _FIRST_LOCK:
        entry = _FIRST_CALLS.setdefault(key, [threading.Lock(), False])
    return None if entry[1] else entry[0]


def _called(key) -> None:
    _FIRST_CALLS[key][1] = True


def _filled(a: np.ndarray, idx: Sequence[int], slots: int, fill) -> np.ndarray:
    """``a[idx]`` followed by ``fill`` up to ``slots`` entries along axis 0."""
    out = np.full((slots,) + a.shape[1:], fill, a.dtype)
    out[:len(idx)] = a[np.asarray(idx, np.int64)]
    return out


def _part(problem: Problem, lam: np.ndarray, tau: np.ndarray, idx, slots: int):
    """The instances ``idx`` of one bucket and fillers up to ``slots``, on the host: a
    filler is an all-padding instance (mask 0) with lambda_inv 0 and tau -1, which
    ends after its first evaluation."""
    prob = Problem(*(_filled(a, idx, slots, 0) for a in
                     (problem.features, problem.labels, problem.query_ids, problem.mask)),
                   problem.num_queries)
    return prob, _filled(lam, idx, slots, 0), _filled(tau, idx, slots, -1)


def run_parts(fn, problems: tuple, lambda_invs: tuple, taus: tuple, threads: int,
              device: jax.Device | None = None, batch_size: int | None = 1):
    """``fn`` (a :func:`batched` solver) over buckets of concrete instances, ONE
    bucket per compiled call, each call of a shape that depends on the bucket's
    padded rows and query count and on the problem-count bucket only
    (:func:`bucket_calls`), the instances past a call's count fillers. So a later
    batch with other counts, other row counts in the same buckets or other buckets
    in it is served by the programs compiled before (in this process, or on this
    machine through JAX's persistent compilation cache), where one program over the
    tuple of buckets was new whenever the tuple changed.

    The calls run on ``threads`` host threads, largest buckets first and each
    program's first call before the others (a program is compiled once, the
    threads compiling different buckets' programs at the same time); the results
    are reassembled in the input order. The parts are cut on the host (NumPy): the
    batches are small, and as op-by-op JAX gathers they would each compile per
    batch shape. ``device``: where the calls run (None: the default device);
    ``batch_size``: the resolved one ``fn`` was built with."""
    problems = [jax.tree.map(np.asarray, p) for p in problems]
    lams = [np.asarray(a) for a in lambda_invs]
    taus = [np.asarray(a) for a in taus]
    tasks = []
    for j, (p, lam) in enumerate(zip(problems, lams)):
        rows = int(p.features.shape[1])
        slots, calls = bucket_calls(int(lam.shape[0]), rows, batch_size, threads)
        key = (fn, p.features.shape[1:], p.features.dtype.name, p.num_queries, slots, device)
        tasks += [(rows, key, j, idx, slots) for idx in calls]
    # Each program's first call first (the compiles start at once), then largest first.
    first = {}
    for i, t in enumerate(tasks):
        first.setdefault(t[1], i)
    order = sorted(range(len(tasks)), key=lambda i: (first[tasks[i][1]] != i, -tasks[i][0]))
    order = [tasks[i] for i in order]
    # jax.enable_x64 and jax.default_device are per thread: the workers take the
    # caller's x64 setting and ``device``.
    x64 = bool(jax.config.jax_enable_x64)

    # The shared pool may be larger than ``threads`` (an earlier call asked for more):
    # at most ``threads`` solves run at once, as asked.
    gate = threading.Semaphore(threads)

    def call(task):
        _, key, j, idx, slots = task
        part = _part(problems[j], lams[j], taus[j], idx, slots)
        with gate, jax.enable_x64(x64), _on(device):
            lock = _first_call(key)
            with lock or contextlib.nullcontext():
                prob, lam, tau = jax.device_put(part, device)
                out = jax.device_get(fn((prob,), (lam,), (tau,))[0])
            _called(key)
        return jax.tree.map(lambda a: a[:len(idx)], out)

    outs = (map(call, order) if threads == 1 or len(order) == 1
            else _thread_pool(threads).map(call, order))
    merged: list = [None] * len(problems)
    for (_, _, j, idx, _), out in zip(order, outs):
        if merged[j] is None:
            count = lams[j].shape[0]
            merged[j] = jax.tree.map(lambda a, c=count: np.empty((c,) + a.shape[1:], a.dtype),
                                     out)
        for dst, src in zip(jax.tree.leaves(merged[j]), jax.tree.leaves(out)):
            dst[np.asarray(idx, np.int64)] = src
    return jax.device_put(tuple(merged), device)


# XLA options wanted for the augmented Lagrangian's batched program, per backend.
# On CPU the program is ~1,100 small fusions in while-loop bodies; with jaxlib 0.10
# XLA's MLIR fusion emitters spend ~2 s more of a cold call on them than the classic
# emitters (k = 8 default batch: 7.7-7.9 against 5.8-6.1 s in fresh processes), for
# runs 0-17% slower. jaxlib 0.11 and later have only the
# fusion emitters and refuse the option ("No such compile option"), so each option is
# used only where this jaxlib accepts it (:func:`compiler_options`). Per executable,
# so nothing global changes for the user's programs. Not for the projected solver:
# its vmapped program with the classic emitters and --xla_backend_optimization_level=0
# (the test suite's setting) ran for minutes where either alone took 3-5 s.
COMPILER_OPTIONS = {"cpu": {"xla_cpu_use_fusion_emitters": False}}
# The jaxlib versions known to accept an option, so that no probe compiles: a refused
# probe is never cached, and every process compiled it again (one program in each
# second run on jaxlib 0.12).
_KNOWN_OPTIONS = {"xla_cpu_use_fusion_emitters": lambda version: version < (0, 11)}


@functools.lru_cache(maxsize=None)
def compiler_options(backend: str) -> dict:
    """The options of :data:`COMPILER_OPTIONS` for ``backend`` that this jaxlib's XLA
    accepts: by jaxlib version where it is known (``_KNOWN_OPTIONS``), otherwise found
    once per process by compiling a one-op program with the option."""
    accepted, probed = {}, {}
    version = tuple(int(p) for p in jaxlib.__version__.split(".")[:2])
    for name, setting in COMPILER_OPTIONS.get(backend, {}).items():
        if name not in _KNOWN_OPTIONS:
            probed[name] = setting
        elif _KNOWN_OPTIONS[name](version):
            accepted[name] = setting
    if not probed:
        return accepted
    arg = jax.ShapeDtypeStruct((), jnp.float32, sharding=jax.sharding.SingleDeviceSharding(
        jax.local_devices(backend=backend)[0]))
    lowered = jax.jit(lambda x: x + 1).lower(arg)
    for name, setting in probed.items():
        try:
            lowered.compile(compiler_options={name: setting})
        except jax.errors.JaxRuntimeError as e:
            if "No such compile option" not in str(e):
                raise
        else:
            accepted[name] = setting
    return accepted


@functools.lru_cache(maxsize=None)
def batched(method: str, sc_star: bool, options: SolverOptions | None,
             batch_size: int | None = None, backend: str = "cpu") -> Batched:
    """jit of :func:`batch_function` (the solver over a tuple of buckets), served
    from exported programs where :func:`.exported.set_export_dir` gave a folder.
    ``backend``: the platform compiled for, which picks :func:`compiler_options` (for
    the augmented Lagrangian)."""
    batch = batch_function(method, sc_star, options, batch_size)
    options_xla = compiler_options(backend) if method == "augmented_lagrangian" else {}
    return Batched(batch, jax.jit(batch, compiler_options=dict(options_xla) or None),
                   Spec(method, sc_star, options, batch_size, backend,
                        tuple(sorted(options_xla.items()))))


@functools.lru_cache(maxsize=None)
def batch_function(method: str, sc_star: bool, options: SolverOptions | None,
                   batch_size: int | None = None):
    """The solver over a tuple of buckets, ``(problems, lambda_invs, taus) -> tuple
    of Solution``, not jitted (under a caller's ``jit`` it is part of the
    caller's program, where per-executable compiler options cannot be given).
    ``batch_size`` (resolved, static): None vmaps each bucket whole, k runs
    ``lax.map`` over chunks of k vmapped instances (k = 1: one instance after
    another, no vmap; for the augmented Lagrangian all buckets through one copy of
    its loop, :func:`solve_slots`)."""
    fn = _JAX_METHODS[method]
    kwargs = {"sc_star": sc_star}
    if options is not None:
        kwargs["options"] = options

    def one(problem, lambda_inv, tau):
        return fn(problem, lambda_inv, tau, **kwargs)

    def bucket(p, lam, t):
        # batch_size 1 maps even a bucket of one: under vmap, lax.cond becomes a
        # select that runs both branches (the solver's subsample and all-rows
        # evaluations, the ray test), so a vmap of one costs more than a map.
        if batch_size is None or 1 < batch_size >= lam.shape[0]:
            return jax.vmap(one)(p, lam, t)
        return jax.lax.map(lambda a: one(*a), (p, lam, t),
                           batch_size=None if batch_size == 1 else batch_size)

    def batch(problems, lambda_invs, taus):
        # A tuple of buckets, each its own vmap or map (and so its own while_loops)
        # inside the one program (run_parts passes one bucket per call).
        with _TRACE_LOCK:  # runs only while tracing, from several solver threads at once
            trace_counts[method] += 1
        if method == "augmented_lagrangian" and batch_size == 1:
            return solve_slots(problems, lambda_invs, taus, sc_star=sc_star,
                                options=options or SolverOptions())
        return tuple(bucket(p, lam, t) for p, lam, t in zip(problems, lambda_invs, taus))

    return batch


def gather_parts(problems: tuple, lambda_invs: tuple, taus: tuple, take: tuple):
    """Per bucket, the instances ``take[j]`` (a part of the bucket); an
    index past the bucket's end gathers zeros, a filler (all padding) with
    lambda_inv 0 and tau -1."""
    def part(a, k, fill=0):
        return jnp.take(a, k, axis=0, mode="fill", fill_value=fill)

    return (tuple(jax.tree.map(lambda a, k=k: part(a, k), p) for p, k in zip(problems, take)),
            tuple(part(lam, k) for lam, k in zip(lambda_invs, take)),
            tuple(part(t, k, -1) for t, k in zip(taus, take)))


def filler_solution(n1: int, dtype, sc_star: bool) -> Solution:
    """What a skipped slot (a filler, see :func:`solve_slots`) returns; discarded."""
    z, zero, none = jnp.zeros(n1, dtype), jnp.zeros((), dtype), jnp.zeros((), jnp.int32)
    return Solution(params=Params(z, jnp.ones_like(z) if sc_star else z), status=none,
                    iterations=none, outer_iterations=none, objective=zero,
                    constraint=zero, violation=zero, multiplier=zero)


def solve_slots(problems: tuple, lambda_invs: tuple, taus: tuple, *,
                 sc_star: bool, options: SolverOptions) -> tuple:
    """The augmented Lagrangian over buckets with ONE copy of its loop in the program
    (CPU, instances one by one): ``lax.map`` over slots, each holding one instance of
    every bucket, and within a slot a ``lax.scan`` over the buckets whose solve
    reads the rows through ``lax.switch`` on the bucket. Only the evaluations of f
    (and the designs) depend on a bucket's row count, so only they are compiled
    per bucket; with a ``vmap`` or ``map`` per bucket the whole solver was, about
    0.8 s of XLA's compile per bucket on the 2-core CPU. The switch index is the
    bucket, never batched (the multi-start maps its starts here), so each evaluation
    runs one bucket's code. Slots past a bucket's count (buckets of unequal counts)
    hold fillers and are skipped by a ``lax.cond``.

    problems, lambda_invs, taus: per bucket, ``[B_j, ...]`` and ``[B_j]``. Returns a
    tuple of per-bucket :class:`Solution` batches, ``[B_j]``.
    """
    counts = [int(p.features.shape[0]) for p in problems]
    slots = max(counts)
    # Every bucket's instances, then its count (out of range: a filler) up to ``slots``.
    take = tuple(jnp.concatenate([jnp.arange(c, dtype=jnp.int32),
                                  jnp.full(slots - c, c, jnp.int32)]) for c in counts)
    valid = jnp.stack([k < c for k, c in zip(take, counts)], axis=1)  # [S, J]
    problems, lambda_invs, taus = gather_parts(problems, lambda_invs, taus, take)
    dtype = problems[0].features.dtype
    n1 = problems[0].num_classes - 1
    sizes = [options.coarse_levels(int(p.features.shape[1])) for p in problems]
    if any(sizes):
        levels = jnp.asarray([len(z) for z in sizes], jnp.int32)
    else:  # no subsample anywhere: known at trace time, no level switch at all
        levels = None

    def slot(args):
        probs, lams, ts, ok = args  # one instance of every bucket
        designs = [level_designs(p, z) for p, z in zip(probs, sizes)]
        has_rows = jnp.stack([jnp.any(p.mask > 0) for p in probs])

        def job(_, xs):
            j, lam, tau, good = xs
            evals = [level_evaluator(ds, lam) for ds in designs]
            rows = Rows(
                evaluate=lambda x, level: jax.lax.switch(
                    j, [lambda e=e: e(x, level) for e in evals]),
                value=lambda x: jax.lax.switch(
                    j, [lambda ds=ds: value(x, ds[-1], lam) for ds in designs]),
                levels=0 if levels is None else levels[j], has_rows=has_rows[j])
            return None, jax.lax.cond(
                good, lambda: multistart.solve(rows, n1, dtype, lam, tau, sc_star=sc_star,
                                        options=options, one_site=True),
                lambda: filler_solution(n1, dtype, sc_star))

        return jax.lax.scan(job, None, (jnp.arange(len(probs)), jnp.stack(lams),
                                        jnp.stack(ts), ok))[1]

    out = jax.lax.map(slot, (problems, lambda_invs, taus, valid))  # [S, J, ...]
    return tuple(jax.tree.map(lambda a, j=j, n=n: a[:n, j], out) for j, n in enumerate(counts))


def solve_batch(problem: Problem | Sequence[Problem], lambda_inv, tau, *,
                method: str = "augmented_lagrangian", sc_star: bool = False,
                options: SolverOptions | None = None, batch_size: int | None = None,
                threads: int | None = None, device: jax.Device | None = None):
    """``jit(vmap(method))`` over a batch: every array of ``problem`` has a leading
    ``[B]`` axis, ``lambda_inv`` and ``tau`` are ``[B]``. One compilation per (padded
    rows, num_queries, dtype, instances per call, method, sc_star, options,
    batch_size); data, lambda_inv, tau and B itself are not part of it
    (:func:`run_parts`), so changing them never recompiles. Padded rows must have
    mask 0.

    batch_size: instances per vmap (:func:`resolve_batch_size`; None: 1 on CPU, all
    on accelerators). With k < B the batch runs as ``lax.map`` over chunks of k;
    every choice gives the same solutions (a test compares them), only the speed
    differs.

    ``problem`` may also be a sequence of batched problems (buckets, each padded to
    its own N), with ``lambda_inv`` and ``tau`` sequences of matching ``[B_j]``
    arrays: each bucket is solved by a compiled program of its own and a tuple of
    :class:`Solution` is returned. Under a caller's ``jit`` (traced arguments) all
    buckets are part of the caller's program instead (with ``batch_size`` 1, the CPU
    default, the augmented Lagrangian then solves every bucket with one copy of its
    loop: :func:`solve_slots`; the same solutions, a test compares them). Under vmap
    every instance pays for the batch's padded N and for its slowest instance's
    iterations, so grouping problems of similar size saves both (see
    ``sc_jax.calibration.numpy_fit.fit_batch``).

    threads: host threads that make the calls (:func:`resolve_threads`; None: on CPU
    one per core, else 1); the solutions are the same as with ``threads=1`` (a test
    compares them). A multi-start batch (``options.num_starts`` > 1) runs on one
    thread: concurrent calls can deadlock in XLA's CPU thread pool.

    device: where the batch is solved (:func:`fit_device` chooses one); None: JAX's
    default device, as the inputs are. Otherwise the inputs are put on ``device``
    and the solver compiled for and run there, under ``jax.default_device``; the
    batch size, the threads and the compiler options are those of its platform.
    Only for concrete inputs (not under ``jit``).
    """
    if method not in _JAX_METHODS:
        raise ValueError(f"unknown JAX solver {method!r}; choose one of "
                         f"{tuple(_JAX_METHODS)} (or 'scipy' through sc_jax.calibration.numpy_fit.fit)")
    backend = jax.default_backend() if device is None else device.platform
    fn = batched(method, sc_star, options, resolve_batch_size(batch_size, backend), backend)
    threads = resolve_threads(threads, backend)
    if options is not None and options.num_starts > 1:
        # While the multi-start vmapped its starts on a CPU too, its matrix products
        # were batched and large enough for XLA's CPU backend to split over its Eigen
        # thread pool, and two such calls made at once from two host threads
        # deadlocked in that pool (batches of 48 or 96 starts hung on 2 threads every
        # time, with no CPU used after the compile). It is a known XLA CPU hang on
        # vmapped programs, avoided elsewhere with --xla_cpu_multi_thread_eigen=false,
        # a flag a library must not set for its user. A CPU now maps the starts, and
        # 2 threads ran three such batches without a hang, but no faster (7 float64
        # 96-start fits: 1.6-2.4 s against 1.9 s on one thread), so a multi-start
        # batch's calls are still made one after another: an accelerator's batch
        # (starts vmapped) keeps the hang's conditions.
        threads = 1
    single = isinstance(problem, Problem)
    if single:
        problem, lambda_inv, tau = (problem,), (lambda_inv,), (tau,)
    problem, lambda_inv, tau = tuple(problem), tuple(lambda_inv), tuple(tau)
    if not (len(problem) == len(lambda_inv) == len(tau)):
        raise ValueError(f"{len(problem)} buckets but {len(lambda_inv)} lambda_inv and "
                         f"{len(tau)} tau arrays")
    leaves = jax.tree.leaves((problem, lambda_inv, tau))
    traced = any(isinstance(a, jax.core.Tracer) for a in leaves)
    if device is not None and traced:
        raise ValueError("device is for concrete inputs; under jit the caller places them")
    if traced:  # the caller's program: every bucket in it
        out = batch_function(method, sc_star, options,
                             resolve_batch_size(batch_size, backend))(problem, lambda_inv, tau)
    else:
        out = run_parts(fn, problem, lambda_inv, tau, threads, device,
                        resolve_batch_size(batch_size, backend))
    return out[0] if single else out
