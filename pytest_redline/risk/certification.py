"""Certification: validate a problem, test every config at each alpha, and pick the config
to deploy (:func:`certify`, :func:`certify_counts`, :func:`sweep`, :func:`alpha_min`)."""
from __future__ import annotations

import math
import numbers
import operator
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Sequence

import numpy as np

from pytest_redline.checks import CORRECTIONS, FAMILIES, choice, open_unit, positive_int
from pytest_redline.risk.binomial import _counts, _cp_upper, lower_tail, violations
from pytest_redline.risk.corrections import (
    _bonferroni_adjusted_rows,
    _holm_adjusted_rows,
    family_mask,
    reject_rows,
)
from pytest_redline.risk.result import RedlineResult

#: The alpha grid of alpha_min: 0.01, 0.02, ..., 0.30.
DEFAULT_ALPHAS = tuple(round(0.01 * i, 2) for i in range(1, 31))

GAINS = ("percent", "factor")


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
    delta = open_unit("delta", delta)
    correction = choice("correction", correction, CORRECTIONS)
    family = choice("family", family, FAMILIES)
    gain = choice("gain", gain if gain is not None else ("factor" if lower_is_better else "percent"), GAINS)
    return _checked_problem(v, accuracy, n, cost, reference, delta, names, lower_is_better, gain, correction, family, eligible)


def _checked_problem(v, accuracy, n, cost, reference, delta, names, lower_is_better, gain, correction, family, eligible) -> _Problem:
    """:func:`_counts_problem` once delta, the correction, the family and the gain are checked."""
    m = len(names)
    cost = np.asarray(cost, dtype=float)
    if cost.shape != (m,) or not np.all(np.isfinite(cost)) or not np.all(cost > 0):
        raise ValueError(f"cost ({cost!r}) must hold {m} positive finite numbers, one per config.")
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
    p = lower_tail(prob.violations[None, :], prob.n, alphas[:, None])
    valid = reject_rows(p, prob.delta, tested, prob.correction)
    if prob.correction == "holm":
        adjusted = _holm_adjusted_rows(p, tested)
    else:
        adjusted = _bonferroni_adjusted_rows(p, tested)
    p = np.where(tested, p, np.nan)

    score = -prob.cost if prob.lower_is_better else prob.cost
    gain = gains(prob.cost, ref, prob.lower_is_better, prob.gain_kind)
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


def gains(cost: Any, reference: int, lower_is_better: bool, gain_kind: str) -> np.ndarray:
    """Each config's gain over the reference: a percentage (``"percent"``: 37.5 means +37.5 %)
    or a factor (``"factor"``: 2.81 means 2.81x better, e.g. 2.81x less memory).

    >>> gains([2.0, 3.0], 0, False, "percent").tolist()
    [0.0, 50.0]
    >>> gains([8.0, 2.0], 0, True, "factor").tolist()
    [1.0, 4.0]
    """
    cost = np.asarray(cost, dtype=float)
    ratio = cost[reference] / cost if lower_is_better else cost / cost[reference]
    return 100.0 * (ratio - 1.0) if gain_kind == "percent" else ratio


def reaches(cost: Any, reference: int, lower_is_better: bool, gain_kind: str, min_gain: Any) -> np.ndarray:
    """Whether each config's gain over the reference is at least ``min_gain``, exactly: every
    number read as written (a float as the shortest decimal that gives it back, so 16.0 / 6.4
    is exactly 2.5), then compared in Fractions. A config with no gain (NaN cost, a zero
    reference) does not reach it.

    >>> reaches([4.5, 2.5], 0, True, "factor", 1.8).tolist()  # the reference gains a factor of 1
    [False, True]
    >>> reaches([2.0, 2.5, 2.4], 0, False, "percent", 25).tolist()
    [False, True, False]
    """
    costs = np.asarray(cost, dtype=float).tolist()
    want, ref = _written(min_gain), costs[reference]
    out = []
    for x in costs:
        top, bottom = (ref, x) if lower_is_better else (x, ref)
        if math.isnan(top) or math.isnan(bottom) or math.isinf(top) or math.isinf(bottom):
            with np.errstate(divide="ignore", invalid="ignore"):  # what the float gain says
                ratio = np.float64(top) / np.float64(bottom)
            gain = 100 * (ratio - 1) if gain_kind == "percent" else ratio
            out.append(bool(gain >= float(want)))
        elif bottom == 0:  # nothing spent against something (an unbounded gain), or 0 / 0 (none)
            out.append(top > 0)
        else:
            ratio = _written(top) / _written(bottom)
            out.append((100 * (ratio - 1) if gain_kind == "percent" else ratio) >= want)
    return np.array(out, dtype=bool)


def _written(x: Any) -> Fraction:
    """A number as written: ints and Fractions as they are, a float as ``Fraction(repr(x))``."""
    if isinstance(x, (Fraction, numbers.Integral)):
        return Fraction(x)
    return Fraction(repr(float(x)))


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

    Selection: the deployed config has the best cost among the valid eligible configs and
    the reference; the reference wins a tie (a candidate must be strictly better), and the
    first listed wins a tie between candidates. A valid config whose cost is not better
    than the reference's is therefore never deployed.

    The family (``family``): with ``"all"`` (the default, the paper's convention) the reference
    is tested too. Its violation count is 0 by construction, so its p-value is
    ``(1 - alpha)^n``, the smallest of all; it takes Holm's first step at ``delta / m`` and the
    candidates step from ``delta / (m - 1)`` on. This reproduces the published numbers. With
    ``"candidates"`` only the m - 1 other configs are tested (K = m - 1), so the candidates'
    thresholds start at ``delta / (m - 1)`` whatever the reference's p-value: never less
    powerful, same guarantee. The two agree whenever ``(1 - alpha)^n <= delta / m``;
    "candidates" certifies more only with very few prompts. The reference then gets NaN
    p-values and ``valid = False``.

    :param correct: a bool array (m, n); ``correct[i, j]``: config i answers prompt j correctly.
    :param cost: a float array (m,): the positive cost of each config (e.g. tokens per forward,
        memory in GB).
    :param reference: the row (an int) or name (a str) of the reference config.
    :param alpha: the risk budget in (0, 1).
    :param delta: the family-wise error level in (0, 1).
    :param names: config names (default ``config0``, ``config1``, ...).
    :param lower_is_better: False for throughput-like costs (TPF, APF), True for memory-like costs.
    :param gain: ``"percent"`` or ``"factor"``: how gain is reported; default ``"factor"`` when
        lower is better, else ``"percent"``.
    :param correction: ``"holm"`` or ``"bonferroni"``: the multiple-testing correction.
    :param family: ``"all"`` or ``"candidates"``: which configs form the family of K tests (above).
    :param eligible: a bool array (m,) of the configs that may be deployed (default all). The
        reference is always eligible.
    :returns: the :class:`RedlineResult`.
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
