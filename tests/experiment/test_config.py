"""RunConfig from Python: lists or one value for its list fields, every choice field
checked with one line naming the field and its flag, Literal types, and from_json."""

from __future__ import annotations

import json
import typing

import pytest

from sc_jax.calibration.numpy_fit import GUARDS
from sc_jax.calibration.solvers.types import METHODS as SOLVERS
from sc_jax.experiment.protocol import config as cfg
from sc_jax.experiment.protocol.config import RunConfig
from sc_jax.experiment.tasks.spec import TASKS
from sc_jax.models import loading
from sc_jax.runtime import ranges


def test_list_fields_take_a_list_a_tuple_or_one_value():
    config = RunConfig(datasets="sst2", methods=["sc", "bc"], shots=[4], seeds=3,
                       data_files=[["sst2", "a.csv"]])
    assert (config.datasets, config.methods, config.shots, config.seeds, config.data_files) == (
        ("sst2",), ("sc", "bc"), (4,), (3,), (("sst2", "a.csv"),))
    assert RunConfig(datasets="all").datasets == tuple(TASKS)
    with pytest.raises(ValueError, match=r"^datasets \(--dataset\) is empty"):
        RunConfig(datasets=[])


@pytest.mark.parametrize("fields, message", [
    # solver was not checked at all: a typo ran the whole scoring, then failed in the fit
    (dict(solver="newton"), "solver (--solver) must be one of augmented_lagrangian, projected, "
                            "scipy, got 'newton'"),
    (dict(size_weighting="paper"), "size_weighting (--size-weighting) must be one of uniform, "
                                   "reference, got 'paper'"),
    (dict(mode="tokens"), "mode (--mode) must be one of first_token, sequence, got 'tokens'"),
    (dict(dtype="float16"), "dtype (--dtype) must be one of float32, bfloat16, got 'float16'"),
    (dict(methods=["sc", "magic", "bc", "oops"]), "methods (--methods) must be one of base, cc, dc, "
                                                  "bc, bc_reference, sc_star, sc_star_free, sc, "
                                                  "sc_paper, looc, linc, surprise, hidden, moicl, got 'magic', 'oops'"),
])
def test_every_choice_field_is_checked_in_one_line(fields, message):
    with pytest.raises(ValueError) as err:
        RunConfig(**fields)
    assert str(err.value) == message


def test_string_options_are_literal_types_of_the_one_list():
    """The choices are the Literal's, and the modules that use the values define their
    tuples from the same Literal (the dtype table's names included)."""
    hints = typing.get_type_hints(RunConfig)
    for field, values in [("dtype", ranges.DTYPES), ("solver", SOLVERS), ("guard", GUARDS),
                          ("mode", cfg.LABEL_MODES), ("size_weighting", cfg.SIZE_WEIGHTINGS)]:
        assert typing.get_origin(hints[field]) is typing.Literal, field
        assert typing.get_args(hints[field]) == values == cfg.field_type(field).choices, field
    # The methods are the registry's (sc_jax.calibration.methods), read when asked.
    from sc_jax.calibration import methods as registry

    assert cfg.field_type("methods").choices == registry.names() == cfg.METHODS
    assert tuple(loading.DTYPES) == ranges.DTYPES


def test_from_json_round_trips_to_json(tmp_path):
    config = RunConfig(datasets=("sst2", "trec"), data_files=(("trec", "t.csv"),), shots=(4,),
                       seeds=(2, 0), methods=("base", "sc"), lambda_inv=0.5, tau=None,
                       solver="projected", mesh_devices=2, device_memory=2 ** 30)
    assert RunConfig.from_json(config.to_json()) == config
    text = json.dumps(config.to_json())  # lists, as run_config.json holds them
    assert RunConfig.from_json(json.loads(text)) == config
    (tmp_path / "run_config.json").write_text(text)
    assert RunConfig.from_json(tmp_path / "run_config.json") == config
    assert RunConfig.from_json(str(tmp_path / "run_config.json")) == config
    # A field left out (a file of an older version) takes its default.
    assert RunConfig.from_json({"shots": [8]}) == RunConfig(shots=(8,))


@pytest.mark.parametrize("content, message", [
    ({"shots": [4], "lamda_inv": 0.5}, "RunConfig.from_json: unknown RunConfig field(s) lamda_inv; "
                                       "the fields are model, dtype, "),
    ("[1, 2]", "{path} holds a list, not a RunConfig's JSON object of fields"),
    ("{not json", "{path} is not JSON ("),
    (None, "{path} cannot be read ("),
])
def test_from_json_refuses_in_one_line(tmp_path, content, message):
    path = tmp_path / "run_config.json"
    if isinstance(content, str):
        path.write_text(content)
    with pytest.raises(ValueError) as err:
        RunConfig.from_json(content if isinstance(content, dict) else path)
    assert str(err.value).startswith(message.format(path=path)), str(err.value)
    assert "\n" not in str(err.value)
