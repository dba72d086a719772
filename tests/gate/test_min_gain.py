"""``min_gain`` read as the user wrote it, on both paths: the scheduled run and ``--redline-full``
compare it with the costs in one exact rule (every float as the shortest decimal that gives it
back), so a gain of exactly ``min_gain`` deploys the candidate either way."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from redline_fakes import Project

from pytest_redline import costbounds, risk

pytest_plugins = ["pytester"]

MEMORY = """\
name: memory-min-gain
suite: fake
suite_args: {{n: 60}}
engine: fake
cost: memory_gb
direction: lower
reference: ref
batch_size: 8
min_gain: {min_gain}
deploy: fastest
configs:
  ref: {{memory_gb: {ref}, wrong: [q1, q2, q9, q20, q33, q41, q50, q58]{bounds}}}  # small skips these: settled by its interval
  small: {{memory_gb: {small}, wrong: [q3]{bounds}}}
  rash: {{memory_gb: 1.0, wrong_every: 4{bounds}}}  # a second contender, which the risk rules out
"""


def test_a_float_reads_as_the_shortest_decimal_that_gives_it_back() -> None:
    assert costbounds.decimal(6.4) == Fraction(32, 5) != Fraction(6.4)
    assert costbounds.decimal(np.float64(1.8)) == Fraction(9, 5)
    assert costbounds.decimal(np.int64(7)) == 7 and costbounds.decimal(Fraction(1, 3)) == Fraction(1, 3)
    assert costbounds.decimal(16.0) / costbounds.decimal(6.4) == Fraction(5, 2)


@pytest.mark.parametrize(("cost", "lower", "kind", "min_gain", "expected"), [
    ([16.0, 6.4], True, "factor", 2.5, [False, True]),  # 16.0 / 6.4 is exactly 2.5
    ([4.5, 2.5], True, "factor", 1.8, [False, True]),  # exactly 9/5
    ([4.5, 2.5], True, "factor", 1.8000000000000003, [False, False]),  # the next float up is more than 9/5
    ([2.0, 2.5], False, "percent", 25, [False, True]),  # +25 % exactly
    ([2.0, 2.2], False, "percent", 10, [False, True]),  # 2.2 / 2.0 - 1 is 1/10 as written (0.10000000000000009 in floats)
    ([2.0, 0.0], True, "factor", 100, [False, True]),  # nothing spent: an unbounded reduction
    ([2.0, float("nan")], True, "factor", 1.5, [False, False]),
])
def test_reaches_is_exact_as_written(cost, lower, kind, min_gain, expected) -> None:
    """The reference gains nothing (a factor of 1, or 0 %): it reaches only a min_gain as low."""
    assert risk.reaches(cost, 0, lower, kind, min_gain).tolist() == expected
    fractions = [costbounds.decimal(c) for c in cost if c == c]
    if len(fractions) == 2:
        assert costbounds.gains_enough(fractions[1], fractions[0], lower, kind, min_gain) is expected[1]


@pytest.mark.parametrize(("ref", "small", "min_gain"), [("16.0", "6.4", "2.5"), ("4.5", "2.5", "1.8")])
@pytest.mark.parametrize("bounds", ["", ", bounds: {memory_gb: constant}"], ids=["measured", "declared-constant"])
def test_a_gain_of_exactly_min_gain_deploys_the_candidate_scheduled_and_full(
        pytester: pytest.Pytester, ref: str, small: str, min_gain: str, bounds: str) -> None:
    project = Project(pytester)
    project.grid(MEMORY.format(ref=ref, small=small, min_gain=min_gain, bounds=bounds))
    for extra, report in (((), "scheduled.json"), (("--redline-full",), "full.json")):
        result = project.run("--redline-alpha=0.1", "--redline-no-cache", f"--redline-report={report}", *extra)
        assert result.ret == 0, result.stdout.str()
        assert project.report(report)["deployed"] == "small", report
    assert "cannot reach min_gain" not in result.stdout.str()
