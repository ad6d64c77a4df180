"""ScoringEngine is what it was built as: its settings are fixed in ``__init__``, and a
call changes nothing but the caches ``__init__`` names."""

import ast
import dataclasses
import inspect

import numpy as np
import pytest

import sc_jax
from sc_jax.scoring import engine as engine_mod
from sc_jax.scoring.engine import ScoringEngine
from sc_jax.scoring.enumeration import all_contexts, surrogate_pairs
from sc_jax.scoring.prompts import Template, build_pieces
from sc_jax.scoring.results import ScoreResult

#: What a call may fill (never reassign): created in __init__, documented there as caches.
CACHES = {"_attention", "_scored"}


def _self_attribute_writes(fn: ast.FunctionDef) -> list[str]:
    """Attributes of ``self`` a method assigns: ``self.x = ``, ``self.x += ``,
    ``self.x: T = ``, ``setattr(self, ...)`` and ``del self.x``."""
    out = []
    for node in ast.walk(fn):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("setattr", "delattr") and node.args
              and isinstance(node.args[0], ast.Name) and node.args[0].id == "self"):
            out.append(f"{node.func.id}(self, ...) at line {node.lineno}")
        for t in targets:
            for sub in ast.walk(t):
                if (isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name)
                        and sub.value.id == "self" and isinstance(sub.ctx, (ast.Store, ast.Del))):
                    out.append(f"self.{sub.attr} at line {sub.lineno}")
    return out


def test_no_method_assigns_an_attribute_outside_init():
    tree = ast.parse(inspect.getsource(engine_mod))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ScoringEngine")
    methods = [n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    assert len(methods) > 5
    bad = {m.name: w for m in methods if m.name != "__init__" and (w := _self_attribute_writes(m))}
    assert not bad, f"ScoringEngine methods assign attributes outside __init__: {bad}"
    init = next(m for m in methods if m.name == "__init__")
    assert CACHES <= {w.split()[0][len("self."):] for w in _self_attribute_writes(init)}


def test_the_check_sees_an_assignment():
    src = "def f(self):\n    self.stats = 1\n    setattr(self, 'x', 2)\n    self.n += 1\n"
    assert len(_self_attribute_writes(ast.parse(src).body[0])) == 3


def test_scoring_changes_no_setting():
    """plan() and score_jobs() leave every attribute the same object (the caches
    filled, not replaced), and score_jobs returns scores, stats and the plan."""
    model = sc_jax.load_model("random:tiny-llama", seed=1)
    texts = ["good film", "bad plot", "fine acting", "dull story", "great fun"]
    pieces = build_pieces(model.tokenizer, Template("review:", "sentiment:", ("neg", "pos")),
                          [(t, i % 2) for i, t in enumerate(texts[:3])], texts)
    ctx = all_contexts(3, 1)
    pairs = surrogate_pairs(ctx, 3)
    eng = ScoringEngine(model, attention="dense", progress=False)
    before = dict(vars(eng))
    planned = eng.plan(pieces, [(ctx, pairs)], "first_token")
    result = eng.score_jobs(pieces, {"a": (ctx, pairs), "empty": (ctx, pairs[:0])})
    after = vars(eng)
    assert after.keys() == before.keys()
    assert all(after[key] is before[key] for key in before), \
        [key for key in before if after[key] is not before[key]]
    assert isinstance(result, ScoreResult) and list(result.scores) == ["a", "empty"]
    assert result.scores["a"].shape == (len(pairs), 2) and result.scores["empty"].shape == (0, 2)
    assert result.stats.calls > 0 and result.stats.attention == "dense"
    assert result.plan.schedule.shape == result.stats.shape == planned.schedule.shape
    again = eng.score_jobs(pieces, {"a": (ctx, pairs)})
    assert again.stats is not result.stats and result.stats.calls > 0
    # A call's stats are made once, as it ends, and stay what they were.
    assert again.stats.calls == result.stats.calls and again.stats.tokens == result.stats.tokens
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.stats.calls = 0
    assert not any(isinstance(v, list) for v in vars(eng).values())  # no list as a mutable cell
    np.testing.assert_allclose(again.scores["a"], result.scores["a"], atol=1e-6)
