"""Benchmark: every engine's overhead over its model, measured in one run.

    python benchmarks/bench_overhead.py [--batch 64] [--repeats 3] [--threads 1] [--only speculative ...]

Engine overhead = the wall time of ``engine.generate`` spent *outside* the model's decoder and
output-head calls, as a share of the time spent inside them:

    overhead = (wall - inside) / inside

``inside`` is measured by forward pre-hooks and hooks on every model the engine holds
(``get_decoder()`` and ``get_output_embeddings()``; both models of the speculative engine), so it
covers the transformer layers and the head whether the engine calls the whole model or the
decoder and head separately. Everything else (masks, caches, bookkeeping, sampling, the Python
loop) is overhead. Each row decodes the first ``--batch`` calibration prompts of the arithmetic
suite as one batch, threads 1, after a warm-up; the best (lowest-wall) of ``--repeats`` runs is
kept. Each run decodes as the gate's decoder calls an engine, with Python's automatic garbage
collection paused for the batch (``batchrun.paused_gc``): a full collection scans every object
of the process, which here holds every engine's models, and is no cost of the engine. Rows: the block-diffusion reference and its skip rule, FlowBlock, BlockBatch (the
parameters of grids/mixed.yaml's defaults), speculative (lossless and typical, grids/speculative.yaml)
and quantized (int8, nf4; grids/quantization.yaml), each on the embedded models. ``--before``
adds the speculative and quantized rows decoded with the cache they used before the preallocated
one (tests/support/compact_row_cache.py), so before and after are measured in the same run, alternating.
``--against REV`` adds the speculative and quantized rows decoded by the engine as it was at git
revision REV (its engines/speculative.py or engines/quantized.py and engines/autoregressive.py, on
the same loaded models), also alternating: the A/B of a speed change, which must and does decode
the same texts (checked).
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import platform
import re
import subprocess
import sys
import types
import time
from pathlib import Path

import torch
from transformers import PreTrainedModel

from pytest_redline.decode.batchrun import paused_gc
from pytest_redline.engines import autoregressive, runtime
from pytest_redline.engines.runtime import AR_DRAFT, AR_TARGET
from pytest_redline.suites.arithmetic import ArithmeticSuite

BD = {"model": runtime.EMBEDDED_MODEL, "device": "cpu", "dtype": "float32"}
ROWS = {  # row -> (engine entry-point name, engine_args, config)
    "block_diffusion reference": ("block_diffusion", BD, {}),
    "block_diffusion skip rule": ("block_diffusion", BD, {"skip_masked_blocks": True}),
    "block_diffusion eager": ("block_diffusion", BD, {"schedule": "eager"}),
    "flowblock w3/s50/acc95/edit": ("flowblock", BD, {"window": 3, "spawn_threshold": 0.5, "accept_threshold": 0.95}),
    "blockbatch bs4-8-16/acc90/m50": ("blockbatch", BD, {"block_sizes": [4, 8, 16], "accept_threshold": 0.90, "merge_threshold": 0.5}),
    "speculative lossless": ("speculative", {"target": AR_TARGET, "draft": AR_DRAFT, "device": "cpu", "dtype": "float32"},
                             {"acceptance": "lossless", "num_draft_tokens": 4}),
    "speculative eps0.1": ("speculative", {"target": AR_TARGET, "draft": AR_DRAFT, "device": "cpu", "dtype": "float32"},
                           {"acceptance": "typical", "posterior_threshold": 0.1, "num_draft_tokens": 4}),
    "quantized int8": ("quantized", {"model": AR_TARGET, "device": "cpu", "dtype": "float32", "measure_peak": False},
                       {"quantization": "int8"}),
    "quantized nf4": ("quantized", {"model": AR_TARGET, "device": "cpu", "dtype": "float32", "measure_peak": False},
                      {"quantization": "nf4"}),
}


class ModelClock:
    """Seconds spent inside the decoder and output-head calls of ``models`` (hooks; remove with ``close``)."""

    def __init__(self, models) -> None:
        self.inside = 0.0
        self._depth = 0
        self._start = 0.0
        self._handles = []
        for model in models:
            for module in (model.get_decoder(), model.get_output_embeddings()):
                self._handles.append(module.register_forward_pre_hook(self._enter))
                self._handles.append(module.register_forward_hook(self._leave))

    def _enter(self, module, args) -> None:
        if self._depth == 0:
            self._start = time.perf_counter()
        self._depth += 1

    def _leave(self, module, args, output) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.inside += time.perf_counter() - self._start

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


def models_of(engine) -> list[PreTrainedModel]:
    """The models an engine holds (the quantized engine's current one included), once each."""
    found = {id(v): v for v in vars(engine).values() if isinstance(v, PreTrainedModel)}
    return list(found.values())


@contextlib.contextmanager
def compact_cache(engine):
    """Decode with the cache used before the preallocated one (speculative and quantized engines)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from compact_row_cache import CompactRowCache

    saved = autoregressive.RowCache
    autoregressive.RowCache = CompactRowCache  # greedy() (the quantized engine) looks it up here
    if hasattr(engine, "target"):
        engine.decode = functools.partial(type(engine).decode, engine, row_cache=CompactRowCache)
    try:
        yield
    finally:
        autoregressive.RowCache = saved
        vars(engine).pop("decode", None)


def engine_at(engine, rev: str):
    """``engine`` (speculative or quantized) as of git revision ``rev``: its module and
    engines/autoregressive.py at ``rev``, loaded as private modules, sharing ``engine``'s loaded
    models (the quantized engine's current mode included)."""
    root = Path(__file__).resolve().parents[1]
    name = f"_bench_at_{len(sys.modules)}"
    engine_module = type(engine).__module__.rsplit(".", 1)[-1]
    for part in ("autoregressive", engine_module):
        source = subprocess.run(["git", "-C", str(root), "show", f"{rev}:engines/{part}.py"],
                                capture_output=True, text=True, check=True).stdout
        module = types.ModuleType(f"{name}_{part}")
        sys.modules[module.__name__] = module  # dataclasses look their module up
        source = re.sub(r"pytest_redline\.engines\.autoregressive\b", f"{name}_autoregressive", source)
        exec(compile(source, f"{rev}:engines/{part}.py", "exec"), module.__dict__)
    cls = getattr(sys.modules[f"{name}_{engine_module}"], type(engine).__name__)
    old = cls.__new__(cls)
    old.__dict__.update(vars(engine))
    return old


def overhead(engine, prompts, config, repeats: int, variants=(False,), rev=None) -> list[tuple[float, float]]:
    """Per variant (False: the engine as it is; True: with the old cache; "at": the engine at git
    revision ``rev``, :func:`engine_at`), the (wall, inside) of the best of ``repeats`` runs of
    ``generate(prompts, config)``. The variants alternate run by run, so a machine's changing
    load weighs on them alike."""
    engine.generate(prompts[:8], config)  # warm-up (and the quantized engine loads its mode)
    against = engine_at(engine, rev) if "at" in variants else None  # after the warm-up: it shares the mode's model
    if against is not None and [g.text for g in against.generate(prompts, config)] != [g.text for g in engine.generate(prompts, config)]:
        raise AssertionError(f"bench_overhead: {config}: the engine at --against decodes other texts")
    clock = ModelClock(models_of(engine))
    best: dict[object, tuple[float, float]] = {}
    try:
        for _ in range(repeats):
            for variant in variants:
                with compact_cache(engine) if variant is True else contextlib.nullcontext(), paused_gc():
                    clock.inside = 0.0
                    start = time.perf_counter()
                    (against if variant == "at" else engine).generate(prompts, config)
                    wall = time.perf_counter() - start
                if variant not in best or wall < best[variant][0]:
                    best[variant] = (wall, clock.inside)
    finally:
        clock.close()
    return [best[v] for v in variants]


def main() -> None:
    from pytest_redline import registry

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", nargs="*", default=None, help="rows whose name contains any of these words")
    parser.add_argument("--before", action="store_true", help="also the speculative and quantized rows with the old cache")
    parser.add_argument("--against", metavar="REV", help="also the speculative and quantized rows decoded by the engine at git revision REV")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    prompts = ArithmeticSuite(split="calibration", n=args.batch, seed=0).prompts()
    rows = {k: v for k, v in ROWS.items() if not args.only or any(word in k for word in args.only)}
    print(f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"batch {args.batch}, best of {args.repeats}")
    print(f"{'engine / config':<38}{'wall s':>9}{'inside s':>10}{'outside s':>11}{'overhead':>10}")
    engines: dict[str, object] = {}
    for row, (name, engine_args, config) in rows.items():
        key = f"{name}:{sorted(engine_args.items())}"
        if key not in engines:
            engines[key] = registry.factory(registry.ENGINES, name)(**engine_args)
            torch.set_num_threads(args.threads)
        variants = (False, True) if args.before and name in ("speculative", "quantized") else (False,)
        variants += ("at",) if args.against and name in ("speculative", "quantized") else ()
        for variant, (wall, inside) in zip(variants, overhead(engines[key], prompts, config, args.repeats, variants, args.against)):
            label = {False: row, True: f"{row} (before)", "at": f"{row} (at {args.against})"}[variant]
            print(f"{label:<38}{wall:>9.3f}{inside:>10.3f}{wall - inside:>11.3f}{(wall - inside) / inside:>10.1%}", flush=True)


if __name__ == "__main__":
    main()
