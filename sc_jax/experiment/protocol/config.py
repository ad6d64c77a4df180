"""A run's configuration (:class:`RunConfig`, paper Section 4.1 and Appendix A): the
methods, datasets, shots, seeds, solver settings and memory knobs, checked when it is
built, and the memory policy it resolves to (:func:`run_policy`), the one object the
engine, the up-front check and ``sc-jax plan`` share.

Each option is declared once, on its field: its type (a ``Literal`` names the choices),
its default, its range (:data:`sc_jax.runtime.ranges.RANGES`, under the field's name)
and its command-line flags (:class:`Flag`), from which :mod:`sc_jax.cli.parser`
generates the options of ``sc-jax run`` and ``sc-jax plan``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import numbers
import os
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, NamedTuple, get_args

import numpy as np

from sc_jax.runtime import ranges
from sc_jax.runtime.ranges import DType
from sc_jax.runtime.sharding import parse_mesh
from sc_jax.calibration import methods as calibration_methods
from sc_jax.calibration.numpy_fit import Guard
from sc_jax.calibration.solvers.types import Solver
from sc_jax.experiment.protocol.splits import DEFAULT_TEST_SEED
from sc_jax.experiment.tasks.spec import TASKS, read_task_file
from sc_jax.scoring.memory import MemoryPolicy

# The methods are those of the registry (sc_jax.calibration.methods: one module each,
# with its display name, colour, the scores it needs and its fit); these names are
# derived from it when this module loads. A method registered later (a module of your
# own) is a choice of --methods too: RunConfig checks the registry when it is built.
METHODS: tuple[str, ...] = calibration_methods.names()
# Run only when named in --methods (Surprise Calibration trains a network per seed).
OPT_IN_METHODS: tuple[str, ...] = tuple(m.name for m in calibration_methods.registered() if m.opt_in)
DEFAULT_METHODS: tuple[str, ...] = tuple(m for m in METHODS if m not in OPT_IN_METHODS)


def sc_fits(methods=None) -> dict:
    """Per SC-family method (of ``methods``, else every registered one): (SC* or not,
    its tau, its guard), None for the run's tau and guard."""
    return {m.name: (m.sc_fit.sc_star, m.sc_fit.tau, m.sc_fit.guard) for m in calibration_methods.registered()
            if m.sc_fit is not None and (methods is None or m.name in methods)}



# The run's guard (sc_jax.calibration.numpy_fit.fit_batch): SC* for a size whose surrogate data
# the LLM scores below chance. A deviation from the paper, chosen on the development
# tasks (Rotten Tomatoes, SST-2, AG News; seeds 100-104; benchmarks/real_eval/README.md),
# where the paper's fit reverses the LLM at those sizes; guard="none" is the paper's SC.
DEFAULT_GUARD = "bias_only"


LabelMode = Literal["first_token", "sequence"]
LABEL_MODES: tuple[LabelMode, ...] = get_args(LabelMode)

# How SC's ensemble weighs the sizes: uniformly (the paper) or by min(P(k, i)(k - i), 15000),
# size i's full surrogate row count before the budget (the reference code).
SizeWeighting = Literal["uniform", "reference"]
SIZE_WEIGHTINGS: tuple[SizeWeighting, ...] = get_args(SizeWeighting)


@dataclasses.dataclass(frozen=True)
class Flag:
    """One command-line flag of a :class:`RunConfig` field. ``sc-jax run`` and ``sc-jax
    plan`` are generated from these (:func:`sc_jax.cli.parser.add_config_options`), and
    :func:`sc_jax.cli.commands.run_config` reads them back with :func:`flag_fields`.

    name: the flag; help: its help text (``--help`` appends the default).
    parse: one value's text -> the value (a ValueError's message is the refusal); None:
    the field's own type. kind: "value", "list" (values given with spaces or commas),
    "append" (one value per repeat) or "switch" (no value); None: "list" for a tuple
    field, "switch" for a bool one, else "value". to_fields: (the parsed value, the
    fields read so far) -> the fields it sets; None: ``{field: value}``. default: the
    field's default -> the flag's (None: the field's own). A field's first flag always
    applies; a later one overrides it where given (neither None nor False).
    """

    name: str
    help: str
    parse: Callable[[str], Any] | None = None
    kind: str | None = None
    to_fields: Callable[[Any, dict], dict] | None = None
    default: Callable[[Any], Any] | None = None

    @property
    def dest(self) -> str:
        return self.name.lstrip("-").replace("-", "_")


def _option(default, *flags: Flag, ranged: bool = False):
    """A RunConfig field: its default, its command-line flags (none: the API only) and,
    where ``ranged``, its range ``RANGES[its name]``, checked value by value."""
    return dataclasses.field(default=default, metadata={"flags": flags, "ranged": ranged})


def _expand_datasets(names) -> tuple:
    """``("all",)`` as the nine tasks (:data:`sc_jax.experiment.tasks.spec.TASKS`), any other
    list as it is."""
    return tuple(TASKS) if tuple(names) == ("all",) else tuple(names)


def _task_files(files, fields) -> dict:
    """``--task-file`` FILEs, their tasks added to ``--dataset``'s (or, where it is not
    given, the only datasets)."""
    files = tuple(files or ())
    if not files:
        return {"task_files": files}
    seen = set()
    for f in files:
        if Path(f).resolve() in seen:
            raise ValueError(f"task file {f} is given twice (--task-file): give each file once")
        seen.add(Path(f).resolve())
    # Two files defining one name: _check_task_files names both files.
    names = tuple(dict.fromkeys(read_task_file(f).name for f in files))
    given = _expand_datasets(fields["datasets"]) if "datasets" in fields else ()
    return {"task_files": files, "datasets": given + tuple(n for n in names if n not in given)}


def _data_files(files, fields) -> dict:
    """``--data-file`` FILE (the first dataset's) or NAME=FILE as (dataset, file) pairs."""
    first = _expand_datasets(fields.get("datasets", RunConfig.datasets))[0]
    return {"data_files": tuple(tuple(f.split("=", 1)) if "=" in f else (first, f) for f in files)}


def _mesh_fields(mesh, fields) -> dict:
    """``--mesh`` (data, model) as the two fields (data 0: no data axis given)."""
    return {} if mesh is None else {"mesh_devices": mesh[0] or None, "mesh_model": mesh[1]}


MODEL_HELP = ("a named model ('default' = smollm2-135m, qwen2.5-0.5b, gemma3-270m; `sc-jax info` "
              "lists them), a HF model dir, a .gguf file, random:<preset>, random:PATH (always "
              "random weights: the config.json and tokenizer.json of directory PATH, its weights "
              "never read), or a Hugging Face id org/name[@REVISION] from the local hub cache "
              "(downloaded into it when the hub is reachable and HF_HUB_OFFLINE is unset)")
DTYPE_HELP = "dtype of the model's weights and activations"


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Everything a run depends on (written into results.json; :meth:`from_json` reads
    it back). A list field takes a list, a tuple or one value (``datasets="sst2"``)."""

    model: str = _option("default", Flag("--model", MODEL_HELP))
    dtype: DType = _option("float32", Flag("--dtype", DTYPE_HELP))
    datasets: tuple[str, ...] = _option(("rotten_tomatoes",), Flag(
        "--dataset", "task names (sc_jax.experiment.tasks.spec.TASKS), or 'all' for the nine; "
                     "rotten_tomatoes works offline (default: rotten_tomatoes, or only the "
                     "--task-file tasks where one is given)",
        default=lambda _: None, to_fields=lambda names, _: {} if names is None else {"datasets": names}))
    # Tasks defined in YAML/JSON files (sc_jax.experiment.tasks.spec.read_task_file); each
    # file's task must be among `datasets` (the command line adds it there).
    task_files: tuple[str, ...] = _option((), Flag(
        "--task-file", "a task defined in a YAML or JSON file (template, labels, columns, its "
                       "data_file or hf_id; docs/experiment.md), run beside --dataset's tasks or "
                       "alone; may be repeated", kind="append", to_fields=_task_files))
    data_files: tuple[tuple[str, str], ...] = _option((), Flag(
        "--data-file", "local CSV/JSONL/Parquet for a dataset: FILE (first dataset) or NAME=FILE; "
                       "may be repeated", kind="append", to_fields=_data_files))
    data_dir: str | None = _option(None, Flag(
        "--data-dir", "directory with DIR/<dataset>.jsonl (or .csv, .parquet) for every "
                      "dataset without a --data-file, e.g. the nine in shared/datasets"))
    # None: the task's own column names, else "text" and "label"
    # (sc_jax.experiment.tasks.loading.load_task).
    text_column: str | None = _option(None, Flag(
        "--text-column", "column of the texts in --data-file / --data-dir files (default: the "
                         "task's own name, else 'text')"))
    label_column: str | None = _option(None, Flag(
        "--label-column", "column of the labels in those files (default: the task's own name, "
                          "else 'label')"))
    strict_data: bool = _option(False, Flag(
        "--strict-data", "refuse a dataset with rows whose text is empty or whitespace-only "
                         "(by default they are left out of every draw, with a warning, and "
                         "listed in results.json)"))
    shots: tuple[int, ...] = _option((4, 8), Flag("--shots", "k, demonstrations per prompt"),
                                     ranged=True)
    seeds: tuple[int, ...] = _option(
        (0, 1, 2, 3, 4),
        Flag("--seeds", "number of seeds (0..N-1)", kind="value", default=len,
             to_fields=lambda n, _: {"seeds": tuple(range(n))}),
        Flag("--seed-list", "explicit seeds (overrides --seeds)", default=lambda _: None),
        ranged=True)
    methods: tuple[str, ...] = _option(DEFAULT_METHODS, Flag(
        "--methods", "the methods to run and report (spaces or commas between them)"))
    test_size: int = _option(256, Flag("--test-size", "held-out test queries per seed"),
                             ranged=True)
    # One test set per dataset, drawn from this seed and kept across seeds (the
    # paper's protocol); None redraws it with every seed.
    test_seed: int | None = _option(
        DEFAULT_TEST_SEED,
        Flag("--test-seed", "seed of the one test set per dataset, the same for every seed "
                            "(the paper's protocol)"),
        Flag("--per-seed-test-sets", "redraw the test set with every seed instead",
             kind="switch", to_fields=lambda on, _: {"test_seed": None}),
        ranged=True)
    mode: LabelMode = _option("first_token", Flag(
        "--mode", "label scoring: first token, or full label sequence"))
    chat_template: bool = _option(False, Flag(
        "--chat-template", "wrap each prompt in the model's own chat template (an instruction-"
                           "tuned model's): demonstrations and query in the user turn, the label "
                           "after the assistant turn's opening"))
    max_size: int = _option(5, Flag("--max-size", "sub-context sizes i = 1..min(this, k-1)"),
                            ranged=True)
    lambda_inv: float | None = _option(None, Flag(
        "--lambda-inv", "invariance weight (default: "
                        "sc_jax.calibration.defaults.DEFAULT_LAMBDA_INV, 0.1)"), ranged=True)
    tau: float | None = _option(None, Flag(
        "--tau", "trust-region cosine (default: the paper's schedule from in-sample "
                 "accuracy)"), ranged=True)
    # "none": SC as the paper fits it; "bias_only": SC* (with the trust region) for a
    # size whose surrogate data the LLM scores below chance; "bias_only_free": the
    # same with SC* unconstrained (sc_jax.calibration.numpy_fit.fit_batch).
    guard: Guard = _option(DEFAULT_GUARD, Flag(
        "--guard", "none: SC as the paper fits it; bias_only: SC* (w = 1, with the trust "
                   "region) for a size whose surrogate data the LLM scores below chance (a "
                   "deviation from the paper, chosen on development tasks; "
                   "benchmarks/real_eval/README.md); bias_only_free: the same with SC* "
                   "unconstrained (tau = -1; the same as bias_only unless --tau is fixed: "
                   "the schedule gives tau = -1 below chance)"))
    solver: Solver = _option("augmented_lagrangian", Flag(
        "--solver", "SC's solver: augmented_lagrangian or projected (batched, in JAX), or "
                    "scipy (a float64 reference, one problem at a time)"))
    budget: int | None = _option(5000, Flag(
        "--budget", "surrogate (context, query) pairs per size; contexts sampled uniformly "
                    "above it"), ranged=True)
    m_cap: int = _option(24, Flag("--m-cap", "cap on test-time sub-contexts m_i per size"),
                         ranged=True)
    size_weighting: SizeWeighting = _option("uniform", Flag(
        "--size-weighting", "ensemble over sizes: uniform (paper) or min(P(k,i)(k-i), 15000), "
                            "the full surrogate row count of size i before --budget (reference "
                            "code)"))
    # Devices on the data axis (None: no mesh unless mesh_model > 1) and on the model
    # axis (weights sharded when > 1), both given by --mesh.
    mesh_devices: int | None = _option(None, Flag(
        "--mesh", "device mesh data=D,model=M: batches split over D devices, weights over "
                  "M (heads, MLP width, vocabulary); a bare number is data=N (default: one "
                  "device)", parse=parse_mesh, to_fields=_mesh_fields), ranged=True)
    mesh_model: int = _option(1, ranged=True)
    max_tokens_per_batch: int | None = _option(None, Flag(
        "--max-tokens-per-batch", "padded tokens per forward call (default: planned from the "
                                  "device's memory)"), ranged=True)
    device_memory: int | None = _option(None, Flag(
        "--device-memory", "memory per device, e.g. 80GiB, 24GB or 512MiB; a bare number is "
                           "GiB (default: the device's own figure; on CPU the host's memory)",
        parse=ranges.memory_size), ranged=True)
    # The API only: BC's batch (sc_jax.calibration.baselines.batch_calibration) and
    # DC's random in-domain strings per seed.
    bc_batch: int = _option(128, ranged=True)
    dc_strings: int = _option(20, ranged=True)

    def __post_init__(self):
        self._as_tuples()
        self._check_types()
        self._check_choices()
        if not self.datasets:
            raise ValueError(f"datasets ({_option_names('datasets')}) is empty: give at least one")
        if not self.shots:
            raise ValueError(f"shots ({_option_names('shots')}) is empty: give at least one k")
        if not self.seeds:
            raise ValueError(f"seeds ({_option_names('seeds')}) is empty: at least one seed is needed")
        # A value given twice would be run (or reported) twice and counted as two:
        # means and intervals "over 4 seeds" from 2.
        for name in ("seeds", "methods", "shots", "datasets"):
            values = getattr(self, name)
            twice = sorted({v for v in values if list(values).count(v) > 1}, key=str)
            if twice:
                raise ValueError(f"{name} ({_option_names(name, lists=True)}) list "
                                 f"{', '.join(map(str, twice))} more than once in {list(values)}; "
                                 "give each once")
        # Every range up front (sc_jax.runtime.ranges): each of these would otherwise run without
        # a word and record a value it did not use (m_cap 0 still draws one sub-context),
        # or fail only after the model was loaded and every seed scored (lambda_inv 1e40).
        for f in dataclasses.fields(self):
            if f.metadata.get("ranged"):
                value = getattr(self, f.name)
                for v in value if isinstance(value, tuple) else (value,):
                    ranges.check(f.name, v)
        if self.budget is not None and self.budget < max(self.shots):
            # Below k, the largest size i = k - 1 keeps fewer than its k contexts (one held-out
            # demonstration each): a demonstration's class can go unseen, and the fit failed
            # only after all the scoring, without naming --budget.
            raise ValueError(f"budget (--budget) must be at least the largest --shots k = "
                             f"{max(self.shots)} (each size's surrogate data must hold every "
                             f"demonstration out at least once), got {self.budget}")
        self._check_data_files()
        self._check_task_files()

    def _as_tuples(self):
        """Lists as tuples (a list would make the frozen config unhashable); one name or
        number given for a list field as a list of one (``datasets="sst2"`` is one
        dataset, not four letters); ``datasets="all"``: the nine tasks."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "data_files":
                if not (isinstance(value, (list, tuple))
                        and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in value)):
                    raise ValueError(f"data_files takes (dataset, file) pairs, got {value!r}")
                value = tuple(tuple(pair) for pair in value)
            elif not field_type(f.name).many:
                continue
            elif isinstance(value, (str, int, float)):
                value = (value,)
            elif isinstance(value, np.ndarray):  # seeds=np.arange(5)
                value = value.tolist()
            elif not isinstance(value, (list, tuple)):
                raise ValueError(f"{f.name} must be a list or tuple, got {value!r}")
            object.__setattr__(self, f.name, tuple(value))
        object.__setattr__(self, "datasets", _expand_datasets(self.datasets))

    def _check_types(self):
        """Every value of its field's type, in one line naming the field: a bool is a
        bool (the string "false" is refused, never read as true), a number not a bool
        or a string, a path a string or path-like (kept as its string); None only
        where the field takes it (an unset value)."""
        hints = typing.get_type_hints(RunConfig)
        for f in dataclasses.fields(self):
            if f.name == "data_files":
                continue  # (dataset, file) pairs: _as_tuples checked their shape
            item, choices, many = field_type(f.name)
            if choices:
                continue  # _check_choices names the choices
            value = getattr(self, f.name)
            optional = type(None) in get_args(hints[f.name])
            values = value if many else (value,)
            fixed = []
            for v in values:
                if item is str and isinstance(v, os.PathLike):
                    v = os.fspath(v)
                elif item is int and isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)):
                    v = int(v)  # a NumPy integer is an integer
                ok = (v is None and optional and not many) or (
                    isinstance(v, bool) if item is bool else
                    isinstance(v, int) and not isinstance(v, bool) if item is int else
                    isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)) if item is float else
                    isinstance(v, str))
                if not ok and f.metadata.get("ranged") and item in (int, float):
                    ok = True  # sc_jax.runtime.ranges checks these, in its own words
                if not ok:
                    kind = {bool: "true or false", int: "an integer", float: "a number",
                            str: "a string"}.get(item, item.__name__)
                    raise ValueError(f"{f.name} ({_option_names(f.name)}) must be {kind}"
                                     f"{' (a list of them)' if many else ''}{' or None' if optional else ''}, "
                                     f"got {type(v).__name__} {v!r}")
                fixed.append(v)
            object.__setattr__(self, f.name, tuple(fixed) if many else fixed[0])

    def _check_choices(self):
        """Every field typed by a ``Literal`` holds its values only."""
        for f in dataclasses.fields(self):
            choices, many = field_type(f.name)[1:]
            value = getattr(self, f.name)
            bad = [v for v in (value if many else (value,)) if v not in choices]
            if choices and bad:
                raise ValueError(f"{f.name} ({_option_names(f.name)}) must be one of "
                                 f"{', '.join(choices)}, got {', '.join(map(repr, bad))}")

    def _check_data_files(self):
        known = set(self.datasets)
        names = [name for name, _ in self.data_files]
        for name in sorted({n for n in names if names.count(n) > 1}):
            files = [f for n, f in self.data_files if n == name]
            raise ValueError(f"--data-file gives {len(files)} files for {name!r} ({', '.join(files)}); "
                             "give one per dataset")
        for name, file in self.data_files:
            if not str(file).strip():
                raise ValueError(f"--data-file {name}= names no file: give {name}=FILE (a .jsonl, "
                                 ".csv or .parquet file)")
            if name not in known:
                raise ValueError(f"--data-file given for {name!r}, which is not among the datasets")

    def _check_task_files(self):
        """Every task file read (a bad one is refused here, before any model loads), its
        task among the datasets, no name given twice or taken from a built-in task."""
        names = {}
        for file in self.task_files:
            name = read_task_file(file).name
            if name in TASKS:
                raise ValueError(f"task file {file} names its task {name!r}, a built-in task's name: "
                                 "rename it (field 'name')")
            if name in names:
                raise ValueError(f"task files {names[name]} and {file} both define task {name!r}: "
                                 "rename one (field 'name')")
            if name not in self.datasets:
                raise ValueError(f"task file {file} defines task {name!r}, which is not among the "
                                 "datasets: add it to datasets")
            names[name] = file

    def sizes(self, k: int) -> list[int]:
        return list(range(1, min(self.max_size, k - 1) + 1))

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, source: Mapping | str | Path) -> RunConfig:
        """The configuration that :meth:`to_json` gave.

        Args:
          source: that dict (lists where it holds tuples, as JSON has them), or the path
            of a JSON file holding it (a run's ``run_config.json``).

        Returns:
          The RunConfig; a field left out takes its default (a file written before the
          field existed).

        Raises:
          ValueError: one line for an unknown key, a file that cannot be read or is not a
            JSON object, or a value its field refuses.
        """
        where = "RunConfig.from_json"
        if not isinstance(source, Mapping):
            where = str(source)
            try:
                source = json.loads(Path(source).read_text(encoding="utf-8"))
            except OSError as e:
                raise ValueError(f"{where} cannot be read ({e.strerror or e}): name a run's "
                                 "run_config.json") from None
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise ValueError(f"{where} is not JSON ({e}): name a run's run_config.json") from None
        if not isinstance(source, Mapping):
            raise ValueError(f"{where} holds a {type(source).__name__}, not a RunConfig's JSON "
                             "object of fields")
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(source) - set(known), key=str)
        if unknown:
            raise ValueError(f"{where}: unknown RunConfig field(s) {', '.join(map(str, unknown))}; "
                             f"the fields are {', '.join(known)}")
        return cls(**source)


class FieldType(NamedTuple):
    """A RunConfig field's value type, read from its annotation: ``item`` (int, float,
    str or bool: of each value, for a list), ``choices`` (a ``Literal``'s, else ()) and
    ``many`` (a list field, a tuple once built)."""

    item: type
    choices: tuple
    many: bool


def field_type(name: str) -> FieldType:
    """The value type of RunConfig field ``name`` (:class:`FieldType`); ``methods``'
    choices are the registry's as it is now (a method registered after import is one)."""
    if name == "methods":
        return FieldType(str, calibration_methods.names(), True)
    return _annotated_type(name)


@functools.cache
def _annotated_type(name: str) -> FieldType:
    hint = typing.get_type_hints(RunConfig)[name]
    many = typing.get_origin(hint) is tuple
    if many:
        hint = get_args(hint)[0]
    # X | None: X (None is the unset value, never given on the command line)
    args = [a for a in get_args(hint) if a is not type(None)]
    if args and typing.get_origin(hint) is not Literal:
        hint = args[0]
    if typing.get_origin(hint) is Literal:
        return FieldType(type(get_args(hint)[0]), get_args(hint), many)
    return FieldType(hint if isinstance(hint, type) else str, (), many)


def flags(name: str) -> tuple[Flag, ...]:
    """The command-line flags of field ``name`` (none: the API only, or set by another
    field's flag, as ``mesh_model`` by --mesh)."""
    return RunConfig.__dataclass_fields__[name].metadata["flags"]


def flag_kind(name: str, flag: Flag) -> str:
    """How ``flag`` of field ``name`` takes its value: :attr:`Flag.kind`, else "list"
    for a list field, "switch" for a bool one, "value" for the rest."""
    item, _, many = field_type(name)
    return flag.kind or ("list" if many else "switch" if item is bool else "value")


def _option_names(name: str, *, lists: bool = False) -> str:
    """The flags that name field ``name`` in a refusal (``lists``: those giving its
    values as a list, where it has one such); the range's own where it has no flag."""
    own = flags(name)
    listed = [f for f in own if lists and flag_kind(name, f) == "list"]
    names = [f.name for f in listed or own]
    return ", ".join(names) if names else ranges.RANGES[name].option


def flag_fields(values: Mapping[str, Any]) -> dict[str, Any]:
    """The RunConfig fields that parsed flags give (``values``: by each flag's dest, as
    argparse's namespace holds them): each field's first flag applies, a later one
    overrides it where given; a field with no flag keeps its default."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(RunConfig):
        for i, flag in enumerate(flags(f.name)):
            value = values[flag.dest]
            if i == 0 or (value is not None and value is not False):
                out.update(flag.to_fields(value, out) if flag.to_fields else {f.name: value})
    return out


def run_policy(config: RunConfig, *, n_devices: int | None = None,
               model_shards: int | None = None, agree: bool = True) -> MemoryPolicy:
    """The run's memory policy (:class:`sc_jax.scoring.memory.MemoryPolicy`): its
    ``device_memory`` (else the device's figure, else the host's, not enforced), its
    mesh (``n_devices`` / ``model_shards``: the loaded model's, where known) and its
    ``max_tokens_per_batch``. The engine, the up-front check and ``sc-jax plan`` all
    take this one object (``agree``: see :meth:`MemoryPolicy.resolve`)."""
    return MemoryPolicy.resolve(
        config.device_memory, n_devices=n_devices or config.mesh_devices or 1,
        model_shards=model_shards or config.mesh_model,
        max_tokens_per_batch=config.max_tokens_per_batch, agree=agree)
