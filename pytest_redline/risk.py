"""Exact Redline certification: a few pure functions over an m x n boolean matrix.

Row ``i`` of ``correct`` says which of the n calibration prompts config ``i`` answers
correctly; one row is the reference (the lossless config). For each config lambda:

- the violation count ``V(lambda) = #(reference correct and lambda wrong)``, an integer;
- the p-value ``p(lambda) = P[Bin(n, alpha) <= V(lambda)]`` of the null "risk > alpha",
  where the risk is ``R(lambda) = P(reference correct and lambda wrong)``;
- Holm's step-down (or Bonferroni) at family-wise level delta: the configs whose null is
  rejected are *valid*, and with probability at least 1 - delta every valid config has
  risk at most alpha;
- the deployed config has the best cost among the valid configs and the reference.

How many prompts a grid needs (power, sample size) is :mod:`pytest_redline.planning`.

numpy and ``scipy.special`` only: this module never imports torch or pytest, nor
``scipy.stats`` (whose import breaks when torch is blocked with ``sys.modules["torch"] = None``).
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from scipy import special

from pytest_redline import text
from pytest_redline.checks import CORRECTIONS, FAMILIES, choice, open_unit, positive_int

__all__ = [
    "ConfidenceInterval",
    "RedlineResult",
    "DEFAULT_ALPHAS",
    "alpha_min",
    "alpha_min_of",
    "binom_logpvalue",
    "binom_pvalue",
    "bonferroni",
    "certify",
    "certify_counts",
    "clopper_pearson_interval",
    "clopper_pearson_upper",
    "critical_count",
    "family_mask",
    "holm",
    "holm_adjusted",
    "reject_rows",
    "select_deployed",
    "sweep",
    "violations",
]

#: The alpha grid of alpha_min: 0.01, 0.02, ..., 0.30.
DEFAULT_ALPHAS = tuple(round(0.01 * i, 2) for i in range(1, 31))

# Below this, binom_logpvalue leaves the incomplete beta (relative accuracy near machine
# epsilon down to here) for an explicit log-space sum of the lower tail.
_TINY = 1e-300

GAINS = ("percent", "factor")


# --------------------------------------------------------------------------- validation


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


def _p_values(name: str, value: Any) -> np.ndarray:
    p = np.asarray(value, dtype=float)
    if p.ndim != 1:
        raise ValueError(f"{name} must be a 1-d sequence of p-values, got shape {p.shape}.")
    if np.any(np.isnan(p)) or np.any(p < 0) or np.any(p > 1):
        raise ValueError(f"{name} ({value!r}) must hold p-values in [0, 1].")
    return p


def _tested_mask(tested: Any, m: int) -> np.ndarray:
    if tested is None:
        return np.ones(m, dtype=bool)
    mask = np.asarray(tested)
    if mask.dtype != bool or mask.shape != (m,):
        raise ValueError(f"tested must be a boolean mask of shape ({m},), got {mask.dtype} of shape {mask.shape}.")
    return mask


# --------------------------------------------------------------------------- counts and p-values


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
    p = _pvalue(v, n, alpha)
    with np.errstate(divide="ignore"):
        out = np.log(np.atleast_1d(p))
    tiny = np.flatnonzero(np.atleast_1d(p) < _TINY)
    for i, (vi, ai) in zip(tiny, zip(v.ravel()[tiny], alpha.ravel()[tiny])):
        out.flat[i] = _log_lower_tail(int(vi), n, float(ai))
    return out.reshape(p.shape)


def _pvalue(v: Any, n: Any, alpha: Any) -> np.ndarray:
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

    Parameters
    ----------
    v : int or array of int
        Violation counts in [0, n]. Vectorized.
    n : int
        Number of calibration prompts, >= 1.
    alpha : float
        Risk budget in (0, 1).

    >>> round(binom_pvalue(0, 10, 0.1), 6)
    0.348678
    """
    v, n, alpha = _binomial(v, n, "alpha", alpha)
    return _scalar(_pvalue(v, n, alpha))


def binom_logpvalue(v: Any, n: int, alpha: float) -> float | np.ndarray:
    """``log P[Bin(n, alpha) <= v]``, accurate where the p-value underflows a double.

    Where the p-value is above 1e-300 this is ``log`` of :func:`binom_pvalue`; below, the
    lower tail is summed in log space (scipy's ``binom.logcdf`` returns -inf there), with
    the absolute error of log Gamma(n + 1), about 1e-16 * log(n!). For example
    ``binom_logpvalue(0, 100_000, 0.3) == 100_000 * log(0.7) = -35667.49...``.
    """
    v, n, alpha = _binomial(v, n, "alpha", alpha)
    return _scalar(_logcdf(v, n, np.asarray(alpha)))


# --------------------------------------------------------------------------- multiple testing


def _holm_rows(p: np.ndarray, delta: float, tested: np.ndarray) -> np.ndarray:
    """Holm's step-down on each row of ``p`` (shape (..., m)); untested columns never reject."""
    k = int(tested.sum())
    rejected = np.zeros(p.shape, dtype=bool)
    if k == 0:
        return rejected
    cols = np.flatnonzero(tested)
    order = np.argsort(p[..., cols], axis=-1, kind="stable")  # ties keep the config order
    sorted_p = np.take_along_axis(p[..., cols], order, axis=-1)
    passes = sorted_p <= delta / (k - np.arange(k))
    steps = np.cumprod(passes, axis=-1).astype(bool)  # stop at the first failure
    sub = np.zeros(sorted_p.shape, dtype=bool)
    np.put_along_axis(sub, order, steps, axis=-1)
    rejected[..., cols] = sub
    return rejected


def holm(p_values: Any, delta: float, tested: Any = None) -> np.ndarray:
    """Holm's step-down at family-wise level delta; returns the rejected (valid) mask.

    The tested p-values are sorted ascending, ties in config order (a stable sort); the
    j-th smallest (j = 0, 1, ...) is rejected while ``p <= delta / (K - j)`` with K the
    family size, and the procedure stops at the first failure. Configs outside ``tested``
    are not in the family and are never rejected.

    >>> holm([0.01, 0.04, 0.03], 0.1).tolist()
    [True, True, True]
    """
    delta = open_unit("delta", delta)
    p = _p_values("p_values", p_values)
    return _holm_rows(p, delta, _tested_mask(tested, p.size))


def bonferroni(p_values: Any, delta: float, tested: Any = None) -> np.ndarray:
    """Bonferroni at family-wise level delta: reject ``p <= delta / K`` (K = family size)."""
    delta = open_unit("delta", delta)
    p = _p_values("p_values", p_values)
    mask = _tested_mask(tested, p.size)
    return _bonferroni_rows(p, delta, mask)


def _bonferroni_rows(p: np.ndarray, delta: float, tested: np.ndarray) -> np.ndarray:
    k = int(tested.sum())
    return tested & (p <= delta / max(k, 1))


def holm_adjusted(p_values: Any, tested: Any = None) -> np.ndarray:
    """Holm-adjusted p-values: ``max over j <= rank of min(1, (K - j) p_(j))``.

    Monotone in the raw p-values and capped at 1; ``holm(p, delta)`` rejects exactly the
    configs whose adjusted p-value is at most delta. Untested configs get NaN. Equal to
    statsmodels' ``multipletests(p, method="holm")[1]``.
    """
    p = _p_values("p_values", p_values)
    return _holm_adjusted_rows(p, _tested_mask(tested, p.size))


def _holm_adjusted_rows(p: np.ndarray, tested: np.ndarray) -> np.ndarray:
    out = np.full(p.shape, np.nan)
    cols = np.flatnonzero(tested)
    k = cols.size
    if k == 0:
        return out
    order = np.argsort(p[..., cols], axis=-1, kind="stable")
    sorted_p = np.take_along_axis(p[..., cols], order, axis=-1)
    adjusted = np.minimum(1.0, np.maximum.accumulate(_level_needed(sorted_p, k - np.arange(k)), axis=-1))
    sub = np.empty(sorted_p.shape)
    np.put_along_axis(sub, order, adjusted, axis=-1)
    out[..., cols] = sub
    return out


def _bonferroni_adjusted_rows(p: np.ndarray, tested: np.ndarray) -> np.ndarray:
    return np.where(tested, np.minimum(1.0, _level_needed(p, max(int(tested.sum()), 1))), np.nan)


def _level_needed(p: np.ndarray, divisor: Any) -> np.ndarray:
    """The smallest float d with ``p <= d / divisor`` as the tests compute it (``p * divisor``
    up to an ulp or two), so that an adjusted p-value is at most delta exactly when the test
    rejects at delta: at delta = 0.23, ``3 * (0.23 / 3)`` is 0.23000000000000004 > delta,
    although ``0.23 / 3 <= 0.23 / 3`` rejects. Division by a positive constant is monotone
    in floating point, so for every delta: ``p <= delta / divisor`` iff ``d <= delta``."""
    p, divisor = np.asarray(p, dtype=float), np.asarray(divisor, dtype=float)
    d = p * divisor
    for _ in range(8):  # each pass moves one ulp; two suffice in practice
        up = d / divisor < p
        down = ~up & (d > 0) & (np.nextafter(d, -np.inf) / divisor >= p)
        if not (up.any() or down.any()):
            break
        d = np.where(up, np.nextafter(d, np.inf), np.where(down, np.nextafter(d, -np.inf), d))
    return d


def family_mask(m: int, reference: int, family: str) -> np.ndarray:
    """Which of m configs are tested: all (the paper), or all but the reference ("candidates")."""
    tested = np.ones(m, dtype=bool)
    if family == "candidates":
        tested[reference] = False
    return tested


def reject_rows(p: np.ndarray, delta: float, tested: np.ndarray, correction: str) -> np.ndarray:
    """Unchecked and vectorized: the rejected (valid) mask of each row of ``p`` (shape (..., m)).

    ``correction`` is "holm" (:func:`holm`), "bonferroni" (:func:`bonferroni`) or "none",
    which tests each config at delta (the analyses' ablation without the multiplicity
    correction). Untested columns never reject. Certification and the analyses' split
    studies both decide validity here.
    """
    if correction == "holm":
        return _holm_rows(p, delta, tested)
    if correction == "bonferroni":
        return _bonferroni_rows(p, delta, tested)
    return tested & (p <= delta)


# --------------------------------------------------------------------------- bounds


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


def _critical(n: np.ndarray, alpha: float, level: float) -> np.ndarray:
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
        fails = _pvalue(k[moving], flat[moving], alpha) > level
        moving = moving[fails]
        k[moving] -= 1
        moving = moving[k[moving] >= 0]
    moving = np.flatnonzero(k + 1 < flat)
    while moving.size:  # up while V + 1 passes
        passes = _pvalue(k[moving] + 1, flat[moving], alpha) <= level
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
    return int(_critical(np.asarray(n), alpha, level))


# --------------------------------------------------------------------------- certification


def _json_float(x: Any) -> float | None:
    x = float(x)
    return None if math.isnan(x) else x


@dataclass(frozen=True, eq=False)
class RedlineResult:
    """The outcome of :func:`certify`. Arrays have one entry per config, in input order.

    Attributes
    ----------
    names, reference, reference_index : the configs, and the reference's name and row.
    accuracy : fraction of prompts answered correctly.
    violations, risk : V(lambda) (int) and V / n.
    risk_upper : one-sided Clopper-Pearson upper bound on the risk at confidence 1 - delta.
    p_values, p_adjusted : raw binomial and Holm- (or Bonferroni-) adjusted p-values; NaN
        for a config outside the family (the reference with ``family="candidates"``).
    valid : the null "risk > alpha" was rejected. Outside the family: False.
    deployed, deployed_index : the config to serve (the reference when nothing valid is faster).
    cost, gain : each config's cost, and its gain over the reference: a percentage when
        ``gain_kind == "percent"`` (37.5 means +37.5 %), a factor when ``"factor"``
        (2.81 means 2.81x better, e.g. smaller memory).
    net_accuracy : accuracy minus the reference's, in points (-4.0 means 4 points lower).
    """

    names: tuple[str, ...]
    reference: str
    reference_index: int
    accuracy: np.ndarray
    violations: np.ndarray
    risk: np.ndarray
    risk_upper: np.ndarray
    p_values: np.ndarray
    p_adjusted: np.ndarray
    valid: np.ndarray
    deployed: str
    deployed_index: int
    cost: np.ndarray
    gain: np.ndarray
    net_accuracy: np.ndarray
    alpha: float
    delta: float
    n: int
    m: int
    correction: str
    family: str
    gain_kind: str
    lower_is_better: bool

    def risk_interval(self, confidence: float = 0.95) -> ConfidenceInterval:
        """Two-sided Clopper-Pearson intervals on every config's risk (arrays)."""
        return clopper_pearson_interval(self.violations, self.n, confidence)

    def to_dict(self, alpha_min: float | None = None) -> dict[str, Any]:
        """The JSON report object of DESIGN.md (plain builtins; NaN becomes None)."""
        report: dict[str, Any] = {
            "alpha": self.alpha,
            "delta": self.delta,
            "correction": self.correction,
            "family": self.family,
            "n": self.n,
            "m": self.m,
            "reference": self.reference,
            "deployed": self.deployed,
        }
        if alpha_min is not None:
            report["alpha_min"] = alpha_min
        report["configs"] = [
            {
                "name": name,
                "accuracy": float(self.accuracy[i]),
                "violations": int(self.violations[i]),
                "risk": float(self.risk[i]),
                "risk_upper": float(self.risk_upper[i]),
                "p_value": _json_float(self.p_values[i]),
                "p_adjusted": _json_float(self.p_adjusted[i]),
                "valid": bool(self.valid[i]),
                "cost": float(self.cost[i]),
                "gain": float(self.gain[i]),
                "net_accuracy_points": float(self.net_accuracy[i]),
            }
            for i, name in enumerate(self.names)
        ]
        return report

    def _gain_text(self, i: int) -> str:
        return text.gain(self.gain[i], self.gain_kind)

    def __str__(self) -> str:
        header = ("", "config", "accuracy", "V", "risk", "risk_up", "p_value", "p_adj", "valid", "cost", "gain", "net_pts")
        rows = [header]
        for i, name in enumerate(self.names):
            mark = ("*" if i == self.deployed_index else " ") + ("R" if i == self.reference_index else " ")
            rows.append((
                mark,
                name,
                f"{self.accuracy[i]:.4f}",
                str(int(self.violations[i])),
                f"{self.risk[i]:.4f}",
                f"{self.risk_upper[i]:.4f}",
                text.number(self.p_values[i]),
                text.number(self.p_adjusted[i]),
                "yes" if self.valid[i] else "no",
                f"{self.cost[i]:.4g}",
                self._gain_text(i),
                f"{self.net_accuracy[i]:+.1f}",
            ))
        lines = [
            f"Redline: alpha={self.alpha:g} delta={self.delta:g} {self.correction} (family: {self.family}), "
            f"n={self.n} prompts, m={self.m} configs, cost {'lower' if self.lower_is_better else 'higher'} is better"
        ]
        lines += text.table(rows, left=(1,))
        d = self.deployed_index
        if d == self.reference_index:
            verdict = f"deployed: {self.deployed} (the reference)"
        else:
            verdict = (
                f"deployed: {self.deployed} ({self._gain_text(d)} vs reference {self.reference}, "
                f"{self.net_accuracy[d]:+.1f} accuracy points)"
            )
        lines.append("* deployed, R reference")
        lines.append(verdict)
        return "\n".join(lines)


@dataclass(frozen=True)
class _Problem:
    """Validated inputs shared by certify, sweep and alpha_min."""

    names: tuple[str, ...]
    reference: int
    violations: np.ndarray
    accuracy: np.ndarray
    cost: np.ndarray
    n: int
    delta: float
    lower_is_better: bool
    gain_kind: str
    correction: str
    family: str
    deployable: np.ndarray


def _problem(correct, cost, reference, delta, names, lower_is_better, gain, correction, family, eligible) -> _Problem:
    c = np.asarray(correct)
    if c.ndim != 2 or c.shape[0] < 1 or c.shape[1] < 1:
        raise ValueError(f"correct must be a non-empty 2-d (configs x prompts) array, got shape {c.shape}.")
    m, n = c.shape
    names, reference = _names_and_reference(names, reference, m, "row of correct")
    v = violations(c, reference)
    accuracy = np.count_nonzero(np.asarray(c, dtype=bool), axis=1) / n
    return _counts_problem(v, accuracy, n, cost, reference, delta, names, lower_is_better, gain, correction, family, eligible)


def _names_and_reference(names, reference, m: int, what: str) -> tuple[tuple[str, ...], int]:
    if names is None:
        names = tuple(f"config{i}" for i in range(m))
    names = tuple(str(x) for x in names)
    if len(names) != m or len(set(names)) != m:
        raise ValueError(f"names must be {m} distinct names, one per {what}; got {list(names)!r}.")
    if isinstance(reference, str):
        if reference not in names:
            raise ValueError(f"reference ({reference!r}) is not a config; configs: {', '.join(names)}.")
        reference = names.index(reference)
    ref = operator.index(reference)
    if not 0 <= ref < m:
        raise ValueError(f"reference ({reference!r}) must index a {what} (0 .. {m - 1}).")
    return names, ref


def _counts_problem(v, accuracy, n, cost, reference, delta, names, lower_is_better, gain, correction, family, eligible) -> _Problem:
    m = len(names)
    cost = np.asarray(cost, dtype=float)
    if cost.shape != (m,) or not np.all(np.isfinite(cost)) or not np.all(cost > 0):
        raise ValueError(f"cost ({cost!r}) must hold {m} positive finite numbers, one per config.")
    delta = open_unit("delta", delta)
    correction = choice("correction", correction, CORRECTIONS)
    family = choice("family", family, FAMILIES)
    gain = choice("gain", gain if gain is not None else ("factor" if lower_is_better else "percent"), GAINS)
    deployable = np.ones(m, dtype=bool) if eligible is None else np.asarray(eligible)
    if deployable.dtype != bool or deployable.shape != (m,):
        raise ValueError(f"eligible ({eligible!r}) must be a boolean mask with one entry per config ({m}).")
    deployable = deployable.copy()
    deployable[reference] = True
    return _Problem(names, reference, v, accuracy, cost, n, delta, bool(lower_is_better), gain, correction, family, deployable)


def _frozen(a: np.ndarray) -> np.ndarray:
    a = np.array(a)
    a.setflags(write=False)
    return a


def _results(prob: _Problem, alphas: np.ndarray) -> list[RedlineResult]:
    """Certify at every alpha at once: p-values and corrections are (len(alphas), m) arrays."""
    m, ref = len(prob.names), prob.reference
    tested = family_mask(m, ref, prob.family)
    p = _pvalue(prob.violations[None, :], prob.n, alphas[:, None])
    valid = reject_rows(p, prob.delta, tested, prob.correction)
    if prob.correction == "holm":
        adjusted = _holm_adjusted_rows(p, tested)
    else:
        adjusted = _bonferroni_adjusted_rows(p, tested)
    p = np.where(tested, p, np.nan)

    score = -prob.cost if prob.lower_is_better else prob.cost
    ratio = prob.cost[ref] / prob.cost if prob.lower_is_better else prob.cost / prob.cost[ref]
    gain = 100.0 * (ratio - 1.0) if prob.gain_kind == "percent" else ratio
    shared = dict(
        names=prob.names,
        reference=prob.names[ref],
        reference_index=ref,
        accuracy=_frozen(prob.accuracy),
        violations=_frozen(prob.violations),
        risk=_frozen(prob.violations / prob.n),
        risk_upper=_frozen(_cp_upper(prob.violations, prob.n, 1.0 - prob.delta)),
        cost=_frozen(prob.cost),
        gain=_frozen(gain),
        net_accuracy=_frozen(100.0 * (prob.accuracy - prob.accuracy[ref])),
        delta=prob.delta,
        n=prob.n,
        m=m,
        correction=prob.correction,
        family=prob.family,
        gain_kind=prob.gain_kind,
        lower_is_better=prob.lower_is_better,
    )
    chosen = select_deployed(valid & prob.deployable, score, ref)
    results = []
    for a, alpha in enumerate(alphas):
        deployed = int(chosen[a])
        results.append(RedlineResult(
            p_values=_frozen(p[a]),
            p_adjusted=_frozen(adjusted[a]),
            valid=_frozen(valid[a]),
            deployed=prob.names[deployed],
            deployed_index=deployed,
            alpha=float(alpha),
            **shared,
        ))
    return results


def select_deployed(valid: Any, score: Any, reference: int) -> np.ndarray:
    """The deployment rule: per row of ``valid`` (shape (..., m)), the index of the config to
    serve, the best ``score`` (higher is better) among the valid configs and the reference.

    The reference wins a tie (a candidate must be strictly better: nothing is gained by
    serving an equally fast lossy config); among tied candidates the first listed wins.
    ``score`` has shape (m,) or broadcasts against ``valid`` (e.g. a per-split cost).
    Vectorized over every leading axis (budgets, splits).

    >>> select_deployed([[False, True, True], [False, False, False]], [1.0, 2.0, 2.0], 0).tolist()
    [1, 0]
    >>> select_deployed([True, True], [2.0, 2.0], 1).tolist()
    1
    """
    candidates = np.array(valid, dtype=bool)
    candidates[..., reference] = True
    masked = np.where(candidates, score, -np.inf)
    best = np.argmax(masked, axis=-1)
    better = np.take_along_axis(masked, best[..., None], axis=-1)[..., 0] > masked[..., reference]
    return np.where(better, best, reference)


def certify(
    correct: Any,
    cost: Any,
    reference: int | str,
    alpha: float,
    delta: float = 0.10,
    *,
    names: Sequence[str] | None = None,
    lower_is_better: bool = False,
    gain: str | None = None,
    correction: str = "holm",
    family: str = "all",
    eligible: Any = None,
) -> RedlineResult:
    """Certify configs at risk budget alpha and pick the one to deploy.

    Parameters
    ----------
    correct : bool array (m, n)
        ``correct[i, j]``: config i answers prompt j correctly.
    cost : float array (m,)
        Positive cost of each config (e.g. tokens per forward, memory in GB).
    reference : int or str
        Row (or name) of the reference config.
    alpha, delta : float in (0, 1)
        Risk budget and family-wise error level.
    names : sequence of str, optional
        Config names (default ``config0``, ``config1``, ...).
    lower_is_better : bool
        False for throughput-like costs (TPF, APF), True for memory-like costs.
    gain : {"percent", "factor"}, optional
        How gain is reported; default "factor" when lower is better, else "percent".
    correction : {"holm", "bonferroni"}
        The multiple-testing correction.
    family : {"all", "candidates"}
        Which configs form the family of K tests.

        - ``"all"`` (the default, the paper's convention): the reference is tested too.
          Its violation count is 0 by construction, so its p-value is ``(1 - alpha)^n``,
          the smallest of all; it takes Holm's first step at ``delta / m`` and the
          candidates step from ``delta / (m - 1)`` on. This reproduces the published numbers.
        - ``"candidates"``: only the m - 1 other configs are tested (K = m - 1), so the
          candidates' thresholds start at ``delta / (m - 1)`` whatever the reference's
          p-value: never less powerful, same guarantee. The two agree whenever
          ``(1 - alpha)^n <= delta / m``; "candidates" certifies more only with very few
          prompts. The reference gets NaN p-values and ``valid = False``.
    eligible : bool array (m,), optional
        Configs that may be deployed (default all). The reference is always eligible.

    Selection: the deployed config has the best cost among the valid eligible configs and
    the reference; the reference wins a tie (a candidate must be strictly better), and the
    first listed wins a tie between candidates. A valid config whose cost is not better
    than the reference's is therefore never deployed.

    Returns
    -------
    RedlineResult
    """
    alpha = open_unit("alpha", alpha)
    prob = _problem(correct, cost, reference, delta, names, lower_is_better, gain, correction, family, eligible)
    return _results(prob, np.array([alpha]))[0]


def certify_counts(
    violations: Any,
    n: int,
    cost: Any,
    reference: int | str,
    alpha: float,
    delta: float = 0.10,
    *,
    accuracy: Any = None,
    names: Sequence[str] | None = None,
    lower_is_better: bool = False,
    gain: str | None = None,
    correction: str = "holm",
    family: str = "all",
    eligible: Any = None,
) -> RedlineResult:
    """:func:`certify` from violation counts instead of the outcome matrix.

    For when the counts are all that is known, or bounds that decide the test (the gate's
    early stopping, :mod:`pytest_redline.schedule`). ``violations`` holds one count in
    [0, n] per config; ``accuracy`` (optional, one fraction per config) only feeds the
    reported accuracy and net accuracy (NaN without it). The other arguments are
    :func:`certify`'s.

    >>> certify_counts([0, 3, 40], 300, [1.0, 1.5, 2.0], 0, 0.05).valid.tolist()
    [True, True, False]
    """
    alpha = open_unit("alpha", alpha)
    n = positive_int("n", n)
    v = _counts("violations", violations, n)
    if v.ndim != 1 or v.size < 1:
        raise ValueError(f"violations ({violations!r}) must be a non-empty 1-d sequence of counts.")
    m = v.size
    names, reference = _names_and_reference(names, reference, m, "violation count")
    acc = np.full(m, np.nan) if accuracy is None else np.asarray(accuracy, dtype=float)
    if acc.shape != (m,):
        raise ValueError(f"accuracy ({accuracy!r}) must hold {m} fractions, one per config.")
    prob = _counts_problem(v, acc, n, cost, reference, delta, names, lower_is_better, gain, correction, family, eligible)
    return _results(prob, np.array([alpha]))[0]


def _alpha_grid(alphas: Any) -> np.ndarray:
    grid = np.atleast_1d(np.asarray(alphas, dtype=float))
    if grid.ndim != 1 or grid.size == 0:
        raise ValueError(f"alphas ({alphas!r}) must be a non-empty 1-d sequence.")
    for a in grid:
        open_unit("alphas", a)
    return grid


def sweep(
    correct: Any,
    cost: Any,
    reference: int | str,
    alphas: Sequence[float] = DEFAULT_ALPHAS,
    delta: float = 0.10,
    **options: Any,
) -> list[RedlineResult]:
    """:func:`certify` at each alpha of ``alphas`` (the p-values of all alphas in one array)."""
    grid = _alpha_grid(alphas)
    prob = _problem(correct, cost, reference, delta, **_options(options))
    return _results(prob, grid)


def alpha_min(
    correct: Any,
    cost: Any,
    reference: int | str,
    delta: float = 0.10,
    alphas: Sequence[float] = DEFAULT_ALPHAS,
    **options: Any,
) -> float | None:
    """The smallest alpha of ``alphas`` at which a config other than the reference is deployed.

    None when the reference is deployed at every alpha of the grid (0.01, ..., 0.30 by
    default). Takes the options of :func:`certify`.
    """
    return alpha_min_of(sweep(correct, cost, reference, alphas, delta, **options))


def alpha_min_of(results: Sequence[RedlineResult]) -> float | None:
    """The first alpha among ``results`` (a :func:`sweep`, budgets ascending) that deploys
    a config other than the reference; None if there is none."""
    for result in results:
        if result.deployed_index != result.reference_index:
            return result.alpha
    return None


def _options(options: dict[str, Any]) -> dict[str, Any]:
    allowed = {
        "names": None,
        "lower_is_better": False,
        "gain": None,
        "correction": "holm",
        "family": "all",
        "eligible": None,
    }
    unknown = set(options) - set(allowed)
    if unknown:
        raise TypeError(f"unexpected option(s) {sorted(unknown)}; allowed: {sorted(allowed)}.")
    return {**allowed, **options}
