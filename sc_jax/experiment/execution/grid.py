"""The whole grid of a plan projected (every dataset x k x seed, e.g. the paper's 9 tasks
x k = 4, 8, 16 x 5 seeds): from the plan's own cost model (:func:`project_grid` of a
:func:`sc_jax.experiment.execution.plan.plan_run` plan), or from what a run measured
(:class:`MeasuredRates`, read from its results.json ``timing``) applied to the plan's
token counts.

The plan replays the first seed of each (dataset, k). The other seeds score the same
jobs on the same test set with other demonstrations drawn from the same data, so each
is projected at the first seed's cost: per (dataset, k), the first seed's figure times
the number of seeds.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sc_jax.experiment.evaluation.results import RunTiming

#: The parts of a projected (dataset, k), in seconds over all its seeds.
PARTS = ("forward_s", "host_s", "compile_s", "fit_s", "metrics_s")


@dataclasses.dataclass(frozen=True)
class MeasuredRates:
    """What one ``sc-jax run`` measured, as rates that carry to other (dataset, k, seeds).

    ``forward_tokens_per_s``: executed tokens (calls x B x W, padding included) per
    second of forward calls; ``host_seconds_per_token``: the scoring's host time
    (prompts, schedule, call arrays, score files) per executed token;
    ``compile_first_s``: the scoring compiles of the run's first (dataset, k) (the
    model's programs, cold or from the persistent cache); ``compile_per_setting_s``: the
    mean scoring compile of each later (dataset, k) (the first's where the run had one);
    ``fit_solve_per_seed_s``: the fits' solve time per seed; ``fit_compile_per_setting_s``:
    the fits' compile per (dataset, k), their mean; ``metrics_per_seed_s``;
    ``once_s``: what a run pays once (load and report, and the wall time outside the parts).
    """

    forward_tokens_per_s: float
    host_seconds_per_token: float
    compile_first_s: float
    compile_per_setting_s: float
    fit_solve_per_seed_s: float
    fit_compile_per_setting_s: float
    metrics_per_seed_s: float
    once_s: float

    @classmethod
    def from_timing(cls, timing: RunTiming) -> MeasuredRates:
        """The rates of a run's results.json ``timing`` (a
        :class:`~sc_jax.experiment.evaluation.results.RunTiming`,
        :func:`sc_jax.experiment.execution.run.run_timing`): its per-seed records ``seeds`` and
        per-(dataset, k) fit records ``fits``."""
        seeds, fits = timing.seeds, timing.fits
        if not seeds or not fits:
            raise ValueError("the run's timing holds no scored seed or no fit: nothing to project from")
        compile_by_setting: dict[tuple, float] = {}
        for s in seeds:  # in the run's order: the first setting is the one that compiled cold
            key = (s.dataset, s.shots)
            compile_by_setting[key] = compile_by_setting.get(key, 0.0) + s.compile_s
        compiles = list(compile_by_setting.values())
        later = compiles[1:] or compiles[:1]
        tokens = sum(s.executed_tokens for s in seeds)
        if tokens <= 0 or sum(s.forward_s for s in seeds) <= 0:
            # A resumed run reads its seeds from the score cache: no forward pass to rate.
            raise ValueError("the run scored no token (every seed came from its score cache): "
                             "project from a run that scored, e.g. in a fresh --out")
        return cls(
            forward_tokens_per_s=tokens / sum(s.forward_s for s in seeds),
            host_seconds_per_token=sum(s.host_s for s in seeds) / tokens,
            compile_first_s=compiles[0], compile_per_setting_s=sum(later) / len(later),
            fit_solve_per_seed_s=sum(f.solve_s for f in fits) / sum(len(f.seeds) for f in fits),
            fit_compile_per_setting_s=sum(f.compile_s for f in fits) / len(fits),
            metrics_per_seed_s=timing.metrics_s / len(seeds),
            once_s=timing.load_s + timing.report_s + max(timing.unaccounted_s, 0.0))


def _measured_parts(s: dict, seeds: int, first: bool, rates: MeasuredRates) -> dict[str, float]:
    """One (dataset, k)'s seconds over ``seeds`` seeds at ``rates``, from the plan's
    executed tokens of its first seed ``s``."""
    tokens = seeds * s["executed_tokens"]
    return {"forward_s": tokens / rates.forward_tokens_per_s,
            "host_s": tokens * rates.host_seconds_per_token,
            "compile_s": rates.compile_first_s if first else rates.compile_per_setting_s,
            "fit_s": seeds * rates.fit_solve_per_seed_s + rates.fit_compile_per_setting_s,
            "metrics_s": seeds * rates.metrics_per_seed_s}


def project_grid(plan: dict[str, Any], rates: MeasuredRates | None = None) -> dict[str, Any]:
    """The whole grid of ``plan`` (every dataset and k of its settings, ``plan["seeds"]``
    seeds), in seconds.

    Without ``rates``, the plan's own estimate: per (dataset, k) ``forward_s`` =
    ``forward_seconds_per_seed`` (the cost model on the plan's roofline) x seeds, and
    once per grid the model programs' compile where the plan measured it
    (``compile_seconds``: this machine's figure, abstract shapes); the plan has no cost
    model of the fits, host work or metrics. With ``rates``, every part of
    :data:`PARTS` from the measured rates and the plan's executed tokens, and
    ``rates.once_s`` once.

    Returns ``source`` ("plan" or "measured"), ``seeds``, ``settings`` (per (dataset,
    k): ``seconds_per_seed`` of its forward, its parts and ``seconds``; skipped ones as
    the plan has them), ``by_dataset`` and ``by_k`` (lists of ``{dataset|k, seconds}``),
    ``parts`` (each part summed over the settings), ``once`` (seconds paid once per
    grid, by name), ``total_seconds`` (= the settings' seconds + the once seconds) and
    ``total_minutes``.
    """
    seeds = plan["seeds"]
    rows, first = [], True
    for s in plan["settings"]:
        if s.get("skipped"):
            rows.append({"dataset": s["dataset"], "k": s["k"], "skipped": True})
            continue
        if rates is None:
            parts = {"forward_s": s["forward_seconds_per_seed"] * seeds}
        else:
            parts = _measured_parts(s, seeds, first, rates)
        first = False
        rows.append({"dataset": s["dataset"], "k": s["k"],
                     "seconds_per_seed": parts["forward_s"] / seeds, **parts,
                     "seconds": sum(parts.values())})
    done = [r for r in rows if not r.get("skipped")]
    if rates is not None:
        once = {"load_and_report_s": rates.once_s}
    else:
        once = {"model_compile_s": plan["compile_seconds"]} if "compile_seconds" in plan else {}
    return {"source": "plan" if rates is None else "measured", "seeds": seeds,
            "settings": rows,
            "by_dataset": _totals(done, "dataset"), "by_k": _totals(done, "k"),
            "parts": {p: sum(r[p] for r in done) for p in PARTS if any(p in r for r in done)},
            "once": once, **_total(sum(r["seconds"] for r in done) + sum(once.values()))}


def _totals(rows: list[dict], key: str) -> list[dict]:
    out: dict = {}
    for r in rows:
        out[r[key]] = out.get(r[key], 0.0) + r["seconds"]
    return [{key: name, "seconds": secs} for name, secs in out.items()]


def _total(seconds: float) -> dict[str, float]:
    return {"total_seconds": seconds, "total_minutes": seconds / 60}


def grid_table(grid: dict[str, Any]) -> str:
    """Markdown of a projection (:func:`project_grid`): per dataset, the forward seconds
    of one seed at each k and the minutes of all its seeds and parts; a last row with
    the sums over the datasets; then the total and its parts in minutes."""
    shots = sorted({r["k"] for r in grid["settings"]})
    cell = {(r["dataset"], r["k"]): r for r in grid["settings"]}
    minutes = {d["dataset"]: d["seconds"] / 60 for d in grid["by_dataset"]}
    lines = ["| dataset | " + " | ".join(f"k={k}: forward s per seed" for k in shots)
             + f" | minutes, {grid['seeds']} seed(s) |", "|---" * (len(shots) + 2) + "|"]
    for name in dict.fromkeys(r["dataset"] for r in grid["settings"]):
        cells = ["–" if (name, k) not in cell else "skipped" if cell[name, k].get("skipped")
                 else f"{cell[name, k]['seconds_per_seed']:.1f}" for k in shots]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {minutes.get(name, 0.0):.1f} |")
    sums = [sum(r["seconds_per_seed"] for r in grid["settings"] if r["k"] == k and not r.get("skipped"))
            for k in shots]
    lines.append("| all | " + " | ".join(f"{x:.1f}" for x in sums)
                 + f" | {sum(minutes.values()):.1f} |")
    parts = ", ".join(f"{_name(p)} {s / 60:.1f}" for p, s in grid["parts"].items())
    once = "".join(f" + {_name(p)} {s / 60:.1f} once" for p, s in grid["once"].items())
    lines.append(f"\ntotal: about {grid['total_minutes']:.1f} min = {parts}{once} (minutes)")
    return "\n".join(lines)


def _name(part: str) -> str:
    return part.removesuffix("_s").replace("_", " ")
