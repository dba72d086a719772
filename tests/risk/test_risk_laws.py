"""Hypothesis property tests: the statistical laws of pytest_redline.risk, one per test."""
import numpy as np
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy import stats
from statsmodels.stats.multitest import multipletests

from pytest_redline import risk
from pytest_redline.risk import binomial, corrections

alphas = st.floats(min_value=1e-9, max_value=1 - 1e-9)
deltas = st.floats(min_value=1e-6, max_value=0.999)
# p-values drawn partly from a small set, so ties are common.
p_values = st.lists(st.one_of(st.sampled_from([0.0, 0.01, 0.02, 0.05, 0.5, 1.0]), st.floats(0, 1)), min_size=1, max_size=12)


@st.composite
def counts(draw, max_n=3000):
    """(v, n) with 0 <= v <= n."""
    n = draw(st.integers(min_value=1, max_value=max_n))
    v = draw(st.integers(min_value=0, max_value=n))
    return v, n


@st.composite
def problems(draw, max_m=6, max_n=60):
    """(correct, cost, reference): an m x n outcome matrix, costs with ties, a reference row."""
    m = draw(st.integers(min_value=1, max_value=max_m))
    n = draw(st.integers(min_value=1, max_value=max_n))
    correct = draw(arrays(bool, (m, n)))
    cost = np.array(draw(st.lists(st.sampled_from([1.0, 1.5, 2.0, 3.0, 5.0]), min_size=m, max_size=m)))
    reference = draw(st.integers(min_value=0, max_value=m - 1))
    return correct, cost, reference


# --------------------------------------------------------------------------- p-values


@given(counts(), alphas)
@example((0, 1), 0.5)
@example((0, 100), 1e-12)
@example((100, 100), 1 - 1e-12)
def test_monotone_in_v_binom_pvalue(vn, alpha):
    v, n = vn
    p = risk.binom_pvalue(np.arange(n + 1), n, alpha)
    assert np.all(np.diff(p) >= 0)
    assert np.all((0 <= p) & (p <= 1))
    assert p[v] == risk.binom_pvalue(v, n, alpha)


@given(counts(), alphas, alphas)
@example((0, 50), 1e-12, 1 - 1e-12)
@example((50, 50), 0.3, 0.6)
def test_monotone_in_alpha_binom_pvalue(vn, a1, a2):
    v, n = vn
    lo, hi = sorted((a1, a2))
    assert risk.binom_pvalue(v, n, hi) <= risk.binom_pvalue(v, n, lo)


@given(counts(max_n=400), alphas, st.floats(min_value=0, max_value=1))
@example((0, 10), 0.1, 0.1)
@example((3, 3), 0.5, 0.125)
def test_exact_binom_pvalue(vn, alpha, u):
    """Under R = alpha, P(p <= u) <= u: the pmf summed over the counts whose p-value is <= u."""
    _, n = vn
    k = np.arange(n + 1)
    rejected = risk.binom_pvalue(k, n, alpha) <= u
    assert stats.binom.pmf(k[rejected], n, alpha).sum() <= u * (1 + 1e-9) + 1e-300


@given(counts(), alphas)
@example((0, 1), 0.5)
@example((0, 1012), 0.05)
@example((1012, 1012), 0.05)
@example((3, 10), 1e-9)
@example((3, 10), 1 - 1e-9)
@example((27, 478), 0.796875)  # 1.343e-271: scipy.stats already off by 5e-9 relative there
def test_equivalent_binom_pvalue_binomtest(vn, alpha):
    v, n = vn
    expected = stats.binomtest(v, n, alpha, alternative="less").pvalue
    # scipy.stats loses digits below ~1e-260; ours stays exact there (see test_risk.py).
    assert risk.binom_pvalue(v, n, alpha) == pytest.approx(expected, rel=1e-9, abs=1e-260)


@given(counts(max_n=100_000), alphas)
@example((0, 100_000), 0.3)
@example((1000, 10_000), 0.3)
def test_consistent_binom_logpvalue(vn, alpha):
    """log p matches log of p wherever p is a normal double, and is finite where p underflows."""
    v, n = vn
    log_p, p = risk.binom_logpvalue(v, n, alpha), risk.binom_pvalue(v, n, alpha)
    assert np.isfinite(log_p) and log_p <= 0
    if p > 1e-300:
        assert log_p == pytest.approx(np.log(p), rel=1e-9, abs=1e-12)
    else:
        assert log_p < np.log(1e-300) + 1e-6


# --------------------------------------------------------------------------- corrections


@given(p_values, deltas)
@example([0.05], 0.05)
@example([0.02, 0.02, 0.02], 0.06)
def test_superset_of_bonferroni_holm(p, delta):
    h, b = risk.holm(p, delta), risk.bonferroni(p, delta)
    assert np.all(h[b])


@given(p_values, deltas)
@example([0.0], 0.5)
def test_subset_of_unadjusted_holm(p, delta):
    h = risk.holm(p, delta)
    assert np.all(np.asarray(p)[h] <= delta)


@given(p_values, deltas, st.randoms(use_true_random=False))
@example([0.01, 0.01, 0.04], 0.1, __import__("random").Random(0))
def test_order_invariant_holm(p, delta, rnd):
    perm = list(range(len(p)))
    rnd.shuffle(perm)
    permuted = [p[i] for i in perm]
    assert np.array_equal(risk.holm(permuted, delta), risk.holm(p, delta)[perm])
    assert np.array_equal(risk.holm_adjusted(permuted), risk.holm_adjusted(p)[perm])


@pytest.mark.slow  # over 5 s (the other risk laws stay in the inner loop)
@settings(max_examples=15)  # each multipletests call runs gc.collect(): about 0.1 s
@given(p_values, deltas)
@example([0.02, 0.02, 0.02], 0.06)
@example([1.0], 0.1)
@example([0.0, 0.0], 0.1)
@example([0.5, 0.01, 0.03, 0.03, 1.0, 0.0], 0.1)
def test_equivalent_holm_statsmodels(p, delta):
    reject, adjusted, _, _ = multipletests(p, alpha=delta, method="holm")
    assert np.array_equal(risk.holm(p, delta), reject)
    # ours is the smallest level at which holm rejects: p * K up to an ulp (subnormals: atol)
    assert np.allclose(risk.holm_adjusted(p), adjusted, rtol=1e-15, atol=1e-300)


@given(p_values, deltas)
@example([0.23 / 3, 1.0, 1.0], 0.23)  # 3 * (0.23 / 3) = 0.23000000000000004 > 0.23, yet holm rejects
@example([0.1 / 7, 0.1 / 6, 0.5], 0.1)
def test_equivalent_holm_adjusted_threshold(p, delta):
    """Holm rejects exactly where the adjusted p-value is at most delta, at the boundary too."""
    assert np.array_equal(risk.holm(p, delta), risk.holm_adjusted(p) <= delta)


@given(p_values, deltas)
@example([0.23 / 3, 1.0, 1.0], 0.23 / 3)
def test_equivalent_bonferroni_adjusted_threshold(p, delta):
    """Bonferroni rejects exactly where its adjusted p-value (the report's p_adj) is at most delta."""
    adjusted = corrections._bonferroni_adjusted_rows(np.asarray(p, dtype=float), np.ones(len(p), dtype=bool))
    assert np.array_equal(risk.bonferroni(p, delta), adjusted <= delta)


@given(p_values)
def test_monotone_holm_adjusted(p):
    p = np.asarray(p)
    adjusted = risk.holm_adjusted(p)
    assert np.all(adjusted >= p) and np.all(adjusted <= 1)
    order = np.argsort(p, kind="stable")
    assert np.all(np.diff(adjusted[order]) >= 0)


# --------------------------------------------------------------------------- certification


def certify(problem, alpha, delta=0.1, **options):
    correct, cost, reference = problem
    return risk.certify(correct, cost, reference, alpha, delta, **options)


@given(problems(), alphas, alphas, st.sampled_from(["holm", "bonferroni"]), st.sampled_from(["all", "candidates"]))
def test_monotone_in_alpha_valid_set(problem, a1, a2, correction, family):
    lo, hi = sorted((a1, a2))
    small = certify(problem, lo, correction=correction, family=family)
    large = certify(problem, hi, correction=correction, family=family)
    assert np.all(large.valid[small.valid])


@given(problems(), alphas, deltas, st.booleans(), st.sampled_from(["all", "candidates"]))
@example((np.ones((1, 3), dtype=bool), np.array([1.0]), 0), 0.5, 0.1, False, "all")  # m = 1
@example((np.zeros((2, 2), dtype=bool), np.array([1.0, 1.0]), 1), 0.5, 0.5, False, "all")  # a tie, reference last
def test_best_valid_or_reference_deployed(problem, alpha, delta, lower, family):
    result = certify(problem, alpha, delta, lower_is_better=lower, family=family)
    d, ref = result.deployed_index, result.reference_index
    assert d == ref or result.valid[d]
    better = result.cost < result.cost[d] if lower else result.cost > result.cost[d]
    assert not np.any(better & result.valid) and not better[ref]
    # The reference wins a tie with it (a candidate must be strictly better); else the first listed.
    assert d == ref or result.cost[d] != result.cost[ref]
    if d != ref:
        assert not np.any(result.valid[:d] & (result.cost[:d] == result.cost[d]))


@given(problems(), alphas, st.booleans())
@example((np.ones((2, 5), dtype=bool), np.array([2.0, 2.0]), 1), 0.3, False)  # a tie, the reference listed last
def test_reference_wins_cost_tie(problem, alpha, lower):
    """A valid candidate whose cost ties the reference's is never deployed; alpha_min is then None."""
    correct, cost, reference = problem
    tied = np.full_like(np.asarray(cost, dtype=float), float(np.asarray(cost)[reference]))
    result = risk.certify(correct, tied, reference, alpha, lower_is_better=lower)
    assert result.deployed_index == reference
    assert risk.alpha_min(correct, tied, reference, lower_is_better=lower) is None


@given(problems(), st.data())
def test_ignores_reference_wrong_prompts_violations(problem, data):
    correct, cost, reference = problem
    wrong = np.flatnonzero(~correct[reference])
    assume(wrong.size and correct.shape[0] > 1)
    j = data.draw(st.sampled_from(list(wrong)))
    i = data.draw(st.sampled_from([r for r in range(correct.shape[0]) if r != reference]))
    flipped = correct.copy()
    flipped[i, j] = ~flipped[i, j]
    before = risk.certify(correct, cost, reference, 0.2)
    after = risk.certify(flipped, cost, reference, 0.2)
    assert np.array_equal(before.violations, after.violations)
    assert np.array_equal(before.p_values, after.p_values)
    assert np.array_equal(before.valid, after.valid) and before.deployed == after.deployed


@given(problems(), alphas)
def test_zero_risk_reference_certify(problem, alpha):
    result = certify(problem, alpha)
    ref = result.reference_index
    assert result.violations[ref] == 0 and result.risk[ref] == 0
    assert result.p_values[ref] == pytest.approx((1 - alpha) ** result.n, rel=1e-9, abs=1e-300)


@given(problems(), alphas, deltas)
def test_more_powerful_candidates_family(problem, alpha, delta):
    """Leaving the reference out of the family never loses a valid candidate."""
    every = certify(problem, alpha, delta, family="all")
    cands = certify(problem, alpha, delta, family="candidates")
    others = np.arange(every.m) != every.reference_index
    assert np.all(cands.valid[others][every.valid[others]])


@given(problems(), alphas)
def test_bounded_risk_upper(problem, alpha):
    result = certify(problem, alpha)
    assert np.all(result.risk <= result.risk_upper) and np.all(result.risk_upper <= 1)


@given(problems(max_m=4, max_n=30), st.lists(alphas, min_size=1, max_size=5))
def test_equivalent_sweep_certify(problem, grid):
    correct, cost, reference = problem
    for swept in risk.sweep(correct, cost, reference, grid):
        single = risk.certify(correct, cost, reference, swept.alpha)
        assert np.array_equal(swept.valid, single.valid) and swept.deployed == single.deployed


@given(problems(max_m=4, max_n=40))
def test_smallest_deploying_alpha_min(problem):
    correct, cost, reference = problem
    found = risk.alpha_min(correct, cost, reference)
    deployed_other = [
        r.alpha for r in risk.sweep(correct, cost, reference) if r.deployed_index != r.reference_index
    ]
    assert found == (deployed_other[0] if deployed_other else None)


# --------------------------------------------------------------------------- bounds and power


@given(counts(), st.floats(min_value=0.5, max_value=0.999))
@example((0, 1), 0.9)
@example((5, 5), 0.9)
def test_monotone_clopper_pearson_upper(vn, level):
    v, n = vn
    upper = risk.clopper_pearson_upper(np.arange(n + 1), n, level)
    assert np.all(np.diff(upper) >= 0) and upper[-1] == 1.0
    assert upper[v] >= v / n


@given(counts(max_n=2000), st.floats(min_value=0.5, max_value=0.999))
@example((0, 10), 0.95)
@example((10, 10), 0.95)
def test_equivalent_clopper_pearson_binomtest(vn, confidence):
    v, n = vn
    ci = risk.clopper_pearson_interval(v, n, confidence)
    expected = stats.binomtest(v, n, 0.5).proportion_ci(confidence, method="exact")
    assert ci.low == pytest.approx(expected.low, abs=1e-9) and ci.high == pytest.approx(expected.high, abs=1e-9)


@given(st.integers(min_value=1, max_value=5000), alphas, st.floats(min_value=1e-6, max_value=0.999))
@example(1, 0.5, 0.4)
@example(5, 0.01, 0.01)
def test_largest_passing_critical_count(n, alpha, level):
    k = risk.critical_count(n, alpha, level)
    assert -1 <= k < n
    if k >= 0:
        assert risk.binom_pvalue(k, n, alpha) <= level
    assert risk.binom_pvalue(k + 1, n, alpha) > level


def _critical_by_bisection(n, alpha, level):
    """The critical counts as risk computed them before (a bisection on the p-value)."""
    n = np.asarray(n, dtype=np.int64)
    lo, hi = np.full(n.shape, -1, dtype=np.int64), n.copy()
    while np.any(hi - lo > 1):
        mid = (lo + hi) // 2
        passes = binomial.lower_tail(mid, n, alpha) <= level
        lo, hi = np.where(passes, mid, lo), np.where(passes, hi, mid)
    return lo


@given(st.lists(st.integers(min_value=1, max_value=10**6), min_size=1, max_size=50), alphas,
       st.floats(min_value=1e-12, max_value=0.999))
@example([1, 2, 3, 1000], 0.5, 0.4)
@example([5, 50, 5000], 1e-9, 1e-12)
@example([7, 10**6], 1 - 1e-9, 0.999)
def test_equivalent_critical_count_bisection(ns, alpha, level):
    n = np.array(ns)
    assert binomial.critical_counts(n, alpha, level).tolist() == _critical_by_bisection(n, alpha, level).tolist()


def _prompts_needed_full_scan(alpha, true_risk, m, delta, power):
    """planning.prompts_needed as it was: every n from 1 scanned again on each doubling."""
    from pytest_redline.planning import _normal_n

    level = delta / m
    hi = max(64, int(2 * _normal_n(alpha, true_risk, level, power)) + 64)
    while True:
        n = np.arange(1, hi + 1, dtype=np.int64)
        k = _critical_by_bisection(n, alpha, level)
        failing = np.flatnonzero(np.where(k < 0, 0.0, binomial.lower_tail(np.maximum(k, 0), n, true_risk)) < power)
        last_fail = int(n[failing[-1]]) if failing.size else 0
        if 2 * last_fail < hi:
            return last_fail + 1
        hi *= 2


@settings(max_examples=40)
@given(st.floats(min_value=0.02, max_value=0.5), st.floats(min_value=0.0, max_value=0.9),
       st.integers(min_value=1, max_value=60), st.floats(min_value=0.01, max_value=0.5),
       st.floats(min_value=0.05, max_value=0.99))
@example(0.05, 0.6, 8, 0.10, 0.8)  # the published figure: 1008
@example(0.1, 0.0, 1, 0.5, 0.05)
def test_equivalent_prompts_needed_full_scan(alpha, share, m, delta, power):
    from pytest_redline import planning

    true_risk = alpha * share
    assume(planning.prompts_needed_approx(alpha, true_risk, m, delta, power) < 4000)
    assert planning.prompts_needed(alpha, true_risk, m, delta, power) == _prompts_needed_full_scan(alpha, true_risk, m, delta, power)
