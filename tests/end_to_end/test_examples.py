"""The README's three examples are the scripts in examples/, and they run.

The README's Python blocks, in order, must be the scripts' code: each script is its
block after a docstring and, for a script that continues another, one ``from exN_...
import ...`` line (what a reader gets by pasting the blocks into one session). The
scripts run in one process, as a reader runs them one after another: example 2 imports
example 1, then example 3.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
SCRIPTS = ["ex1_scores.py", "ex2_calibrate_jit.py", "ex3_run_experiment.py"]


def readme_python_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(r"^```python\n(.*?)^```", text, re.M | re.S)


def script_block(name: str) -> str:
    """The script's code after its docstring and its import of an earlier example."""
    text = (EXAMPLES / name).read_text(encoding="utf-8")
    body = ast.parse(text).body
    i = 0
    while i < len(body) and (
            isinstance(body[i], ast.Expr) and isinstance(body[i].value, ast.Constant)
            or isinstance(body[i], ast.ImportFrom) and (body[i].module or "").startswith("ex")):
        i += 1
    return "".join(text.splitlines(keepends=True)[body[i].lineno - 1:])


def test_readme_blocks_are_the_examples():
    blocks = readme_python_blocks()
    assert len(blocks) == len(SCRIPTS), \
        f"README has {len(blocks)} Python blocks, examples/ {len(SCRIPTS)} scripts"
    for block, name in zip(blocks, SCRIPTS):
        assert block == script_block(name), f"README block differs from examples/{name}"


def test_examples_run(tmp_path):
    """Examples 1 and 2 (scores from the default model, SC fitted in jit) and 3
    (run_experiment at toy settings), in one process as a reader runs them."""
    env = dict(os.environ)
    # As a user runs them, without the suite's compile settings (tests/conftest.py):
    # its lower LLVM level makes the default model's forward passes several times
    # slower than the compiles it saves.
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(
        ("--xla_backend_optimization_level", "--xla_cpu_use_fusion_emitters")))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + env.get("PYTHONPATH", "").split(os.pathsep))
    code = ("import runpy, sys; sys.path.insert(0, sys.argv[1]); "
            "runpy.run_path(sys.argv[1] + '/ex2_calibrate_jit.py', run_name='__main__'); "
            "runpy.run_path(sys.argv[1] + '/ex3_run_experiment.py', run_name='__main__')")
    out = subprocess.run([sys.executable, "-c", code, str(EXAMPLES)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0] == "surrogate rows (24, 2) test rows (24, 2)", out.stdout
    assert lines[1].startswith("CONVERGED"), out.stdout
    methods = [line.split()[0] for line in lines if "macro-F1" in line]
    assert methods == ["base", "bc", "sc"], out.stdout
    assert (tmp_path / "runs" / "example" / "table.md").exists()
