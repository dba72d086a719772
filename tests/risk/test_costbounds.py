"""Declared cost bounds (pytest_redline.costbounds): the check, exact intervals against brute
force, and the deployment rule on intervals against the rule on the true costs."""
from __future__ import annotations

import math
from fractions import Fraction
from itertools import product
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_redline import costbounds
from pytest_redline.risk.certification import select_deployed


def outcome(tokens, forwards, **extra):
    return SimpleNamespace(tokens=tokens, forwards=forwards, extra=extra)


def test_parse_refuses_malformed_bounds() -> None:
    assert costbounds.parse(None, "e") is None
    assert costbounds.parse({"tokens": (1, 2.5), "forwards": (1, math.inf), "memory": "constant"}, "e") == {
        "tokens": (1, Fraction(5, 2)), "forwards": (1, math.inf), "memory": "constant"}
    for bad in ({"tokens": (3, 2)}, {"tokens": 5}, {"tokens": (-math.inf, 2)}, {"tokens": (0, float("nan"))}, {"t": (True, 2)}):
        with pytest.raises(costbounds.BoundsError, match="engine 'x': cost_bounds"):
            costbounds.parse(bad, "engine 'x'")


def test_violation_names_the_bound() -> None:
    bounds = costbounds.parse({"tokens": (1, 96), "tokens_per_forward": (1, 5), "memory": "constant"}, "e")
    assert costbounds.violation(bounds, outcome(10, 2, memory=3.0)) is None
    assert costbounds.violation(bounds, outcome(12, 2)) == "tokens_per_forward = 6 outside the declared [1, 5]"
    assert costbounds.violation(bounds, outcome(97, 20)) == "tokens = 97 outside the declared [1, 96]"
    assert costbounds.violation(bounds, outcome(10, 0)) == "tokens_per_forward = 10 outside the declared [1, 5]"  # max(f, 1)
    assert "memory = 4, declared constant" in costbounds.violation(bounds, outcome(4, 2, memory=4.0), outcome(4, 2, memory=3.0))


def brute_pooled(t0, f0, vertices, k):
    ratios = [(t0 + sum(v[0] for v in pick)) / (f0 + sum(v[1] for v in pick)) for pick in product(vertices, repeat=k)]
    return min(ratios), max(ratios)


ints = st.integers(0, 12)


@settings(max_examples=150, deadline=None)
@given(tl=ints, tw=ints, fl=st.integers(1, 8), fw=st.integers(0, 8), rl=st.integers(0, 3), rw=st.integers(0, 6),
       t0=ints, f0=ints, k=st.integers(1, 3))
@pytest.mark.slow  # in-process pytester gate run(s): 0.42 s CPU, over the inner loop's 50 s budget (issue 25)
def test_pooled_interval_is_the_exact_extreme(tl, tw, fl, fw, rl, rw, t0, f0, k) -> None:
    """Dinkelbach over the cell's vertices equals the brute-force extreme over every choice of
    vertices for the k unknown cells (a linear-fractional program's extremes are at vertices)."""
    th, fh, rh = tl + tw, fl + fw, Fraction(rl) + Fraction(rw, 2)
    vertices = costbounds.cell_vertices(Fraction(tl), Fraction(th), Fraction(fl), Fraction(fh), Fraction(rl), rh)
    if not vertices or f0 + k * fl == 0:
        return
    exact = brute_pooled(Fraction(t0), Fraction(f0), vertices, k)
    groups = [(vertices, k)]
    assert (costbounds.dinkelbach(Fraction(t0), Fraction(f0), groups, False),
            costbounds.dinkelbach(Fraction(t0), Fraction(f0), groups, True)) == exact
    # every integer point of the cell lies in the polygon: its pooled ratio is inside
    for t, f in product(range(tl, th + 1), range(fl, fh + 1)):
        if rl * f <= t <= rh * f:
            assert exact[0] <= Fraction(t0 + k * t, f0 + k * f) <= exact[1]


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 30), kind=st.sampled_from(["tpf", "apf", "memory"]))
def test_interval_holds_the_all_prompt_cost(seed, n, kind) -> None:
    """Per-prompt values within declared bounds, any prompts decoded: the true cost is inside."""
    rng = np.random.default_rng(seed)
    forwards = rng.integers(1, 20, n).astype(float)
    tokens = np.minimum(forwards * rng.integers(1, 5, n), 60).astype(float)
    rows = [outcome(float(t), float(f), memory=2.5) for t, f in zip(tokens, forwards)]
    bounds = costbounds.parse({"tokens": (0, 60), "forwards": (1, 20 if rng.random() < 0.5 else math.inf),
                               "tokens_per_forward": (1, 4), "memory": "constant"}, "e")
    decoded = [r for r in rows if rng.random() < 0.5] or rows[:1]
    if kind == "tpf":
        truth = Fraction(sum(map(Fraction, tokens))) / Fraction(sum(map(Fraction, forwards)))
    elif kind == "apf":
        truth = sum(Fraction(t) / Fraction(f) for t, f in zip(tokens, forwards)) / n
    else:
        truth = Fraction(5, 2)
    low, high = costbounds.interval(kind, decoded, n - len(decoded), bounds)
    assert low <= truth <= high
    assert costbounds.interval(kind, rows, 0, bounds) == (truth, truth)
    if kind == "memory":
        assert (low, high) == (truth, truth)  # a declared constant: known from one decoded prompt
    assert costbounds.interval(kind, decoded, n - len(decoded), None)[1] in (math.inf, truth)


def test_pooled_lower_end_is_zero_without_a_forwards_ceiling() -> None:
    bounds = costbounds.parse({"tokens": (0, 96), "forwards": (1, math.inf), "tokens_per_forward": (0, 16)}, "e")
    low, high = costbounds.interval("tpf", [outcome(10, 5)], 1, bounds)
    assert (low, high) == (0, Fraction(106, 11))  # the unknown prompt at 96 tokens in 6 forwards
    assert costbounds.interval("tpf", [outcome(10, 5)], 1, costbounds.parse({"tokens_per_forward": (0, 16)}, "e")) == (-math.inf, math.inf)


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), m=st.integers(2, 6), lower=st.booleans(), gain=st.sampled_from([None, 0, 5, 1.5]))
@pytest.mark.slow  # in-process pytester gate run(s): 0.48 s CPU, over the inner loop's 50 s budget (issue 25)
def test_standing_never_drops_the_config_the_true_costs_deploy(seed, m, lower, gain) -> None:
    """Random integer costs and intervals around them (ties frequent): a contender that
    :func:`standing` drops is never the one the deployment rule picks on the true costs."""
    rng = np.random.default_rng(seed)
    cost = rng.integers(1, 6, m)
    intervals = [(Fraction(int(c - rng.integers(0, 3))), Fraction(int(c + rng.integers(0, 3)))) for c in cost]
    intervals[0] = (Fraction(int(cost[0])),) * 2
    contenders = [i for i in range(1, m) if rng.random() < 0.8]
    min_gain = None if gain is None or (lower and gain < 1) else gain
    out = costbounds.standing(intervals, 0, contenders, lower, min_gain)
    valid = np.zeros(m, dtype=bool)
    valid[contenders] = True
    score = -cost.astype(float) if lower else cost.astype(float)
    if min_gain is not None:
        ratio = [Fraction(int(cost[0]), int(c)) if lower else Fraction(int(c), int(cost[0])) for c in cost]
        valid &= np.array([(r if lower else 100 * (r - 1)) >= Fraction(min_gain) for r in ratio])
    deployed = int(select_deployed(valid, score, 0))
    assert deployed not in out
    alive = [i for i in contenders if i not in out]
    if all(intervals[i][0] == intervals[i][1] for i in contenders):  # points: the rule is decided
        assert len(alive) <= 1 and (deployed == 0 or alive == [deployed])
