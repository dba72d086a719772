"""The scorers on every vendored reference solution, and on each with its final answer changed
(the first digit of the number after ``####`` or in the last box; "+1" appended to a box without one).

For GSM8K (1319 solutions) and MATH-500 (500, with math-verify and with our own rules only):
how many reference solutions score correct (all must), how many perturbed ones score wrong
(all must), and the time per output, as a ratio of the math-verify run to our own rules
measured in the same process. No model, no GPU.

    python benchmarks/bench_scoring.py
"""
from __future__ import annotations

import json
import platform
import sys
from pathlib import Path
import time

from pytest_redline.suites.answers import boxes
from pytest_redline.suites.equivalence import math_verify_version
from pytest_redline.suites.math import GSM8K, MATH500
from pytest_redline.suites.records import DATA

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_suite_math import perturb as perturbed  # noqa: E402  (the tests' own: the first digit changed)


def gsm8k_wrong(text: str) -> str:
    body, answer = text.rsplit("####", 1)
    return f"{body}####{perturbed(answer)}"


def math_wrong(text: str) -> str:
    start, content, end = boxes(text)[-1]
    return text[:end - 1 - len(content)] + perturbed(content) + text[end - 1:]


def sweep(suite, prompts, texts, wrong) -> tuple[int, int, float]:
    """(reference solutions correct, perturbed ones wrong, seconds per output)."""
    start = time.perf_counter()
    correct = sum(suite.judge(p, t, "eos").correct for p, t in zip(prompts, texts))
    rejected = sum(not suite.judge(p, wrong(t), "eos").correct for p, t in zip(prompts, texts))
    return correct, rejected, (time.perf_counter() - start) / (2 * len(texts))


def main() -> None:
    print(f"machine: {platform.processor() or platform.machine()}, Python {platform.python_version()}, "
          f"math-verify {math_verify_version() or 'not installed'}")
    rows = [json.loads(line) for line in (DATA / "gsm8k_test.jsonl").read_text().splitlines()]
    gsm8k = GSM8K()
    texts = [r["answer"] for r in rows]
    ok, bad, per = sweep(gsm8k, gsm8k.prompts(), texts, gsm8k_wrong)
    print(f"gsm8k      {ok}/{len(texts)} reference solutions correct, {bad}/{len(texts)} perturbed wrong, {per * 1e3:.3f} ms/output")
    rows = [json.loads(line) for line in (DATA / "math500.jsonl").read_text().splitlines()]
    texts = [r["solution"] for r in rows]
    timings = {}
    for label, math_verify in (("own rules", False), ("math-verify", True)):
        suite = MATH500(math_verify=math_verify)
        ok, bad, per = sweep(suite, suite.prompts(), texts, math_wrong)
        timings[label] = per
        print(f"math500    {ok}/{len(texts)} reference solutions correct, {bad}/{len(texts)} perturbed wrong, "
              f"{per * 1e3:.3f} ms/output ({label})")
    print(f"ratio      math-verify / own rules: {timings['math-verify'] / timings['own rules']:.2f}x time per output")


if __name__ == "__main__":
    main()
