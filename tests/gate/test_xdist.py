"""End-to-end in subprocesses: pytest-xdist parity, and a run killed with SIGKILL."""
from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import time

import pytest
from redline_fakes import Project

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.slow  # subprocess gates (xdist workers, a killed run)

ALPHA = "--redline-alpha=0.1"


@pytest.fixture
def project(pytester: pytest.Pytester) -> Project:
    return Project(pytester)


def stored_keys(project: Project, cache: str = ".redline") -> set[str]:
    path = project.path / cache / "outcomes.sqlite"
    if not path.exists():
        return set()
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        return {row[0] for row in con.execute("SELECT key FROM outcomes")}
    except sqlite3.OperationalError:  # the schema is not created yet
        return set()
    finally:
        con.close()


def test_equivalent_verdict_xdist_and_serial(project: Project) -> None:
    project.grid()
    parallel = project.run_subprocess(ALPHA, "-n", "2", "--redline-report=xdist.json", "--redline-cache-dir=xdist")
    assert parallel.ret == 0
    parallel.stdout.fnmatch_lines(["*REDLINE CERTIFIED: 1 grid*", "*123 passed, 52 skipped, 5 regressed*"])
    batches = [(call["config"]["forwards"], tuple(call["prompts"])) for call in project.calls()]
    assert len(batches) == len(set(batches)) == 8 + 8 + 1  # each batch decoded once; rash (q3 first) stops after 1
    (project.path / "calls.jsonl").unlink()
    serial = project.run(ALPHA, "--redline-report=serial.json", "--redline-cache-dir=serial")
    assert serial.ret == 0
    assert sorted((c["config"]["forwards"], tuple(c["prompts"])) for c in project.calls()) == sorted(batches)
    parallel_report, serial_report = project.report("xdist.json"), project.report("serial.json")
    for report in (parallel_report, serial_report):  # wall time differs
        assert sum(e["decode_seconds"] for e in report["configs"]) == pytest.approx(report["spend"]["decode_seconds"], abs=0.01)
        del report["spend"]["decode_seconds"], report["spend"]["naive_seconds_estimate"]
        for entry in report["configs"]:
            del entry["decode_seconds"]
    assert parallel_report == serial_report


def test_deselection_reported_from_xdist_workers(project: Project) -> None:
    project.grid()
    result = project.run_subprocess(ALPHA, "-n", "2", "-k", "fast and q1")
    assert result.ret == 1
    result.stdout.fnmatch_lines([
        "*PARTIAL RUN: 169 of 180 items produced no outcome*",
        "*deselected: 169 (ref::q0, ref::q1, ref::q2, ... (166 more))*",
    ])


def test_sigkill_then_rerun_loses_no_finished_outcome(project: Project) -> None:
    project.grid(engine_args="{log_path: calls.jsonl, delay: 0.25}")
    run = subprocess.Popen(project.command(ALPHA, "-q"), cwd=project.path, env=project.env(),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while len(stored_keys(project)) < 40 and time.monotonic() < deadline and run.poll() is None:
        time.sleep(0.05)
    os.kill(run.pid, signal.SIGKILL)
    run.wait()
    before = stored_keys(project)
    assert 40 <= len(before) < 136, "the kill should land mid-run"

    rerun = project.run(ALPHA, "--redline-report=rerun.json")
    assert rerun.ret == 0
    assert stored_keys(project) >= before  # nothing that had finished was lost
    report = project.report("rerun.json")
    assert report.pop("outcomes") == {"reused": len(before), "decoded": report["spend"]["items_run"] - len(before)}
    clean = project.run(ALPHA, "--redline-no-cache", "--redline-report=clean.json")
    assert clean.ret == 0
    expected = project.report("clean.json")
    expected.pop("outcomes")
    assert report.pop("spend")["forwards"] == expected.pop("spend")["forwards"]
    for entry in report["configs"] + expected["configs"]:
        del entry["decode_seconds"]  # wall time, and the rerun decoded less
    assert report == expected
