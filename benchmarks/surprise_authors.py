"""Surprise Calibration against the authors' released code on one small synthetic case.

The authors' notebook (``SC.ipynb`` of yan-muzhou/Surprise-Calibration, the code the
repository's README gives for arXiv:2506.12796) defines the surprise vectors
(``multiclass_pointwise_surprise``), the data layout (``data_reader``), the network
(``GRUModel``), its training (``train_model``) and evaluation (``test_model``). This
script takes those five definitions from the notebook the user points at (nothing of
it is copied into sc_jax), builds the network at the authors' sizes (embedding 768,
hidden 1024) from one torch seed, copies its initial weights into
:func:`sc_jax.calibration.surprise.fit`, trains both for the authors' 200 epochs at
learning rate 1e-4 and weight decay 0.01, and compares the test probabilities.

The case: 3 classes, contexts of 3 demonstrations (random labels), 240 training and
120 test queries whose label follows softmax(u) while the model's log-probs are u
shifted by 0.8 per demonstration of each class (the prior shift the method corrects).
Both sides run float32 on the CPU; they differ only by the order of float32 sums, which
200 Adam steps carry into the outputs. Writes
``benchmarks/results/surprise_authors/<machine>.json`` and prints the comparison.

  git clone https://github.com/yan-muzhou/Surprise-Calibration /tmp/sc-authors
  python benchmarks/surprise_authors.py /tmp/sc-authors/SC.ipynb
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import _results  # noqa: E402
from sc_jax.calibration import surprise as S  # noqa: E402

AUTHORS_DEFS = ("multiclass_pointwise_surprise", "data_reader", "GRUModel", "train_model",
                "test_model")
N, K, SHIFT, EPOCHS, LR = 3, 3, 0.8, 200, 1e-4


def authors_namespace(notebook: Path) -> dict:
    """The five definitions of the notebook's first code cell, executed with the
    imports they use (the cell's other statements, e.g. its GPU selection, are not run)."""
    import torch
    from torch import nn, optim
    from torch.nn import functional as F, init
    from torch.utils.data import DataLoader, TensorDataset
    from tqdm import tqdm

    cells = [c for c in json.loads(notebook.read_text())["cells"] if c["cell_type"] == "code"]
    tree = ast.parse("".join(cells[0]["source"]))
    keep = [node for node in tree.body if getattr(node, "name", None) in AUTHORS_DEFS]
    missing = set(AUTHORS_DEFS) - {node.name for node in keep}
    if missing:
        raise SystemExit(f"{notebook}: no {', '.join(sorted(missing))} in its first code cell; "
                         "pass the SC.ipynb of yan-muzhou/Surprise-Calibration")
    ns = dict(torch=torch, nn=nn, optim=optim, F=F, init=init, DataLoader=DataLoader,
              TensorDataset=TensorDataset, tqdm=tqdm, math=math)
    exec(compile(ast.Module(body=keep, type_ignores=[]), str(notebook), "exec"), ns)
    return ns


def case(rng, rows):
    """Context labels [rows, K], the query's label probabilities [rows, N] and labels."""
    ctx = rng.integers(0, N, (rows, K))
    u = rng.normal(scale=1.5, size=(rows, N))
    y = np.array([rng.choice(N, p=np.exp(r) / np.exp(r).sum()) for r in u])
    logit = u + SHIFT * np.eye(N)[ctx].sum(1)
    return ctx, np.exp(logit) / np.exp(logit).sum(-1, keepdims=True), y


def authors_layout(ctx, p_query, y):
    """The notebook's per-row lists: one-hot labels and label probabilities at the K
    demonstrations' positions and the query's ([rows, K + 1, N] each). Its surprise
    vectors read only the one-hot labels, so the demonstrations' probabilities are
    uniform here."""
    true = np.eye(N)[np.concatenate([ctx, y[:, None]], 1)]
    pred = np.concatenate([np.full((len(y), K, N), 1.0 / N), p_query[:, None]], 1)
    return true.tolist(), pred.tolist()


def params_of(model) -> dict:
    sd = {k: jnp.asarray(v.detach().numpy()) for k, v in model.state_dict().items()}
    return {"w_in": sd["input_projection.weight"], "b_in": sd["input_projection.bias"],
            "ln_scale": sd["layer_norm.weight"], "ln_bias": sd["layer_norm.bias"],
            "w_ih": sd["rnn.weight_ih_l0"], "w_hh": sd["rnn.weight_hh_l0"],
            "b_ih": sd["rnn.bias_ih_l0"], "b_hh": sd["rnn.bias_hh_l0"],
            "w_out": sd["output_projection.weight"], "b_out": sd["output_projection.bias"]}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("notebook", type=Path, help="SC.ipynb of yan-muzhou/Surprise-Calibration")
    p.add_argument("--out", default=None, type=_results.result_file)
    args = p.parse_args(argv)
    if not args.notebook.is_file():
        p.error(f"{args.notebook} not found: clone yan-muzhou/Surprise-Calibration and pass its SC.ipynb")
    import torch

    ns = authors_namespace(args.notebook)
    rng = np.random.default_rng(0)
    train, test = case(rng, 240), case(rng, 120)
    train_loader, test_loader = ns["data_reader"](*authors_layout(*train), *authors_layout(*test))
    torch.manual_seed(0)
    model = ns["GRUModel"](num_labels=N)
    start = params_of(model)

    t = time.perf_counter()
    model = ns["train_model"](model, train_loader, EPOCHS, LR, torch.device("cpu"), None)
    theirs_s = time.perf_counter() - t
    theirs_acc, theirs_p = ns["test_model"](model, test_loader, torch.device("cpu"))
    theirs_p = np.concatenate(theirs_p).astype(np.float64)

    settings = S.SurpriseSettings(epochs=EPOCHS, learning_rate=LR)  # the authors' defaults
    t = time.perf_counter()
    params = S.fit([(S.sign_surprise(train[0], N), np.log(train[1]), train[2])], N, settings,
                   params=start)
    jax.block_until_ready(params)  # JAX dispatches asynchronously: time the training itself
    ours_s = time.perf_counter() - t
    z = np.asarray(S.calibrated_logits(params, jnp.asarray(S.sign_surprise(test[0], N)),
                                       jnp.asarray(np.log(test[1]), jnp.float32)), np.float64)
    ours_p = np.exp(z - z.max(-1, keepdims=True))
    ours_p /= ours_p.sum(-1, keepdims=True)
    ours_acc = float((ours_p.argmax(-1) == test[2]).mean())
    base_acc = float((test[1].argmax(-1) == test[2]).mean())

    record = dict(classes=N, context=K, shift=SHIFT, train_rows=len(train[2]),
                  test_rows=len(test[2]), epochs=EPOCHS, learning_rate=LR,
                  embed_dim=settings.embed_dim, hidden_dim=settings.hidden_dim,
                  max_abs_prob_diff=float(np.abs(ours_p - theirs_p).max()),
                  argmax_agreement=float((ours_p.argmax(-1) == theirs_p.argmax(-1)).mean()),
                  accuracy_base=base_acc, accuracy_authors=float(theirs_acc),
                  accuracy_sc_jax=ours_acc, seconds_authors=theirs_s,
                  seconds_sc_jax_compile_included=ours_s)
    machine = _results.jax_machine()
    out = _results.write_json(
        args.out or _results.default_path("surprise_authors", machine["id"]),
        dict(header=_results.header(machine, command=_results.command(__file__, argv),
                                    dtype="float32"), **record))
    for key, value in record.items():
        print(f"{key:32s} {value}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
