"""The scorer's own memory stays small and linear (docs/explanation/sandbox.md, "The scorer's memory"): a
64M-character completion, and 974 programs that each print 1 MiB of 4-byte characters scored
through ``score_many``. Each runs in a scorer process of its own, whose peak RSS is read from
``/proc/self/status`` after the completions exist (the peak is reset there first)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from pytest_redline.suites.code import MAX_COMPLETION_CHARS

pytestmark = pytest.mark.slow  # bubblewrap jails; the 974 programs take about 40 s on 2 CPUs at load 12 to 15

BOUND_KIB = 64 << 10  # 64 MiB above the baseline

SCORER = r"""
import sys
from pytest_redline.suites.code import MBPP, HumanEval

def status(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field))

def above_baseline(score):
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS: the peak counts from here, the completions already built
    baseline = status("VmRSS:")
    verdicts = score()
    return status("VmHWM:") - baseline, verdicts

if sys.argv[1] == "long":
    suite = HumanEval(ids=["humaneval/HumanEval-0"])
    prompt = suite.prompts()[0]
    fences = "```\n" * (16 << 20)  # 64 Mi characters, every line a fence
    near_cap = "```\n" * ((1 << 20) // 4 - 1)  # just under the cap: scanned, assembled and run
    for text in (fences, near_cap):
        grown, verdicts = above_baseline(lambda: [suite.score(prompt, text)])
        print(len(text), grown, verdicts[0])
else:
    suite = MBPP(split="all")
    prompts = suite.prompts()
    texts = [p.meta["code"] + "\nprint('\U0001F600' * (1 << 18), flush=True)\n" for p in prompts]  # 1 MiB each
    grown, verdicts = above_baseline(lambda: suite.score_many(prompts, texts, workers=4))
    print(len(texts), grown, sum(verdicts))
"""


def scorer(which: str) -> list[list[int | str]]:
    done = subprocess.run([sys.executable, "-c", SCORER, which], capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    return [line.split() for line in done.stdout.split("\n") if line]


def test_bounded_scorer_memory_long_completion_code():
    # Fence assembly kept an 8-tuple per fence line: a 64M-character completion took +4.5 GiB.
    (length, grown, verdict), (near, near_grown, near_verdict) = scorer("long")
    assert int(length) == 64 << 20 and verdict == "False"  # over the cap: wrong, unrun
    assert int(near) < MAX_COMPLETION_CHARS and near_verdict == "False"  # run: the stub's tests fail
    assert int(grown) < BOUND_KIB and int(near_grown) < BOUND_KIB, (grown, near_grown)


def test_bounded_scorer_memory_many_outputs_code():
    # score_many held every result until the batch returned: 974 x 1 MiB of output, about 1 GiB
    # (4 GiB when one 4-byte character widened an ASCII output).
    [(count, grown, passed)] = scorer("many")
    assert int(count) == 974 and int(passed) == 974
    assert int(grown) < BOUND_KIB, grown
