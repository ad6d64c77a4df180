"""Each option's accepted range, defined once.

:class:`sc_jax.experiment.protocol.config.RunConfig`, the API's constructors
(:class:`sc_jax.scoring.memory.MemoryPolicy` behind
:class:`sc_jax.scoring.engine.ScoringEngine`, :func:`sc_jax.models.loading.load_model`)
and the command line check their values here, so a value that a later step would refuse
is refused before any model is loaded or any prompt scored, with the same line whichever
door it came through. Each line names the field and its command-line option.

Imports nothing heavy: the scoring, model and experiment layers all use it.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import numbers
import re
from typing import Literal, get_args

#: The largest k a run accepts: the paper's largest is 16. Above a few dozen, the k-shot
#: prompt outgrows small models' context windows and a run compiles for minutes before
#: its first score, so a typo such as --shots 100 is refused instead.
MAX_SHOTS = 32

#: The least device memory accepted: below it no model's weights and activations fit,
#: and a figure that small is a unit typo (1KiB for 1GiB).
MIN_DEVICE_MEMORY = 64 << 20

#: Largest lambda_inv accepted: beyond it the penalty's weight overflows float32 in the
#: solver (1e39 did, giving INVALID_INPUT and overflow warnings); the objective is long
#: flat in lambda_inv well before it.
LAMBDA_MAX = 1e30

#: The dtypes a model is loaded in, by name. Half precision (float16) is left out: its
#: 5-bit exponent overflows in the attention logits of the larger models, and bfloat16
#: has float32's range at the same cost.
DType = Literal["float32", "bfloat16"]
DTYPES: tuple[DType, ...] = get_args(DType)


@dataclasses.dataclass(frozen=True)
class Range:
    """An option's range: a number (an integer where ``integer``) in ``[lo, hi]``
    (``hi_open``: ``[lo, hi)``); ``option`` is its command-line flag, ``why`` what the
    line adds where the reason is not obvious."""

    option: str
    lo: float | None = None
    hi: float | None = None
    integer: bool = True
    hi_open: bool = False
    why: str = ""
    #: The line's tail for a value out of range, where the bounds alone read badly
    #: ("{value}" is filled in).
    out_of_range: str = ""

    def bounds(self) -> str:
        if self.hi is None:
            return "0 or more" if self.lo == 0 else f"at least {self.lo:g}"
        close = ")" if self.hi_open else "]"
        return f"in [{self.lo:g}, {self.hi:g}{close}"

    def problem(self, value) -> str | None:
        """What is wrong with ``value`` (None: nothing)."""
        # bool is an int in Python; True for a count is a mistake, not 1.
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            return f"must be {'an integer' if self.integer else 'a number'}, got {value!r}"
        if math.isnan(value):  # passes every comparison that refuses by "<"
            return f"must be a number {self.bounds()}, got nan"
        if self.integer and not isinstance(value, numbers.Integral):
            # 4.0 too: it would name files "k4.0" and fail in range() much later
            return f"must be an integer, got {value!r}"
        low = self.lo is not None and value < self.lo
        high = self.hi is not None and (value >= self.hi if self.hi_open else value > self.hi)
        if (low or high) and self.out_of_range:
            return self.out_of_range.format(value=value)
        if low or high:
            shown = int(value) if self.integer else f"{value:g}"
            return f"must be {self.bounds()}{self.why}, got {shown}"
        return None


RANGES: dict[str, Range] = {
    "shots": Range("--shots", 2, MAX_SHOTS,
                   why=" (SC needs a held-out demonstration; the paper uses 4, 8 and 16)"),
    "seeds": Range("--seed-list", 0),
    "seed": Range("--seed", 0),
    "test_seed": Range("--test-seed", 0),
    "test_size": Range("--test-size", 1),
    "max_size": Range("--max-size", 1),
    "m_cap": Range("--m-cap", 1),
    "budget": Range("--budget", 1),
    # RunConfig fields with no command-line flag: the line names none.
    "bc_batch": Range("RunConfig only", 1),
    "dc_strings": Range("RunConfig only", 1),
    "max_tokens_per_batch": Range("--max-tokens-per-batch", 1),
    "max_cache_tokens": Range("--max-cache-tokens", 1),
    "mesh_devices": Range("--mesh", 1),
    "mesh_model": Range("--mesh", 1),
    "device_memory": Range("--device-memory", MIN_DEVICE_MEMORY, out_of_range=(
        "of {value} bytes is below 64 MiB, too small for any model: give the memory per "
        "device, e.g. 80GiB (a bare number is GiB)")),
    # The API's budget (ScoringEngine, MemoryPolicy) takes any positive figure: a tiny
    # model's plan fits in kilobytes, so the command line's 64 MiB floor (a unit typo
    # there) is not the API's.
    "device_memory_bytes": Range("bytes per device", 1),
    "lambda_inv": Range("--lambda-inv", 0, LAMBDA_MAX, integer=False,
                        why=" (beyond it the penalty's weight overflows float32)"),
    "tau": Range("--tau", -1, 1, integer=False, hi_open=True,
                 why=" (-1 turns the trust region off; at 1 it admits only b = 0, which its "
                     "smoothed cosine never reaches, so every fit would end INFEASIBLE: use "
                     "e.g. 0.9999)"),
    "k": Range("--k", 2, 8, why=" (the demo's built-in sentences hold 8 demonstrations)"),
}


def check(name: str, value, *, field: str | None = None):
    """``value`` once it lies in ``RANGES[name]``; else ValueError naming the field
    (``field``, default ``name``) and its option. None passes (unset)."""
    if value is None:
        return value
    rng = RANGES[name]
    problem = rng.problem(value)
    if problem:
        raise ValueError(f"{field or name} ({rng.option}) {problem}")
    return value


def check_dtype(dtype, *, option: str = "--dtype") -> str:
    """A model dtype's name, once it is one of :data:`DTYPES`."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype ({option}) must be one of {', '.join(DTYPES)}, got {dtype!r}")
    return dtype


def memory_size(text: str) -> int:
    """'80GiB', '24GB', '512MiB', '60' -> bytes: a bare number is GiB (device memory is
    quoted in GiB; GB and GiB both mean 2**30 here), 'B' names bytes. ValueError for
    anything else."""
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([KMGT]?)(i?B)?\s*", text)
    if not m:
        raise ValueError(f"not a memory size: {text!r} (e.g. 80GiB, or 80 for GiB)")
    unit = m.group(2).upper() if (m.group(2) or m.group(3)) else "G"
    scale = {"": 1, "K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}[unit]
    try:
        value = int(float(m.group(1)) * scale)
    except (ValueError, OverflowError):
        raise ValueError(f"not a memory size: {text!r} (e.g. 80GiB)") from None
    if value < 1:
        raise ValueError(f"memory size must be positive, got {text!r}")
    return value


def arg_type(name: str, cast=int):
    """An argparse ``type`` that casts and checks against ``RANGES[name]``: the parser
    refuses the value with the same line as the API."""
    def parse(text: str):
        try:
            value = cast(text)
        except ValueError:
            kind = "an integer" if cast is int else "a number"
            raise argparse.ArgumentTypeError(f"must be {kind}, got {text!r}") from None
        problem = RANGES[name].problem(value)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value

    parse.__name__ = name  # argparse names the type in its messages
    return parse
