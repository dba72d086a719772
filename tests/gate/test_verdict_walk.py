"""How the verdict walks the gate's modules: profiled on the published LLaDA2 math replay.

``verdict.decide`` reads what the ledger recorded, slices the outcome table, reads the grid's
settings, confirms the schedule's stops and certifies. Every ``pytest_redline`` module it calls
into is counted (a package such as ``pytest_redline.risk`` as one), consecutive calls collapsed
into one run: no module may appear in more than three runs. Before issue 25 (6d5fd4b) the
scheduled replay's walk made 52 runs (ledger 10, risk 10, verdict 7, record 6, checks 6, ...)
and the ``--redline-full`` one 19 (risk 6); after the first pass of that issue 42 (risk 10,
verdict 8, checks 7) and 29; now 14 (verdict 3, risk 3, schedule 2, the others 1) and 11.
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

ROOT = Path(__file__).resolve().parents[2]
GRID = ROOT / "grids" / "llada2_math_published.yaml"
MAX_RUNS = 3
PACKAGE = "pytest_redline."


def layer(module: str) -> str:
    """The gate's module or package a module belongs to (``pytest_redline.risk.binomial`` is
    ``pytest_redline.risk``)."""
    return ".".join(module.split(".")[:2])


def walk(call, package=PACKAGE):
    """The module (package: :func:`layer`) of each Python call into ``package`` made during
    ``call()``, consecutive repeats collapsed into one run."""
    calls: list[str] = []

    def profile(frame, event, arg):
        if event == "call":
            name = frame.f_globals.get("__name__") or ""
            if name.startswith(package):
                calls.append(layer(name))

    sys.setprofile(profile)
    try:
        value = call()
    finally:
        sys.setprofile(None)
    return value, [name for name, _ in itertools.groupby(calls)]


@pytest.mark.slow  # a gate over 7,084 replayed items in process: about 12 s
@pytest.mark.parametrize("options", [(), ("--redline-full",)], ids=["scheduled", "full"])
def test_decide_visits_each_module_in_at_most_three_runs(pytester: pytest.Pytester, monkeypatch, options) -> None:
    project = Project(pytester)
    outcomes = ROOT / "tests" / "data" / "redline" / "llada2_math.csv"
    project.grid(GRID.read_text().replace("../tests/data/redline/llada2_math.csv", str(outcomes)))
    walks = []
    decide = session.decide

    def profiled(record, *args, **kwargs):
        verdict, runs = walk(lambda: decide(record, *args, **kwargs))
        walks.append((record, verdict, runs))
        return verdict

    monkeypatch.setattr(session, "decide", profiled)
    result = project.run("--redline-alpha=0.1", *options)
    assert result.ret == 0
    ((record, verdict, runs),) = walks
    assert verdict.deployed == "acc85/semi70" and verdict.alpha_min is not None
    assert bool(record.skips) == (verdict.scheduled is not None) == (not options)
    counts = Counter(runs)
    # the statistics, the table and the settings are all reached, each in a run of its own
    assert {"verdict", "ledger", "outcomes", "calibration", "grid", "risk", "costbounds"} <= {r.split(".")[1] for r in counts}
    assert max(counts.values()) <= MAX_RUNS, f"{len(runs)} runs: {' -> '.join(r.split('.')[1] for r in runs)}"


def test_walk_counts_runs_of_layers() -> None:
    """The counter itself: a call into another layer and back makes three runs."""
    from pytest_redline.report import text
    from pytest_redline.risk import binomial

    def mixed():
        text.number(0.5)
        binomial.binom_pvalue(1, 10, 0.1)
        text.number(0.25)
        return binomial.critical_count(10, 0.1, 0.1)

    _, runs = walk(mixed)
    assert runs[0] == "pytest_redline.report" and runs[-1] == "pytest_redline.risk"
    assert Counter(runs)["pytest_redline.report"] == 2
