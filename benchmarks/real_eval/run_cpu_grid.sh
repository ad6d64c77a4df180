#!/usr/bin/env bash
# The CPU grid of issue 17, run in the background and resumable: each run's score cache
# lives in its committed directory (benchmarks/real_eval/<model>/<kN>/cache, a few kB per
# entry), so a run interrupted in one session resumes in the next from what was committed.
# A finished run's cache is committed as one archive, <kN>/cache.tar.xz (score_cache.sh).
# Usage: benchmarks/real_eval/run_cpu_grid.sh   (from the repository root, after the
# README's install with the data and gguf extras).
set -uo pipefail
cd "$(dirname "$0")/../.."
# Bad input before hours of scoring: the install and the data must be there.
[ -x .venv/bin/sc-jax ] || { echo "no .venv/bin/sc-jax: run python3 -m venv .venv && .venv/bin/pip install -c constraints.txt -e '.[gguf,data]'" >&2; exit 2; }
[ -d ../shared/datasets ] || { echo "no ../shared/datasets: the nine JSONL files are expected there" >&2; exit 2; }
common=(--dataset all --seed-list 0 1 2 --data-dir ../shared/datasets --test-size 128
        --budget 300 --guard bias_only --quiet)
run() {  # model, k, m-cap, directory
    echo "== $(date -u +%FT%TZ) $1 k=$2 m-cap=$3 -> $4"
    # A finished run keeps its cache in cache.tar.xz: extract it first, or sc-jax would
    # find cache/ empty and score the whole run again (hours); pack it again afterwards
    # (the same bytes unless this run scored something new).
    local packed=0
    [ -f "$4/cache.tar.xz" ] && packed=1
    benchmarks/real_eval/score_cache.sh restore "$4" || return
    .venv/bin/sc-jax run --model "$1" --shots "$2" --m-cap "$3" "${common[@]}" --out "$4"
    local rc=$?
    [ "$packed" = 1 ] && benchmarks/real_eval/score_cache.sh pack "$4"
    echo "== $(date -u +%FT%TZ) exit $rc"
}
run qwen2.5-0.5b 4 4 benchmarks/real_eval/qwen2.5-0.5b/k4
run default 8 4 benchmarks/real_eval/smollm2-135m/k8
run qwen2.5-0.5b 8 4 benchmarks/real_eval/qwen2.5-0.5b/k8
