"""Rooms stay small (style guide rule 11), read from the source with ``ast`` and
``tokenize`` (nothing is imported or run):

* no function or method in ``sc_jax/`` or ``benchmarks/`` has more than
  :data:`MAX_FUNCTION_LINES` (70) code lines. A code line is a line from the ``def`` to
  the function's last line that holds code: blank lines and lines holding only a comment
  do not count, nor does the docstring; a line inside a multi-line string or expression
  does. A nested function's lines count in the function that holds it as well.
* no module in ``sc_jax/`` has more than :data:`MAX_MODULE_LINES` (600) lines, all of
  them counted (as ``wc -l`` does).
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_FUNCTION_LINES = 70
MAX_MODULE_LINES = 600
_NOT_CODE = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
             tokenize.ENDMARKER}


def _code_lines(source: str) -> set[int]:
    """Numbers of the lines that hold a token other than a comment or a line break."""
    lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in _NOT_CODE:
            lines.update(range(tok.start[0], tok.end[0] + 1))
    return lines


def function_lengths(source: str, name: str = "<source>") -> list[tuple[int, str, int]]:
    """(code lines, qualified name, line of the ``def``) of every function in ``source``."""
    tree = ast.parse(source, name)
    code = _code_lines(source)
    out = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                span = set(range(child.lineno, child.end_lineno + 1))
                body = child.body[0]
                if (isinstance(body, ast.Expr) and isinstance(body.value, ast.Constant)
                        and isinstance(body.value.value, str)):
                    span -= set(range(body.lineno, body.end_lineno + 1))
                out.append((len(span & code), prefix + child.name, child.lineno))
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def _sources(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def test_no_function_over_the_limit():
    files = _sources("sc_jax", "benchmarks")
    assert len(files) > 100 and ROOT / "benchmarks" / "bench_solver.py" in files
    long = [f"{path.relative_to(ROOT)}:{line} {name}: {n} code lines"
            for path in files for n, name, line in function_lengths(path.read_text(), str(path))
            if n > MAX_FUNCTION_LINES]
    assert not long, (f"functions over {MAX_FUNCTION_LINES} code lines (split them by job):\n"
                      + "\n".join(long))


def test_no_module_over_the_limit():
    sizes = {path: len(path.read_text().splitlines()) for path in _sources("sc_jax")}
    assert len(sizes) > 50
    big = [f"{path.relative_to(ROOT)}: {n} lines" for path, n in sorted(sizes.items())
           if n > MAX_MODULE_LINES]
    assert not big, f"modules over {MAX_MODULE_LINES} lines (split them by reason to change):\n" + "\n".join(big)


def test_the_count_skips_blanks_comments_and_the_docstring():
    # f: its def, the call's two lines (not the blank between them), return y, and its
    # nested g's two lines, which count in g as well; docstring, comments and blanks not.
    source = '''
class A:
    def f(self, x):
        """A docstring
        of three lines.
        """
        # a comment

        y = max(x,

                1)  # a trailing comment
        def g():
            return 1
        return y
'''
    assert function_lengths(source) == [(6, "A.f", 3), (2, "A.f.g", 12)]
    long_one = "def h():\n" + "    x = 1\n" * MAX_FUNCTION_LINES
    assert function_lengths(long_one) == [(MAX_FUNCTION_LINES + 1, "h", 1)]
