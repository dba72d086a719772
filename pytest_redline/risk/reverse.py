"""The reverse test: showing that a config's risk *exceeds* the budget, and the three statuses.

The certificate rejects "R > alpha" for the valid configs. The reverse test rejects
"R <= alpha" for the configs that *exceed the budget*: its p-value is the upper tail

    p'(lambda) = P[Bin(n, alpha) >= V(lambda)]

(valid for every R <= alpha, since the tail grows with the risk), and Holm's step-down (or
Bonferroni) runs over the m - 1 candidates at the same level delta: a second family beside
the certificates. Each family's error is at most delta, so the chance that any status is
wrong is at most 2 delta (a union bound over the two families).

A config's status is ``certified`` (valid), ``exceeds budget`` (the reverse test rejected),
or ``inconclusive`` (neither). Both cannot happen when delta < 1/2: for one V the two tails
add up to 1 + P[Bin = V] >= 1, so both at most delta is impossible; the status rule still
gives the certificate precedence, so a grid with delta >= 1/2 never says both.

A count V' that is a *lower bound* on the full V (a config stopped early, counted on the
prompts it ran on) gives a larger p', so Holm rejects a subset of what the full counts
would: the test stays valid (it can only say "inconclusive" more often).

numpy and ``scipy.special`` only, as the rest of :mod:`pytest_redline.risk`.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import special

from pytest_redline.checks import CORRECTIONS, choice, open_unit, positive_int
from pytest_redline.risk.binomial import _binomial, _counts, _scalar
from pytest_redline.risk.corrections import _bonferroni_adjusted_rows, _holm_adjusted_rows, family_mask, reject_rows

CERTIFIED = "certified"
EXCEEDS = "exceeds budget"
INCONCLUSIVE = "inconclusive"
STATUSES = (CERTIFIED, EXCEEDS, INCONCLUSIVE)

__all__ = [
    "CERTIFIED", "EXCEEDS", "INCONCLUSIVE", "STATUSES", "Reverse", "exceeds_budget", "reverse_power",
    "reverse_prompts_needed", "reverse_prompts_needed_approx", "reverse_pvalue", "statuses",
]


def _upper(v: Any, n: Any, alpha: Any) -> np.ndarray:
    """Unchecked, broadcasting P[Bin(n, alpha) >= v] = I_alpha(v, n - v + 1); 1 at v = 0."""
    v, n = np.asarray(v), np.asarray(n)
    tail = special.betainc(np.maximum(v, 1), n - v + 1, alpha)
    return np.where(v <= 0, 1.0, tail)


def reverse_pvalue(v: Any, n: int, alpha: float) -> float | np.ndarray:
    """The exact p-value ``P[Bin(n, alpha) >= v]`` of the null "risk <= alpha".

    It equals ``scipy.stats.binomtest(v, n, alpha, alternative="greater").pvalue``.
    Vectorized over v.

    >>> round(reverse_pvalue(3, 10, 0.1), 6)
    0.070191
    """
    v, n, alpha = _binomial(v, n, "alpha", alpha)
    return _scalar(_upper(v, n, alpha))


@dataclass(frozen=True, eq=False)
class Reverse:
    """The reverse family: one entry per config, in input order (NaN / False for the reference).

    ``violations`` are the counts it used (for a stopped config, those on the prompts it ran
    on: a lower bound on V), ``p_values`` the upper tails, ``p_adjusted`` Holm's (or
    Bonferroni's) adjusted p-values over the m - 1 candidates, ``exceeds`` the rejections.
    """

    violations: np.ndarray
    p_values: np.ndarray
    p_adjusted: np.ndarray
    exceeds: np.ndarray
    n: int
    alpha: float
    delta: float
    correction: str


def exceeds_budget(violations: Any, n: int, reference: int, alpha: float, delta: float, correction: str = "holm") -> Reverse:
    """Test every candidate's "R <= alpha" at family-wise level delta over the m - 1 candidates.

    ``correction`` is the certificate's: "holm" or "bonferroni".

    >>> exceeds_budget([0, 30, 2], 100, 0, 0.1, 0.1).exceeds.tolist()
    [False, True, False]
    """
    n = positive_int("n", n)
    alpha, delta = open_unit("alpha", alpha), open_unit("delta", delta)
    correction = choice("correction", correction, CORRECTIONS)
    v = _counts("violations", violations, n)
    if v.ndim != 1 or v.size < 1 or not 0 <= reference < v.size:
        raise ValueError(f"violations ({violations!r}) must be a 1-d sequence of counts with a row for reference {reference!r}.")
    tested = family_mask(v.size, reference, "candidates")
    p = _upper(v, n, alpha)
    exceeds = reject_rows(p, delta, tested, correction)
    adjusted = _holm_adjusted_rows(p, tested) if correction == "holm" else _bonferroni_adjusted_rows(p, tested)
    return Reverse(_frozen(v), _frozen(np.where(tested, p, np.nan)), _frozen(adjusted), _frozen(exceeds), n, alpha, delta, correction)


def statuses(valid: Any, exceeds: Any) -> tuple[str, ...]:
    """Each config's status; the certificate takes precedence (both only when delta >= 1/2).

    >>> statuses([True, False, False], [False, True, False])
    ('certified', 'exceeds budget', 'inconclusive')
    """
    return tuple(CERTIFIED if ok else EXCEEDS if bad else INCONCLUSIVE for ok, bad in zip(valid, exceeds, strict=True))


# --------------------------------------------------------------------------- power and sample size


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
        fails = _upper(k[moving], flat[moving], alpha) > level
        moving = moving[fails]
        k[moving] += 1
        moving = moving[k[moving] <= flat[moving]]
    moving = np.flatnonzero(k > 1)
    while moving.size:  # down while V - 1 passes
        passes = _upper(k[moving] - 1, flat[moving], alpha) <= level
        moving = moving[passes]
        k[moving] -= 1
        moving = moving[k[moving] > 1]
    return k.reshape(n.shape)


def _reverse_power(n: np.ndarray, alpha: float, true_risk: float, level: float) -> np.ndarray:
    k = _reverse_critical(n, alpha, level)
    return np.where(k > n, 0.0, _upper(np.minimum(k, n), n, true_risk))


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
    return _scalar(_reverse_power(n_arr.astype(np.int64), alpha, true_risk, level))


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


def _normal_n(alpha: float, true_risk: float, level: float, power: float) -> float:
    z = special.ndtri(1.0 - level) * math.sqrt(alpha * (1 - alpha)) + special.ndtri(power) * math.sqrt(true_risk * (1 - true_risk))
    return (z / (true_risk - alpha)) ** 2


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


def _frozen(a: np.ndarray) -> np.ndarray:
    a = np.array(a)
    a.setflags(write=False)
    return a
