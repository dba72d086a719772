"""The model-free half of the block-diffusion engines (multi-block, FlowBlock, BlockBatch):
their configs' parameters and defaults, constructor arguments, checkpoint check and identity.
Imports no torch (see ``spec``); the engines live in block_diffusion.py, flowblock.py and
blockbatch.py and derive from these specs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from pytest_redline.contracts import ConfigError
from pytest_redline.engines import checkpoints, runtime
from pytest_redline.engines.spec import EngineSpec, check_params, defaults, with_defaults

SCHEDULES = ("diffulex", "eager", "fast_dllm")
# what each schedule's attention is, and the upstream decoder it equals (the report shows it)
MODES = {
    "diffulex": "block-causal cache, blocks from position 0 (Diffulex multi_bd)",
    "eager": "block-causal cache, blocks from position 0 (single-block threshold decoding)",
    "fast_dllm": "dual cache, full attention, blocks from the prompt's end (Fast-dLLM generate_with_dual_cache; "
    "Dream: its block generation with dual_cache)",
}
# keys of the multi-block schedules that fast_dllm has no use for: a grid that sets one is refused
MULTI_BLOCK_ONLY = ("buffer_size", "semi_complete_threshold", "add_block_threshold", "skip_masked_blocks")

@dataclass(frozen=True)
class DecodeConfig:
    block_size: int = 8
    buffer_size: int = 2
    accept_threshold: float = 0.95
    semi_complete_threshold: float = 0.90
    add_block_threshold: float = 0.10
    skip_masked_blocks: bool = False
    schedule: str = "diffulex"  # or "eager" (earlier, cheaper rules), or "fast_dllm" (dual cache: dual_cache.py)
    max_new_tokens: int = 96
    use_cache: bool = True  # False recomputes the whole prefix every step: the reference for tests

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> "DecodeConfig":
        values = with_defaults("block_diffusion", params, cls)
        check_params(
            "block_diffusion", values,
            ints={"block_size": 1, "buffer_size": 1, "max_new_tokens": 1},
            numbers=("accept_threshold", "semi_complete_threshold", "add_block_threshold"),
            flags=("skip_masked_blocks", "use_cache"),
        )
        if values["schedule"] not in SCHEDULES:
            raise ConfigError("schedule", f"block_diffusion: schedule: expected one of {', '.join(SCHEDULES)}, got {values['schedule']!r}")
        if values["schedule"] == "fast_dllm":
            _check_fast_dllm(params, values)
        return cls(**values)


def _check_fast_dllm(params: Mapping[str, Any], values: Mapping[str, Any]) -> None:
    """``schedule: fast_dllm``: every position attends the whole canvas, so the block and the
    generation length change every token: both must be set (they enter the outcome key) and the
    length must be whole blocks, as in Fast-dLLM."""
    for key in ("block_size", "max_new_tokens"):
        if key not in params:
            raise ConfigError(key, f"block_diffusion: {key}: expected a value under schedule fast_dllm (the masked "
                              "suffix spans the whole generation, so it changes every token), got none")
    for key in MULTI_BLOCK_ONLY:
        if key in params:
            raise ConfigError(key, f"block_diffusion: {key}: does not apply to schedule fast_dllm (one block at a time), "
                              f"got {params[key]!r}")
    if values["max_new_tokens"] % values["block_size"]:
        raise ConfigError("max_new_tokens", f"block_diffusion: max_new_tokens: expected a multiple of block_size "
                          f"{values['block_size']} under schedule fast_dllm (Fast-dLLM decodes whole blocks), "
                          f"got {values['max_new_tokens']}")
    if not values["use_cache"]:
        raise ConfigError("use_cache", "block_diffusion: use_cache: schedule fast_dllm is the dual cache; "
                          "expected true, got false")


@dataclass(frozen=True)
class FlowConfig:
    block_size: int = 8
    window: int = 3  # at most this many active blocks; 1 = one block at a time (LLaDA2.1)
    accept_threshold: float = 0.95  # commit a masked position above this; also the readiness cut
    # Admit the next block when the frontier's readiness reaches this. Not 0.9: a frontier with m
    # <= 9 masked positions has rho >= 0.9 only when all m pass (rho = 1), so with blocks of 8 and
    # no editing 0.9 admits a block only once its predecessor is complete: serial decoding.
    spawn_threshold: float = 0.50
    edit_threshold: float = 0.90  # replace a filled token whose rival top-1 is above this; >= 1: no editing
    max_post_steps: int = 16  # check forwards per block after its masks are filled (LLaDA2.1's cap)
    max_new_tokens: int = 96
    use_cache: bool = True  # False recomputes the whole prefix every step: the reference for tests

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> "FlowConfig":
        values = with_defaults("flowblock", params, cls)
        check_params(
            "flowblock", values,
            ints={"block_size": 1, "window": 1, "max_new_tokens": 1, "max_post_steps": 0},
            numbers=("accept_threshold", "spawn_threshold", "edit_threshold"),
            flags=("use_cache",),
        )
        return cls(**values)

    @property
    def editing(self) -> bool:
        return self.edit_threshold < 1

    @property
    def buffer_size(self) -> int:
        """The multi-block engine's name for the blocks in flight at most (its ``new_request`` reads it)."""
        return self.window


@dataclass(frozen=True)
class BatchConfig:
    block_sizes: tuple[int, ...] = (4, 8, 16)  # one branch each (the paper evaluates 4-8-16-32-64)
    accept_threshold: float = 0.9  # per-branch commit: top-1 probability above this, else the top-1
    proposal_threshold: float = 0.1  # a branch proposes, at a position it read, every token above this
    merge_threshold: float = 0.5  # a destination takes a merged token only above this probability
    sync_lag: int = 8  # a branch more than this many positions behind the leader copies it
    refresh_interval: int = 0  # leader positions between full cache refreshes; 0: never (paper: 32)
    max_new_tokens: int = 96

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> "BatchConfig":
        values = with_defaults("blockbatch", params, cls)
        sizes = values["block_sizes"]
        if (
            not isinstance(sizes, (list, tuple)) or not sizes or len(set(sizes)) != len(sizes)
            or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in sizes)
        ):
            raise ConfigError("block_sizes", f"blockbatch: block_sizes: expected a non-empty list of distinct ints >= 1, got {sizes!r}")
        check_params(
            "blockbatch", values,
            ints={"sync_lag": 0, "refresh_interval": 0, "max_new_tokens": 1},
            numbers=("accept_threshold", "proposal_threshold", "merge_threshold"),
        )
        return cls(**{**values, "block_sizes": tuple(sizes)})


# The parameters as mappings, read from the fields (tests merge a config into them).
DEFAULTS = defaults(DecodeConfig)
FLOW_DEFAULTS = defaults(FlowConfig)


class BlockDiffusionSpec(EngineSpec):
    """``BlockDiffusionEngine(model=PATH, device="auto", dtype="auto", mask_token_id=None,
    trust_remote_code=False, trace=None, threads=None, eos_token_id=None)``; the model defaults to
    the embedded bd-tiny. ``eos_token_id`` replaces the EOS ids the checkpoint declares."""

    name = "block_diffusion"
    engine = "pytest_redline.engines.block_diffusion:BlockDiffusionEngine"
    rules = "3: diffulex multi_bd, LLaDA2.0 step cap, confidences in the wider dtype"  # enters the outcome key (describe): bump when decoding rules change
    rules_before = "2: diffulex multi_bd"  # what rules 3 decodes exactly like where none of its changes applies
    step_cap = True  # rules 3's LLaDA2.0 step cap (BlockDiffusionEngine.transfer_count) applies to this engine
    Config = DecodeConfig
    engine_args = {"model": None, "device": "auto", "dtype": "auto", "mask_token_id": None, "eos_token_id": None,
                   "trust_remote_code": False, "trace": None, "threads": None}

    @classmethod
    def identity(cls, engine_args: Mapping[str, Any], cache_dir: str | Path | None = None) -> dict[str, Any]:
        """Model-free: what ``fingerprint()`` and ``describe()`` return once built, so that a
        warm rerun keys its outcomes without loading the model (tests/gate/test_store.py checks both);
        weight hashes are cached in ``cache_dir`` (``runtime.WeightHashes``)."""
        args = cls.arguments(engine_args, cache_dir)
        path = Path(args["model"]) if args["model"] is not None else runtime.EMBEDDED_MODEL
        declared = checkpoints.read_checkpoint(path, args["mask_token_id"], args["eos_token_id"]).describe()
        dtype = runtime.dtype_name(args["dtype"], runtime.device_name(args["device"]))
        return runtime.identity(cls.name, args["device"], args["dtype"], [path], model=path,
                                rules=cls.rules_for(dtype, declared["family"]), **declared)

    @classmethod
    def rules_for(cls, dtype: str, family: str) -> str:
        """The rules version in the outcome key for this dtype and checkpoint family. Rules 3 changed
        answers only in a dtype wider than float32 (confidences in that dtype) and, where the step
        cap applies, on LLaDA2 checkpoints; elsewhere it decodes exactly as rules 2 did, so the key
        keeps rules 2 and the stores written before stay warm."""
        changed = dtype == "float64" or (cls.step_cap and family == "llada2")
        return cls.rules if changed else cls.rules_before

    mode = ""  # FlowBlock's and BlockBatch's (their configs have no schedule)

    @classmethod
    def decode_mode(cls, params: Mapping[str, Any]) -> str:
        """Model-free: the attention and cache a config decodes with, and the decoder it equals
        (the JSON report's ``checkpoints`` entry shows it)."""
        schedule = getattr(cls.Config.from_params(params), "schedule", None)
        return f"{schedule}: {MODES[schedule]}" if schedule else cls.mode

    @classmethod
    def check_engine_args(cls, engine_args: Mapping[str, Any], params: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        """The model-free checkpoint check (family, block size, mask token): the gate calls it
        for each config while preparing a grid; a ``checkpoints.CheckpointError`` names the file
        and the field. Returns what the checkpoint declares, ``block_size_used``, the block
        size (BlockBatch: sizes) the config ``params`` decodes with, and its ``decode_mode``; None
        for the embedded model."""
        if "device_map" in engine_args:
            raise ValueError("device_map: sharding a model across devices is not supported; an engine runs on one "
                             "device (engine_args.device), e.g. cuda:0 (docs/how-to/checkpoints.md)")
        checkpoint = checkpoints.check_engine_args(engine_args)
        if checkpoint is None:
            return None
        return {**checkpoint.describe(), "block_size_used": cls.block_size_used(params or {}, checkpoint.block_size),
                "decode_mode": cls.decode_mode(params or {})}

    @classmethod
    def cost_bounds(cls, engine_args: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
        """Model-free (the checkpoint's declared block size read from its config file): tokens
        are in [0, max_new_tokens], and a forward commits at most the window's masked positions,
        block size x blocks in flight (``buffer_size``; FlowBlock's ``window``), so tokens per
        forward is in [0, block x buffer]. No lower bound on it above 0 (FlowBlock's post-steps
        and the store forwards commit nothing) and no upper bound on forwards: the pooled TPF's
        lower end stays 0 until a config is decoded everywhere. BlockBatch declares tokens and forwards only."""
        model = engine_args.get("model")
        checkpoint = checkpoints.read_checkpoint(Path(model) if model is not None else runtime.EMBEDDED_MODEL, engine_args.get("mask_token_id"))
        cfg = cls.Config.from_params(cls.with_declared(params, checkpoint.block_size))
        bounds = {"tokens": (0, cfg.max_new_tokens), "forwards": (1, math.inf)}  # the prefill is one
        if hasattr(cfg, "block_size") and hasattr(cfg, "buffer_size"):
            bounds["tokens_per_forward"] = (0, cfg.block_size * cfg.buffer_size)
        return bounds

    @classmethod
    def with_declared(cls, params: Mapping[str, Any], declared: int | None) -> Mapping[str, Any]:
        """A config's parameters with the checkpoint's ``declared`` block size as the default of
        ``block_size`` (a Config that has one: BlockBatch's ``block_sizes`` do not take it); a
        grid's own value wins. What the engine decodes with, and what it reports."""
        if declared is None or "block_size" in params or "block_size" not in defaults(cls.Config):
            return params
        return {**params, "block_size": declared}

    @classmethod
    def block_size_used(cls, params: Mapping[str, Any], declared: int | None) -> int | list[int]:
        """The block size a config decodes with (BlockBatch: its block sizes)."""
        config = cls.Config.from_params(cls.with_declared(params, declared))
        return list(config.block_sizes) if isinstance(config, BatchConfig) else config.block_size


class FlowBlockSpec(BlockDiffusionSpec):
    name = "flowblock"
    engine = "pytest_redline.engines.flowblock:FlowBlockEngine"
    rules = "3: LLaDA2.1 editing, post-step cap, confidences in the wider dtype"
    rules_before = "2: LLaDA2.1 editing, post-step cap"
    step_cap = False
    Config = FlowConfig
    mode = "block-causal cache, blocks from position 0 (FlowBlock wavefront)"


class BlockBatchSpec(BlockDiffusionSpec):
    name = "blockbatch"
    engine = "pytest_redline.engines.blockbatch:BlockBatchEngine"
    rules = "2: paper merges, best-EOS winner, re-committing refresh"
    rules_before = rules  # its own float32 confidences: rules 3's changes do not apply
    step_cap = False
    Config = BatchConfig
    mode = "block-causal cache per branch, blocks from position 0 (BlockBatch)"
