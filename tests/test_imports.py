"""The package's import graph, read from the source (style guide rules 12 and 15): no
circle between modules; the stages, and the experiment's sub-packages, import only
earlier ones; imports at the top of their module, a function-local import being for an
optional extra and saying why.

The graph is built with ``ast`` from every ``sc_jax/**/*.py``, subpackages included,
and counts imports inside functions too (a circle closed by a function-local import
is still a circle: it only waits for the first call to bite).
"""

from __future__ import annotations

import ast
import io
import os
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import sc_jax

PACKAGE = "sc_jax"
ROOT = Path(sc_jax.__file__).resolve().parent

# Packages a function may import, and why they are not imported at the top. Such an
# import says why in a comment on its line or the line above (a bare ``noqa`` does not).
ALLOWED_LOCAL = {
    "jaxopt": "importing it prints a deprecation warning; only the projected solver needs it",
    "scipy": "the float64 reference solver alone needs it, and it is slow to import",
    "gguf": "optional extra [gguf]",
    "transformers": "optional extra [gguf] (its GGUF tokenizer conversion)",
    "sc_jax.models.gguf": "needs the optional extra [gguf]: importing it raises without it",
    "datasets": "optional extra [data]",
    "pyarrow": "optional extra [data]",
    "torch": "optional extra [test]",
    "yaml": "pyyaml, for YAML task files only (JSON task files need nothing)",
    "jinja2": "--chat-template only (installed with transformers, the [gguf] extra)",
    "sc_jax.cli": "sc_jax.entry imports the command inside main, so that Ctrl-C during its "
                  "imports is caught",
    "matplotlib": "plotting only",
}


def _module_names(root: Path, package: str) -> dict[str, list[Path]]:
    """Module name -> its source file(s). A module ``x.py`` beside a package ``x/``
    (one replacing the other) share the name ``package.x``."""
    out: dict[str, list[Path]] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out.setdefault(".".join([package, *parts]), []).append(path)
    return out


def _imports(tree: ast.AST, name: str, is_package: bool):
    """(node, dotted targets) of every import statement in ``tree``: ``import a.b``
    gives ``a.b``, ``from a import b`` gives ``a.b`` (:func:`_resolve` keeps the
    longest module), relative imports are resolved against module ``name``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield node, [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if is_package else name.split(".")[:-1]
                pkg = pkg[:len(pkg) - node.level + 1]
                base = ".".join(pkg + ([base] if base else []))
            yield node, [f"{base}.{alias.name}" if base else alias.name for alias in node.names]


def _resolve(target: str, modules) -> str | None:
    """The longest known module that ``target`` names or lies in, else None."""
    while target:
        if target in modules:
            return target
        target = target.rpartition(".")[0]
    return None


def _function_of(tree: ast.AST) -> dict[ast.AST, str]:
    """Import node -> name of the function that holds it (module-level ones absent)."""
    out = {}

    def visit(node, fn):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)) and fn:
                out[child] = fn
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else fn
            visit(child, inner)

    visit(tree, None)
    return out


def _says_why(comment: str) -> bool:
    """A comment with words besides a ``noqa`` directive."""
    return bool(re.search(r"\w", re.sub(r"noqa(:\s*[A-Z]+[0-9]+(,\s*[A-Z]+[0-9]+)*)?", "", comment)))


def import_graph(root: Path = ROOT, package: str = PACKAGE):
    """``(graph, local)``: module -> the package's modules it imports (anywhere in
    its source), and every function-local import statement as (module, function,
    line, [modules it names], whether it carries a comment)."""
    modules = _module_names(root, package)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    local = []
    for name, paths in modules.items():
        for path in paths:
            source = path.read_text()
            tree = ast.parse(source, str(path))
            holder = _function_of(tree)
            comments = {tok.start[0]: tok.string for tok in
                        tokenize.generate_tokens(io.StringIO(source).readline)
                        if tok.type == tokenize.COMMENT and _says_why(tok.string)}
            lines = source.splitlines()
            for node, targets in _imports(tree, name, path.name == "__init__.py"):
                ours = {_resolve(t, modules) for t in targets if t.split(".")[0] == package}
                graph[name] |= ours - {None, name}
                if node in holder:
                    named = sorted(ours - {None}) or [
                        node.module if isinstance(node, ast.ImportFrom) else t for t in targets]
                    above = node.lineno - 1
                    commented = any(n in comments for n in range(node.lineno, node.end_lineno + 1)) \
                        or (above in comments and lines[above - 1].lstrip().startswith("#"))
                    local.append((name, holder[node], node.lineno, sorted(set(named)), commented))
    return graph, local


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle ``[a, b, ..., a]`` per strongly connected group of modules (Tarjan)."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def connect(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return [_circle(graph, group) for group in groups]


def _circle(graph, group: set[str]) -> list[str]:
    """A shortest circle through the first module of ``group`` (breadth first)."""
    start = min(group)
    prev = {start: None}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & group):
                if w == start:
                    path = [v]
                    while prev[path[-1]] is not None:
                        path.append(prev[path[-1]])
                    return path[::-1] + [start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError("a strongly connected group without a circle")


#: The stages in the order data flows through them: a token goes from the model
#: (models) through the engine (scoring) into the calibrator (calibration), and the
#: paper's protocol (experiment) drives them all; runtime serves every stage, and the
#: command line (the package sc_jax.cli, sc_jax.entry) and the package's curated namespace sit on top.
STAGES = ("runtime", "models", "scoring", "calibration", "experiment")


def stage_of(module: str, package: str = PACKAGE) -> int:
    """Rank of ``module`` in :data:`STAGES`; modules outside them (the top) rank last."""
    parts = module.split(".")
    if len(parts) > 1 and parts[0] == package and parts[1] in STAGES:
        return STAGES.index(parts[1])
    return len(STAGES)


def backward_imports(graph: dict[str, set[str]], package: str = PACKAGE) -> list[str]:
    """Imports from a later stage into an earlier one, as ``"a imports b (models <- scoring)"``."""
    names = STAGES + ("top",)
    return [f"{a} imports {b} ({names[stage_of(a, package)]} <- {names[stage_of(b, package)]})"
            for a in sorted(graph) for b in sorted(graph[a])
            if stage_of(b, package) > stage_of(a, package)]


#: The experiment's sub-packages in the order their imports run: the tasks (what is
#: scored), the protocol (the configuration and the plan, before any weight is read), the
#: evaluation (each method's fits, the metrics, results.json's records, a run's files),
#: the reporting (tables, figures and refits from a finished run, no model) and the
#: execution (run, demo and the dry run, which take a plan; the run ends by writing the
#: report, so it sits above reporting).
EXPERIMENT_PARTS = ("tasks", "protocol", "evaluation", "reporting", "execution")


def part_of(module: str, package: str = PACKAGE) -> int | None:
    """Rank of ``module`` in :data:`EXPERIMENT_PARTS`; None outside ``package.experiment``,
    and for the package ``package.experiment`` itself (its docstring only)."""
    parts = module.split(".")
    if parts[:2] != [package, "experiment"] or len(parts) < 3:
        return None
    return EXPERIMENT_PARTS.index(parts[2]) if parts[2] in EXPERIMENT_PARTS else len(EXPERIMENT_PARTS)


def backward_experiment_imports(graph: dict[str, set[str]], package: str = PACKAGE) -> list[str]:
    """Imports within the experiment from one of its sub-packages into an earlier one (or
    from a module in none of them), as ``"a imports b (protocol <- reporting)"``."""
    names = EXPERIMENT_PARTS + ("none",)
    out = []
    for a in sorted(graph):
        for b in sorted(graph[a]):
            pa, pb = part_of(a, package), part_of(b, package)
            if pa is not None and pb is not None and (pb > pa or pb == len(EXPERIMENT_PARTS)):
                out.append(f"{a} imports {b} ({names[pa]} <- {names[pb]})")
    return out


def refused_local_imports(local) -> list[str]:
    """Function-local imports that are not of an allowed optional extra, or carry no
    comment saying why."""
    out = []
    for module, fn, line, targets, commented in local:
        extra = [any(t == k or t.startswith(k + ".") for k in ALLOWED_LOCAL) for t in targets]
        if not all(extra) or not commented:
            why = "not an optional extra" if not all(extra) else "no comment saying why"
            out.append(f"{module}.{fn} (line {line}) imports {', '.join(targets)}: {why}")
    return out


def test_no_import_cycle():
    graph, _ = import_graph()
    assert len(graph) > 20 and "sc_jax.scoring.engine" in graph["sc_jax.experiment.execution.run"]
    cycles = find_cycles(graph)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_no_import_from_a_later_stage_into_an_earlier_one():
    graph, _ = import_graph()
    # Every module of the package lies in one stage or on top, and every stage is used.
    ranks = {stage_of(m) for m in graph}
    assert ranks == set(range(len(STAGES) + 1)), ranks
    assert {m for m in graph if stage_of(m) == len(STAGES)} == {
        "sc_jax", "sc_jax.cli", "sc_jax.cli.__main__", "sc_jax.cli.commands", "sc_jax.cli.parser",
        "sc_jax.cli.process", "sc_jax.entry"}
    backward = backward_imports(graph)
    assert not backward, "imports against the data flow:\n" + "\n".join(backward)
    # The check itself finds an import against the flow, and lets one with it through.
    fake = {"sc_jax.models.a": {"sc_jax.scoring.b", "sc_jax.runtime.c"}, "sc_jax.scoring.b": set(),
            "sc_jax.runtime.c": set(), "sc_jax.cli": {"sc_jax.models.a"}}
    assert backward_imports(fake) == ["sc_jax.models.a imports sc_jax.scoring.b (models <- scoring)"]


def test_the_experiment_sub_packages_import_only_earlier_ones():
    graph, _ = import_graph()
    experiment = {m for m in graph if m.startswith(PACKAGE + ".experiment")}
    # Every module of the experiment lies in one of its sub-packages, and each is used.
    assert {m for m in experiment if part_of(m) is None} == {"sc_jax.experiment"}
    assert {part_of(m) for m in experiment} - {None} == set(range(len(EXPERIMENT_PARTS)))
    # The package and its sub-packages are docstrings: importing one loads no module.
    for m in ["sc_jax.experiment", *(f"sc_jax.experiment.{p}" for p in EXPERIMENT_PARTS)]:
        assert graph[m] == set(), (m, graph[m])
    backward = backward_experiment_imports(graph)
    assert not backward, "imports against the experiment's order:\n" + "\n".join(backward)
    inside = {a: graph[a] & experiment for a in experiment}
    assert not find_cycles(inside)
    # The check finds an import into an earlier sub-package, and one from a module in none
    # of them, and lets an import from an earlier one and one inside the same through.
    fake = {"sc_jax.experiment.protocol.a": {"sc_jax.experiment.reporting.b",
                                             "sc_jax.experiment.tasks.c",
                                             "sc_jax.experiment.protocol.d"},
            "sc_jax.experiment.execution.e": {"sc_jax.experiment.stray", "sc_jax.models.m"},
            "sc_jax.cli": {"sc_jax.experiment.execution.e"}}
    assert backward_experiment_imports(fake) == [
        "sc_jax.experiment.execution.e imports sc_jax.experiment.stray (execution <- none)",
        "sc_jax.experiment.protocol.a imports sc_jax.experiment.reporting.b (protocol <- reporting)"]


def test_function_local_imports_are_optional_extras_only():
    _, local = import_graph()
    refused = refused_local_imports(local)
    assert not refused, "imports to move to the top of their module:\n" + "\n".join(refused)


def test_the_checks_catch_a_cycle_and_a_local_import(tmp_path):
    # A package where a -> b at the top and b -> a inside a function (relative), and a
    # subpackage's module that imports a inside a function (relative, two levels up):
    # the cycle, both function-local imports of the package and the allowed extra
    # with a bare noqa must be found, the commented import of an extra let through.
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg import b\nimport numpy\n")
    (pkg / "b.py").write_text("def f():\n    from . import a\n    return a\n")
    (pkg / "sub" / "__init__.py").write_text("from .c import x\n")
    (pkg / "sub" / "c.py").write_text(
        "x = 1\n\ndef g():\n    import scipy  # slow to import\n    from ..a import numpy\n"
        "    import jaxopt  # noqa: PLC0415\n")
    graph, local = import_graph(pkg, "pkg")
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.a"}
    assert graph["pkg.sub"] == {"pkg.sub.c"} and graph["pkg.sub.c"] == {"pkg.a"}
    assert find_cycles(graph) == [["pkg.a", "pkg.b", "pkg.a"]]
    refused = refused_local_imports(local)
    assert len(refused) == 3 and "pkg.b.f (line 2) imports pkg.a: not an" in refused[0]
    assert "pkg.sub.c.g (line 5) imports pkg.a: not an" in refused[1]
    assert "pkg.sub.c.g (line 6) imports jaxopt: no comment saying why" in refused[2]


# ---------------------------------------------------------------------------------
# The public namespace: ``sc_jax.__all__``, the lazy table that loads each name on first
# use, and the ``TYPE_CHECKING`` imports that show the names to IDEs and type checkers,
# declared three times in sc_jax/__init__.py and held equal here.


def type_checking_imports(path: Path) -> dict[str, str]:
    """name -> module of every ``from module import name`` under a top-level
    ``if TYPE_CHECKING:`` of ``path``."""
    out = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) \
                and node.test.id == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom), ast.dump(imp)
                out.update({alias.asname or alias.name: imp.module for alias in imp.names})
    return out


def test_public_names_are_the_same_in_all_the_lazy_table_and_for_type_checkers():
    names = sc_jax.__all__
    assert len(set(names)) == len(names) and "SolverOptions" in names and "log_odds" in names
    assert set(names) == set(sc_jax._LAZY)
    assert type_checking_imports(ROOT / "__init__.py") == sc_jax._LAZY
    assert set(names) <= set(dir(sc_jax))
    for name in names:
        obj = getattr(sc_jax, name)
        # Defined where the table says, not re-exported from elsewhere.
        assert obj.__module__ == sc_jax._LAZY[name], (name, obj.__module__)
    star = {}
    exec("from sc_jax import *", star)  # noqa: S102
    assert set(star) - {"__builtins__"} == set(names)


def test_import_sc_jax_loads_no_jax():
    code = "import sys, sc_jax; print(sorted(m for m in ('jax', 'flax') if m in sys.modules))"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT.parent),
                                                       os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=True, cwd=ROOT.parent)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_string_options_are_typed_with_the_values_they_accept():
    """The ``Literal`` types of the calibration API's string options name exactly the
    values its checks accept (one declaration each: the tuples are read off the types)."""
    import typing

    from sc_jax.calibration import numpy_fit, numpy_predict
    from sc_jax.calibration.solvers import METHODS, batching

    def choices(fn, arg):
        hint = typing.get_type_hints(fn)[arg]
        parts = [hint, *typing.get_args(hint)]
        return {a for part in parts if typing.get_origin(part) is typing.Literal
                for a in typing.get_args(part)}

    assert choices(sc_jax.calibrate, "solver") == {"augmented_lagrangian"}
    assert choices(sc_jax.calibrate, "dtype") == {"float32", "float64"}
    for fn in (sc_jax.fit, sc_jax.fit_batch):
        assert choices(fn, "solver") == set(METHODS) == {"augmented_lagrangian", "projected", "scipy"}
        assert choices(fn, "device") == set(batching.DEVICES) == {"auto", "cpu", "default"}
        assert choices(fn, "dtype") == {"float32", "float64"}
    assert choices(sc_jax.fit_batch, "guard") == set(numpy_fit.GUARDS) == {"none", "bias_only",
                                                                            "bias_only_free"}
    assert choices(sc_jax.predict_proba, "size_weights") == {"uniform", "reference"}
    assert choices(numpy_predict.FitResult, "solver") == set(METHODS)
