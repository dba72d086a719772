"""Unit tests of pytest_redline.risk: exact values, edge cases and argument checks."""
import json
import math
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from pytest_redline import planning, risk
from pytest_redline.report import redline_table


def exact_log_cdf(v, n, alpha):
    """log P[Bin(n, alpha) <= v] in exact rational arithmetic (alpha a Fraction)."""
    total = sum(math.comb(n, k) * alpha**k * (1 - alpha) ** (n - k) for k in range(v + 1))
    return math.log(total.numerator) - math.log(total.denominator)


# --------------------------------------------------------------------------- violations


def test_counts_only_reference_correct_violations():
    correct = np.array([[1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 0, 0]], dtype=bool)
    assert risk.violations(correct, 0).tolist() == [0, 1, 2]
    assert risk.violations(correct, 0).dtype == np.int64


def test_integer_count_violations_large_n():
    """V is an integer count, exact where n * mean would round (n = 10**6 + 1)."""
    n = 10**6 + 1
    correct = np.ones((2, n), dtype=bool)
    correct[1, ::3] = False
    assert risk.violations(correct, 0)[1] == len(range(0, n, 3))


@pytest.mark.parametrize(
    "correct, reference, match",
    [
        (np.ones(3, dtype=bool), 0, "2-d"),
        (np.array([[0, 2]]), 0, "0/1"),
        (np.ones((2, 3), dtype=bool), 2, r"reference \(2\)"),
    ],
)
def test_rejects_bad_input_violations(correct, reference, match):
    with pytest.raises(ValueError, match=match):
        risk.violations(correct, reference)


# --------------------------------------------------------------------------- p-values


@pytest.mark.parametrize("v, n, alpha", [(0, 1, 0.5), (3, 10, 0.1), (0, 1012, 0.05), (73, 1012, 0.1), (542, 542, 0.3)])
def test_equivalent_binom_pvalue_binomtest(v, n, alpha):
    expected = stats.binomtest(v, n, alpha, alternative="less").pvalue
    assert risk.binom_pvalue(v, n, alpha) == pytest.approx(expected, rel=1e-12)


def test_vectorized_binom_pvalue():
    p = risk.binom_pvalue(np.array([0, 5, 10]), 10, 0.2)
    assert isinstance(p, np.ndarray) and p.shape == (3,)
    assert p[-1] == 1.0
    assert p[0] == pytest.approx(0.8**10, rel=1e-14)


@pytest.mark.parametrize(
    "v, n, alpha",
    [(0, 2000, Fraction(3, 10)), (5, 3000, Fraction(1, 4)), (40, 2500, Fraction(1, 2)), (100, 900, Fraction(1, 2))],
)
def test_exact_binom_logpvalue_far_tail(v, n, alpha):
    """Where the p-value underflows a double, its log is still right (checked exactly)."""
    expected = exact_log_cdf(v, n, alpha)
    assert risk.binom_logpvalue(v, n, float(alpha)) == pytest.approx(expected, rel=1e-12)


def test_no_underflow_binom_logpvalue():
    assert risk.binom_pvalue(0, 100_000, 0.3) == 0.0  # correctly rounded: below the smallest double
    assert risk.binom_logpvalue(0, 100_000, 0.3) == pytest.approx(100_000 * math.log(0.7), rel=1e-13)


@pytest.mark.parametrize("v, n, alpha", [(7, 40, Fraction(1, 10)), (0, 30, Fraction(1, 100)), (12, 12, Fraction(1, 3))])
def test_equivalent_binom_logpvalue_log_pvalue(v, n, alpha):
    assert risk.binom_logpvalue(v, n, float(alpha)) == pytest.approx(exact_log_cdf(v, n, alpha), rel=1e-12, abs=1e-15)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"v": 1, "n": 10, "alpha": 0.0}, r"alpha \(0.0\) must be in the open interval \(0, 1\)"),
        ({"v": 1, "n": 10, "alpha": 1.0}, r"alpha \(1.0\)"),
        ({"v": 11, "n": 10, "alpha": 0.1}, r"v \(11\) must be counts in \[0, n\] with n = 10"),
        ({"v": -1, "n": 10, "alpha": 0.1}, r"v \(-1\)"),
        ({"v": 1.5, "n": 10, "alpha": 0.1}, r"v \(1.5\) must be integer counts"),
        ({"v": 1, "n": 10.0, "alpha": 0.1}, r"n \(10.0\) must be an integer >= 1"),
        ({"v": 0, "n": 0, "alpha": 0.1}, r"n \(0\)"),
    ],
)
def test_rejects_bad_arguments_binom_pvalue(kwargs, match):
    with pytest.raises(ValueError, match=match):
        risk.binom_pvalue(**kwargs)


# --------------------------------------------------------------------------- corrections


def test_step_down_stops_at_first_failure_holm():
    # thresholds 0.1/3, 0.1/2, 0.1: the second fails, so the third (0.09 < 0.1) is not rejected.
    assert risk.holm([0.01, 0.06, 0.09], 0.1).tolist() == [True, False, False]
    assert risk.holm([0.01, 0.04, 0.09], 0.1).tolist() == [True, True, True]


def test_excludes_untested_holm():
    tested = np.array([False, True, True])
    assert risk.holm([0.0, 0.04, 0.09], 0.1, tested).tolist() == [False, True, True]
    assert risk.bonferroni([0.0, 0.04, 0.06], 0.1, tested).tolist() == [False, True, False]
    adjusted = risk.holm_adjusted([0.0, 0.04, 0.09], tested)
    assert math.isnan(adjusted[0]) and adjusted[1:].tolist() == pytest.approx([0.08, 0.09])


def test_capped_holm_adjusted():
    assert risk.holm_adjusted([0.5, 0.6, 0.01]).tolist() == pytest.approx([1.0, 1.0, 0.03])


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: risk.holm([0.1, 1.2], 0.1), "p-values in"),
        (lambda: risk.holm([0.1], 1.0), r"delta \(1.0\)"),
        (lambda: risk.holm([0.1, 0.2], 0.1, [True]), "tested must be a boolean mask"),
        (lambda: risk.holm_adjusted([[0.1]]), "1-d"),
    ],
)
def test_rejects_bad_arguments_corrections(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# --------------------------------------------------------------------------- bounds and power


@pytest.mark.parametrize("v, n", [(0, 10), (3, 10), (10, 10), (73, 1012), (0, 1)])
def test_equivalent_clopper_pearson_interval_binomtest(v, n):
    expected = stats.binomtest(v, n, 0.5).proportion_ci(0.95, method="exact")
    ci = risk.clopper_pearson_interval(v, n)
    assert (ci.low, ci.high) == pytest.approx((expected.low, expected.high), abs=1e-12)


@pytest.mark.parametrize("v, n, level", [(0, 100, 0.9), (73, 1012, 0.9), (5, 20, 0.5)])
def test_one_sided_clopper_pearson_upper(v, n, level):
    """P[Bin(n, upper) <= v] = 1 - level: the upper bound is the one-sided exact bound."""
    upper = risk.clopper_pearson_upper(v, n, level)
    assert stats.binom.cdf(v, n, upper) == pytest.approx(1 - level, rel=1e-9)
    assert risk.clopper_pearson_upper(n, n, level) == 1.0


@pytest.mark.parametrize("n, alpha, level", [(1012, 0.05, 0.1 / 7), (542, 0.15, 0.0125), (10, 0.5, 0.3), (5, 0.01, 0.01)])
def test_largest_passing_critical_count(n, alpha, level):
    k = risk.critical_count(n, alpha, level)
    if k >= 0:
        assert risk.binom_pvalue(k, n, alpha) <= level
    if k < n:
        assert risk.binom_pvalue(k + 1, n, alpha) > level


def test_none_passes_critical_count():
    assert risk.critical_count(5, 0.01, 0.01) == -1  # (0.99)^5 > 0.01


def test_equivalent_power_binomial_cdf():
    n, alpha, r, level = 1008, 0.05, 0.03, 0.1 / 8
    k = risk.critical_count(n, alpha, level)
    assert planning.power(n, alpha, r, level) == pytest.approx(stats.binom.cdf(k, n, r))
    assert planning.power(np.array([n, n]), alpha, r, level).tolist() == pytest.approx([stats.binom.cdf(k, n, r)] * 2)


def test_stays_above_target_prompts_needed():
    """Power is at least the target from the returned n on (checked over a long stretch)
    and below it just before."""
    alpha, r, m, delta, target = 0.05, 0.03, 8, 0.10, 0.8
    n = planning.prompts_needed(alpha, r, m, delta, target)
    level = delta / m
    assert planning.power(n - 1, alpha, r, level) < target
    assert np.all(planning.power(np.arange(n, 4 * n), alpha, r, level) >= target)


def test_rejects_unreachable_risk_prompts_needed():
    with pytest.raises(ValueError, match=r"true_risk \(0.05\) must be in \[0, 0.05\)"):
        planning.prompts_needed(0.05, 0.05, 8)


# --------------------------------------------------------------------------- certify


def small_problem():
    correct = np.array(
        [
            [1, 1, 1, 1, 0, 1, 1, 1, 1, 1],  # reference
            [1, 1, 1, 1, 0, 1, 1, 1, 1, 1],  # identical: V = 0
            [0, 1, 1, 1, 1, 1, 1, 1, 1, 1],  # V = 1
        ],
        dtype=bool,
    )
    return correct, np.array([1.0, 2.0, 3.0])


def test_selects_fastest_valid_certify():
    correct, cost = small_problem()
    result = risk.certify(correct, cost, 0, alpha=0.5, delta=0.5, names=["ref", "same", "fast"])
    assert result.valid.tolist() == [True, True, True]
    assert result.deployed == "fast" and result.deployed_index == 2
    assert result.violations.tolist() == [0, 0, 1]
    assert result.gain.tolist() == pytest.approx([0.0, 100.0, 200.0])
    assert result.net_accuracy.tolist() == pytest.approx([0.0, 0.0, 0.0])


def test_reference_always_eligible_certify():
    correct, cost = small_problem()
    result = risk.certify(correct, cost, "config0", alpha=0.01, delta=0.01)
    assert not result.valid[1:].any()
    assert result.deployed == "config0" and result.reference == "config0"


def test_slower_valid_never_deployed_certify():
    correct, _ = small_problem()
    result = risk.certify(correct, [5.0, 2.0, 3.0], 0, alpha=0.5, delta=0.5)
    assert result.valid[1:].all() and result.deployed_index == 0


def test_first_listed_wins_ties_certify():
    correct, _ = small_problem()
    result = risk.certify(correct, [1.0, 3.0, 3.0], 0, alpha=0.5, delta=0.5)
    assert result.deployed_index == 1


def test_lower_is_better_factor_gain_certify():
    correct, _ = small_problem()
    result = risk.certify(correct, [16.0, 8.0, 4.0], 0, alpha=0.5, delta=0.5, lower_is_better=True)
    assert result.deployed_index == 2
    assert result.gain_kind == "factor" and result.gain.tolist() == pytest.approx([1.0, 2.0, 4.0])


def test_eligible_restricts_deployment_certify():
    correct, cost = small_problem()
    result = risk.certify(correct, cost, 0, 0.5, 0.5, eligible=np.array([False, True, False]))
    assert result.valid[2] and result.deployed_index == 1


def test_family_candidates_excludes_reference_certify():
    correct, cost = small_problem()
    result = risk.certify(correct, cost, 0, 0.3, 0.2, family="candidates")
    assert math.isnan(result.p_values[0]) and not result.valid[0]
    assert result.p_values[1] == pytest.approx(0.7**10)  # V = 0 of n = 10
    # K = 2 instead of 3: the first threshold is 0.2 / 2.
    assert result.valid[1] == (0.7**10 <= 0.1)


def test_family_all_counts_reference_certify():
    correct, cost = small_problem()
    result = risk.certify(correct, cost, 0, 0.3, 0.2)
    assert result.p_values[0] == pytest.approx(0.7**10)
    assert result.m == 3 and result.n == 10


def test_bonferroni_option_certify():
    correct, cost = small_problem()
    result = risk.certify(correct, cost, 0, 0.5, 0.5, correction="bonferroni")
    assert result.correction == "bonferroni"
    assert result.p_adjusted.tolist() == pytest.approx(np.minimum(1, 3 * result.p_values).tolist())


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"alpha": 1.5}, r"alpha \(1.5\) must be in the open interval"),
        ({"delta": 0.0}, r"delta \(0.0\)"),
        ({"reference": "nope"}, r"reference \('nope'\) is not a config"),
        ({"cost": [1.0, 2.0]}, "cost .* must hold 3 positive finite numbers"),
        ({"cost": [1.0, np.nan, 2.0]}, "positive finite"),
        ({"names": ["a", "a", "b"]}, "3 distinct names"),
        ({"correction": "sidak"}, r"correction \('sidak'\) not recognized; must be one of 'holm', 'bonferroni'"),
        ({"family": "some"}, r"family \('some'\) not recognized"),
        ({"gain": "ratio"}, r"gain \('ratio'\) not recognized"),
        ({"eligible": [1, 0, 1]}, "eligible .* boolean mask"),
    ],
)
def test_rejects_bad_arguments_certify(kwargs, match):
    correct, cost = small_problem()
    args = {"correct": correct, "cost": cost, "reference": 0, "alpha": 0.1, **kwargs}
    with pytest.raises(ValueError, match=match):
        risk.certify(**args)


def test_readable_table_result():
    correct, cost = small_problem()
    text = redline_table.render(risk.certify(correct, cost, 0, 0.5, 0.5, names=["ref", "same", "fast"]))
    lines = text.splitlines()
    assert lines[0].startswith("Redline: alpha=0.5 delta=0.5 holm (family: all), n=10 prompts, m=3 configs")
    assert any(line.lstrip().startswith("R") and "ref" in line for line in lines)
    assert any(line.startswith(" *") and "fast" in line and "+200.0%" in line for line in lines)
    assert lines[-1] == "deployed: fast (+200.0% vs reference ref, +0.0 accuracy points)"


def test_json_report_shape_result():
    correct, cost = small_problem()
    result = risk.certify(correct, cost, 0, 0.5, 0.5, family="candidates")
    report = json.loads(json.dumps(result.to_dict(alpha_min=0.07)))
    assert set(report) == {"alpha", "delta", "correction", "family", "n", "m", "reference", "deployed", "alpha_min", "configs"}
    assert set(report["configs"][0]) == {
        "name", "accuracy", "violations", "risk", "risk_upper", "p_value", "p_adjusted",
        "valid", "cost", "gain", "net_accuracy_points",
    }
    assert report["configs"][0]["p_value"] is None  # outside the family
    assert "alpha_min" not in result.to_dict()


def test_immutable_result():
    correct, cost = small_problem()
    result = risk.certify(correct, cost, 0, 0.5, 0.5)
    with pytest.raises(ValueError):
        result.valid[0] = False
    with pytest.raises(AttributeError):
        result.alpha = 0.2


def test_equivalent_sweep_certify():
    correct, cost = small_problem()
    alphas = [0.05, 0.2, 0.5]
    for a, swept in zip(alphas, risk.sweep(correct, cost, 0, alphas, 0.5)):
        single = risk.certify(correct, cost, 0, a, 0.5)
        assert swept.alpha == a and swept.deployed_index == single.deployed_index
        assert np.array_equal(swept.p_values, single.p_values) and np.array_equal(swept.valid, single.valid)


def test_none_when_reference_always_alpha_min():
    correct, cost = small_problem()
    assert risk.alpha_min(correct[:1], cost[:1], 0) is None
    assert risk.alpha_min(correct, cost, 0, delta=0.5, alphas=[0.01, 0.5]) == 0.5


def test_rejects_unknown_option_alpha_min():
    correct, cost = small_problem()
    with pytest.raises(TypeError, match="unexpected option"):
        risk.alpha_min(correct, cost, 0, lower_is_beter=True)


def test_no_torch_or_pytest_import_risk():
    """The statistics import and run with torch and pytest blocked."""
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['pytest'] = None\n"
        "import numpy as np\n"
        "from pytest_redline import risk, planning, outcomes, cli\nfrom pytest_redline.report import redline_table\n"
        "r = risk.certify(np.eye(3, dtype=bool), [1.0, 2.0, 3.0], 0, 0.5, 0.5)\n"
        "risk.alpha_min(np.eye(3, dtype=bool), [1.0, 2.0, 3.0], 0)\n"
        "planning.prompts_needed(0.05, 0.03, 8); risk.clopper_pearson_interval(3, 10); redline_table.render(r)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_examples_hold_risk_docstrings():
    import doctest

    from pytest_redline.risk import binomial, certification, corrections, result

    failures = tried = 0
    for module in (risk, binomial, corrections, result, certification):
        f, t = doctest.testmod(module)
        failures, tried = failures + f, tried + t
    assert tried >= 6 and failures == 0
