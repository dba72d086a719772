"""The execution sandbox: programs pass only when their tests ran to the end, and adversarial
programs fail fast and leave the harness working (and, as root, their neighbours untouched)."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from pytest_redline.suites.sandbox import SLOT_UID_BASE, Limits, Program, run, run_many

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="per-slot uids need root (tests and CI run as root)")

GOOD = Program("def add(a, b):\n    return a + b\n", "assert add(2, 3) == 5\n")
FAST = Limits(cpu_seconds=1, wall_seconds=2)


def assert_harness_works() -> None:
    result = run(GOOD)
    assert result.passed, result


def test_pass_tests_ran_to_end_sandbox():
    result = run(GOOD)
    assert result.passed and result.reason == "passed"


def test_fail_failed_assertion_sandbox():
    result = run(Program("def add(a, b):\n    return a - b\n", "assert add(2, 3) == 5\n"))
    assert not result.passed
    assert result.reason == "exit status 1" and "AssertionError" in result.output


def test_fail_syntax_error_sandbox():
    result = run(Program("def add(a, b)\n    return a + b\n", "assert add(2, 3) == 5\n"))
    assert not result.passed and "SyntaxError" in result.output


def test_fail_code_cannot_swallow_tests_sandbox():
    # An unterminated string in the code cannot absorb the tests: the two are compiled apart.
    result = run(Program('def add(a, b):\n    return 0\nx = """\n', 'assert add(2, 3) == 5\n"""\n'))
    assert not result.passed


@pytest.mark.parametrize("exit_call", ["sys.exit(0)", "os._exit(0)", "raise SystemExit", "exit()"])
def test_fail_exit_before_tests_sandbox(exit_call):
    code = f"import os, sys\ndef add(a, b):\n    return a + b\nif __name__ == '__main__':\n    {exit_call}\n"
    result = run(Program(code, "assert add(2, 3) == 5\n"))
    assert not result.passed
    assert result.reason == "exited before its tests finished"


ADVERSARIAL = {
    # name: (code, limits, the most seconds it may take)
    "infinite loop": ("while True:\n    pass\n", FAST, 3.0),
    "sleep forever": ("import time\ntime.sleep(10**6)\n", FAST, 5.0),
    "fork bomb": ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n", FAST, 10.0),
    "memory bomb": ("x = bytearray(1 << 40)\n", Limits(), 3.0),
    "growing memory": ("chunks = []\nwhile True:\n    chunks.append(bytearray(1 << 24))\n", Limits(memory_bytes=256 << 20), 5.0),
    "a million lines": ("for i in range(10**6):\n    print(i)\n", Limits(), 5.0),
    "closing stdout": ("import os, time\nos.close(1)\nos.close(2)\ntime.sleep(10**6)\n", FAST, 5.0),
    "closing every fd": ("import os\nos.closerange(0, 1024)\n", Limits(), 3.0),
    "kill the process group": ("import os, signal\nos.killpg(0, signal.SIGKILL)\n", Limits(), 3.0),
    "huge file": ("with open('big', 'wb') as f:\n    f.write(b'x' * (64 << 20))\n", Limits(), 5.0),
}


@pytest.mark.parametrize("name", list(ADVERSARIAL))
def test_fail_fast_adversarial_sandbox(name):
    code, limits, most = ADVERSARIAL[name]
    start = time.monotonic()
    result = run(Program(code, "pass\n", limits))
    assert not result.passed, result
    assert time.monotonic() - start < most, result
    assert_harness_works()


def test_fail_fast_output_over_cap_sandbox():
    result = run(Program("for i in range(10**6):\n    print(i)\n", "pass\n"))
    assert result.reason == f"output over {Limits().output_bytes} bytes"
    assert len(result.output) <= Limits().output_bytes


def test_contained_write_outside_workdir_sandbox(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o755)
    code = f"with open({str(outside / 'written')!r}, 'w') as f:\n    f.write('x')\n"
    result = run(Program(code, "pass\n"))
    if os.geteuid() == 0:
        assert not result.passed and "PermissionError" in result.output
        assert not (outside / "written").exists()
    assert_harness_works()


def test_fresh_removed_workdir_sandbox():
    first = run(Program("import os\nopen('left', 'w').write('x')\nprint(os.getcwd())\n", "pass\n"))
    workdir = Path(first.output.strip())
    assert first.passed and workdir.name.startswith("redline-sandbox-")
    assert not workdir.exists()
    second = run(Program("import os\n", "assert sorted(os.listdir('.')) == ['program.py', 'tests.py']\n"))
    assert second.passed, second


def test_stripped_environment_and_no_stdin_sandbox(monkeypatch):
    monkeypatch.setenv("REDLINE_SECRET", "do-not-leak")
    code = "import os, sys\nenv = dict(os.environ)\ndata = sys.stdin.read()\n"
    tests = ("assert 'REDLINE_SECRET' not in env, env\n"
             "assert env['HOME'] == env['TMPDIR'] == os.getcwd()\n"
             "assert data == ''\n")
    result = run(Program(code, tests))
    assert result.passed, result


def test_bound_limits_sandbox():
    limits = Limits(cpu_seconds=3, memory_bytes=512 << 20, processes=8, file_bytes=1 << 20, open_files=32)
    tests = ("import resource as r\n"
             "assert r.getrlimit(r.RLIMIT_CPU)[0] == 3\n"
             "assert r.getrlimit(r.RLIMIT_AS)[0] == 512 << 20\n"
             "assert r.getrlimit(r.RLIMIT_NPROC)[0] == 8\n"
             "assert r.getrlimit(r.RLIMIT_FSIZE)[0] == 1 << 20\n"
             "assert r.getrlimit(r.RLIMIT_NOFILE)[0] == 32\n"
             "assert r.getrlimit(r.RLIMIT_CORE)[0] == 0\n")
    result = run(Program("", tests, limits))
    assert result.passed, result


@root_only
def test_unprivileged_uid_sandbox():
    tests = (f"import os\nassert os.getuid() >= {SLOT_UID_BASE} and os.getgid() >= {SLOT_UID_BASE}\n"
             "assert os.getgroups() in ([], [os.getgid()])\n")
    result = run(Program("", tests))
    assert result.passed, result


@root_only
def test_contained_kill_parent_sandbox():
    result = run(Program("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n", "pass\n"))
    assert not result.passed and "PermissionError" in result.output
    assert_harness_works()


@root_only
def test_isolated_fork_bomb_from_neighbours_sandbox():
    # While a fork bomb fills its own slot's process limit and another program kill(-1)s,
    # programs in other slots still fork and finish.
    bomb = Program(ADVERSARIAL["fork bomb"][0], "pass\n", Limits(cpu_seconds=2, wall_seconds=3))
    killer = Program("import os, signal, time\ntime.sleep(0.5)\nos.kill(-1, signal.SIGKILL)\n", "pass\n")
    forker = Program(
        "import os, time\n"
        "def children(n):\n"
        "    codes = []\n"
        "    for _ in range(n):\n"
        "        time.sleep(0.3)\n"
        "        pid = os.fork()\n"
        "        if pid == 0:\n"
        "            os._exit(7)\n"
        "        codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n"
        "    return codes\n",
        "assert children(5) == [7] * 5\n", Limits(cpu_seconds=5, wall_seconds=30))
    results = run_many([bomb, forker, killer, forker], workers=4)
    assert [r.passed for r in results] == [False, True, True, True], results


def test_equivalent_run_many_run_sandbox():
    programs = [Program(f"x = {i}\n", "assert x % 3 != 0\n") for i in range(8)]
    assert [r.passed for r in run_many(programs, workers=2)] == [run(p).passed for p in programs]


@pytest.mark.parametrize("field, value", [("cpu_seconds", 0), ("memory_bytes", -1), ("processes", True), ("wall_seconds", 0)])
def test_rejected_bad_limits_sandbox(field, value):
    with pytest.raises(ValueError, match=f"Limits.{field}: expected a number > 0, got {value!r}"):
        Limits(**{field: value})


def test_rejected_non_unicode_program_sandbox():
    with pytest.raises(ValueError, match="Program.code: not valid Unicode"):
        Program("x = '\ud800'\n")
    with pytest.raises(TypeError, match="Program.tests: expected str, got bytes"):
        Program("", b"assert True")
