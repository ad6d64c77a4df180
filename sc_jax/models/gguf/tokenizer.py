"""A GGUF file's tokenizer, rebuilt from its `tokenizer.ggml.*` metadata.

transformers builds it (`convert_gguf_tokenizer`, which needs no torch);
:func:`build_tokenizer` corrects it where it differs from the model's own tokenizer and
writes the HF `tokenizer_config.json` beside it. Every check runs on the metadata alone.
"""

from __future__ import annotations

import json

import tokenizers
from tokenizers import normalizers, pre_tokenizers, processors
from transformers.integrations.gguf.gguf_tokenizer_mapping import (
    GGUF_PRE_TOKENIZER_SPLITS,
    GGUF_TOKENIZER_MAPPING,
    convert_gguf_tokenizer,
)

from sc_jax.models.gguf.reader import GGUFError, Metadata

# `tokenizer.ggml.pre` values whose pre-tokenizer transformers' GGUF conversion gets
# wrong, with the fix. "smollm" and "starcoder" isolate every numeric character before
# the GPT-2 split (llama.cpp's regex `\p{N}`; SmolLM2's own tokenizer.json has
# `Digits(individual_digits=True)`); transformers 5.x does not know these names and
# falls back to the plain GPT-2 split (tests/models/test_gguf.py pins where that changes the
# tokens).
_DIGIT_SPLIT_PRE_TYPES = ("smollm", "starcoder")
SUPPORTED_PRE_TOKENIZERS = ("gpt2", *_DIGIT_SPLIT_PRE_TYPES, *sorted(GGUF_PRE_TOKENIZER_SPLITS))
# llama.cpp's LLAMA3 pre-tokenizer group: a pre-token that is itself in the vocabulary is
# one token, merges or not (`ignore_merges`, also in Llama 3's own tokenizer.json), and
# BOS is added unless the file's `add_bos_token` says otherwise (llama-vocab.cpp).
_LLAMA3_PRE_TYPES = ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                     "midm-2.0", "lfm2", "jina-v5-nano")
# SentencePiece vocabularies (tokenizer.ggml.model "llama") are built only for these
# architectures, whose builder transformers has checked against the model's own tokenizer.
_SENTENCEPIECE_ARCHITECTURES = ("gemma3",)


def _check_tokenizer_metadata(meta: Metadata, arch: str) -> tuple[str, str, list]:
    """The file's tokenizer model ("gpt2" or "llama"), pre-tokenizer name and vocabulary,
    once its tokenizer metadata has passed every check."""
    path = meta.path
    kind = meta.get("tokenizer.ggml.model")
    if kind == "llama" and arch not in _SENTENCEPIECE_ARCHITECTURES:
        raise GGUFError(
            f"{path} has a SentencePiece vocabulary (tokenizer.ggml.model = 'llama', as in "
            "Llama-2 and Mistral files), which sc_jax builds from GGUF metadata only for "
            f"{', '.join(_SENTENCEPIECE_ARCHITECTURES)} files. Pass the model's Hugging Face "
            "directory (config.json, *.safetensors, tokenizer.json) instead."
        )
    if kind not in ("gpt2", "llama"):
        raise GGUFError(
            f"{path} has a {kind!r} tokenizer; only byte-level BPE ('gpt2') tokenizers, and "
            "Gemma's SentencePiece one, can be built from GGUF metadata. Use the model's "
            "Hugging Face directory instead."
        )
    pre = meta.get("tokenizer.ggml.pre")
    if kind == "gpt2" and pre not in SUPPORTED_PRE_TOKENIZERS:
        raise GGUFError(
            f"{path} asks for pre-tokenizer {pre!r}; supported: {', '.join(SUPPORTED_PRE_TOKENIZERS)}. "
            "Use the model's Hugging Face directory, whose tokenizer.json spells it out."
        )
    tokens = meta.need("tokenizer.ggml.tokens")
    if kind == "gpt2":
        meta.need("tokenizer.ggml.merges")  # Gemma's merges are rebuilt from the token order
    types = meta.get("tokenizer.ggml.token_type")
    if types is not None and len(types) != len(tokens):
        raise GGUFError(f"{path} is corrupt: {len(types)} token types for {len(tokens)} tokens.")
    return kind, pre, tokens


def _correct_pre_tokenizer(tok: tokenizers.Tokenizer, meta: Metadata, pre: str) -> None:
    """Digit isolation for "smollm"/"starcoder", NFC for "qwen2", whole-word lookup for
    the Llama 3 group (see :func:`build_tokenizer`)."""
    if pre in _DIGIT_SPLIT_PRE_TYPES:
        add_prefix_space = bool(meta.get("tokenizer.ggml.add_space_prefix", False))
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=True),
            ]
        )
    if pre == "qwen2":
        tok.normalizer = normalizers.NFC()
    if pre in _LLAMA3_PRE_TYPES:
        tok.model.ignore_merges = True


def _special_token(meta: Metadata, tokens: list, name: str) -> tuple[str | None, int | None]:
    """(token, id) of `tokenizer.ggml.<name>_token_id`, or (None, None) if the file has none."""
    token_id = meta.get(f"tokenizer.ggml.{name}_token_id")
    if token_id is None:
        return None, None
    if not 0 <= token_id < len(tokens):
        raise GGUFError(
            f"{meta.path}: tokenizer.ggml.{name}_token_id = {token_id} is outside the vocabulary."
        )
    return tokens[token_id], int(token_id)


def _post_processor(bos, bos_id, eos, eos_id, add_bos: bool, add_eos: bool, byte_level: bool = True):
    """BOS/EOS added exactly where the file says; otherwise byte-level offsets, or
    nothing for a SentencePiece vocabulary (no byte-level pieces to map)."""
    if add_bos or add_eos:
        single = " ".join([f"{bos}:0"] * add_bos + ["$A:0"] + [f"{eos}:0"] * add_eos)
        specials = [(bos, bos_id)] * add_bos + [(eos, eos_id)] * (add_eos and eos != bos)
        return processors.TemplateProcessing(single=single, special_tokens=specials)
    return processors.ByteLevel(trim_offsets=False) if byte_level else None


def _without_foreign_tokens(tok: tokenizers.Tokenizer, n_tokens: int) -> tokenizers.Tokenizer:
    """`tok` without added tokens past the file's `n_tokens`.

    transformers' byte-level builder (`GPT2Tokenizer`) adds GPT-2's `<|endoftext|>` when
    the vocabulary lacks it (Llama 3's does): an id the model's embedding has no row
    for, so text containing that string would index past it.
    """
    if tok.get_vocab_size(with_added_tokens=True) <= n_tokens:
        return tok  # SmolLM2's and Qwen2.5's vocabularies: nothing to drop
    spec = json.loads(tok.to_str())
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["id"] < n_tokens]
    return tokenizers.Tokenizer.from_str(json.dumps(spec))


def build_tokenizer(meta: Metadata, arch: str) -> tuple[tokenizers.Tokenizer, dict]:
    """The file's tokenizer, built by transformers and corrected where it is wrong.

    transformers' `convert_gguf_tokenizer` builds the byte-level BPE (vocabulary
    respelled in GPT-2's byte alphabet, merges, control tokens kept whole, the split
    regex `tokenizer.ggml.pre` names). Two corrections, each to match the model's own
    tokenizer:

    * "smollm"/"starcoder": isolate digits before the GPT-2 split (transformers does
      not know these names and uses the plain GPT-2 split);
    * "qwen2": NFC-normalise first, as Qwen2's tokenizer.json (and transformers'
      `Qwen2Tokenizer`) does; transformers' GGUF path leaves it out, so composed and
      decomposed accents would tokenize differently from training;
    * the Llama 3 group ("llama-bpe", ...): a pre-token found whole in the vocabulary is
      one token (`ignore_merges`, as llama.cpp and Llama 3's tokenizer.json do), where
      transformers' GGUF path would apply the merges and may stop short of it.

    Gemma 3's SentencePiece vocabulary (tokenizer.ggml.model "llama") is transformers'
    `GemmaTokenizer` on the file's tokens, merges rebuilt from their order, byte
    fallback, spaces as U+2581 and no prefix space, left as transformers builds it.

    BOS/EOS are added exactly where the file's `add_bos_token`/`add_eos_token` say; a
    SentencePiece or Llama 3 group file without `add_bos_token` gets BOS (llama.cpp's
    default there: Llama 3 wants `<|begin_of_text|>`, Gemma `<bos>`).
    """
    kind, pre, tokens = _check_tokenizer_metadata(meta, arch)
    fields = {
        name: meta.get(f"tokenizer.{key}")
        for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items()
        if f"tokenizer.{key}" in meta
    }
    tok, _ = convert_gguf_tokenizer(arch, fields)
    tok = _without_foreign_tokens(tok, len(tokens))
    _correct_pre_tokenizer(tok, meta, pre)
    bos, bos_id = _special_token(meta, tokens, "bos")
    eos, eos_id = _special_token(meta, tokens, "eos")
    # Without the key llama.cpp adds BOS for SentencePiece and the Llama 3 group.
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", kind == "llama" or pre in _LLAMA3_PRE_TYPES))
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
    if (add_bos and bos is None) or (add_eos and eos is None):
        raise GGUFError(f"{meta.path} asks to add a BOS/EOS token but gives no id for it.")
    tok.post_processor = _post_processor(bos, bos_id, eos, eos_id, add_bos, add_eos, kind == "gpt2")

    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "clean_up_tokenization_spaces": False,
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": _special_token(meta, tokens, "unknown")[0],
        "pad_token": _special_token(meta, tokens, "padding")[0],
    }
    template = meta.get("tokenizer.chat_template")
    if template is not None:
        tokenizer_config["chat_template"] = template
    return tok, tokenizer_config

