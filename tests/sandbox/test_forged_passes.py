"""Forged passes that only the verdict's rules can stop (docs/explanation/sandbox.md, "The verdict"): a fork
oracle, a fork hedge, a key that collides with a name the tests define, and the token read back
through ``/proc/self/mem``. Each program below is wrong, and each passed before only the
bootstrap's own process could write the token, the tests' namespace held only ``str`` keys and
the bootstrap's process was not dumpable."""
from __future__ import annotations

import pytest

from pytest_redline.suites.sandbox import Limits, Program, run

pytestmark = pytest.mark.slow  # bubblewrap jails and child processes

# A HumanEval-shaped task: check(candidate) asserts ten answers of a yes/no function.
PRIMES = (2, 3, 5, 7, 11, 13)
CHECK = ("def check(candidate):\n"
         + "".join(f"    assert candidate({n}) is {n in PRIMES}\n" for n in range(2, 14))
         + "check(is_prime)\n")
LIMITS = Limits(cpu_seconds=5, wall_seconds=20)

# Knows no primes. Each forked child returns into the harness, which runs the tests there; the
# child reports every input it is asked about on a pipe, so the last one reported before it dies
# is the answer the tests rejected, and the main process flips it. The child that gets through
# the tests writes the token; the main process then leaves with status 0 without running them.
ORACLE = r"""
import os
flipped = set()
for attempt in range(20):
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(read_end)
        def is_prime(n):
            os.write(write_end, b"%d\n" % n)
            return n in flipped
        break
    os.close(write_end)
    asked = b""
    while True:
        chunk = os.read(read_end, 4096)
        if not chunk:
            break
        asked += chunk
    os.close(read_end)
    status = os.waitpid(child, 0)[1]
    if os.waitstatus_to_exitcode(status) == 0:
        os._exit(0)  # a child got through: leave before the tests run here
    flipped ^= {int(asked.split()[-1])}
else:
    os._exit(1)
"""

# Four candidate answers, one per forked child; the main process runs no tests at all. Only the
# last candidate is right, and each of the three wrong ones fails on its own.
CANDIDATES = ["lambda n: n % 2 == 1", "lambda n: n < 8", "lambda n: n in (2, 3, 5, 7)",
              "lambda n: n > 1 and all(n % d for d in range(2, n))"]
HEDGE = r"""
import os
children = []
for candidate in CANDIDATES:
    child = os.fork()
    if child == 0:
        is_prime = eval(candidate)
        break
    children.append(child)
else:
    for child in children:
        os.waitpid(child, 0)
    os._exit(0)
"""


def hedge(candidates: list[str]) -> str:
    return HEDGE.replace("CANDIDATES", repr(candidates))


# A str subclass with hash('check'): once a dict holds it, lookups compare keys the general way.
# Its __eq__ says "different" while the tests' 'def check' stores the real function, then "same"
# when check(...) is looked up, so the program's no-op runs instead of the tests.
COLLISION = r"""
class Twin(str):
    calls = 0
    def __hash__(self):
        return hash(KEY)
    def __eq__(self, other):
        Twin.calls += 1
        return Twin.calls > 1
    __ne__ = lambda self, other: not self.__eq__(other)

def is_prime(n):
    return False

WHERE[Twin("decoy")] = FAKE
"""
GLOBALS = COLLISION.replace("KEY", "'check'").replace("WHERE", "globals()").replace("FAKE", "lambda candidate: None")
# The same through builtins: 'len' taken out, the twin put in, and the real len put back (so
# builtins.len is still the real one): the tests' len(...) finds the twin first.
BUILTINS = (COLLISION.replace("KEY", "'len'").replace("WHERE", "builtins.__dict__").replace("FAKE", "lambda seq: 3")
            .replace("class Twin", "import builtins\nreal = builtins.__dict__.pop('len')\nclass Twin")
            + "builtins.len = real\n")
LENGTH_CHECK = "def check(candidate):\n    assert len([n for n in range(2, 8) if candidate(n)]) == 3\ncheck(is_prime)\n"


def test_fail_fork_oracle_verdict():
    # Passed before: the child that got through the tests wrote the token and the main process exited 0.
    result = run(Program(ORACLE, CHECK, LIMITS))
    assert not result.passed, result
    assert result.reason == "exited before its tests finished", result


def test_fail_fork_hedge_verdict():
    # Passed before with one right candidate of four; each wrong one alone fails, and so do they together.
    for wrong in CANDIDATES[:3]:
        assert not run(Program(f"is_prime = {wrong}\n", CHECK, LIMITS)).passed, wrong
    assert run(Program(f"is_prime = {CANDIDATES[3]}\n", CHECK, LIMITS)).passed
    result = run(Program(hedge(CANDIDATES), CHECK, LIMITS))
    assert not result.passed, result


@pytest.mark.parametrize("code, tests", [(GLOBALS, CHECK), (BUILTINS, LENGTH_CHECK)], ids=["globals", "builtins"])
def test_fail_key_collision_verdict(code, tests):
    # Passed before: the twin key answered the tests' lookup of check (or len) with the program's own.
    result = run(Program(code, tests, LIMITS))
    assert not result.passed, result
    assert "AssertionError" in result.output, result.output[-500:]


def test_pass_forked_child_returning_verdict():
    # An honest program whose child returns into the harness without exiting: the child leaves
    # before the tests, and the main process's own run of them decides.
    code = "import os\nif os.fork() == 0:\n    pass\nelse:\n    os.wait()\n\ndef is_prime(n):\n" \
           "    return n > 1 and all(n % d for d in range(2, n))\n"
    assert run(Program(code, CHECK, LIMITS)).passed
    assert not run(Program(code.replace("n > 1", "n > 2"), CHECK, LIMITS)).passed


def test_fail_child_forked_in_tests_verdict():
    # A child forked inside the tested function returns through the tests and the harness: it must
    # not write the token, and the main process leaves with status 0 once the child is done.
    code = ("import os\nforked = []\ndef is_prime(n):\n    if not forked:\n        forked.append(os.fork())\n"
            "    if forked[0] == 0:\n        return n in (2, 3, 5, 7, 11, 13)\n    os.waitpid(forked[0], 0)\n"
            "    os._exit(0)\n")
    result = run(Program(code, CHECK, LIMITS))
    assert not result.passed, result


# Reads every writable mapping of its own memory through /proc/self/mem (no ctypes, no frames),
# takes the one token-shaped string there and writes it to every pipe it holds, then exits 0.
OWN_MEMORY = r"""
import os, re
found = set()
with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb", buffering=0) as mem:
    for line in maps:
        span, perms = line.split()[:2]
        if perms.startswith("rw"):
            start, end = (int(x, 16) for x in span.split("-"))
            try:
                mem.seek(start)
                found.update(re.findall(rb"(?<![0-9a-f])[0-9a-f]{32}(?![0-9a-f])", mem.read(end - start)))
            except OSError:
                pass
if len(found) == 1:
    for fd in range(3, 64):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:"):
                os.write(fd, min(found))
        except OSError:
            pass
    os._exit(0)
def is_prime(n):
    return False
"""


def test_fail_own_memory_token_verdict():
    # Passed before: the token, a bytes object of the bootstrap, was the one token-shaped string in
    # the process's memory. The bootstrap's process is not dumpable now: /proc/self/mem is root's.
    result = run(Program(OWN_MEMORY, CHECK, LIMITS))
    assert not result.passed, result
    assert "PermissionError" in result.output and "/proc/self/mem" in result.output, result.output[-500:]
