"""Benchmark for a lent GPU: tokens/s, TPF and peak memory per config of a grid, as the gate builds it.

    python benchmarks/gpu_block_diffusion.py --grid grids/sdar.yaml                 # CUDA + bfloat16 when available
    python benchmarks/gpu_block_diffusion.py --grid redline.yaml --device cpu --n 64   # the same on the CPU

The grid is read as the gate reads it (pytest_redline.calibration.prepare): its suite and
suite_args, its engine_args whole (model, trust_remote_code, threads, mask_token_id, seed, ...) and
each config's own ``engine:``/``engine_args:``; only ``device`` and ``dtype`` are overridden (on
every config) by ``--device``/``--dtype``. Each distinct engine is built once and warmed up on
one batch; then every config decodes the prompts in the grid's batch size. Per config it prints
the generated tokens per second (wall clock, synchronised), TPF (tokens / forwards), both as
ratios to the reference's, and the peak memory (CUDA: ``max_memory_allocated`` since the
config started; CPU: the process's peak RSS so far, which only grows), with the card, dtype,
torch version and date. On a lent GPU, for all four tiny families:

    python benchmarks/make_tiny_checkpoints.py build/tiny && for g in sdar dream llada llada2 llada21 diffusion_gemma; do python benchmarks/gpu_block_diffusion.py --grid grids/$g.yaml --dtype bfloat16; done

LLaDA2.0-mini at its real size, with random weights built on the device (nothing is downloaded,
no 32 GB file is written): ``--llada2-random DIR`` writes DIR with LLaDA2.0-mini's exact
config.json, tokenizer ids and generation config and shards that hold only the tensors'
headers (sparse files), points the grid's models at it, and replaces the weight reading by a
seeded random fill on the device, in the grid's dtype (the model-free checks and the engines run
unchanged; the weight fingerprint is the string ``random``). One H200 run, 16 prompts:

    python benchmarks/gpu_block_diffusion.py --grid grids/llada2_math.yaml --llada2-random /tmp/llada2-mini --n 16 \
        --max-new-tokens 256 --configs acc95/semi90,acc90/semi70 --dtype bfloat16
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import resource
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def load(args):
    """(grid, calibration, {config: engine}) with device and dtype overridden on every config."""
    from pytest_redline.calibration import Level, prepare
    from pytest_redline.decode.enginebook import EngineBook
    from pytest_redline.grid import load_grid

    grid = load_grid(args.grid)
    override = {"device": args.device, "dtype": args.dtype, **({"model": str(args.llada2_random)} if args.llada2_random else {})}
    if args.configs:
        keep = set(args.configs.split(","))
        grid = dataclasses.replace(grid, configs=tuple(c for c in grid.configs if c.name in keep))
    if args.max_new_tokens:
        grid = dataclasses.replace(grid, configs=tuple(
            dataclasses.replace(c, params={**c.params, "max_new_tokens": args.max_new_tokens}) for c in grid.configs))
    configs = tuple(
        dataclasses.replace(spec, engine_args={**spec.engine_args, **override}) if spec.engine_args else spec
        for spec in grid.configs or ()
    )
    grid = dataclasses.replace(grid, engine_args={**grid.engine_args, **override}, configs=configs)
    if args.n:
        size = "count" if grid.suite == "math" else "n"  # the math suite (gsm8k + math500) takes a count
        grid = dataclasses.replace(grid, suite_args={**grid.suite_args, size: args.n})
    # a benchmark certifies nothing: a lax alpha keeps prepare()'s n check out of the way of a small --n
    level = Level(alpha=0.99, delta=grid.delta or 0.1, grids_in_session=1, correction="holm", deploy_override=None)
    cal = prepare(grid, grid.name, level, EngineBook())
    book = EngineBook()
    return grid, cal, {name: book.get(*cal.engines[name]) for name in cal.configs}


def random_llada2(folder: Path, sizes: dict) -> None:
    """LLaDA2.0-mini's published folder without its weights (sparse header-only shards), and the
    loader patched to fill the model with seeded random weights on the device instead."""
    import json

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import make_tiny_checkpoints

    from pytest_redline.engines import llada2_config, llada2_load, runtime

    if not (folder / "model.safetensors.index.json").is_file():
        make_tiny_checkpoints.llada2_published(folder, **sizes)

    def random_load(checkpoint, device, dtype):
        fields = llada2_config.model_config(checkpoint.config, checkpoint.folder / "config.json")
        model = llada2_load.build({**fields, "mask_token_id": checkpoint.mask_token_id}, None, dtype, device)
        model.generation_config.eos_token_id = checkpoint.eos_token_id
        generator = torch.Generator(device=device).manual_seed(0)
        with torch.no_grad():
            for name, tensor in model.state_dict(keep_vars=True).items():
                if "norm" in name:
                    tensor.fill_(1.0)
                else:
                    tensor.normal_(0.0, 0.02, generator=generator)
        return model

    llada2_load.load = random_load
    runtime.fingerprint = lambda *paths: "random"
    print(f"LLaDA2 random weights, config {json.loads((folder / 'config.json').read_text())['model_type']} from {folder}")


def device_of(engine) -> torch.device:
    return torch.device(getattr(engine, "device", "cpu"))


def peak_memory_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return rss_kb / 2**20


def run(engine, prompts, params, batch_size):
    """(tokens/s, TPF, peak GB) of decoding ``prompts`` in the gate's batches."""
    device = device_of(engine)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    gens = []
    for i in range(0, len(prompts), batch_size):
        gens += engine.generate(prompts[i : i + batch_size], params)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    wall = time.perf_counter() - start
    tokens = sum(g.tokens for g in gens)
    return tokens / wall, tokens / max(sum(g.forwards for g in gens), 1), peak_memory_gb(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grid", default=str(ROOT / "redline.yaml"))
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto", help="auto: bfloat16 on CUDA, float32 on the CPU")
    parser.add_argument("--n", type=int, default=None, help="prompts (default: the grid's suite_args.n)")
    parser.add_argument("--configs", default=None, help="comma-separated config names to run (default: all)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="override every config's max_new_tokens")
    parser.add_argument("--llada2-random", type=Path, default=None, metavar="DIR",
                        help="LLaDA2.0-mini's exact config with random weights built on the device (see above)")
    parser.add_argument("--llada2-sizes", default="{}", help="JSON: config.json sizes to replace (a CPU smoke run)")
    args = parser.parse_args()
    if args.llada2_random:
        import json

        random_llada2(args.llada2_random, json.loads(args.llada2_sizes))
    grid, cal, engines = load(args)
    prompts = list(cal.prompts)
    batch_size = grid.batch_size
    for name in {id(e): name for name, e in engines.items()}.values():  # warm-up, once per engine
        engines[name].generate(prompts[:batch_size], cal.params[name])
    first = engines[cal.reference]
    device = device_of(first)
    card = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    info = first.describe() if hasattr(first, "describe") else {}
    print(f"{datetime.date.today()}  {grid.name}  {card}  {info.get('dtype', '?')}  torch {torch.__version__}  "
          f"threads {torch.get_num_threads()}  {len(prompts)} prompts, batch {batch_size}  python {sys.version.split()[0]}")
    results = {name: run(engines[name], prompts, cal.params[name], batch_size) for name in cal.configs}
    ref_tps, ref_tpf, _ = results[cal.reference]
    memory = "peak GB (CUDA)" if device.type == "cuda" else "peak RSS GB"
    print(f"{'config':<26}{'engine':<16}{'tokens/s':>10}{'x ref':>8}{'TPF':>8}{'x ref':>8}{memory:>16}")
    for name in cal.configs:
        tps, tpf, peak = results[name]
        print(f"{name:<26}{cal.engines[name][0]:<16}{tps:>10.1f}{tps / ref_tps:>8.3f}{tpf:>8.3f}{tpf / ref_tpf:>8.3f}{peak:>16.3f}")


if __name__ == "__main__":
    main()
