"""A run's ``results.json``: its typed records (:class:`RunResults` and the rows, fits,
splits and timings it holds, each with ``to_json`` / ``from_json``), read and checked
before any table or plot is made from it (:func:`load_results`), and the display names
of the methods it may hold (:data:`METHOD_NAMES`).

The run builds these records and writes ``RunResults.to_json()`` once; every reader
takes a :class:`RunResults`. The checks (:func:`results_problem`,
:func:`rows_against_config`) read the parsed JSON before it is typed, so that a bad
file gets one line naming its key or row.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

from sc_jax.calibration import methods as calibration_methods
from sc_jax.calibration.baselines import BC_BATCH_SIZE
from sc_jax.calibration.defaults import DEFAULT_LAMBDA_INV
from sc_jax.models.identity import ModelDescription, describe_named
from sc_jax.models.named_models import display_name, named_model

#: Each method's display name ("sc" -> "SC (guard)": the run's --guard fit; "sc_paper" ->
#: "SC (paper)"; "bc_reference" -> "BC (code)"), in the registry's order.
METHOD_NAMES: Mapping[str, str] = calibration_methods.View("display")  # live: a method registered later is in it


def load_results(path: str | Path) -> RunResults:
    """The :class:`RunResults` of ``path`` (a run's output directory or its
    results.json), checked: a ValueError of one line naming the file and what is wrong
    with it (not JSON, a key or row missing or of the wrong type, rows that disagree
    with the config), FileNotFoundError where there is no results.json."""
    path = Path(path)
    if path.is_dir():
        path = path / "results.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: pass the output directory of a run (the folder holding results.json)")
    try:
        res = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        if path.name != "results.json":  # another file given for the run's directory
            raise ValueError(f"{path} is a file, not a run's output directory: pass the folder "
                             "holding results.json (or results.json itself)") from None
        raise ValueError(f"{path} is not valid JSON ({e}); re-run `sc-jax run` to regenerate it") from e
    problem = results_problem(res)
    if problem:
        raise ValueError(f"{path} is not an sc_jax results file: {problem}")
    problem = rows_against_config(res)
    if problem:
        raise ValueError(f"{path}: {problem}; the tables would not be those of its config: "
                         "rerun the `sc-jax run` command of its config with the same --out to "
                         "rewrite it (every score is read from the cache)")
    try:
        return RunResults.from_json(res)
    except ValueError as e:
        raise ValueError(f"{path} is not an sc_jax results file: {e}") from None


def _row_name(r: dict) -> str:
    return f"(method {r['method']}, dataset {r['dataset']}, k {r['shots']}, seed {r['seed']})"


def rows_against_config(res: dict) -> str | None:
    """What makes the rows of ``res`` (a results.json that passed
    :func:`results_problem`) disagree with its config, naming the row; None when they
    agree. A run writes one row per method, dataset, k and seed, for every seed of
    ``config.seeds``: a repeated row would be averaged in twice, a missing seed would
    leave a method's mean over fewer seeds than the header says, a seed the config
    does not list was not part of the run, and a method of config ``methods`` with no
    rows would drop out of the tables without a word."""
    cfg = res["config"]
    seeds = cfg["seeds"]
    if not isinstance(seeds, (list, tuple)) or not seeds or any(_wrong(s, int) for s in seeds):
        return f"config 'seeds' is {seeds!r}, not a list of whole numbers"
    listed = {"dataset": cfg.get("datasets"), "shots": cfg.get("shots")}
    seen, groups = set(), defaultdict(set)
    for r in res["rows"]:
        if r["seed"] not in seeds:
            return f"row {_row_name(r)} has a seed that config 'seeds' {list(seeds)} does not list"
        for key, values in listed.items():  # older results.json may lack them: not checked
            if isinstance(values, (list, tuple)) and r[key] not in values:
                return (f"row {_row_name(r)} has a {key} that config "
                        f"'{key if key == 'shots' else 'datasets'}' {list(values)} does not list")
        key = (r["method"], r["dataset"], r["shots"], r["seed"])
        if key in seen:
            return f"row {_row_name(r)} appears more than once"
        seen.add(key)
        groups[key[:3]].add(r["seed"])
    for (method, dataset, k), have in sorted(groups.items()):
        for s in seeds:
            if s not in have:
                name = _row_name(dict(method=method, dataset=dataset, shots=k, seed=s))
                return f"row {name} is missing (config 'seeds' {list(seeds)})"
    return _method_without_rows(cfg.get("methods"), groups)


def _method_without_rows(methods, groups) -> str | None:
    """A method of config ``methods`` (older results.json may lack it: not checked)
    with no row on a (dataset, k) that has rows (a skipped one has none), which the
    tables would silently leave out; ``groups`` is keyed by (method, dataset, k)."""
    if not isinstance(methods, (list, tuple)):
        return None
    for dataset, k in sorted({key[1:] for key in groups}):
        for method in methods:
            if (method, dataset, k) not in groups:
                return (f"method {method!r} of config 'methods' {list(methods)} has no row "
                        f"for dataset {dataset}, k {k}")
    return None


# What the tables and plots read from results.json: config keys, and per row / SC
# param the keys and their types (bool is excluded from the numbers).
_CONFIG_KEYS = ("model", "seeds", "test_size", "mode", "solver")
_ROW_KEYS = {"dataset": str, "shots": int, "method": str, "seed": int,
             "accuracy": float, "macro_f1": float, "ece": float}
_PARAM_KEYS = {"method": str, "dataset": str, "shots": int, "size": int, "w": list, "b": list}


def _wrong(value, kind) -> bool:
    if kind is float:
        return isinstance(value, bool) or not isinstance(value, (int, float))
    if kind is int:
        return isinstance(value, bool) or not isinstance(value, int)
    return not isinstance(value, kind)


def results_problem(res) -> str | None:
    """What makes ``res`` (parsed results.json) unusable for
    :func:`sc_jax.experiment.reporting.report.write_report`, in a few words naming the key or the
    row; None when it is usable."""
    if not isinstance(res, dict):
        return f"a JSON {type(res).__name__}, not an object"
    if not isinstance(res.get("config"), dict) or not isinstance(res.get("rows"), list):
        return "no 'config' object or no 'rows' list"
    missing = [k for k in _CONFIG_KEYS if k not in res["config"]]
    if missing:
        return f"config has no {missing[0]!r}"
    for what, items, keys in (("rows", res["rows"], _ROW_KEYS),
                              ("params", res.get("params") or [], _PARAM_KEYS)):
        if not isinstance(items, list):
            return f"{what!r} is not a list"
        for j, item in enumerate(items):
            if not isinstance(item, dict):
                return f"{what}[{j}] is not an object"
            if what == "params" and item.get("method") != calibration_methods.subject():
                continue  # only the subject's (SC's) parameters are plotted
            for key, kind in keys.items():
                if key not in item:
                    return f"{what}[{j}] has no {key!r}"
                if _wrong(item[key], kind):
                    return f"{what}[{j}][{key!r}] is {item[key]!r}, not {'a number' if kind is float else kind.__name__}"
                if kind is list and any(_wrong(v, float) for v in item[key]):
                    return f"{what}[{j}][{key!r}] holds a value that is not a number"
            if what == "rows" and item["method"] not in METHOD_NAMES:
                return f"rows[{j}] has an unknown method {item['method']!r}"
            if what == "rows":
                for key in ("accuracy", "macro_f1", "ece"):  # fractions, each in [0, 1]
                    if not 0.0 <= item[key] <= 1.0:
                        return f"rows[{j}][{key!r}] is {item[key]!r}, not a fraction in [0, 1]"
    if not res["rows"]:
        return "'rows' is empty: the run recorded no result"
    return None


# ------------------------------------------------------------------ typed records
# Each record's fields are results.json's keys in the order the run writes them
# (the file is json.dumps of to_json, so a new run's bytes are what they were). A key
# an older file lacks is read as the field's default and named in ``absent``; keys a
# newer version added are kept in ``extra``: to_json gives back the dict it was read
# from, so every run on disk loads and re-serialises as it is.


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Record:
    """A record of results.json: its fields are the JSON object's keys, ``absent`` the
    optional keys the object it was read from lacked (not written back), ``extra`` the
    keys this version does not know (written back as they were)."""

    absent: frozenset[str] = dataclasses.field(default=frozenset(), repr=False)
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d, where: str | None = None) -> Self:
        """The record of ``d`` (its JSON object); a ValueError naming ``where`` (the
        key's path in results.json, e.g. ``timing['seeds'][0]``; None for the file
        itself) and the key when ``d`` is not an object or lacks a key the record
        cannot do without."""
        name = where or cls.__name__
        if not isinstance(d, dict):
            raise ValueError(f"{name} is not an object")
        values, absent = {}, set()
        for f in _json_fields(cls):
            if f.name not in d:
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    raise ValueError(f"{name} has no {f.name!r}")
                absent.add(f.name)
                continue
            values[f.name] = _read(f, d[f.name], f"{where}[{f.name!r}]" if where else f.name)
        names = {f.name for f in _json_fields(cls)}
        return cls(**values, absent=frozenset(absent),
                   extra={k: v for k, v in d.items() if k not in names})

    def replace(self, **changes) -> Self:
        """A copy with ``changes``, each then written (no longer ``absent``)."""
        return dataclasses.replace(self, absent=self.absent - changes.keys(), **changes)

    def to_json(self) -> dict[str, Any]:
        """The JSON object results.json holds (what :meth:`from_json` read back)."""
        out = {f.name: _written(getattr(self, f.name)) for f in _json_fields(type(self))
               if f.name not in self.absent}
        out.update(self.extra)
        return out


def _json_fields(cls) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if f.name not in ("absent", "extra")]


def _read(f: dataclasses.Field, value, where: str):
    """One JSON value as field ``f`` holds it: a record (``metadata["record"]``) or a
    tuple of them, a JSON list as a tuple where the field is one."""
    kind = f.metadata.get("record")
    if value is None or not str(f.type).startswith("tuple"):
        return kind.from_json(value, where) if kind and value is not None else value
    if not isinstance(value, list):
        raise ValueError(f"{where} is not a list")
    return tuple(kind.from_json(v, f"{where}[{j}]") if kind else v for j, v in enumerate(value))


def _written(value):
    if isinstance(value, _Record):
        return value.to_json()
    if isinstance(value, tuple):
        return [_written(v) for v in value]
    return value


def _records(kind) -> dict:
    return {"metadata": {"record": kind}}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ResultRow(_Record):
    """One method on one (dataset, shots k, seed): its test accuracy, macro-F1 and ECE
    (fractions). ``model``: the run's ``--model`` (None in files made before it was kept
    per row: the config's)."""

    dataset: str
    model: str | None = None
    shots: int
    method: str
    seed: int
    accuracy: float
    macro_f1: float
    ece: float

    def metric(self, name: str) -> float:
        """``accuracy``, ``macro_f1`` or ``ece`` by name (the tables loop over them)."""
        if name not in METRICS:
            raise ValueError(f"no metric {name!r}; choose from {', '.join(METRICS)}")
        return getattr(self, name)


#: The metrics of a :class:`ResultRow`.
METRICS = ("accuracy", "macro_f1", "ece")


@dataclasses.dataclass(frozen=True, kw_only=True)
class FitRecord(_Record):
    """One SC-family fit of one (dataset, k, seed, size): its class-wise ``b`` and
    ``w`` ([n - 1] each, exact float64), solver ``status`` (a
    :class:`sc_jax.calibration.solvers.Status` name), trust-region ``tau``,
    ``lambda_inv``, ``objective``, the LLM's in-sample ``base_accuracy``, the surrogate
    ``rows`` and whether the guard fitted SC* (``guarded``). Defaults: what files made
    before a key was kept mean by its absence."""

    dataset: str
    shots: int
    seed: int
    size: int
    method: str
    b: list[float] | None = None
    w: list[float] | None = None
    status: str = "CONVERGED"
    tau: float = math.nan
    lambda_inv: float = math.nan
    objective: float = math.nan
    base_accuracy: float = math.nan
    rows: int = 0
    guarded: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class SplitRecord(_Record):
    """One seed's split: its demonstrations' dataset rows and its test set's size and
    hash (:meth:`sc_jax.experiment.protocol.splits.Split.test_hash`)."""

    dataset: str
    shots: int
    seed: int
    demo_indices: list[int] | None = None
    test_size: int | None = None
    test_hash: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class SkippedSetting(_Record):
    """A (dataset, k) the run skipped (more classes than demonstrations)."""

    dataset: str
    shots: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class CacheCounts(_Record):
    """The score cache's hits, misses and corrupt entries over the run."""

    hits: int = 0
    misses: int = 0
    corrupt: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class SeedTiming(_Record):
    """Where one seed's scoring time went (seconds): ``compile_s`` (JAX compiles;
    ``programs`` compiled, of them ``model_programs``, and ``cache_hits`` from the
    persistent compilation cache), ``forward_s`` (the forward calls on the device),
    ``host_s`` (everything else: prompts, the schedule, each call's arrays, the score
    cache and files), adding up to ``wall_s``; ``engine_host_s`` the engine's own host
    time; ``calls``, ``tokens`` and ``executed_tokens`` (padding included); the
    engine's last ``shape``; ``attention``, the packed calls' attention, and
    ``attention_trials``, the candidates timed to choose it (``{name, seconds}`` each;
    empty where nothing was timed), ``attention_from_cache`` where the decision was
    read back from an earlier run's."""

    dataset: str
    shots: int
    seed: int
    wall_s: float
    compile_s: float
    programs: int = 0
    model_programs: int = 0
    cache_hits: int = 0
    forward_s: float
    host_s: float
    engine_host_s: float = 0.0
    calls: int = 0
    tokens: int = 0
    executed_tokens: int = 0
    shape: dict | None = None
    attention: str | None = None
    attention_trials: tuple[dict, ...] = ()
    attention_from_cache: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class FitTiming(_Record):
    """The SC fits of one (dataset, k) over ``seeds``: ``wall_s`` split in
    ``compile_s`` (``programs`` compiled, ``cache_hits`` from the persistent cache) and
    ``solve_s``, for ``problems`` fits."""

    dataset: str
    shots: int
    seeds: list[int]
    wall_s: float
    compile_s: float
    solve_s: float
    programs: int = 0
    cache_hits: int = 0
    problems: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunTiming(_Record):
    """Where a run's wall time ``total_s`` went (seconds; files made before a part was
    timed lack it, read as None): ``load_s`` (data, the up-front check and the model),
    ``scoring_s`` (every seed, split in ``compile_s``, ``forward_s`` and ``host_s``),
    ``fitting_s`` (split in ``fit_compile_s`` and ``fit_solve_s``), ``metrics_s``,
    ``report_s`` (tables, plots, records and results.json), ``unaccounted_s`` (the
    wall time outside them); the compile counts summed over the seeds; and the records
    of every seed and every fit."""

    total_s: float | None = None
    load_s: float | None = None
    scoring_s: float | None = None
    compile_s: float | None = None
    forward_s: float | None = None
    host_s: float | None = None
    fitting_s: float | None = None
    fit_compile_s: float | None = None
    fit_solve_s: float | None = None
    metrics_s: float | None = None
    report_s: float | None = None
    unaccounted_s: float | None = None
    model_programs: int | None = None
    programs: int | None = None
    cache_hits: int | None = None
    seeds: tuple[SeedTiming, ...] = dataclasses.field(default=(), **_records(SeedTiming))
    fits: tuple[FitTiming, ...] = dataclasses.field(default=(), **_records(FitTiming))


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunResults(_Record):
    """A run's results.json: ``config`` (the :class:`~sc_jax.experiment.protocol.config.RunConfig`
    as JSON), the ``lambda_inv`` its fits used, the model's identity
    (:func:`sc_jax.models.identity.files_identity`), ``model_source`` (what was
    read) and ``model_description`` (what the model is: name, variant, quantisation as
    stored, the dtype it ran in, where it came from; a
    :class:`sc_jax.models.identity.ModelDescription` as a dict), package ``versions``, one :class:`ResultRow` per (method, dataset, k, seed),
    one :class:`FitRecord` per fit, one :class:`SplitRecord` per seed, the skipped
    (dataset, k), the notes, the :class:`RunTiming`, per dataset the file's rows left
    out for a blank text (1-based), the score cache's counts, the processes, devices and
    mesh (``runtime``) and the memory policy
    (:class:`sc_jax.scoring.memory.MemoryPolicy` as a dict).

    Read one with :func:`load_results` (checked); the accessors below give the config's
    settings with what files made before a setting existed meant by its absence."""

    config: dict[str, Any]
    lambda_inv: float | None = None
    model_identity: str | None = None
    model_source: str | None = None
    model_description: dict[str, Any] | None = None
    versions: dict[str, str] = dataclasses.field(default_factory=dict)
    rows: tuple[ResultRow, ...] = dataclasses.field(**_records(ResultRow))
    params: tuple[FitRecord, ...] = dataclasses.field(default=(), **_records(FitRecord))
    splits: tuple[SplitRecord, ...] = dataclasses.field(default=(), **_records(SplitRecord))
    skipped: tuple[SkippedSetting, ...] = dataclasses.field(default=(), **_records(SkippedSetting))
    notes: tuple[str, ...] = ()
    timing: RunTiming | None = dataclasses.field(default=None, **_records(RunTiming))
    left_out_rows: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    cache: CacheCounts | None = dataclasses.field(default=None, **_records(CacheCounts))
    runtime: dict[str, Any] | None = None
    memory_policy: dict[str, Any] | None = None
    #: Per dataset, the task and data the run read
    #: (:meth:`sc_jax.experiment.tasks.spec.Dataset.record`): template, label words, columns, content-free inputs, chat template, source and the
    #: rows' sha256, which `report --log-samples` checks the data against.
    tasks: dict[str, Any] | None = None

    @property
    def model(self) -> str:
        return self.config["model"]

    @property
    def seeds(self) -> list[int]:
        return list(self.config["seeds"])

    @property
    def datasets(self) -> list[str]:
        """The config's datasets ([] in files made before they were listed)."""
        return list(self.config.get("datasets") or [])

    @property
    def shots(self) -> list[int]:
        """The config's shot counts ([] in files made before they were listed)."""
        return list(self.config.get("shots") or [])

    @property
    def test_size(self) -> int:
        return self.config["test_size"]

    @property
    def mode(self) -> str:
        return self.config["mode"]

    @property
    def solver(self) -> str:
        return self.config.get("solver", "augmented_lagrangian")

    @property
    def guard(self) -> str:
        """The run's guard; "none" (the paper's SC) in files made before it existed."""
        return self.config.get("guard", "none")

    @property
    def tau(self) -> float | None:
        return self.config.get("tau")

    @property
    def size_weighting(self) -> str:
        return self.config.get("size_weighting", "uniform")

    @property
    def bc_batch(self) -> int:
        return int(self.config.get("bc_batch", BC_BATCH_SIZE))

    @property
    def fit_lambda_inv(self) -> float:
        """The lambda_inv the run's fits used (the default where the file lacks it)."""
        return DEFAULT_LAMBDA_INV if self.lambda_inv is None else self.lambda_inv

    @property
    def config_lambda_inv(self) -> float | None:
        """The lambda_inv as the tables show it: the fits', else the config's."""
        return self.config.get("lambda_inv") if "lambda_inv" in self.absent else self.lambda_inv

    def rows_of(self, dataset: str, shots: int, seed: int) -> list[ResultRow]:
        """The rows of one (dataset, k, seed)."""
        return [r for r in self.rows if (r.dataset, r.shots, r.seed) == (dataset, shots, seed)]


def model_description(results: RunResults) -> ModelDescription | None:
    """What the run's model is: results.json's ``model_description``, else, in files
    made before it was written, a named model's from its table (the run's ``--model``
    and dtype), else None."""
    described = ModelDescription.from_json(results.model_description)
    if described is not None:
        return described
    named = named_model(str(results.model))
    return None if named is None else describe_named(named, results.config.get("dtype", "float32"))


def model_label(results: RunResults) -> str:
    """The model as the tables' captions and the plots' titles name it: its name,
    variant, stored quantisation and run dtype ("SmolLM2-135M-Instruct Q4_1 GGUF,
    dequantised to float32"); the ``--model`` given where nothing more is known."""
    described = model_description(results)
    return display_name(str(results.model)) if described is None else described.label
