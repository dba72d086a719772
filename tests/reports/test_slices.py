"""Slices: each config's V, regressions and accuracy per slice of the prompts, in every output.

The published LLaDA2 math outcomes (GSM8K 512 + MATH-500 500 prompts) split by the prompt id's
prefix with no ``slice_by:`` in the grid; judged on every outcome (``--redline-full``), the
slices' V add up to the grid's V for every config."""
from __future__ import annotations

from pathlib import Path

import pytest
import redline_fakes  # noqa: F401  (numpy and the gate's modules loaded once)

from pytest_redline.contracts import Prompt
from pytest_redline.grid import GridError, parse_grid
from pytest_redline.report import review, summary
from pytest_redline.report.document import grid_report
from pytest_redline.report.terminal import grid_lines
from pytest_redline.slices import chosen, slicings
from tests.reports.test_step_summary import PROVENANCE, Page, html_of, replayed


@pytest.fixture(scope="module")
def verdict():
    return replayed()


def test_the_published_math_grid_splits_into_gsm8k_and_math500_and_the_slices_add_up(verdict):
    (by_prefix,) = slicings(verdict)
    assert by_prefix.by == "prefix" and by_prefix.names == ("gsm8k", "math500")
    r = verdict.result
    for i, config in enumerate(r.names):
        rows = by_prefix.of(config)
        assert [(row.slice, row.prompts, row.decoded) for row in rows] == [("gsm8k", 512, 512), ("math500", 500, 500)]
        assert sum(row.violations for row in rows) == int(r.violations[i])
        assert sum(row.correct for row in rows) == round(float(r.accuracy[i]) * 1012)
    deployed = {row.slice: (row.violations, row.correct) for row in by_prefix.of("acc85/semi70")}
    assert deployed == {"gsm8k": (19, 465), "math500": (54, 369)}  # 73 regressions in all


def test_every_output_shows_the_slices_with_exact_counts(verdict):
    lines = grid_lines(verdict, 0)
    at = next(i for i, line in enumerate(lines) if line.startswith("slices by prefix (2: gsm8k, math500): descriptive"))
    table = lines[at + 2: at + 2 + 14]
    assert table[0].split() == ["config", "slice", "prompts", "decoded", "V", "correct", "accuracy"]
    assert table[1].split() == ["acc85/semi70", "gsm8k", "512", "512", "19", "465", "0.9082"]
    assert table[2].split() == ["acc85/semi70", "math500", "500", "500", "54", "369", "0.7380"]
    report = grid_report(verdict)
    (sliced,) = report["slices"]
    assert sliced["by"] == "prefix" and "not certificates" in sliced["note"]
    assert {(row["config"], row["slice"]): row["violations"] for row in sliced["rows"]}[("acc99/semi90", "math500")] == 36
    (grid,) = summary.grids([verdict])
    page = Page(html_of(summary.render([grid], PROVENANCE)))
    block = next(d for d in page.details if d["summary"].startswith("By prefix: 2 slices (gsm8k, math500)"))
    rows = {(row[0], row[1]): row[2:] for row in block["tables"][0][1:]}
    assert rows[("acc85/semi70", "gsm8k")] == ["19", "465 / 512", "512", "0.9082"]
    page = review.render([verdict], {})
    section = page[page.index('<details class="slices" open><summary>By prefix: 2 slices (gsm8k, math500)'):]
    assert "<tr><td>acc85/semi70</td><td>math500</td><td>54</td><td>369 / 500</td><td>500</td><td>0.738</td></tr>" in section


def test_built_in_and_named_slicings():
    def prompt(i: int, **meta) -> Prompt:
        return Prompt(id=f"math500/{i}", text="", meta=meta)

    prompts = [prompt(i, subject=s, level=lv) for i, (s, lv) in enumerate([("Algebra", 1), ("Geometry", 1), ("Algebra", 3)])]
    assert chosen(prompts, None) == ("subject", "level")  # one prefix only: not a slicing
    assert chosen(prompts, ("level",)) == ("level",) and chosen(prompts, ()) == ()
    with pytest.raises(GridError, match=r"g.yaml: slice_by: expected 'prefix', a prompt metadata field, or a list of them, got 3"):
        parse_grid("engine: replay\nreference: a\nslice_by: 3\n", Path("g.yaml"))
    assert parse_grid("engine: replay\nreference: a\nslice_by: [subject, level]\n", Path("g.yaml")).slice_by == ("subject", "level")
