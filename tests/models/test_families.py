"""The later families' configs (no torch): what each family's config.json turns into, the
two spellings of Gemma 3's (transformers 4 and 5), and every field sc_jax does not
compute refused by name at load."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sc_jax.models.config import ModelConfig, layer_inv_freq, preset, preset_hf_config


def test_gemma3_config_fields():
    c = preset("gemma-3-4b")
    assert c.model_type == "gemma3_text" and c.qk_norm and c.sandwich_norm
    assert (c.norm_offset, c.hidden_act, c.tie_word_embeddings) == (1.0, "gelu_tanh", True)
    assert c.embed_scale == math.sqrt(2560) and c.attn_scale == 256 ** -0.5
    # Every sixth layer global, the others a window of 1024.
    assert c.windows[:6] == (1024,) * 5 + (0,) and c.windows.count(0) == 34 // 6
    inv = layer_inv_freq(c)
    assert inv.shape == (34, 128)
    # Local layers: base 10^4, unscaled; global ones: base 10^6, divided by 8.
    np.testing.assert_allclose(inv[0, 1], 10000.0 ** (-2 / 256))
    np.testing.assert_allclose(inv[5, 1], 1e6 ** (-2 / 256) / 8)
    assert preset("qwen3-8b").qk_norm and not preset("qwen3-8b").sandwich_norm
    assert not preset("llama-3.1-8b").qk_norm


def test_gemma3_transformers_4_and_5_spellings_agree():
    v4 = preset_hf_config("tiny-gemma3")
    v5 = {k: v for k, v in v4.items() if k not in ("rope_theta", "rope_local_base_freq", "rope_scaling")}
    v5["rope_parameters"] = {"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
    assert ModelConfig.from_hf(v4) == ModelConfig.from_hf(v5)
    # 4.x's sliding_window_pattern instead of layer_types: every 4th layer global.
    v4p = {k: v for k, v in v4.items() if k != "layer_types"} | {"sliding_window_pattern": 3}
    assert ModelConfig.from_hf(v4p).windows == (8, 8, 0, 8)
    # A multimodal gemma3 config: its text tower.
    mm = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
          "text_config": v4, "vision_config": {"model_type": "siglip_vision_model"}}
    assert ModelConfig.from_hf(mm) == ModelConfig.from_hf(v4)


@pytest.mark.parametrize("preset_name,field,value,match", [
    ("tiny-gemma3", "final_logit_softcapping", 30.0, "final_logit_softcapping=30.0 asks for final logit soft-capping"),
    ("tiny-gemma3", "attn_logit_softcapping", 50.0, "attn_logit_softcapping"),
    ("tiny-gemma3", "use_bidirectional_attention", True, "bidirectional"),
    ("tiny-qwen3", "num_experts", 8, "mixture of experts"),
    ("tiny-qwen3", "rope_parameters", {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0},
     "rope scaling type 'yarn' is not supported"),
    ("tiny-gemma3", "hidden_activation", "relu", "field 'hidden_activation' must be one of .*got \"relu\""),
    ("tiny-gemma3", "layer_types", ["sliding_attention"] * 3, "layer_types has 3 entries"),
    ("tiny-gemma3", "layer_types", ["chunked_attention"] * 4, "chunked_attention"),
    ("tiny-gemma3", "rope_parameters", {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                        "sliding_attention": {"rope_type": "linear", "factor": 2.0}},
     "sliding-window layers is not supported"),
])
def test_uncomputed_fields_refused_by_name(preset_name, field, value, match):
    cfg = preset_hf_config(preset_name) | {field: value}
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_hf(cfg)


def test_gemma3_without_text_config_and_unsupported_families():
    with pytest.raises(ValueError, match="text tower"):
        ModelConfig.from_hf({"model_type": "gemma3"})
    for mtype in ("gemma2", "qwen3_moe", "llama4"):
        with pytest.raises(ValueError, match=f"unsupported model_type '{mtype}'"):
            ModelConfig.from_hf(preset_hf_config("tiny-qwen3") | {"model_type": mtype})


def test_multimodal_gemma3_checkpoint_loads_its_text_tower(tmp_path):
    """A Gemma3ForConditionalGeneration directory (text tower under
    ``model.language_model.``, a vision tower beside it) gives the logits of the same
    text weights saved as a Gemma3ForCausalLM."""
    import json

    from safetensors.numpy import save_file

    import sc_jax
    from hf_models import write_tokenizer
    from sc_jax.models.checkpoint import key_map

    cfg = preset_hf_config("tiny-gemma3") | {"vocab_size": 331}
    rng = np.random.default_rng(0)
    tensors = {k: (0.1 * rng.standard_normal(r.hf_shape)).astype(np.float32)
               for k, r in key_map(ModelConfig.from_hf(cfg)).items()}
    text, mm = tmp_path / "text", tmp_path / "mm"
    for d, c, t in [(text, cfg, tensors),
                    (mm, {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
                          "text_config": cfg},
                     {"model.language_model." + k[len("model."):]: v for k, v in tensors.items()}
                     | {"model.vision_tower.patch_embed.weight": np.ones((4, 3), np.float32)})]:
        d.mkdir()
        (d / "config.json").write_text(json.dumps(c))
        save_file(t, str(d / "model.safetensors"))
        write_tokenizer(d)
    prompts = [[5, 9, 40, 7, 3, 11, 12, 13, 14, 15], [8]]
    a = sc_jax.load_model(text).last_logits(prompts)
    b = sc_jax.load_model(mm).last_logits(prompts)
    assert np.isfinite(a).all() and np.array_equal(a, b)
