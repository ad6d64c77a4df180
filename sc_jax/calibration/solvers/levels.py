"""The rows the augmented-Lagrangian loop evaluates f on, by coarse level: fixed random
subsamples of the rows first, smallest first, then all rows
(:class:`.types.SolverOptions` ``coarse_rows``; level ``levels`` is all rows).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import numpy as np

from sc_jax.calibration.objective import Problem, design, value_grad_hess

Array = jax.Array

__all__ = ["Rows", "coarse_subsample", "level_designs", "level_evaluator"]


class Rows(NamedTuple):
    """``evaluate(x, level)`` gives f, its gradient and Hessian at the full (b, w) on
    the rows of level ``level`` (subsamples first, ``levels`` = all rows);
    ``value(x)`` f on all rows; ``has_rows`` whether any row is real (a batch filler
    has none). A Python int ``levels`` is known at trace time; the solver of many
    buckets in one loop (:func:`.batching.solve_slots`) passes the instance's own as
    a traced int."""

    evaluate: Callable
    value: Callable
    levels: int | Array
    has_rows: Array


def coarse_subsample(num_rows: int, size: int) -> np.ndarray:
    """The rows of a subsample level (:class:`.types.SolverOptions` ``coarse_rows``):
    ``size`` of ``num_rows`` drawn without replacement by a fixed generator, sorted.
    A function of the two sizes alone (static under jit); random rather than
    strided, so that no period of the rows' order (contexts enumerated per query)
    aliases with it. Padded rows drawn stay masked."""
    rng = np.random.default_rng(num_rows)
    return np.sort(rng.choice(num_rows, size, replace=False))


def level_designs(problem: Problem, sizes: list) -> list:
    """The :class:`sc_jax.calibration.objective.Design` of each level of one unbatched
    problem: its fixed random subsample of each size in ``sizes`` (:func:`coarse_subsample`), then all rows."""
    num_rows = problem.features.shape[0]
    return [design(jax.tree.map(lambda a, r=coarse_subsample(num_rows, m): a[r], problem))
            for m in sizes] + [design(problem)]


def level_evaluator(designs: list, lambda_inv) -> Callable:
    """``evaluate(x, level)`` over a problem's level designs (subsamples, then all
    rows): a switch where there are subsamples (on CPU only the branch taken runs)."""
    if len(designs) == 1:
        return lambda x, level: value_grad_hess(x, designs[0], lambda_inv)
    return lambda x, level: jax.lax.switch(
        level, [lambda dd=dd: value_grad_hess(x, dd, lambda_inv) for dd in designs])

