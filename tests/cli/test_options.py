"""Each option of `sc-jax run` and `sc-jax plan` that sets the run's configuration is
declared once, on its RunConfig field (sc_jax.experiment.protocol.config): the parser generates
the option from it, its default is the field's, its choices the field's Literal, and
`commands.run_config` reads it back without a line of its own."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from sc_jax.cli import commands, parser
from sc_jax.experiment.protocol import config as cfg
from sc_jax.experiment.protocol.config import RunConfig
from sc_jax.experiment.tasks.spec import TASKS
from sc_jax.runtime import ranges

# The options of `run` and `plan` that are no part of the configuration: where the
# outputs go and how much is printed, and the plan's assumptions for its time estimate.
COMMAND_ONLY = {
    "run": {"out", "overwrite", "quiet", "log_samples"},
    "plan": {"json", "overwrite", "quiet", "peak_tflops", "accelerator", "mfu", "bandwidth_gbs",
             "attention", "no_xla", "no_compile_time"},
}
# RunConfig fields with no flag of their own: set by --mesh with mesh_devices, or the API only.
NO_FLAG = {"mesh_model", "bc_batch", "dc_strings"}


def _subparser(p: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def _declared() -> dict:
    """dest -> (field name, Flag, whether it is the field's first flag)."""
    return {flag.dest: (f.name, flag, i == 0) for f in dataclasses.fields(RunConfig)
            for i, flag in enumerate(cfg.flags(f.name))}


def _problems(p: argparse.ArgumentParser, command: str) -> list[str]:
    """What in ``p``'s options is not generated from one RunConfig declaration."""
    declared, out, seen = _declared(), [], set()
    fields = {f.name: f for f in dataclasses.fields(RunConfig)}
    for action in p._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        where = f"sc-jax {command} {'/'.join(action.option_strings)}"
        if action.dest in COMMAND_ONLY[command] and action.dest not in fields and action.dest not in declared:
            continue
        if action.dest not in declared:
            out.append(f"{where} (dest {action.dest}) is neither a RunConfig field's Flag nor command-only")
            continue
        name, flag, first = declared[action.dest]
        seen.add(action.dest)
        if action.option_strings != [flag.name]:
            out.append(f"{where} is not {flag.name}, the flag declared for {name}")
        if action.help != flag.help or not flag.help.strip():
            out.append(f"{where}: help is not the declared one, or empty")
        choices = tuple(action.choices or getattr(action.type, "choices", None) or ())
        if choices != (cfg.field_type(name).choices if first else ()):
            out.append(f"{where}: choices {choices} are not {name}'s Literal")
        if first:  # its default, read back, is the field's
            got = flag.to_fields(action.default, {}) if flag.to_fields else {name: action.default}
            got = {k: tuple(v) if isinstance(v, list) else v for k, v in got.items()}
            if got != {k: fields[k].default for k in got}:
                out.append(f"{where}: default {action.default!r} is not {name}'s {fields[name].default!r}")
        elif action.default not in (None, False):
            out.append(f"{where}: an overriding flag must default to unset, not {action.default!r}")
    out += [f"sc-jax {command}: {flag.name} of {declared[d][0]} is missing" for d, (_, flag, _) in
            declared.items() if d not in seen]
    return out


@pytest.mark.parametrize("command", ["run", "plan"])
def test_every_run_and_plan_option_comes_from_one_declaration(command):
    p = _subparser(parser.build_parser(), command)
    assert _problems(p, command) == []
    # Defaults come from the dataclass: no option given is RunConfig().
    assert commands.run_config(p.parse_args([])) == RunConfig()
    # Every field is reachable from the command line, but the documented few.
    assert {f.name for f in dataclasses.fields(RunConfig) if not cfg.flags(f.name)} == NO_FLAG
    mesh = commands.run_config(p.parse_args(["--mesh", "data=2,model=4"]))
    assert (mesh.mesh_devices, mesh.mesh_model) == (2, 4)
    # A range's refusal names a flag that exists (its field's, --mesh for mesh_model), or
    # none for a field of the API only.
    for f in dataclasses.fields(RunConfig):
        if f.metadata["ranged"]:
            names = [fl.name for fl in cfg.flags(f.name)] or (["--mesh"] if f.name == "mesh_model" else [])
            option = ranges.RANGES[f.name].option
            assert option in names if names else not option.startswith("-"), (f.name, option)


def test_a_config_option_added_by_hand_is_caught():
    """The check above fails for an option of a config field written by hand (here
    --bc-batch, which has no flag), and for a hand-made copy of a declared one."""
    p = argparse.ArgumentParser()
    parser.add_config_options(p)
    assert _problems(p, "run") == []
    p.add_argument("--bc-batch", type=int, default=128, help="BC's batch")
    assert _problems(p, "run") == ["sc-jax run --bc-batch (dest bc_batch) is neither a RunConfig "
                                   "field's Flag nor command-only"]
    q = argparse.ArgumentParser()
    for f in dataclasses.fields(RunConfig):
        for flag in cfg.flags(f.name):
            if flag.name != "--solver":
                q.add_argument(flag.name, **parser._flag_arguments(f.name, flag))
    q.add_argument("--solver", default="scipy", choices=["scipy"], help="SC's solver")
    assert len(_problems(q, "run")) == 3  # help, choices and default differ


@pytest.mark.parametrize("argv, field, value", [
    (["--methods", "sc", "bc"], "methods", ("sc", "bc")),  # refused before: commas only
    (["--methods", "sc,bc"], "methods", ("sc", "bc")),
    (["--dataset", "sst2,trec"], "datasets", ("sst2", "trec")),
    (["--dataset", "sst2", "trec"], "datasets", ("sst2", "trec")),
    (["--shots", "4,8", "16"], "shots", (4, 8, 16)),
    (["--seed-list", "3,1"], "seeds", (3, 1)),
    (["--seeds", "2"], "seeds", (0, 1)),
    (["--seeds", "2", "--seed-list", "7"], "seeds", (7,)),
    (["--per-seed-test-sets"], "test_seed", None),
    (["--dataset", "sst2", "trec", "--data-file", "a.csv", "--data-file", "trec=b.csv"],
     "data_files", (("sst2", "a.csv"), ("trec", "b.csv"))),
    (["--device-memory", "2GiB"], "device_memory", 2 ** 31),
    (["--dataset", "all"], "datasets", tuple(TASKS)),
])
def test_list_options_take_spaces_or_commas(argv, field, value):
    args = parser.build_parser().parse_args(["plan"] + argv)
    assert getattr(commands.run_config(args), field) == value


@pytest.mark.parametrize("argv, message", [
    (["--methods", "sc,magic"], "argument --methods: invalid choice: 'magic' (choose from 'base', "),
    (["--shots", "4,x"], "argument --shots: invalid int value: 'x'"),
    (["--methods", ","], "argument --methods: no value in ','"),
    (["--solver", "newton"], "argument --solver: invalid choice: 'newton'"),
])
def test_a_bad_list_item_is_refused_by_the_parser(capsys, argv, message):
    with pytest.raises(SystemExit):
        parser.build_parser().parse_args(["run"] + argv)
    assert message in capsys.readouterr().err


def test_other_commands_take_the_fields_choices():
    """demo, info and ablate's --dtype, --solver and --guard: the fields' choices, so a
    dtype or solver added to its Literal reaches every command."""
    p = parser.build_parser()
    for command, dest, field in [("demo", "dtype", "dtype"), ("info", "dtype", "dtype"),
                                 ("ablate", "solver", "solver"), ("ablate", "guard", "guard")]:
        action = next(a for a in _subparser(p, command)._actions if a.dest == dest)
        assert tuple(action.choices) == cfg.field_type(field).choices, (command, dest)
