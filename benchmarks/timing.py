"""Shared by the benchmark scripts: decode prompts in the gate's batches and time it."""
from __future__ import annotations

import time


def generate_timed(engine, prompts, params, batch_size):
    """(generations, wall seconds) of decoding ``prompts`` in consecutive batches, as the gate does."""
    start = time.perf_counter()
    gens = []
    for i in range(0, len(prompts), batch_size):
        gens += engine.generate(prompts[i : i + batch_size], params)
    return gens, time.perf_counter() - start


def gate_setup(description: str, default_grid: str):
    """The command line (``--grid``, ``--n``, ``--threads``) and what the gate would decode for the grid:
    ``(args, grid, cal, engines)``, with ``cal`` the gate's calibration (prompts, params, engines)
    and ``engines`` each config's built engine, warmed up on a small batch. Threads are set after
    the engines load (a ``threads`` engine_arg sets them too). Prints the machine line."""
    import argparse
    import dataclasses
    import platform

    import torch

    from pytest_redline.calibration import Level, prepare
    from pytest_redline.decode.enginebook import EngineBook
    from pytest_redline.grid import load_grid

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--grid", default=default_grid)
    parser.add_argument("--n", type=int, default=None, help="prompts (default: the grid's suite_args.n)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (set after the engines load)")
    args = parser.parse_args()
    grid = load_grid(args.grid)
    if args.n:
        grid = dataclasses.replace(grid, suite_args={**grid.suite_args, "n": args.n})
    level = Level(alpha=0.1, delta=grid.delta or 0.1, grids_in_session=1, correction="holm", deploy_override=None)
    cal = prepare(grid, grid.name, level, EngineBook())
    book = EngineBook()
    engines = {name: book.get(*cal.engines[name]) for name in cal.configs}
    torch.set_num_threads(args.threads)
    prompts = list(cal.prompts)
    for engine in {id(e): e for e in engines.values()}.values():
        engine.generate(prompts[:8], {})
    info = next(iter(engines.values())).describe()
    print(f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"{len(prompts)} prompts, batch {grid.batch_size}, {info['device']} {info['dtype']}")
    return args, grid, cal, engines
