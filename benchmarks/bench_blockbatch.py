"""Benchmark: the BlockBatch grid on the CPU, every config against the multi-block reference, in one run.

    python benchmarks/bench_blockbatch.py [--grid grids/blockbatch.yaml] [--n 512] [--threads 1]

Prepares the grid as the gate does (its prompts, and each config's engine: a config's own
``engine:``/``engine_args:`` replace the grid's), warms each engine up, then decodes the prompts
with every config (batches of the grid's batch_size, in prompt order, reference first) and prints
per config: accuracy and the prompts the reference answers and the config misses (V), TPF (pooled
tokens / forwards, a batched forward counting once per request), forwards per request,
row-forwards per request (the rows a request occupies in those forwards: BlockBatch's branches),
analytical FLOPs per request and wall time, each beside its ratio to the reference; then
BlockBatch's merges, syncs and refreshes per request and the mean block size of the winning branch.
"""
from __future__ import annotations

import argparse
import dataclasses
import platform
from pathlib import Path

import numpy as np
import torch

from pytest_redline.calibration import Level, prepare
from pytest_redline.enginebook import EngineBook
from pytest_redline.grid import load_grid
from timing import generate_timed

ROOT = Path(__file__).resolve().parent.parent


def mean_extra(gens, key: str, fallback=None) -> float:
    """The mean of ``extra[key]`` over the generations (``fallback(g)``, else NaN, where an engine
    does not report it)."""
    return float(np.mean([g.extra.get(key, fallback(g) if fallback else np.nan) for g in gens]))


def measure(engine, suite, prompts, params, batch_size) -> dict:
    gens, wall = generate_timed(engine, prompts, params, batch_size)
    return {
        "correct": np.array([suite.score(p, g.text) for p, g in zip(prompts, gens)]),
        "tpf": sum(g.tokens for g in gens) / sum(g.forwards for g in gens),
        "forwards": float(np.mean([g.forwards for g in gens])),
        "rows": mean_extra(gens, "row_forwards", lambda g: g.forwards),  # one row per forward elsewhere
        "wall": wall,
        **{key: mean_extra(gens, key) for key in ("flops", "merges", "syncs", "refreshes", "block_size")},
    }


def ratio(value: float, reference: float) -> str:
    return f"{value / reference:.3f}" if reference else "n/a"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grid", default=str(ROOT / "grids" / "blockbatch.yaml"))
    parser.add_argument("--n", type=int, default=None, help="prompts (default: the grid's suite_args.n)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (set after the engines load)")
    args = parser.parse_args()
    grid = load_grid(args.grid)
    if args.n:
        grid = dataclasses.replace(grid, suite_args={**grid.suite_args, "n": args.n})
    level = Level(alpha=0.1, delta=grid.delta or 0.1, grids_in_session=1, correction="holm", deploy_override=None)
    cal = prepare(grid, grid.name, level, EngineBook())  # the gate's prompts, params and engines
    book = EngineBook()
    engines = {name: book.get(*cal.engines[name]) for name in cal.configs}
    prompts = list(cal.prompts)
    torch.set_num_threads(args.threads)  # after the engines: a `threads` engine_arg sets it too
    for engine in {id(e): e for e in engines.values()}.values():  # warm-up: one small batch each
        engine.generate(prompts[:8], {})
    info = next(iter(engines.values())).describe()
    print(f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"{len(prompts)} prompts, batch {grid.batch_size}, {info['device']} {info['dtype']}")

    names = list(cal.collection_order())  # the reference first
    results = {name: measure(engines[name], cal.suite, prompts, cal.params[name], grid.batch_size) for name in names}
    ref = results[grid.reference]
    print(f"\n{'config':<22}{'acc':>7}{'acc x':>7}{'V':>4}{'TPF':>7}{'TPF x':>7}{'fwd/req':>9}{'fwd x':>7}"
          f"{'rows/req':>9}{'rows x':>8}{'FLOPs x':>8}{'wall s':>8}{'wall x':>8}")
    for name in names:
        r = results[name]
        violations = int((ref["correct"] & ~r["correct"]).sum())
        print(f"{name:<22}{r['correct'].mean():>7.3f}{ratio(r['correct'].mean(), ref['correct'].mean()):>7}{violations:>4}"
              f"{r['tpf']:>7.2f}{ratio(r['tpf'], ref['tpf']):>7}{r['forwards']:>9.2f}{ratio(r['forwards'], ref['forwards']):>7}"
              f"{r['rows']:>9.2f}{ratio(r['rows'], ref['rows']):>8}{ratio(r['flops'], ref['flops']):>8}"
              f"{r['wall']:>8.1f}{ratio(r['wall'], ref['wall']):>8}")
    print(f"\n{'config':<22}{'merges/req':>11}{'syncs/req':>10}{'refresh/req':>12}{'winner B':>9}")
    for name in names[1:]:
        r = results[name]
        print(f"{name:<22}{r['merges']:>11.2f}{r['syncs']:>10.2f}{r['refreshes']:>12.2f}{r['block_size']:>9.2f}")


if __name__ == "__main__":
    main()
