"""How long scoring the 164 HumanEval canonical solutions takes, sandboxed, against a baseline.

Baseline: each program (prompt + canonical solution + test + check) run in a plain
``python -s -c`` subprocess of the sandbox's own interpreter, one after another, with no
sandbox (no slot, uid, limits, temporary folder or sentinel). Candidates, in the same run:
``HumanEval.score`` one outcome at a time (the path of a caller that scores per outcome), and
``HumanEval.score_many`` (a pool with one worker per usable CPU). The budget is 30 s on 2 cores.

    python benchmarks/bench_humaneval.py [--workers N]
"""
from __future__ import annotations

import argparse
import os
import platform
import subprocess
import time

from pytest_redline.suites.code import HumanEval
from pytest_redline.suites.sandbox import interpreter

BUDGET_SECONDS = 30.0


def baseline(suite: HumanEval, prompts, texts, python: str) -> float:
    start = time.perf_counter()
    for prompt, text in zip(prompts, texts):
        program = suite.program(prompt, text)
        done = subprocess.run([python, "-s", "-c", program.code + "\n" + program.tests], capture_output=True, check=False)
        assert done.returncode == 0, prompt.id
    return time.perf_counter() - start


def timed(function, *args) -> tuple[float, object]:
    start = time.perf_counter()
    value = function(*args)
    return time.perf_counter() - start, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=None, help="score_many's pool size (default: usable CPUs)")
    workers = parser.parse_args().workers or len(os.sched_getaffinity(0))

    suite = HumanEval()
    prompts = suite.prompts()
    texts = [p.meta["canonical_solution"] for p in prompts]
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    print(f"hardware: {len(os.sched_getaffinity(0))} usable CPUs ({cpu}); load average {os.getloadavg()[0]:.1f}")
    python = interpreter()
    print(f"harness: Python {platform.python_version()}; programs run under {python}; uid {os.geteuid()}")

    suite.score_many(prompts[:4], texts[:4], workers)  # warm up: page cache, interpreter probe

    base = baseline(suite, prompts, texts, python)
    one, scores_one = timed(lambda: [suite.score(p, t) for p, t in zip(prompts, texts)])
    many, scores_many = timed(suite.score_many, prompts, texts, workers)
    assert all(scores_one) and all(scores_many), "a canonical solution failed"

    print(f"{len(prompts)} canonical solutions, all pass")
    print(f"{'':34}{'seconds':>9}{'vs baseline':>13}")
    print(f"{'baseline: plain subprocess, serial':34}{base:9.2f}{1.0:12.2f}x")
    print(f"{'score(): sandbox, serial':34}{one:9.2f}{one / base:12.2f}x")
    print(f"{f'score_many(): sandbox, {workers} workers':34}{many:9.2f}{many / base:12.2f}x")
    verdict = "within" if many <= BUDGET_SECONDS else "OVER"
    print(f"score_many: {many:.2f} s, {verdict} the {BUDGET_SECONDS:.0f} s budget ({many / BUDGET_SECONDS:.0%} of it)")


if __name__ == "__main__":
    main()
