"""--chat-template: the prompts wrapped in the model's own chat template equal, string
and token ids, what transformers' apply_chat_template renders for the same user turn."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from sc_jax import cli
from sc_jax.models.tokenizer import ByteTokenizer, Tokenizer, read_chat_settings
from sc_jax.scoring.chat import chat_frame
from sc_jax.scoring.prompts import TEMPLATES, build_pieces

CHATML = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
          "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
          "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
# Gemma's form: the template writes BOS itself, and trims the message.
GEMMA = ("{{ bos_token }}{% for message in messages %}<start_of_turn>user\n"
         "{{ message['content'] | trim }}<end_of_turn>\n{% endfor %}"
         "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
SPECIAL = ["<bos>", "<|im_start|>", "<|im_end|>", "<start_of_turn>", "<end_of_turn>"]
DEMOS = [("a fine film , warm and funny", 1), ("a dull film", 0), ("what a grand film", 1)]
QUERY = "a poor , tired film"


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory):
    """A byte-level BPE tokenizer trained on a few sentences, with the templates'
    special tokens."""
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = [t for t, _ in DEMOS] + [QUERY, "review: sentiment: positive negative", "You are a helpful assistant.",
                                    "system user assistant model"]
    tok.train_from_iterator(text * 20, trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIAL,
                                                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


@pytest.mark.parametrize("chat_template", [CHATML, GEMMA], ids=["chatml", "gemma"])
def test_chat_prompts_are_the_tokenizer_s_own_rendering(tokenizer_file, chat_template):
    transformers = pytest.importorskip("transformers")
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_file), bos_token="<bos>",
                                              eos_token="<|im_end|>")
    hf.chat_template = chat_template
    ours = Tokenizer.from_file(tokenizer_file, bos_token_id=hf.bos_token_id, chat_template=chat_template,
                               special_tokens={"bos_token": "<bos>", "eos_token": "<|im_end|>"})
    template = TEMPLATES["rotten_tomatoes"]
    user = "\n".join([template.demo(t, y) for t, y in DEMOS] + [f"{template.input_prefix} {QUERY}"])
    expected = hf.apply_chat_template([{"role": "user", "content": user}], add_generation_prompt=True,
                                      tokenize=False) + template.label_prefix
    frame = chat_frame(ours)
    assert template.prompt(DEMOS, QUERY, chat=frame) == expected
    pieces = build_pieces(ours, template, DEMOS, [QUERY], chat=frame)
    for label in (0, 1):
        ids = pieces.prompt(range(len(DEMOS)), 0) + list(pieces.labels[label])
        assert ids == hf(expected + " " + template.labels[label], add_special_tokens=False)["input_ids"]
    # The header is the shared prefix of every prompt; the demonstrations' ids are the
    # plain prompts' (position-independent), only the query's end changes.
    plain = build_pieces(ours, template, DEMOS, [QUERY], add_bos=False)
    assert pieces.demos == plain.demos and pieces.bos == tuple(ours.encode(frame[0])) != ()
    assert pieces.prompt([2, 0], 0)[:len(pieces.bos)] == list(pieces.bos)


def test_no_chat_template_is_one_line(tmp_path, capsys):
    with pytest.raises(ValueError, match="m's tokenizer has no chat template"):
        chat_frame(ByteTokenizer(600), "m")
    rows = "".join(json.dumps({"text": f"film {j}", "label": j % 2}) + "\n" for j in range(24))
    (tmp_path / "rt.jsonl").write_text(rows)
    argv = ["run", "--chat-template", "--model", "random:tiny-llama", "--data-file", str(tmp_path / "rt.jsonl"),
            "--shots", "2", "--seeds", "1", "--test-size", "8", "--quiet", "--out", str(tmp_path / "run")]
    assert cli.main(argv) != 0
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("sc_jax:")]
    assert len(err) == 1 and "random:tiny-llama's tokenizer has no chat template" in err[0], err


def test_chat_settings_from_a_model_directory(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": CHATML, "bos_token": {"content": "<bos>"}, "eos_token": "<|im_end|>"}))
    assert read_chat_settings(tmp_path) == {"chat_template": CHATML,
                                            "special_tokens": {"bos_token": "<bos>", "eos_token": "<|im_end|>"}}
    (tmp_path / "chat_template.jinja").write_text(GEMMA)  # transformers' newer place wins
    assert read_chat_settings(tmp_path)["chat_template"] == GEMMA
    assert read_chat_settings(tmp_path / "absent") == {"chat_template": None, "special_tokens": {}}


class _Templated:
    special_tokens = {"bos_token": "<bos>"}

    def __init__(self, template):
        self.chat_template = template


@pytest.mark.parametrize("template, message", [
    ("{% for m in messages %}{{ m.content ", "TemplateSyntaxError, line 1: unexpected end of template"),
    ("{{ messages[1].content }}", "UndefinedError: list object has no element 1"),
    ("{{ nothing.at_all }}", "UndefinedError: 'nothing' is undefined"),
    ("{{ raise_exception('only system turns') }}", None),
])
def test_a_broken_chat_template_is_one_line_naming_it(template, message):
    with pytest.raises(ValueError) as err:
        chat_frame(_Templated(template), "m")
    text = str(err.value)
    assert "\n" not in text and text.endswith("; leave out --chat-template"), text
    if message is None:
        assert text.startswith("--chat-template: the model's chat template refused the prompt: only system turns")
    else:
        assert text.startswith(f"--chat-template: m's chat template cannot be rendered ({message}"), text


@pytest.mark.parametrize("template", ["{{ messages[0].content | upper }}", "{{ messages[0].content | lower }}",
                                      "{{ messages[0].content | replace('\\n', ' ') }}",
                                      "{{ messages[0].content }}{{ messages[0].content }}"])
def test_a_template_that_changes_the_message_is_refused(template):
    with pytest.raises(ValueError, match=r"^--chat-template: m's chat template does not write the user's message "
                                         r"once, as given \(it changes or repeats it\)"):
        chat_frame(_Templated(template), "m")
    # Trimming the message's outer spaces changes no prompt: Gemma's and Llama 3's form.
    assert chat_frame(_Templated("<u>{{ messages[0].content | trim }}</u>"), "m") == ("<u>", "</u>")
