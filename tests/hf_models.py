"""Tiny random Hugging Face checkpoints for parity tests (needs torch + transformers).

Odd sizes (hidden 60, 6 heads over 2 or 3 KV heads, MLP 37, vocab 331) so shape bugs
show; a byte-level tokenizer.json is written beside the weights."""

from __future__ import annotations

import json
from pathlib import Path

VOCAB = 331

CASES = {
    # name: (architecture, extra config fields)
    "llama": ("llama", dict(tie_word_embeddings=False)),
    "llama_tied": ("llama", dict(tie_word_embeddings=True)),
    "llama_bias": ("llama", dict(attention_bias=True, num_key_value_heads=3)),
    "llama_rope_llama3": ("llama", dict(rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 16})),
    "llama_rope_linear": ("llama", dict(rope_parameters={
        "rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0})),
    "mistral_window": ("mistral", dict(sliding_window=5)),
    "qwen2": ("qwen2", dict(num_key_value_heads=3, tie_word_embeddings=True)),
    # Llama 3.1 as published: untied, 3 of 6 heads per KV head, llama3 rope scaling.
    "llama3": ("llama", dict(num_key_value_heads=3, rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 32})),
    # Qwen3: q/k norms, head_dim 16 with hidden 60 / 6 heads, no biases, untied.
    "qwen3": ("qwen3", dict(head_dim=16, tie_word_embeddings=False)),
    # Gemma 3 text: windows of 5 on layers 0, 1, 3 and a global layer 2, each kind with
    # its rotary base (the global one linearly scaled), query_pre_attn_scalar 24 with
    # head_dim 16, GELU-tanh, sandwich and q/k norms of 1 + w, sqrt(D) embeddings, tied.
    "gemma3": ("gemma3_text", dict(
        num_hidden_layers=4, head_dim=16, query_pre_attn_scalar=24, sliding_window=5,
        layer_types=["sliding_attention", "sliding_attention", "full_attention",
                     "sliding_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "factor": 2.0,
                                            "rope_theta": 1000000.0}},
        hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, pad_token_id=0)),
}


def write_tokenizer(path: Path, vocab_size: int = VOCAB) -> None:
    """A byte-level BPE tokenizer.json with no merges (ids 0..255 are bytes)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(path / "tokenizer.json"))


def make_checkpoint(name: str, out: Path, *, seed: int = 0, max_shard_size=None):
    """Save a random HF model ``name`` (a key of CASES) to ``out``; return the torch model."""
    import torch
    import transformers as tf

    arch, extra = CASES[name]
    cfg_cls, model_cls = {
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
        "mistral": (tf.MistralConfig, tf.MistralForCausalLM),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
        "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM),
        "gemma3_text": (tf.Gemma3TextConfig, tf.Gemma3ForCausalLM),
    }[arch]
    kw = dict(vocab_size=VOCAB, hidden_size=60, intermediate_size=37, num_hidden_layers=3,
              num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256,
              rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2)
    kw.update(extra)
    torch.manual_seed(seed)
    config = cfg_cls(**kw)
    model = model_cls(config).eval().float()
    # Default init leaves norms at 1 and biases at 0: randomise them so the key map
    # is tested on every tensor.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n or n.endswith("bias"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p) if "norm" in n else 0.1 * torch.randn_like(p))
    out.mkdir(parents=True, exist_ok=True)
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(out, **kwargs)
    write_tokenizer(out)
    return model


def hf_logits(model, ids) -> "list":
    """Full logits ``[T, V]`` of one unpadded sequence, float32 NumPy."""
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def read_config(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


def write_numpy_checkpoint(out: Path, *, seed: int = 0, vocab_size: int | None = None) -> Path:
    """A random tiny llama Hugging Face directory written with NumPy and safetensors
    alone (no torch, so on every Python): config.json, model.safetensors and a
    byte-level tokenizer.json. ``vocab_size``: rows of the embeddings (default the
    tokenizer's; more makes a larger file). Returns ``out``."""
    import numpy as np
    from safetensors.numpy import save_file

    from sc_jax.models.checkpoint import key_map
    from sc_jax.models.config import ModelConfig

    cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": vocab_size or VOCAB,
           "hidden_size": 60, "intermediate_size": 37, "num_hidden_layers": 2,
           "num_attention_heads": 6, "num_key_value_heads": 2, "max_position_embeddings": 256,
           "rms_norm_eps": 1e-5, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False}
    rng = np.random.default_rng(seed)
    tensors = {k: (0.1 * rng.standard_normal(rule.hf_shape)).astype(np.float32)
               for k, rule in key_map(ModelConfig.from_hf(cfg)).items()}
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg))
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    write_tokenizer(out)
    return out
