"""Benchmark: the embedded grid on the CPU, every config against the reference, in one run.

    python benchmarks/bench_block_diffusion.py [--grid redline.yaml] [--n 512] [--threads 2]

Decodes the grid's calibration prompts with every config (batches of the grid's batch_size, in
prompt order) and prints, per config: accuracy, TPF (pooled tokens / forwards), wall time, and
both as ratios to the reference; then the FLOPs the static skip rule saves (the reference with
``skip_masked_blocks`` on against off, same prompts), and the reference config under both
schedules (``diffulex``, the default, and ``eager``) at its buffer size and at buffer 1. When ``pytest_redline.risk`` is importable
it also prints the Redline verdict at alpha 0.1 and 0.02 (V = prompts the reference answers and
the config misses, Holm at the grid's delta), the same computation the gate makes.

    python benchmarks/bench_block_diffusion.py --overhead-against REV [--n 64]

instead prints the three block-diffusion engines' overhead (time outside the model's decoder and
head calls as a share of the time inside: ``bench_overhead.overhead``, threads 1, best of 3) for
the engines of git revision REV and of the working tree, measured in one run on the first ``--n``
calibration prompts as one batch.
"""
from __future__ import annotations

import argparse
import platform
from pathlib import Path

import numpy as np
import torch
import yaml

from pytest_redline.engines.block_diffusion import BlockDiffusionEngine
from pytest_redline.engines.diffusion_spec import DEFAULTS
from pytest_redline.suites.arithmetic import ArithmeticSuite
from timing import generate_timed

ROOT = Path(__file__).resolve().parent.parent


def run(engine, suite, prompts, params, batch_size):
    gens, wall = generate_timed(engine, prompts, params, batch_size)
    correct = np.array([suite.score(p, g.text) for p, g in zip(prompts, gens)])
    tokens = sum(g.tokens for g in gens)
    forwards = sum(g.forwards for g in gens)
    flops = sum(g.extra["flops"] for g in gens)
    blocks = np.mean([g.extra["blocks"] for g in gens])
    return {"correct": correct, "tpf": tokens / forwards, "wall": wall, "flops": flops, "blocks": blocks}


OVERHEAD_ROWS = [  # (row, module, class, config)
    ("block_diffusion reference", "block_diffusion", "BlockDiffusionEngine", {}),
    ("block_diffusion eager", "block_diffusion", "BlockDiffusionEngine", {"schedule": "eager"}),
    ("block_diffusion skip rule", "block_diffusion", "BlockDiffusionEngine", {"skip_masked_blocks": True}),
    ("flowblock w3/s50/acc95/edit", "flowblock", "FlowBlockEngine", {"window": 3, "spawn_threshold": 0.5, "accept_threshold": 0.95}),
    ("blockbatch bs4-8-16/acc90/m50", "blockbatch", "BlockBatchEngine", {"block_sizes": [4, 8, 16], "accept_threshold": 0.90, "merge_threshold": 0.5}),
]


def engines_at(rev: str, folder: Path) -> dict:
    """The three engine modules as they were at git revision ``rev``, imported from ``folder``
    (their imports of the multi-block engine point at its copy)."""
    import importlib
    import subprocess
    import sys

    for name in ("block_diffusion", "flowblock", "blockbatch"):
        source = subprocess.run(["git", "show", f"{rev}:engines/{name}.py"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        (folder / f"at_rev_{name}.py").write_text(source.replace("pytest_redline.engines.block_diffusion", "at_rev_block_diffusion"))
    sys.path.insert(0, str(folder))
    return {name: importlib.import_module(f"at_rev_{name}") for name in ("block_diffusion", "flowblock", "blockbatch")}


def overhead_against(rev: str, n: int) -> None:
    import importlib
    import tempfile

    from bench_overhead import BD, overhead

    prompts = ArithmeticSuite(split="calibration", n=n, seed=0).prompts()
    print(f"{platform.processor() or platform.machine()}, 1 thread, torch {torch.__version__}, batch {n}, best of 3; {rev} against the working tree")
    print(f"{'engine / config':<32}{rev[:10]:>12}{'now':>9}{'wall ' + rev[:7]:>14}{'wall now':>10}")
    with tempfile.TemporaryDirectory() as folder:
        old = engines_at(rev, Path(folder))
        for row, module, cls, config in OVERHEAD_ROWS:
            result = []
            for mod in (old[module], importlib.import_module(f"pytest_redline.engines.{module}")):
                try:
                    engine = getattr(mod, cls)(**BD)
                    torch.set_num_threads(1)
                    result.append(overhead(engine, prompts, config, 3))
                except (ValueError, TypeError):
                    result.append(None)  # the config is unknown at that revision
            cells = [f"{(w - i) / i:.1%}" if (w, i) != (0, 0) else "-" for w, i in (r or (0, 0) for r in result)]
            walls = [f"{r[0]:.2f}" if r else "-" for r in result]
            print(f"{row:<32}{cells[0]:>12}{cells[1]:>9}{walls[0]:>14}{walls[1]:>10}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grid", default=str(ROOT / "redline.yaml"))
    parser.add_argument("--n", type=int, default=None, help="prompts (default: the grid's suite_args.n)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--overhead-against", metavar="REV", default=None, help="print the engines' overhead at REV and now")
    args = parser.parse_args()
    if args.overhead_against:
        torch.set_num_threads(1)
        return overhead_against(args.overhead_against, args.n or 64)
    torch.set_num_threads(args.threads)
    grid_path = Path(args.grid)
    grid = yaml.safe_load(grid_path.read_text())
    suite_args = dict(grid.get("suite_args", {}))
    if args.n:
        suite_args["n"] = args.n
    suite = ArithmeticSuite(**suite_args)
    prompts = suite.prompts()
    engine_args = dict(grid.get("engine_args", {}))
    engine_args["model"] = str((grid_path.parent / engine_args.get("model", "engines/models/bd-tiny")).resolve())
    engine = BlockDiffusionEngine(**engine_args)
    batch_size = grid.get("batch_size", 8)
    print(f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"{len(prompts)} prompts, batch {batch_size}, {engine.describe()['device']} {engine.describe()['dtype']}")

    names = list(grid["configs"])
    results = {name: run(engine, suite, prompts, grid["configs"][name], batch_size) for name in names}
    ref = results[grid["reference"]]
    print(f"\n{'config':<16}{'acc':>7}{'V':>5}{'TPF':>7}{'TPF x':>8}{'wall s':>8}{'wall x':>8}{'blocks':>8}")
    for name in names:
        r = results[name]
        violations = int((ref["correct"] & ~r["correct"]).sum())
        print(f"{name:<16}{r['correct'].mean():>7.3f}{violations:>5}{r['tpf']:>7.2f}{r['tpf'] / ref['tpf']:>8.3f}"
              f"{r['wall']:>8.1f}{r['wall'] / ref['wall']:>8.3f}{r['blocks']:>8.2f}")

    reference_params = grid["configs"][grid["reference"]]
    skipped = run(engine, suite, prompts, {**reference_params, "skip_masked_blocks": True}, batch_size)
    print(f"\nskip rule on the reference: FLOPs x{skipped['flops'] / ref['flops']:.3f} "
          f"({1 - skipped['flops'] / ref['flops']:.1%} saved), TPF x{skipped['tpf'] / ref['tpf']:.3f}, "
          f"accuracy {skipped['correct'].mean():.3f} vs {ref['correct'].mean():.3f}")

    print(f"\n{'schedule':<10}{'buffer':>7}{'acc':>7}{'TPF':>7}{'TPF x':>8}{'wall s':>8}")
    for buffer in (reference_params.get("buffer_size", DEFAULTS["buffer_size"]), 1):
        for schedule in ("diffulex", "eager"):
            r = run(engine, suite, prompts, {**reference_params, "buffer_size": buffer, "schedule": schedule}, batch_size)
            print(f"{schedule:<10}{buffer:>7}{r['correct'].mean():>7.3f}{r['tpf']:>7.2f}{r['tpf'] / ref['tpf']:>8.3f}{r['wall']:>8.1f}")

    try:
        from pytest_redline import risk
    except ImportError:
        return
    correct = np.stack([results[n]["correct"] for n in names])
    cost = np.array([results[n]["tpf"] for n in names])
    for alpha in (0.1, 0.02):
        verdict = risk.certify(correct, cost, grid["reference"], alpha, grid.get("delta", 0.1), names=names)
        valid = [n for n, v in zip(names, verdict.valid) if v]
        print(f"alpha {alpha}: deployed {verdict.deployed}; certified {valid}")


if __name__ == "__main__":
    main()
