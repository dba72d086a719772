"""Load a published LLaDA2 folder into the native model (``llada2_model``), no remote code.

The model is built on the meta device, allocated once in the target dtype on the target device
(``to_empty``), and each tensor of the safetensors shards is read straight into its parameter
(``readinto`` on the parameter's bytes when the file's dtype is the parameter's, else through a
one-tensor buffer). So a bf16 checkpoint loads in bf16 with no float32 copy and no second copy
of the weights: the load raises the peak RSS by about the checkpoint's size
(``benchmarks/bench_llada2_memory.py``). The published per-expert names
(``mlp.experts.E.{gate,up,down}_proj.weight``) load into slices of the stacked expert tensors.

Every tensor's name and shape was checked before (``llada2_config.check_weights``, also run by
the gate's model-free check), so a mismatched folder is refused before anything is allocated.
One device only: ``device_map`` sharding across GPUs is not supported (docs/how-to/checkpoints.md).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from pytest_redline.engines import llada2_config
from pytest_redline.engines.llada2_model import LLaDA2Config, LLaDA2MoeLM

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
EXPERT_PART = re.compile(r"(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")


def build(fields: dict[str, Any], generation_config=None, dtype: torch.dtype = torch.float32,
          device: torch.device | str = "cpu") -> LLaDA2MoeLM:
    """An uninitialised model of the checked config fields, allocated once in ``dtype`` on ``device``."""
    with torch.device("meta"):
        model = LLaDA2MoeLM(LLaDA2Config(**fields), generation_config)
    model = model.to(dtype).to_empty(device=device).requires_grad_(False)
    if model.config.tie_word_embeddings:  # to_empty gives each module its own tensor
        model.lm_head.weight = model.model.word_embeddings.weight
    return model.eval()


def load(checkpoint, device: torch.device, dtype: torch.dtype) -> LLaDA2MoeLM:
    """The model (eval mode, on ``device``, in ``dtype``) of an inspected LLaDA2 checkpoint."""
    from transformers import GenerationConfig

    folder = checkpoint.folder
    config_file = folder / "config.json"
    fields = llada2_config.model_config(checkpoint.config, config_file)
    tensors = llada2_config.check_weights(folder, fields, config_file)
    generation = GenerationConfig.from_pretrained(folder) if (folder / "generation_config.json").is_file() else GenerationConfig()
    generation.eos_token_id = checkpoint.eos_token_id
    model = build({**fields, "mask_token_id": checkpoint.mask_token_id}, generation, dtype, device)
    targets = _targets(model)
    with torch.no_grad():
        handles: dict[Path, Any] = {}
        try:
            for name, (file, entry, start) in tensors.items():
                if file not in handles:
                    handles[file] = open(file, "rb")
                _read_into(targets[name], handles[file], file, name, entry, start)
        finally:
            for handle in handles.values():
                handle.close()
    return model


def _targets(model: LLaDA2MoeLM) -> dict[str, torch.Tensor]:
    """Published weight name -> the tensor (or the stacked experts' slice) it loads into."""
    targets = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    for prefix, experts in [(n, m) for n, m in model.named_modules() if n.endswith("mlp.experts")]:
        inner = experts.intermediate
        for e in range(experts.gate_up.shape[0]):
            targets[f"{prefix}.{e}.gate_proj.weight"] = experts.gate_up[e, :inner]
            targets[f"{prefix}.{e}.up_proj.weight"] = experts.gate_up[e, inner:]
            targets[f"{prefix}.{e}.down_proj.weight"] = experts.down[e]
    return targets


def _read_into(target: torch.Tensor, handle, file: Path, name: str, entry: dict[str, Any], start: int) -> None:
    begin, end = entry["data_offsets"]
    source = DTYPES.get(entry["dtype"])
    if source is None:
        raise llada2_config._error(f"{file}: {name}: dtype {entry['dtype']} is not a float dtype the model loads")
    direct = target.device.type == "cpu" and target.dtype == source and target.is_contiguous()
    buffer = target if direct else torch.empty(tuple(entry["shape"]), dtype=source)
    raw = buffer.view(-1).view(torch.uint8).numpy()
    if raw.nbytes != end - begin:
        raise llada2_config._error(f"{file}: {name}: {end - begin} bytes for shape {entry['shape']} {entry['dtype']}")
    handle.seek(start + begin)
    if handle.readinto(memoryview(raw)) != raw.nbytes:
        raise llada2_config._error(f"{file}: {name}: the file ends before the tensor's data (a truncated shard)")
    if not direct:
        target.copy_(buffer)
