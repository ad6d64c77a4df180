"""The paper's result tables as JSON, for comparing this project's runs with them.

Macro-F1 and accuracy at k = 4, 8 and 16, for Qwen2-7B-Instruct, Llama-2-7B-chat and
Mistral-7B-Instruct-v0.3 (keyed by the paper's short names, Qwen, Llama and Mistral;
`PAPER_MODELS` maps them) and the methods Base, CC, DC, BC and SC: mean and s.d. over five seeds, keyed by this project's
task names. Each row's Avg column is checked against the mean of its cells, and any
mismatch above rounding is printed (the paper's own).

  python benchmarks/real_eval/paper_tables.py ../shared/paper/supervised_calibration.tex \\
      --out benchmarks/real_eval/paper_7b_tables.json
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

TASKS = {"AGNews": "ag_news", "FPB": "financial_phrasebank", "SST2": "sst2",
         "RT": "rotten_tomatoes", "Subj": "subj", "TE-Emo": "tweet_eval_emotion",
         "TE-Hate": "tweet_eval_hate", "SST5": "sst5", "TREC": "trec"}
# The paper's short names for its models (its Appendix's tables) and the checkpoints
# they stand for (its "Models and Baselines" paragraph): all three instruction-tuned,
# run unquantised from Hugging Face.
PAPER_MODELS = {"Qwen": "Qwen2-7B-Instruct", "Llama": "Llama-2-7B-chat",
                "Mistral": "Mistral-7B-Instruct-v0.3"}
METHODS = {"Base LLM": "base", "CC": "cc", "DC": "dc", "BC": "bc", r"\MethodName{}": "sc"}
NUMBER = re.compile(r"(\d+\.\d+)")


def parse(tex: str) -> tuple[dict, list[str]]:
    """{"<metric>_k<k>": {model: {method: {task: {"mean", "sd"}}}}} and the Avg
    mismatches found."""
    lines = tex.splitlines()
    out, mismatches = {}, []
    for start, line in enumerate(lines):
        m = re.search(r"\\label\{tab:(macro_f1|accuracy)_k_(\d+)\}", line)
        if not m:
            continue
        key = f"{m.group(1)}_k{m.group(2)}"
        i = start
        while not lines[i].startswith("Model"):
            i += 1
        cols = [c.strip() for c in lines[i].rstrip("\\ ").split("&")][3:]
        table, block = {}, []
        for row in lines[i + 1:]:
            if row.startswith((r"\midrule", r"\bottomrule")) and block:
                # Five method rows per model; the model is named on one of them.
                model = next(cells[0] for cells in block if cells[0])
                for cells in block:
                    values = {}
                    for name, cell in zip(cols, cells[3:]):
                        nums = [float(x) for x in NUMBER.findall(cell)]
                        values[TASKS[name]] = {"mean": nums[0],
                                               "sd": nums[1] if len(nums) > 1 else None}
                    method = METHODS[cells[1]]
                    table.setdefault(model, {})[method] = values
                    avg = float(NUMBER.findall(cells[2])[0])
                    mean = statistics.mean(v["mean"] for v in values.values())
                    if abs(avg - mean) > 0.02:  # cells rounded to 0.01
                        mismatches.append(f"{key} {model} {method}: Avg {avg} but the "
                                          f"cells' mean is {mean:.2f}")
                block = []
            if row.startswith(r"\bottomrule"):
                break
            if "&" in row:
                block.append([c.strip() for c in row.rstrip().rstrip("\\").split("&")])
        out[key] = table
    return out, mismatches


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("tex")
    p.add_argument("--out", default="benchmarks/real_eval/paper_7b_tables.json")
    args = p.parse_args(argv)
    if not Path(args.tex).is_file():
        p.error(f"no such file: {args.tex}")
    tables, mismatches = parse(Path(args.tex).read_text())
    Path(args.out).write_text(json.dumps(tables, indent=1) + "\n")
    for key, table in tables.items():
        print(f"{key}: {', '.join(table)}; tasks {', '.join(next(iter(table.values()))['sc'])}")
    for line in mismatches:
        print("Avg mismatch:", line)
    print(f"JSON: {args.out}")


if __name__ == "__main__":
    main()
