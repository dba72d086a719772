"""Benchmark: the vectorized validity study and held-out splits against per-split loops.

    python benchmarks/bench_analysis.py [--splits 1000] [--baseline-splits 20]

The validity study runs the issue's size: 5 calibration sizes x 30 budgets x 1,000 splits
on the 9 x 1,012 llada2_math grid (all nine configs). The baseline is the per-split loop
of the paper's scripts, built on the risk core (``risk.sweep`` over the 30 budgets, once
per split and size), timed on a subset of splits and scaled to the full count; both must
agree on that subset. The held-out run (K = 1000 splits, one budget) is compared with a
loop of ``risk.certify`` per split in the same way. Prints absolute times, the ratio, and
the hardware; the validity study must take at most 60 s.
"""
from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import numpy as np

from pytest_redline import risk
from pytest_redline.lab import analysis
from pytest_redline.lab.analysis import GridData, Procedure
from pytest_redline.outcomes import OutcomeTable

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "redline"
LIMIT_S = 60.0


def naive_validity(grid: GridData, alphas, sizes, perms, delta: float) -> np.ndarray:
    """FWER per (size, alpha), one split and one size at a time (risk.sweep over the budgets)."""
    fwer = np.zeros((len(sizes), len(alphas)))
    for perm in perms:
        for s, n_cal in enumerate(sizes):
            cal, test = perm[:n_cal], perm[n_cal:]
            results = risk.sweep(grid.correct[:, cal], grid.cost, grid.reference, alphas, delta, names=grid.names)
            test_risk = grid.joint[:, test].mean(axis=1)
            for a, r in enumerate(results):
                fwer[s, a] += bool(np.any(r.valid & (test_risk > r.alpha)))
    return fwer / len(perms)


def naive_heldout(grid: GridData, alpha: float, masks: np.ndarray, delta: float) -> np.ndarray:
    """Deployed config per split, one risk.certify per split."""
    return np.array([
        risk.certify(grid.correct[:, cal], grid.cost, grid.reference, alpha, delta, names=grid.names).deployed_index
        for cal in masks
    ])


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


def hardware() -> str:
    model = platform.processor() or "unknown cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} logical cores, numpy {np.__version__}, python {platform.python_version()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--splits", type=int, default=1000)
    parser.add_argument("--baseline-splits", type=int, default=20)
    args = parser.parse_args()

    table = OutcomeTable.read_csv(DATA / "llada2_math.csv")  # all 9 configs
    grid = GridData.from_table(table, "acc95/semi90", "tpf", label="llada2_math (9 configs)")
    procedure, alphas = Procedure(), risk.DEFAULT_ALPHAS
    sizes = analysis.calibration_sizes(grid.n)
    print(f"hardware: {hardware()}")
    print(f"grid: {grid.label}, m = {grid.m}, n = {grid.n}; sizes {sizes}, {len(alphas)} budgets")

    analysis.validity(grid, alphas, sizes, 10, procedure)  # warm up
    result, fast = timed(analysis.validity, grid, alphas, sizes, args.splits, procedure)
    k = args.baseline_splits
    subset = analysis.validity(grid, alphas, sizes, k, procedure)
    naive, slow = timed(naive_validity, grid, alphas, sizes, analysis.validity_permutations(grid.n, k), procedure.delta)
    assert np.array_equal(naive, subset.fwer), "vectorized and per-split FWER differ"
    slow_full = slow * args.splits / k
    print(
        f"validity study, {len(sizes)} sizes x {len(alphas)} budgets x {args.splits} splits: {fast:.2f} s "
        f"(limit {LIMIT_S:.0f} s: {'ok' if fast <= LIMIT_S else 'OVER'}); per-split loop: {slow:.2f} s for {k} splits, "
        f"~{slow_full:.0f} s for {args.splits}; ratio {slow_full / fast:.0f}x"
    )
    print(f"  max FWER {result.fwer.max():.3f}, min coverage {result.coverage.min():.3f}, flagged {int(result.flagged.sum())}")

    small = GridData.from_table(table.select(list(table.configs[:7])), "acc95/semi90", "tpf", label="llada2_math")
    analysis.heldout(small, 0.10, procedure, splits=10)  # warm up
    held, fast = timed(analysis.heldout, small, 0.10, procedure, args.splits)
    n_cal = held.cal_size
    masks = analysis.calibration_mask(analysis.heldout_permutations(small.n, k), n_cal)
    deployed, slow = timed(naive_heldout, small, 0.10, masks, procedure.delta)
    assert np.array_equal(deployed, held.outcomes.deployed[:k]), "vectorized and per-split deployments differ"
    slow_full = slow * args.splits / k
    print(
        f"held-out splits, 1 budget x {args.splits} splits: {fast:.3f} s; per-split certify: {slow:.2f} s for {k} "
        f"splits, ~{slow_full:.1f} s for {args.splits}; ratio {slow_full / fast:.0f}x"
    )


if __name__ == "__main__":
    main()
