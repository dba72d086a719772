"""Decoding time per config: where pytest charges it, and where the gate reports it honestly.

A config's first item decodes all of that config's batches in its setup, so pytest's
``--durations`` (and pytest-timeout, and ``-x``) see one slow item per config. The gate
measures the time in ``engine.generate`` per config and reports it in the summary and as
``decode_seconds`` in each JSON config entry (docs/explanation/session.md).
"""
from __future__ import annotations

import re

import pytest
from redline_fakes import GRID, Project
from terminal_text import flat

pytest_plugins = ["pytester"]

DELAY = 0.1  # the fake engine sleeps this long per generate call
ARGS = ("--redline-alpha=0.1", "--redline-full", "--redline-report=report.json")


@pytest.fixture
def project(pytester: pytest.Pytester) -> Project:
    project = Project(pytester)
    project.grid(GRID, suite_args="{n: 40}", batch_size="20", engine_args=f"{{log_path: calls.jsonl, delay: {DELAY}}}")
    return project


def test_at_least_engine_sleep_decode_seconds(project: Project) -> None:
    result = project.run(*ARGS, "--durations=0", "-vv")
    assert result.ret == 0
    report = project.report()
    calls = {name: sum(c["config"] == params for c in project.calls()) for name, params in
             ((e["name"], e["params"]) for e in report["configs"])}
    seconds = {e["name"]: e["decode_seconds"] for e in report["configs"]}
    assert calls == {"ref": 2, "fast": 2, "rash": 2}  # 40 prompts in batches of 20
    for name, count in calls.items():
        assert count * DELAY <= seconds[name] < count * DELAY + 5.0
    assert sum(seconds.values()) == pytest.approx(report["spend"]["decode_seconds"], abs=0.01)
    assert re.search(r"decoding per config: ref \d+\.\d s, fast \d+\.\d s, rash \d+\.\d s \(pytest's durations charge it",
                     flat(result))  # the line wraps at 120 columns
    # pytest charges all of a config's decoding to the setup of its first item.
    durations = "\n".join(result.outlines)
    first = re.search(r"([\d.]+)s setup\s+redline\.yaml::fast::q0", durations)
    assert first is not None and float(first.group(1)) >= 2 * DELAY - 0.01


@pytest.mark.slow  # in-process pytester gate run(s): 0.29 s CPU, over the inner loop's 50 s budget (issue 25)
def test_zero_when_reused_decode_seconds(project: Project) -> None:
    assert project.run(*ARGS).ret == 0
    assert project.run(*ARGS).ret == 0  # every outcome from the store
    assert {e["name"]: e["decode_seconds"] for e in project.report()["configs"]} == {"ref": 0.0, "fast": 0.0, "rash": 0.0}
