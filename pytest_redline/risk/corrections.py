"""Multiple testing: Holm's step-down and Bonferroni at family-wise level delta, their
adjusted p-values, and the family of tested configs."""
from __future__ import annotations

from typing import Any

import numpy as np

from pytest_redline.checks import open_unit


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
