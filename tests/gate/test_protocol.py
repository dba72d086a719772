"""The short run protocol of settled grid items (pytest_redline/protocol.py), through pytest.

Every report a settled item produces by the short protocol must equal the full protocol's:
the tests rerun a warm grid once as it is (the short protocol) and once with a plugin that
implements a phase hook (which keeps the full protocol), and compare every report's fields,
the JUnit XML, the terminal output under -v -rA and the JSON report. Which protocol ran
shows in PYTEST_CURRENT_TEST: the full protocol sets it for the setup and call phases
(and removes it before the teardown's report), the short one never does.
"""
from __future__ import annotations

import html
import json
import re
import xml.etree.ElementTree as ET

import pytest
from redline_fakes import Project

pytest_plugins = ["pytester"]

ALPHA = "--redline-alpha=0.1"

# Every report's fields, one JSON line each (durations and times left out: they differ).
RECORDER = '''
import json, os

def pytest_runtest_logreport(report):
    longrepr = report.longrepr
    line = {
        "nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
        "longrepr": list(longrepr) if isinstance(longrepr, tuple) else (None if longrepr is None else str(longrepr)),
        "sections": [list(s) for s in report.sections], "user_properties": [list(p) for p in report.user_properties],
        "keywords": sorted(report.keywords), "location": list(report.location),
        "wasxfail": getattr(report, "wasxfail", None), "head_line": report.head_line,
        "full_protocol": None if report.when == "teardown" else os.environ.get("PYTEST_CURRENT_TEST") is not None,
    }
    with open("reports.jsonl", "a") as f:
        f.write(json.dumps(line) + "\\n")
'''
# A phase hook of another plugin: it may do anything, so its presence keeps the full protocol.
FULL = "def pytest_runtest_setup(item):\n    pass\n"


@pytest.fixture
def project(pytester: pytest.Pytester) -> Project:
    project = Project(pytester)
    pytester.makepyfile(recorder=RECORDER, fullprotocol=FULL)
    return project


def reports(project: Project) -> list[dict]:
    path = project.path / "reports.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    path.unlink()
    return lines


def junit(project: Project, name: str) -> list[tuple]:
    """The JUnit XML without its times, host and timestamp, as comparable tuples."""
    root = ET.parse(project.path / name).getroot()
    for element in root.iter():
        for key in ("time", "timestamp", "hostname"):
            element.attrib.pop(key, None)
    return [(e.tag, sorted(e.attrib.items()), (e.text or "").strip()) for e in root.iter()]


def terminal(result) -> list[str]:
    lines = [re.sub(r"\d+\.\d+s|\d+\.\d+ s", "T", line).replace("short.", "X.").replace("full.", "X.") for line in result.outlines]
    return [line for line in lines if "rootdir:" not in line and "JSON report" not in line]


def without_times(report: dict) -> dict:
    for config in report["configs"]:
        config.pop("decode_seconds", None)
    report["spend"].pop("decoded_seconds", None)
    return report


@pytest.mark.slow  # gates under both protocols: 1.1-1.4 s of CPU here
def test_same_reports_short_protocol(project: Project) -> None:
    project.grid()
    project.run(ALPHA, "-p", "recorder")  # fills the store
    reports(project)
    common = (ALPHA, "-p", "recorder", "-v", "-rA")
    short = project.run(*common, "--junitxml=short.xml", "--redline-report=short.json")
    short_reports = reports(project)
    full = project.run(*common, "-p", "fullprotocol", "--junitxml=full.xml", "--redline-report=full.json")
    full_reports = reports(project)
    assert short.ret == full.ret == 0
    assert all(r["full_protocol"] for r in full_reports if r["when"] != "teardown")
    took_short = [r for r in short_reports if r["full_protocol"] is False]
    assert len(took_short) >= len([r for r in short_reports if r["when"] != "teardown"]) - 4  # the first item of the reference and of the candidates load the store
    assert {r["outcome"] for r in took_short} == {"passed", "skipped"}  # skips the schedule decided take it too
    for r in short_reports + full_reports:
        del r["full_protocol"]
    assert short_reports == full_reports
    assert junit(project, "short.xml") == junit(project, "full.xml")
    assert terminal(short) == terminal(full)
    assert without_times(project.report("short.json")) == without_times(project.report("full.json"))


@pytest.mark.slow  # in-process pytester gate run(s): 0.29 s CPU, over the inner loop's 50 s budget (issue 25)
def test_full_protocol_for_items_that_decode(project: Project) -> None:
    project.grid()
    project.run(ALPHA, "-p", "recorder", "--redline-full")
    first = {r["nodeid"]: r["full_protocol"] for r in reports(project) if r["when"] == "setup"}
    # Each config's first item decodes all its batches (capture on); the rest are settled.
    assert [node for node, full in first.items() if full] == ["redline.yaml::ref::q0", "redline.yaml::fast::q0", "redline.yaml::rash::q0"]


SESSION = '''
import pytest

@pytest.fixture(scope="session")
def session_resource():
    with open("events.txt", "a") as f:
        f.write("session up\\n")
    yield
    with open("events.txt", "a") as f:
        f.write("session down\\n")
'''
MODULE = '''
import pytest

@pytest.fixture(scope="module")
def module_resource(session_resource):
    with open("events.txt", "a") as f:
        f.write("{name} up\\n")
    yield
    with open("events.txt", "a") as f:
        f.write("{name} down\\n")

def test_one(module_resource):
    pass

def test_two(module_resource):
    pass
'''
EVENTS = '''
def pytest_runtest_logreport(report):
    if report.nodeid.startswith("redline.yaml") and report.when == "teardown":
        with open("events.txt", "a") as f:
            f.write("grid item done\\n")
'''


@pytest.mark.slow  # gates under both protocols: 1.1-1.4 s of CPU here
def test_same_fixture_lifetimes_short_protocol(project: Project) -> None:
    """Grid items between two test modules: the first module's fixture ends before the grid,
    the second's starts after it, and the session fixture lives through (as in the full protocol)."""
    project.grid()
    project.pytester.makeconftest(SESSION)
    project.pytester.makepyfile(test_a=MODULE.format(name="a"), test_b=MODULE.format(name="b"), events=EVENTS)
    project.run(ALPHA)  # fills the store
    runs = []
    for protocol in ((), ("-p", "fullprotocol")):
        result = project.run(ALPHA, "-p", "recorder", "-p", "events", *protocol, "test_a.py", "redline.yaml", "test_b.py")
        assert result.ret == 0, result.stdout.str()
        assert result.parseoutcomes()["passed"] == 127  # the fake grid's 123 passed items (rash: one batch, adaptive order) + 4
        runs.append((project.path / "events.txt").read_text().splitlines())
        (project.path / "events.txt").unlink()
        took_short = sum(r["full_protocol"] is False for r in reports(project))
        assert (took_short > 300) if not protocol else took_short == 0
    short, full = runs
    assert short == full
    grid = [i for i, e in enumerate(short) if e == "grid item done"]
    assert len(grid) == 180
    assert [e for e in short if e != "grid item done"] == ["session up", "a up", "a down", "b up", "b down", "session down"]
    assert short.index("a down") < grid[0] and grid[-1] < short.index("b up")


def test_same_html_report_short_protocol(project: Project) -> None:
    """pytest-html's data (its JSON blob, times left out) is the same under both protocols."""
    pytest.importorskip("pytest_html")
    project.grid()
    project.run(ALPHA)  # fills the store
    blobs = []
    for name, protocol in (("short", ()), ("full", ("-p", "fullprotocol"))):
        project.run(ALPHA, "-p", "recorder", *protocol, f"--html={name}.html")
        page = (project.path / f"{name}.html").read_text()
        blob = html.unescape(re.search(r'data-jsonblob="([^"]*)"', page).group(1))
        blob = json.dumps(json.loads(blob), sort_keys=True).replace(f"{name}.html", "X.html")
        blobs.append(re.sub(r'\d+ ms|\d\d:\d\d:\d\d|"duration": "[^"]*"|\d+\.\d+ s', "T", blob))
        took_short = sum(r["full_protocol"] is False for r in reports(project))
        assert (took_short > 300) if not protocol else took_short == 0
    assert blobs[0] == blobs[1]
