"""A pytest plugin that records each test's CPU (time.process_time) over setup, call and teardown.

Usage: python -m pytest -m "not slow" -q -p benchmarks.cpu_per_test
Writes the 40 costliest tests to the terminal and all of them, tab-separated, to the file named
by REDLINE_CPU_OUT (if set). CPU, not wall: on a shared machine the wall is inflated by load.
"""
from __future__ import annotations

import os
import time

import pytest

_cpu: dict[str, float] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    start = time.process_time()
    yield
    _cpu[item.nodeid] = _cpu.get(item.nodeid, 0.0) + time.process_time() - start


def pytest_terminal_summary(terminalreporter):
    ranked = sorted(_cpu.items(), key=lambda kv: kv[1], reverse=True)
    terminalreporter.write_sep("-", f"CPU per test: {sum(_cpu.values()):.1f} s in {len(_cpu)} tests")
    for nodeid, seconds in ranked[:40]:
        terminalreporter.write_line(f"{seconds:7.3f}  {nodeid}")
    out = os.environ.get("REDLINE_CPU_OUT")
    if out:
        with open(out, "w") as handle:
            handle.writelines(f"{seconds:.4f}\t{nodeid}\n" for nodeid, seconds in ranked)
