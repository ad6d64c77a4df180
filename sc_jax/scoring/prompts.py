"""Prompt templates (paper Appendix C) and prompt assembly from token ids.

A demonstration is ``"<input prefix> <text>\\n<label prefix> <label word>"``, a query
is ``"<input prefix> <text>\\n<label prefix>"``, and a prompt is

    [BOS] demo_1 SEP demo_2 SEP ... demo_i SEP query          (SEP = "\\n")

as in the reference code (each demonstration line ends with a newline). The model's
answer is the next token(s) after the label prefix; the label word is scored with its
leading space (" positive"), which is how it is written in the demonstrations and so
how the model would naturally emit it.

Tokenization is done once per piece, and prompts are assembled from ids, so every
permutation of the same demonstrations sees identical tokens:

* the body of a demo or query is tokenized *after the separator* (``"\\n" + body``,
  minus the separator's tokens), i.e. exactly as it appears in the middle of a prompt;
* the label word is tokenized after its label prefix, minus the prefix's tokens;
* the separator is tokenized after a letter.

For byte-level BPE tokenizers (the default model, GPT-2 style, Qwen2) this gives the
same ids as tokenizing the joined string (a test checks it on our templates). For
SentencePiece tokenizers (Llama-2, Mistral) one difference remains: the first
demonstration of a joined string starts with a word-boundary marker ("▁review")
that the same demonstration lacks in any other position; we use the mid-prompt form
everywhere so that a demonstration's tokens never depend on its position.

Input texts are whitespace-normalised (any run of whitespace, newlines included,
becomes one space) so that a text can never break the template's line structure.
"""

from __future__ import annotations

import dataclasses
import numbers

import numpy as np


@dataclasses.dataclass(frozen=True)
class Template:
    """A task's prompt format: ``input_prefix``, ``label_prefix`` (both without
    trailing space) and the label words, class 0 first."""

    input_prefix: str
    label_prefix: str
    labels: tuple[str, ...]
    separator: str = "\n"

    def __post_init__(self):
        if len(self.labels) < 2:
            raise ValueError(f"a template needs at least two labels, got {self.labels}")
        if len(set(self.labels)) != len(self.labels):
            raise ValueError(f"label words must be distinct, got {self.labels}")

    @property
    def n_classes(self) -> int:
        return len(self.labels)

    @classmethod
    def from_string(cls, fmt: str, labels) -> Template:
        """The template written as one demonstration, its text and label as the slots
        ``{text}`` and ``{label}``: ``"review: {text}\\nsentiment: {label}"`` is
        ``Template("review:", "sentiment:", labels)``. The format is this module's
        (:meth:`demo`): an input prefix, a space, the text, a newline, a label prefix, a
        space, the label word; anything else raises ValueError naming the slot."""
        if not isinstance(fmt, str):
            raise ValueError(f"the template must be a string, got {type(fmt).__name__}")
        for slot in ("{text}", "{label}"):
            if fmt.count(slot) != 1:
                raise ValueError(f"the template must hold the slot {slot} once, got {fmt!r}")
        head, _, rest = fmt.partition(" {text}")
        label_prefix, found, tail = rest.partition(" {label}")
        if "{text}" in head or not found or tail or not label_prefix.startswith("\n"):
            raise ValueError(f"the template must read 'PREFIX {{text}}\\nLABEL PREFIX {{label}}' "
                             f"(a space before each slot, a newline between the lines, nothing "
                             f"after {{label}}), got {fmt!r}")
        template = cls(head, label_prefix[1:], tuple(labels))
        if "\n" in template.input_prefix + template.label_prefix:
            raise ValueError(f"the template's prefixes must be one line each, got {fmt!r}")
        return template

    @property
    def format(self) -> str:
        """The template as :meth:`from_string` reads it."""
        return f"{self.input_prefix} {{text}}\n{self.label_prefix} {{label}}"

    def body(self, text: str) -> str:
        """The query form: ``"<input prefix> <text>\\n<label prefix>"``."""
        return f"{self.input_prefix} {normalise(text)}\n{self.label_prefix}"

    def demo(self, text: str, label: int) -> str:
        return f"{self.body(text)} {self.labels[label]}"

    def chat_query(self, text: str, footer: str) -> str:
        """The query in a chat prompt (:mod:`sc_jax.scoring.chat`): its input line, the
        chat template's footer (the user turn's end, the assistant turn's opening), then
        the label prefix: ``"<input prefix> <text><footer><label prefix>"``."""
        return f"{self.input_prefix} {normalise(text)}{footer}{self.label_prefix}"

    def prompt(self, demos, query: str, chat: tuple[str, str] | None = None) -> str:
        """The joined string of a prompt (for display and for the tokenization test).
        ``demos``: sequence of (text, label); ``chat``: the chat template's (header,
        footer) (:func:`sc_jax.scoring.chat.chat_frame`), None for the plain prompt."""
        parts = [self.demo(t, y) for t, y in demos]
        if chat is None:
            return self.separator.join(parts + [self.body(query)])
        header, footer = chat
        return header + self.separator.join(parts + [self.chat_query(query, footer)])


def normalise(text: str) -> str:
    return " ".join(str(text).split())


# Paper Appendix C, Table "Prompt templates and label words".
TEMPLATES: dict[str, Template] = {
    "sst2": Template("sentence:", "sentiment:", ("negative", "positive")),
    "sst5": Template("sentence:", "sentiment:", ("terrible", "bad", "neutral", "good", "great")),
    "rotten_tomatoes": Template("review:", "sentiment:", ("negative", "positive")),
    "financial_phrasebank": Template("sentence:", "sentiment:", ("negative", "neutral", "positive")),
    "subj": Template("review:", "type:", ("objective", "subjective")),
    "trec": Template("question:", "target:", ("abbreviation", "entity", "description", "person",
                                              "location", "number")),
    "ag_news": Template("news:", "topic:", ("world", "sports", "business", "technology")),
    "tweet_eval_emotion": Template("tweet:", "emotion:", ("anger", "joy", "optimism", "sadness")),
    "tweet_eval_hate": Template("tweet:", "hate speech:", ("non-hate", "hate")),
}


def encode_after(tokenizer, anchor: str, text: str) -> list[int]:
    """Token ids of ``text`` as it is tokenized right after ``anchor``.

    Raises ValueError if the anchor's own tokens change when ``text`` follows (a merge
    across the boundary), since then no position-independent ids exist.
    """
    a = tokenizer.encode(anchor)
    full = tokenizer.encode(anchor + text)
    if full[: len(a)] != a:
        raise ValueError(f"tokens merge across the boundary {anchor!r} | {text[:30]!r}; "
                         "choose a separator or prefix that ends the previous token")
    return full[len(a):]


def tokenizer_adds_bos(tokenizer) -> bool:
    """Whether this model's prompts start with BOS: True when the tokenizer's own
    post-processor adds one (Llama-2, Mistral), False otherwise (GPT-2-style BPE, e.g.
    the default SmolLM2)."""
    inner = getattr(tokenizer, "_tok", None)
    if inner is None:  # ByteTokenizer stand-in: behave like Llama
        return tokenizer.bos_token_id is not None
    with_special = inner.encode("a", add_special_tokens=True).ids
    without = inner.encode("a", add_special_tokens=False).ids
    return len(with_special) > len(without) and with_special[0] == tokenizer.bos_token_id


@dataclasses.dataclass(frozen=True)
class PromptPieces:
    """Token ids of everything a run needs, each tokenized once.

    demos: ``[k]`` lists (body + label word); queries: lists (bodies ending with the
    label prefix); labels: ``[n_classes]`` lists (label word with its leading space);
    sep: separator ids; bos: ``[]`` or ``[bos_id]``, or a chat template's header.
    """

    demos: tuple[tuple[int, ...], ...]
    demo_labels: tuple[int, ...]
    queries: tuple[tuple[int, ...], ...]
    labels: tuple[tuple[int, ...], ...]
    sep: tuple[int, ...]
    bos: tuple[int, ...]

    def prompt(self, context, query: int) -> list[int]:
        """Full ids of ``context`` (demo indices, in order) followed by query ``query``."""
        ids = list(self.bos)
        for j in context:
            ids += list(self.demos[j]) + list(self.sep)
        return ids + list(self.queries[query])

    def segment(self, demo: int) -> list[int]:
        """The trie node segment of one demonstration: its ids and the separator."""
        return list(self.demos[demo]) + list(self.sep)

    def prompt_lengths(self, contexts, pairs, mode: str = "first_token") -> np.ndarray:
        """Tokens of every prompt ``pairs`` names: int64 ``[N]`` for ``contexts`` ``[M, i]``
        (demo indices) and ``pairs`` ``[N, 2]`` (context index, query index). In
        ``"sequence"`` mode a prompt also holds all but the last token of the longest
        label. Exact per pair (not the longest context plus the longest query): a long
        demonstration is never its own query, and the check must not claim it is."""
        contexts = np.asarray(contexts, np.int64).reshape(len(contexts), -1)
        pairs = np.asarray(pairs, np.int64).reshape(-1, 2)
        seg = np.asarray([len(d) + len(self.sep) for d in self.demos], np.int64)
        qlen = np.asarray([len(q) for q in self.queries], np.int64)
        extra = max(len(lab) for lab in self.labels) - 1 if mode == "sequence" else 0
        ctx_len = seg[contexts].sum(1) if contexts.size else np.zeros(len(contexts), np.int64)
        return len(self.bos) + ctx_len[pairs[:, 0]] + qlen[pairs[:, 1]] + extra


def build_pieces(tokenizer, template: Template, demos, queries, *, add_bos: bool | None = None,
                 chat: tuple[str, str] | None = None) -> PromptPieces:
    """Tokenize demonstrations ``[(text, label)]`` and query texts once. ``chat``: the
    model's chat template's (header, footer) (:func:`sc_jax.scoring.chat.chat_frame`):
    the header's tokens open every prompt in BOS's place (the template writes its own
    BOS where it has one) and each query ends with the footer and the label prefix.

    Raises ValueError for an empty demonstration set or labels out of range.
    """
    demos = list(demos)
    n = template.n_classes
    for j, (_, y) in enumerate(demos):
        # A label word ("positive") or a float is a caller's slip that int() would
        # answer with "invalid literal" or silently truncate.
        if isinstance(y, bool) or not isinstance(y, numbers.Integral):
            raise ValueError(f"demonstration {j} has label {y!r}: labels are class ids, integers "
                             f"0..{n - 1} in the template's order ({', '.join(template.labels)})")
        if not 0 <= int(y) < n:
            raise ValueError(f"demonstration {j} has label {y}, outside 0..{n - 1}")
    sep = template.separator
    labels = tuple(tuple(encode_after(tokenizer, template.label_prefix, " " + w)) for w in template.labels)
    for w, ids in zip(template.labels, labels):
        if not ids:
            raise ValueError(f"label word {w!r} tokenizes to nothing")
    bodies = [tuple(encode_after(tokenizer, sep, template.body(t))) for t, _ in demos]
    demo_ids = tuple(b + labels[int(y)] for b, (_, y) in zip(bodies, demos))
    query_text = template.body if chat is None else (lambda t: template.chat_query(t, chat[1]))
    q_ids = tuple(tuple(encode_after(tokenizer, sep, query_text(t))) for t in queries)
    sep_ids = tuple(encode_after(tokenizer, "a", sep))
    if add_bos is None:
        add_bos = chat is None and tokenizer_adds_bos(tokenizer)
    if chat is not None:
        bos = tuple(tokenizer.encode(chat[0]))
    else:
        bos = (tokenizer.bos_token_id,) if add_bos and tokenizer.bos_token_id is not None else ()
    return PromptPieces(demo_ids, tuple(int(y) for _, y in demos), q_ids, labels, sep_ids, bos)

