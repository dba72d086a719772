"""What makes run_many fast without weakening it (docs/explanation/sandbox.md, "Starting ahead"): sandboxes
started ahead of their turn (at most ``workers`` programs run user code at once, a program's clock
starts at its turn, a sandbox whose turn never comes is torn down), and a bootstrap that imports
neither site nor os yet sets what site would."""
from __future__ import annotations

import ast
import contextlib
import json
import os
import subprocess
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


def test_site_without_site_sandbox():
    # The bootstrap imports neither site nor os, yet a program sees what site would set: the venv's
    # prefixes, its site-packages folders in site's order, exit() and friends.
    probe = ("import json, site, sys\nsite.venv(None)\n"
             "print(json.dumps([sys.prefix, list(dict.fromkeys(site.getsitepackages()))]))")
    done = subprocess.run([sys.executable, "-I", "-S", "-c", probe], cwd="/", env={}, capture_output=True, text=True,
                          check=True)
    prefix, sites = json.loads(done.stdout)
    code = ("import sys\nseen = sorted({'os', 'site'} & set(sys.modules))\n"
            "print(repr((seen, sys.prefix, sys.exec_prefix, sys.path[-len(SITES):], sys.flags.no_site)))\n"
            "print(exit, quit, type(help).__name__, __import__('builtins').__dict__.get('license'))\n")
    result = run_many([Program(f"SITES = {sites!r}\n" + code, "exit()\n")] * 2, workers=1)[0]
    assert result.reason == "exited before its tests finished", result  # exit() is site's: SystemExit
    lines = result.output.splitlines()
    assert ast.literal_eval(lines[0]) == ([], prefix, prefix, sites, 1), lines
    assert lines[1] == "Use exit() or Ctrl-D (i.e. EOF) to exit Use quit() or Ctrl-D (i.e. EOF) to exit _Helper None", lines
