"""One device command that cannot lose its results: the stack, the attention candidates
at the 7B call shape, one seed of bench_seed's protocol cold and in a second process, and
the engine against Hugging Face transformers, in at most ``--budget-s`` seconds (540: a
device command may run 600).

Phases, each a fresh process (the parent starts no JAX backend; the children own the
device, one at a time):

  stack      jax, jaxlib and their plugins, the CUDA and cuDNN versions where they can be
             read (the backend's ``platform_version``, ``jax._src.lib.cuda_versions``),
             the device kind and count, its memory (``bytes_limit``);
  attention  :func:`sc_jax.scoring.attention_choice.time_attention` of every candidate of
             the backend (and ``dense``, the reference) for one layer at the 7B call shape
             (``random:qwen2-7b``'s config, bfloat16, B = 16 rows of W = 512 tokens after
             2048 cached keys): compiled or not, seconds per layer, largest difference
             from ``dense``;
  cold       bench_seed's cold phase (:func:`bench_seed.phase`: one seed of the protocol,
             an empty persistent compilation cache);
  second     bench_seed's second phase (another seed, another process, the same cache);
  grid       ``sc-jax run --dataset all --shots 8 --seeds 1`` on bench_seed's protocol
             otherwise: the nine tasks in one process (the cold and second phases'
             persistent compilation cache). Per dataset: seconds (its seed's scoring and
             its fit), programs compiled (scoring, model, fit), forward seconds, unique and
             executed tokens and MFU (2 x non-embedding parameters x unique tokens over the
             forward seconds, against the device's peak: :func:`device_peak_flops`). Then
             the paper's whole grid (:data:`GRID`: k = 4, 8, 16 x 5 seeds) projected twice
             from ``sc-jax plan``'s token counts: from the rates this run measured
             (:class:`sc_jax.experiment.execution.grid.MeasuredRates`) and the plan's own estimate
             (its roofline), side by side;
  peer       bench_peer (its own process) with one repeat and only the attention the
             cold seed's engine chose (``auto`` where it recorded none); ``skipped`` where
             torch or transformers is not installed. Not run unless asked (``--skip``
             without ``peer``): with the grid phase it does not fit the budget.

``--skip PHASE ...`` leaves phases out (default: ``peer``; ``--smoke``: none).

Each phase has a deadline: at most its share of the budget (:data:`SHARE`) and never
so much that a later phase is left under :data:`FLOOR` seconds. A child past its deadline
is killed with its process group and its phase recorded as ``{"status": "timeout",
"seconds": ...}``; a child that exits nonzero as ``failed`` with its exit code and the
tail of its stderr; a phase without the time or what it needs as ``skipped`` with why;
the next phase runs either way. The JSON (the header of ``_results``, then ``phases``)
is written atomically to ``--out`` after every phase, so a kill at any moment keeps the
phases done so far (bench_peer writes its own sections as it goes; a peer phase that
times out keeps those). The exit status is 1 if a phase failed or timed out. A table is
printed at the end.

``--smoke``: every phase on CPU with tiny random models (``random:tiny-llama``,
bench_seed's and bench_peer's smoke settings; the attention phase at a small call shape,
float32; the grid phase over :data:`SMOKE_TASKS` on synthetic CSVs, projected to
:data:`SMOKE_GRID`), about a minute on two cores; it then checks the JSON (every phase
``ok``, peer ``skipped`` only for a missing torch, bench_seed's own smoke checks, and
that the grid's records and projections add up: :func:`check_grid`). CI's gpu-image leg
runs it (tests/legs.sh).

On a bare GPU machine (the device tool's image: Python 3.12, jax with CUDA, torch,
transformers; no jaxopt, gguf, tokenizer files or datasets, no network):
  here:  python benchmarks/gpu_check.py --prepare bench_out/prep
         (bench_seed's --prepare: the jaxopt and gguf wheels, Qwen2's tokenizer cache
         folder and rotten_tomatoes.jsonl; then the other eight tasks' JSONL files for the
         grid phase, as shipped; it checks the folder fits a carry and prints the device
         command);
  there: that one command, with ``carry`` ["bench_out/prep"] and timeout_s 600; it writes
         ``$OUT/gpu_check.json`` and ``$OUT/gpu_check.log``.

Writes ``benchmarks/results/gpu_check/<machine>.json`` (``<machine>_smoke.json`` for
``--smoke``) unless ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import platform
import shlex
import shutil
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))  # sc_jax from the checkout, installed or not

import _results  # noqa: E402
import bench_peer  # noqa: E402
import bench_seed  # noqa: E402

PHASES = ("stack", "attention", "cold", "second", "grid", "peer")
#: The phases a plain run leaves out (``--skip``'s default; ``--smoke`` runs them all).
SKIP = ("peer",)
#: The most of the budget each phase may take (a fraction of ``--budget-s``).
SHARE = {"stack": 0.1, "attention": 0.25, "cold": 0.45, "second": 0.35, "grid": 1.0, "peer": 1.0}
#: Seconds kept for each later phase; a phase left less than this is skipped.
FLOOR = 20.0
#: One layer's attention call as ``random:qwen2-7b``'s plan makes it on an 80 GB device
#: (H = 28 query heads, K = 4 key/value heads, Dh = 128), and a small one for --smoke.
SHAPE = {"model": "qwen2-7b", "dtype": "bfloat16", "B": 16, "W": 512, "cache": 2048}
SMOKE_SHAPE = {"model": "tiny-llama", "dtype": "float32", "B": 2, "W": 32, "cache": 64}
#: The grid phase's projection: the paper's grid (Section 4.1) for one model, and a small
#: one for --smoke, over :data:`SMOKE_TASKS` (binary tasks whose label words start apart,
#: as the byte stand-in's first tokens must).
GRID = {"shots": (4, 8, 16), "seeds": 5}
SMOKE_GRID = {"shots": (4, 8), "seeds": 2}
SMOKE_TASKS = ("rotten_tomatoes", "subj")
#: The carry limit of a device command.
CARRY_LIMIT = 64 * 2 ** 20


def say(msg: str) -> None:
    print(f"gpu_check: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the children's phases
# jax and sc_jax are imported inside the children's functions only: the parent must not
# start a backend beside its children, and a phase whose import fails (a missing module,
# a broken plugin) is that phase's failure, not the whole command's.

def _read(fn):
    """``fn()``, or the error's text where the stack cannot say (a CPU has no cuDNN)."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001  (any failure to read a version is an answer)
        return f"unavailable ({e})"


def stack() -> dict:
    import jax

    dev = jax.devices()[0]
    plugins = {d.metadata["Name"]: d.version for d in metadata.distributions()
               if d.metadata["Name"] and d.metadata["Name"].lower().replace("_", "-").startswith(
                   ("jax-cuda", "jax-rocm", "libtpu", "nvidia-cudnn", "nvidia-cuda-runtime"))}

    def cuda(name):
        from jax._src.lib import cuda_versions

        if cuda_versions is None:
            raise LookupError("no CUDA plugin")
        return getattr(cuda_versions, name)()

    stats = _read(dev.memory_stats) or {}
    return {"machine": _results.jax_machine(), "backend": jax.default_backend(),
            "jax": jax.__version__, "jaxlib": _results._version("jaxlib"),
            "python": platform.python_version(), "plugins": plugins,
            "platform_version": _read(lambda: dev.client.platform_version),
            "cuda_runtime": _read(lambda: cuda("cuda_runtime_get_version")),
            "cuda_driver": _read(lambda: cuda("cuda_driver_get_version")),
            "cudnn": _read(lambda: cuda("cudnn_get_version")),
            "device_kind": dev.device_kind, "device_count": jax.device_count(),
            "bytes_limit": stats.get("bytes_limit") if isinstance(stats, dict) else None}


def attention(smoke: bool, model: str | None = None) -> dict:
    """The candidates' trials at :data:`SHAPE` (:data:`SMOKE_SHAPE`), with ``model`` (a
    preset's name) in place of the shape's model where given."""
    import jax
    import jax.numpy as jnp

    from sc_jax.models.config import ModelConfig, preset_hf_config
    from sc_jax.scoring.attention_choice import candidates, time_attention
    from sc_jax.scoring.packing import PackShape

    s = dict(SMOKE_SHAPE if smoke else SHAPE)
    if model:
        s["model"] = model
    config = ModelConfig.from_hf(preset_hf_config(s["model"]))
    dtype = jnp.dtype(s["dtype"])
    backend = jax.default_backend()
    names = tuple(dict.fromkeys(("dense", *candidates(backend, dtype))))  # dense: the reference
    say(f"attention: timing {', '.join(names)} at B={s['B']} W={s['W']} cache={s['cache']}")
    trials = time_attention(config, dtype, PackShape(B=s["B"], W=s["W"], cache=s["cache"]), names)
    ok = [t for t in trials if t.ok]
    return {"machine": _results.jax_machine(), "backend": backend, "call": s,
            "candidates": list(names), "trials": [t.to_json() for t in trials],
            "fastest": min(ok, key=lambda t: t.seconds).name if ok else None}


def grid_args(smoke: bool, data_dir: str, tmp: Path) -> list[str]:
    """``sc-jax run``'s arguments of the grid phase besides the seeds and --out:
    bench_seed's protocol with ``--dataset all`` on ``data_dir``, or its smoke settings
    over :data:`SMOKE_TASKS` on synthetic CSVs written into ``tmp``."""
    base = bench_seed.SMOKE if smoke else bench_seed.PROTOCOL
    i = base.index("--dataset")
    args = base[:i + 1] + (list(SMOKE_TASKS) if smoke else ["all"]) + base[i + 2:]
    if not smoke:
        return args + ["--data-dir", data_dir]
    for task in SMOKE_TASKS:
        args += ["--data-file", f"{task}={bench_seed.smoke_csv(tmp / f'{task}.csv')}"]
    # One budget for the run and its plan (the plan names an H100 for its rates only).
    return args + ["--device-memory", "16GiB"]


def grid_records(timing, nonembed: int, peak: float) -> list[dict]:
    """Per (dataset, k) of a run's results.json ``timing`` (a
    :class:`sc_jax.experiment.evaluation.results.RunTiming`, one seed each): ``seconds``
    (its seed's scoring and its fit; the metrics and report are the run's, not a
    dataset's), programs compiled (``programs`` by the scoring, ``model_programs`` of
    them the model's, ``fit_programs``), forward seconds, tokens and ``mfu`` (2 x
    ``nonembed`` x unique tokens / forward seconds / ``peak``)."""
    fits = {(f.dataset, f.shots): f for f in timing.fits}
    out = []
    for s in timing.seeds:
        f = fits[s.dataset, s.shots]
        out.append({"dataset": s.dataset, "k": s.shots, "seconds": s.wall_s + f.wall_s,
                    "scoring_s": s.wall_s, "compile_s": s.compile_s, "forward_s": s.forward_s,
                    "host_s": s.host_s, "fit_s": f.wall_s, "fit_compile_s": f.compile_s,
                    "programs": s.programs, "model_programs": s.model_programs,
                    "fit_programs": f.programs, "cache_hits": s.cache_hits, "calls": s.calls,
                    "unique_tokens": s.tokens, "executed_tokens": s.executed_tokens,
                    "mfu": 2 * nonembed * s.tokens / s.forward_s / peak if s.forward_s else None,
                    "attention": s.attention})
    return out


def grid(args) -> dict:
    """The grid phase's child: the run (all tasks, one seed, one process), its records
    (written before the plan, so a deadline in the plan keeps them), then ``sc-jax plan``
    of the whole grid and both projections."""
    import jax.numpy as jnp

    from sc_jax.cli import main as sc_jax_main
    from sc_jax.experiment.evaluation.results import load_results
    from sc_jax.experiment.execution.grid import MeasuredRates, grid_table, project_grid
    from sc_jax.models.sources import load_model_parts
    from sc_jax.runtime.devices import device_peak_flops
    from sc_jax.scoring.costs import non_embedding_params

    work = Path(args.child_out).parent / "grid"
    work.mkdir(parents=True, exist_ok=True)
    run_args = grid_args(args.smoke, args.data_dir, work)
    say(f"grid: sc-jax run {' '.join(run_args)} --seeds 1")
    t = time.perf_counter()
    if sc_jax_main(["run", *run_args, "--seeds", "1", "--out", str(work / "run"), "--quiet"]):
        raise SystemExit("grid: sc-jax run failed (its error is above)")
    wall = time.perf_counter() - t
    timing = load_results(work / "run").timing
    model = run_args[run_args.index("--model") + 1]
    dtype = run_args[run_args.index("--dtype") + 1]
    peak, peak_source = device_peak_flops(None, jnp.dtype(dtype))
    rec = {"machine": _results.jax_machine(), "run_args": run_args, "run_wall_s": wall,
           **{key: getattr(timing, key) for key in ("total_s", *bench_seed.PARTS, "programs",
                                                    "model_programs", "cache_hits")},
           "peak_flops": peak, "peak_source": peak_source,
           "datasets": grid_records(timing, non_embedding_params(load_model_parts(model).config), peak)}
    rates = MeasuredRates.from_timing(timing)
    rec["rates"] = dataclasses.asdict(rates)
    _results.write_json(args.child_out, dict(rec, unfinished="the plan and the projections"))

    g = SMOKE_GRID if args.smoke else GRID
    i = run_args.index("--shots")
    plan_args = run_args[:i + 1] + [str(k) for k in g["shots"]] + run_args[i + 2:]
    # The plan for this device (its datasheet, its attention measured); the smoke's for an
    # H100's rates, as measuring a CPU's attention and bandwidth takes longer than its
    # whole run.
    # The smoke's run and plan share one explicit budget (grid_args), so that the H100
    # named here lends its rates, not its 80 GiB.
    plan_args += ["--accelerator", "h100"] if args.smoke else []
    say(f"grid: sc-jax plan of {g['shots']} x {g['seeds']} seeds")
    if sc_jax_main(["plan", *plan_args, "--seeds", str(g["seeds"]), "--no-xla", "--no-compile-time",
                    "--quiet", "--json", str(work / "plan.json")]):
        raise SystemExit("grid: sc-jax plan failed (its error is above)")
    plan = json.loads((work / "plan.json").read_text())
    planned = {(s["dataset"], s["k"]): s for s in plan["settings"] if not s.get("skipped")}
    for d in rec["datasets"]:  # the plan's first seed is the run's seed: the same calls
        d["plan_executed_tokens"] = planned[d["dataset"], d["k"]]["executed_tokens"]
    rec["plan"] = {key: plan[key] for key in ("peak_flops", "peak_source", "mfu", "attention",
                                              "attention_source", "bandwidth", "seeds")}
    rec["projection"] = {"measured": project_grid(plan, rates), "plan": plan["grid"]}
    # Printed by the parent, which imports no sc_jax.
    rec["projection_tables"] = {key: grid_table(p) for key, p in rec["projection"].items()}
    return rec


CHILDREN = {"stack": lambda args: stack(),
            "attention": lambda args: attention(args.smoke, args.attention_model),
            "grid": grid}


# ---------------------------------------------------------------- the parent
def deadline(name: str, budget: float, left: float, phases: tuple = PHASES) -> float | None:
    """Seconds ``name`` may run: its share of the budget, and no more than leaves each later
    phase of ``phases`` (those that run) :data:`FLOOR`; None where that leaves this one
    less than FLOOR."""
    spare = left - FLOOR * (len(phases) - 1 - phases.index(name))
    return None if spare < FLOOR else min(SHARE[name] * budget, spare)


def own_child(name: str, args, out: Path, timeout: float, env: dict) -> dict:
    """A phase of this script's own (``--child``) in a fresh process; its result is the
    JSON file the child wrote, also where it then failed or timed out (the grid child
    writes its records before its plan)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", name, "--child-out", str(out),
           "--data-dir", args.data_dir]
    rec, _ = bench_seed.run_child(cmd + (["--smoke"] if args.smoke else []), timeout, env=env)
    if out.exists():
        rec.update(json.loads(out.read_text()))
    return rec


def peer(args, out: Path, timeout: float, env: dict, chosen: str | None) -> dict:
    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        return {"status": "skipped", "why": f"{' and '.join(missing)} not installed"}
    impl = chosen if chosen in bench_peer.ATTENTION else "auto"
    cmd = [sys.executable, bench_peer.__file__, "--repeats", "1", "--attention", impl,
           "--out", str(out), *(["--smoke"] if args.smoke else ["--data-dir", args.data_dir])]
    rec, _ = bench_seed.run_child(cmd, timeout, env=env)
    if out.exists():  # the sections bench_peer finished, also where it then failed or timed out
        data = json.loads(out.read_text())
        data.pop("header")
        rec.update(data)
    return rec


def run(args, argv) -> dict:
    t0 = time.perf_counter()
    out_path = Path(args.out) if args.out else None
    result = {"smoke": args.smoke, "budget_s": args.budget_s, "phases": {}}
    phases = result["phases"]

    def save() -> Path:
        nonlocal out_path
        machine = next((r["machine"] for r in phases.values() if "machine" in r), _results.UNREPORTED)
        if out_path is None and machine is not _results.UNREPORTED:
            out_path = _results.default_path("gpu_check", machine["id"] + ("_smoke" if args.smoke else ""))
        result["header"] = _results.header(
            machine, command=_results.command(__file__, argv), dtype={
                "attention": (SMOKE_SHAPE if args.smoke else SHAPE)["dtype"],
                "seed": "float32" if args.smoke else "bfloat16",
                "peer": bench_peer.SMOKE["dtype"] if args.smoke else bench_peer.FULL["dtype"]},
            note="each phase a fresh process with a deadline; written after every phase")
        result["wall_s"] = time.perf_counter() - t0
        data = {"header": result["header"], **{k: v for k, v in result.items() if k != "header"}}
        data["phases"] = {n: {k: v for k, v in r.items() if k != "machine"} for n, r in phases.items()}
        return _results.write_json(out_path or _results.default_path("gpu_check", "unreported"), data)

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    if args.smoke:
        env.setdefault("JAX_PLATFORMS", "cpu")
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        tmp = Path(tmp)
        run_args = bench_seed.protocol_args(args.smoke, args.data_dir, tmp)
        seeds = dict(zip(("cold", "second"), args.seeds))
        running = tuple(n for n in PHASES if n not in args.skip)
        for name in PHASES:
            left = args.budget_s - (time.perf_counter() - t0)
            limit = None if name in args.skip else deadline(name, args.budget_s, left, running)
            if name in args.skip:
                rec = {"status": "skipped", "why": "left out (--skip)"}
            elif limit is None:
                rec = {"status": "skipped", "why": f"no time left ({left:.0f} s of the budget)"}
            else:
                say(f"{name}: up to {limit:.0f} s")
                if name == "grid":  # the seed phases' persistent compilation cache
                    rec = own_child(name, args, tmp / "grid.json", limit,
                                    dict(env, SC_JAX_XLA_CACHE=str(tmp / "xla")))
                elif name in CHILDREN:
                    rec = own_child(name, args, tmp / f"{name}.json", limit, env)
                elif name in seeds:
                    rec = bench_seed.phase(name, seeds[name], run_args, tmp / name, tmp / "xla",
                                           limit)
                else:
                    chosen = next((r.get("attention") for r in (phases["cold"], phases["second"])
                                   if r.get("attention")), None)
                    rec = peer(args, tmp / "peer.json", limit, env, chosen)
                if rec["status"] != "skipped":
                    rec.setdefault("deadline_s", limit)
            phases[name] = rec
            say(f"{name}: {rec['status']}" + (f" in {rec['seconds']:.1f} s" if "seconds" in rec else "")
                + (f" ({rec['why']})" if "why" in rec else ""))
            path = save()
    print(table(phases))
    if "datasets" in phases.get("grid", {}):
        print(grid_phase_table(phases["grid"]))
    print(f"wrote {path}")
    return result


def _summary(name: str, r: dict) -> str:
    if r["status"] == "skipped":
        return r["why"]
    if r["status"] != "ok":
        tail = (r.get("stderr_tail") or "").strip().splitlines()
        return f"exit {r.get('exit_code', '–')}: {tail[-1] if tail else ''}"[:120]
    if name == "stack":
        gib = r["bytes_limit"] / 2 ** 30 if isinstance(r["bytes_limit"], int) else None
        return (f"{r['device_count']} x {r['device_kind']}, jax {r['jax']}, jaxlib {r['jaxlib']}, "
                f"{r['platform_version']}, CUDA {r['cuda_runtime']}, cuDNN {r['cudnn']}"
                + (f", {gib:.1f} GiB" if gib else ""))
    if name == "attention":
        return "; ".join(
            f"{t['name']}: " + (f"{1e3 * t['seconds']:.2f} ms/layer, diff {t['max_diff']:.1e}"
                                if t.get("seconds") is not None and t.get("max_diff") is not None
                                else f"{1e3 * t['seconds']:.2f} ms/layer" if t.get("seconds") is not None
                                else "compiled, did not run" if t.get("compiled")
                                else "does not compile") for t in r["trials"])
    if name in ("cold", "second"):
        return (f"run {r['run_total_s']:.1f} s: compile {r['compile_s']:.1f}, forward "
                f"{r['forward_s']:.1f}, fitting {r['fitting_s']:.1f}; {r['model_programs']} model "
                f"programs; attention {r.get('attention')}")
    if name == "grid":
        proj = r.get("projection", {})
        return (f"{len(r['datasets'])} datasets in one run, {r['total_s']:.1f} s (forward "
                f"{r['forward_s']:.1f}, compile {r['compile_s']:.1f}, fitting {r['fitting_s']:.1f}); "
                + (f"the grid projected: {proj['measured']['total_minutes']:.1f} min from these rates, "
                   f"{proj['plan']['total_minutes']:.1f} min by the plan" if proj else "no projection"))
    e = r.get("engine") or {}
    return (f"HF {r['hf']['steady_s']:.2f} s, engine ({e.get('attention')}) {e.get('steady_s', 0):.2f} s "
            f"(first {e.get('first_s', 0):.1f}), {r.get('speedup', 0):.2f}x, max diff "
            f"{r.get('max_abs_diff', float('nan')):.1e}")


def table(phases: dict) -> str:
    out = ["| phase | status | seconds | deadline s | result |", "|---|---|---|---|---|"]
    for name, r in phases.items():
        secs = f"{r['seconds']:.1f}" if "seconds" in r else "–"
        dl = f"{r['deadline_s']:.0f}" if "deadline_s" in r else "–"
        out.append(f"| {name} | {r['status']} | {secs} | {dl} | {_summary(name, r)} |")
    return "\n".join(out)


def grid_phase_table(r: dict) -> str:
    """The grid phase per dataset, then its two projections of the whole grid."""
    out = ["| dataset | k | seconds | compile s | programs (model, fit) | forward s | unique tokens | "
           "executed tokens (plan) | MFU |", "|---|---|---|---|---|---|---|---|---|"]
    for d in r["datasets"]:
        mfu = f"{100 * d['mfu']:.1f}%" if d["mfu"] is not None else "–"
        out.append(f"| {d['dataset']} | {d['k']} | {d['seconds']:.1f} | {d['compile_s']:.1f} | "
                   f"{d['programs']} ({d['model_programs']}, {d['fit_programs']}) | {d['forward_s']:.1f} | "
                   f"{d['unique_tokens']:,} | {d['executed_tokens']:,} ({d.get('plan_executed_tokens', '–')}) "
                   f"| {mfu} |")
    out.append(f"MFU against {r['peak_flops'] / 1e12:.3g} TFLOP/s ({r['peak_source']})")
    for key, what in (("measured", "from the rates this run measured"), ("plan", "by the plan's roofline")):
        if key in r.get("projection_tables", {}):
            out += ["", f"the whole grid {what}:", r["projection_tables"][key]]
    return "\n".join(out)


def check_grid(r: dict, tasks: tuple, grid: dict) -> None:
    """The grid phase's records and projections add up: one record per task with its
    tokens (the plan's first seed scores the run's calls: the same executed tokens),
    the run's forward time theirs; each projection's total the sum of its settings and
    once-paid parts, per dataset and per k alike, over ``grid``'s shots."""
    assert r["status"] == "ok" and "unfinished" not in r, r
    ds = r["datasets"]
    assert [d["dataset"] for d in ds] == list(tasks), ds
    for d in ds:
        assert d["seconds"] > 0 and d["forward_s"] > 0 and d["unique_tokens"] > 0 and d["mfu"] > 0, d
        assert d["executed_tokens"] == d["plan_executed_tokens"], d
    assert abs(sum(d["forward_s"] for d in ds) - r["forward_s"]) <= 1e-6 * r["forward_s"], r
    for key in ("measured", "plan"):
        p = r["projection"][key]
        assert {(s["dataset"], s["k"]) for s in p["settings"]} == {(t, k) for t in tasks for k in grid["shots"]}
        assert p["seeds"] == grid["seeds"], p
        once = sum(p["once"].values())
        for by in ("by_dataset", "by_k"):
            assert abs(sum(x["seconds"] for x in p[by]) + once - p["total_seconds"]) <= 1e-9 * p["total_seconds"]
        assert abs(sum(p["parts"].values()) + once - p["total_seconds"]) <= 1e-9 * p["total_seconds"]
    m = r["projection"]["measured"]
    rate = r["rates"]["forward_tokens_per_s"]
    measured_k = ds[0]["k"]
    for s in m["settings"]:  # the measured k: the run's own tokens at the run's rate
        if s["k"] == measured_k:
            d = next(d for d in ds if d["dataset"] == s["dataset"])
            assert abs(s["forward_s"] - grid["seeds"] * d["executed_tokens"] / rate) <= 1e-9 * s["forward_s"]


def check_smoke(phases: dict) -> None:
    """What CI checks of ``--smoke``: every phase ran (peer skipped only without torch)."""
    for name, r in phases.items():
        if name == "peer" and r["status"] == "skipped":
            assert r["why"].startswith("torch"), r
            continue
        assert r["status"] == "ok", (name, r)
    trials = {t["name"]: t for t in phases["attention"]["trials"]}
    assert trials["dense"]["ran"], trials
    bench_seed.check_smoke([phases["cold"], phases["second"]])
    check_grid(phases["grid"], SMOKE_TASKS, SMOKE_GRID)
    if phases["peer"]["status"] == "ok":
        assert phases["peer"]["max_abs_diff"] <= bench_peer.SMOKE_TOLERANCE, phases["peer"]


def copy_tasks(data_dir: str, dest: Path, tasks) -> None:
    """Each of ``tasks``' ``<task>.jsonl`` from ``data_dir`` into ``dest``, as shipped: the
    loader leaves out rows with a blank text itself (and lists them in results.json's
    ``left_out_rows`` by the file's row numbers)."""
    dest.mkdir(parents=True, exist_ok=True)
    for task in tasks:
        shutil.copyfile(Path(data_dir) / f"{task}.jsonl", dest / f"{task}.jsonl")


def prepare(folder: Path, data_dir: str) -> None:
    """bench_seed's --prepare (wheels, tokenizer, data), the grid phase's nine tasks, the
    folder's size, and the device command."""
    # The parent of --prepare starts no backend either.
    from sc_jax.experiment.tasks.spec import TASKS

    missing = [t for t in TASKS if not (Path(data_dir) / f"{t}.jsonl").is_file()]
    if missing:  # before any download
        raise SystemExit(f"gpu_check: no {', '.join(f'{t}.jsonl' for t in missing)} in {data_dir}; "
                         "give --data-dir the folder that holds the nine tasks")
    bench_seed.prepare(folder, data_dir)
    copy_tasks(data_dir, folder / "datasets", TASKS)
    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    print(f"gpu_check: {folder} holds {size / 2 ** 20:.1f} MiB to carry (limit "
          f"{CARRY_LIMIT // 2 ** 20} MiB)")
    if size > CARRY_LIMIT:
        raise SystemExit(f"gpu_check: {folder} is over the carry limit")
    try:
        rel = folder.resolve().relative_to(ROOT)
    except ValueError:
        raise SystemExit(f"gpu_check: {folder} must be inside the checkout ({ROOT}) to travel")
    cmd = device_command(str(rel))
    assert len(cmd) <= 2000, len(cmd)
    print(f"gpu_check: the device command (carry [{str(rel)!r}], timeout_s 600):\n{cmd}")


def device_command(prep: str) -> str:
    """The one command a lent GPU machine runs, from the checkout's root, with ``prep``
    (from :func:`prepare`) carried; what it writes lands in $OUT. ``pipefail``: the
    command's status is gpu_check's (1 where a phase failed), not ``tee``'s."""
    p = shlex.quote(prep)
    return (f"set -o pipefail; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "
            f"{p}/wheels/*.whl && PYTHONPATH=/tmp/site:. SC_JAX_CACHE={p}/sc_jax_cache "
            f"PYTHONUNBUFFERED=1 python3 benchmarks/gpu_check.py --data-dir {p}/datasets "
            f"--out $OUT/gpu_check.json 2>&1 | tee $OUT/gpu_check.log")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="every phase on CPU with tiny models")
    ap.add_argument("--budget-s", type=float, default=540, help="seconds for all phases together")
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "datasets"),
                    help="folder holding the nine tasks' JSONL files (rotten_tomatoes.jsonl for "
                         "the seed phases; not used by --smoke)")
    ap.add_argument("--seeds", type=int, nargs=2, default=[0, 1], help="the cold and the second seed")
    ap.add_argument("--skip", nargs="*", choices=PHASES, default=None,
                    help=f"phases to leave out (default: {' '.join(SKIP)}; with --smoke none); "
                         "'--skip' alone runs them all")
    ap.add_argument("--out", default=None, type=_results.result_file, help="JSON result (default: results/gpu_check/<machine>.json)")
    ap.add_argument("--prepare", default=None, metavar="DIR",
                    help="gather what a bare GPU machine lacks into DIR, print the device command, stop")
    ap.add_argument("--child", choices=tuple(CHILDREN), help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    ap.add_argument("--attention-model", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.skip is None:
        args.skip = () if args.smoke else SKIP
    if args.child:
        _results.write_json(args.child_out, CHILDREN[args.child](args))
        return 0
    if args.prepare:
        prepare(Path(args.prepare), args.data_dir)
        return 0
    phases = run(args, argv)["phases"]
    if args.smoke:
        check_smoke(phases)
        print("gpu_check smoke: every phase ran; bench_seed's checks hold")
    return 1 if any(r["status"] in ("failed", "timeout") for r in phases.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
