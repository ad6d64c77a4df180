"""The statistics of the reports, computed by SciPy (no model needed).

* Spread over seeds: the sample standard deviation (ddof = 1; :func:`mean_sd`).
* An interval over seeds (of a metric, or of a paired difference such as SC minus a
  baseline on the same seeds): :func:`seed_interval`, from :data:`MIN_INTERVAL_SEEDS`
  (3) seeds; below that none (the reports say "n/a (2 seeds)"). With at least
  :data:`BOOTSTRAP_MIN_SEEDS` seeds it is ``scipy.stats.bootstrap``'s BCa interval of
  the mean; with fewer (a bootstrap of 3 seeds has 10 distinct means), or where BCa is
  undefined, it is the Student t interval ``scipy.stats.t.interval`` with the standard
  error ``scipy.stats.sem``. Each interval carries the name of its method.
* Query by query (two methods on the same test queries): the exact McNemar test per
  seed (``scipy.stats.binomtest`` on the discordant pairs; :func:`mcnemar_exact_p`),
  and one test over seeds that respects the shared test set (:func:`query_signed_rank_p`):
  every seed scores the same queries, so neither the (seed, query) pairs nor the seeds'
  McNemar tests are independent. The query is the unit: per query, the difference of
  the two methods' correctness averaged over seeds, and the Wilcoxon signed-rank test
  (``scipy.stats.wilcoxon``) of those differences against 0.
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from collections.abc import Sequence

import numpy as np
from scipy import stats

__all__ = ["BOOTSTRAP_MIN_SEEDS", "CONFIDENCE", "MIN_INTERVAL_SEEDS", "Interval", "mcnemar_exact_p", "mean_sd",
           "query_signed_rank_p", "seed_interval"]

#: The confidence level of every interval in the reports.
CONFIDENCE = 0.95
#: The fewest seeds for a BCa bootstrap interval; below it the t interval. A bootstrap
#: over n seeds has at most C(2n - 1, n) distinct means (10 for 3 seeds, 126 for 5): its
#: quantiles are those of a handful of values, and BCa's acceleration (a jackknife over
#: the seeds) is as coarse.
BOOTSTRAP_MIN_SEEDS = 10
#: The fewest seeds for any interval over seeds: with two, a t interval has one degree
#: of freedom (t = 12.7) and spans the whole scale; the reports give the s.d. and
#: "n/a (2 seeds)" instead.
MIN_INTERVAL_SEEDS = 3
#: Bootstrap resamples (SciPy's default).
N_RESAMPLES = 9999

T_METHOD = "t"
BCA_METHOD = "BCa bootstrap"


@dataclasses.dataclass(frozen=True)
class Interval:
    """A two-sided interval of a mean and the method that gave it (:data:`T_METHOD` or
    :data:`BCA_METHOD`)."""

    low: float
    high: float
    method: str


def mean_sd(values: Sequence[float]) -> tuple[float, float, int]:
    """``(mean, sd, n)`` of ``values``: sd the sample standard deviation (ddof = 1),
    NaN for a single value (it has no spread)."""
    x = np.asarray(values, np.float64)
    if x.size == 0:
        raise ValueError("mean_sd: no values")
    return float(x.mean()), float(x.std(ddof=1)) if x.size > 1 else float("nan"), int(x.size)


def _rng_kwarg(seed: int) -> dict:
    """SciPy >= 1.15 takes ``rng``; older releases ``random_state`` (same generator)."""
    name = "rng" if "rng" in inspect.signature(stats.bootstrap).parameters else "random_state"
    return {name: np.random.default_rng(seed)}


def t_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """The Student t interval of the mean: mean ± t_{n-1} * sd / sqrt(n)
    (``scipy.stats.t.interval`` with ``scipy.stats.sem``); the point itself when every
    value is equal (SciPy gives NaN at scale 0)."""
    x = np.asarray(values, np.float64)
    mean, sem = float(x.mean()), float(stats.sem(x))
    if sem == 0.0:
        return Interval(mean, mean, T_METHOD)
    low, high = stats.t.interval(confidence, x.size - 1, loc=mean, scale=sem)
    return Interval(float(low), float(high), T_METHOD)


def seed_interval(values: Sequence[float], confidence: float = CONFIDENCE, *, seed: int = 0,
                  n_resamples: int = N_RESAMPLES) -> Interval | None:
    """A ``confidence`` interval of the mean of ``values`` (one per seed; for a paired
    comparison the per-seed differences): BCa bootstrap (``scipy.stats.bootstrap``,
    ``n_resamples`` resamples drawn from ``numpy.random.default_rng(seed)``) with at
    least :data:`BOOTSTRAP_MIN_SEEDS` values, else, or where BCa is undefined (equal
    values; a NaN bound), the t interval (:func:`t_interval`). None for fewer than
    :data:`MIN_INTERVAL_SEEDS` values. NaN or infinite values are refused (ValueError):
    an interval of them would read as a tie."""
    x = np.asarray(values, np.float64)
    if not np.all(np.isfinite(x)):
        raise ValueError(f"seed_interval: the values must be finite, got {x.tolist()}")
    if x.size < MIN_INTERVAL_SEEDS:
        return None
    if x.size >= BOOTSTRAP_MIN_SEEDS and np.ptp(x) > 0:
        with warnings.catch_warnings():  # a degenerate BCa warns and gives NaN: caught below
            warnings.simplefilter("ignore")
            res = stats.bootstrap((x,), np.mean, confidence_level=confidence, method="BCa",
                                  n_resamples=n_resamples, **_rng_kwarg(seed))
        low, high = res.confidence_interval
        if np.isfinite(low) and np.isfinite(high):
            return Interval(float(low), float(high), BCA_METHOD)
    return t_interval(x, confidence)


def mcnemar_exact_p(a_only: int, b_only: int) -> float:
    """The exact two-sided McNemar p-value: ``scipy.stats.binomtest(a_only, a_only +
    b_only, 0.5)`` on the discordant pairs (queries only one method gets right); 1.0
    with none."""
    n = int(a_only) + int(b_only)
    return 1.0 if n == 0 else float(stats.binomtest(int(a_only), n, 0.5).pvalue)


def query_signed_rank_p(a_correct, b_correct) -> float:
    """The Wilcoxon signed-rank p-value (two-sided, ``scipy.stats.wilcoxon``, zeros
    dropped) of d_t = mean over seeds of (a_correct[s, t] - b_correct[s, t]): the
    queries t are the units, each seed's outcome on a query averaged into one value,
    because every seed scores the same queries. a_correct, b_correct: ``[S, T]``
    (seeds x queries) booleans. 1.0 when no query differs."""
    a = np.asarray(a_correct, np.float64)
    b = np.asarray(b_correct, np.float64)
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(f"a_correct and b_correct must both be [seeds, queries], got "
                         f"{a.shape} and {b.shape}")
    d = (a - b).mean(axis=0)
    d = d[d != 0]
    return 1.0 if d.size == 0 else float(stats.wilcoxon(d).pvalue)
