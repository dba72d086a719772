"""Weight quantization, measured in one run on the embedded target.

    python benchmarks/bench_quantized.py [--n 512] [--threads 1]

For each config of grids/quantization.yaml: weight memory with the quantization scales (our
``memory`` cost), what transformers' ``get_memory_footprint()`` reports (no scales), the scales'
share, peak tensor memory while decoding, wall time and accuracy, with the reductions against the
reference as factors (x smaller) and the wall time as a ratio. Wall time is measured without the
peak tracker (which slows decoding down on the CPU); the peak comes from a second pass.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from pytest_redline.engines import memory
from pytest_redline.engines.quantized import QuantizedEngine
from pytest_redline.grid import load_grid
from pytest_redline.suites.arithmetic import ArithmeticSuite
from timing import generate_timed

GRID = Path(__file__).resolve().parents[1] / "grids" / "quantization.yaml"


run = generate_timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    grid = load_grid(GRID)
    suite = ArithmeticSuite(split="calibration", n=args.n, seed=0)
    prompts = suite.prompts()
    timed = QuantizedEngine(**{**grid.engine_args, "measure_peak": False, "threads": args.threads})
    traced = QuantizedEngine(**{**grid.engine_args, "measure_peak": True, "threads": args.threads})
    print(f"{grid.name}: {args.n} prompts, batch {grid.batch_size}, {timed.describe()['device']}, {args.threads} threads")
    rows = {}
    for config in grid.configs:
        gens, wall = run(timed, prompts, config.params, grid.batch_size)
        peaks, _ = run(traced, prompts, config.params, grid.batch_size)
        model = timed.model(config.params["quantization"])
        weights = memory.weight_memory(model)
        buffers = sum(b.numel() * b.element_size() for b in model.buffers())
        rows[config.name] = dict(
            memory=weights["total"],
            footprint=model.get_memory_footprint() - buffers,
            scales=weights["scales"],
            packed=weights["weights"],
            peak=max(g.extra["memory_peak"] for g in peaks),
            wall=wall,
            accuracy=sum(suite.score(p, g.text) for p, g in zip(prompts, gens)) / len(prompts),
            same=sum(g.text == r.text for g, r in zip(gens, rows.get(grid.reference, {}).get("gens", gens))) / len(gens),
            gens=gens,
        )
    ref = rows[grid.reference]
    print(f"{'config':<6} {'memory B':>10} {'x smaller':>9} {'hf footprint B':>14} {'scales':>7} {'peak B':>10} {'x smaller':>9} "
          f"{'wall s':>7} {'ratio':>6} {'accuracy':>8} {'same text':>9}")
    for name, r in rows.items():
        print(f"{name:<6} {r['memory']:10d} {ref['memory'] / r['memory']:9.2f} {r['footprint']:14d} "
              f"{r['scales'] / r['memory']:7.1%} {r['peak']:10.0f} {ref['peak'] / r['peak']:9.2f} "
              f"{r['wall']:7.2f} {r['wall'] / ref['wall']:6.2f} {r['accuracy']:8.1%} {r['same']:9.1%}")
    print("memory = packed weights + unquantized parameters + quantization scales (absmax/code, SCB); "
          "hf footprint = get_memory_footprint() less buffers (no scales)")


if __name__ == "__main__":
    main()
