"""Hidden Calibration against its authors' code, and what the engine's hidden states cost.

1. Authors' code. The authors' reloaded Hidden Calibration, StaICC's
   ``prefabricate_inference/standard_calibration.py`` ``hidden_calibration`` (pure
   Python on lists: its ``train`` draws ``calibration_number`` prompts with its own
   seeded sampler and averages their hidden states per label; its ``inference``
   returns softmax(d_0 - d_c) of the Euclidean distances), is driven on the engine's
   states of a small case (``random:tiny-llama``, k = 4, size-3 surrogate prompts as
   the calibration set, the test queries under 4 sampled size-3 sub-contexts). Its
   ``feedforward`` returns our states, so both sides see the same vectors; ours
   (:mod:`sc_jax.calibration.hidden`) gets the rows StaICC drew. Reported: the largest
   centroid and probability differences and the argmax agreement. The original
   repository (hc495/Hidden_Calibration) computes the same centroids and argmin of
   ``scipy.spatial.distance.euclidean`` inline in a notebook
   (``Experiments/Exp1_Main_result.ipynb``), which cannot be imported.
2. Cost of ``hidden=True``: the model program of the jobs' call shape compiled with and
   without states, the jobs scored by warm engines with and without (on this
   machine), and per call shape
   of a GPU plan the bytes the states add to a call's output (``R x D`` float32,
   ``R = B W / 8`` readouts) beside the call's estimated temporaries
   (:func:`sc_jax.scoring.memory.packed_temp_bytes`).

  git clone https://github.com/hc495/StaICC /tmp/StaICC   # any checkout of it
  python benchmarks/hidden_calibration.py --staicc /tmp/StaICC
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import subprocess
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import sc_jax  # noqa: E402
from sc_jax.calibration.hidden import centroid_distances, class_centroids, distance_probs  # noqa: E402
from sc_jax.models.config import preset  # noqa: E402
from sc_jax.scoring.engine import ScoringEngine, _padding_call  # noqa: E402
from sc_jax.scoring.enumeration import all_contexts, sample_contexts, surrogate_pairs  # noqa: E402
from sc_jax.scoring.memory import READOUT_SPACING, packed_temp_bytes  # noqa: E402
from sc_jax.scoring.programs import packed_step  # noqa: E402
from sc_jax.scoring.prompts import Template, build_pieces  # noqa: E402

import _results  # noqa: E402

WORDS = "good bad movie plot actor great terrible fine boring fun dull superb the a of".split()
K, SIZE, M, T = 4, 3, 4, 6
LABELS = [0, 1, 0, 1]


def staicc_module(path: Path):
    """StaICC's ``standard_calibration`` module, imported from a checkout at ``path``
    without its package ``__init__`` (which loads models and datasets)."""
    pkg = types.ModuleType("StaICC")
    pkg.__path__ = [str(path)]
    sys.modules["StaICC"] = pkg
    return importlib.import_module("StaICC.prefabricate_inference.standard_calibration")


def small_case(model):
    """The small case's prompt pieces and jobs: size-3 surrogate prompts (the
    calibration set) and the test queries under M sampled size-3 sub-contexts."""
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(WORDS, int(rng.integers(2, 7)))) for _ in range(K + T)]
    pieces = build_pieces(model.tokenizer, Template("review:", "sentiment:", ("negative", "positive")),
                          list(zip(texts[:K], LABELS)), texts)
    ctx = all_contexts(K, SIZE)
    tctx = sample_contexts(K, SIZE, M, seed=1)
    jobs = {"surrogate": (ctx, surrogate_pairs(ctx, K)),
            "test": (tctx, np.stack([np.repeat(np.arange(M), T), np.tile(np.arange(K, K + T), M)], 1))}
    return pieces, jobs


def case_states(model, pieces, jobs):
    """The engine's states of the small case: (calibration states [N, D], labels [N],
    test states [M, T, D])."""
    res = ScoringEngine(model, progress=False).score_jobs(pieces, jobs, hidden=True)
    y = np.asarray(LABELS)[jobs["surrogate"][1][:, 1]]
    return res.hidden["surrogate"], y, res.hidden["test"].reshape(M, T, -1)


class _Rows:
    """A calibration set as StaICC reads one: row r is ((text,), label)."""

    def __init__(self, labels):
        self.labels = [int(v) for v in labels]

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, r):
        return ([str(r)], self.labels[r])

    def get_label(self, r):
        return self.labels[r]

    def find_index_from_label(self, label):
        return int(label)

    def get_dataset_name(self):
        return "small case"


def authors_comparison(staicc: Path, states, y, test) -> dict:
    """StaICC's hidden_calibration trained and run on ``states``; ours on the rows it drew."""
    sc = staicc_module(staicc)
    drawn = []

    def feedforward(prompt, label_space):
        drawn.append(int(prompt))
        return None, states[int(prompt)].tolist()

    theirs = sc.hidden_calibration(["negative", "positive"])
    with contextlib.redirect_stdout(io.StringIO()):  # its progress bar
        theirs.train(lambda demos, query: query[0], feedforward, calibration_set=_Rows(y),
                     calibration_number=len(y), k=K)
    mu = class_centroids(states[drawn], y[drawn], 2)
    flat = test.reshape(-1, test.shape[-1])
    p_theirs = np.asarray([theirs.inference(None, None, h.tolist()) for h in flat])
    p_ours = distance_probs(centroid_distances(flat, mu))
    return {"calibration_rows": len(y), "rows_drawn": len(drawn), "distinct_rows_drawn": len(set(drawn)),
            "test_prompts": len(flat),
            "centroid_max_abs_diff": float(np.abs(np.asarray(theirs.centroid) - mu).max()),
            "centroid_max_abs": float(np.abs(mu).max()),
            "prob_max_abs_diff": float(np.abs(p_theirs - p_ours).max()),
            "argmax_agree": int((p_theirs.argmax(-1) == p_ours.argmax(-1)).sum())}


def engine_cost(model, pieces, jobs, repeats: int) -> dict:
    """The programs of the jobs' call shapes (the schedule's ladder: gather, model and
    write in one) each compiled once ahead of time without and with states
    (``packed_step.lower(...).compile()``, the order alternating from shape to shape: a
    compile is cached, so each is timed once), and the jobs scored ``repeats`` times by
    warm engines in turn: summed compile and median call seconds."""
    eng = ScoringEngine(model, progress=False, attention="blocked", max_tokens_per_batch=512)
    sched = eng.plan(pieces, list(jobs.values()), "first_token").schedule
    pool = eng._pool_of(sched.pool)
    compile_s = {False: 0.0, True: 0.0}
    for j, shape in enumerate(sched.shapes):
        args = eng._args(_padding_call(shape), np.zeros((shape.B, shape.cache), np.int32),
                         np.full(shape.cache, -1, np.int32), np.full(shape.B * shape.W, sched.pool, np.int32),
                         model.replicate(np.zeros(shape.labels, np.int32)))
        for hidden in ((False, True) if j % 2 == 0 else (True, False)):
            extra = {"hidden": True} if hidden else {}
            t = time.perf_counter()
            packed_step.lower(model.graphdef, model.state, pool, *args, sequence=False, attention="blocked",
                              **extra).compile()
            compile_s[hidden] += time.perf_counter() - t
    shape = sched.shape
    engines = {h: ScoringEngine(model, progress=False, attention="blocked", max_tokens_per_batch=512)
               for h in (False, True)}
    call_s = {False: [], True: []}
    for h, e in engines.items():
        e.score_jobs(pieces, jobs, hidden=h)  # compiles
    for _ in range(repeats):
        for h, e in engines.items():
            t = time.perf_counter()
            e.score_jobs(pieces, jobs, hidden=h)
            call_s[h].append(time.perf_counter() - t)
    return {"shape": [shape.B, shape.W, shape.cache, shape.R], "calls": len(list(sched.calls())),
            "programs": len(sched.shapes),
            **{("hidden" if h else "plain"): {"compile_s": compile_s[h],
                                              "score_jobs_s_median": float(np.median(call_s[h]))}
               for h in (False, True)}}


def memory_cost() -> list[dict]:
    """Per model preset, at a GPU call shape (B = 32 rows of W = 512 tokens after 2048
    keys, bfloat16): the states' output bytes beside the call's temporaries."""
    rows = []
    B, W, keys = 32, 512, 2048
    R = B * W // READOUT_SPACING
    for name in ("smollm2-135m", "gemma-3-270m", "qwen2-7b", "llama-2-7b"):
        cfg = preset(name)
        extra = R * cfg.hidden_size * 4
        temp = packed_temp_bytes(cfg, "bfloat16", B, W, keys, R=R)
        rows.append({"model": name, "D": cfg.hidden_size, "B": B, "W": W, "cache": keys, "R": R,
                     "state_bytes": extra, "temp_bytes": temp, "fraction": extra / temp})
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--staicc", type=Path, required=True, help="a checkout of hc495/StaICC")
    p.add_argument("--staicc-commit", default=None,
                   help="its commit, where the checkout is no git work tree")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=None, type=_results.result_file)
    args = p.parse_args(argv)
    commit = args.staicc_commit or subprocess.run(
        ["git", "-C", str(args.staicc), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    model = sc_jax.load_model("random:tiny-llama", seed=1)
    pieces, jobs = small_case(model)
    cost = engine_cost(model, pieces, jobs, args.repeats)  # first: nothing compiled yet
    authors = authors_comparison(args.staicc, *case_states(model, pieces, jobs))
    memory = memory_cost()
    machine = _results.jax_machine()
    out = _results.write_json(
        args.out or _results.default_path("hidden_calibration", machine["id"]),
        dict(header=_results.header(machine, command=_results.command(__file__, argv), dtype="float32",
                                    staicc_commit=commit or "unknown"),
             authors=authors, engine=cost, memory=memory))
    print(f"StaICC hidden_calibration ({commit[:7] or '?'}) vs sc_jax on {authors['test_prompts']} "
          f"test prompts: centroids differ by {authors['centroid_max_abs_diff']:.2e} (max |mu| "
          f"{authors['centroid_max_abs']:.2f}), probabilities by {authors['prob_max_abs_diff']:.2e}, "
          f"argmax agrees on {authors['argmax_agree']}/{authors['test_prompts']}")
    print(f"{cost['programs']} model programs, largest {cost['shape']} ({cost['calls']} calls): "
          f"{'compile s':>10} {'score_jobs s':>13}")
    for name in ("plain", "hidden"):
        r = cost[name]
        print(f"{name:>46} {r['compile_s']:10.2f} {r['score_jobs_s_median']:13.3f}")
    print(f"{'model':14} {'D':>5} {'states MiB':>11} {'temps MiB':>10} {'fraction':>9}")
    for r in memory:
        print(f"{r['model']:14} {r['D']:5d} {r['state_bytes'] / 2**20:11.1f} "
              f"{r['temp_bytes'] / 2**20:10.1f} {r['fraction']:9.4f}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
