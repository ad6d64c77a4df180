"""The offline default model (SmolLM2-135M-Instruct from GGUF) through our Flax
decoder against transformers' own GGUF loader (PyTorch), and prompt assembly from
token ids against tokenizing the joined string, for the default tokenizer.

Tolerance: both sides use the same dequantised float32 weights (bit-identical, see
test_gguf.py); what remains is float32 summation order over 30 layers with logits
of magnitude up to ~40. Max |logit difference| <= 5e-4 (measured 1.2e-4 on 2 CPU threads).
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")

import sc_jax  # noqa: E402
from sc_jax.default_model import default_model_dir  # noqa: E402
from sc_jax.prompts import TEMPLATES, build_pieces  # noqa: E402

TOL = 5e-4
PROMPTS = [
    "review: a gripping, funny film\nsentiment:",
    "Hello",
    "review: dull.\nsentiment: negative\nreview: a masterpiece of 2003 cinema\nsentiment:",
    "news: Stocks rallied 3% on Tuesday as tech shares rose.\ntopic:",
]


@pytest.fixture(scope="module")
def ours():
    return sc_jax.load_model("default")


def test_default_model_matches_transformers_gguf(ours, hf_gguf_model):
    torch.set_num_threads(2)
    hf = hf_gguf_model
    ids = [ours.tokenizer.encode(p) for p in PROMPTS]
    got = ours.last_logits(ids)
    worst = 0.0
    for i, seq in enumerate(ids):
        with torch.no_grad():
            ref = hf(torch.tensor([seq])).logits[0, -1].numpy()
        worst = max(worst, float(np.abs(got[i] - ref).max()))
        assert np.argmax(got[i]) == np.argmax(ref)
    print(f"default model vs transformers GGUF: max |logit diff| = {worst:.2e}")
    assert worst <= TOL


def test_default_model_identity_and_config(ours):
    c = ours.config
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.vocab_size) == (30, 576, 9, 3, 49152)
    assert c.tie_word_embeddings and c.rope_theta == 100000.0
    assert ours.identity == sc_jax.load_model(default_model_dir()).identity


@pytest.mark.parametrize("task", sorted(TEMPLATES))
def test_id_assembly_equals_joined_string(ours, task):
    """For the default (byte-level BPE) tokenizer, prompts assembled from per-piece ids
    equal the tokenization of the joined prompt string, on every shipped template."""
    rng = np.random.default_rng(len(task))
    t = TEMPLATES[task]
    words = ("It's a 3-hour, $40M film -- oddly moving; the cast (all 12!) shines. "
             "Café naïve déjà vu? Yes: 100% worth it. Don't/won't 2nd time").split()
    texts = [" ".join(rng.choice(words, int(rng.integers(1, 15)))) for _ in range(6)]
    demos = [(x, int(rng.integers(0, t.n_classes))) for x in texts[:4]]
    pieces = build_pieces(ours.tokenizer, t, demos, texts[4:])
    assert pieces.bos == ()  # SmolLM2 adds no BOS
    for ctx in ([0], [2, 0, 3], [3, 1, 0, 2]):
        for q in range(2):
            joined = t.prompt([demos[j] for j in ctx], texts[4 + q])
            assert pieces.prompt(ctx, q) == ours.tokenizer.encode(joined), (task, ctx, q)
