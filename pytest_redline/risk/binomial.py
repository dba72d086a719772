"""Binomial tails and bounds: violation counts, exact p-values, Clopper-Pearson bounds and
critical counts.

numpy and ``scipy.special`` only: never torch or pytest, nor ``scipy.stats`` (whose import
breaks when torch is blocked with ``sys.modules["torch"] = None``).
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import special

from pytest_redline.checks import open_unit, positive_int

# Below this, binom_logpvalue leaves the incomplete beta (relative accuracy near machine
# epsilon down to here) for an explicit log-space sum of the lower tail.
_TINY = 1e-300


def _counts(name: str, value: Any, n: int) -> np.ndarray:
    """Integer counts in [0, n] as an int64 array (scalars become 0-d arrays)."""
    v = np.asarray(value)
    if v.dtype == bool or not np.issubdtype(v.dtype, np.integer):
        if not (np.issubdtype(v.dtype, np.floating) and np.all(np.isfinite(v)) and np.all(v == np.round(v))):
            raise ValueError(f"{name} ({value!r}) must be integer counts.")
    v = v.astype(np.int64)
    if v.size and (v.min() < 0 or v.max() > n):
        raise ValueError(f"{name} ({value!r}) must be counts in [0, n] with n = {n}.")
    return v


def _binomial(v: Any, n: Any, name: str, p: Any) -> tuple[np.ndarray, int, float]:
    """The arguments of a binomial tail or bound: counts ``v`` in [0, n], n >= 1, and the
    probability ``name`` in (0, 1); checked in the order n, ``name``, v."""
    n = positive_int("n", n)
    p = open_unit(name, p)
    return _counts("v", v, n), n, p


def _scalar(out: np.ndarray) -> float | np.ndarray:
    """A 0-d result as a float; arrays as they are (the functions vectorize over counts)."""
    return float(out) if out.ndim == 0 else out



def violations(correct: Any, reference: int) -> np.ndarray:
    """``V[i] = #(reference correct and config i wrong)``, as exact int64 counts.

    Counted with integer sums, never as ``n * mean`` (which is off by one in floating
    point for some n). Prompts the reference gets wrong never count.

    >>> violations([[1, 1, 0], [0, 1, 1]], reference=0).tolist()
    [0, 1]
    """
    c = np.asarray(correct)
    if c.ndim != 2 or c.shape[0] < 1 or c.shape[1] < 1:
        raise ValueError(f"correct must be a non-empty 2-d (configs x prompts) array, got shape {c.shape}.")
    if c.dtype != bool:
        if not np.all((c == 0) | (c == 1)):
            raise ValueError("correct must hold only booleans or 0/1 values.")
        c = c.astype(bool)
    ref = operator.index(reference)
    if not 0 <= ref < c.shape[0]:
        raise ValueError(f"reference ({reference!r}) must index a row of correct (0 .. {c.shape[0] - 1}).")
    return np.count_nonzero(c < c[ref], axis=1).astype(np.int64)  # for booleans, a < b is (not a) and b


def _log_lower_tail(v: int, n: int, alpha: float) -> float:
    """log P[Bin(n, alpha) <= v] by a log-space sum, for the far lower tail.

    Terms fall geometrically below v when v is under the mean, so the sum
    ``pmf(v) * (1 + r_v + r_v r_{v-1} + ...)``, ``r_k = pmf(k-1)/pmf(k)``, is cut once a
    term is below 1e-20 of the first.
    """
    window = 64
    while True:
        k = np.arange(v, max(v - window, 0), -1, dtype=float)  # v, v-1, ..., > v - window
        log_ratio = np.log(k) + math.log1p(-alpha) - np.log(n - k + 1) - math.log(alpha)
        log_terms = np.concatenate(([0.0], np.cumsum(log_ratio)))
        if v - window < 0 or log_terms[-1] < -46.0:  # reached k = 0, or the rest is < 1e-20
            break
        window *= 4
    top = log_terms.max()
    log_sum = top + math.log(np.exp(log_terms - top).sum())
    return _binom_logpmf(v, n, alpha) + log_sum


def _binom_logpmf(k: int, n: int, p: float) -> float:
    log_choose = special.gammaln(n + 1) - special.gammaln(k + 1) - special.gammaln(n - k + 1)
    return float(log_choose + special.xlogy(k, p) + special.xlog1py(n - k, -p))


def _logcdf(v: np.ndarray, n: int, alpha: np.ndarray) -> np.ndarray:
    """Unchecked, broadcasting log P[Bin(n, alpha) <= v]."""
    v, alpha = np.broadcast_arrays(v, alpha)
    p = lower_tail(v, n, alpha)
    with np.errstate(divide="ignore"):
        out = np.log(np.atleast_1d(p))
    tiny = np.flatnonzero(np.atleast_1d(p) < _TINY)
    for i, (vi, ai) in zip(tiny, zip(v.ravel()[tiny], alpha.ravel()[tiny])):
        out.flat[i] = _log_lower_tail(int(vi), n, float(ai))
    return out.reshape(p.shape)


def lower_tail(v: Any, n: Any, alpha: Any) -> np.ndarray:
    """Unchecked, broadcasting P[Bin(n, alpha) <= v] = 1 - I_alpha(v + 1, n - v).

    The complemented incomplete beta keeps its relative accuracy (about 1e-16) in the far
    lower tail, where ``scipy.stats.binom.cdf`` loses digits near 1e-290.
    """
    v, n = np.asarray(v), np.asarray(n)
    below = v < n
    tail = special.betaincc(v + 1, np.where(below, n - v, 1), alpha)
    return np.where(below, tail, 1.0)


def binom_pvalue(v: Any, n: int, alpha: float) -> float | np.ndarray:
    """The exact p-value ``P[Bin(n, alpha) <= v]`` of the null "risk > alpha".

    Computed as the complemented regularized incomplete beta ``1 - I_alpha(v + 1, n - v)``
    (``scipy.special.betaincc``, Boost), which keeps a relative accuracy near 1e-16 in the
    far lower tail down to the smallest normal double (about 1e-308); below that the float
    is 0.0, the correctly rounded value; :func:`binom_logpvalue` gives the logarithm there.
    It equals ``scipy.stats.binomtest(v, n, alpha, alternative="less").pvalue`` (which
    loses digits below about 1e-290).

    :param v: violation counts in [0, n] (an int or an array of ints: vectorized).
    :param n: the number of calibration prompts, >= 1.
    :param alpha: the risk budget in (0, 1).

    >>> round(binom_pvalue(0, 10, 0.1), 6)
    0.348678
    """
    v, n, alpha = _binomial(v, n, "alpha", alpha)
    return _scalar(lower_tail(v, n, alpha))


def binom_logpvalue(v: Any, n: int, alpha: float) -> float | np.ndarray:
    """``log P[Bin(n, alpha) <= v]``, accurate where the p-value underflows a double.

    Where the p-value is above 1e-300 this is ``log`` of :func:`binom_pvalue`; below, the
    lower tail is summed in log space (scipy's ``binom.logcdf`` returns -inf there), with
    the absolute error of log Gamma(n + 1), about 1e-16 * log(n!). For example
    ``binom_logpvalue(0, 100_000, 0.3) == 100_000 * log(0.7) = -35667.49...``.
    """
    v, n, alpha = _binomial(v, n, "alpha", alpha)
    return _scalar(_logcdf(v, n, np.asarray(alpha)))



@dataclass(frozen=True)
class ConfidenceInterval:
    """A confidence interval ``[low, high]`` (floats, or arrays when vectorized)."""

    low: Any
    high: Any


def _cp_upper(v: np.ndarray, n: int, level: float) -> np.ndarray:
    """The ``level`` quantile of Beta(v + 1, n - v); 1 when v = n."""
    upper = special.betaincinv(v + 1, np.maximum(n - v, 1), level)
    return np.where(v >= n, 1.0, upper)


def _cp_lower(v: np.ndarray, n: int, level: float) -> np.ndarray:
    """The ``1 - level`` quantile of Beta(v, n - v + 1); 0 when v = 0."""
    lower = special.betaincinv(np.maximum(v, 1), n - v + 1, 1.0 - level)
    return np.where(v <= 0, 0.0, lower)


def clopper_pearson_upper(v: Any, n: int, level: float) -> float | np.ndarray:
    """One-sided Clopper-Pearson upper bound on a binomial proportion at confidence ``level``.

    With ``level = 1 - delta`` this bounds the risk R(lambda) from V(lambda) violations in n
    prompts: ``P[R <= upper] >= level``. It is 1 when ``v == n``. Vectorized over v.

    >>> round(clopper_pearson_upper(0, 100, 0.9), 4)
    0.0228
    """
    v, n, level = _binomial(v, n, "level", level)
    return _scalar(_cp_upper(v, n, level))


def clopper_pearson_interval(v: Any, n: int, confidence: float = 0.95) -> ConfidenceInterval:
    """Two-sided exact (Clopper-Pearson) interval, as scipy's ``proportion_ci(method="exact")``."""
    v, n, confidence = _binomial(v, n, "confidence", confidence)
    side = 1.0 - (1.0 - confidence) / 2.0
    low, high = _cp_lower(v, n, side), _cp_upper(v, n, side)
    if low.ndim == 0:
        return ConfidenceInterval(float(low), float(high))
    return ConfidenceInterval(low, high)


def critical_counts(n: np.ndarray, alpha: float, level: float) -> np.ndarray:
    """Vectorized critical count: the largest V with P[Bin(n, alpha) <= V] <= level, or -1.

    Decided by the p-value itself (monotone in V), so the boundary is the one of the
    function that decides the test: from the Cornish-Fisher quantile of Bin(n, alpha),
    step down while V fails, then up while V + 1 passes. The guess is off by at most one
    or two, so this costs about three p-value evaluations per n, where a bisection costs
    log2(n) (the power scans of :mod:`pytest_redline.planning` evaluate tens of thousands
    of n). V = -1 passes by convention and V = n fails (its p-value is 1 > level).
    """
    n = np.asarray(n, dtype=np.int64)
    flat = n.ravel()
    z = special.ndtri(level)
    sd = np.sqrt(flat * alpha * (1 - alpha))
    guess = flat * alpha - 0.5 + sd * (z + (z * z - 1) * (1 - 2 * alpha) / (6 * np.maximum(sd, 1e-300)))
    k = np.clip(np.floor(guess), -1, flat - 1).astype(np.int64)
    moving = np.flatnonzero(k >= 0)
    while moving.size:  # down while V fails
        fails = lower_tail(k[moving], flat[moving], alpha) > level
        moving = moving[fails]
        k[moving] -= 1
        moving = moving[k[moving] >= 0]
    moving = np.flatnonzero(k + 1 < flat)
    while moving.size:  # up while V + 1 passes
        passes = lower_tail(k[moving] + 1, flat[moving], alpha) <= level
        moving = moving[passes]
        k[moving] += 1
        moving = moving[k[moving] + 1 < flat[moving]]
    return k.reshape(n.shape)


def critical_count(n: int, alpha: float, level: float) -> int:
    """The largest V with ``binom_pvalue(V, n, alpha) <= level`` (-1 when even V = 0 fails).

    A config passes a test at ``level`` exactly when its violation count is at most this.

    >>> critical_count(1012, 0.05, 0.10 / 7)
    35
    """
    n = positive_int("n", n)
    alpha = open_unit("alpha", alpha)
    level = open_unit("level", level)
    return int(critical_counts(np.asarray(n), alpha, level))
