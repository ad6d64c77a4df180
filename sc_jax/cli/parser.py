"""The ``sc-jax`` argument parser: every subcommand, its options and their help.

The options ``sc-jax run`` and ``sc-jax plan`` share are generated from
:class:`sc_jax.experiment.protocol.config.RunConfig`'s fields (:func:`add_config_options`), where
each is declared once: help, default, choices and range. Each option has help text, and
its default is printed once: by the formatter (:class:`HelpFormatter`), unless the help
already says what the default is.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import platform
import re

from sc_jax import __version__
from sc_jax.runtime import ranges
from sc_jax.runtime.ranges import arg_type
from sc_jax.cli import commands
from sc_jax.experiment.protocol import config as cfg
from sc_jax.experiment.protocol.config import RunConfig
from sc_jax.runtime.devices import ACCELERATOR_PEAK_FLOPS
from sc_jax.models import attention as attn

#: A help text that already names its option's default: "(default ...", "default: ...",
#: or argparse's own "%(default)s". The formatter adds none to such a text.
SAYS_DEFAULT = re.compile(r"\(default\b|\bdefault:|%\(default\)")

class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Appends an option's default to its help once: not where the help already says
    it (:data:`SAYS_DEFAULT`), nor for a default of None, an empty list or a flag's
    False. Raw descriptions: argparse would wrap the --version line at the terminal's
    width."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if (SAYS_DEFAULT.search(text) or default is None or default is False
                or (isinstance(default, (list, tuple)) and not default)
                or default is argparse.SUPPRESS
                or not (action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE))):
            return text
        shown = " ".join(map(str, default)) if isinstance(default, (list, tuple)) else str(default)
        return f"{text} (default: {shown.replace('%', '%%')})"


def _bytes(text: str) -> int:
    """``--device-memory``'s value in bytes (:func:`sc_jax.runtime.ranges.memory_size`)."""
    return _argparse_type(ranges.memory_size)(text)


def _argparse_type(parse):
    """``parse`` as an argparse type: its ValueError's message is the refusal (argparse
    would say only "invalid value")."""
    if parse in (int, float, str):
        return parse  # argparse names these itself: "invalid int value: 'x'"

    def convert(text: str):
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


def _list_type(parse, choices):
    """One word of a list option as a list: "4,8" as 4 and 8 (a list is given with spaces,
    or commas), each parsed and checked against ``choices``."""
    one = _argparse_type(parse)

    def convert(text: str) -> list:
        out = []
        for item in filter(None, (t.strip() for t in text.split(","))):
            try:
                value = one(item)
            except (TypeError, ValueError):
                raise argparse.ArgumentTypeError(f"invalid {one.__name__} value: {item!r}") from None
            if choices and value not in choices:
                raise argparse.ArgumentTypeError(f"invalid choice: {item!r} (choose from "
                                                 f"{', '.join(map(repr, choices))})")
            out.append(value)
        if not out:
            raise argparse.ArgumentTypeError(f"no value in {text!r}")
        return out

    convert.__name__ = one.__name__
    convert.choices = tuple(choices)
    return convert


class _ListAction(argparse.Action):
    """Stores the words of a list option, each a list (:func:`_list_type`), as one list."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, [v for word in values for v in word])


def _flag_arguments(name: str, flag: cfg.Flag) -> dict:
    """``add_argument``'s keywords for ``flag`` of RunConfig field ``name``: its help,
    its default (the field's) and, by its kind, its type, choices and number of values."""
    field = RunConfig.__dataclass_fields__[name]
    kind_of, kind = cfg.field_type(name), cfg.flag_kind(name, flag)
    kw = {"dest": flag.dest, "help": flag.help}
    if kind == "switch":
        return {**kw, "action": "store_true"}
    default = flag.default(field.default) if flag.default else field.default
    kw["default"] = list(default) if isinstance(default, tuple) else default
    parse = flag.parse or kind_of.item
    choices = kind_of.choices if flag is cfg.flags(name)[0] else ()
    if kind == "list":
        return {**kw, "nargs": "+", "action": _ListAction, "type": _list_type(parse, choices)}
    if kind == "append":
        return {**kw, "action": "append", "type": _argparse_type(parse)}
    return {**kw, "type": _argparse_type(parse), **({"choices": list(choices)} if choices else {})}


def add_config_options(p) -> None:
    """The options of ``sc-jax run`` and ``sc-jax plan`` that set a RunConfig field: one per
    :class:`sc_jax.experiment.protocol.config.Flag` of its fields, in their order
    (:func:`sc_jax.cli.commands.run_config` reads them back)."""
    for field in dataclasses.fields(RunConfig):
        for flag in cfg.flags(field.name):
            p.add_argument(flag.name, **_flag_arguments(field.name, flag))


def _model_options(p) -> None:
    """--model and --dtype as `run` has them, for the commands that load a model."""
    p.add_argument("--model", default=RunConfig.model, help=cfg.MODEL_HELP)
    p.add_argument("--dtype", default=RunConfig.dtype, choices=cfg.field_type("dtype").choices,
                   help=cfg.DTYPE_HELP)


def version_line() -> str:
    """``sc-jax --version``: this package and the stack it runs on (read from the
    installed metadata)."""

    def installed(name):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    stack = ", ".join(f"{n} {installed(n)}" for n in ("jax", "jaxlib", "flax", "optax", "jaxopt"))
    return f"sc-jax {__version__} ({stack}; Python {platform.python_version()})"


def _add_demo_parser(sub) -> None:
    d = sub.add_parser("demo", help="SC and the baselines fitted and scored on built-in sentences",
                       formatter_class=HelpFormatter)
    _model_options(d)
    d.add_argument("--k", type=arg_type("k"), default=4, help="number of demonstrations (2..8)")
    d.add_argument("--seed", type=arg_type("seed"), default=0,
                   help="seed of the draw of the demonstrations and the test-time sub-contexts")
    d.add_argument("--quiet", action="store_true", help="no progress bars")
    d.set_defaults(fn=commands.demo_command)


def _add_run_parser(sub) -> None:
    r = sub.add_parser("run", help="the paper's experiment: SC and the baselines",
                       formatter_class=HelpFormatter)
    add_config_options(r)
    r.add_argument("--out", default="sc_jax_run", help="output directory (also holds the score cache)")
    r.add_argument("--overwrite", action="store_true",
                   help="replace the results of another configuration in --out (without it such "
                        "a directory is refused; the score cache is kept and reused)")
    r.add_argument("--quiet", action="store_true", help="no progress bars")
    r.add_argument("--log-samples", action=argparse.BooleanOptionalAction, default=True,
                   help="write OUT/samples.jsonl (gzipped when large; on by default): per test query "
                        "its gold label, each method's probabilities and prediction, SC's per-size "
                        "probabilities; the per-query tests in table.md and reliability.png are "
                        "drawn from it, and `sc-jax report` redraws them from it. --no-log-samples: "
                        "neither the file nor what is drawn from it")
    r.set_defaults(fn=commands.run_command)


def _add_plan_parser(sub) -> None:
    pl = sub.add_parser("plan", help="dry run of `run`: pairs, tokens, FLOPs, calls, planned and "
                                     "XLA peak memory, compiles, time; no weights read, nothing scored",
                        formatter_class=HelpFormatter)
    add_config_options(pl)
    pl.add_argument("--json", default=None, help="also write the plan as JSON here")
    pl.add_argument("--overwrite", action="store_true",
                    help="replace an existing --json file that is not a plan's JSON (without it "
                         "such a file is refused; a plan's own is replaced)")
    pl.add_argument("--quiet", action="store_true", help="no per-setting progress lines")
    pl.add_argument("--peak-tflops", type=float, default=None,
                    help="device peak for the time estimate (default: --accelerator's datasheet, "
                         "the local accelerator's, or a matmul measured on this CPU)")
    pl.add_argument("--accelerator", default=None, choices=sorted(ACCELERATOR_PEAK_FLOPS),
                    help="estimate the time for this accelerator's dense bf16 peak (datasheet)")
    pl.add_argument("--mfu", type=float, default=0.4, help="model FLOPs utilisation assumed")
    pl.add_argument("--bandwidth-gbs", type=float, default=None,
                    help="device memory bandwidth in GB/s for the memory-bound parts (default: "
                         "--accelerator's datasheet, the local accelerator's, or measured here)")
    pl.add_argument("--attention", default="auto", choices=("auto",) + attn.IMPLEMENTATIONS,
                    help="the engine's attention to plan for (auto: the Pallas kernel on a GPU, "
                         "block-sparse elsewhere; the engine itself times the candidates on its "
                         "device and keeps the fastest)")
    pl.add_argument("--no-xla", action="store_true",
                    help="skip compiling the worst program for XLA's memory figure")
    pl.add_argument("--no-compile-time", action="store_true",
                    help="skip compiling every distinct model program to measure compile seconds "
                         "on this machine (minutes for a 7B model on a few CPU cores)")
    pl.set_defaults(fn=commands.plan_command)


def _add_report_parser(sub) -> None:
    rp = sub.add_parser("report", help="rebuild tables and plots from DIR/results.json",
                        formatter_class=HelpFormatter)
    rp.add_argument("dir", help="output directory of a finished `sc-jax run`")
    rp.add_argument("--log-samples", action="store_true",
                    help="first write DIR/samples.jsonl[.gz], the per-sample records, from the "
                         "run's score files and fitted parameters (no model, no refit)")
    rp.set_defaults(fn=commands.report_command)


def _add_ablate_parser(sub) -> None:
    a = sub.add_parser("ablate", help="refit SC from DIR's saved scores (no model, no forward "
                                      "pass): lambda_inv x trust region, SC-N, m_i, single sizes, guard",
                       formatter_class=HelpFormatter)
    a.add_argument("dir", help="output directory of a finished `sc-jax run`")
    a.add_argument("--lambda-inv", nargs="+", default=["0", "run", "1", "paper"],
                   help="lambda_inv grid: numbers, 'run' (the run's value) and 'paper' (the "
                        "paper's weight 10 on our mean scale)")
    a.add_argument("--m-values", type=int, nargs="+", default=None,
                   help="test-time sub-contexts per size, up to what the run scored (default: "
                        "those of 1 2 4 8 16 24 it scored; a larger value is refused)")
    a.add_argument("--solver", default=None, choices=cfg.field_type("solver").choices,
                   help="SC's solver (default: the run's)")
    a.add_argument("--guard", default=None, choices=cfg.field_type("guard").choices,
                   help="the guard of every study but the guard study (default: the run's)")
    a.add_argument("--out", default=None, help="where the tables go (default: DIR/ablation)")
    a.add_argument("--overwrite", action="store_true",
                   help="replace files by the names ablate writes in --out that no sc-jax "
                        "ablate wrote (without it such a directory is refused)")
    a.add_argument("--quiet", action="store_true", help="no progress lines")
    a.set_defaults(fn=commands.ablate_command)


def _add_info_parser(sub) -> None:
    i = sub.add_parser("info", help="list the named models and the local hub cache's, or load "
                                    "one and print its configuration",
                       formatter_class=HelpFormatter)
    i.add_argument("model", nargs="?", help=cfg.MODEL_HELP)
    i.add_argument("--dtype", default=RunConfig.dtype, choices=cfg.field_type("dtype").choices,
                   help=cfg.DTYPE_HELP)
    i.set_defaults(fn=commands.info_command)


def _add_export_tasks_parser(sub) -> None:
    e = sub.add_parser("export-tasks", help="rebuild the nine tasks' JSONL files (DIR/<task>.jsonl) "
                                            "from the Hugging Face datasets (needs sc-jax[data])",
                       formatter_class=HelpFormatter)
    e.add_argument("dir", help="directory for the files (created if missing)")
    e.add_argument("--tasks", nargs="+", default=None,
                   help="only these tasks (default: the nine; "
                        "sc_jax.experiment.tasks.export.EXPORT_SPLITS)")
    e.add_argument("--overwrite", action="store_true", help="replace files that exist in DIR")
    e.set_defaults(fn=commands.export_tasks_command)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sc-jax", description="Supervised Calibration for ICL, in JAX.",
                                formatter_class=HelpFormatter)
    p.add_argument("--version", action="version", version=version_line())
    sub = p.add_subparsers(dest="command", required=True)
    _add_demo_parser(sub)
    _add_run_parser(sub)
    _add_plan_parser(sub)
    _add_report_parser(sub)
    _add_ablate_parser(sub)
    _add_info_parser(sub)
    _add_export_tasks_parser(sub)
    return p
