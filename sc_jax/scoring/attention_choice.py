"""Which packed attention (:mod:`sc_jax.models.attention`) a run's model program uses,
chosen by measurement on the device it runs on. The one place that decides it: a
scoring engine asks :class:`EngineAttention` per call shape, which decides
(:func:`choose_attention`), builds the model program with the decision and falls back
(:func:`fallbacks`) where it does not compile or run; the model only runs the name it
is handed (:data:`sc_jax.models.attention.REGISTRY`).

What is fastest depends on the device, its libraries and the call shape: a fused kernel
may not build on one CUDA release, the block-sparse XLA path pays per tile what a kernel
does not, and the dense path scores every key but in a few large products. So on an
accelerator ``"auto"`` times every candidate (:func:`candidates`) on one layer at the
run's call shape, checks its output against ``"dense"`` on the same input, and keeps
the fastest that compiled, ran and agreed (:func:`choose_attention`). The decision is
kept in a small JSON file beside JAX's persistent compilation cache, keyed by device
kind, jax version, dtype, the model's attention geometry and the call shape, so a
second process on the same machine reads it instead of timing again. On a CPU ``"auto"``
is the block-sparse path without timing (measured the faster there:
``benchmarks/RESULTS.md``).

The layer's input is a packed call of the shape's ``B`` rows (per device), ``W`` new
tokens and ``cache`` cached keys, laid out as the engine lays out a middle depth of
the trie: four slots of ``cache / 4`` keys per row, each partly filled, and items of
about ``W / 8`` tokens packed end to end after them, each continuing one slot.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import json
import logging
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from sc_jax.models import attention as attn
from sc_jax.models import pallas_attention, pallas_tpu_attention
from sc_jax.runtime import multihost
from sc_jax.scoring.packing import PackShape

log = logging.getLogger(__name__)

#: The file, in the cache folder, that keeps the decisions.
CHOICES_FILE = "attention_choices.json"
#: Largest difference from ``"dense"`` a candidate may show on the layer's input, per
#: activation dtype: float32 rounding of two softmax orders (~1e-6 on outputs O(1)),
#: bfloat16's 8 significant bits (2^-8 of the output, the probabilities rounded too).
TOLERANCE = {"float32": 1e-4, "bfloat16": 3e-2, "float16": 1e-2}


@dataclasses.dataclass(frozen=True)
class Trial:
    """One candidate timed on one layer: whether it ``compiled`` and ``ran``, its
    median ``seconds`` per layer call, its largest difference from ``"dense"`` over
    the real tokens (``max_diff``, against ``tolerance``), and the ``error`` that
    stopped it, if any (its first line)."""

    name: str
    compiled: bool = False
    ran: bool = False
    seconds: float | None = None
    max_diff: float | None = None
    tolerance: float | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return (self.compiled and self.ran and self.max_diff is not None
                and self.max_diff <= self.tolerance)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def candidates(platform: str, dtype, devices: int = 1) -> tuple[str, ...]:
    """The implementations worth timing on a backend: on a GPU the Pallas kernel (Triton;
    on one device: XLA has no rule to split a Pallas call over a mesh, so it would
    gather the whole batch onto every device), cuDNN's fused kernel (16-bit floats
    only), the block-sparse and the dense XLA paths; on a TPU the Pallas kernel
    (Mosaic; one device, as on a GPU) and the XLA paths; on a CPU the block-sparse
    path alone."""
    if platform == "cpu":
        return ("blocked",)
    names = []
    if platform in ("gpu", "cuda", "tpu") and devices == 1 and "pallas" in attn.IMPLEMENTATIONS:
        names.append("pallas")
    if platform in ("gpu", "cuda") and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16):
        names.append("cudnn")
    return tuple(names) + ("blocked", "dense")


def layer_call(config, dtype, shape: PackShape, *, rows: int | None = None, seed: int = 0):
    """The inputs of one layer's packed attention at ``shape``: ``(q [b, W, H, Dh], k, v
    [b, W, K, Dh], ck, cv [b, cache, K, Dh])`` and the call's
    :class:`sc_jax.models.attention.PackedTokens` (``[b, W]`` and ``[b, cache]``), with
    ``b = rows`` (default ``shape.B``). The layout is
    the module docstring's; the values are normal draws."""
    rng = np.random.default_rng(seed)
    b, W, C = rows or shape.B, shape.W, shape.cache
    H, K, Dh = config.num_heads, config.num_kv_heads, config.head_dim
    m, S = 4, C // 4
    item = max(1, W // 8)
    seg, slot = np.full((b, W), -1, np.int32), np.zeros((b, W), np.int32)
    pos, valid = np.zeros((b, W), np.int32), np.zeros((b, W), bool)
    cpos, cvalid = np.zeros((b, C), np.int32), np.zeros((b, C), bool)
    cslot = np.repeat(np.arange(m, dtype=np.int32), S)[None].repeat(b, 0)
    for r in range(b):
        lens = rng.integers(S // 2, S + 1, m)
        for j in range(m):
            cpos[r, j * S:j * S + lens[j]] = np.arange(lens[j])
            cvalid[r, j * S:j * S + lens[j]] = True
        o, n = 0, 0
        while True:
            length = int(rng.integers(item // 2 + 1, item + item // 2 + 1))
            if o + length > W - item // 4:  # the row's end stays padding
                break
            j = min(m - 1, n * m * item // W)  # slots in order along the row
            seg[r, o:o + length], slot[r, o:o + length], valid[r, o:o + length] = n, j, True
            pos[r, o:o + length] = lens[j] + np.arange(length)
            o, n = o + length, n + 1
    key = jax.random.split(jax.random.PRNGKey(seed), 5)
    normal = lambda k, *s: jax.random.normal(k, s, jnp.float32).astype(dtype)  # noqa: E731
    arrays = (normal(key[0], b, W, H, Dh), normal(key[1], b, W, K, Dh), normal(key[2], b, W, K, Dh),
              normal(key[3], b, C, K, Dh), normal(key[4], b, C, K, Dh))
    tokens = attn.PackedTokens(pos, valid, seg, slot, cpos, cvalid, cslot)
    return arrays, attn.PackedTokens(*map(jnp.asarray, tokens))


def _layer(implementation: str, windows: bool):
    def f(q, k, v, ck, cv, tokens, window):
        inputs = attn.packed_inputs(tokens, implementation=implementation, windows=windows,
                                    platform=jax.default_backend())
        return attn.packed_attention(q, k, v, ck, cv, inputs, window, implementation=implementation)
    return jax.jit(f)


def error_line(e: BaseException) -> str:
    """An exception in one line: its type and the first line of its message."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300] if text else ''}"


def time_attention(config, dtype, shape: PackShape, names, *, rows: int | None = None,
                   repeats: int = 5) -> list[Trial]:
    """Each of ``names`` timed on one layer's packed attention at ``shape``
    (:func:`layer_call`; ``rows`` per device, default ``shape.B``): compiled, run once
    (a kernel can fail at run time), then ``repeats`` timed calls (median), its output
    compared with ``"dense"``'s over the real tokens. ``"dense"`` is the reference and
    must run. Returns one :class:`Trial` per name, in order."""
    arrays, tokens = layer_call(config, dtype, shape, rows=rows)
    wins = [w for w in config.windows if w > 0]
    window = jnp.int32(min(wins) if wins else 0)
    windows = bool(wins)
    real = np.asarray(tokens.q_valid)
    tol = TOLERANCE.get(jnp.dtype(dtype).name, 3e-2)
    want = np.asarray(_layer("dense", windows)(*arrays, tokens, window), np.float32)
    trials = []
    for name in names:
        fn = _layer(name, windows)
        try:
            compiled = fn.lower(*arrays, tokens, window).compile()
        except Exception as e:  # noqa: BLE001  (a candidate this backend cannot build)
            trials.append(Trial(name, error=error_line(e)))
            continue
        try:
            got = np.asarray(jax.block_until_ready(compiled(*arrays, tokens, window)), np.float32)
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                jax.block_until_ready(compiled(*arrays, tokens, window))
                times.append(time.perf_counter() - t)
        except Exception as e:  # noqa: BLE001  (compiled, but fails when it runs)
            trials.append(Trial(name, compiled=True, error=error_line(e)))
            continue
        if not np.isfinite(got).all():  # JSON has no infinity: no difference, an error
            trials.append(Trial(name, True, True, statistics.median(times), None, tol,
                                "the output is not finite"))
            continue
        diff = float(np.abs(got[real] - want[real]).max()) if real.any() else 0.0
        trials.append(Trial(name, True, True, statistics.median(times), diff, tol))
    return trials


def decision_key(config, dtype, shape: PackShape, rows: int, platform: str) -> str:
    """What a decision holds for: the device kind, jax's version and the attention code
    (:func:`code_digest`: a changed kernel is timed and checked again), the dtype, the
    attention geometry (heads, key/value heads, head dim, windows) and the call shape."""
    kind = jax.devices()[0].device_kind
    wins = sorted({w for w in config.windows if w > 0})
    return (f"{platform}|{kind}|jax {jax.__version__}|code {code_digest()}|"
            f"{jnp.dtype(dtype).name}|H{config.num_heads} "
            f"K{config.num_kv_heads} Dh{config.head_dim} windows{wins}|rows {rows} W {shape.W} "
            f"cache {shape.cache}")


@functools.cache
def code_digest() -> str:
    """The first 12 hex digits of the SHA-256 of the attention's source files."""
    h = hashlib.sha256()
    for module in (attn, pallas_attention, pallas_tpu_attention):
        with open(module.__file__, "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:12]


def default_cache_dir() -> str | None:
    """JAX's persistent compilation cache folder, where the decisions are kept beside
    the programs they chose; None when that cache is off."""
    return jax.config.jax_compilation_cache_dir or None


def _read(path: str) -> dict:
    try:
        with open(path) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


@contextlib.contextmanager
def _locked(path: str):
    """An advisory ``flock`` on ``path + ".lock"``: processes sharing a cache folder add
    their decisions one at a time, none lost (the kernel drops the lock of a process
    that dies)."""
    fd = os.open(path + ".lock", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _write(path: str, key: str, record: dict) -> None:
    """Add one decision to the file, atomically (a reader never sees half a file)."""
    folder = os.path.dirname(path) or "."
    tmp = None
    try:
        os.makedirs(folder, exist_ok=True)
        with _locked(path):
            data = _read(path)
            data[key] = record
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=".attention", suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1)
            os.replace(tmp, path)
            tmp = None
    except OSError as e:  # a read-only cache costs the next process a timing, not this run
        log.warning("could not keep the attention decision in %s (%s)", path, e)
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and np.isfinite(x)


def _from_record(record) -> tuple[str, list[Trial]] | None:
    """A kept decision, checked: its name an implementation, every trial whole (a
    passing one with numeric seconds, difference and tolerance), the chosen one among
    those that passed. None (time again) for anything else: a hand edit, a file of
    another version."""
    try:
        trials = [Trial(**t) for t in record["trials"]]
        name = str(record["chosen"])
    except (KeyError, TypeError):
        return None
    for t in trials:
        if t.compiled and t.ran and t.error is None and not all(
                _number(x) for x in (t.seconds, t.max_diff, t.tolerance)):
            return None
    if name not in attn.IMPLEMENTATIONS or name not in {t.name for t in trials if t.ok}:
        return None
    return name, trials


def choose_attention(config, dtype, shape: PackShape, *, platform: str | None = None,
                     rows: int | None = None, devices: int = 1, cache_dir: str | None = None,
                     repeats: int = 5) -> tuple[str, list[Trial], bool]:
    """The attention for calls of ``shape`` on this backend, ``rows`` per device over
    ``devices`` (the model's mesh): ``(name, trials, from_cache)``. On a CPU,
    ``"blocked"`` without timing (no trials). Elsewhere the fastest :func:`candidates`
    trial that is :attr:`Trial.ok`, from the decision file in ``cache_dir`` (default
    :func:`default_cache_dir`) if it holds this :func:`decision_key`, else timed now
    and kept there. In a multi-process run process 0 decides and every process uses
    its choice (the others keep no trials), so all compile the same program; an error
    there stops every process (:func:`sc_jax.runtime.multihost.on_writer`)."""
    platform = platform or jax.default_backend()
    names = candidates(platform, dtype, devices)
    if platform == "cpu":
        return names[0], [], False
    rows = rows or shape.B
    cache_dir = cache_dir if cache_dir is not None else default_cache_dir()
    key = decision_key(config, dtype, shape, rows, platform) + f"|devices {devices}"
    path = os.path.join(cache_dir, CHOICES_FILE) if cache_dir else None

    def decide():
        kept = _from_record(_read(path).get(key)) if path else None
        if kept is not None:
            return kept + (True,)
        trials = time_attention(config, dtype, shape, names, rows=rows, repeats=repeats)
        good = sorted((t for t in trials if t.ok), key=lambda t: t.seconds)
        if not good:
            raise RuntimeError("no packed attention compiled and ran on this device: " +
                               "; ".join(f"{t.name}: {t.error or t.max_diff}" for t in trials))
        if path:
            _write(path, key, {"chosen": good[0].name, "trials": [t.to_json() for t in trials]})
        return good[0].name, trials, False

    decided = multihost.on_writer(decide)
    if not multihost.is_multiprocess():
        return decided
    index = -1 if decided is None else attn.IMPLEMENTATIONS.index(decided[0])
    index = multihost.from_writer(np.asarray([index], np.int32))
    name = attn.IMPLEMENTATIONS[int(index[0])]
    return decided if decided is not None else (name, [], False)


def fallbacks(name: str, trials: list[Trial]) -> list[str]:
    """What to try after ``name`` fails to compile or run in the whole model program:
    the other trials that passed, fastest first, then the block-sparse and dense paths
    (nothing after ``"dense"``, the plain path)."""
    if name == "dense":
        return []
    order = [t.name for t in sorted((t for t in trials if t.ok), key=lambda t: t.seconds)]
    out = []
    for n in order + ["blocked", "dense"]:
        if n != name and n not in out:
            out.append(n)
    return out


#: The XLA paths need no trial run on a CPU once they compile (nothing there fails at
#: run time that compiled); every other candidate, and every path elsewhere, runs once.
_TRUSTED_ON_CPU = ("dense", "blocked")


class EngineAttention:
    """Which attention each model program of one scoring engine runs: the engine's one
    place to ask (:meth:`sc_jax.scoring.engine.ScoringEngine.compile`).

    ``requested``: ``"auto"`` or one of :data:`sc_jax.models.attention.IMPLEMENTATIONS`;
    the model (``config``, ``dtype``) runs on ``n_devices`` data devices of
    ``model_shards`` each. :meth:`decide` says what a call shape should run (for
    ``"auto"``, :func:`choose_attention` on one device's share of the call's rows);
    :meth:`settle` builds the shape's model program with it, and where that does not
    compile or run, with the next of :func:`fallbacks`, warning once. Both are kept per
    call shape, so a shape is decided and built once per engine."""

    def __init__(self, requested: str, config, dtype, *, n_devices: int = 1, model_shards: int = 1):
        if requested != "auto" and requested not in attn.IMPLEMENTATIONS:
            raise ValueError(f"attention must be 'auto' or one of {attn.IMPLEMENTATIONS}, "
                             f"got {requested!r}")
        self.requested = requested
        self._model = (config, dtype, n_devices, model_shards)
        # Filled as shapes come: program -> (name, trials, from_cache), and
        # (program, sequence) -> the attention its built program runs.
        self._decided: dict = {}
        self._settled: dict = {}

    def decide(self, shape: PackShape) -> tuple[str, list[Trial], bool]:
        """The attention for calls of ``shape``: ``(name, trials, from_cache)``."""
        if shape.program not in self._decided:
            config, dtype, n_devices, model_shards = self._model
            if self.requested == "auto":
                self._decided[shape.program] = choose_attention(
                    config, dtype, shape, rows=max(1, shape.B // n_devices),
                    devices=n_devices * model_shards)
            else:
                self._decided[shape.program] = (self.requested, [], False)
        return self._decided[shape.program]

    def settle(self, shape: PackShape, sequence: bool, build: Callable[[str, bool], None], *,
               like: PackShape | None = None, hidden: bool = False) -> str:
        """The attention the model program of calls of ``shape`` runs, built once:
        ``build(name, run)`` compiles the program with ``name`` (and, where ``run``,
        runs it once: a kernel can compile and still fail when it runs) or raises. The
        decision for ``like`` where given (a schedule's smaller calls run what its
        largest call settled on, which must be settled first), else :meth:`decide`'s;
        then its :func:`fallbacks`, each failure a warning; the last failure raises.
        ``hidden``: the program that also returns hidden states, built and kept apart."""
        key = (shape.program, sequence) + ((True,) if hidden else ())
        if key in self._settled:
            return self._settled[key]
        if like is not None:
            name, trials = self._settled[(like.program, sequence) + key[2:]], []
        else:
            name, trials, _ = self.decide(shape)
        order = [name] + fallbacks(name, trials)
        cpu = jax.default_backend() == "cpu"
        for i, cand in enumerate(order):
            try:
                build(cand, not (cpu and cand in _TRUSTED_ON_CPU))
                break
            except Exception as e:  # noqa: BLE001  (a kernel this backend cannot build or run)
                if i + 1 == len(order):
                    raise
                warnings.warn(f"attention {cand!r} does not compile or run here ({error_line(e)}); "
                              f"using {order[i + 1]!r}", RuntimeWarning, stacklevel=3)
        self._settled[key] = cand
        return cand
