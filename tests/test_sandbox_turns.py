"""run_many starts sandboxes ahead of their turn (docs/sandbox.md, "Starting ahead"): at most
``workers`` programs run user code at once, a program's clock starts at its turn, and a sandbox
whose turn never comes is torn down."""
from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import pytest

from pytest_redline.suites.sandbox import Limits, Program, api, jail, run_many
from pytest_redline.suites.sandbox.execute import _execute
from pytest_redline.suites.sandbox.slots import _slot

pytestmark = pytest.mark.slow  # bubblewrap jails and child processes

# CLOCK_MONOTONIC is the host's inside the namespaces (no time namespace): the intervals compare.
SLEEPER = "import time\nstarted = time.monotonic()\ntime.sleep(0.4)\nprint('RAN', started, time.monotonic())\n"


@pytest.mark.parametrize("sandbox", ["namespaces", "process"])
def test_turns_run_many(sandbox):
    # Four 0.4 s programs, one worker, each with 1.2 s of wall clock: the last waits over 1.2 s for
    # its turn, so it passes only if its clock starts at its turn; and no two ever overlap.
    assert api.STARTING >= 1
    programs = [Program(SLEEPER, "pass\n", Limits(cpu_seconds=1, wall_seconds=1.2)) for _ in range(4)]
    results = run_many(programs, workers=1, sandbox=sandbox)
    assert all(r.passed for r in results), results
    spans = sorted(tuple(map(float, r.output.split("RAN")[1].split())) for r in results)
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:])), spans


class Refused(Exception):
    pass


@contextlib.contextmanager
def refused():
    raise Refused
    yield  # pragma: no cover


def bwraps_of(pid: int) -> list[int]:
    """Our children running bwrap."""
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        with contextlib.suppress(OSError):
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
            if fields.get("Name", "").strip() == "bwrap" and int(fields["PPid"]) == pid:
                found.append(int(status.parent.name))
    return found


def test_turn_never_comes_sandbox():
    # A sandbox started ahead whose turn fails (an error while waiting) is killed and reaped: no
    # bwrap of ours is left, and the slot can run the next program.
    python = os.path.abspath(sys.executable)
    built = jail._jail(python)
    with _slot() as uid:
        with pytest.raises(Refused):
            _execute(Program("x = 1\n", "assert x == 1\n"), built.launcher(uid), python, refused())
    assert bwraps_of(os.getpid()) == []
    results = run_many([Program("x = 1\n", "assert x == 1\n")] * 2, workers=1)
    assert all(r.passed for r in results), results
