"""Tokenizers: a thin wrapper over Hugging Face ``tokenizers`` (no transformers, no
torch), and a byte-level stand-in for random-weight presets."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer


class Tokenizer:
    """Text <-> token ids. ``encode`` never adds special tokens: prompts are assembled
    from ids by the caller, who decides where a BOS goes. ``chat_template``: the model's
    Jinja chat template (its tokenizer_config.json's or .gguf file's), None where it has
    none; ``special_tokens``: the strings a template names (``bos_token``, ``eos_token``)."""

    chat_template: str | None = None
    special_tokens: dict = {}

    def __init__(self, tok, *, bos_token_id: int | None = None, eos_token_id: int | None = None,
                 chat_template: str | None = None, special_tokens: dict | None = None):
        self._tok = tok
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.chat_template = chat_template
        self.special_tokens = dict(special_tokens or {})

    @classmethod
    def from_file(cls, path: str | Path, **kw) -> "Tokenizer":
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(
                f"{path} not found: sc_jax needs a fast-tokenizer file (tokenizer.json). "
                "Create one with transformers: AutoTokenizer.from_pretrained(dir).save_pretrained(dir)")
        try:
            return cls(HFTokenizer.from_file(str(path)), **kw)
        except Exception as e:  # tokenizers raises a bare Exception on bad JSON
            raise ValueError(f"{path} is not a valid tokenizer.json: {e}") from e

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [list(e.ids) for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)


class ByteTokenizer(Tokenizer):
    """Stand-in for random-weight presets: 0 pad, 1 BOS, 2 EOS, ``3 + b`` for byte b,
    and ``259 + b`` for a space followed by byte b (as BPE tokenizers fold a leading
    space into the word, so " positive" and " negative" start with different
    tokens). Needs a vocabulary of at least 515. Throughput benchmarks only need
    plausible token counts."""

    OFFSET = 3
    SPACE_OFFSET = 259

    def __init__(self, vocab_size: int):
        if vocab_size < self.SPACE_OFFSET + 256:
            raise ValueError(f"ByteTokenizer needs a vocabulary of at least 515, got {vocab_size}")
        self._vocab_size = vocab_size
        self.bos_token_id, self.eos_token_id = 1, 2

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def encode(self, text: str) -> list[int]:
        b = text.encode("utf-8")
        out, j = [], 0
        while j < len(b):
            if b[j] == 0x20 and j + 1 < len(b) and b[j + 1] != 0x20:
                out.append(self.SPACE_OFFSET + b[j + 1])
                j += 2
            else:
                out.append(self.OFFSET + b[j])
                j += 1
        return out

    def encode_batch(self, texts):
        return [self.encode(t) for t in texts]

    def decode(self, ids) -> str:
        out = bytearray()
        for i in ids:
            if self.SPACE_OFFSET <= i < self.SPACE_OFFSET + 256:
                out += bytes([0x20, i - self.SPACE_OFFSET])
            elif self.OFFSET <= i < self.SPACE_OFFSET:
                out.append(i - self.OFFSET)
        return out.decode("utf-8", errors="replace")

    def token_to_id(self, token: str) -> int | None:
        ids = self.encode(token)
        return ids[0] if len(ids) == 1 else None


def chat_settings(config: dict, directory: str | Path | None = None) -> dict:
    """``Tokenizer`` keywords ``chat_template`` and ``special_tokens`` from a
    tokenizer_config.json's contents ``config`` (a .gguf file's, or a model directory's;
    ``directory``: where a ``chat_template.jinja`` beside it takes precedence, as in
    transformers). A list of named templates gives its "default"."""
    template = config.get("chat_template")
    jinja = Path(directory) / "chat_template.jinja" if directory is not None else None
    if jinja is not None and jinja.is_file():
        template = jinja.read_text(encoding="utf-8")
    if isinstance(template, list):
        template = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}.get("default")
    specials = {}
    for key in ("bos_token", "eos_token"):
        value = config.get(key)
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            specials[key] = value
    return {"chat_template": template if isinstance(template, str) else None, "special_tokens": specials}


def read_chat_settings(directory: str | Path) -> dict:
    """:func:`chat_settings` of a model directory's tokenizer_config.json (none: no
    chat template)."""
    path = Path(directory) / "tokenizer_config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError):  # an unreadable config names no chat template
        config = {}
    return chat_settings(config if isinstance(config, dict) else {}, directory)
