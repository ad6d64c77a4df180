#!/usr/bin/env bash
# The workbench over the nine tasks (issue 79), reusing every committed score: one
# `sc-jax run` per (model, k) into benchmarks/real_eval/workbench/<model>_k<k>/, in the
# background and resumable (each run's score cache is in its directory; a finished run,
# one with results.json, is skipped).
#   1. The four committed reported runs (SmolLM2-135M-Instruct and Qwen2.5-Coder-0.5B-Instruct,
#      k = 4 and 8): their caches (key format 1, served and rewritten: docs/experiment.md)
#      restored into the new run's cache/, and every method their scores allow computed with
#      their configuration. The only new forward passes are LOOC's leave-one-out prompts at
#      k = 8 (max size 5 < k - 1). Hidden Calibration is left out: those caches hold no states.
#   2. Gemma-3-270M on the nine tasks at k = 4, scored here, hidden states included.
# Usage: benchmarks/real_eval/run_evidence.sh [reuse|gemma|all]   (repository root, after the
# README's install with the gguf extra); then
#   python benchmarks/real_eval/workbench_table.py benchmarks/real_eval/workbench/*_k* \
#       --out benchmarks/real_eval/workbench/table.md --readme README.md
set -uo pipefail
cd "$(dirname "$0")/../.."
SC_JAX=${SC_JAX:-.venv/bin/sc-jax}
[ -d ../shared/datasets ] || { echo "no ../shared/datasets: the nine JSONL files are expected there (sc-jax export-tasks DIR rebuilds them)" >&2; exit 2; }
what=${1:-all}
PAPER="base cc dc bc bc_reference sc_star sc_star_free sc sc_paper looc linc surprise"
common=(--dataset all --seed-list 0 1 2 --data-dir ../shared/datasets --test-size 128 --max-size 5
        --budget 300 --guard bias_only --log-samples --quiet --overwrite)

run() {  # run MODEL K M_CAP SOURCE_RUN METHODS...
    local model=$1 k=$2 mcap=$3 src=$4; shift 4
    local out=benchmarks/real_eval/workbench/${model}_k$k
    [ -f "$out/results.json" ] && { echo "== $out: done"; return 0; }
    mkdir -p "$out"
    if [ -n "$src" ] && [ ! -d "$out/cache" ]; then
        tar -xJf "benchmarks/real_eval/$src/cache.tar.xz" -C "$out"
    fi
    echo "== $(date -u +%FT%TZ) $model k=$k -> $out"
    # shellcheck disable=SC2068
    "$SC_JAX" run --model "$(named "$model")" --shots "$k" --m-cap "$mcap" "${common[@]}" --methods $@ --out "$out"
    echo "== $(date -u +%FT%TZ) $model k=$k exit $?"
}
named() { case $1 in smollm2-135m) echo default ;; *) echo "$1" ;; esac; }

if [ "$what" = reuse ] || [ "$what" = all ]; then
    run smollm2-135m 4 8 smollm2-135m/k4 $PAPER
    run qwen2.5-0.5b 4 4 qwen2.5-0.5b/k4 $PAPER
    run smollm2-135m 8 4 smollm2-135m/k8 $PAPER
    run qwen2.5-0.5b 8 4 qwen2.5-0.5b/k8 $PAPER
fi
if [ "$what" = gemma ] || [ "$what" = all ]; then
    run gemma3-270m 4 4 "" $PAPER hidden
fi
