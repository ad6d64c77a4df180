"""GGUF checkpoints (llama, qwen2 and gemma3 architectures), read into Hugging Face layout.

A GGUF file (llama.cpp's format) holds everything a model directory holds, in other
clothes: the config as `<arch>.*` metadata keys, the tokenizer as `tokenizer.ggml.*`
arrays, and the weights, usually block-quantised. :func:`read_gguf` turns one into

* an HF `config.json` dict (`LlamaForCausalLM`, `Qwen2ForCausalLM` or
  `Gemma3ForCausalLM` with model_type "gemma3_text"),
* float32 NumPy weights under HF names, in HF layout `[out_features, in_features]`,
  dequantised one tensor at a time when they are read,
* a `tokenizers.Tokenizer` equal to the one the model was trained with,

and :func:`write_hf_dir` saves that as a model directory that transformers, and our own
safetensors loader, read like any other.

What differs from an HF checkpoint, and who undoes it:

1. Names. `blk.3.attn_q.weight` is `model.layers.3.self_attn.q_proj.weight`: the
   `gguf` package's own `TensorNameMap` maps them (:func:`.config.hf_names`).
2. Shapes. GGUF lists a tensor's dimensions fastest-first; the header reader
   (:mod:`.reader`) turns them around.
3. Quantisation. F16, BF16, Q8_0, Q4_0/1, Q5_0/1 and the K-quants are expanded to
   float32 with `gguf.quants.dequantize` (:class:`.reader.Tensors`), exactly the values
   llama.cpp computes with.
4. Rotary layout (llama only). llama.cpp rotates adjacent pairs `(x[2j], x[2j+1])` of
   each head, HF Llama rotates the halves `(x[j], x[j + head_dim/2])`, so llama.cpp's
   converter reorders the rows of `q_proj` and `k_proj` within every head
   (:func:`.reader.unpermute_rotary_rows` inverts it). Qwen2 files use the half rotation
   (llama.cpp's NEOX rope) and are stored unpermuted, and so are Gemma 3's.
5. Norm weights (gemma3 only). Gemma's RMSNorm scales by `1 + w` and HF stores w;
   llama.cpp's converter stores `w + 1` for every `*norm.weight` (q/k norms included),
   so the reader subtracts 1 again, in float32 as transformers' GGUF loader does.
6. Llama 3.1/3.2 rope scaling (llama only): recovered from the tensor
   `rope_freqs.weight` into the config's `rope_scaling` (:mod:`.config`).
7. What the metadata leaves out (gemma3): the sliding-window pattern, the local rotary
   base, the query scale and the activation, written into the config as llama.cpp
   hard-codes them (:mod:`.config`).
8. The tokenizer. transformers builds it from the metadata; :mod:`.tokenizer` corrects
   it where it differs from the model's own tokenizer.

Every check that can fail (magic, version, truncation, architecture, unsupported
features, missing, unexpected or misshapen tensors, quantisation types, tokenizer
metadata) runs on the header alone, before any weight is dequantised.

The pieces, one reason to change each:

* :mod:`.reader`: the binary format (header, metadata, tensor table, dequantised
  tensors) and :class:`GGUFError`;
* :mod:`.config`: the metadata as an HF `config.json`, the tensor names as HF's;
* :mod:`.tokenizer`: the tokenizer and `tokenizer_config.json` from the metadata;
* :mod:`.checkpoint`: :class:`GGUFCheckpoint` and :func:`read_gguf`, which joins them;
* :mod:`.writer`: :func:`write_hf_dir`, the HF model directory.

Importing this package needs the optional extra `[gguf]` (the `gguf` and
`transformers` packages); without it the import raises an ImportError that says so.
"""

import contextlib
import logging


@contextlib.contextmanager
def _without_torch_notice():
    """transformers' notice, logged as it is imported without PyTorch, that "Models
    won't be available", left out: only its GGUF tokenizer conversion is used here,
    which needs no PyTorch. Every other record of transformers passes."""
    def keep(record: logging.LogRecord) -> bool:
        return "Models won't be available" not in record.getMessage()

    logger = logging.getLogger("transformers")
    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)


def _check_extra() -> None:
    """Raises one ImportError that names the extra when `gguf` or transformers' GGUF
    tokenizer conversion is missing, before any module of the package imports them."""
    try:
        # The optional extra [gguf]: the names the modules below import, checked in one place.
        from gguf import quants  # noqa: F401 (optional extra [gguf])
        # The package's first import of transformers: the modules below find it imported.
        with _without_torch_notice():
            from transformers.integrations.gguf.gguf_tokenizer_mapping import (  # noqa: F401 (optional extra [gguf])
                GGUF_PRE_TOKENIZER_SPLITS,
                GGUF_TOKENIZER_MAPPING,
                convert_gguf_tokenizer,
            )
    except ImportError as error:  # pragma: no cover - depends on the installation
        raise ImportError(
            f"Reading .gguf files needs the `gguf` and `transformers` packages ({error.name} is "
            "missing): pip install 'sc-jax[gguf]'"
        ) from error


_check_extra()

from sc_jax.models.gguf.checkpoint import GGUFCheckpoint, metadata_tokenizer, read_gguf  # noqa: E402
from sc_jax.models.gguf.config import SUPPORTED_ARCHITECTURES  # noqa: E402
from sc_jax.models.gguf.reader import GGUFError, read_metadata  # noqa: E402
from sc_jax.models.gguf.writer import write_hf_dir  # noqa: E402

__all__ = ["GGUFCheckpoint", "GGUFError", "SUPPORTED_ARCHITECTURES", "metadata_tokenizer", "read_gguf",
           "read_metadata", "write_hf_dir"]
