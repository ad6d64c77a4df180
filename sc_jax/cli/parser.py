"""The ``sc-jax`` argument parser: every subcommand, its options and their help.

Each option has help text, and its default is printed once: by the formatter
(:class:`HelpFormatter`), unless the help already says what the default is.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import platform
import re

from sc_jax import __version__
from sc_jax.runtime.ranges import DTYPES, arg_type
from sc_jax.calibration.numpy_fit import GUARDS
from sc_jax.cli import commands
from sc_jax.experiment.config import METHODS
from sc_jax.runtime.devices import ACCELERATOR_PEAK_FLOPS
from sc_jax.experiment.splits import DEFAULT_TEST_SEED
from sc_jax.models import attention as attn
from sc_jax.runtime.sharding import parse_mesh

#: A help text that already names its option's default: "(default ...", "default: ...",
#: or argparse's own "%(default)s". The formatter adds none to such a text.
SAYS_DEFAULT = re.compile(r"\(default\b|\bdefault:|%\(default\)")

SOLVERS = ["augmented_lagrangian", "projected", "scipy"]

_MODEL_HELP = ("a named model ('default' = smollm2-135m, qwen2.5-0.5b, gemma3-270m; `sc-jax info` lists them), "
               "a HF model dir, a .gguf file, random:<preset>, random:PATH (always random weights: "
               "the config.json and tokenizer.json of directory PATH, its weights never read), "
               "or a Hugging Face id "
               "org/name[@REVISION] from the local hub cache (downloaded into it when the hub "
               "is reachable and HF_HUB_OFFLINE is unset)")
_DTYPE_HELP = "dtype of the model's weights and activations"


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Appends an option's default to its help once: not where the help already says
    it (:data:`SAYS_DEFAULT`), nor for a default of None, an empty list or a flag's
    False. Raw descriptions: argparse would wrap the --version line at the terminal's
    width."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if (SAYS_DEFAULT.search(text) or default is None or default is False
                or (isinstance(default, (list, tuple)) and not default)
                or default is argparse.SUPPRESS
                or not (action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE))):
            return text
        shown = " ".join(map(str, default)) if isinstance(default, (list, tuple)) else str(default)
        return f"{text} (default: {shown.replace('%', '%%')})"


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


def _add_run_options(r) -> None:
    """Options shared by `sc-jax run` and `sc-jax plan`."""
    r.add_argument("--model", default="default",
                   help=_MODEL_HELP)
    r.add_argument("--dataset", nargs="+", default=["rotten_tomatoes"],
                   help="task names (sc_jax.experiment.tasks.TASKS), or 'all' for the nine; "
                        "rotten_tomatoes works offline")
    r.add_argument("--data-file", action="append", default=[],
                   help="local CSV/JSONL/Parquet for a dataset: FILE (first dataset) or NAME=FILE; "
                        "may be repeated")
    r.add_argument("--data-dir", default=None,
                   help="directory with DIR/<dataset>.jsonl (or .csv, .parquet) for every "
                        "dataset without a --data-file, e.g. the nine in shared/datasets")
    r.add_argument("--text-column", default=None,
                   help="column of the texts in --data-file / --data-dir files (default: the "
                        "task's own name, else 'text')")
    r.add_argument("--strict-data", action="store_true",
                   help="refuse a dataset with rows whose text is empty or whitespace-only "
                        "(by default they are left out of every draw, with a warning, and "
                        "listed in results.json)")
    r.add_argument("--label-column", default=None,
                   help="column of the labels in those files (default: the task's own name, else "
                        "'label')")
    r.add_argument("--shots", type=int, nargs="+", default=[4, 8], help="k, demonstrations per prompt")
    r.add_argument("--seeds", type=int, default=5, help="number of seeds (0..N-1)")
    r.add_argument("--seed-list", type=int, nargs="+", help="explicit seeds (overrides --seeds)")
    r.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of the methods")
    r.add_argument("--test-size", type=int, default=256, help="held-out test queries per seed")
    r.add_argument("--test-seed", type=int, default=DEFAULT_TEST_SEED,
                   help="seed of the one test set per dataset, the same for every seed "
                        "(the paper's protocol)")
    r.add_argument("--per-seed-test-sets", action="store_true",
                   help="redraw the test set with every seed instead")
    r.add_argument("--mode", default="first_token", choices=["first_token", "sequence"],
                   help="label scoring: first token, or full label sequence")
    r.add_argument("--dtype", default="float32", choices=DTYPES, help=_DTYPE_HELP)
    r.add_argument("--max-size", type=int, default=5, help="sub-context sizes i = 1..min(this, k-1)")
    r.add_argument("--lambda-inv", type=float, default=None,
                   help="invariance weight (default: sc_jax.calibration.defaults.DEFAULT_LAMBDA_INV, 0.1)")
    r.add_argument("--tau", type=float, default=None,
                   help="trust-region cosine (default: the paper's schedule from in-sample accuracy)")
    r.add_argument("--guard", default="bias_only", choices=list(GUARDS),
                   help="none: SC as the paper fits it; bias_only: SC* (w = 1, with the trust "
                        "region) for a size whose surrogate data the LLM scores below chance (a "
                        "deviation from the paper, chosen on development tasks; "
                        "benchmarks/real_eval/README.md); bias_only_free: the same with SC* unconstrained (tau = -1; "
                        "the same as bias_only unless --tau is fixed: the schedule gives "
                        "tau = -1 below chance)")
    r.add_argument("--solver", default="augmented_lagrangian", choices=SOLVERS,
                   help="SC's solver: augmented_lagrangian or projected (batched, in JAX), or "
                        "scipy (a float64 reference, one problem at a time)")
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


def _add_demo_parser(sub) -> None:
    d = sub.add_parser("demo", help="SC and the baselines fitted and scored on built-in sentences",
                       formatter_class=HelpFormatter)
    d.add_argument("--model", default="default", help=_MODEL_HELP)
    d.add_argument("--dtype", default="float32", choices=DTYPES, help=_DTYPE_HELP)
    d.add_argument("--k", type=arg_type("k"), default=4, help="number of demonstrations (2..8)")
    d.add_argument("--seed", type=arg_type("seed"), default=0,
                   help="seed of the draw of the demonstrations and the test-time sub-contexts")
    d.add_argument("--quiet", action="store_true", help="no progress bars")
    d.set_defaults(fn=commands.demo_command)


def _add_run_parser(sub) -> None:
    r = sub.add_parser("run", help="the paper's experiment: SC and the baselines",
                       formatter_class=HelpFormatter)
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
    r.set_defaults(fn=commands.run_command)


def _add_plan_parser(sub) -> None:
    pl = sub.add_parser("plan", help="dry run of `run`: pairs, tokens, FLOPs, calls, planned and "
                                     "XLA peak memory, compiles, time; no weights read, nothing scored",
                        formatter_class=HelpFormatter)
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
    pl.set_defaults(fn=commands.plan_command)


def _add_report_parser(sub) -> None:
    rp = sub.add_parser("report", help="rebuild tables and plots from DIR/results.json",
                        formatter_class=HelpFormatter)
    rp.add_argument("dir", help="output directory of a finished `sc-jax run`")
    rp.add_argument("--log-samples", action="store_true",
                    help="first write DIR/samples.jsonl[.gz], the per-sample records, from the "
                         "run's score files and fitted parameters (no model, no refit)")
    rp.set_defaults(fn=commands.report_command)


def _add_ablate_parser(sub) -> None:
    a = sub.add_parser("ablate", help="refit SC from DIR's saved scores (no model, no forward "
                                      "pass): lambda_inv x trust region, SC-N, m_i, single sizes, guard",
                       formatter_class=HelpFormatter)
    a.add_argument("dir", help="output directory of a finished `sc-jax run`")
    a.add_argument("--lambda-inv", nargs="+", default=["0", "run", "1", "paper"],
                   help="lambda_inv grid: numbers, 'run' (the run's value) and 'paper' (the "
                        "paper's weight 10 on our mean scale)")
    a.add_argument("--m-values", type=int, nargs="+", default=None,
                   help="test-time sub-contexts per size, up to what the run scored (default: "
                        "those of 1 2 4 8 16 24 it scored; a larger value is refused)")
    a.add_argument("--solver", default=None, choices=SOLVERS,
                   help="SC's solver (default: the run's)")
    a.add_argument("--guard", default=None, choices=list(GUARDS),
                   help="the guard of every study but the guard study (default: the run's)")
    a.add_argument("--out", default=None, help="where the tables go (default: DIR/ablation)")
    a.add_argument("--overwrite", action="store_true",
                   help="replace files by the names ablate writes in --out that no sc-jax "
                        "ablate wrote (without it such a directory is refused)")
    a.add_argument("--quiet", action="store_true", help="no progress lines")
    a.set_defaults(fn=commands.ablate_command)


def _add_info_parser(sub) -> None:
    i = sub.add_parser("info", help="list the named models and the local hub cache's, or load "
                                    "one and print its configuration",
                       formatter_class=HelpFormatter)
    i.add_argument("model", nargs="?", help=_MODEL_HELP)
    i.add_argument("--dtype", default="float32", choices=DTYPES, help=_DTYPE_HELP)
    i.set_defaults(fn=commands.info_command)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sc-jax", description="Supervised Calibration for ICL, in JAX.",
                                formatter_class=HelpFormatter)
    p.add_argument("--version", action="version", version=version_line())
    sub = p.add_subparsers(dest="command", required=True)
    _add_demo_parser(sub)
    _add_run_parser(sub)
    _add_plan_parser(sub)
    _add_report_parser(sub)
    _add_ablate_parser(sub)
    _add_info_parser(sub)
    return p
