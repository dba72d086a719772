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

Its power and sample size are :func:`pytest_redline.planning.reverse_power` and
:func:`~pytest_redline.planning.reverse_prompts_needed`. numpy and ``scipy.special`` only,
as the rest of :mod:`pytest_redline.risk`.
"""
from __future__ import annotations

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

__all__ = ["CERTIFIED", "EXCEEDS", "INCONCLUSIVE", "STATUSES", "Reverse", "exceeds_budget", "reverse_pvalue", "statuses",
           "upper_tail"]


def upper_tail(v: Any, n: Any, alpha: Any) -> np.ndarray:
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
    return _scalar(upper_tail(v, n, alpha))


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
    return _reverse(v, n, reference, alpha, delta, correction)


def _reverse(v: np.ndarray, n: int, reference: int, alpha: float, delta: float, correction: str) -> Reverse:
    """:func:`exceeds_budget` on arguments already checked."""
    tested = family_mask(v.size, reference, "candidates")
    p = upper_tail(v, n, alpha)
    exceeds = reject_rows(p, delta, tested, correction)
    adjusted = _holm_adjusted_rows(p, tested) if correction == "holm" else _bonferroni_adjusted_rows(p, tested)
    p = np.where(tested, p, np.nan)
    return Reverse(_frozen(v), _frozen(p), _frozen(adjusted), _frozen(exceeds), n, alpha, delta, correction)


def statuses(valid: Any, exceeds: Any) -> tuple[str, ...]:
    """Each config's status; the certificate takes precedence (both only when delta >= 1/2).

    >>> statuses([True, False, False], [False, True, False])
    ('certified', 'exceeds budget', 'inconclusive')
    """
    return tuple(CERTIFIED if ok else EXCEEDS if bad else INCONCLUSIVE for ok, bad in zip(valid, exceeds, strict=True))


def _frozen(a: np.ndarray) -> np.ndarray:
    a = np.array(a)
    a.setflags(write=False)
    return a
