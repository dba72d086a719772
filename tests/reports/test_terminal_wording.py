"""What a newcomer reads in the terminal (issue 29 item 5): the header lines pytest prints for a
gate run (what is collected, what the progress marks mean), the mode's cost-aware wording, the
risk figures a note names, and the progress lines' denominators (pytester, the fake engine of
redline_fakes: ``ref`` always right, ``fast`` wrong on q3, ``rash`` wrong on every 4th prompt)."""
from __future__ import annotations

import re

import pytest
from redline_fakes import Project
from terminal_text import flat

pytest_plugins = ["pytester"]

ALPHA = "--redline-alpha=0.1"


@pytest.fixture
def project(pytester: pytest.Pytester) -> Project:
    return Project(pytester)


def test_the_header_says_only_grids_are_collected_and_explains_the_marks(project: Project) -> None:
    project.grid()
    project.pytester.makeini("[pytest]\ntestpaths = tests\n")
    project.pytester.mkdir("tests")
    result = project.run(ALPHA, "--collect-only")
    out = result.stdout.str()
    assert "testpaths:" not in out  # pytest's own line would claim tests/ is collected
    result.stdout.fnmatch_lines(["redline: gating redline.yaml (only the grids are collected, not testpaths)"])
    assert ("redline marks: . no regression (or the reference's own item); R regressed: the reference answers correctly "
            "and this config does not; s skipped by the schedule") in flat(result)
    named = project.run(ALPHA, "--collect-only", "redline.yaml")  # a path argument: collected as given
    named.stdout.fnmatch_lines(["redline: gating redline.yaml"])


@pytest.mark.slow  # in-process pytester gate run(s): 0.21 s CPU, over the inner loop's 50 s budget (issue 25)
def test_a_memory_grid_selects_the_best_cost_config_not_the_fastest(project: Project) -> None:
    project.grid(cost="memory_gb", direction="lower")
    result = project.run(ALPHA, "--redline-full")
    assert "mode select (select the best-cost valid config: lowest memory_gb)" in flat(result)
    assert "fastest valid" not in result.stdout.str()


@pytest.mark.slow  # in-process pytester gate run(s): 0.21 s CPU, over the inner loop's 50 s budget (issue 25)
def test_a_stopped_config_names_the_rate_its_stop_used_beside_the_risk_column(project: Project) -> None:
    project.grid()
    result = project.run(ALPHA, "--redline-report=report.json")
    rash = next(c for c in project.report()["configs"] if c["name"] == "rash")
    assert rash["violations_bound"] == "lower"
    row = next(line for line in result.outlines if re.match(r"\s+rash\s", line))
    column = float(row.split()[5])  # risk: V / n with the V the stop reached
    assert column == pytest.approx(rash["violations"] / 60, abs=1e-4)
    # the adaptive order ran rash first where fast regressed, so the rate is labelled biased
    note = re.search(r" rash: stopped early: [^;]*(; [^;]*)*?; no n would certify it: the rate the stop used (\S+) \(biased\) "
                     r">= alpha", flat(result))  # in the notes under the table
    stop_rate = float(note.group(2))
    assert stop_rate > column  # scaled from the prompts it ran to all n, not V / n
    text = flat(result)
    assert "risk: V / n (V as in the V column)" in text and "'the rate the stop used' is V / prompts run, scaled to all n" in text
