#!/usr/bin/env bash
# The workbench evidence: SC against the 2024-25 methods (LOOC, LinC, Surprise, Hidden
# Calibration) on the same scores, with the three real models at k = 4, in the background
# and resumable: one run per (model, k, task), each with its score cache in its directory
# (benchmarks/real_eval/workbench/<model>/k<k>/<task>/cache), so an interrupted grid keeps
# every finished run and resumes the next from what was scored. TASKS and SHOTS narrow or
# widen the grid (defaults below: what fits a 2-core CPU in about an hour: 64 test queries per task).
# Usage: benchmarks/real_eval/run_workbench.sh   (from the repository root, after the
# README's install with the gguf extra).
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -x .venv/bin/sc-jax ] || { echo "no .venv/bin/sc-jax: run python3 -m venv .venv && .venv/bin/pip install -c constraints.txt -e '.[gguf]'" >&2; exit 2; }
[ -d ../shared/datasets ] || { echo "no ../shared/datasets: the nine JSONL files are expected there (sc-jax export-tasks DIR rebuilds them)" >&2; exit 2; }
TASKS=${TASKS:-"sst2 subj tweet_eval_emotion"}
SHOTS=${SHOTS:-4}
METHODS=${METHODS:-"base cc dc bc bc_reference sc_star sc_star_free sc sc_paper looc linc hidden surprise"}
for k in $SHOTS; do
    # Task by task, each with the three models: a grid cut short still compares the models.
    for task in $TASKS; do
        for model in default gemma3-270m qwen2.5-0.5b; do
            dir=benchmarks/real_eval/workbench/$model/k$k/$task
            [ -f "$dir/results.json" ] && { echo "== $dir: done"; continue; }
            echo "== $(date -u +%FT%TZ) $model k=$k $task -> $dir"
            # shellcheck disable=SC2086
            .venv/bin/sc-jax run --model "$model" --shots "$k" --dataset "$task" --seed-list 0 1 2 \
                --data-dir ../shared/datasets --test-size 64 --m-cap 4 --budget 300 \
                --guard bias_only --methods $METHODS --out "$dir" --overwrite
            echo "== $(date -u +%FT%TZ) exit $?"
        done
    done
done
