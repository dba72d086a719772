"""``risk.certify_grid`` (the verdict's one call into the statistics) equals the public functions."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from pytest_redline import risk


def table(seed: int, m: int, n: int):
    rng = np.random.default_rng(seed)
    correct = rng.random((m, n)) < rng.uniform(0.5, 1.0, size=(m, 1))
    cost = rng.integers(1, 6, size=m).astype(float)  # small integers: ties happen
    return correct, cost


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), m=st.integers(1, 6), n=st.integers(1, 120),
       alpha=st.floats(0.01, 0.5), correction=st.sampled_from(["holm", "bonferroni"]), lower=st.booleans())
def test_equals_certify_reverse_and_alpha_min(seed, m, n, alpha, correction, lower) -> None:
    correct, cost = table(seed, m, n)
    options = dict(lower_is_better=lower, correction=correction)
    got = risk.certify_grid(n, cost, 0, alpha, 0.1, correct=correct, **options)
    assert got.result.to_dict() == risk.certify(correct, cost, 0, alpha, 0.1, **options).to_dict()
    reverse = risk.exceeds_budget(risk.violations(correct, 0), n, 0, alpha, 0.1, correction)
    assert got.reverse.exceeds.tolist() == reverse.exceeds.tolist()
    assert np.array_equal(got.reverse.p_adjusted, reverse.p_adjusted, equal_nan=True)
    assert got.alpha_min == risk.alpha_min(correct, cost, 0, 0.1, **options)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), m=st.integers(2, 6), n=st.integers(20, 120), min_gain=st.floats(-50, 100))
def test_bounds_min_gain_and_ineligible_as_an_eligible_mask(seed, m, n, min_gain) -> None:
    """Counts that are bounds, a reverse family on other counts, and eligibility from
    ``min_gain`` and ``ineligible``: what certify_counts gives with the same mask."""
    correct, cost = table(seed, m, n)
    v = risk.violations(correct, 0)
    seen = v // 2
    out = [m - 1]
    eligible = risk.gains(cost, 0, False, "percent") >= min_gain
    eligible[out] = False
    eligible[0] = True
    accuracy = correct.mean(axis=1)  # NaN (the default) never equals itself in the dicts compared
    got = risk.certify_grid(n, cost, 0, 0.2, 0.1, violations=v, seen=seen, accuracy=accuracy, min_gain=min_gain, ineligible=out)
    expected = risk.certify_counts(v, n, cost, 0, 0.2, 0.1, accuracy=accuracy, eligible=eligible)
    assert got.result.to_dict() == expected.to_dict()
    assert got.reverse.violations.tolist() == seen.tolist() and got.alpha_min is None


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), m=st.integers(2, 6), n=st.integers(20, 120))
def test_a_replay_certifies_on_the_bounds_and_tests_the_reverse_and_alpha_min_on_all_prompts(seed, m, n) -> None:
    """A scheduled replay passes the stop bounds and the whole matrix: the certificate is on the
    bounds, the reverse family and alpha_min on every prompt's counts."""
    correct, cost = table(seed, m, n)
    v = risk.violations(correct, 0)
    bound = np.minimum(v + 3, n)
    bound[0] = 0
    got = risk.certify_grid(n, cost, 0, 0.2, 0.1, violations=bound, correct=correct)
    accuracy = correct.mean(axis=1)
    assert got.result.to_dict() == risk.certify_counts(bound, n, cost, 0, 0.2, 0.1, accuracy=accuracy).to_dict()
    assert got.reverse.violations.tolist() == v.tolist()
    assert got.alpha_min == risk.alpha_min(correct, cost, 0, 0.1)


def test_choose_overrides_the_deployment_among_the_choosable() -> None:
    correct = np.ones((3, 50), dtype=bool)
    asked = []

    def choose(choosable):
        asked.append(choosable)
        return choosable[0]

    got = risk.certify_grid(50, [1.0, 2.0, 3.0], 0, 0.2, 0.1, correct=correct, choose=choose, ineligible=[2])
    assert asked == [[1]] and got.result.deployed == "config1"  # config2 is faster but not eligible
    kept = risk.certify_grid(50, [1.0, 2.0, 3.0], 0, 0.2, 0.1, correct=correct, choose=lambda c: None)
    assert kept.result.deployed == "config2"


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(), "needs the violation counts or the outcome matrix"),
    (dict(violations=[0, 1], correct=np.ones((3, 10), dtype=bool)), "3 rows but there are 2"),
    (dict(correct=np.ones((2, 9), dtype=bool)), r"\(configs x 10 prompts\)"),
    (dict(violations=[0, 11]), r"counts in \[0, n\]"),
    (dict(violations=[0, 1], accuracy=[0.5]), "accuracy"),
    (dict(violations=[0, 1], seen=[0, 1, 2]), "seen"),
    (dict(violations=[0, 1], ineligible=[2]), "ineligible"),
])
def test_refuses_inconsistent_arguments(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        risk.certify_grid(10, [1.0, 2.0], 0, 0.1, 0.1, **kwargs)
