"""Benchmark for a lent GPU: tokens per second and TPF ratios of the embedded grid's configs.

    python benchmarks/gpu_block_diffusion.py                    # CUDA + bfloat16 when available
    python benchmarks/gpu_block_diffusion.py --device cpu --n 64  # the same script on the CPU

Loads the grid's model on ``--device`` (``auto``: CUDA when available) with ``--dtype``
(``auto``: bfloat16 on CUDA, float32 on the CPU), warms up on one batch, then decodes the
calibration prompts with every config, in the grid's batch size, and prints per config the
generated tokens per second (wall clock, synchronised), TPF, and both as ratios to the reference,
with the card, dtype and date.
"""
from __future__ import annotations

import argparse
import datetime
import time
from pathlib import Path

import torch
import yaml

from pytest_redline.engines.block_diffusion import BlockDiffusionEngine
from pytest_redline.suites.arithmetic import ArithmeticSuite

ROOT = Path(__file__).resolve().parent.parent


def timed(engine, prompts, params, batch_size):
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    gens = []
    for i in range(0, len(prompts), batch_size):
        gens += engine.generate(prompts[i : i + batch_size], params)
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    tokens = sum(g.tokens for g in gens)
    return tokens / wall, tokens / sum(g.forwards for g in gens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grid", default=str(ROOT / "redline.yaml"))
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--n", type=int, default=None, help="prompts (default: the grid's suite_args.n)")
    args = parser.parse_args()
    grid_path = Path(args.grid)
    grid = yaml.safe_load(grid_path.read_text())
    suite_args = dict(grid.get("suite_args", {}))
    if args.n:
        suite_args["n"] = args.n
    prompts = ArithmeticSuite(**suite_args).prompts()
    model = (grid_path.parent / grid.get("engine_args", {}).get("model", "engines/models/bd-tiny")).resolve()
    engine = BlockDiffusionEngine(model=model, device=args.device, dtype=args.dtype)
    batch_size = grid.get("batch_size", 8)
    card = torch.cuda.get_device_name(engine.device) if engine.device.type == "cuda" else "cpu"
    info = engine.describe()
    print(f"{datetime.date.today()}  {card}  {info['dtype']}  torch {info['torch']}  "
          f"{len(prompts)} prompts, batch {batch_size}")

    names = list(grid["configs"])
    engine.generate(prompts[:batch_size], grid["configs"][grid["reference"]])  # warm-up
    results = {name: timed(engine, prompts, grid["configs"][name], batch_size) for name in names}
    ref_tps, ref_tpf = results[grid["reference"]]
    print(f"{'config':<16}{'tokens/s':>10}{'x ref':>8}{'TPF':>7}{'x ref':>8}")
    for name in names:
        tps, tpf = results[name]
        print(f"{name:<16}{tps:>10.0f}{tps / ref_tps:>8.3f}{tpf:>7.2f}{tpf / ref_tpf:>8.3f}")


if __name__ == "__main__":
    main()
