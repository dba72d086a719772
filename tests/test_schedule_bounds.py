"""Declared cost bounds through the gate: a bound that lies makes the run partial, a memory grid
with declared constants decodes no contender, and scheduled runs deploy what --redline-full does
while decoding less (fakes: tests/redline_fakes)."""
from __future__ import annotations

import pytest
from redline_fakes import Project

pytest_plugins = ["pytester"]

ALPHA = "--redline-alpha=0.1"


@pytest.fixture
def project(pytester: pytest.Pytester) -> Project:
    return Project(pytester)


def by_name(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["configs"]}


def test_bound_that_lies_makes_the_run_partial(project: Project) -> None:
    project.grid(configs="{ref: {forwards: 10}, fast: {forwards: 5, wrong: [q3], bounds: {forwards: [1, 4], tokens: [0, 10]}}}")
    result = project.run(ALPHA, "--redline-report=report.json")
    assert result.ret == 1
    result.stdout.fnmatch_lines([
        "*engine 'fake' broke its declared cost bounds on config 'fast', prompt 'q*': forwards = 5 outside the declared [[]1, 4[]]*",
        "*PARTIAL RUN*",
    ])
    assert project.report()["certified"] is False


MEMORY = """\
name: memory-grid
suite: fake
suite_args: {n: 60}
engine: fake
engine_args: {log_path: calls.jsonl}
cost: memory_gb
direction: lower
reference: ref
batch_size: 8
configs:
  ref: {memory_gb: 4.0, wrong: [q1, q2, q9, q20, q33, q41, q50, q58], bounds: {memory_gb: constant}}
  half: {memory_gb: 2.0, wrong: [q3], bounds: {memory_gb: constant}}
  rash: {memory_gb: 1.0, wrong_every: 4, bounds: {memory_gb: constant}}
  third: {memory_gb: 1.5, wrong: [q7], bounds: {memory_gb: constant}}
deploy: fastest
"""


def decoded(project: Project) -> int:
    return sum(len(call["prompts"]) for call in project.calls())


def test_memory_grid_with_declared_constants_decodes_no_contender(project: Project) -> None:
    project.grid(MEMORY)
    full = project.run(ALPHA, "--redline-full", "--redline-no-cache", "--redline-report=full.json")
    assert full.ret == 0
    full_decoded = decoded(project)
    (project.path / "calls.jsonl").unlink()
    scheduled = project.run(ALPHA, "--redline-no-cache", "--redline-report=scheduled.json")
    assert scheduled.ret == 0
    one, two = project.report("full.json"), project.report("scheduled.json")
    assert [c["valid"] for c in one["configs"]] == [c["valid"] for c in two["configs"]]
    assert one["deployed"] == two["deployed"] == "third"
    assert by_name(two)["third"]["cost"] == pytest.approx(1.5)
    # the contenders ran their schedules only: no prompt decoded for cost beyond them
    calls = project.calls()
    assert full_decoded == 240
    assert decoded(project) == 240 - 3 * 8 - two["schedule"]["skipped"]["early_stop"]  # nothing where the reference is wrong
    assert all(not set(c["prompts"]) & {"q1", "q2", "q9"} for c in calls if c["config"]["memory_gb"] != 4.0)
    assert by_name(two)["half"]["valid"] and by_name(two)["half"]["prompts_run"] == 52
