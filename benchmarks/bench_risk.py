"""Benchmark: the risk core against a naive per-config loop, in one process.

    python benchmarks/bench_risk.py [--repeats 5]

1. ``select`` on m = 50 configs x n = 100,000 prompts (random outcomes, seeded): what
   ``redline select`` computes once the table is loaded, one ``risk.sweep`` over the
   chosen budget and the 30 budgets of alpha_min. The naive alpha_min stops at the
   first budget that deploys, so it gets the easier job.
2. An alpha sweep over the 30 budgets 0.01 .. 0.30 on the published 9 x 1,012
   llada2_math grid: ``risk.sweep`` against 30 calls of ``risk.certify``.

The baseline is the textbook loop: per config, V as a numpy sum over its row and the
p-value by ``scipy.stats.binom.cdf``, then Holm as a Python loop, repeated for every
budget. Both must select the same
config. Prints the best of ``--repeats`` runs, the ratio, and the hardware. Each candidate
must take well under a second.
"""
from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import numpy as np
from scipy import stats

from pytest_redline import risk
from pytest_redline.outcomes import OutcomeTable

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "redline"
ALPHAS = risk.DEFAULT_ALPHAS
LIMIT_S = 1.0


def naive_deployed(correct: np.ndarray, cost: np.ndarray, reference: int, alpha: float, delta: float) -> int:
    """One budget, config by config: the loop a first implementation would write."""
    m, n = correct.shape
    p = []
    for i in range(m):
        v = int(np.sum(correct[reference] & ~correct[i]))
        p.append(stats.binom.cdf(v, n, alpha))
    order = sorted(range(m), key=lambda i: p[i])
    valid = [False] * m
    for step, i in enumerate(order):
        if p[i] > delta / (m - step):
            break
        valid[i] = True
    best = reference
    for i in range(m):
        if valid[i] and cost[i] > cost[best]:
            best = i
    return best


def naive_alpha_min(correct, cost, reference, delta) -> float | None:
    for alpha in ALPHAS:
        if naive_deployed(correct, cost, reference, alpha, delta) != reference:
            return alpha
    return None


def best_of(repeats: int, fn):
    times, value = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - start)
    return min(times), value


def report(label: str, candidate_s: float, baseline_s: float) -> None:
    verdict = "ok" if candidate_s < LIMIT_S else f"TOO SLOW (limit {LIMIT_S} s)"
    print(f"{label}: risk core {candidate_s * 1e3:8.1f} ms   naive loop {baseline_s * 1e3:8.1f} ms   "
          f"speed-up x{baseline_s / candidate_s:5.1f}   [{verdict}]")


def bench_select(repeats: int) -> None:
    m, n, delta = 50, 100_000, 0.10
    rng = np.random.default_rng(0)
    base = rng.random(n) < 0.8  # the reference is right on 80 % of prompts
    flip_rate = np.linspace(0.05, 0.35, m)  # config i breaks a fraction of those
    correct = base & ~(rng.random((m, n)) < flip_rate[:, None])
    correct[0] = base
    cost = np.linspace(1.0, 3.0, m)

    def candidate():  # as run_select: one sweep over the chosen budget and the alpha_min grid
        result, *grid = risk.sweep(correct, cost, 0, (0.10,) + ALPHAS, delta)
        return result.deployed_index, risk.alpha_min_of(grid)

    def baseline():
        return naive_deployed(correct, cost, 0, 0.10, delta), naive_alpha_min(correct, cost, 0, delta)

    candidate()  # warm up
    candidate_s, ours = best_of(repeats, candidate)
    baseline_s, theirs = best_of(max(1, repeats // 2), baseline)
    assert ours == theirs, (ours, theirs)
    report(f"select      m={m} n={n:,} (certify + alpha_min)", candidate_s, baseline_s)


def bench_sweep(repeats: int) -> None:
    table = OutcomeTable.read_csv(DATA / "llada2_math.csv")
    correct, cost, reference, delta = table.correct, table.cost("tpf"), table.index("acc95/semi90"), 0.10

    def candidate():
        return [r.deployed_index for r in risk.sweep(correct, cost, reference, ALPHAS, delta)]

    def per_budget():
        return [risk.certify(correct, cost, reference, a, delta).deployed_index for a in ALPHAS]

    def baseline():
        return [naive_deployed(correct, cost, reference, a, delta) for a in ALPHAS]

    candidate()
    candidate_s, ours = best_of(repeats, candidate)
    loop_s, looped = best_of(repeats, per_budget)
    baseline_s, theirs = best_of(repeats, baseline)
    assert ours == looped == theirs, (ours, looped, theirs)
    report(f"alpha sweep m={table.m} n={table.n:,} (30 budgets)  ", candidate_s, baseline_s)
    print(f"  (30 separate risk.certify calls: {loop_s * 1e3:.1f} ms, x{loop_s / candidate_s:.1f} the sweep)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"hardware: {platform.machine()} {platform.processor() or ''}, {os.cpu_count()} CPUs, "
          f"python {platform.python_version()}, numpy {np.__version__}")
    bench_select(args.repeats)
    bench_sweep(args.repeats)


if __name__ == "__main__":
    main()
