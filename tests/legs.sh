#!/usr/bin/env bash
# The test suite on every supported stack, one leg after another; CI's .ci/run runs this
# (the README's test command). Each leg makes its own virtual environment:
#
#   oldest     .venv              Python 3.11, jax 0.10.2 and the rest of constraints.txt,
#                                 torch 2.13.0 (CPU): the whole suite, parity tests included,
#                                 and benchmarks/bench_peer.py --smoke (the engine against
#                                 HF transformers).
#   newest     .venv-newest       Python 3.13, the newest jax and flax (constraints-newest.txt),
#                                 no torch: the whole suite; the torch parity tests skip.
#   gpu-image  .venv-gpu-image    the GPU machines' stack on CPU (constraints-gpu-image.txt):
#                                 Python 3.12, jax 0.11.2, jaxopt and gguf added --no-deps,
#                                 sc_jax NOT installed but imported from the checkout
#                                 (PYTHONPATH=.), running benchmarks/accelerator_suite.py
#                                 --smoke exactly as benchmarks/RESULTS.md says to run the
#                                 suite there, and benchmarks/gpu_check.py --smoke (which
#                                 runs bench_seed's two phases).
#
# Usage: tests/legs.sh [oldest|newest|gpu-image ...]   (no argument: all three, in that order)
# Python 3.12 and 3.13 are found on PATH or under pyenv ($PYENV_ROOT, ~/.pyenv); set
# SC_JAX_PYTHON312 / SC_JAX_PYTHON313 to choose others. Extra pytest arguments: PYTEST_ARGS.
# Each pytest leg prints its 15 slowest tests (--durations), so where CI's time goes stays
# visible in its log.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1

find_python() {  # find_python 3.13 -> the path of a working python3.13
    local want=$1 override=$2 c
    for c in ${!override:-} "python$want" "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$want"*/bin/"python$want"; do
        if [ -n "$c" ] && "$c" -c "import sys; assert sys.version_info[:2] == tuple(map(int, '$want'.split('.')))" 2>/dev/null; then
            command -v "$c"
            return
        fi
    done
    echo "tests/legs.sh: no Python $want found (tried PATH and pyenv); set $override to one" >&2
    return 1
}

leg_start() { echo "== leg $1: $(date -u +%FT%TZ)"; leg_t0=$(date +%s); }
leg_end() { echo "== leg $1 passed in $(( $(date +%s) - leg_t0 )) s"; }

oldest() {
    leg_start oldest
    python3 -m venv .venv && .venv/bin/pip install -q -c constraints.txt -e ".[test]"
    .venv/bin/python -m pytest -q --durations=15 ${PYTEST_ARGS:-}
    # The engine against HF transformers (PyTorch), which only this leg has: the script
    # fails where their label log-probs differ by more than 1e-3 (float32).
    local out
    out=$(mktemp -d)
    .venv/bin/python benchmarks/bench_peer.py --smoke --out "$out/peer.json"
    rm -rf "$out"
    leg_end oldest
}

newest() {
    leg_start newest
    local py
    py=$(find_python 3.13 SC_JAX_PYTHON313)
    "$py" -m venv .venv-newest && .venv-newest/bin/pip install -q -c constraints-newest.txt -e ".[test]"
    .venv-newest/bin/python -m pytest -q --durations=15 ${PYTEST_ARGS:-}
    leg_end newest
}

gpu_image() {
    leg_start gpu-image
    local py out
    py=$(find_python 3.12 SC_JAX_PYTHON312)
    "$py" -m venv .venv-gpu-image
    # What the image holds, then the two wheels carried there; never this package.
    .venv-gpu-image/bin/pip install -q -c constraints-gpu-image.txt jax jaxlib flax optax numpy \
        scipy transformers tokenizers safetensors huggingface_hub matplotlib tqdm flatbuffers
    .venv-gpu-image/bin/pip install -q --no-deps -c constraints-gpu-image.txt jaxopt gguf
    out=$(mktemp -d)
    PYTHONPATH=. JAX_PLATFORMS=cpu .venv-gpu-image/bin/python benchmarks/accelerator_suite.py \
        --smoke --out "$out/suite"
    .venv-gpu-image/bin/python - "$out/suite/suite.json" <<'EOF'
import json, sys
# The checks tests/benchmarks/test_accelerator_suite.py makes, on the image's stack,
# and those of the SC seed section, which only this leg runs.
out = json.load(open(sys.argv[1]))
assert out["scoring"]["max_abs_diff_engine_vs_plain"] <= 1e-4, out["scoring"]
for r in out["solvers"]:
    assert r["jax_not_converged"] == 0 and r["max_rel_gap"] <= 1e-4, r
e = out["end_to_end"]  # the SC seed section, which the pytest test skips
assert e["status"] == "ok" and e["forward_s"] > 0 and len(e["sc_macro_f1"]) == 1, e
print("gpu-image: accelerator suite smoke checks passed on jax", out["device"]["jax"])
EOF
    # The one device command of a lent GPU machine (benchmarks/gpu_check.py), every phase:
    # the stack, the attention candidates, one seed cold and in a second process (the
    # script makes bench_seed's checks: the timing adds up, the second process compiles no
    # model program), two tasks in one run projected to a small grid (its records and
    # projections add up); the peer phase records that this stack has no torch.
    PYTHONPATH=. JAX_PLATFORMS=cpu .venv-gpu-image/bin/python benchmarks/gpu_check.py \
        --smoke --out "$out/gpu_check.json"
    rm -rf "$out"
    leg_end gpu-image
}

legs=("$@")
[ ${#legs[@]} -eq 0 ] && legs=(oldest newest gpu-image)
for leg in "${legs[@]}"; do
    case $leg in
        oldest) oldest ;;
        newest) newest ;;
        gpu-image) gpu_image ;;
        *) echo "tests/legs.sh: unknown leg '$leg' (oldest, newest, gpu-image)" >&2; exit 2 ;;
    esac
done
