"""Benchmark: forwards (and wall time) the gate's schedule spends against the naive full grid.

    python benchmarks/bench_schedule.py               # both parts
    python benchmarks/bench_schedule.py --published   # the paper's block-diffusion grids, replayed (about a minute)
    python benchmarks/bench_schedule.py --embedded    # redline.yaml, decoded by the embedded model (minutes on a CPU)
    python benchmarks/bench_schedule.py --live        # the published grids served live: deployment agrees? (minutes)
    python benchmarks/bench_schedule.py --decoder     # the adaptive order through the real Decoder (part of --live)

Every figure comes from the gate itself: ``pytest --redline-alpha=...`` runs in a subprocess
and the numbers are read from its JSON report.

1. **Published grids** (llada2_math, llada2_code, sdar_math, sdar_code; alpha = 0.10, seed 0):
   each grid is replayed once scheduled and once with ``--redline-full``. Printed per grid:
   whether the valid sets and the deployed config agree, and the forwards the scheduled run
   spent against the full grid's (exact: replay knows every prompt's forwards).
2. **Published grids served live** (``--live``; alpha 0.02 .. 0.30, seeds 0..4, batches of
   16): what a live scheduled run decodes, computed in process by the gate's own functions
   (``Schedule.run``, ``schedule.contenders``, ``verdict.certify_scheduled``) on each table,
   as the ``table`` engine of the tests serves it. Printed per grid: how often the deployed
   config equals the full run's, before the fix (costs on the prompts each config ran on)
   and after it: every valid candidate decoded on the prompts it skipped ("decode all"), and
   contenders decided by cost intervals from the bounds each engine family declares
   (``costbounds.settle``, the decoder's own loop: "bounds"); and the forwards spent against
   the full grid's for each. "adaptive": the same with the decoder's adaptive visiting order
   (``Schedule.run`` given the prompts where the candidates before it regressed, as ``Decoder``
   passes them); the other columns use the seeded order the decoder used before. The
   speculative grids declare APF in [1, gamma + 1], the memory
   grid a constant per config, the block-diffusion grids tokens <= max_new_tokens, forwards
   >= 1 and TPF <= block x buffer (the published data does not give those parameters: the
   grid's largest values stand in for them). Then (also ``--decoder``) the six published grids
   that record forwards are gated live through the real ``Decoder`` (the tests' ``table``
   engine, no declared bounds, alpha 0.10, seed 0): the prompts each config ran on, from the
   JSON report, against the simulation with the adaptive order.
3. **Embedded grid** (``redline.yaml``): a cold scheduled run against a cold ``--redline-full``
   run (forwards and wall time, each in a fresh store); a rerun with nothing changed (it
   must decode nothing; its wall time as a share of the cold run's: the goal is <= 10 %),
   again with Python's bytecode cache when the environment turns it off; and a rerun after
   one candidate's parameters change (it must decode only that candidate).
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


def gate(grid: Path, work: Path, *options: str, alpha: float, seed: int, threads: int,
         bytecode: bool = False, pythonpath: Path | None = None) -> tuple[dict, float, float]:
    """Run the gate on one grid; returns (its JSON report, wall seconds, CPU seconds).

    CPU seconds (user + system of the child) are printed beside wall time because a shared
    machine's load changes wall time between runs far more than it changes CPU time."""
    report = work / f"report-{time.monotonic_ns()}.json"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--redline-alpha={alpha}",
               f"--redline-seed={seed}", f"--redline-grid={grid}", f"--redline-report={report}", *options]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    if pythonpath is not None:  # where the tests' fake engines are installed
        env["PYTHONPATH"] = os.pathsep.join([str(pythonpath), env.get("PYTHONPATH", "")])
    if bytecode:  # Python's default: compiled (and assertion-rewritten) modules cached in __pycache__
        env.pop("PYTHONDONTWRITEBYTECODE", None)
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


LIVE_ALPHAS = (0.02, 0.05, 0.10, 0.15, 0.20, 0.25, 0.30)
LIVE_SEEDS = range(5)
LIVE_GRIDS = PUBLISHED + ("specdec_qwen_gsm8k", "specdec_llama_gsm8k", "quant_llama_gsm8k")


def declared_bounds(table, cost: str) -> tuple[dict, str]:
    """What each engine family declares for every config (``cost_bounds``), with the values its
    parameters would give, read off the grid where the published data does not say them."""
    import numpy as np

    if cost == "memory_gb":
        return {"memory_gb": "constant"}, "memory constant per config"
    ratio = table.tokens / np.maximum(table.forwards, 1.0)
    if cost == "apf":  # speculative: tokens per target forward in [1, gamma + 1]
        top = int(np.ceil(ratio.max()))
        return {"tokens_per_forward": (1, top)}, f"APF in [1, gamma + 1 = {top}]"
    tokens, top = int(table.tokens.max()), int(np.ceil(ratio.max()))  # block diffusion
    return ({"tokens": (0, tokens), "forwards": (1, float("inf")), "tokens_per_forward": (0, top)},
            f"tokens <= {tokens}, forwards >= 1, TPF <= {top} (stand-ins for max_new_tokens and block x buffer)")


class _Cell:
    """One (config, prompt) outcome as ``costbounds`` reads it."""

    __slots__ = ("tokens", "forwards", "extra")

    def __init__(self, table, i: int, j: int) -> None:
        self.tokens, self.forwards = table.tokens[i, j], table.forwards[i, j]
        self.extra = {name: column[i, j] for name, column in table.extra.items()}


def settle_on_table(table, cost: str, bounds, ran, valid, batch: int, lower: bool) -> dict[int, bool]:
    """What the decoder does after the schedules, on a table: ``costbounds.settle`` over the
    contenders' skipped prompts in prompt order, ``batch`` at a time; then the one left is
    decoded everywhere unless its cost is a point. Marks ``ran``; returns ``decided``."""
    from pytest_redline import costbounds

    n = table.n
    rest = {i: [j for j in range(n) if not ran[i, j]] for i in valid}
    rest = {i: [r[k:k + batch] for k in range(0, len(r), batch)] for i, r in rest.items()}
    memo: dict = {}

    def interval_of(i: int):
        key = (i, int(ran[i].sum()))
        if key not in memo:
            cells = [_Cell(table, i, j) for j in range(n) if ran[i, j]]
            memo[key] = costbounds.interval(cost, cells, n - len(cells), bounds if i in valid else {})
        return memo[key] if i == 0 or i in valid else (float("-inf"), float("inf"))

    def decode_next(i: int) -> None:
        ran[i, rest[i].pop(0)] = True

    intervals, out, alive = costbounds.settle(table.m, 0, list(valid), interval_of, lambda i: bool(rest[i]), decode_next, lower)
    for i in alive:
        if intervals[i][0] != intervals[i][1]:
            ran[i] = True
    return {i: i in out for i in valid if not ran[i].all()}


def live(args: argparse.Namespace) -> None:
    import numpy as np

    sys.path.insert(0, str(ROOT / "tests"))
    from published import published_table

    from pytest_redline import risk
    from pytest_redline.outcomes import cost_direction
    from pytest_redline.schedule import Schedule, StopRule
    from pytest_redline.verdict import certify_scheduled

    runs = len(LIVE_ALPHAS) * len(LIVE_SEEDS)
    print(f"\n== published grids served live (deterministic table engine): alpha {LIVE_ALPHAS[0]}..{LIVE_ALPHAS[-1]}, "
          f"seeds 0..{LIVE_SEEDS[-1]}, batches of 16, delta 0.10: {runs} runs per grid")
    print("spent: forwards against the full grid's (items for the memory grid, which has no forwards); "
          "before: costs on the prompts run; decode all: every valid candidate decoded everywhere; "
          "bounds: contenders decided by cost intervals from the declared bounds (seeded order); adaptive: the same "
          "with the adaptive visiting order (agrees: same valid set and deployment)")
    print(f"{'grid':<20} {'n':>5} {'m':>2}  {'deployment agrees':>17} {'(before)':>8} {'(decode all)':>12} {'(adaptive)':>10}  "
          f"{'spent: before':>13} {'decode all':>10} {'bounds':>7} {'adaptive':>9}  declared")
    for name in LIVE_GRIDS:
        table, cost, reference = published_table(name)
        order = [table.index(reference)] + [i for i in range(table.m) if table.configs[i] != reference]
        table = table.select([table.configs[i] for i in order])  # the reference in row 0
        m, n = table.m, table.n
        lower = cost_direction(cost) == "lower"
        weight = np.ones_like(table.tokens) if cost == "memory_gb" else table.forwards
        bounds, said = declared_bounds(table, cost)
        agree = {"before": 0, "all": 0, "bounds": 0, "adaptive": 0}
        spent: dict[str, list[float]] = {"before": [], "all": [], "bounds": [], "adaptive": []}
        cost_all = table.cost(cost)
        for alpha in LIVE_ALPHAS:
            full = risk.certify(table.correct, cost_all, 0, alpha, 0.10, lower_is_better=lower)
            rule = StopRule.of(n, alpha, 0.10, m, "holm")
            for seed in LIVE_SEEDS:
                ran, stops, chosen = schedules(table, Schedule(n, 16, seed, rule), alpha)
                before, every, bounded = ran.copy(), ran.copy(), ran.copy()
                every[list(chosen)] = True
                decided = settle_on_table(table, cost, bounds, bounded, chosen, 16, lower)
                adaptive, adaptive_stops, adaptive_chosen = schedules(table, Schedule(n, 16, seed, rule, adaptive=True), alpha)
                adaptive_decided = settle_on_table(table, cost, bounds, adaptive, adaptive_chosen, 16, lower)
                result = certify_scheduled(table.correct, adaptive, adaptive_stops, table.cost_on(adaptive, cost), 0, rule, alpha,
                                           0.10, lower_is_better=lower, decided=adaptive_decided).result
                agree["adaptive"] += result.deployed_index == full.deployed_index and result.valid.tolist() == full.valid.tolist()
                agree["before"] += int(risk.select_deployed(full.valid, -table.cost_on(before, cost) if lower else
                                                            table.cost_on(before, cost), 0)) == full.deployed_index
                for key, mask, settled in (("all", every, None), ("bounds", bounded, decided)):
                    result = certify_scheduled(table.correct, mask, stops, table.cost_on(mask, cost), 0, rule, alpha, 0.10,
                                               lower_is_better=lower, decided=settled).result
                    agree[key] += result.deployed_index == full.deployed_index
                for key, mask in (("before", before), ("all", every), ("bounds", bounded), ("adaptive", adaptive)):
                    spent[key].append(weight[mask].sum() / weight.sum())
        print(f"{name:<20} {n:>5} {m:>2}  {agree['bounds']:>10}/{runs:<6} {agree['before']:>5}/{runs:<2} {agree['all']:>9}/{runs:<2}  "
              f"{agree['adaptive']:>8}/{runs:<2}  {np.mean(spent['before']):>12.3f}x {np.mean(spent['all']):>9.3f}x "
              f"{np.mean(spent['bounds']):>6.3f}x {np.mean(spent['adaptive']):>8.3f}x  {said}")


def decoder_check(args: argparse.Namespace, work: Path) -> None:
    """The adaptive order through the real ``Decoder``: each published grid with forwards served live by the
    tests' ``table`` engine (no declared bounds, so every contender is decoded everywhere), gated
    once, scheduled, at alpha 0.10, seed 0; what each config ran on, from the JSON report,
    against the in-process simulation above (``schedules`` with the adaptive order, contenders
    everywhere)."""
    import numpy as np

    sys.path.insert(0, str(ROOT / "tests"))
    from published import published_table
    from redline_fakes import install

    from pytest_redline.schedule import Schedule, StopRule

    alpha, seed = 0.10, 0
    install(work)
    print(f"\n== the adaptive order through the real Decoder (the gate, table engine, no declared bounds): alpha {alpha}, "
          f"seed {seed}, batches of 16")
    print("spent: forwards on the prompts each config ran on against the full grid's (exact, from the table); the gate's "
          "own spend line estimates the forwards of skipped items at each config's mean")
    print(f"{'grid':<20} {'items run':>10} {'simulated':>10}  {'same prompts per config':>23}  {'spent: adaptive':>15} "
          f"{'seeded (simulated)':>18} {'gate spend line':>15}  {'wall s':>6}")
    for name in LIVE_GRIDS:
        table, cost, reference = published_table(name)
        if cost == "memory_gb":  # the published memory grid has no forwards to serve: not run here
            continue
        order = [table.index(reference)] + [i for i in range(table.m) if table.configs[i] != reference]
        table = table.select([table.configs[i] for i in order])
        csv = work / f"{name}.csv"
        table.write_csv(csv)
        configs = ", ".join(f"{json.dumps(c)}: {{config: {json.dumps(c)}}}" for c in table.configs)
        grid = work / f"{name}.yaml"
        grid.write_text(f"name: {name}\nsuite: table\nsuite_args: {{outcomes: {csv}}}\nengine: table\n"
                        f"engine_args: {{outcomes: {csv}}}\ncost: {cost}\nreference: {json.dumps(table.configs[0])}\n"
                        f"batch_size: 16\nconfigs: {{{configs}}}\ndeploy: fastest\n")
        start = time.perf_counter()
        report, _, _ = gate(grid, work, "--redline-no-cache", alpha=alpha, seed=seed, threads=args.threads, pythonpath=work)
        wall = time.perf_counter() - start
        rule = StopRule.of(table.n, alpha, 0.10, table.m, "holm")
        masks = {}
        for adaptive in (True, False):
            ran, _, chosen = schedules(table, Schedule(table.n, 16, seed, rule, adaptive=adaptive), alpha)
            ran[list(chosen)] = True
            masks[adaptive] = ran
        if "ran_on" not in report["configs"][0]:
            sys.exit(f"the gate did not certify {name}: {json.dumps(report)[:2000]}")
        gated = np.array([[p in set(c["ran_on"]) for p in table.prompts] for c in report["configs"]])
        weight = np.ones_like(table.tokens) if cost == "memory_gb" else table.forwards
        spend = report["spend"]
        print(f"{name:<20} {int(gated.sum()):>10} {int(masks[True].sum()):>10}  {str(bool((gated == masks[True]).all())):>23}  "
              f"{weight[gated].sum() / weight.sum():>14.3f}x {weight[masks[False]].sum() / weight.sum():>17.3f}x "
              f"{spend['ratio']:>14.3f}x  {wall:>6.1f}")


def schedules(table, schedule, alpha: float):
    """Every candidate's schedule on a table (the reference in row 0), each given the prompts where
    the candidates before it regressed, as the decoder does: (ran mask, stops, contenders)."""
    import numpy as np

    from pytest_redline.schedule import contenders

    ran = np.zeros((table.m, table.n), dtype=bool)
    ran[0] = True
    runs, regressed = [None], set()
    for i in range(1, table.m):
        runs.append(schedule.run(table.correct[0], lambda b: {j: bool(table.correct[i, j]) for j in b}, regressed))
        ran[i, list(runs[i].ran)] = True
        regressed.update(j for j in runs[i].ran if not table.correct[i, j])
    return ran, [None if r is None else r.stop for r in runs], contenders(runs, 0, table.n, alpha, 0.10, "holm")


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
    print(f"warm rerun     {again_s / cold_s:>10.1%} of the cold run's wall time (goal <= 10 %: the model-free engine "
          f"identity keys the stored outcomes, so no engine is built and no model loads)")
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        gate(grid, work, store, bytecode=True, **common)  # writes the bytecode caches
        cached, cached_s, _ = gate(grid, work, store, bytecode=True, **common)
        print(f"warm rerun     {cached_s / cold_s:>10.1%} of the cold run's wall time with Python's bytecode cache "
              f"({cached_s:.1f} s, {cached['outcomes']['decoded']} decoded; this environment sets "
              f"PYTHONDONTWRITEBYTECODE=1, so every run above compiles, and pytest assertion-rewrites, every module)")
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
    parser.add_argument("--live", action="store_true", help="only the published grids served live")
    parser.add_argument("--decoder", action="store_true", help="only the adaptive order through the real Decoder")
    parser.add_argument("--grid", default=str(ROOT / "redline.yaml"), help="the embedded grid (default redline.yaml)")
    parser.add_argument("--alpha", type=float, default=0.10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    both = not (args.published or args.embedded or args.live or args.decoder)
    print(f"{platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    with tempfile.TemporaryDirectory(prefix="bench-schedule-") as folder:
        if args.published or both:
            published(args, Path(folder))
        if args.live or both:
            live(args)
        if args.live or args.decoder or both:
            decoder_check(args, Path(folder))
        if args.embedded or both:
            embedded(args, Path(folder))


if __name__ == "__main__":
    main()
