"""Benchmark: forwards (and wall time) the gate's schedule spends against the naive full grid.

    python benchmarks/bench_schedule.py               # both parts
    python benchmarks/bench_schedule.py --published   # the paper's block-diffusion grids, replayed (about a minute)
    python benchmarks/bench_schedule.py --embedded    # redline.yaml, decoded by the embedded model (minutes on a CPU)

Every figure comes from the gate itself: ``pytest --redline-alpha=...`` runs in a subprocess
and the numbers are read from its JSON report.

1. **Published grids** (llada2_math, llada2_code, sdar_math, sdar_code; alpha = 0.10, seed 0):
   each grid is replayed once scheduled and once with ``--redline-full``. Printed per grid:
   whether the valid sets and the deployed config agree, and the forwards the scheduled run
   spent against the full grid's (exact: replay knows every prompt's forwards).
2. **Embedded grid** (``redline.yaml``): a cold scheduled run against a cold ``--redline-full``
   run (forwards and wall time, each in a fresh store); a rerun with nothing changed (it
   must decode nothing); and a rerun after one candidate's parameters change (it must
   decode only that candidate).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "redline"
PUBLISHED = ("llada2_math", "llada2_code", "sdar_math", "sdar_code")


def gate(grid: Path, work: Path, *options: str, alpha: float, seed: int, threads: int) -> tuple[dict, float, float]:
    """Run the gate on one grid; returns (its JSON report, wall seconds, CPU seconds).

    CPU seconds (user + system of the child) are printed beside wall time because a shared
    machine's load changes wall time between runs far more than it changes CPU time."""
    report = work / f"report-{time.monotonic_ns()}.json"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--redline-alpha={alpha}",
               f"--redline-seed={seed}", f"--redline-grid={grid}", f"--redline-report={report}", *options]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    before, start = _child_cpu(), time.perf_counter()
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - start, _child_cpu() - before
    if run.returncode not in (0, 1) or not report.exists():
        sys.exit(f"the gate failed (exit {run.returncode}) on {grid}:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
    return json.loads(report.read_text()), wall, cpu


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def valid_set(report: dict) -> list[str]:
    return [c["name"] for c in report["configs"] if c["valid"]]


def published(args: argparse.Namespace, work: Path) -> None:
    specs = json.loads((DATA / "grids.json").read_text())
    print(f"== published block-diffusion grids, replayed: alpha={args.alpha}, seed {args.seed}, batches of 16")
    print(f"{'grid':<12} {'n':>5} {'m':>2}  {'same valid set':>14}  {'same deployed':>13}  "
          f"{'forwards':>10} {'naive':>10} {'ratio':>6}  {'items run':>11}")
    for name in PUBLISHED:
        spec = specs[name]
        grid = {"name": name, "engine": "replay", "engine_args": {"outcomes": str(DATA / spec["file"])},
                "cost": spec["cost"], "reference": spec["reference"], "deploy": "fastest"}
        if "configs" in spec:
            grid["configs"] = spec["configs"]
        path = work / f"{name}.yaml"
        path.write_text(yaml.safe_dump(grid, sort_keys=False))
        common = dict(alpha=args.alpha, seed=args.seed, threads=args.threads)
        scheduled, _, _ = gate(path, work, "--redline-no-cache", **common)
        full, _, _ = gate(path, work, "--redline-no-cache", "--redline-full", **common)
        spend = scheduled["spend"]
        print(f"{name:<12} {scheduled['n']:>5} {scheduled['m']:>2}  {str(valid_set(scheduled) == valid_set(full)):>14}  "
              f"{str(scheduled['deployed'] == full['deployed']):>13}  {spend['forwards']:>10,.0f} "
              f"{spend['naive_forwards']:>10,.0f} {spend['ratio']:>5.2f}x  {spend['items_run']:>5}/{spend['items']:<5}")


def changed_copy(grid_path: Path, work: Path) -> tuple[Path, str]:
    """A copy of the grid with one candidate's parameters changed (paths made absolute)."""
    grid = yaml.safe_load(grid_path.read_text())
    for key in ("engine_args", "suite_args"):
        for name, value in dict(grid.get(key) or {}).items():
            if name in ("model", "outcomes", "path", "data", "draft", "target") and not Path(value).is_absolute():
                grid[key][name] = os.path.normpath(grid_path.parent / value)
    candidate = [c for c in grid["configs"] if c != grid["reference"]][-1]
    params = grid["configs"][candidate]
    number = next(k for k, v in params.items() if isinstance(v, float))
    params[number] = round(params[number] + 0.01, 4)
    path = work / grid_path.name
    path.write_text(yaml.safe_dump(grid, sort_keys=False))
    return path, candidate


def embedded(args: argparse.Namespace, work: Path) -> None:
    grid = Path(args.grid).resolve()
    common = dict(alpha=args.alpha, seed=args.seed, threads=args.threads)
    store, full_store = f"--redline-cache-dir={work / 'store'}", f"--redline-cache-dir={work / 'full-store'}"
    print(f"\n== embedded grid {grid.relative_to(ROOT) if grid.is_relative_to(ROOT) else grid}: alpha={args.alpha}, "
          f"seed {args.seed}, {args.threads} threads")
    cold, cold_s, cold_cpu = gate(grid, work, store, **common)
    full, full_s, full_cpu = gate(grid, work, full_store, "--redline-full", **common)
    a, b = cold["spend"], full["spend"]
    reference = next(c for c in full["configs"] if c["name"] == full["reference"])
    print(f"reference {full['reference']} answers {reference['accuracy']:.1%} of {full['n']} prompts correctly")
    print(f"cold run       {a['forwards']:>10,.0f} forwards {cold_s:>8.1f} s wall {cold_cpu:>8.1f} s CPU   "
          f"({a['items_run']}/{a['items']} items; valid {valid_set(cold)}, deployed {cold['deployed']})")
    print(f"--redline-full {b['forwards']:>10,.0f} forwards {full_s:>8.1f} s wall {full_cpu:>8.1f} s CPU   "
          f"({b['items_run']}/{b['items']} items; valid {valid_set(full)}, deployed {full['deployed']})")
    print(f"ratio          {a['forwards'] / b['forwards']:>10.2f}x forwards {cold_s / full_s:>6.2f}x wall "
          f"{cold_cpu / full_cpu:>6.2f}x CPU; same valid set: {valid_set(cold) == valid_set(full)}")
    again, again_s, _ = gate(grid, work, store, **common)
    print(f"rerun, nothing changed: decoded {again['outcomes']['decoded']} outcomes, reused "
          f"{again['outcomes']['reused']}, {again_s:.1f} s (must decode nothing: "
          f"{'yes' if again['outcomes']['decoded'] == 0 else 'NO'})")
    path, candidate = changed_copy(grid, work)
    changed, changed_s, _ = gate(path, work, store, **common)
    ran = next(c["prompts_run"] for c in changed["configs"] if c["name"] == candidate)
    only = changed["outcomes"]["decoded"] == ran and changed["outcomes"]["reused"] == changed["spend"]["items_run"] - ran
    print(f"rerun, {candidate} changed: decoded {changed['outcomes']['decoded']} outcomes ({candidate} ran on {ran} "
          f"prompts), reused {changed['outcomes']['reused']}, {changed_s:.1f} s (must decode only {candidate}: "
          f"{'yes' if only else 'NO'})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--published", action="store_true", help="only the published grids")
    parser.add_argument("--embedded", action="store_true", help="only the embedded grid")
    parser.add_argument("--grid", default=str(ROOT / "redline.yaml"), help="the embedded grid (default redline.yaml)")
    parser.add_argument("--alpha", type=float, default=0.10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    both = not (args.published or args.embedded)
    print(f"{platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    with tempfile.TemporaryDirectory(prefix="bench-schedule-") as folder:
        if args.published or both:
            published(args, Path(folder))
        if args.embedded or both:
            embedded(args, Path(folder))


if __name__ == "__main__":
    main()
