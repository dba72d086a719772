"""Planning a calibration set: the power of the Redline test and the prompts it needs, and the
same for the reverse test ("exceeds budget", :mod:`pytest_redline.risk.reverse`).

How many prompts must a grid have so that a config of a given true risk passes Holm's
hardest step with a given probability? :func:`power` is that probability at n prompts,
:func:`prompts_needed` the smallest n from which it stays above a target, and
:func:`prompts_needed_approx` the normal approximation that says beforehand whether the
exact scan would be long. The test itself (p-values, the critical count) is
:mod:`pytest_redline.risk`; this module only asks it questions.

numpy and ``scipy.special`` only, as :mod:`pytest_redline.risk`.
"""
from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
from scipy import special

from pytest_redline.checks import open_unit, positive_int
from pytest_redline.risk.binomial import critical_counts, lower_tail
from pytest_redline.risk.reverse import upper_tail

__all__ = ["power", "prompts_needed", "prompts_needed_approx", "reverse_power", "reverse_prompts_needed",
           "reverse_prompts_needed_approx"]


def _as_float(out: np.ndarray) -> float | np.ndarray:
    """A 0-d result as a float; arrays as they are."""
    return float(out) if out.ndim == 0 else out


def _power(n: np.ndarray, alpha: float, true_risk: float, level: float) -> np.ndarray:
    return _power_at(n, critical_counts(n, alpha, level), true_risk)


def _power_at(n: np.ndarray, k: np.ndarray, true_risk: float) -> np.ndarray:
    """P[Bin(n, true_risk) <= k], 0 where the critical count k is -1 (nothing passes)."""
    return np.where(k < 0, 0.0, lower_tail(np.maximum(k, 0), n, true_risk))


def power(n: Any, alpha: float, true_risk: float, level: float) -> float | np.ndarray:
    """P(a config with risk ``true_risk`` passes the test at ``level``) with n prompts.

    ``= P[Bin(n, true_risk) <= critical_count(n, alpha, level)]``. Saw-toothed in n,
    because the critical count is an integer. Vectorized over n.
    """
    n_arr = np.asarray(n)
    if n_arr.ndim == 0:
        n_arr = np.asarray(positive_int("n", n))
    elif not np.issubdtype(n_arr.dtype, np.integer) or n_arr.size == 0 or n_arr.min() < 1:
        raise ValueError(f"n ({n!r}) must be integers >= 1.")
    alpha = open_unit("alpha", alpha)
    level = open_unit("level", level)
    true_risk = _risk_below("true_risk", true_risk, 1.0)
    return _as_float(_power(n_arr.astype(np.int64), alpha, true_risk, level))


def _risk_below(name: str, value: Any, bound: float) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} ({value!r}) must be a number in [0, {bound}).") from None
    if not 0.0 <= x < bound:
        raise ValueError(f"{name} ({value!r}) must be in [0, {bound}).")
    return x


def _normal_n(alpha: float, true_risk: float, level: float, power: float) -> float:
    """The normal-approximation sample size; the same for the reverse test (squared: either sign)."""
    z = special.ndtri(1.0 - level) * math.sqrt(alpha * (1 - alpha)) + special.ndtri(power) * math.sqrt(
        true_risk * (1 - true_risk)
    )
    return (z / (alpha - true_risk)) ** 2


def prompts_needed_approx(alpha: float, true_risk: float, m: int, delta: float = 0.10, power: float = 0.8) -> float:
    """The normal approximation of :func:`prompts_needed`, in constant time.

    The exact scan takes time in proportion to its answer (seconds at tens of thousands of
    prompts); this says beforehand whether the answer is that large.

    >>> round(prompts_needed_approx(0.05, 0.03, 8))
    999
    """
    alpha = open_unit("alpha", alpha)
    true_risk = _risk_below("true_risk", true_risk, alpha)
    m = positive_int("m", m)
    return _normal_n(alpha, true_risk, open_unit("delta", delta) / m, open_unit("power", power))


def prompts_needed(alpha: float, true_risk: float, m: int, delta: float = 0.10, power: float = 0.8) -> int:
    """The calibration size n above which a config of risk ``true_risk`` passes with ``power``.

    The test is Holm's first step, at level ``delta / m`` (m configs in the family), the
    hardest step. Power is saw-toothed in n (it drops each time the critical count stays
    put while n grows), so this returns the smallest n such that the power is at least
    ``power`` for that n and every larger one. The scan runs to twice the last failing n
    (and at least twice the normal approximation), past which the teeth have died out.

    Published figures: alpha = 0.05, true risk 0.03, delta = 0.10, power 0.8 need
    1008 prompts for m = 8, 1189 for m = 16 and 1444 for m = 50.

    >>> prompts_needed(0.05, 0.03, 8)
    1008
    """
    alpha = open_unit("alpha", alpha)
    true_risk = _risk_below("true_risk", true_risk, alpha)
    m = positive_int("m", m)
    return _prompts_needed(alpha, true_risk, open_unit("delta", delta) / m, open_unit("power", power))


@functools.lru_cache(maxsize=256)
def _prompts_needed(alpha: float, true_risk: float, level: float, target: float) -> int:
    """The scan of :func:`prompts_needed` on checked arguments, remembered (a session's
    report and summary ask the same question for each config): ``last_fail`` is the largest
    failing n in [1, hi], and each doubling of hi looks only at the new n."""
    hi = max(64, int(2 * _normal_n(alpha, true_risk, level, target)) + 64)
    last_fail = _last_failing(1, hi, alpha, true_risk, level, target)
    while 2 * last_fail >= hi:
        last_fail = _last_failing(hi + 1, 2 * hi, alpha, true_risk, level, target) or last_fail
        hi *= 2
    return last_fail + 1


def _last_failing(lo: int, hi: int, alpha: float, true_risk: float, level: float, target: float) -> int:
    """The largest n in [lo, hi] whose power is below ``target`` (0 when none).

    The critical count k(n) is nondecreasing in n, in steps of one, and while it stays put
    the power P[Bin(n, true_risk) <= k] falls as n grows. So the failing n of each run of
    equal k(n) are its last ones, and the largest failing n is the end of the last run (cut
    at hi) whose end fails: the power is evaluated at run ends only, about alpha * n of them.
    Run ends come from each count's first passing n: a bisection on the p-value in n,
    between the critical counts on a grid of every 64th n.
    """
    grid = np.unique(np.append(np.arange(lo, hi + 1, 64, dtype=np.int64), hi))  # brackets for the bisection
    k_grid = critical_counts(grid, alpha, level)
    k_lo, k_hi = int(k_grid[0]), int(k_grid[-1])
    counts = np.arange(k_lo + 1, k_hi + 1, dtype=np.int64)  # the counts k(n) reaches after lo
    at = np.searchsorted(k_grid, counts)  # the first grid n where k(n) >= count
    fails, passes = grid[at - 1], grid[at]
    while np.any(passes - fails > 1):  # first n with P[Bin(n, alpha) <= count] <= level
        mid = (fails + passes) // 2
        ok = lower_tail(counts, mid, alpha) <= level
        fails, passes = np.where(ok, fails, mid), np.where(ok, mid, passes)
    ends = np.append(passes - 1, hi)  # the last n of each run, k(n) = k_lo .. k_hi
    power = _power_at(ends, np.arange(k_lo, k_hi + 1), true_risk)
    failing = np.flatnonzero(power < target)
    return int(ends[failing[-1]]) if failing.size else 0


# --------------------------------------------------------------------------- the reverse test


def _reverse_critical(n: np.ndarray, alpha: float, level: float) -> np.ndarray:
    """Vectorized: the smallest V with P[Bin(n, alpha) >= V] <= level (n + 1 when none).

    From a normal guess, stepped by the p-value itself (the function that decides the test).
    """
    n = np.asarray(n, dtype=np.int64)
    flat = n.ravel()
    sd = np.sqrt(flat * alpha * (1 - alpha))
    k = np.clip(np.ceil(flat * alpha + special.ndtri(1 - level) * sd), 1, flat + 1).astype(np.int64)
    moving = np.flatnonzero(k <= flat)
    while moving.size:  # up while V fails
        fails = upper_tail(k[moving], flat[moving], alpha) > level
        moving = moving[fails]
        k[moving] += 1
        moving = moving[k[moving] <= flat[moving]]
    moving = np.flatnonzero(k > 1)
    while moving.size:  # down while V - 1 passes
        passes = upper_tail(k[moving] - 1, flat[moving], alpha) <= level
        moving = moving[passes]
        k[moving] -= 1
        moving = moving[k[moving] > 1]
    return k.reshape(n.shape)


def _reverse_power(n: np.ndarray, alpha: float, true_risk: float, level: float) -> np.ndarray:
    k = _reverse_critical(n, alpha, level)
    return np.where(k > n, 0.0, upper_tail(np.minimum(k, n), n, true_risk))


def reverse_power(n: Any, alpha: float, true_risk: float, level: float) -> float | np.ndarray:
    """P(a config of risk ``true_risk`` > alpha is shown to exceed alpha at ``level``) with n prompts.

    ``= P[Bin(n, true_risk) >= k'(n)]``, k'(n) the smallest V whose reverse p-value is at most
    ``level``. Saw-toothed in n: it rises while k' stays put, and drops when k' steps up.
    """
    n_arr = np.asarray(n)
    if n_arr.ndim == 0:
        n_arr = np.asarray(positive_int("n", n))
    alpha, level = open_unit("alpha", alpha), open_unit("level", level)
    true_risk = open_unit("true_risk", true_risk)
    return _as_float(_reverse_power(n_arr.astype(np.int64), alpha, true_risk, level))


def reverse_prompts_needed(alpha: float, true_risk: float, m: int, delta: float = 0.10, power: float = 0.8) -> int:
    """The calibration size above which a config of risk ``true_risk`` > alpha is shown to
    exceed alpha with ``power``, at Holm's hardest step over the m - 1 candidates
    (``delta / (m - 1)``): the smallest n whose power, and every larger n's, is at least ``power``.

    The power's teeth are failures at the *start* of each run of equal k'(n), so the scan
    evaluates every n up to twice the last failing one (and at least twice the normal
    approximation), where the teeth have died out.

    >>> reverse_prompts_needed(0.05, 0.10, 8)
    267
    """
    alpha = open_unit("alpha", alpha)
    true_risk = open_unit("true_risk", true_risk)
    if true_risk <= alpha:
        raise ValueError(f"true_risk ({true_risk!r}) must exceed alpha ({alpha!r}): the reverse test shows R > alpha.")
    m = positive_int("m", m)
    level = open_unit("delta", delta) / max(m - 1, 1)
    return _reverse_needed(alpha, true_risk, level, open_unit("power", power))


def reverse_prompts_needed_approx(alpha: float, true_risk: float, m: int, delta: float = 0.10, power: float = 0.8) -> float:
    """The normal approximation of :func:`reverse_prompts_needed`, in constant time."""
    level = open_unit("delta", delta) / max(positive_int("m", m) - 1, 1)
    return _normal_n(open_unit("alpha", alpha), open_unit("true_risk", true_risk), level, open_unit("power", power))


@functools.lru_cache(maxsize=256)
def _reverse_needed(alpha: float, true_risk: float, level: float, target: float) -> int:
    hi = max(64, int(2 * _normal_n(alpha, true_risk, level, target)) + 64)
    while True:
        n = np.arange(1, hi + 1, dtype=np.int64)
        failing = np.flatnonzero(_reverse_power(n, alpha, true_risk, level) < target)
        last_fail = int(n[failing[-1]]) if failing.size else 0
        if 2 * last_fail < hi:
            return last_fail + 1
        hi *= 2
