"""A grid's own budget (``alpha:``) and advisory grids (``required: false``), through pytest.

The fake grid (redline_fakes.GRID): n = 60, `ref` always right, `fast` wrong on q3 (V = 1),
`rash` wrong on every 4th prompt (V = 15, not valid at alpha = 0.1).
"""
from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from redline_fakes import Project

from pytest_redline.grid import GridError, parse_grid

pytest_plugins = ["pytester"]


@pytest.fixture
def project(pytester: pytest.Pytester) -> Project:
    return Project(pytester)


def parse(text: str):
    return parse_grid("engine: fake\nsuite: fake\nreference: ref\nconfigs: {ref: {}}\n" + text, Path("g.yaml"))


def test_grid_keys_alpha_and_required() -> None:
    grid = parse("alpha: 0.05\nrequired: false\n")
    assert (grid.alpha, grid.advisory) == (0.05, True)
    assert (parse("").alpha, parse("").advisory) == (None, False)
    with pytest.raises(GridError, match=r"g.yaml: alpha: expected a number in \(0, 1\), got 1.5"):
        parse("alpha: 1.5\n")
    with pytest.raises(GridError, match="g.yaml: required: expected true or false, got 'no'"):
        parse("required: 'no'\n")


@pytest.mark.slow  # in-process pytester gate run(s): 0.9 s CPU, over the inner loop's budget
def test_grid_alpha_wins_over_the_option_and_the_report_says_where_each_came_from(project: Project) -> None:
    project.grid(filename="own.yaml", name="own", alpha="0.5")  # at 0.5, rash (V = 15 of 60) is valid
    project.grid(filename="shared.yaml", name="shared")
    result = project.run("--redline-alpha=0.1", "--redline-grid=own.yaml", "--redline-grid=shared.yaml",
                         "--redline-report=report.json")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*= redline: own (own.yaml): alpha=0.5 from the grid file =*",
                                 "alpha=0.5 delta=0.1 (share 0.05*", "*CERTIFIED (own, select): deploy rash*",
                                 "*= redline: shared (shared.yaml): alpha=0.1 from --redline-alpha =*",
                                 "alpha=0.1 delta=0.1 (share 0.05*",
                                 "*CERTIFIED (shared, select): deploy fast*"])
    own, shared = project.report()["grids"]
    assert (own["alpha"], own["alpha_source"], shared["alpha"], shared["alpha_source"]) == (
        0.5, "grid file", 0.1, "--redline-alpha")


@pytest.mark.slow  # in-process pytester gate run(s): 2.0 s CPU, over the inner loop's budget
def test_advisory_errors_are_xfails_and_fail_nothing(project: Project) -> None:
    """An advisory grid whose engine fails: its items are XFAIL (pytest's summary, JUnit XML
    <skipped type="pytest.xfail">), the grid is a partial run, and the session exits 0."""
    project.grid(filename="required.yaml", name="main")
    project.grid(filename="advisory.yaml", name="side", required="false",
                 configs="{ref: {forwards: 10}, fast: {forwards: 5, fail_on: q5}}")
    result = project.run("--redline-alpha=0.1", "--redline-full", "--redline-grid=required.yaml",
                         "--redline-grid=advisory.yaml", "--junitxml=junit.xml", "--redline-report=report.json", "-rx")
    assert result.ret == 0, result.stdout.str()
    assert result.parseoutcomes()["xfailed"] == 8  # the batch q0..q7 of `fast`
    result.stdout.fnmatch_lines([
        "*= redline: side (advisory.yaml): alpha=0.1 from --redline-alpha; advisory (required: false): reported, "
        "fails nothing =*",
        "*PARTIAL RUN: 8 of 120 items produced no outcome*", "*errored: 8 (fast::q0, *",
        "ADVISORY NOT CERTIFIED (side): partial run, 8 items missing",
        "*REDLINE CERTIFIED: 1 required grid; advisory, not certified (fails nothing): side*",
        "XFAIL *advisory.yaml::fast::q0 - redline: error in an advisory grid (required: false), which fails nothing: "
        "engine 'fake' failed on batch 1 of config 'fast'*",
    ])
    suite = ET.parse(project.path / "junit.xml").getroot().find("testsuite")
    assert (suite.get("failures"), suite.get("errors")) == ("0", "0")
    skipped = [case.find("skipped") for case in suite.iter("testcase") if "advisory" in case.get("classname")]
    xfails = [s for s in skipped if s is not None and s.get("type") == "pytest.xfail"]
    assert len(xfails) == 8 and "fake engine exploded on q5" in xfails[0].get("message")
    report = project.report()
    assert (report["certified"], report["advisory_not_certified"]) == (True, ["side"])
    side = report["grids"][1]
    assert (side["advisory"], side["complete"], len(side["missing"])) == (True, False, 8)
    assert {m["reason"] for m in side["missing"]} == {"errored"}


@pytest.mark.slow  # in-process pytester gate run(s): 1.4 s CPU, over the inner loop's budget
def test_a_failing_required_grid_still_fails_beside_an_advisory_one(project: Project) -> None:
    project.grid(filename="required.yaml", name="main", deploy="DROP")  # every candidate: rash is not valid
    project.grid(filename="advisory.yaml", name="side", required="false")
    result = project.run("--redline-alpha=0.1", "--redline-grid=required.yaml", "--redline-grid=advisory.yaml")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["NOT CERTIFIED (main, all): 1 of 2 required configs not valid at alpha=0.1: rash",
                                 "ADVISORY CERTIFIED (side, select): deploy fast*",
                                 "*REDLINE NOT CERTIFIED: main (exit status 1)*"])


@pytest.mark.slow  # in-process pytester gate run(s): 2.2 s CPU, over the inner loop's budget
def test_advisory_partial_run_and_deploy_override(project: Project) -> None:
    """Deselected items of an advisory grid make it partial, and fail nothing; --redline-deploy
    applies to it as to every grid (the named config must exist there)."""
    project.grid(filename="required.yaml", name="main")
    project.grid(filename="advisory.yaml", name="side", required="false")
    result = project.run("--redline-alpha=0.1", "--redline-grid=required.yaml", "--redline-grid=advisory.yaml",
                         "--redline-deploy=rash", "--deselect=advisory.yaml::ref::q0")
    assert result.ret == 1  # main: rash is not valid at 0.1
    result.stdout.fnmatch_lines(["NOT CERTIFIED (main, gate): rash is NOT valid at alpha=0.1; deploy ref (the reference)",
                                 "*deselected: 1 (ref::q0)",
                                 "ADVISORY NOT CERTIFIED (side): rash partial run, 1 items missing; deploy the reference ref",
                                 "*REDLINE NOT CERTIFIED: main (exit status 1); advisory, not certified (fails nothing): side*"])
    certified = project.run("--redline-alpha=0.1", "--redline-grid=required.yaml", "--redline-grid=advisory.yaml",
                            "--redline-deploy=fast", "--deselect=advisory.yaml::ref::q0")
    assert certified.ret == 0
    certified.stdout.fnmatch_lines(["CERTIFIED (main, gate): fast is certified; deploy fast*",
                                    "ADVISORY NOT CERTIFIED (side): fast partial run, 1 items missing*"])
