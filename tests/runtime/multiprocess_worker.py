"""One process of the multi-process engine test (tests/runtime/test_multiprocess.py), started
by ``python -m sc_jax.runtime.launch``: label log-probs of tiny-llama-8h (8 heads, 4 key/value
heads) from the prefix-shared engine and the flat path on meshes that span every
process's devices, written to ``<out>/p<process>.npz``. :func:`problem` is also what
the test scores in one process."""

import sys

import numpy as np

#: (data, model) meshes over 8 devices: key/value heads split on 2 x 4, replicated on
#: 1 x 8 (a model axis of 8 does not divide 4 heads), queries split on 4 x 2.
MESHES = ((2, 4), (4, 2), (1, 8))
MODEL, SEED = "random:tiny-llama-8h", 3


def problem(tokenizer):
    """(pieces, contexts, pairs): k = 3 demonstrations, every ordered pair of them as
    a context, the held-out demonstrations and two test queries as queries."""
    from sc_jax.scoring.enumeration import all_contexts, surrogate_pairs
    from sc_jax.scoring.prompts import Template, build_pieces

    rng = np.random.default_rng(7)
    words = "good bad movie plot actor great terrible fine boring fun dull superb".split()
    texts = [" ".join(rng.choice(words, int(rng.integers(1, 7)))) for _ in range(5)]
    demos = list(zip(texts[:3], rng.integers(0, 3, 3).tolist()))
    template = Template("review:", "sentiment:", ("negative", "positive", "mixed"))
    pieces = build_pieces(tokenizer, template, demos, texts)
    ctx = all_contexts(3, 2)
    pairs = np.concatenate([surrogate_pairs(ctx, 3), [[0, 3], [1, 4]]])
    return pieces, ctx, pairs


def scores(model, mode):
    """Engine and flat label log-probs ``[N, 3]`` of :func:`problem`."""
    from sc_jax.scoring.engine import ScoringEngine
    from sc_jax.scoring.reference import score_flat

    pieces, ctx, pairs = problem(model.tokenizer)
    engine = ScoringEngine(model, max_tokens_per_batch=1024, progress=False).score(pieces, ctx, pairs, mode)
    return engine, score_flat(model, pieces, ctx, pairs, mode, max_tokens_per_batch=1024)


def main(out):
    from sc_jax.runtime.multihost import initialize_distributed

    assert initialize_distributed(), "run me under python -m sc_jax.runtime.launch"
    import jax

    import sc_jax
    from sc_jax.runtime.sharding import make_mesh

    res = {}
    for data, model_axis in MESHES:
        model = sc_jax.load_model(MODEL, seed=SEED, mesh=make_mesh(data, model=model_axis))
        for mode in ("first_token", "sequence") if model_axis == 4 else ("first_token",):
            res[f"engine_{data}x{model_axis}_{mode}"], res[f"flat_{data}x{model_axis}_{mode}"] = \
                scores(model, mode)
    res.update(shared(jax.process_index()))
    np.savez(f"{out}/p{jax.process_index()}.npz", devices=jax.device_count(), **res)


def shared(pid):
    """What process 0 shares: an array (float64 and its shape), nothing (None), the
    smallest of per-process values, and an error raised in process 0 alone."""
    from sc_jax.runtime.multihost import from_writer, on_writer, smallest

    def fail():
        raise ValueError(f"only process {pid} raised this")

    mine = np.arange(6.0).reshape(2, 3) / 7 if pid == 0 else None
    try:
        on_writer(fail)
        message = ""
    except ValueError as e:
        message = str(e)
    return {"from_writer": from_writer(mine), "none": from_writer(None) is None,
            "smallest": smallest(10 - pid), "error": message}


if __name__ == "__main__":
    main(sys.argv[1])
