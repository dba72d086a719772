"""The review page's config rows: pink marks a failure (exceeds the budget), an inconclusive
config is grey, and the params header sits over its left-aligned cells. The published LLaDA2
math grid at alpha 0.05, where two configs exceed the budget and four are inconclusive."""
from __future__ import annotations

import re

from pytest_redline.report import review
from tests.reports.test_step_summary import replayed


def test_inconclusive_rows_are_not_pink_and_failures_are():
    v = replayed(0.05)
    page = review.render([v], {})
    classes = {name: cls for cls, name in re.findall(r'<tr class="([^"]*)" title="[^"]*"><td data-sort="([^"]+)">', page)}
    statuses = dict(zip(v.result.names, v.statuses))
    assert {s for s in statuses.values()} == {"certified", "exceeds budget", "inconclusive"}
    for name, status in statuses.items():
        marks = classes[name].split()
        assert ("not-valid" in marks) == (status == "exceeds budget"), (name, status, marks)
        assert ("inconclusive" in marks) == (status == "inconclusive"), (name, status, marks)
    css = page[page.index("<style>"):page.index("</style>")]
    assert "tr.not-valid{background:#fdecea}" in css and "tr.inconclusive{background:#f1f1f4}" in css
    assert "table.configs th:nth-child(-n+2){text-align:left}" in css  # config and params headers, as their cells
