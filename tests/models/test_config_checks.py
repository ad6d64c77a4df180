"""Every config.json field the decoder reads is checked for its type and range: a bad
value is one line naming the field, the value and the file, raised before any weight
is read (the model directories here hold none). A field left out takes transformers'
default for the family, and a folder with both weight layouts loads the one
transformers loads."""

from __future__ import annotations

import dataclasses
import json

import pytest

import sc_jax
from hf_models import write_tokenizer
from sc_jax import cli
from sc_jax.models.checkpoint import safetensors_files
from sc_jax.models.config import ModelConfig, preset, preset_hf_config
from sc_jax.models.hf_config import HF_DEFAULTS, ConfigError

_LLAMA3_NO_LOW = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 64}

# (preset, fields changed, the field named, how the message gives the value)
CASES = [
    ("tiny-llama", {"num_attention_heads": 0}, "num_attention_heads", "got 0"),
    ("tiny-llama", {"num_key_value_heads": 2}, "num_key_value_heads", "got 2"),
    ("tiny-llama", {"num_key_value_heads": 0}, "num_key_value_heads", "got 0"),
    ("tiny-llama", {"hidden_size": 71}, "hidden_size", "got 71"),
    ("tiny-qwen3", {"head_dim": 15}, "head_dim", "got 15"),
    ("tiny-llama", {"num_hidden_layers": 0}, "num_hidden_layers", "got 0"),
    ("tiny-llama", {"rope_theta": None}, "rope_theta", "got null"),
    ("tiny-llama", {"rope_theta": "abc"}, "rope_theta", 'got "abc"'),
    ("tiny-llama", {"rope_theta": -10000.0}, "rope_theta", "got -10000.0"),
    ("tiny-llama", {"rms_norm_eps": 0.0}, "rms_norm_eps", "got 0.0"),
    ("tiny-llama", {"rope_scaling": {"rope_type": "linear"}}, "rope_scaling.factor", "is missing"),
    ("tiny-llama", {"rope_scaling": {"rope_type": "linear", "factor": -2}}, "rope_scaling.factor",
     "got -2"),
    ("tiny-llama", {"rope_scaling": "linear"}, "rope_scaling", 'got "linear"'),
    ("tiny-llama3", {"rope_parameters": _LLAMA3_NO_LOW}, "rope_parameters.low_freq_factor",
     "is missing"),
    ("tiny-llama3", {"rope_parameters": _LLAMA3_NO_LOW | {"low_freq_factor": 4.0}},
     "rope_parameters.high_freq_factor", "got 4.0"),
    ("tiny-llama", {"tie_word_embeddings": "false"}, "tie_word_embeddings", 'got "false"'),
    ("tiny-llama", {"attention_bias": "false"}, "attention_bias", 'got "false"'),
    ("tiny-mistral", {"sliding_window": 2.5}, "sliding_window", "got 2.5"),
    ("tiny-mistral", {"sliding_window": -1}, "sliding_window", "got -1"),
    ("tiny-llama", {"max_position_embeddings": 0}, "max_position_embeddings", "got 0"),
    ("tiny-llama", {"bos_token_id": "<s>"}, "bos_token_id", 'got "<s>"'),
    ("tiny-llama", {"hidden_act": ["silu"]}, "hidden_act", 'got ["silu"]'),
    ("tiny-gemma3", {"query_pre_attn_scalar": -4}, "query_pre_attn_scalar", "got -4"),
    ("tiny-gemma3", {"layer_types": None, "sliding_window_pattern": 0}, "sliding_window_pattern",
     "got 0"),
    ("tiny-gemma3", {"rope_local_base_freq": 0}, "rope_local_base_freq", "got 0"),
    ("tiny-gemma3", {"head_dim": None}, "head_dim", "got null"),
]
_IDS = [f"{p}-{next(iter(c))}={json.dumps(next(iter(c.values())))}" for p, c, _, _ in CASES]


def _model_dir(tmp_path, preset_name: str, change: dict):
    """A Hugging Face directory with config.json and tokenizer.json, and no weights."""
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(preset_hf_config(preset_name) | change))
    write_tokenizer(d)
    return d


@pytest.mark.parametrize("preset_name, change, field, value", CASES, ids=_IDS)
def test_a_bad_config_value_is_one_line_naming_field_value_and_file(tmp_path, preset_name, change,
                                                                   field, value):
    d = _model_dir(tmp_path, preset_name, change)
    with pytest.raises(ConfigError) as e:
        sc_jax.load_model(str(d))  # no weights in d: refused before any is looked for
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{d / 'config.json'}: ")
    assert f"'{field}'" in msg and value in msg, msg


# The values that gave a traceback (heads 0, a null theta, a linear scaling without
# factor, a pattern of 0) and the strings whose message named no field.
_CLI_CASES = [CASES[i] for i, ident in enumerate(_IDS) if ident.startswith((
    "tiny-llama-num_attention_heads=0", "tiny-llama-rope_theta=null", 'tiny-llama-rope_theta="abc"',
    'tiny-llama-rope_scaling={"rope_type": "linear"}', 'tiny-llama-rope_scaling="linear"',
    'tiny-llama-bos_token_id="<s>"', "tiny-gemma3-layer_types=null"))]


@pytest.mark.parametrize("preset_name, change, field, value", _CLI_CASES,
                         ids=[f"{c[2]}-{c[3]}" for c in _CLI_CASES])
@pytest.mark.parametrize("command", ["info", "plan"])
def test_the_cli_gives_one_line_for_a_bad_config(tmp_path, capsys, command, preset_name, change,
                                                 field, value):
    """`sc-jax info` and `plan` on random:PATH: one error line, exit 2."""
    d = _model_dir(tmp_path, preset_name, change)
    argv = {"info": ["info", f"random:{d}"],
            "plan": ["plan", "--model", f"random:{d}", "--no-xla", "--quiet", "--shots", "4",
                     "--seeds", "1", "--test-size", "8"]}[command]
    assert cli.main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("sc_jax:")]
    assert len(err) == 1 and err[0].startswith(f"error: {d / 'config.json'}: "), err
    assert f"'{field}'" in err[0] and value in err[0]


def test_a_preset_and_a_hand_built_config_are_held_to_the_same_checks():
    """A rope scaling missing a value is refused on a ModelConfig built by hand too (the
    llama3 rotary filled in low_freq_factor 1, high_freq_factor 4 and a context of 8192)."""
    c = preset("tiny-llama3")
    partial = tuple((k, v) for k, v in c.rope_scaling if k != "low_freq_factor")
    with pytest.raises(ConfigError, match=r"'ModelConfig.rope_scaling.low_freq_factor' is missing"):
        dataclasses.replace(c, rope_scaling=partial)
    with pytest.raises(ConfigError, match=r"'ModelConfig.rms_norm_eps' must be positive, got -1"):
        dataclasses.replace(c, rms_norm_eps=-1.0)
    with pytest.raises(ConfigError, match=r"'ModelConfig.tie_word_embeddings' must be true or false"):
        dataclasses.replace(c, tie_word_embeddings="false")
    with pytest.raises(ConfigError, match=r"^preset 'tiny-llama': field 'rope_theta' must be"):
        ModelConfig.from_hf(preset_hf_config("tiny-llama") | {"rope_theta": None},
                            source="preset 'tiny-llama'")


# ------------------------------------------------------------------ transformers' defaults
@pytest.mark.parametrize("mtype", sorted(HF_DEFAULTS))
def test_the_defaults_are_transformers_class_defaults(mtype):
    transformers = pytest.importorskip("transformers")
    cls = transformers.CONFIG_MAPPING[mtype]
    fields = {f.name: f.default for f in dataclasses.fields(cls)}
    theta = cls.default_theta
    for name, ours in HF_DEFAULTS[mtype].items():
        if name == "rope_theta":
            assert ours == (theta["global"] if isinstance(theta, dict) else theta)
        elif name == "rope_local_base_freq":
            assert ours == theta["local"]
        elif name == "sliding_window_pattern":
            # Set in Gemma3TextConfig.__post_init__: every 6th layer global.
            types = cls(num_hidden_layers=12).layer_types
            assert [i for i, t in enumerate(types) if t == "full_attention"] == [ours - 1, 2 * ours - 1]
        else:
            # A field the class lacks (Qwen2's head_dim) is derived, as ours (None) is.
            assert fields.get(name) == ours, (mtype, name, fields.get(name), ours)


@pytest.mark.parametrize("preset_name", ["tiny-llama", "tiny-mistral", "tiny-qwen2", "tiny-qwen3",
                                         "tiny-gemma3"])
def test_a_config_without_its_optional_fields_reads_as_transformers_fills_it(preset_name):
    """The preset with every defaulted field left out gives the configuration of
    transformers' own reading (its to_dict, every field filled in)."""
    transformers = pytest.importorskip("transformers")
    full = preset_hf_config(preset_name)
    mtype = full["model_type"]
    defaults = HF_DEFAULTS[mtype] | {"rms_norm_eps": 0, "attention_bias": 0, "layer_types": 0,
                                     "rope_scaling": 0, "rope_local_base_freq": 0}
    kv = defaults.get("num_key_value_heads")
    keep = {"num_key_value_heads"} if kv and full["num_attention_heads"] % kv else set()
    sparse = {k: v for k, v in full.items() if k not in defaults or k in keep}
    theirs = transformers.CONFIG_MAPPING[mtype](**sparse).to_dict()
    assert ModelConfig.from_hf(sparse) == ModelConfig.from_hf(theirs)


# ------------------------------------------------------------------ which weights file
def _both_layouts(tmp_path, config: dict):
    d = tmp_path / "both"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    (d / "model.safetensors").write_bytes(b"single")
    (d / "model-00001-of-00001.safetensors").write_bytes(b"shard")
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"lm_head.weight": "model-00001-of-00001.safetensors"}}))
    return d


def test_a_folder_with_both_weight_layouts_loads_the_single_file(tmp_path):
    """transformers' order for a local folder: model.safetensors before the index (the
    index's shards were read)."""
    d = _both_layouts(tmp_path, preset_hf_config("tiny-llama"))
    assert safetensors_files(d) == [d / "model.safetensors"]


def test_transformers_weights_names_the_file(tmp_path):
    """config.json's transformers_weights comes first, as in transformers; one outside
    the folder is one line naming the field and the file."""
    cfg = preset_hf_config("tiny-llama")
    d = _both_layouts(tmp_path, cfg | {"transformers_weights": "model.safetensors.index.json"})
    assert safetensors_files(d) == [d / "model-00001-of-00001.safetensors"]
    (d / "config.json").write_text(json.dumps(cfg | {"transformers_weights": "../w.safetensors"}))
    with pytest.raises(ValueError, match=rf"^{d / 'config.json'}: field 'transformers_weights' must "
                                         r"name a \.safetensors file or index in .*, got \"\.\./w"):
        safetensors_files(d)
