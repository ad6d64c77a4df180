"""A run's files: the output directory (:func:`make_out_dir`, refusing another
configuration's), its score files (:func:`save_scores` / :func:`load_scores`, tagged with
the configuration that made them and naming what they hold, :func:`score_meta`) and the
JSON it writes atomically.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import os
import platform
import sys
import zipfile
from pathlib import Path

import numpy as np

from sc_jax.calibration import methods as calibration_methods
from sc_jax.experiment.evaluation import metrics
from sc_jax.experiment.evaluation.methods import method_probs
from sc_jax.experiment.evaluation.results import METRICS, RunResults, load_results
from sc_jax.experiment.protocol.config import RunConfig
from sc_jax.experiment.protocol.jobs import SeedScores
from sc_jax.experiment.protocol.splits import test_set_hash


def scores_path(out_dir, dataset: str, k: int, seed: int) -> Path:
    """Where a run keeps the assembled scores of one (dataset, k, seed)."""
    return Path(out_dir) / "scores" / f"{dataset}-k{k}-seed{seed}.npz"


def config_tag(config_json: dict) -> str:
    """A short hash of a run configuration as results.json holds it
    (``RunConfig.to_json()`` through JSON): each score file carries its run's, so
    refits never mix the scores of two configurations."""
    return hashlib.sha256(json.dumps(config_json, sort_keys=True).encode()).hexdigest()[:16]


def score_meta(dataset: str, k: int, seed: int, split, model_identity: str | None) -> dict:
    """What one score file holds, stored in it (:func:`save_scores`) so that a file is
    never taken for another by its name: the dataset, k, seed, the demonstrations'
    and test queries' data rows (``split``: its
    :class:`sc_jax.experiment.protocol.splits.Split`) and the model's identity
    (:func:`sc_jax.models.identity.files_identity`)."""
    return {"dataset": dataset, "shots": int(k), "seed": int(seed),
            "demo_indices": [int(i) for i in split.demo_indices],
            "test_indices": [int(i) for i in split.test_indices],
            "model_identity": model_identity}


def save_scores(path: Path, s: SeedScores, tag: str | None = None,
                meta: dict | None = None) -> None:
    """Write one seed's :class:`SeedScores` (a few hundred KB) atomically: refits
    (``sc-jax ablate``) read these, with no model and no forward pass. ``tag``: the
    run's :func:`config_tag`, stored beside the scores; ``meta``: what they hold
    (:func:`score_meta`), checked when they are read (:func:`load_run_scores`)."""
    arrays = {"base": s.base, "cc": s.cc, "dc": s.dc, "y_test": s.y_test}
    if tag is not None:
        arrays["config"] = np.asarray(tag)
    if meta is not None:
        arrays["meta"] = np.asarray(json.dumps(meta, sort_keys=True))
    for i, (lp, y, q) in s.surrogate.items():
        arrays.update({f"surrogate{i}_logp": lp, f"surrogate{i}_labels": y,
                       f"surrogate{i}_queries": q})
    for i, t in s.test.items():
        arrays[f"test{i}"] = t
    if s.demo_labels is not None:
        arrays["demo_labels"] = s.demo_labels
    for i, c in (s.surrogate_contexts or {}).items():
        arrays[f"surrogate{i}_contexts"] = c
    if s.loo is not None:
        arrays.update(zip(("loo_logp", "loo_labels", "loo_queries"), s.loo))
    for i, d in s.hidden.items():
        arrays[f"hidden{i}"] = d
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{path.name}")
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
    tmp.replace(path)


def _unreadable(path: Path, e: Exception) -> ValueError:
    return ValueError(f"{path}: unreadable score file ({type(e).__name__}: {e}); rerun the "
                      "same `sc-jax run` command to rewrite it from the score cache")


def load_scores(path: Path, tag: str | None = None, expect: dict | None = None) -> SeedScores:
    """The :class:`SeedScores` written by :func:`save_scores`.

    Raises ValueError naming ``path`` for a truncated or foreign file (the score cache
    still holds the scores: rerunning the run's command rewrites it), or, given the
    ``tag`` of the configuration expected, for a file saved by a run of another
    configuration (files saved before tags existed carry none and are read as they are),
    or, given ``expect`` (what the file should hold: :func:`check_holds`), for a file
    that holds another dataset, k, seed, split or model's scores."""
    try:  # a damaged file: zipfile.BadZipFile (not an OSError), EOFError, ValueError, OSError
        with np.load(path) as z:
            a = {name: z[name] for name in z.files}
    except (zipfile.BadZipFile, EOFError, OSError, ValueError) as e:
        raise _unreadable(path, e) from e
    saved = str(a.pop("config")) if "config" in a else None
    if tag is not None and saved is not None and saved != tag:
        raise ValueError(f"{path} holds the scores of another configuration than the run's "
                         f"results.json (a rerun with other settings stopped before it ended?): "
                         "rerun the command of results.json with the same --out to rewrite them, "
                         "or finish the other one")
    try:
        meta = json.loads(str(a.pop("meta"))) if "meta" in a else None
        if meta is not None and not isinstance(meta, dict):
            raise ValueError(f"its record of what it holds is a JSON {type(meta).__name__}")
        sizes = sorted(int(name[len("test"):]) for name in a if name.startswith("test"))
        s = SeedScores(
            base=a["base"], cc=a["cc"], dc=a["dc"], y_test=a["y_test"],
            surrogate={i: (a[f"surrogate{i}_logp"], a[f"surrogate{i}_labels"],
                           a[f"surrogate{i}_queries"]) for i in sizes},
            test={i: a[f"test{i}"] for i in sizes},
            # Files written before Surprise Calibration lack these: it is then not rerun.
            demo_labels=a.get("demo_labels"),
            surrogate_contexts={i: a[f"surrogate{i}_contexts"] for i in sizes}
            if all(f"surrogate{i}_contexts" in a for i in sizes) and "demo_labels" in a else None,
            loo=(a["loo_logp"], a["loo_labels"], a["loo_queries"]) if "loo_logp" in a else None,
            hidden={i: a[f"hidden{i}"] for i in sizes if f"hidden{i}" in a})
    except (KeyError, ValueError) as e:  # a foreign archive: a key missing or misnamed
        raise _unreadable(path, e) from e
    if expect is not None:
        check_holds(path, s, meta, expect)
    return s


# What a score file's record (score_meta) is checked against, and how a person reads it.
_HELD = (("dataset", "dataset"), ("shots", "k"), ("seed", "seed"),
         ("demo_indices", "demonstration rows"), ("model_identity", "model"))
# Baselines whose results.json rows a score file without a record must reproduce.
_LEGACY_METHODS = ("base", "cc", "dc")


def check_holds(path: Path, s: SeedScores, meta: dict | None, expect: dict) -> None:
    """A ValueError naming ``path`` when the scores ``s`` (with their record ``meta``,
    :func:`score_meta`; None for a file written before records) are not those of
    ``expect``: ``dataset``, ``shots``, ``seed`` and, where known, ``demo_indices``,
    ``test_hash`` (:func:`sc_jax.experiment.protocol.splits.test_set_hash`) and
    ``model_identity`` (from results.json). A file without a record is checked by its
    content instead: every Base / CC / DC row of ``expect["rows"]`` (results.json's
    :class:`~sc_jax.experiment.evaluation.results.ResultRow` of this dataset, k and seed)
    recomputed from it, to 1e-9 (the run computed them in float64 from the same float32
    scores)."""
    want = f"{expect['dataset']} k={expect['shots']} seed {expect['seed']}"
    redo = ("rerun the `sc-jax run` command of results.json with the same --out to rewrite "
            "it from the score cache")
    if meta is None:
        problem = _legacy_problem(s, expect)
        if problem:
            raise ValueError(f"{path} does not record what it holds (written before score files "
                             f"did) and {problem}, so it may hold another seed's or run's scores "
                             f"than results.json's {want}: {redo}")
        return
    got = dict(meta)
    got["test_hash"] = test_set_hash(meta.get("test_indices", []))
    for key, name in (*_HELD, ("test_hash", "test set")):
        if key in expect and expect[key] is not None and got.get(key) != expect[key]:
            shown = f"{_short(got.get(key))} here, {_short(expect[key])} in results.json"
            raise ValueError(f"{path} holds the scores of {meta.get('dataset')} "
                             f"k={meta.get('shots')} seed {meta.get('seed')}, not results.json's "
                             f"{want} (its {name}: {shown}): {redo}")
    if len(meta.get("test_indices", [])) != len(s.y_test):
        raise ValueError(f"{path} names {len(meta.get('test_indices', []))} test rows and holds "
                         f"scores of {len(s.y_test)}: {redo}")


def _short(value) -> str:
    text = str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _legacy_problem(s: SeedScores, expect: dict) -> str | None:
    """Why scores without a record cannot be taken for ``expect``'s, or None: its
    Base / CC / DC rows must be in results.json and be reproduced from them."""
    rows = [r for r in expect.get("rows", ()) if r.method in _LEGACY_METHODS]
    if not rows:
        return "results.json has no Base, CC or DC row of it to check its scores against"
    n = s.base.shape[-1]
    for r in rows:
        p = method_probs(r.method, s, None, [])
        got = dict(accuracy=metrics.accuracy(s.y_test, p.argmax(-1)),
                   macro_f1=metrics.macro_f1(s.y_test, p.argmax(-1), num_classes=n),
                   ece=metrics.expected_calibration_error(p, s.y_test))
        for key in METRICS:
            if not abs(got[key] - r.metric(key)) <= 1e-9:
                return (f"its {r.method} {key} {got[key]:.6f} is not results.json's "
                        f"{r.metric(key):.6f}")
    return None


def load_run_scores(run_dir: Path) -> tuple[RunResults, dict]:
    """A finished run's results.json (:func:`sc_jax.experiment.evaluation.results.load_results`)
    and its saved scores, ``{(dataset, k): {seed: SeedScores}}`` for every (dataset, k) it did not
    skip. Raises FileNotFoundError naming the score files missing (and how to write
    them), ValueError when the run has no (dataset, k) at all."""
    results = load_results(run_dir)
    skipped = {(x.dataset, x.shots) for x in results.skipped}
    runs, missing = {}, []
    tag = config_tag(results.config)
    splits = {(x.dataset, x.shots, x.seed): x for x in results.splits}
    for name in results.datasets:
        for k in results.shots:
            if (name, k) in skipped:
                continue
            for seed in results.seeds:
                path = scores_path(run_dir, name, k, seed)
                if path.exists():
                    split = splits.get((name, k, seed))
                    expect = dict(dataset=name, shots=k, seed=seed,
                                  rows=results.rows_of(name, k, seed),
                                  demo_indices=None if split is None else split.demo_indices,
                                  test_hash=None if split is None else split.test_hash,
                                  model_identity=results.model_identity)
                    runs.setdefault((name, k), {})[seed] = load_scores(path, tag, expect)
                else:
                    missing.append(path.name)
    if missing:
        raise FileNotFoundError(
            f"{run_dir}: no saved scores for {len(missing)} (dataset, k, seed) "
            f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}). Runs made "
            "before scores were saved can write them: run the same `sc-jax run` command "
            "again with the same --out (every score is read from its cache, no forward "
            "pass).")
    if not runs:
        raise ValueError(f"{run_dir}: the run has no (dataset, k) to ablate")
    return results, runs



def check_output_file(path, option: str, ours=None, command: str = "", sign: str = "") -> Path:
    """A file a command will write at its end (``option`` names it in the message):
    refused now, as a ValueError, when it is a directory, lies under a file, or its
    directory cannot be created or written, so no work is lost to a bad path.

    ``ours``: given, a test of an existing file (``ours(path) -> bool``) that tells a
    file sc-jax ``command`` wrote (replaced freely: a rerun) from a user's (refused,
    ``sign`` saying how ours are recognised; the caller skips the check on --overwrite)."""
    out = Path(path)
    if str(path) == "" or out.is_dir():
        raise ValueError(f"{option} {str(path)!r} is a directory (or empty), not a file: name a file")
    make_out_dir(out.parent, option)
    if ours is not None and out.exists() and not ours(out):
        raise ValueError(f"{option} {out} exists and no sc-jax {command} wrote it ({sign}): rerun "
                         f"with --overwrite to replace it, or choose another {option}")
    return out


def refuse_foreign_outputs(out: Path, names, ours: bool, *, command: str, sign: str,
                           option: str = "--out") -> None:
    """A ValueError when directory ``out`` holds any of ``names`` (the files ``command``
    writes there) and ``ours`` is False: sc-jax did not write them (``sign``: what
    would have marked them as its own), so they are a user's, and are not replaced
    without --overwrite (the caller skips this check then). Every command that writes
    into a directory (``run --out``, ``ablate --out``) refuses through this one test."""
    if ours:
        return
    theirs = sorted(name for name in names if (out / name).exists())
    if theirs:
        raise ValueError(f"{option} {out} holds {', '.join(theirs)}, which this {command} would "
                         f"replace, and no sc-jax {command} wrote them ({sign}): rerun with "
                         f"--overwrite to replace them, or choose another {option}")


def make_out_dir(path, option: str = "--out") -> Path:
    """Create the output directory ``path`` (and its parents) and return it; a
    ValueError naming ``path`` (``--out``) when it is a file, lies under a file, or
    cannot be created or written."""
    if str(path) == "":  # Path("") is the current directory: a typo, not a choice
        raise ValueError(f"{option} is empty: name a directory (e.g. {option} runs/default)")
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{option} {out} is an existing file, not a directory: choose a directory")
    parent = out
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{option} {out} lies under {parent}, which is a file, not a directory")
    try:
        probe_writable(out)
    except OSError as e:
        where = f"{parent} does not accept new files" if parent != out else f"{out} is not writable"
        raise ValueError(f"{option} {out}: {where} ({e.strerror or e}); choose a writable "
                         "directory") from e
    return out


def probe_writable(directory: Path) -> None:
    """Create ``directory`` (and its parents) and write and remove a file in it: an
    OSError where it cannot. A directory can exist and still refuse files (read-only
    mounts, permissions), which only a write shows."""
    directory.mkdir(parents=True, exist_ok=True)
    probe = directory / f".write-test-{os.getpid()}"
    probe.write_bytes(b"")
    probe.unlink()


def package_versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0], "platform": platform.platform()}
    for pkg in ("sc-jax", "jax", "jaxlib", "flax", "jaxopt", "numpy", "scipy", "tokenizers",
                "safetensors", "gguf"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


#: What a run writes into --out besides run_config.json and results.json (and cache/).
RUN_OUTPUTS = ("results.csv", "results.tex", "results_accuracy.tex", "results_ece.tex",
               "table.md", "f1_bars.png", "f1_bars.pdf", "f1_bars.svg", "sc_params.png",
               "sc_params.pdf", "sc_params.svg", "reliability.png", "reliability.pdf",
               "reliability.svg", "samples.jsonl", "samples.jsonl.gz", "scores")


RUN_CONFIG_FILE = "run_config.json"
#: Beside it: the run's task files' tasks by content (:func:`sc_jax.experiment.protocol.jobs.task_file_records`).
RUN_TASKS_FILE = "run_tasks.json"


# Methods that runs made before them lack in their run_config.json and
# results.json: resuming such a run with the default --methods only adds them.
def added_methods() -> tuple[str, ...]:
    """The registered methods marked ``added`` (:class:`sc_jax.calibration.methods.Method`)."""
    return tuple(m.name for m in calibration_methods.registered() if m.added)


ADDED_METHODS = added_methods()


def _config_differences(old: dict, new: dict) -> list[str]:
    """``key: old there, new here`` for every key of two RunConfig JSONs that differs;
    a key one of them lacks (written by another version) counts as its default. A run
    whose methods lack only :func:`added_methods` of the new ones is no other run:
    methods do not change any score, every old row is recomputed as it was, and the
    added methods' rows join them (so a run started before them resumes)."""
    default = json.loads(json.dumps(RunConfig().to_json()))
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key, default.get(key)), new.get(key, default.get(key))
        if key == "methods" and isinstance(a, list) and isinstance(b, list):
            added = added_methods()
            a = [m for m in a if m not in added]
            b = [m for m in b if m not in added]
        if a != b:
            out.append(f"{key}: {a} there, {b} here")
    return out


def recorded_tasks(out: Path) -> dict | None:
    """name -> what the run in ``out`` recorded of its tasks' content: run_tasks.json,
    else (a run that predates it) results.json's ``tasks`` (fewer fields); None where
    neither is there."""
    for name, key in ((RUN_TASKS_FILE, None), ("results.json", "tasks")):
        try:
            data = json.loads((out / name).read_text())
            data = data if key is None else data.get(key)
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(data, dict) and data:
            return data
    return None


def task_difference(recorded: dict, records: dict) -> tuple[str, str, str] | None:
    """``(task file, task name, what differs)`` for the first task of ``records`` (by
    name, :func:`sc_jax.experiment.protocol.jobs.task_file_records`) whose content is not what
    ``recorded`` (:func:`recorded_tasks`) holds of it, compared on the fields both
    have; None where every one is the same."""
    for name, record in records.items():
        was = recorded.get(name)
        if not isinstance(was, dict):
            continue  # a task new to the run: its name is among the config's differences
        changed = [k for k in record if k in was and k not in ("file", "resolved") and record[k] != was[k]]
        if changed:
            key = changed[0]
            what = (f"its rows differ (data sha256 {str(was[key])[:12]}... there, {record[key][:12]}... here)"
                    if key == "data_sha256" else f"field {key!r} differs ({was[key]!r} there, {record[key]!r} here)")
            more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
            return record["file"], name, what + more
    return None


def refuse_other_config(out: Path, config: RunConfig, task_records=None) -> None:
    """A ValueError when ``out`` holds (or was last started with) another run
    configuration: the tables, plots and scores/ would be replaced without a word.

    Task files are compared by content, not by path: ``task_records()`` gives the
    new run's (:func:`sc_jax.experiment.protocol.jobs.task_file_records`, called only where
    the run in ``out`` recorded its own), so the same task read from another working
    directory or a copy of its file resumes, and other content at the same path is
    refused. A run that recorded none (made before run_tasks.json) compares paths."""
    new = json.loads(json.dumps(config.to_json()))  # tuples as JSON lists
    if not any((out / name).exists() for name in (RUN_CONFIG_FILE, "results.json")):
        # No run of ours was here: files by the names a run writes are someone else's.
        refuse_foreign_outputs(out, RUN_OUTPUTS, False, command="run", sign="no run_config.json")
        return
    for name in (RUN_CONFIG_FILE, "results.json"):
        path = out / name
        if not path.exists():
            continue
        try:
            old = json.loads(path.read_text())
            old = old["config"] if name == "results.json" else old
            if not isinstance(old, dict):  # `[]` would compare as a default configuration
                raise TypeError(f"a JSON {type(old).__name__}, not a configuration")
        except (OSError, ValueError, KeyError, TypeError):
            raise ValueError(f"--out {out} holds an unreadable {name}; rerun with --overwrite "
                             "to replace it, or choose another --out") from None
        diff = _config_differences(old, new)
        recorded = recorded_tasks(out) if task_records and old.get("task_files") and new["task_files"] else None
        if recorded is not None:
            diff = [d for d in diff if not d.startswith("task_files:")]
        if diff:
            raise ValueError(f"--out {out} holds a run with another configuration "
                             f"({'; '.join(diff[:3])}{'; ...' if len(diff) > 3 else ''}): rerun "
                             "with --overwrite to replace its results (the score cache is kept "
                             "and reused), or choose another --out")
        differs = None if recorded is None else task_difference(recorded, task_records())
        if differs:
            file, task, what = differs
            raise ValueError(f"task file {file} is not the task {task!r} the run in --out {out} read: {what}; "
                             "rerun with --overwrite to replace its results, or choose another --out")
        return
