"""A GGUF checkpoint in Hugging Face terms: :class:`GGUFCheckpoint`, and :func:`read_gguf`,
which builds one from the binary reader, the config mapping and the tokenizer.

Every check that can fail (magic, version, truncation, architecture, unsupported
features, missing, unexpected or misshapen tensors, quantisation types, tokenizer
metadata) runs on the header alone, before any weight is dequantised.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import tokenizers

from sc_jax.models.gguf.config import ROPE_FREQS, SUPPORTED_ARCHITECTURES, hf_config, hf_names
from sc_jax.models.gguf.reader import GGUFError, Metadata, Tensors, check_dequantizable, scan_layout
from sc_jax.models.gguf.tokenizer import build_tokenizer


@dataclasses.dataclass(frozen=True)
class GGUFCheckpoint:
    """A GGUF checkpoint in Hugging Face terms.

    Attributes:
      config: HF `config.json` contents (`LlamaForCausalLM` or `Qwen2ForCausalLM`).
      tensors: HF parameter name -> float32 array in HF layout, e.g.
        `model.layers.{i}.self_attn.q_proj.weight` is `[num_heads * head_dim, hidden]`
        and `model.embed_tokens.weight` is `[vocab, hidden]`. `lm_head.weight` is present
        only when the embeddings are untied. A read-only mapping over the open file:
        every access dequantises that one tensor afresh, so a loop over it holds one
        float tensor at a time.
      tokenizer: the tokenizer built from the file's metadata; it adds BOS/EOS only
        where the file says so (SmolLM2, Qwen2.5: neither).
      tokenizer_config: HF `tokenizer_config.json` contents (special tokens as strings,
        `add_bos_token`, `chat_template`, `model_max_length`).
    """

    config: dict
    tensors: Mapping[str, np.ndarray]
    tokenizer: tokenizers.Tokenizer
    tokenizer_config: dict = dataclasses.field(default_factory=dict)


def _architecture(meta: Metadata) -> str:
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise GGUFError(
            f"{meta.path} holds a {arch!r} model (general.architecture); sc_jax reads GGUF files of "
            f"architecture {', '.join(map(repr, SUPPORTED_ARCHITECTURES))} only. For other models "
            "pass their Hugging Face directory (config.json + safetensors)."
        )
    return arch


def metadata_tokenizer(fields: dict, source) -> tokenizers.Tokenizer:
    """The tokenizer of a GGUF file from its metadata alone (:func:`.reader.read_metadata`),
    the same as :func:`read_gguf`'s; ``source`` names the file in errors."""
    meta = Metadata(fields, source)
    return build_tokenizer(meta, _architecture(meta))[0]


def read_gguf(path: str | os.PathLike) -> GGUFCheckpoint:
    """Reads a llama, qwen2 or gemma3 .gguf file into HF config, float32 weights and tokenizer.

    All validation (file integrity, architecture, features, tensor names and shapes,
    quantisation types, tokenizer metadata) happens before the first weight is
    dequantised; the weights themselves are dequantised when `tensors` is read.

    Args:
      path: a single-file GGUF v2/v3 checkpoint with `general.architecture` "llama" or
        "qwen2" and a byte-level BPE (`gpt2`) tokenizer, or "gemma3" (either tokenizer;
        Gemma's own is SentencePiece).
    Returns:
      A `GGUFCheckpoint`; see its docstring for names, shapes and layouts.
    Raises:
      GGUFError (a ValueError): the file is not GGUF, is truncated or corrupt, is of
        another architecture, uses an unsupported feature or tokenizer, or its tensors do
        not match its metadata. FileNotFoundError: no file at `path`.
    """
    path = Path(path)
    fields, infos = scan_layout(path)
    meta = Metadata(fields, path)
    arch = _architecture(meta)
    config = hf_config(meta, arch, infos)
    if arch == "llama":
        # HF has no such tensor: what it holds is now the config's rope_scaling.
        infos = [t for t in infos if t.name != ROPE_FREQS]
    by_hf = hf_names(path, config, infos, arch)
    tokenizer, tokenizer_config = build_tokenizer(meta, arch)
    tokenizer_config["model_max_length"] = config["max_position_embeddings"]
    if tokenizer.get_vocab_size() > config["vocab_size"]:
        raise GGUFError(
            f"{path} has {tokenizer.get_vocab_size()} tokens but an embedding of only "
            f"{config['vocab_size']} rows; the file is inconsistent."
        )
    check_dequantizable(path, infos)

    permute = {}
    if arch == "llama":
        for i in range(config["num_hidden_layers"]):
            permute[f"model.layers.{i}.self_attn.q_proj.weight"] = config["num_attention_heads"]
            permute[f"model.layers.{i}.self_attn.k_proj.weight"] = config["num_key_value_heads"]
    # llama.cpp's gemma converters add 1 to every tensor whose name ends in norm.weight.
    norm_shifted = frozenset(n for n in by_hf if arch == "gemma3" and n.endswith("norm.weight"))
    return GGUFCheckpoint(
        config=config,
        tensors=Tensors(path, by_hf, permute, norm_shifted),
        tokenizer=tokenizer,
        tokenizer_config=tokenizer_config,
    )

