"""The calibration-method protocol: what a method is (:class:`Method`) and the one
registry every stage reads (:func:`register`, :func:`get`, :func:`names`).

A method declares its name, display name and colour; the scores it needs
(:data:`NEEDS`); how it predicts a seed's test probabilities from them; and, for the SC
family, the fit it takes (:class:`SCFit`, batched over a (dataset, k)'s seeds and sizes
by the run). The run's choices (``--methods``), the engine's extra jobs, the score
files, ``regenerate_samples``, the tables and the colours are derived from the
registry: a new method is one module that calls :func:`register` (docs/methods.md).

The seed's scores reach ``predict`` as :class:`sc_jax.experiment.protocol.jobs.SeedScores` (read
by attribute: ``base``, ``cc``, ``dc``, ``surrogate``, ``test``, ``loo``, ``hidden``,
``demo_labels``, ``surrogate_contexts``); nothing here imports the experiment stage.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Callable

import numpy as np

__all__ = ["NEEDS", "Method", "PredictOptions", "SCFit", "View", "get", "markdown_table", "names", "paired",
           "paper_baselines", "register", "registered", "subject", "unregister"]

#: The scores a method may need: the k-shot prompt of the test queries ("k_shot"),
#: of the content-free inputs ("content_free") and of DC's in-domain strings ("domain");
#: SC's surrogate prompts ("surrogate") and test-time sub-contexts ("test"); LOOC's
#: leave-one-out prompts ("loo"); the surrogate and test prompts' last hidden states
#: ("hidden"); and the SC fits of the run ("sc_fit", :class:`SCFit`).
NEEDS = frozenset({"k_shot", "content_free", "domain", "surrogate", "test", "loo", "hidden", "sc_fit"})


@dataclasses.dataclass(frozen=True)
class SCFit:
    """An SC-family fit (:func:`sc_jax.calibration.numpy_fit.fit_batch`): SC* (w = 1)
    or the full map, its tau (None: the run's) and its guard (None: the run's)."""

    sc_star: bool = False
    tau: float | None = None
    guard: str | None = None


@dataclasses.dataclass(frozen=True)
class PredictOptions:
    """The run's settings a method's prediction may read: BC's batch, SC's size
    weighting and the shot count k."""

    bc_batch: int = 128
    size_weighting: str = "uniform"
    shots: int | None = None


@dataclasses.dataclass(frozen=True)
class Method:
    """One calibration method.

    ``predict(scores, fits, sizes, options) -> [T, n]`` probabilities of the seed's T
    test queries (``fits``: size -> FitResult for an SC-family method, else None;
    ``sizes``: the run's sub-context sizes). ``needs``: a subset of :data:`NEEDS`.
    ``sc_fit``: the SC fit it predicts with. ``opt_in``: run only when named in
    ``--methods`` (Surprise trains a network per seed). ``added``: newer than some
    runs on disk, so that a run resumed with it is the same run with more rows.
    ``available(scores, run_methods)``: whether a finished run's score files let it be
    computed again (``sc-jax report --log-samples``); None: always.

    Roles in the report (each read through :func:`subject`, :func:`paired` and
    :func:`paper_baselines`, so that no stage branches on a method's name):
    ``subject``: the method the run is about (one at most; SC): its fits are the ones
    plotted and noted, its bars and lines marked, and its rows compared with the
    others'; ``paired``: compared with the subject query by query and in the margin
    table (BC in both forms); ``paper_baseline``: among the baselines the subject is
    compared with as "the best baseline" (the paper's Base, CC, DC and BC)."""

    name: str
    display: str
    colour: str
    predict: Callable[[Any, dict | None, list, PredictOptions], np.ndarray]
    needs: frozenset = frozenset({"k_shot"})
    sc_fit: SCFit | None = None
    opt_in: bool = False
    added: bool = False
    available: Callable[[Any, tuple], bool] | None = None
    doc: str = ""
    subject: bool = False
    paired: bool = False
    paper_baseline: bool = False

    def __post_init__(self):
        object.__setattr__(self, "needs", frozenset(self.needs))
        unknown = sorted(self.needs - NEEDS)
        if unknown:
            raise ValueError(f"method {self.name!r}: unknown needs {unknown}; the needs are {sorted(NEEDS)}")
        if not self.name or not self.name.replace("_", "").isalnum() or self.name != self.name.lower():
            raise ValueError(f"method name {self.name!r}: use lower-case letters, digits and '_'")
        if (self.sc_fit is not None) != ("sc_fit" in self.needs):
            raise ValueError(f"method {self.name!r}: sc_fit and the need 'sc_fit' go together")


_REGISTRY: dict[str, Method] = {}


def register(method: Method, *, replace: bool = False) -> Method:
    """Add ``method`` to the registry (its order is the tables'); a name already taken
    is refused unless ``replace``, and so is a second subject. Returns the method."""
    if method.name in _REGISTRY and not replace:
        raise ValueError(f"method {method.name!r} is registered already (replace=True to replace it)")
    other = subject()
    if method.subject and other not in (None, method.name):
        raise ValueError(f"method {method.name!r}: {other!r} is the subject method already (one at most)")
    _REGISTRY[method.name] = method
    return method


def unregister(name: str) -> None:
    """Remove a method (a test's own, when it is done)."""
    _REGISTRY.pop(name, None)


def get(name: str) -> Method:
    """The registered method ``name``; ValueError naming the registered ones."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; the methods are {', '.join(_REGISTRY)}") from None


def names() -> tuple[str, ...]:
    """Every registered method's name, in registration order."""
    return tuple(_REGISTRY)


def registered() -> tuple[Method, ...]:
    """Every registered method, in registration order."""
    return tuple(_REGISTRY.values())


def subject() -> str | None:
    """The name of the method the report is about (``Method.subject``; SC), or None."""
    return next((m.name for m in _REGISTRY.values() if m.subject), None)


def paired() -> tuple[str, ...]:
    """The methods the subject is compared with query by query (``Method.paired``)."""
    return tuple(m.name for m in _REGISTRY.values() if m.paired)


def paper_baselines() -> tuple[str, ...]:
    """The baselines of the "best baseline" comparison (``Method.paper_baseline``)."""
    return tuple(m.name for m in _REGISTRY.values() if m.paper_baseline)


def markdown_table() -> str:
    """The registry as docs/methods.md shows it: per method its id, display name,
    needs, SC fit and whether it is opt-in (a test keeps the page in step)."""
    lines = ["| `--methods` | in tables | needs | SC fit | opt-in |", "|---|---|---|---|---|"]
    for m in registered():
        fit = "" if m.sc_fit is None else (
            ("SC*" if m.sc_fit.sc_star else "SC") + (f", tau {m.sc_fit.tau:g}" if m.sc_fit.tau is not None else "")
            + (f", guard {m.sc_fit.guard}" if m.sc_fit.guard else ""))
        lines.append(f"| `{m.name}` | {m.display} | {', '.join(sorted(m.needs))} | {fit} | "
                     f"{'yes' if m.opt_in else ''} |")
    return "\n".join(lines) + "\n"


class View(Mapping):
    """method id -> one attribute of each registered method (``"display"``,
    ``"colour"``), live: a method registered after import is in it, in the registry's
    order."""

    def __init__(self, attribute: str):
        self.attribute = attribute

    def __getitem__(self, method: str):
        if method not in _REGISTRY:
            raise KeyError(method)
        return getattr(_REGISTRY[method], self.attribute)

    def __iter__(self):
        return iter(tuple(_REGISTRY))

    def __len__(self) -> int:
        return len(_REGISTRY)

