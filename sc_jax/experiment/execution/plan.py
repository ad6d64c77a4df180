"""Dry run of ``sc-jax run`` (:func:`plan_run`): what a run would score and what it
needs, with no weights read and nothing scored.

:func:`plan_run` costs the run's own plan (:func:`sc_jax.experiment.protocol.runplan.build_plan`):
each seed's scoring jobs, planned together as ONE engine call
(:meth:`sc_jax.scoring.engine.ScoringEngine.score_jobs`) scores them: one prefix trie over
every job of the seed, packed into calls of one shape by the run's memory policy
(:meth:`sc_jax.scoring.memory.MemoryPolicy.plan`, the engine's own).
:mod:`sc_jax.scoring.costs` counts what those calls cost: tokens and FLOPs call by
call (:func:`~sc_jax.scoring.costs.replay`); :mod:`sc_jax.scoring.xla_costs` gives
XLA's memory and compile time of the model program lowered with abstract shapes
(nothing is allocated, no weights are read); :mod:`sc_jax.runtime.devices` the
device's peaks.

The random presets tokenize with a byte-level stand-in unless a real vocabulary of
theirs is available (:data:`sc_jax.models.vocabulary.PRESET_TOKENIZERS`); ``random:PATH``
and every checkpoint with their own tokenizer.json. The plan says which tokenizer, from
which file, its size against the embedding's rows, and for the stand-in measures how
many more tokens it makes than the Qwen2 vocabulary on the same prompts.

The memory model itself (:func:`~sc_jax.scoring.memory.plan_schedule`,
:class:`~sc_jax.scoring.memory.PlanError` and the rest) lives in
:mod:`sc_jax.scoring.memory`, below the engine.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from sc_jax.experiment.execution.grid import grid_table, project_grid
from sc_jax.experiment.execution.roofline import Rates, check_rates, plan_rates
from sc_jax.experiment.protocol.jobs import seed_jobs
from sc_jax.experiment.protocol.runplan import RunPlan, SeedWork, build_plan
from sc_jax.models.named_models import tokenizer_file
from sc_jax.models.tokenizer import ByteTokenizer, Tokenizer
from sc_jax.runtime.wheel_files import WheelFileError
from sc_jax.runtime.sharding import make_mesh
from sc_jax.scoring.costs import Roofline, flat_tokens, measured_attention, non_embedding_params, replay
from sc_jax.scoring.memory import MemoryPolicy, kv_bytes_per_token, level_peak_tokens, weight_bytes
from sc_jax.scoring.packing import PackShape
from sc_jax.scoring.xla_costs import compile_seconds, xla_peak_bytes

log = logging.getLogger(__name__)


#: The figures of :func:`sc_jax.scoring.costs.replay` a setting keeps.
REPLAY_FIELDS = ("attention", "scored_keys", "dense_flops", "dense_bytes", "attention_flops",
                 "attention_bytes", "readout_flops", "readout_bytes", "unique_tokens",
                 "executed_tokens", "padding_tokens", "flops", "calls", "rows", "programs",
                 "call_sizes", "depths")


@dataclasses.dataclass
class SettingPlan:
    """One (dataset, k) of :func:`plan_run`: its first seed's work (every job in one
    schedule, as the engine scores them), what the schedule costs and needs, and its
    forward time per seed. :meth:`to_json` is the plan's JSON setting (the keys
    :func:`plan_run` documents); the table reads that."""

    dataset: str
    k: int
    pairs: int
    job_pairs: dict[str, int]
    flat_tokens: int
    model_flops: float
    chunks: int
    shape: dict[str, int]
    max_tokens_per_batch: int
    max_cache_tokens: int
    level_peak_tokens: int
    peak_bytes: int
    weight_bytes: int
    cache_bytes: int
    temp_bytes: int
    longest_prompt: int
    longest_seed: int
    xla_attention: str
    replay: dict[str, Any]  # REPLAY_FIELDS of sc_jax.scoring.costs.replay
    xla: dict[str, Any] = dataclasses.field(default_factory=dict)  # compile_seconds, xla_peak_bytes
    prompt_tokens: int | None = None  # the stand-in's, where the reference vocabulary is here
    prompt_tokens_reference: int | None = None
    dense_seconds_per_seed: float = 0.0
    attention_seconds_per_seed: float = 0.0

    @property
    def forward_seconds_per_seed(self) -> float:
        return self.dense_seconds_per_seed + self.attention_seconds_per_seed

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name not in ("replay", "xla", "prompt_tokens", "prompt_tokens_reference")}
        out.update(self.replay, **self.xla,
                   executed_per_unique=self.replay["executed_tokens"] / max(self.replay["unique_tokens"], 1),
                   forward_seconds_per_seed=self.forward_seconds_per_seed)
        if self.prompt_tokens_reference:
            out.update(prompt_tokens=self.prompt_tokens,
                       prompt_tokens_reference=self.prompt_tokens_reference,
                       stand_in_inflation=self.prompt_tokens / self.prompt_tokens_reference)
        return out


@dataclasses.dataclass
class _Planner:
    """What every (dataset, k) of one plan shares: the run's plan, the roofline, the
    Qwen2 tokenizer where the run's is a stand-in (``reference``), the mesh the model
    program is lowered on, which XLA figures to take, and the attention's pace once
    measured (``score_seconds`` per scored key; :func:`measured_attention`)."""

    plan: RunPlan
    rates: Rates
    reference: Any
    mesh: Any
    xla: bool
    compile_time: bool
    progress: bool
    score_seconds: float | None = None
    measured: dict = dataclasses.field(default_factory=dict)


def _plan_setting(pl: _Planner, work: SeedWork) -> SettingPlan:
    """One (dataset, k) of :func:`plan_run`, from its first seed's ``work``: the
    schedule the run's plan made, replayed call by call, with XLA's figures."""
    run, config, policy = pl.plan.config, pl.plan.model.parts.config, pl.plan.policy
    planned, sj = work.planned, work.jobs
    sched, b = planned.schedule, planned.budgets
    r = replay(sched, config, attention=pl.rates.attention, platform=policy.platform,
               itemsize=jnp.dtype(pl.plan.dtype).itemsize, mode=run.mode)
    jobs = list(sj.jobs.values())
    longest = max(pl.plan.seeds_of(work.dataset, work.k), key=lambda w: w.longest_prompt)
    s = SettingPlan(
        dataset=work.dataset, k=work.k, pairs=int(sum(len(p) for _, p in jobs)),
        job_pairs={tag: len(p) for tag, (_, p) in sj.jobs.items()},
        flat_tokens=flat_tokens(sj.pieces, jobs, run.mode),
        model_flops=2 * non_embedding_params(config) * r["unique_tokens"], chunks=len(sched.chunks),
        shape=dataclasses.asdict(sched.shape), max_tokens_per_batch=b.max_tokens_per_batch,
        max_cache_tokens=b.max_cache_tokens, level_peak_tokens=level_peak_tokens(sched),
        peak_bytes=b.peak_bytes, weight_bytes=b.weight_bytes, cache_bytes=b.cache_bytes,
        temp_bytes=b.temp_bytes, longest_prompt=longest.longest_prompt, longest_seed=longest.seed,
        xla_attention=_lowered_attention(pl.rates.attention),
        replay={key: r[key] for key in REPLAY_FIELDS})
    if pl.progress:
        sh = sched.shape
        log.info("  %s k=%d: %d jobs, %d pairs, %d calls of %d x %d tokens (%d cached keys per row), "
                 "%d programs", s.dataset, s.k, len(jobs), s.pairs, r["calls"], sh.B, sh.W, sh.cache,
                 r["programs"])
    if pl.reference is not None:
        ref = seed_jobs(pl.reference, pl.plan.datasets[work.dataset], work.split, run, work.k)
        s.prompt_tokens = _prompt_tokens(sj.pieces, sj.jobs, run.mode)
        s.prompt_tokens_reference = _prompt_tokens(ref.pieces, ref.jobs, run.mode)
    s.xla.update(_xla_figures(pl, planned, s.xla_attention))
    return s


def _lowered_attention(attention: str) -> str:
    """The attention of the program as the engine compiles it here: the fused kernels
    compile on a GPU only (the Pallas one also on a TPU; on a CPU it is its
    interpreter), so elsewhere their XLA figures are the dense path's (more
    temporaries, not fewer)."""
    fused_on = {"cudnn": ("gpu",), "pallas": ("gpu", "tpu")}.get(attention)
    return "dense" if fused_on is not None and jax.default_backend() not in fused_on else attention


def _xla_figures(pl: _Planner, planned, attention: str) -> dict[str, Any]:
    """XLA's compile seconds and peak bytes of the model program of ``planned`` (where
    asked, and where its mesh is on this machine)."""
    policy, config, dtype = pl.plan.policy, pl.plan.model.parts.config, pl.plan.dtype
    out: dict[str, Any] = {}
    if pl.mesh is None and policy.model_shards * policy.n_devices > 1:
        return out
    kw = {"mode": pl.plan.config.mode, "mesh": pl.mesh, "attention": attention}
    if pl.compile_time:
        out.update(compile_seconds(config, dtype, planned.schedule.shapes, measured=pl.measured,
                                   progress=pl.progress, **kw))
    if pl.xla:
        out.update(xla_peak_bytes(config, dtype, planned, model_shards=policy.model_shards, **kw))
    return out


#: Keys every plan's JSON holds (``sc-jax plan --json``): an existing file with them is a
#: plan of ours, which a new plan replaces; any other file is a user's, refused.
PLAN_KEYS = ("model", "budget_bytes", "attention_source", "settings")


def written_by_plan(path) -> bool:
    """Whether the file ``path`` is a plan's JSON (:data:`PLAN_KEYS`) that sc-jax wrote."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and all(k in data for k in PLAN_KEYS)


def plan_run(run_config, *, peak_flops: float | None = None, mfu: float = 0.4, xla: bool = True,
             compile_time: bool = True, progress: bool = False,
             accelerator: str | None = None, bandwidth: float | None = None,
             attention: str = "auto") -> dict[str, Any]:
    """A dry run of ``sc-jax run``: what one seed of every (dataset, k) would score,
    with no weights read and nothing scored. Every job of the seed (base, cc, dc,
    surrogate and test-time sizes) is planned together, as one engine call scores
    them (:meth:`sc_jax.scoring.memory.MemoryPolicy.plan`). Returns a JSON-able dict with, per (dataset, k):
    ``pairs`` (``job_pairs``: per job tag), ``unique_tokens`` (what the trie
    computes), ``executed_tokens`` (calls x B x W, what the device runs),
    ``padding_tokens`` (their difference), ``flat_tokens`` (full prompts), FLOPs,
    ``calls`` (``call_sizes``: rows per call -> calls), ``chunks``, the largest call
    ``shape`` (B, W, cache, R, labels), the distinct model ``programs`` (one per call
    size), the planned ``peak_bytes`` and its parts (``weight_bytes``, ``cache_bytes``
    for the resident token pool, ``temp_bytes`` for one call), per depth (``depths``, by
    :func:`sc_jax.scoring.costs.depth_name`) the same token counts (:func:`replay`), and:

    * ``xla=True``: XLA's ``xla_peak_bytes`` for the model program and the plan's
      figure for it (``planned_peak_of_that_call``);
    * ``compile_time=True``: ``compile_seconds``, the model program traced,
      lowered and compiled with abstract shapes on this backend (:func:`compile_seconds`;
      a CPU's figure, not a GPU's); a figure of its own, never added to the forward time;
    * ``forward_seconds_per_seed`` = ``dense_seconds_per_seed`` +
      ``attention_seconds_per_seed``: each part of every call on a roofline
      (:class:`sc_jax.scoring.costs.Roofline`), FLOPs at ``mfu`` of ``peak_flops`` per device
      (None: :func:`device_peak_flops`; ``peak_source`` says where it comes from), bytes
      at ``bandwidth`` (None: :func:`device_bandwidth`; ``bandwidth_source``), the
      attention that of the engine on that device (``attention``; "auto":
      :func:`sc_jax.models.attention.choose`), its scored keys and memory traffic counted per
      call (:class:`sc_jax.scoring.costs.CostModel`);
    * ``tokenizer`` ("byte stand-in", "real (NAME's tokenizer.json)" for a preset
      sharing a named model's vocabulary, "the model's own"), ``tokenizer_file``,
      ``tokenizer_tokens`` against ``embedding_rows``, ``tokenizer_note`` (why a preset
      fell back to the stand-in) and, for the stand-in,
      ``stand_in_inflation``: its prompt tokens over the Qwen2 vocabulary's on the same
      prompts (first seed), where that vocabulary is on this machine.

    ``flops`` is what the device executes (every row of every call, padding and
    masked attention keys included); ``model_flops`` is 2 x non-embedding parameters
    x unique tokens, the usual numerator of MFU. Seeds repeat the same work with other
    demonstrations, so totals multiply the first seed's figures by the number of seeds,
    and so does ``grid``, the whole grid projected per (dataset, k), dataset and k
    (:func:`sc_jax.experiment.execution.grid.project_grid`).
    The memory budget and the mesh are the run's own (``run_config.device_memory``,
    ``mesh_devices``, ``mesh_model``), resolved once by
    :func:`sc_jax.experiment.protocol.config.run_policy`, as the run resolves them.
    """
    check_rates(peak_flops=peak_flops, mfu=mfu, bandwidth=bandwidth)
    # The run's own plan: its data, model, memory policy and every seed's work, checked
    # as the run checks them (a prompt too long for the context window is named, task,
    # seed and row, before the memory plan would misread it). A dry run: every process
    # computes the same plan and process 0 reports it, so no collective over the
    # processes' memory figures, and a named model is not fetched.
    run_plan = build_plan(run_config, agree=False, fetch=False)
    rates = plan_rates(run_plan.dtype, peak_flops=peak_flops, mfu=mfu, accelerator=accelerator,
                   bandwidth=bandwidth, attention=attention)
    tokenizer = run_plan.model.parts.tokenizer
    reference, why = _reference_tokenizer() if isinstance(tokenizer, ByteTokenizer) else (None, "")
    pl = _Planner(run_plan, rates, reference, _lowering_mesh(run_plan.policy, xla or compile_time),
                  xla, compile_time, progress)
    out = _plan_header(run_plan, rates)
    if why:
        out["stand_in_inflation_missing"] = why
    settings = []
    for name, ds in run_plan.datasets.items():
        for k in run_config.shots:
            work = run_plan.seeds_of(name, k)
            if not work:
                settings.append(dict(dataset=name, k=k, skipped=True))
                continue
            setting = _plan_setting(pl, work[0])
            if rates.calibrate and pl.score_seconds is None:
                _measure_attention(pl, setting, out)
            _forward_seconds(setting, run_plan.model.parts.config,
                             rates.roofline(run_plan.policy.n_devices * run_plan.policy.model_shards),
                             pl.score_seconds, run_plan.policy.n_devices * run_plan.policy.model_shards)
            settings.append(setting.to_json())
    out["settings"] = settings
    out.update(_run_totals(settings, len(run_config.seeds), pl.measured))
    out["grid"] = project_grid(out)
    return out


def _lowering_mesh(policy: MemoryPolicy, lowered: bool):
    """The mesh the model program is lowered on for XLA's figures: the run's, where
    this machine has its devices (else None: no figures for a mesh)."""
    devices = policy.n_devices * policy.model_shards
    if devices > 1 and lowered and len(jax.devices()) >= devices:
        return make_mesh(policy.n_devices, model=policy.model_shards)
    return None


def _plan_header(run_plan: RunPlan, rates: Rates) -> dict[str, Any]:
    """The plan's JSON but its settings and totals: the model, its memory and the roofline."""
    c, parts, policy, dtype = run_plan.config, run_plan.model.parts, run_plan.policy, run_plan.dtype
    config, tokenizer = parts.config, parts.tokenizer
    out = dict(model=c.model, dtype=c.dtype, budget_bytes=int(policy.budget_bytes),
               attention_source=f"{rates.attention} attention on the roofline (scores' memory "
                                "traffic counted, not measured)",
               n_devices=policy.n_devices, model_shards=policy.model_shards,
               weight_bytes=weight_bytes(config, dtype, policy.model_shards),
               kv_bytes_per_token=kv_bytes_per_token(config, dtype, policy.model_shards),
               peak_flops=rates.peak_flops, peak_source=rates.peak_source, mfu=rates.mfu,
               attention=rates.attention, bandwidth=rates.bandwidth,
               bandwidth_source=rates.bandwidth_source, seeds=len(c.seeds),
               context_window=config.max_position_embeddings,
               tokenizer=parts.tokenizer_label, tokenizer_file=parts.tokenizer_file,
               tokenizer_tokens=tokenizer.vocab_size, embedding_rows=config.vocab_size,
               compile_backend=_backend_name(), settings=[])
    if parts.tokenizer_note:
        out["tokenizer_note"] = parts.tokenizer_note
    return out


def _measure_attention(pl: _Planner, setting: SettingPlan, out: dict[str, Any]) -> None:
    """The attention's pace measured here, at the run's call shape, once per plan: a
    plan for this machine's own backend (a named accelerator's is the roofline's)."""
    plan, attention = pl.plan, pl.rates.attention
    pl.score_seconds = measured_attention(plan.model.parts.config, plan.dtype,
                                          PackShape(**setting.shape), attention,
                                          platform=plan.policy.platform)
    out["attention_source"] = (f"{attention} attention measured on this {jax.default_backend()}: "
                               f"{pl.score_seconds * 1e12:.2f} ps per scored key and head")


def _forward_seconds(setting: SettingPlan, config, roof: Roofline, score_seconds: float | None,
                     devices: int) -> None:
    """A setting's forward time per seed: the dense part on ``roof``, the attention
    measured on this backend (``score_seconds`` per scored token, head and key) or,
    without that, on the roofline too."""
    r = setting.replay
    setting.dense_seconds_per_seed = roof.seconds(r["dense_flops"], r["dense_bytes"])
    if score_seconds:
        setting.attention_seconds_per_seed = (
            r["scored_keys"] * r["executed_tokens"] * config.num_heads * config.num_layers
            * score_seconds / devices)
    else:
        setting.attention_seconds_per_seed = roof.seconds(r["attention_flops"], r["attention_bytes"])


#: The named model whose vocabulary (Qwen2's byte-level BPE, 152k tokens) measures how
#: many more tokens the byte-level stand-in of the random presets makes.
INFLATION_REFERENCE = "qwen2.5-0.5b"


def _backend_name() -> str:
    """"cpu", or the platform with its device kind ("gpu (NVIDIA H100 80GB HBM3)")."""
    dev = jax.local_devices()[0]
    kind = str(getattr(dev, "device_kind", dev.platform))
    return dev.platform if kind.lower() == dev.platform else f"{dev.platform} ({kind})"


def _reference_tokenizer():
    """(Qwen2 tokenizer or None, why none): only files already on this machine, so a
    plan never starts a download for a comparison."""
    try:
        path = tokenizer_file(INFLATION_REFERENCE, fetch=False)
    except (OSError, ValueError, ImportError, WheelFileError) as e:
        return None, str(e).splitlines()[0]
    if path is None:
        return None, (f"the {INFLATION_REFERENCE} vocabulary is not on this machine "
                      f"(`sc-jax info {INFLATION_REFERENCE}` fetches it)")
    return Tokenizer.from_file(path), ""


def _prompt_tokens(pieces, jobs, mode: str) -> int:
    """Tokens of every prompt the jobs score, in full."""
    return int(sum(pieces.prompt_lengths(ctx, pairs, mode).sum() for ctx, pairs in jobs.values()))



def _run_totals(settings: list[dict], seeds: int, measured: dict) -> dict[str, Any]:
    """The plan's totals: forward time and FLOPs over every seed, the stand-in's
    inflation over all settings, and the run's distinct programs (a program two
    settings share compiles once) with their compile seconds."""
    done = [s for s in settings if not s.get("skipped")]
    out = {"total_forward_seconds": sum(s["forward_seconds_per_seed"] for s in done) * seeds,
           "total_attention_seconds": sum(s["attention_seconds_per_seed"] for s in done) * seeds,
           "total_flops": sum(s["flops"] for s in done) * seeds}
    ref = sum(s.get("prompt_tokens_reference", 0) for s in done)
    if ref:
        out["stand_in_inflation"] = sum(s["prompt_tokens"] for s in done) / ref
    if measured:
        out.update(programs=len(measured),
                   compile_seconds=sum(m["seconds"] for m in measured.values()),
                   compile_wall_seconds=sum(m["wall_seconds"] for m in measured.values()),
                   compile_cache_hits=sum(int(m["cached"]) for m in measured.values()))
    return out


def _tokenizer_line(plan: dict[str, Any]) -> str:
    tok = plan.get("tokenizer", "byte stand-in")
    n, V = plan.get("tokenizer_tokens"), plan.get("embedding_rows")
    if tok != "byte stand-in":
        size = f", {n:,} tokens for {V:,} embedding rows" if n and V else ""
        return f"tokenizer: {tok}{size} ({plan.get('tokenizer_file')})"
    # The stand-in's ids are bytes: 515 of the embedding's rows, whatever its size.
    tail = f"; {ByteTokenizer.SPACE_OFFSET + 256} byte ids of {V:,} embedding rows" if V else ""
    if plan.get("tokenizer_note"):
        tail += f"; {plan['tokenizer_note']}"
    if "stand_in_inflation" in plan:
        return (f"tokenizer: byte stand-in, {plan['stand_in_inflation']:.2f}x the tokens of the Qwen2 "
                f"vocabulary ({INFLATION_REFERENCE}) on the same prompts (first seed, measured): "
                f"token counts, FLOPs and times below are inflated by about that much{tail}")
    return (f"tokenizer: byte stand-in, several times the tokens of a real vocabulary (not measured: "
            f"{plan.get('stand_in_inflation_missing', 'no reference')}){tail}")


def _shape(s: dict[str, Any]) -> str:
    sh = s["shape"]
    return f"{sh['B']} x {sh['W']}, {sh['cache']} keys"


def _setting_line(s: dict[str, Any]) -> str:
    gib = 2 ** 30
    xla = f"{s['xla_peak_bytes'] / gib:.2f}" if "xla_peak_bytes" in s else "–"
    comp = f"{s['compile_seconds']:.1f}" if "compile_seconds" in s else "–"
    return (f"| {s['dataset']} | {s['k']} | {s['pairs']:,} | {s['unique_tokens']:,} | "
            f"{s['executed_tokens']:,} | {s['padding_tokens']:,} | {s['executed_per_unique']:.2f}x | "
            f"{s['flat_tokens'] / s['unique_tokens']:.1f}x | {s['flops'] / 1e12:.1f} | "
            f"{s['calls']:,} | {_shape(s)} | {s['programs']} | {comp} | {s['peak_bytes'] / gib:.2f} | "
            f"{xla} | {s['scored_keys']:,.0f} | {s['dense_seconds_per_seed']:.1f} | "
            f"{s['attention_seconds_per_seed']:.1f} | {s['forward_seconds_per_seed']:.1f} |")


def _padding_lines(done: list[dict]) -> list[str]:
    """Per setting, the three depths with the most padding: their share of the
    setting's padding, calls, and how much of it is in the unused ends of rows (the
    rest: the empty rows of each depth's last call)."""
    lines = []
    for s in done:
        W = s["shape"]["W"]
        top = sorted(s["depths"].items(), key=lambda kv: -kv[1]["padding_tokens"])[:3]
        parts = [f"{name} {st['padding_tokens']:,} ({st['padding_tokens'] / max(s['padding_tokens'], 1):.0%}; "
                 f"{st['calls']} calls, {(st['rows'] * W - st['unique_tokens']) / max(st['padding_tokens'], 1):.0%}"
                 " in row ends)" for name, st in top]
        lines.append(f"- {s['dataset']} k={s['k']}: " + "; ".join(parts))
    return lines


def _sizes(s: dict[str, Any]) -> str:
    """"B 16 rows: 160, B 8: 3" (the calls of each size, largest first)."""
    sizes = sorted(s["call_sizes"].items(), key=lambda kv: -int(kv[0]))
    return ", ".join(f"B {b}{' rows' if i == 0 else ''}: {n:,}" for i, (b, n) in enumerate(sizes))


def _memory_lines(done: list[dict]) -> list[str]:
    """Per setting, the call shape and the planned peak's parts."""
    gib = 2 ** 30
    lines = []
    for s in done:
        sh = s["shape"]
        xla = ""
        if "xla_peak_bytes" in s:
            xla = (f"; XLA {s['xla_peak_bytes'] / gib:.2f} GiB for the model program "
                   f"({s.get('xla_attention', 'dense')} attention) "
                   f"(planned {s['planned_peak_of_that_call'] / gib:.2f})")
        slots = ", ".join(f"{name} {st['m']} x {st['S']}" for name, st in s["depths"].items())
        lines.append(
            f"- {s['dataset']} k={s['k']}: {s['calls']:,} calls ({_sizes(s)}) x W {sh['W']} "
            f"tokens after {sh['cache']} cached keys per row, R {sh['R']} readouts; "
            f"{s['chunks']} chunk(s); cache slots per row by depth (m x S tokens): {slots}; peak "
            f"{s['peak_bytes'] / gib:.2f} GiB = weights {s['weight_bytes'] / gib:.2f} + KV pool "
            f"{s['cache_bytes'] / gib:.2f} ({s['level_peak_tokens']:,} tokens) + one call "
            f"{s['temp_bytes'] / gib:.2f}{xla}")
    return lines


def _compile_line(plan: dict[str, Any]) -> str:
    if "compile_seconds" not in plan:
        return "compile time not measured (--no-compile-time, or a mesh larger than this machine's devices)"
    return (f"compile: {plan['programs']} distinct model programs over the run, "
            f"{plan['compile_seconds']:.1f} s to trace, lower and compile them on this "
            f"{plan.get('compile_backend', 'backend')} (measured with abstract shapes; a GPU compile "
            f"takes other times), not included in the forward time; "
            f"{plan['compile_cache_hits']} served from JAX's persistent compilation cache "
            f"(this plan spent {plan['compile_wall_seconds']:.1f} s)")


def plan_table(plan: dict[str, Any]) -> str:
    """Markdown summary of :func:`plan_run`."""
    gib = 2 ** 30
    backend = plan.get("compile_backend", "cpu").split(" ")[0]
    lines = [f"model {plan['model']} ({plan['dtype']}): weights {plan['weight_bytes'] / gib:.2f} GiB, "
             f"KV {plan['kv_bytes_per_token'] / 2 ** 20:.3f} MiB per token; budget "
             f"{plan['budget_bytes'] / gib:.1f} GiB per device; mesh data {plan['n_devices']} x model "
             f"{plan['model_shards']}; forward time on a roofline: {plan['mfu']:.0%} MFU of "
             f"{plan['peak_flops'] / 1e12:.3g} TFLOP/s per device "
             f"({plan.get('peak_source', 'given')}), memory {plan['bandwidth'] / 1e9:,.0f} GB/s "
             f"({plan['bandwidth_source']}); {plan['attention_source']} "
             "(dense s: projections, MLP and readout; attention s: scores, softmax, values)",
             _tokenizer_line(plan), "",
             "| dataset | k | pairs | unique tokens | executed tokens | padding tokens | executed/unique | "
             f"flat/unique | TFLOP | calls | call shape B x W | programs | compile s ({backend}) | "
             "peak GiB | XLA peak GiB | keys scored per token | dense s per seed | attention s per seed | "
             "forward s per seed |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in plan["settings"]:
        if s.get("skipped"):
            lines.append(f"| {s['dataset']} | {s['k']} | skipped: more classes than demonstrations "
                         "|" + " |" * 16)
            continue
        lines.append(_setting_line(s))
    done = [s for s in plan["settings"] if not s.get("skipped")]
    if done:
        lines += ["", "calls and memory per device (all jobs of a seed in one schedule):"] + _memory_lines(done)
        lines += ["", ("padding (executed - unique tokens) by depth (d: segments making depth-d trie "
                       "nodes and query rows after d - 1 demonstrations), the largest three:")]
        lines += _padding_lines(done)
        w = max(done, key=lambda s: s["longest_prompt"])
        lines += ["", (f"longest prompt over all seeds and jobs: {w['longest_prompt']:,} tokens "
                       f"({w['dataset']} k={w['k']} seed {w['longest_seed']}), context window "
                       f"{plan.get('context_window', 0):,}")]
    expect = ""
    if "compile_seconds" in plan:
        expect = (f", plus {plan['programs']} model program(s) to compile once per machine "
                  f"({plan['compile_seconds']:.1f} s on this {backend})")
    lines += ["", f"total over {plan['seeds']} seed(s): {plan['total_flops'] / 1e12:.1f} TFLOP, "
              f"about {plan['total_forward_seconds'] / 60:.1f} min of forward passes on the stated "
              f"roofline ({plan['total_attention_seconds'] / 60:.1f} min of it attention)"
              + expect, _compile_line(plan)]
    if "grid" in plan:
        lines += ["", _grid_heading(plan), grid_table(plan["grid"])]
    return "\n".join(lines)


def _grid_heading(plan: dict[str, Any]) -> str:
    g = plan["grid"]
    datasets = len({s["dataset"] for s in g["settings"]})
    shots = ", ".join(str(k) for k in sorted({s["k"] for s in g["settings"]}))
    return (f"the grid: {datasets} dataset(s) x k = {shots} x {g['seeds']} seed(s), projected from the "
            "plan's forward time per seed times the seeds (the plan replays the first seed of each "
            "(dataset, k); the other seeds differ in their demonstrations and are projected at its "
            "cost); the plan has no cost model of the fits, host work and metrics (gpu_check's grid "
            "phase measures them and projects from its rates):")
