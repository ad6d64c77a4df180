"""MoICL's scalar weights against the authors' released training loop on one small case.

The authors' ``train_tweet_offensive`` (``utils/train_eval.py`` of
HongGiwon/Mixture-of-In-context-Learners, the scalar-weight training of
``run_moicl_classification.py``) is imported from the clone the user points at and run
unchanged (nothing of it is copied into sc_jax) with stand-ins for what it reads from an
LLM and a data set: a "model" whose ``generate`` returns, per expert, vocabulary logits
holding the case's label logits at two label token ids; a collator that hands it the
training row; a data set with ``label`` and a seeded ``shuffle``, which records the row
order of each epoch. :func:`sc_jax.calibration.methods.moicl.moicl_fit` gets the same
rows as log-probs (each expert's logits shifted by a constant, which the mixture ignores)
and those orders.

The case: 2 classes, 6 experts (one informative, five noise), 48 training rows, 5 epochs
at learning rate 0.05, their ``--noeval`` (the last weights); 64 test rows. Theirs runs
torch float32, ours float64. Writes ``benchmarks/results/moicl_authors/<machine>.json``.

  git clone https://github.com/HongGiwon/Mixture-of-In-context-Learners /tmp/moicl-authors
  python benchmarks/moicl_authors.py /tmp/moicl-authors
"""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import _results  # noqa: E402
from sc_jax.calibration.methods import moicl as M  # noqa: E402

R, E, T, EPOCHS, LR, SEED = 48, 6, 64, 5, 0.05, 42
LABEL_TOKENS, VOCAB = (3, 7), 11


def case(seed: int = 7):
    """``(logits [R + T, E, 2], labels [R + T])``: expert 0 leans to the gold label."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, R + T)
    logits = rng.normal(0, 2, (R + T, E, 2)) + rng.normal(0, 5, (1, E, 1))
    logits[:, 0] += 1.5 * np.eye(2)[labels]
    return logits.astype(np.float32), labels


def stand_ins(logits, labels):
    """The model, collator and training set their loop reads, over the case's rows."""
    import torch

    class Encoded(dict):
        def to(self, device):
            return self

    class Model:
        def generate(self, input_ids, attention_mask, **kwargs):
            vocab = torch.full((E, VOCAB), -30.0)
            vocab[:, list(LABEL_TOKENS)] = torch.from_numpy(logits[int(input_ids[0, 0])])
            return {"scores": [vocab]}

    def collator(samples):
        row = samples[-1]["row"]
        return {"encodeds": Encoded(input_ids=torch.full((E, 1), row), attention_mask=torch.ones(E, 1)),
                "input_label": torch.tensor([samples[-1]["label"]])}

    class Rows:
        orders: list = []

        def __init__(self, rows):
            self.rows = list(rows)

        def __len__(self):
            return len(self.rows)

        def __getitem__(self, key):
            return [int(labels[r]) for r in self.rows] if key == "label" else self.rows[key]

        def shuffle(self, seed):
            shuffled = Rows(np.asarray(self.rows)[np.random.default_rng(seed).permutation(len(self.rows))])
            Rows.orders.append(list(shuffled.rows))
            return shuffled

        def __iter__(self):
            return iter({"row": int(r), "label": int(labels[r])} for r in self.rows)

    return Model(), collator, Rows


def run_authors(clone: Path, logits, labels):
    """Their ``train_tweet_offensive`` on the case's training rows: weights [E], orders."""
    import torch
    from torch import nn

    sys.path.insert(0, str(clone))
    from utils.train_eval import train_tweet_offensive

    model, collator, Rows = stand_ins(logits, labels)
    torch.manual_seed(SEED)
    weights = nn.Parameter(torch.ones(E, 1) / E, requires_grad=True)
    args = types.SimpleNamespace(lr=LR, n_epoch=EPOCHS, seed=SEED, noeval=True, use_cache=False)
    best = train_tweet_offensive(train_dataset=Rows(range(R)), eval_dataset=None, scalar_weights=weights,
                                 model=model, label_model_token_ids=list(LABEL_TOKENS), device="cpu",
                                 args=args, collator=collator, train_samples=[], output_log={"train": {}},
                                 cache_enabled=False)
    return best.detach().numpy()[:, 0].astype(np.float64), np.asarray(Rows.orders)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("clone", type=Path, help="a clone of HongGiwon/Mixture-of-In-context-Learners")
    p.add_argument("--out", default=None, type=_results.result_file)
    args = p.parse_args(argv)
    if not (args.clone / "utils" / "train_eval.py").is_file():
        p.error(f"{args.clone} holds no utils/train_eval.py: clone HongGiwon/Mixture-of-In-context-Learners")
    logits, labels = case()
    theirs, orders = run_authors(args.clone, logits, labels)
    logp = logits.astype(np.float64)
    logp = logp - np.logaddexp.reduce(logp, axis=-1, keepdims=True)
    ours = M.moicl_fit(logp[:R], None, labels[:R], lr=LR, epochs=EPOCHS, orders=orders)
    test = logits[R:].transpose(1, 0, 2).astype(np.float64)
    p_ours = M.moicl_predict(ours, test)
    p_theirs = M.moicl_predict(theirs, test)  # their evaluate's argmax of the same weighted sum
    record = dict(
        case=dict(classes=2, experts=E, train_rows=R, test_rows=T, epochs=EPOCHS, lr=LR),
        weights_ours=ours.tolist(), weights_theirs=theirs.tolist(),
        max_abs_weight_difference=float(np.max(np.abs(ours - theirs))),
        max_abs_test_probability_difference=float(np.max(np.abs(p_ours - p_theirs))),
        same_predictions=int(np.sum(p_ours.argmax(-1) == np.einsum("e,etn->tn", theirs, test).argmax(-1))),
        test_accuracy_ours=float(np.mean(p_ours.argmax(-1) == labels[R:])))
    machine = _results.jax_machine()
    out = _results.write_json(
        args.out or _results.default_path("moicl_authors", machine["id"]),
        dict(header=_results.header(machine, command=_results.command(__file__, argv),
                                    dtype="theirs float32, ours float64"), **record))
    for key, value in record.items():
        print(f"{key:38s} {value}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
