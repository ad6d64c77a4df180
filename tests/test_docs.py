"""The documentation's code is checked, so that it cannot drift from the package.

* Every Python block of a docs/ page runs, the page's blocks one after another in one
  namespace (as a reader pastes them). A block after a line
  ``<!-- check: import-only ... -->`` (it needs a GPU, a real checkpoint, the hub, or
  minutes) is compiled instead, every name it reads must be defined on the page, and
  its ``sc_jax`` imports and ``sc_jax.x.y`` attributes must resolve. The README's Python
  blocks are the examples/ scripts, which tests/end_to_end/test_examples.py runs; here they get
  the import-only checks.
* Every ``sc-jax ...`` command in a shell block is parsed by the command's own argparse
  parser (PARSER below), and a repository file a shell line runs must exist.
* Every ``sc_jax.a.b`` module path (or ``sc_jax/a/b.py`` file) named in README.md or
  docs/ must import, and every relative link must point to a file.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README] + DOCS

# Where the sc-jax command's parser is built: (module, function). The only place to
# update when the command line moves.
PARSER = ("sc_jax.cli.parser", "build_parser")

IMPORT_ONLY = "<!-- check: import-only"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def blocks(page: Path) -> list[tuple[str, str, int, bool]]:
    """(language, code, first line, import-only) of every fenced block of a page."""
    text = page.read_text(encoding="utf-8")
    out = []
    for m in FENCE.finditer(text):
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        line = text.count("\n", 0, m.start()) + 2
        out.append((m.group(1), m.group(2), line, before.strip().startswith(IMPORT_ONLY)))
    return out


def rel(page: Path) -> str:
    return str(page.relative_to(ROOT))


# ---------------------------------------------------------------------------------
# Python blocks

def bound_names(tree: ast.AST) -> set[str]:
    """Every name a block binds anywhere (assignments, imports, defs, arguments, loop
    and comprehension targets)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return names


def resolve(dotted: str) -> None:
    """Import the longest module prefix of ``dotted`` and get the rest as attributes;
    AssertionError naming what is missing."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as e:
            if e.name is not None and not ".".join(parts[:cut]).startswith(e.name):
                raise  # a dependency is missing, not the documented module
            continue
        for attr in parts[cut:]:
            assert hasattr(obj, attr), f"{dotted}: {'.'.join(parts[:cut])} has no {attr!r}"
            obj = getattr(obj, attr)
        return
    raise AssertionError(f"{dotted}: no such module")


def sc_jax_references(tree: ast.AST) -> set[str]:
    """The dotted sc_jax names a block imports or reads (``sc_jax.x.y``, ``from sc_jax.x
    import y``, ``import sc_jax.x``)."""
    refs = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "sc_jax":
            refs.update(f"{node.module}.{a.name}" for a in node.names if a.name != "*")
        elif isinstance(node, ast.Import):
            refs.update(a.name for a in node.names if a.name.split(".")[0] == "sc_jax")
        elif isinstance(node, ast.Attribute):
            chain, cur = [], node
            while isinstance(cur, ast.Attribute):
                chain.append(cur.attr)
                cur = cur.value
            if isinstance(cur, ast.Name) and cur.id == "sc_jax":
                refs.add(".".join(["sc_jax"] + chain[::-1]))
    return refs


def check_import_only(code: str, where: str, defined: set[str]) -> None:
    tree = ast.parse(code, where)
    compile(tree, where, "exec")
    known = defined | bound_names(tree) | set(dir(builtins))
    unknown = sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
                      and isinstance(n.ctx, ast.Load) and n.id not in known})
    assert not unknown, f"{where}: names never defined on the page: {unknown}"
    for ref in sorted(sc_jax_references(tree)):
        resolve(ref)


def python_pages():
    return [p for p in PAGES if any(lang == "python" for lang, *_ in blocks(p))]


@pytest.mark.parametrize("page", python_pages(), ids=rel)
def test_python_blocks(page, tmp_path, monkeypatch):
    """A page's Python blocks, in order, in one namespace (the README's: import-only,
    tests/end_to_end/test_examples.py runs them)."""
    monkeypatch.chdir(tmp_path)  # what a block writes stays in the test's directory
    # A block may register a calibration method (docs/methods.md does): in a copy of the
    # registry, so that the worker's later tests see the built-in methods alone.
    from sc_jax.calibration.methods import protocol

    monkeypatch.setattr(protocol, "_REGISTRY", dict(protocol._REGISTRY))
    namespace: dict = {"__name__": "__main__"}
    defined: set[str] = set()
    for lang, code, line, import_only in blocks(page):
        if lang != "python":
            continue
        where = f"{rel(page)}:{line}"
        if import_only or page == README:
            check_import_only(code, where, defined)
        else:
            exec(compile(code, where, "exec"), namespace)
        defined |= bound_names(ast.parse(code)) | set(namespace)


# ---------------------------------------------------------------------------------
# Shell blocks

def parser():
    module, name = PARSER
    return getattr(importlib.import_module(module), name)()


def shell_commands(code: str) -> list[list[str]]:
    """The commands of a shell block: continuation lines joined, comments dropped,
    split at ``&&``, ``;`` and ``|``, and side-by-side columns (two commands on a line,
    as the multi-host block shows two hosts) kept as one word list."""
    text = code.replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        cmd: list[str] = []
        for w in words:
            if w in ("&&", ";", "|", "||"):
                out.append(cmd)
                cmd = []
            else:
                cmd.append(w)
        out.append(cmd)
    return [c for c in out if c]


def sc_jax_argvs(cmd: list[str]) -> list[list[str]]:
    """The arguments after each ``sc-jax`` word of a command (``srun ... sc-jax run ...``,
    ``.venv/bin/sc-jax run ...``); ``...`` (elided options) dropped."""
    starts = [i for i, w in enumerate(cmd) if Path(w).name == "sc-jax"] + [len(cmd)]
    return [[w for w in cmd[a + 1:b] if w != "..."] for a, b in zip(starts, starts[1:])]


def shell_blocks():
    return [(p, code, line) for p in PAGES for lang, code, line, _ in blocks(p)
            if lang in ("bash", "sh", "shell")]


@pytest.mark.parametrize("page,code,line", shell_blocks(),
                         ids=[f"{rel(p)}:{line}" for p, _, line in shell_blocks()])
def test_shell_blocks(page, code, line):
    argvs = [argv for cmd in shell_commands(code) for argv in sc_jax_argvs(cmd)]
    for cmd in shell_commands(code):
        if "/" in cmd[0] and not cmd[0].startswith((".venv", "/", "~", "$")):
            assert (ROOT / cmd[0]).exists(), f"{rel(page)}:{line}: no {cmd[0]} in the repository"
    for argv in argvs:
        try:
            parser().parse_args(argv)
        except SystemExit as e:
            assert e.code == 0, f"{rel(page)}:{line}: the parser refuses `sc-jax {' '.join(argv)}`"


def test_some_sc_jax_commands_are_checked():
    """The shell checks see the README's main job and the docs' commands (a parsing
    slip here would pass every block without checking one)."""
    argvs = [a for _, code, _ in shell_blocks()
             for cmd in shell_commands(code) for a in sc_jax_argvs(cmd)]
    assert len(argvs) >= 5 and ["run", "--shots", "4"] == argvs[0][:3]


# ---------------------------------------------------------------------------------
# Module paths and links

MODULE_PATH = re.compile(r"\bsc_jax(?:\.[A-Za-z_]\w*)+")
FILE_PATH = re.compile(r"\bsc_jax(?:/[A-Za-z_]\w*)+\.py\b")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_module_paths_resolve():
    """Every sc_jax.a.b named in the prose and code of README.md and docs/ exists (a
    module renamed without its docs fails here, naming page and path)."""
    missing = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        paths = set(MODULE_PATH.findall(text))
        paths |= {m[:-3].replace("/", ".") for m in FILE_PATH.findall(text)}
        for dotted in sorted(paths):
            try:
                resolve(dotted)
            except (AssertionError, ImportError) as e:
                missing.append(f"{rel(page)}: {dotted} ({e})")
    assert not missing, "stale module paths:\n" + "\n".join(missing)


def test_links_and_pages():
    """Relative links point to files, and every docs/ page is linked from the README."""
    broken = []
    for page in PAGES:
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{rel(page)} -> {target}")
    assert not broken, "broken links:\n" + "\n".join(broken)
    readme = README.read_text(encoding="utf-8")
    unlinked = [rel(p) for p in DOCS if f"({rel(p)})" not in readme]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"
