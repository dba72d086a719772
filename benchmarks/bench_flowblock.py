"""Benchmark: FlowBlock against serial decoding and the multi-block reference, on the CPU.

    python benchmarks/bench_flowblock.py [--grid grids/flowblock.yaml] [--n 512] [--threads 1]

Warms each engine up, then decodes the grid's calibration prompts (batches of the grid's
batch_size, in prompt order) with every config, and each FlowBlock config once more with
``window: 1`` (the same config decoded serially, one block at a time; spawn_threshold then plays no
part). Prints per config: accuracy, V (prompts the reference answers and the config misses), TPF (pooled
tokens / forwards) and its ratios to the reference and to the serial decoding (``ser x``), forwards
and edits per request, wall time and its ratio to the reference, and two divergences: the share of
output positions that differ from the serial decoding of the same config (``div ser``: what the
wavefront changes) and from the reference's output (``div ref``). Outputs are compared position by
position up to the longer one (a position only one output has differs), pooled over the prompts.
Then the Redline verdict at alpha 0.1 and 0.02 (Holm at the grid's delta), the computation the gate
makes.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pytest_redline import risk
from timing import gate_setup, generate_timed

ROOT = Path(__file__).resolve().parent.parent


def output_ids(engine, gen) -> list[int]:
    """The generated tokens, re-encoded from the text; -1 stands for the EOS when one was produced."""
    ids = engine.tokenizer(gen.text).input_ids
    return ids + [-1] * (gen.tokens - len(ids))


def divergence(outputs: list[list[int]], others: list[list[int]]) -> float:
    """The pooled share of output positions where two decodings of the same prompts differ."""
    differ = total = 0
    for a, b in zip(outputs, others):
        differ += sum(x != y for x, y in zip(a, b)) + abs(len(a) - len(b))
        total += max(len(a), len(b))
    return differ / max(total, 1)


def run(engine, suite, prompts, params, batch_size) -> dict:
    gens, wall = generate_timed(engine, prompts, params, batch_size)
    forwards = sum(g.forwards for g in gens)
    return {
        "correct": np.array([suite.score(p, g.text) for p, g in zip(prompts, gens)]),
        "tpf": sum(g.tokens for g in gens) / forwards,
        "fpr": forwards / len(prompts),
        "edits": sum(g.extra.get("edits", 0.0) for g in gens) / len(prompts),
        "wall": wall,
        "ids": [output_ids(engine, g) for g in gens],
    }


def main() -> None:
    _, grid, cal, engines = gate_setup(__doc__.split("\n\n")[0], str(ROOT / "grids" / "flowblock.yaml"))
    suite, prompts, names = cal.suite, list(cal.prompts), list(cal.configs)
    results = {name: run(engines[name], suite, prompts, cal.params[name], grid.batch_size) for name in names}
    serial: dict[str, dict] = {}  # one serial decoding per distinct window-1 config
    ref = results[grid.reference]
    print(f"\n{'config':<20}{'acc':>7}{'V':>5}{'TPF':>7}{'TPF x':>8}{'ser x':>7}{'fwd/req':>9}{'edits':>7}"
          f"{'wall s':>8}{'wall x':>8}{'div ser':>9}{'div ref':>9}")
    for name in names:
        r = results[name]
        speedup = div_serial = "-"
        if cal.engines[name][0] == "flowblock":
            params = {**cal.params[name], "window": 1}
            key = json.dumps(params, sort_keys=True)
            if key not in serial:
                serial[key] = run(engines[name], suite, prompts, params, grid.batch_size)
            speedup = f"{r['tpf'] / serial[key]['tpf']:.3f}"
            div_serial = f"{divergence(r['ids'], serial[key]['ids']):.3f}"
        violations = int((ref["correct"] & ~r["correct"]).sum())
        print(f"{name:<20}{r['correct'].mean():>7.3f}{violations:>5}{r['tpf']:>7.2f}{r['tpf'] / ref['tpf']:>8.3f}"
              f"{speedup:>7}{r['fpr']:>9.1f}{r['edits']:>7.2f}{r['wall']:>8.1f}{r['wall'] / ref['wall']:>8.3f}"
              f"{div_serial:>9}{divergence(r['ids'], ref['ids']):>9.3f}")

    correct = np.stack([results[n]["correct"] for n in names])
    cost = np.array([results[n]["tpf"] for n in names])
    for alpha in (0.1, 0.02):
        verdict = risk.certify(correct, cost, grid.reference, alpha, grid.delta or 0.1, names=names)
        valid = [n for n, v in zip(names, verdict.valid) if v]
        print(f"alpha {alpha}: deployed {verdict.deployed}; certified {valid}")


if __name__ == "__main__":
    main()
