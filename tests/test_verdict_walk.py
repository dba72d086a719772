"""How the verdict walks the gate's layers: profiled on the published LLaDA2 math replay.

``verdict.judge`` reads what the ledger recorded, slices the outcome table and certifies.
Each of those four layers (verdict, ledger, outcomes, risk) is visited in a few runs, not
bounced through: before issue 25 the scheduled replay's walk made 18 runs of them (verdict
6, ledger 4, outcomes 4, risk 4). Calls into the helpers they share (checks, record,
calibration, grid, schedule) are left out of the walk: the statistics validate each argument
with ``checks``, a call that says nothing about how the layers hand data to each other.
"""
from __future__ import annotations

import itertools
import sys
from collections import Counter
from pathlib import Path

import pytest
from redline_fakes import Project

from pytest_redline import session

pytest_plugins = ["pytester"]

ROOT = Path(__file__).parent.parent
GRID = ROOT / "grids" / "llada2_math_published.yaml"
MAX_RUNS = 3
LAYERS = ("pytest_redline.verdict", "pytest_redline.ledger", "pytest_redline.outcomes", "pytest_redline.risk")


def layer(module: str) -> str:
    """The gate's module or package a module belongs to (``pytest_redline.risk.binomial`` is
    ``pytest_redline.risk``)."""
    return ".".join(module.split(".")[:2])


def walk(call, layers=LAYERS):
    """The layer of each Python call into ``layers`` made during ``call()``, consecutive
    repeats collapsed into one run."""
    calls: list[str] = []

    def profile(frame, event, arg):
        if event == "call":
            name = layer(frame.f_globals.get("__name__") or "")
            if name in layers:
                calls.append(name)

    sys.setprofile(profile)
    try:
        value = call()
    finally:
        sys.setprofile(None)
    return value, [name for name, _ in itertools.groupby(calls)]


@pytest.mark.slow  # a gate over 7,084 replayed items in process: about 12 s
def test_judge_visits_each_module_in_at_most_three_runs(pytester: pytest.Pytester, monkeypatch) -> None:
    project = Project(pytester)
    outcomes = ROOT / "tests" / "data" / "redline" / "llada2_math.csv"
    project.grid(GRID.read_text().replace("../tests/data/redline/llada2_math.csv", str(outcomes)))
    walks = []
    judge = session.judge

    def profiled(record, *args, **kwargs):
        verdict, runs = walk(lambda: judge(record, *args, **kwargs))
        walks.append((record, verdict, runs))
        return verdict

    monkeypatch.setattr(session, "judge", profiled)
    result = project.run("--redline-alpha=0.1")
    assert result.ret == 0
    ((record, verdict, runs),) = walks
    assert record.skips and verdict.scheduled is not None and verdict.deployed == "acc85/semi70"
    counts = Counter(runs)
    assert set(counts) == set(LAYERS)
    assert max(counts.values()) <= MAX_RUNS, f"{len(runs)} runs: {' -> '.join(r.split('.')[1] for r in runs)}"


def test_walk_counts_runs_of_layers() -> None:
    """The counter itself: a call into another layer and back makes three runs."""
    from pytest_redline import text
    from pytest_redline.risk import binomial

    def mixed():
        text.number(0.5)
        binomial.binom_pvalue(1, 10, 0.1)
        text.number(0.25)
        return binomial.critical_count(10, 0.1, 0.1)

    _, runs = walk(mixed, ("pytest_redline.text", "pytest_redline.risk"))
    assert runs[0] == "pytest_redline.text" and runs[-1] == "pytest_redline.risk"
    assert Counter(runs)["pytest_redline.text"] == 2
