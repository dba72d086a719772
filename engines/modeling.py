"""Model plumbing of the engines.

- block-causal 4-D additive attention masks (decoding with a block size or with explicit block
  ids);
- position ids for left-padded batches;
- loading model + tokenizer from a local folder, offline, through the Auto classes;
- device / dtype selection (CUDA + bf16 when available, else CPU float32).

What identifies a run (weight fingerprints, ``describe``, the model-free identity) is in
``runtime``, which imports no torch.

Conventions for block-diffusion models here: blocks are counted from position 0 of each row's
first real token (``block(p) = p // block_size``); logits at position ``i`` predict the token at
position ``i`` (no shift), as in SDAR and LLaDA.
"""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer



# ---------------------------------------------------------------------------------------------
# Masks and positions


def block_causal_mask(
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    block_size: int,
    dtype: torch.dtype,
    k_valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """The additive mask ``(batch, 1, q_len, k_len)``: 0 where a query may attend, finfo.min elsewhere.

    ``q_pos`` (batch, q_len) and ``k_pos`` (batch, k_len) are absolute positions (keys: the cache,
    then the input). A query attends a key iff ``block(key) <= block(query)`` and the key is valid
    (``k_valid``, False for left padding). A query whose row would be fully blocked (a padding
    query) attends the invalid keys instead, so no row is ever empty.
    """
    return block_mask(q_pos // block_size, k_pos // block_size, dtype, k_valid)


def block_mask(
    q_block: torch.Tensor,
    k_block: torch.Tensor,
    dtype: torch.dtype,
    k_valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """``block_causal_mask`` from explicit block ids instead of a fixed block size.

    ``q_block`` (batch, q_len) and ``k_block`` (batch, k_len) are any ids that increase with the
    position (blocks of mixed sizes: e.g. each block's start position). A query attends a key iff
    ``k_block <= q_block`` and the key is valid; a fully blocked query row attends the invalid keys.
    """
    allowed = k_block[:, None, :] <= q_block[:, :, None]
    if k_valid is not None:
        allowed = allowed & k_valid[:, None, :]
        empty = ~allowed.any(dim=-1, keepdim=True)
        allowed = allowed | (empty & ~k_valid[:, None, :])
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[:, None]


def left_pad_positions(valid: torch.Tensor) -> torch.Tensor:
    """Position ids for a left-padded batch: each row counts from 0 at its first real token."""
    return (valid.long().cumsum(dim=-1) - 1).clamp(min=0)


# ---------------------------------------------------------------------------------------------
# Devices and loading


def select_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def select_dtype(dtype: str | torch.dtype = "auto", device: torch.device | None = None) -> torch.dtype:
    """``auto``: bfloat16 on CUDA, float32 elsewhere; otherwise a torch dtype name."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device is not None and device.type == "cuda" else torch.float32
    value = getattr(torch, str(dtype), None)
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise ValueError(f"engine_args.dtype: expected auto, float32, float64, bfloat16 or float16, got {dtype!r}")
    return value


def load(path: str | Path, device: str = "auto", dtype: str | torch.dtype = "auto", trust_remote_code: bool = False):
    """Model (eval mode) and tokenizer from a local folder, offline; returns ``(model, tokenizer)``."""
    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"engine_args.model: expected a save_pretrained folder with config.json, got {str(folder)!r}")
    dev = select_device(device)
    dt = select_dtype(dtype, dev)
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(
        folder,
        local_files_only=True,
        trust_remote_code=trust_remote_code,
        dtype=dt,
        attn_implementation="sdpa",
    )
    return model.to(dev).eval(), tokenizer


def loaded_device(device: str | torch.device = "auto") -> torch.device:
    """The device a model's parameters land on when loaded with ``device`` (``cuda`` means the
    current CUDA device, as ``model.to("cuda")`` does), without loading one."""
    dev = select_device(device) if isinstance(device, str) else device
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def active_layer_params(model) -> float:
    """Parameters of the decoder layers that one token runs through: every parameter, except that
    a mixture-of-experts layer's experts count ``num_experts_per_tok / num_experts`` of theirs
    (the router and any shared expert count in full). For the FLOPs estimate (2 per parameter
    per token): counting every expert of an MoE model overstates it (4.3x on a tiny Qwen3-MoE)."""
    cfg = model.config.get_text_config()
    experts = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None)
    active = getattr(cfg, "num_experts_per_tok", None)
    share = active / experts if experts and active else 1.0
    total = 0.0
    for name, p in model.get_decoder().layers.named_parameters():
        routed = ".experts." in f".{name}" and "shared_expert" not in name
        total += p.numel() * (share if routed else 1.0)
    return total
