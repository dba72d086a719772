"""Benchmark: where a warm rerun of a grid spends its time, phase by phase.

    python benchmarks/bench_warm.py                      # redline.yaml, 3 warm reruns
    python benchmarks/bench_warm.py --against d8f7727    # and the gate (pytest_redline/) at a revision

A cold run fills a fresh store; then each warm rerun (every outcome stored, nothing decoded)
runs ``pytest --redline-alpha=...`` in a subprocess with a small plugin that records the
process's CPU time (``time.process_time``) at pytest's phase boundaries: start-up to
``pytest_configure`` (interpreter, pytest, plugins, conftest), configure (the gate's start),
collection, the run loop with the gate's session finish (verdict, JSON report), the terminal
summary and unconfigure (the store closes), pytest's cleanup to exit (five ``gc.collect``
for unraisable exceptions), and interpreter teardown (the child's CPU from ``getrusage``
minus what the plugin saw at exit). Wall time is the child's.

With ``--against REV`` the package ``pytest_redline`` is taken from that git revision (the
engines and suites stay the working tree's), and the two alternate run by run; the medians
and their ratio are printed. CPU time is shown beside wall time because a shared machine's
load changes wall time between runs far more than CPU time.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PLUGIN = '''
import atexit, json, os, time
import pytest

_marks = []


def _mark(name):
    _marks.append((name, time.process_time()))


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    _mark("configure")


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session):
    _mark("collection")


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session):
    _mark("run loop and session finish")


@pytest.hookimpl(tryfirst=True)
def pytest_terminal_summary(terminalreporter):
    _mark("summary and unconfigure")


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    _mark("cleanup to exit")


@atexit.register
def _write():
    _mark("end")
    with open(os.environ["BENCH_WARM_OUT"], "w") as f:
        json.dump(_marks, f)
'''
PHASES = ("start-up", "configure", "collection", "run loop and session finish", "summary and unconfigure", "cleanup to exit")
SITE = '''
import sys
sys.path.insert(0, {path!r})
import pytest_redline  # the revision's package, before the editable install's finder sees the name
sys.path.remove({path!r})
'''


def gate_command(args: argparse.Namespace, store: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--redline-alpha={args.alpha}",
            f"--redline-seed={args.seed}", f"--redline-grid={args.grid}", f"--redline-cache-dir={store}", *extra]


def child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def warm_run(args: argparse.Namespace, store: Path, work: Path, pythonpath: list[str]) -> dict[str, float]:
    """One warm rerun: CPU seconds per phase, interpreter teardown, total CPU and wall."""
    out = work / "marks.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "BENCH_WARM_OUT": str(out),
           "PYTHONPATH": os.pathsep.join([*pythonpath, str(work), os.environ.get("PYTHONPATH", "")])}
    before, start = child_cpu(), time.perf_counter()
    extra = ("-p", "bench_warm_phases", f"--redline-report={work / 'report.json'}")  # as bench_schedule.py
    run = subprocess.run(gate_command(args, store, *extra), cwd=ROOT, env=env,
                         capture_output=True, text=True)
    wall, cpu = time.perf_counter() - start, child_cpu() - before
    if run.returncode not in (0, 1) or "0 decoded" not in run.stdout:
        sys.exit(f"the warm rerun failed or decoded (exit {run.returncode}):\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
    marks = json.loads(out.read_text())
    phases = {name: t1 - t0 for (name, t0), (_, t1) in zip(marks, marks[1:])}
    phases["start-up"] = dict(marks)["configure"]  # from the interpreter's start to pytest_configure
    phases["interpreter teardown"] = cpu - dict(marks)["end"]
    return {**phases, "CPU total": cpu, "wall": wall}


def package_at(rev: str, folder: Path) -> Path:
    """``pytest_redline/`` at a git revision, extracted under ``folder``; a sitecustomize that imports it first."""
    archive = subprocess.run(["git", "archive", rev, "pytest_redline"], cwd=ROOT, capture_output=True, check=True).stdout
    tar = folder / "rev.tar"
    tar.write_bytes(archive)
    with tarfile.open(tar) as t:
        t.extractall(folder / "rev")
    site = folder / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITE.format(path=str(folder / "rev")))
    return site


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grid", default=str(ROOT / "redline.yaml"))
    parser.add_argument("--alpha", type=float, default=0.10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--against", metavar="REV", help="also time the gate (pytest_redline/) at this git revision")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    print(f"{platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"load {os.getloadavg()[0]:.2f}, PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r}")
    with tempfile.TemporaryDirectory(prefix="bench-warm-") as folder:
        work = Path(folder)
        (work / "bench_warm_phases.py").write_text(PLUGIN)
        store = work / "store"
        start = time.perf_counter()
        cold = subprocess.run(gate_command(args, store), cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
                              capture_output=True, text=True)
        if cold.returncode not in (0, 1):
            sys.exit(f"the cold run failed (exit {cold.returncode}):\n{cold.stdout[-3000:]}\n{cold.stderr[-3000:]}")
        print(f"cold run (fills the store): {time.perf_counter() - start:.1f} s wall")
        sides = {"now": []}
        if args.against:
            sides[args.against] = [str(package_at(args.against, work))]
        results: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
        for _ in range(args.runs):
            for side, pythonpath in sides.items():
                results[side].append(warm_run(args, store, work, pythonpath))
        rows = [*PHASES, "interpreter teardown", "CPU total", "wall"]
        medians = {side: {r: statistics.median(x[r] for x in runs) for r in rows} for side, runs in results.items()}
        header = f"{'warm rerun (median of ' + str(args.runs) + ')':<38}" + "".join(f"{side:>12}" for side in sides)
        print(header + ("     ratio" if args.against else ""))
        for r in rows:
            line = f"{r + (' (s wall)' if r == 'wall' else ' (s CPU)'):<38}" + "".join(f"{medians[s][r]:>12.2f}" for s in sides)
            if args.against:
                base = medians[args.against][r]
                line += f"  {medians['now'][r] / base:>7.2f}x" if base > 0.005 else ""
            print(line)
        print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
