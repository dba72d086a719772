"""Validity: Holm's family-wise error stays at most delta.

An error is declaring valid a config whose true risk exceeds alpha. For independent
configs the probability is computed exactly, by enumerating every vector of violation
counts; for dependent configs (one shared uniform per prompt) by a seeded simulation.
"""
import itertools

import numpy as np
import pytest
from scipy import stats

from pytest_redline import risk

ALPHA, DELTA = 0.2, 0.1


def exact_fwer(n, risks, alpha, delta, correction="holm", family="all"):
    """P(some config with risk > alpha is declared valid), independent configs, exactly.

    Config i's violation count is Bin(n, risks[i]); the reference (row 0, risk 0) has V = 0.
    With family="all" it is tested too, with its p-value (1 - alpha)^n.
    """
    risks = np.asarray(risks)
    null = risks >= alpha  # the supremum of the null "risk > alpha" is attained at alpha
    tested = np.ones(len(risks) + 1, dtype=bool)
    tested[0] = family == "all"
    test = risk.holm if correction == "holm" else risk.bonferroni
    grid = np.array(list(itertools.product(range(n + 1), repeat=len(risks))))
    weights = np.prod(stats.binom.pmf(grid, n, risks), axis=1)
    p = risk.binom_pvalue(np.hstack([np.zeros((len(grid), 1), dtype=int), grid]), n, alpha)
    errors = np.array([np.any(test(row, delta, tested)[1:] & null) for row in p])
    return float(weights[errors].sum())


# (n, risks, alpha, delta): alpha and delta large enough that n prompts can certify m configs.
SCENARIOS = [
    (14, [0.3, 0.3, 0.3], 0.3, 0.2),  # every candidate on the null's boundary
    (14, [0.0, 0.0, 0.3], 0.3, 0.2),  # two sure rejections open Holm's later steps to the null
    (14, [0.0, 0.1, 0.35], 0.3, 0.2),
    (20, [0.0, 0.2], 0.2, 0.1),
    (40, [0.2], 0.2, 0.1),
]


@pytest.mark.parametrize("n, risks, alpha, delta", SCENARIOS)
@pytest.mark.parametrize("family", ["all", "candidates"])
def test_bounded_by_delta_exact_fwer(n, risks, alpha, delta, family):
    fwer = exact_fwer(n, risks, alpha, delta, family=family)
    assert 0 < fwer <= delta  # positive: the scenario can err, so the bound is not vacuous


def test_between_bonferroni_and_delta_exact_fwer():
    """Holm errs at least as often as Bonferroni (it rejects more), and still at most delta."""
    holm = exact_fwer(14, [0.0, 0.0, 0.3], 0.3, 0.2, "holm", "candidates")
    bonf = exact_fwer(14, [0.0, 0.0, 0.3], 0.3, 0.2, "bonferroni", "candidates")
    assert 0 < bonf < holm <= 0.2


def simulate_fwer(dependence, n=150, reps=3000, seed=20260, risks=(0.0, 0.05, 0.2, 0.2, 0.2)):
    """Monte-Carlo FWER with one shared uniform U_j per prompt j.

    Config i is wrong on prompt j when U_j falls in its interval of length risks[i]:
    ``[0, r_i)`` for every config under positive dependence (violations nest), and
    disjoint intervals laid end to end under negative dependence (violations exclude
    each other). The reference is always right, so the risk is exactly r_i.
    """
    rng = np.random.default_rng(seed)
    risks = np.asarray(risks)
    starts = np.zeros_like(risks) if dependence == "positive" else np.concatenate(([0.0], np.cumsum(risks)[:-1]))
    assert starts[-1] + risks[-1] <= 1
    null = risks >= ALPHA
    cost = np.arange(1.0, len(risks) + 2)
    errors = 0
    for _ in range(reps):
        u = rng.random(n)
        wrong = (u >= starts[:, None]) & (u < (starts + risks)[:, None])
        correct = np.vstack([np.ones((1, n), dtype=bool), ~wrong])
        valid = risk.certify(correct, cost, 0, ALPHA, DELTA).valid[1:]
        errors += bool(np.any(valid & null))
    return errors / reps


@pytest.mark.parametrize("dependence", ["positive", "negative"])
def test_bounded_by_delta_simulated_fwer(dependence):
    reps = 3000
    fwer = simulate_fwer(dependence, reps=reps)
    standard_error = np.sqrt(DELTA * (1 - DELTA) / reps)
    assert fwer <= DELTA + 3 * standard_error
