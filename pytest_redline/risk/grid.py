"""A grid's statistics in one pass: the certificate, the reverse family and alpha_min.

The gate's verdict needs all three from the same counts. :func:`certify_grid` checks the
arguments once and computes them together, so that the verdict calls into the statistics
once (the walk of ``verdict.decide``, ``tests/gate/test_verdict_walk.py``). Each figure equals the
public function's (:func:`~pytest_redline.risk.certify_counts`,
:func:`~pytest_redline.risk.exceeds_budget`, :func:`~pytest_redline.risk.alpha_min`);
``tests/risk/test_risk_grid.py`` shows it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from pytest_redline.checks import CORRECTIONS, choice, open_unit, positive_int
from pytest_redline.risk.binomial import _counts, violations as violations_of
from pytest_redline.risk.certification import (
    DEFAULT_ALPHAS,
    GAINS,
    _checked_problem,
    _names_and_reference,
    _results,
    alpha_min_of,
    reaches,
)
from pytest_redline.risk.result import RedlineResult
from pytest_redline.risk.reverse import Reverse, _reverse


@dataclass(frozen=True)
class GridCertificate:
    """``result``: the certificate and the deployment; ``reverse``: the "exceeds budget" family
    beside it; ``alpha_min``: the smallest alpha of the default grid that deploys a candidate
    (None when the whole outcome matrix is unknown, or when no alpha does)."""

    result: RedlineResult
    reverse: Reverse
    alpha_min: float | None


def certify_grid(
    n: int,
    cost: Any,
    reference: int | str,
    alpha: float,
    delta: float,
    *,
    violations: Any = None,
    correct: Any = None,
    seen: Any = None,
    accuracy: Any = None,
    names: Sequence[str] | None = None,
    lower_is_better: bool = False,
    gain: str | None = None,
    correction: str = "holm",
    min_gain: float | None = None,
    ineligible: Sequence[int] = (),
    choose: Callable[[list[int]], int | None] | None = None,
) -> GridCertificate:
    """Certify one grid's configs, test the reverse family and find alpha_min, in one pass.

    - ``correct`` (m x n booleans, optional): the whole outcome matrix, when known. It gives the
      violation counts and accuracy when those are not passed, the reverse family's counts when
      ``seen`` is not, and alpha_min (None without it).
    - ``violations``: the counts the certificate uses (exact, or the bounds that decided early
      stops: :mod:`pytest_redline.schedule`); required without ``correct``.
    - ``seen``: the counts the reverse family uses (for a stopped config, those on the prompts
      it ran on: a lower bound on V); default: ``correct``'s, else ``violations``.
    - ``accuracy``: one fraction per config for the report (NaN without it or ``correct``).
    - ``min_gain``: the configs whose gain over the reference falls short of it may not be
      deployed (the certificate does not change); ``ineligible``: indices that may not be
      deployed either (contenders the cost intervals dropped). The reference always may.
    - ``choose``: given the candidates that may be deployed (valid and eligible, ascending),
      the deployment on exact costs, or None to keep the rule's choice on float costs.

    The other arguments are :func:`~pytest_redline.risk.certify`'s.
    """
    alpha, delta, n = open_unit("alpha", alpha), open_unit("delta", delta), positive_int("n", n)
    correction = choice("correction", correction, CORRECTIONS)
    gain = choice("gain", gain if gain is not None else ("factor" if lower_is_better else "percent"), GAINS)
    full = None if correct is None else np.asarray(correct, dtype=bool)
    if full is not None and (full.ndim != 2 or full.shape[1] != n):
        raise ValueError(f"correct must be a (configs x {n} prompts) array, got shape {full.shape}.")
    if violations is None and full is None:
        raise ValueError("certify_grid needs the violation counts or the outcome matrix (correct).")
    m = len(full) if violations is None else np.size(violations)
    if full is not None and len(full) != m:
        raise ValueError(f"correct has {len(full)} rows but there are {m} violation counts.")
    names, reference = _names_and_reference(names, reference, m, "config")
    full_v = None if full is None else violations_of(full, reference)
    v = full_v if violations is None else _counts("violations", violations, n)
    if v.shape != (m,):
        raise ValueError(f"violations ({violations!r}) must hold {m} counts, one per config.")
    if accuracy is None:
        accuracy = np.full(m, np.nan) if full is None else np.count_nonzero(full, axis=1) / n
    acc = np.asarray(accuracy, dtype=float)
    if acc.shape != (m,):
        raise ValueError(f"accuracy ({accuracy!r}) must hold {m} fractions, one per config.")
    counts = (v if full_v is None else full_v) if seen is None else _counts("seen", seen, n)
    if counts.shape != (m,):
        raise ValueError(f"seen ({seen!r}) must hold {m} counts, one per config.")
    if not all(0 <= i < m for i in ineligible):
        raise ValueError(f"ineligible ({list(ineligible)!r}) must index configs (0 .. {m - 1}).")
    prob = _checked_problem(v, acc, n, cost, reference, delta, names, lower_is_better, gain, correction, "all", None)
    if min_gain is not None:
        enough = reaches(prob.cost, reference, prob.lower_is_better, prob.gain_kind, min_gain)
        prob = dataclasses.replace(prob, deployable=enough | (np.arange(m) == reference))
    alpha_min = None
    if full is not None:
        alphas = np.asarray(DEFAULT_ALPHAS)
        alpha_min = alpha_min_of(_results(dataclasses.replace(prob, violations=full_v, accuracy=np.count_nonzero(full, axis=1) / n), alphas))
    if len(ineligible):
        deployable = prob.deployable.copy()
        deployable[list(ineligible)] = False
        deployable[reference] = True
        prob = dataclasses.replace(prob, deployable=deployable)
    result = _results(prob, np.array([alpha]))[0]
    if choose is not None:
        # With min_gain, choose tests it on the exact costs: it gets every valid eligible candidate.
        allowed = prob.deployable if min_gain is None else np.ones(m, dtype=bool)
        if len(ineligible):
            allowed = allowed.copy()
            allowed[list(ineligible)] = False
        d = choose(np.flatnonzero(result.valid & allowed & (np.arange(m) != reference)).tolist())
        if d is not None and d != result.deployed_index:
            result = dataclasses.replace(result, deployed_index=d, deployed=names[d])
    return GridCertificate(result, _reverse(counts, n, reference, alpha, prob.delta, prob.correction), alpha_min)
