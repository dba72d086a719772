"""Benchmark: the checkpoint lever on bd-tiny, base against self-distilled, in one run.

    python benchmarks/bench_distill.py [--grid grids/checkpoints.yaml] [--n 512] [--threads 1]

Prepares the grid as the gate does (each config's engine and model: the ``distilled/...`` configs
name engines/models/bd-tiny-distilled in their own ``engine_args``), warms the engines up, decodes
every calibration prompt with every config (the reference first, batches of the grid's size) and
prints per config its checkpoint, accuracy on all prompts, V (prompts the base reference answers
and the config misses), TPF and its ratio to the reference, and wall time; then, per threshold,
the distilled checkpoint's TPF beside the base's (the paper's "TPF gain at every threshold"); then
what the gate deploys at alpha 0.1 (and 0.15, 0.2; the grid's delta, Holm, selection) from the
base-only configs and from the whole grid. Every config sees every prompt here, so the verdicts are the ones the
scheduled gate reaches.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from bench_engines import measure, ratio
from timing import gate_setup

from pytest_redline import risk

ROOT = Path(__file__).resolve().parent.parent
ALPHAS = (0.10, 0.15, 0.20)  # the issue's alpha first; the others show where the verdict moves


def checkpoint(config: str) -> str:
    """``base/acc95/semi90`` -> ``base``: the grid's naming, checkpoint first."""
    return config.split("/", 1)[0]


def deployment(names, results, reference, alpha, delta) -> str:
    correct = np.array([results[n]["correct"] for n in names])
    cost = np.array([results[n]["tpf"] for n in names])
    r = risk.certify(correct, cost, reference, alpha, delta, names=names)
    d = r.deployed_index
    certified = [n for i, n in enumerate(names) if r.valid[i] and i != r.reference_index]
    return (f"{r.deployed}: TPF {r.cost[d]:.3f} ({r.gain[d]:+.1f} %), accuracy {r.accuracy[d]:.3f} "
            f"({r.net_accuracy[d]:+.1f} pts), V {int(r.violations[d])}; "
            f"{len(certified)} of {r.m - 1} candidates certified ({', '.join(certified) or 'none'})")


def main() -> None:
    _, grid, cal, engines = gate_setup(__doc__.split("\n\n")[0], str(ROOT / "grids" / "checkpoints.yaml"))
    prompts = list(cal.prompts)
    names = list(cal.collection_order())
    results = {name: measure(engines[name], cal.suite, prompts, cal.params[name], grid.batch_size) for name in names}
    ref = results[grid.reference]

    w = max(map(len, names)) + 2
    print(f"\n{'config':<{w}}{'model':<26}{'acc':>7}{'V':>5}{'TPF':>7}{'TPF x':>7}{'wall s':>8}")
    for name in names:
        r = results[name]
        model = Path(cal.engines[name][1].get("model", "?")).name
        violations = int((ref["correct"] & ~r["correct"]).sum())
        print(f"{name:<{w}}{model:<26}{r['correct'].mean():>7.3f}{violations:>5}{r['tpf']:>7.3f}"
              f"{ratio(r['tpf'], ref['tpf']):>7}{r['wall']:>8.1f}")

    pairs = [(b, "distilled/" + b.split("/", 1)[1]) for b in names if checkpoint(b) == "base"]
    pairs = [(b, d) for b, d in pairs if d in results]
    print(f"\n{'threshold':<16}{'TPF base':>9}{'TPF dist':>9}{'TPF gain':>10}{'acc base':>9}{'acc dist':>9}{'V base':>7}{'V dist':>7}")
    for b, d in pairs:
        rb, rd = results[b], results[d]
        vb, vd = (int((ref["correct"] & ~r["correct"]).sum()) for r in (rb, rd))
        print(f"{b.split('/', 1)[1]:<16}{rb['tpf']:>9.3f}{rd['tpf']:>9.3f}{100 * (rd['tpf'] / rb['tpf'] - 1):>+9.1f}%"
              f"{rb['correct'].mean():>9.3f}{rd['correct'].mean():>9.3f}{vb:>7}{vd:>7}")

    base_only = [n for n in names if checkpoint(n) == checkpoint(grid.reference)]
    for alpha in ALPHAS:
        print(f"\nthe gate at alpha {alpha}, delta {cal.delta}, n {len(prompts)}, selection:")
        print(f"  base-only grid ({len(base_only)} configs): {deployment(base_only, results, grid.reference, alpha, cal.delta)}")
        print(f"  mixed grid ({len(names)} configs): {deployment(names, results, grid.reference, alpha, cal.delta)}")


if __name__ == "__main__":
    main()
