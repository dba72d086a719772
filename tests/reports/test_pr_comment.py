"""The pull-request comment: the Markdown summary under GitHub's 65,536-character limit on a
comment (characters, not bytes), led by the session's hidden marker, rendered by GitHub's
renderer (``cmarkgfm``). The verdict is the published LLaDA2 math grid's, judged without pytest."""
from __future__ import annotations

import dataclasses

import pytest

from pytest_redline.report import summary
from tests.reports.test_step_summary import PROVENANCE, Page, html_of, replayed

MARKER = "<!-- redline: llada2-mini-math-published -->"


@pytest.fixture(scope="module")
def grid():
    (g,) = summary.grids([replayed()])
    return g


def _shown(doc: str) -> int:
    return sum(len(d["tables"][0]) - 1 for d in Page(html_of(doc)).details if d["tables"] and "regression" in d["summary"])


def test_the_comment_starts_with_the_hidden_marker_and_renders(grid):
    comment = summary.render_comment([grid], PROVENANCE, "full")
    assert comment.splitlines()[0] == MARKER and len(comment) < summary.COMMENT_LIMIT
    page = html_of(comment)
    assert MARKER in page and MARKER.strip("<!->") not in page.replace(MARKER, "")  # an HTML comment: not shown
    assert "<h2>✅ REDLINE CERTIFIED: llada2-mini-math-published</h2>" in page
    assert _shown(comment) == len(grid.report["regressions"])  # all 351 fit, prompts and all
    other = dataclasses.replace(grid, report={**grid.report, "grid": "code"})
    assert summary.marker([other, grid]) == summary.marker([grid, other]) == "<!-- redline: code, llada2-mini-math-published -->"


def test_the_limit_counts_characters_not_bytes(grid):
    """With prompt texts of two-byte characters the document is about twice as many bytes as
    characters: the comment keeps every row that fits 65,536 characters, more than a byte limit would."""
    wide = dataclasses.replace(grid, prompts={p: "Σ" * 290 for p in grid.prompts})
    comment = summary.render_comment([wide], PROVENANCE, "full")
    by_bytes = summary.render([wide], PROVENANCE, "full", limit=summary.COMMENT_LIMIT)
    assert len(comment) < summary.COMMENT_LIMIT < len(comment.encode())
    assert _shown(by_bytes) < _shown(comment) < len(grid.report["regressions"])
    total = len(grid.report["regressions"])
    assert (f"{total - _shown(comment)} of {total} regressions left out** to keep this summary under GitHub's "
            "65,536-character limit for a comment") in comment
    assert comment.splitlines()[0] == MARKER


def test_the_gate_writes_the_comment_beside_the_summary(tmp_path):
    notes = summary.write(tmp_path / "redline.md", [replayed()], PROVENANCE, "ids", environ={})
    comment = (tmp_path / "redline.comment.md").read_text()
    assert comment.startswith(MARKER + "\n") and (tmp_path / "redline.md").read_text().startswith(MARKER + "\n")
    assert notes[1] == (f"Markdown summary as a pull-request comment: {tmp_path / 'redline.comment.md'} "
                        f"({len(comment):,} characters, marker {MARKER})")
