"""Tokenizers: a thin wrapper over Hugging Face ``tokenizers`` (no transformers, no
torch), and a byte-level stand-in for random-weight presets."""

from __future__ import annotations

from pathlib import Path


class Tokenizer:
    """Text <-> token ids. ``encode`` never adds special tokens: prompts are assembled
    from ids by the caller, who decides where a BOS goes."""

    def __init__(self, tok, *, bos_token_id: int | None = None, eos_token_id: int | None = None):
        self._tok = tok
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id

    @classmethod
    def from_file(cls, path: str | Path, **kw) -> "Tokenizer":
        from tokenizers import Tokenizer as HFTokenizer

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
    """Stand-in for random-weight presets: one token per UTF-8 byte, id = byte + 3
    (0 pad, 1 BOS, 2 EOS). Its speed characteristics are not a real tokenizer's, but
    throughput benchmarks only need plausible token counts."""

    OFFSET = 3

    def __init__(self, vocab_size: int):
        if vocab_size < 256 + self.OFFSET:
            raise ValueError(f"ByteTokenizer needs a vocabulary of at least 259, got {vocab_size}")
        self._vocab_size = vocab_size
        self.bos_token_id, self.eos_token_id = 1, 2

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def encode(self, text: str) -> list[int]:
        return [b + self.OFFSET for b in text.encode("utf-8")]

    def encode_batch(self, texts):
        return [self.encode(t) for t in texts]

    def decode(self, ids) -> str:
        return bytes(i - self.OFFSET for i in ids if i >= self.OFFSET and i < 256 + self.OFFSET
                     ).decode("utf-8", errors="replace")

    def token_to_id(self, token: str) -> int | None:
        b = token.encode("utf-8")
        return b[0] + self.OFFSET if len(b) == 1 else None
