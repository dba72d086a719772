"""A release manager's policy on the published replays, in every output: math at its own alpha
(0.10, from its grid file), code at 0.05 (from --redline-alpha) and an advisory code grid
(``required: false``) whose gated config fails. The session exits 0; the terminal, the JSON
report, the review page, the Markdown summary and the JUnit XML each give every grid's alpha
and where it came from, and show the advisory failure without failing anything.

Subsets of the paper's grids keep it quick (two configs each). At delta = 0.10 split over the
three grids, math deploys acc85/semi70 (V = 73 of 1,012: p = 0.0013 under its Holm step); code
at 0.05 deploys its reference; acc85/semi70 of the code grid (V = 85 of 542) is not valid at 0.05.
"""
from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from redline_fakes import Project

pytest_plugins = ["pytester"]

DATA = Path(__file__).resolve().parents[1] / "data" / "redline"
GRIDS = {
    "math.yaml": f"""\
name: math
engine: replay
engine_args: {{outcomes: {DATA / "llada2_math.csv"}}}
cost: tpf
reference: acc95/semi90
configs: [acc85/semi70, acc95/semi90]
deploy: fastest
alpha: 0.10
""",
    "code.yaml": f"""\
name: code
engine: replay
engine_args: {{outcomes: {DATA / "llada2_code.csv"}}}
cost: tpf
reference: acc95/semi90
configs: [acc95/semi90, acc99/semi90]
deploy: fastest
""",
    "advisory.yaml": f"""\
name: code-advisory
engine: replay
engine_args: {{outcomes: {DATA / "llada2_code.csv"}}}
cost: tpf
reference: acc95/semi90
configs: [acc85/semi70, acc95/semi90]
deploy: acc85/semi70
required: false
""",
}
SOURCES = {"math": (0.10, "grid file"), "code": (0.05, "--redline-alpha"), "code-advisory": (0.05, "--redline-alpha")}


@pytest.fixture
def project(pytester: pytest.Pytester) -> Project:
    return Project(pytester)


@pytest.mark.slow  # one gate session over 4,192 replayed items: 6.2 s of CPU
def test_two_budgets_and_an_advisory_failure_in_every_output(project: Project) -> None:
    for name, text in GRIDS.items():
        (project.path / name).write_text(text)
    result = project.run("--redline-alpha=0.05", *(f"--redline-grid={name}" for name in GRIDS), "--redline-no-cache",
                         "--redline-report=report.json", "--redline-html=page.html", "--redline-markdown=summary.md",
                         "--junitxml=junit.xml")
    assert result.ret == 0, result.stdout.str()
    check_terminal(result)
    check_json(project.path)
    check_review_page(project.path)
    check_summary(project.path)
    check_junit(project.path)


def check_terminal(result) -> None:
    result.stdout.fnmatch_lines([
        "*= redline: math (math.yaml): alpha=0.1 from the grid file =*",
        "alpha=0.1 delta=0.1 (share 0.03333: split over 3 grids, Bonferroni)*",
        "outcomes: replayed (replay): * read from the recorded outcomes, 0 reused from the store, none decoded",
        "CERTIFIED (math, select): deploy acc85/semi70 (+37.5% tpf, -4.0 accuracy points)",
        "*= redline: code (code.yaml): alpha=0.05 from --redline-alpha =*",
        "alpha=0.05 delta=0.1 (share 0.03333*",
        "CERTIFIED (code, select): deploy acc95/semi90 (the reference)",
        "*= redline: code-advisory (advisory.yaml): alpha=0.05 from --redline-alpha; advisory (required: false): "
        "reported, fails nothing =*",
        "alpha=0.05 delta=0.1 (share 0.03333*",
        "ADVISORY NOT CERTIFIED (code-advisory, gate): acc85/semi70 is NOT valid at alpha=0.05; deploy acc95/semi90*",
        "*REDLINE CERTIFIED: 2 required grids; advisory, not certified (fails nothing): code-advisory*",
    ])


def check_json(folder: Path) -> None:
    report = json.loads((folder / "report.json").read_text())
    grids = {g["grid"]: g for g in report["grids"]}
    assert {name: (g["alpha"], g["alpha_source"]) for name, g in grids.items()} == SOURCES
    assert {name: g["advisory"] for name, g in grids.items()} == {"math": False, "code": False, "code-advisory": True}
    assert (report["certified"], report["advisory_not_certified"]) == (True, ["code-advisory"])
    advisory = grids["code-advisory"]
    assert (advisory["certified"], advisory["complete"], advisory["not_certified"]) == (False, True, ["acc85/semi70"])
    assert all(g["delta_share"] == pytest.approx(0.1 / 3) for g in report["grids"])  # the advisory grid counts in the split


def check_review_page(folder: Path) -> None:
    page = (folder / "page.html").read_text()
    assert '<h1 id="verdict">REDLINE CERTIFIED (advisory, not certified: code-advisory)</h1>' in page
    facts = re.findall(r"<th>alpha</th><td>([^<]*)</td>", page)
    assert facts == ["0.1 (grid file)", "0.05 (--redline-alpha)", "0.05 (--redline-alpha)"]
    assert '<p class="head">ADVISORY: acc85/semi70 is NOT CERTIFIED</p>' in page
    assert page.count("<th>advisory</th><td>advisory (required: false): reported, fails nothing</td>") == 1
    assert page.count("replayed (replay): ") == 3  # the outcomes fact of each grid


def check_summary(folder: Path) -> None:
    doc = (folder / "summary.md").read_text()
    assert "## ✅ REDLINE CERTIFIED: math, code, code-advisory (advisory, not certified: code-advisory)" in doc.splitlines()
    assert "### code-advisory (`advisory.yaml`) · α = 0.05 from --redline-alpha · advisory (required: false): fails nothing\n" in doc
    assert "**ADVISORY NOT CERTIFIED (code-advisory, gate): acc85/semi70 is NOT valid at alpha=0.05;" in doc
    headings = re.findall(r"^### (\S+) \(`[^`]*`\) · α = ([\d.]+) from ([^·\n]*?)(?: ·|$)", doc, flags=re.M)
    assert headings == [("math", "0.1", "the grid file"), ("code", "0.05", "--redline-alpha"),
                        ("code-advisory", "0.05", "--redline-alpha")]
    assert doc.count("outcomes: replayed (replay): ") == 3


def check_junit(folder: Path) -> None:
    suite = ET.parse(folder / "junit.xml").getroot().find("testsuite")
    assert (suite.get("failures"), suite.get("errors"), suite.get("tests")) == ("0", "0", str(2 * 1012 + 2 * 542 + 2 * 542))
