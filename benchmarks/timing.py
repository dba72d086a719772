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
