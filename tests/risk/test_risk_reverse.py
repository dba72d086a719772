"""The reverse test ("exceeds budget") and the three statuses: against scipy and statsmodels,
and the family-wise error of the "exceeds budget" claims computed exactly.

The exact error: a grid's prompts are i.i.d. draws of a correctness *pattern* (which of the
reference and 2-3 candidates answer correctly), with hypothesis-drawn pattern probabilities
(candidates at R = alpha exactly among them). The counts of the patterns over n prompts are
multinomial, and the violation vector (V_1, ..., V_K) is a function of them; summing the
multinomial by that vector (a convolution over the prompts, exact up to float rounding) gives
its distribution, checked against the literal enumeration of every multinomial outcome for
small n. The error is the probability that some candidate with R <= alpha is said to exceed.
"""
from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from pytest_redline import risk
from pytest_redline.risk.corrections import reject_rows
from pytest_redline.planning import reverse_power, reverse_prompts_needed
from pytest_redline.risk.reverse import upper_tail

ALPHAS = (Fraction(1, 20), Fraction(1, 10), Fraction(1, 5), Fraction(1, 4))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 400), st.data())
def test_reverse_pvalue_is_scipys_upper_tail(n: int, data) -> None:
    v = data.draw(st.integers(0, n))
    alpha = data.draw(st.floats(0.001, 0.999))
    assert risk.reverse_pvalue(v, n, alpha) == pytest.approx(
        stats.binomtest(v, n, alpha, alternative="greater").pvalue, rel=1e-9, abs=1e-300)


def test_holm_over_the_candidates_matches_statsmodels() -> None:
    from statsmodels.stats.multitest import multipletests

    v, n = [0, 30, 12, 26, 9], 150
    rev = risk.exceeds_budget(v, n, 0, 0.1, 0.1)
    p = [stats.binomtest(k, n, 0.1, alternative="greater").pvalue for k in v[1:]]
    reject, adjusted, _, _ = multipletests(p, alpha=0.1, method="holm")
    assert np.isnan(rev.p_values[0]) and not rev.exceeds[0]
    np.testing.assert_allclose(rev.p_adjusted[1:], adjusted, rtol=1e-9)
    assert rev.exceeds[1:].tolist() == reject.tolist() == [True, False, True, False]
    bonf = risk.exceeds_budget(v, n, 0, 0.1, 0.1, "bonferroni")
    np.testing.assert_allclose(bonf.p_adjusted[1:], np.minimum(1, 4 * np.array(p)), rtol=1e-9)


def _scan(alpha: float, true_risk: float, m: int, delta: float, power: float, top: int) -> int:
    """The reverse sample size by brute force with scipy: every n up to ``top``, every V."""
    level = delta / (m - 1)
    powers = []
    for n in range(1, top + 1):
        tail = stats.binom.sf(np.arange(n + 1) - 1, n, alpha)  # P[Bin >= V], V = 0..n
        ok = np.flatnonzero(tail <= level)
        powers.append(stats.binom.sf(ok[0] - 1, n, true_risk) if ok.size else 0.0)
    failing = np.flatnonzero(np.array(powers) < power)
    return int(failing[-1]) + 2


@pytest.mark.parametrize("alpha, true_risk, m, delta", [(0.05, 0.10, 8, 0.1), (0.1, 0.2, 3, 0.05), (0.2, 0.35, 5, 0.1)])
def test_reverse_prompts_needed_is_the_brute_force_scan(alpha: float, true_risk: float, m: int, delta: float) -> None:
    needed = reverse_prompts_needed(alpha, true_risk, m, delta)
    assert needed == _scan(alpha, true_risk, m, delta, 0.8, 3 * needed)
    n = np.arange(needed, 3 * needed)
    assert (reverse_power(n, alpha, true_risk, delta / (m - 1)) >= 0.8).all()
    assert reverse_power(needed - 1, alpha, true_risk, delta / (m - 1)) < 0.8


def test_reverse_prompts_needed_refuses_a_risk_within_the_budget() -> None:
    with pytest.raises(ValueError, match="must exceed alpha"):
        reverse_prompts_needed(0.1, 0.1, 4)


# --------------------------------------------------------------------------- never both


@settings(max_examples=80, deadline=None)
@given(st.integers(2, 5), st.integers(1, 60), st.data())
def test_never_both_certified_and_exceeds(m: int, n: int, data) -> None:
    """For delta < 1/2 the two tails cannot both be small; for any delta the status says one thing."""
    correct = np.array(data.draw(st.lists(st.lists(st.booleans(), min_size=n, max_size=n), min_size=m, max_size=m)))
    alpha = data.draw(st.floats(0.01, 0.5))
    delta = data.draw(st.floats(0.001, 0.4999))
    correction = data.draw(st.sampled_from(["holm", "bonferroni"]))
    result = risk.certify(correct, np.ones(m), 0, alpha, delta, correction=correction)
    rev = risk.exceeds_budget(result.violations, n, 0, alpha, delta, correction)
    assert not (result.valid & rev.exceeds).any()
    wide = risk.exceeds_budget(result.violations, n, 0, alpha, 0.9, correction)
    both = risk.certify(correct, np.ones(m), 0, alpha, 0.9, correction=correction).valid
    status = risk.statuses(both, wide.exceeds)
    assert all((s == risk.CERTIFIED) == bool(ok) for s, ok in zip(status, both))


# --------------------------------------------------------------------------- exact error


def _patterns(k: int) -> np.ndarray:
    """Every correctness pattern of the reference (column 0) and k candidates."""
    return np.array(list(itertools.product([False, True], repeat=k + 1)))


@st.composite
def _pattern_law(draw):
    """Pattern probabilities (exact fractions) and each candidate's risk: some at alpha exactly,
    some below, at most one above (where a claim is not an error)."""
    k = draw(st.integers(2, 3))
    alpha = draw(st.sampled_from(ALPHAS))
    pats = _patterns(k)
    weights = [draw(st.integers(1, 9)) if p[0] else draw(st.integers(0, 3)) for p in pats]
    law = {tuple(p): Fraction(w, sum(weights)) for p, w in zip(pats, weights)}  # P(reference right) >= 1/4 >= alpha
    kinds = draw(st.lists(st.sampled_from(["at", "at", "below"]), min_size=k, max_size=k))
    if draw(st.booleans()):
        kinds[draw(st.integers(0, k - 1))] = "above"
    for i, kind in enumerate(kinds, start=1):
        right = sum(q for p, q in law.items() if p[0])
        target = {"at": alpha, "below": alpha * Fraction(draw(st.integers(0, 9)), 10),
                  "above": min(right, alpha * Fraction(draw(st.integers(11, 30)), 10))}[kind]
        law = _set_risk(law, i, target)
    return k, alpha, law


def _set_risk(law: dict, i: int, target: Fraction) -> dict:
    """Move mass between each pattern and its twin with candidate i's bit flipped (reference
    right only), so that candidate i's risk is exactly ``target``; the others' are unchanged."""
    risk_i = sum(q for p, q in law.items() if p[0] and not p[i])
    right = sum(q for p, q in law.items() if p[0])
    out = dict(law)
    for p, q in law.items():
        if not p[0] or p[i]:
            continue
        twin = p[:i] + (True,) + p[i + 1:]
        if target <= risk_i:  # some of the wrong become right
            move = q * (1 - target / risk_i) if risk_i else 0
            out[p], out[twin] = out[p] - move, out[twin] + move
    if target > risk_i:  # some of the right become wrong
        share = (target - risk_i) / (right - risk_i)
        for p, q in law.items():
            if p[0] and p[i]:
                twin = p[:i] + (False,) + p[i + 1:]
                out[p], out[twin] = out[p] - q * share, out[twin] + q * share
    assert sum(q for p, q in out.items() if p[0] and not p[i]) == target and sum(out.values()) == 1
    return out


def _violation_law(law: dict, k: int, n: int) -> np.ndarray:
    """P[(V_1, ..., V_k) = v] over n prompts: the multinomial summed by the violation vector."""
    step: dict[tuple, float] = {}
    for p, q in law.items():
        d = tuple(bool(p[0] and not p[i]) for i in range(1, k + 1))
        step[d] = step.get(d, 0.0) + float(q)
    dist = np.zeros((n + 1,) * k)
    dist[(0,) * k] = 1.0
    for _ in range(n):
        new = np.zeros_like(dist)
        for d, q in step.items():
            to = tuple(slice(1, n + 1) if x else slice(None) for x in d)  # a violating prompt adds 1 to V_i
            new[to] += q * dist[tuple(slice(0, n) if x else slice(None) for x in d)]
        dist = new
    return dist


def _literal(law: dict, k: int, n: int) -> np.ndarray:
    """The same distribution by enumerating every multinomial outcome (pattern counts)."""
    pats = list(law)
    dist = np.zeros((n + 1,) * k)
    for counts in _compositions(n, len(pats)):
        prob = math.factorial(n)
        for c, p in zip(counts, pats):
            prob = prob * law[p] ** c / math.factorial(c)
        v = tuple(sum(c for c, p in zip(counts, pats) if p[0] and not p[i]) for i in range(1, k + 1))
        dist[v] += float(prob)
    return dist


def _compositions(n: int, parts: int):
    if parts == 1:
        yield (n,)
        return
    for first in range(n + 1):
        for rest in _compositions(n - first, parts - 1):
            yield (first,) + rest


def _error(dist: np.ndarray, n: int, alpha: float, delta: float, correction: str, null: np.ndarray) -> float:
    """P(some candidate whose null holds is said to exceed), through the gate's rejection rule."""
    k = dist.ndim
    v = np.indices(dist.shape).reshape(k, -1).T  # every violation vector
    p = np.column_stack([np.ones(len(v)), upper_tail(v, n, alpha)])  # column 0: the reference (untested)
    tested = np.r_[False, np.ones(k, dtype=bool)]
    exceeds = reject_rows(p, delta, tested, correction)[:, 1:]
    for row in (0, len(v) // 2, len(v) - 1):  # the vectorized rule is exceeds_budget's
        one = risk.exceeds_budget(np.r_[0, v[row]], n, 0, alpha, delta, correction).exceeds[1:]
        assert one.tolist() == exceeds[row].tolist()
    return float(dist.reshape(-1)[(exceeds & null).any(axis=1)].sum())


def test_violation_law_is_the_literal_multinomial() -> None:
    law = _set_risk(_set_risk({tuple(p): Fraction(1, 16) for p in _patterns(3)}, 1, Fraction(1, 10)), 2, Fraction(1, 4))
    np.testing.assert_allclose(_violation_law(law, 3, 4), _literal(law, 3, 4), atol=1e-15)


@settings(max_examples=40, deadline=None)
@given(_pattern_law(), st.integers(1, 12), st.sampled_from([0.05, 0.1, 0.2, 0.3, 0.45]), st.sampled_from(["holm", "bonferroni"]))
def test_exceeds_budget_family_wise_error_is_at_most_delta(case, n: int, delta: float, correction: str) -> None:
    k, alpha, law = case
    risks = [sum(q for p, q in law.items() if p[0] and not p[i]) for i in range(1, k + 1)]
    null = np.array([r <= alpha for r in risks])
    dist = _violation_law(law, k, n)
    assert dist.sum() == pytest.approx(1.0, abs=1e-12)
    if n <= 3:
        np.testing.assert_allclose(dist, _literal(law, k, n), atol=1e-14)
    assert _error(dist, n, float(alpha), delta, correction, null) <= delta + 1e-12
