"""A run's ``results.json``, read and checked before any table or plot is made from it
(:func:`load_results`), and the display names of the methods it may hold
(:data:`METHOD_NAMES`).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

# "BC (code)": BC as the reference code computes it, softmax(p - mean p)
# (sc_jax.calibration.baselines.batch_calibration_reference), beside the paper's p / mean p.
# "SC* (no trust region)": the bias-only fit without the trust region (tau = -1), as
# the paper describes SC* and the reference code fits it; "SC*" keeps it.
METHOD_NAMES = {"base": "Base", "cc": "CC", "dc": "DC", "bc": "BC", "bc_reference": "BC (code)",
                "sc_star": "SC*", "sc_star_free": "SC* (no trust region)", "sc": "SC",
                "sc_paper": "SC (paper, no guard)"}


def load_results(path: str | Path) -> dict:
    path = Path(path)
    if path.is_dir():
        path = path / "results.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: pass the output directory of a run (the folder holding results.json)")
    try:
        res = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        if path.name != "results.json":  # another file given for the run's directory
            raise ValueError(f"{path} is a file, not a run's output directory: pass the folder "
                             "holding results.json (or results.json itself)") from None
        raise ValueError(f"{path} is not valid JSON ({e}); re-run `sc-jax run` to regenerate it") from e
    problem = results_problem(res)
    if problem:
        raise ValueError(f"{path} is not an sc_jax results file: {problem}")
    problem = rows_against_config(res)
    if problem:
        raise ValueError(f"{path}: {problem}; the tables would not be those of its config: "
                         "rerun the `sc-jax run` command of its config with the same --out to "
                         "rewrite it (every score is read from the cache)")
    return res


def _row_name(r: dict) -> str:
    return f"(method {r['method']}, dataset {r['dataset']}, k {r['shots']}, seed {r['seed']})"


def rows_against_config(res: dict) -> str | None:
    """What makes the rows of ``res`` (a results.json that passed
    :func:`results_problem`) disagree with its config, naming the row; None when they
    agree. A run writes one row per method, dataset, k and seed, for every seed of
    ``config.seeds``: a repeated row would be averaged in twice, a missing seed would
    leave a method's mean over fewer seeds than the header says, a seed the config
    does not list was not part of the run, and a method of config ``methods`` with no
    rows would drop out of the tables without a word."""
    cfg = res["config"]
    seeds = cfg["seeds"]
    if not isinstance(seeds, (list, tuple)) or not seeds or any(_wrong(s, int) for s in seeds):
        return f"config 'seeds' is {seeds!r}, not a list of whole numbers"
    listed = {"dataset": cfg.get("datasets"), "shots": cfg.get("shots")}
    seen, groups = set(), defaultdict(set)
    for r in res["rows"]:
        if r["seed"] not in seeds:
            return f"row {_row_name(r)} has a seed that config 'seeds' {list(seeds)} does not list"
        for key, values in listed.items():  # older results.json may lack them: not checked
            if isinstance(values, (list, tuple)) and r[key] not in values:
                return (f"row {_row_name(r)} has a {key} that config "
                        f"'{key if key == 'shots' else 'datasets'}' {list(values)} does not list")
        key = (r["method"], r["dataset"], r["shots"], r["seed"])
        if key in seen:
            return f"row {_row_name(r)} appears more than once"
        seen.add(key)
        groups[key[:3]].add(r["seed"])
    for (method, dataset, k), have in sorted(groups.items()):
        for s in seeds:
            if s not in have:
                name = _row_name(dict(method=method, dataset=dataset, shots=k, seed=s))
                return f"row {name} is missing (config 'seeds' {list(seeds)})"
    return _method_without_rows(cfg.get("methods"), groups)


def _method_without_rows(methods, groups) -> str | None:
    """A method of config ``methods`` (older results.json may lack it: not checked)
    with no row on a (dataset, k) that has rows (a skipped one has none), which the
    tables would silently leave out; ``groups`` is keyed by (method, dataset, k)."""
    if not isinstance(methods, (list, tuple)):
        return None
    for dataset, k in sorted({key[1:] for key in groups}):
        for method in methods:
            if (method, dataset, k) not in groups:
                return (f"method {method!r} of config 'methods' {list(methods)} has no row "
                        f"for dataset {dataset}, k {k}")
    return None


# What the tables and plots read from results.json: config keys, and per row / SC
# param the keys and their types (bool is excluded from the numbers).
_CONFIG_KEYS = ("model", "seeds", "test_size", "mode", "solver")
_ROW_KEYS = {"dataset": str, "shots": int, "method": str, "seed": int,
             "accuracy": float, "macro_f1": float, "ece": float}
_PARAM_KEYS = {"method": str, "dataset": str, "shots": int, "size": int, "w": list, "b": list}


def _wrong(value, kind) -> bool:
    if kind is float:
        return isinstance(value, bool) or not isinstance(value, (int, float))
    if kind is int:
        return isinstance(value, bool) or not isinstance(value, int)
    return not isinstance(value, kind)


def results_problem(res) -> str | None:
    """What makes ``res`` (parsed results.json) unusable for
    :func:`sc_jax.experiment.report.write_report`, in a few words naming the key or the
    row; None when it is usable."""
    if not isinstance(res, dict):
        return f"a JSON {type(res).__name__}, not an object"
    if not isinstance(res.get("config"), dict) or not isinstance(res.get("rows"), list):
        return "no 'config' object or no 'rows' list"
    missing = [k for k in _CONFIG_KEYS if k not in res["config"]]
    if missing:
        return f"config has no {missing[0]!r}"
    for what, items, keys in (("rows", res["rows"], _ROW_KEYS),
                              ("params", res.get("params") or [], _PARAM_KEYS)):
        if not isinstance(items, list):
            return f"{what!r} is not a list"
        for j, item in enumerate(items):
            if not isinstance(item, dict):
                return f"{what}[{j}] is not an object"
            if what == "params" and item.get("method") != "sc":
                continue  # only SC's parameters are plotted
            for key, kind in keys.items():
                if key not in item:
                    return f"{what}[{j}] has no {key!r}"
                if _wrong(item[key], kind):
                    return f"{what}[{j}][{key!r}] is {item[key]!r}, not {'a number' if kind is float else kind.__name__}"
                if kind is list and any(_wrong(v, float) for v in item[key]):
                    return f"{what}[{j}][{key!r}] holds a value that is not a number"
            if what == "rows" and item["method"] not in METHOD_NAMES:
                return f"rows[{j}] has an unknown method {item['method']!r}"
            if what == "rows":
                for key in ("accuracy", "macro_f1", "ece"):  # fractions, each in [0, 1]
                    if not 0.0 <= item[key] <= 1.0:
                        return f"rows[{j}][{key!r}] is {item[key]!r}, not a fraction in [0, 1]"
    if not res["rows"]:
        return "'rows' is empty: the run recorded no result"
    return None
