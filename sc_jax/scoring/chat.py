"""A model's chat template around the prompts (``--chat-template``).

The template (Jinja, from the model's tokenizer_config.json or .gguf file) is rendered
once, as transformers' ``apply_chat_template`` renders it, for one user turn holding a
sentinel and the assistant turn's opening (``add_generation_prompt``). The text before
the sentinel is the :func:`chat_frame` header, the text after it the footer:

    header  demo_1 SEP ... demo_i SEP <input prefix> <text>  footer  <label prefix> <label>

so the user turn holds the demonstrations and the query's text, the assistant's turn
opens and the label prefix and label word follow, as the demonstrations write them. The
header is the same for every prompt: it takes BOS's place at the root of the prefix
trie (:class:`sc_jax.scoring.prompts.PromptPieces`), and each demonstration's tokens stay
those of the plain prompts.
"""

from __future__ import annotations

import datetime

__all__ = ["chat_frame", "render_chat"]

# Mixed case, inner spaces, punctuation and a newline: a template that transforms the
# message (| upper, | lower, | replace) changes it and is refused, instead of rendering
# other prompts than the ones scored. No outer space: templates that `| trim` the
# message (Llama 3's) trim nothing of a prompt, whose text starts and ends with words.
_SENTINEL = "ScJax user-turn Sentinel,\n  kept AS given."


def render_chat(template: str, messages, special_tokens: dict, *, add_generation_prompt: bool = True) -> str:
    """``template`` rendered for ``messages`` (a list of {"role", "content"}), as
    transformers renders a chat template: a sandboxed Jinja environment with
    ``trim_blocks`` and ``lstrip_blocks``, loop controls, ``raise_exception`` and
    ``strftime_now``, the special tokens' strings as variables."""
    try:
        from jinja2.ext import loopcontrols  # only --chat-template needs jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment  # (with transformers)
    except ImportError:
        raise ImportError("--chat-template renders the model's chat template with jinja2, which is "
                          "not installed: pip install jinja2") from None

    def raise_exception(message):
        raise ValueError(f"the model's chat template refused the prompt: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env.from_string(template).render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                            **special_tokens)


def chat_frame(tokenizer, model: str = "the model") -> tuple[str, str]:
    """``(header, footer)``: the text the model's chat template puts before and after a
    user turn's content, the assistant turn's opening included in the footer.

    Raises ValueError (one line naming ``model``) where the tokenizer has no chat
    template, or its template does not hold the user's content once, verbatim."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise ValueError(f"--chat-template: {model}'s tokenizer has no chat template (none in its "
                         "tokenizer_config.json or .gguf file); leave out --chat-template")
    try:
        text = render_chat(template, [{"role": "user", "content": _SENTINEL}],
                           getattr(tokenizer, "special_tokens", {}))
    except ImportError:
        raise
    except ValueError as e:  # raise_exception() inside the template
        raise ValueError(f"--chat-template: {e} ({model}); leave out --chat-template") from None
    except Exception as e:  # noqa: BLE001  (jinja2's TemplateSyntaxError, UndefinedError, ...)
        where = f", line {e.lineno}" if getattr(e, "lineno", None) else ""
        detail = " ".join(str(e).split())
        raise ValueError(f"--chat-template: {model}'s chat template cannot be rendered "
                         f"({type(e).__name__}{where}: {detail}); leave out --chat-template") from None
    if text.count(_SENTINEL) != 1:
        raise ValueError(f"--chat-template: {model}'s chat template does not write the user's "
                         "message once, as given (it changes or repeats it); leave out --chat-template")
    header, footer = text.split(_SENTINEL)
    return header, footer
