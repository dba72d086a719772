"""Benchmark: every config of a grid against its reference, across engines, in one run.

    python benchmarks/bench_engines.py [--grid grids/mixed.yaml] [--n 512] [--threads 1]

Prepares the grid as the gate does (its prompts, and each config's engine: a config's own
``engine:``/``engine_args:`` replace the grid's), warms each engine up, then decodes the prompts
with every config (batches of the grid's batch_size, in prompt order, reference first) and prints
per config: its engine, accuracy and the prompts the reference answers and the config misses (V),
TPF (pooled tokens / forwards, a batched forward counting once per request), forwards per
request, row-forwards per request (the rows a request occupies in those forwards: BlockBatch's
branches; one per forward elsewhere), analytical FLOPs per request and wall time, each beside its
ratio to the reference; then what each engine reports of its own: FlowBlock's edits, BlockBatch's
merges, syncs and refreshes per request and the mean block size of its winning branch.
The default grid, grids/mixed.yaml, holds the multi-block, FlowBlock and BlockBatch engines;
``--grid grids/blockbatch.yaml`` (or any grid) benchmarks another.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from timing import gate_setup, generate_timed

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
        **{key: mean_extra(gens, key) for key in ("flops", "edits", "merges", "syncs", "refreshes", "block_size")},
    }


EXTRAS = {  # extra key -> column label, per request (block_size: the winning branch's)
    "edits": "edits/req", "merges": "merges/req", "syncs": "syncs/req", "refreshes": "refresh/req", "block_size": "winner B",
}


def ratio(value: float, reference: float) -> str:
    return f"{value / reference:.3f}" if reference else "n/a"


def main() -> None:
    _, grid, cal, engines = gate_setup(__doc__.split("\n\n")[0], str(ROOT / "grids" / "mixed.yaml"))
    prompts = list(cal.prompts)

    names = list(cal.collection_order())  # the reference first
    results = {name: measure(engines[name], cal.suite, prompts, cal.params[name], grid.batch_size) for name in names}
    ref = results[grid.reference]
    engine_of = {name: cal.engines[name][0] for name in names}
    w, e = max(map(len, names)) + 2, max(map(len, engine_of.values())) + 2
    print(f"\n{'config':<{w}}{'engine':<{e}}{'acc':>6}{'acc x':>7}{'V':>4}{'TPF':>7}{'TPF x':>7}{'fwd/req':>9}{'fwd x':>7}"
          f"{'rows/req':>9}{'rows x':>8}{'FLOPs x':>8}{'wall s':>8}{'wall x':>8}")
    for name in names:
        r = results[name]
        violations = int((ref["correct"] & ~r["correct"]).sum())
        print(f"{name:<{w}}{engine_of[name]:<{e}}{r['correct'].mean():>6.3f}{ratio(r['correct'].mean(), ref['correct'].mean()):>7}"
              f"{violations:>4}{r['tpf']:>7.2f}{ratio(r['tpf'], ref['tpf']):>7}{r['forwards']:>9.2f}"
              f"{ratio(r['forwards'], ref['forwards']):>7}{r['rows']:>9.2f}{ratio(r['rows'], ref['rows']):>8}"
              f"{ratio(r['flops'], ref['flops']):>8}{r['wall']:>8.1f}{ratio(r['wall'], ref['wall']):>8}")
    own = [name for name in names if any(np.isfinite(results[name][key]) for key in EXTRAS)]
    if own:  # what FlowBlock and BlockBatch report of their own ("-": the engine does not)
        print(f"\n{'config':<{w}}" + "".join(f"{label:>{len(label) + 2}}" for label in EXTRAS.values()))
        for name in own:
            cells = (f"{results[name][key]:.2f}" if np.isfinite(results[name][key]) else "-" for key in EXTRAS)
            print(f"{name:<{w}}" + "".join(f"{cell:>{len(label) + 2}}" for cell, label in zip(cells, EXTRAS.values())))

if __name__ == "__main__":
    main()
