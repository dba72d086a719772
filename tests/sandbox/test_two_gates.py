"""Two gates on one host, as two CI jobs on one runner would be: each with a $TMPDIR of its own,
scoring at the same time (docs/explanation/sandbox.md, "Slots"). Slot locks are host-wide, so the gates hold
different slots, hence different uids and cgroups: one gate's program holding 62 threads leaves
the other's honest program passing, and neither kills the other's programs."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_redline.suites.sandbox import SLOTS, slots

pytestmark = [pytest.mark.slow,  # two gates, each a Python process with bubblewrap jails
              pytest.mark.skipif(os.geteuid() != 0, reason="slot uids need root (tests and CI run as root)")]

GATE = r"""
import json, sys
from pytest_redline.suites.sandbox import Limits, Program, run
code, tests, sandbox = sys.argv[1:]
result = run(Program(code, tests, Limits(cpu_seconds=5, wall_seconds=60)), sandbox=sandbox)
print(json.dumps([result.passed, result.reason, result.output[-500:]]))
"""
# Gate A's program: 62 threads (63 tasks of its uid, one below Limits.processes) until SIGUSR1.
THREADS = r"""
import os, signal, threading
done = threading.Event()
signal.signal(signal.SIGUSR1, lambda *_: done.set())
threads = [threading.Thread(target=done.wait, args=(60,)) for _ in range(62)]
for thread in threads:
    thread.start()
done.wait(60)
for thread in threads:
    thread.join()
print("uid", os.getuid())
"""
# Gate B's honest program: a pool of 8 threads.
HONEST = r"""
import os
from concurrent.futures import ThreadPoolExecutor
with ThreadPoolExecutor(max_workers=8) as pool:
    squares = list(pool.map(lambda n: n * n, range(100)))
print("uid", os.getuid())
"""


def gate(tmp: Path, code: str, tests: str, sandbox: str) -> subprocess.Popen:
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    return subprocess.Popen([sys.executable, "-c", GATE, code, tests, sandbox], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def threaded_program(seconds: float) -> int:
    """The host pid of a slot uid's process with 63 threads (gate A's program), once it runs."""
    base, deadline = slots.uid_base(), time.monotonic() + seconds
    while time.monotonic() < deadline:
        for entry in os.scandir("/proc"):
            try:
                status = dict(line.split(":", 1) for line in Path(entry.path, "status").read_text().splitlines())
                uid, threads = int(status["Uid"].split()[0]), int(status["Threads"])
            except (OSError, ValueError, KeyError):
                continue
            if base <= uid < base + SLOTS and threads == 63:
                return int(entry.name)
        time.sleep(0.05)
    pytest.fail(f"gate A's program with 63 threads did not appear within {seconds} s")


def verdict(process: subprocess.Popen) -> list:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("sandbox", ["namespaces", "process"])
def test_independent_two_gates_sandbox(tmp_path, sandbox):
    # Before, both gates took slot 0 from locks in their own $TMPDIR: B refused to score (A's live
    # cgroup), or (process sandbox) B's uid-killer SIGKILLed A's program, and A's 62 threads made
    # B's program fail with "can't start new thread" (RLIMIT_NPROC counts tasks per uid).
    a = gate(tmp_path / "a", THREADS, "pass\n", sandbox)
    b = None
    try:
        holder = threaded_program(60)
        b = gate(tmp_path / "b", HONEST, "assert squares[-1] == 99 * 99\n", sandbox)
        b_passed, b_reason, b_output = verdict(b)
        assert Path(f"/proc/{holder}").exists()  # A's program still ran while B scored, untouched
        os.kill(holder, signal.SIGUSR1)
        a_passed, a_reason, a_output = verdict(a)
    finally:
        for process in (a, b):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
    assert b_passed, (b_reason, b_output)
    assert a_passed, (a_reason, a_output)
    uids = {a_output.split("uid")[-1].split()[0], b_output.split("uid")[-1].split()[0]}
    assert len(uids) == 2, (a_output, b_output)
