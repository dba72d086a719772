"""A fresh model to train: the small stock Llama of the shipped checkpoints, and the two-copy
attention mask of the block-diffusion objective.

The engines never build a model (they load ``save_pretrained`` folders through the Auto classes,
``pytest_redline.engines.modeling.load``); only training does, so this lives here.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import LlamaConfig, LlamaForCausalLM


@dataclass
class ModelConfig:
    vocab_size: int = 96  # the tokenizer's 83 ids, padded to a multiple of 32
    hidden_size: int = 128
    num_layers: int = 6
    num_heads: int = 4
    intermediate_size: int = 512
    max_positions: int = 256
    rope_theta: float = 10000.0


def build_model(cfg: ModelConfig, tokenizer) -> LlamaForCausalLM:
    """A fresh stock Llama whose config records the tokenizer's special ids."""
    config = LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_positions,
        rope_theta=cfg.rope_theta,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        mask_token_id=tokenizer.mask_token_id,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config)


def two_copy_mask(length: int, block_size: int, dtype: torch.dtype) -> torch.Tensor:
    """The training mask over ``[noised (L) | clean (L)]``, shape ``(1, 1, 2L, 2L)``.

    Noised block k attends itself (bidirectionally) and the clean blocks before k; clean tokens
    attend clean tokens block-causally. Per block this equals "prefix clean, block noised, suffix
    absent" (the BD3-LM / SDAR objective), for every block of the sequence at once. Blocks are
    counted as the engines count them (``block(p) = p // block_size``, see
    ``pytest_redline.engines.modeling``).
    """
    block = torch.arange(length) // block_size
    noised_to_noised = block[:, None] == block[None, :]
    noised_to_clean = block[None, :] < block[:, None]
    clean_to_clean = block[None, :] <= block[:, None]
    top = torch.cat([noised_to_noised, noised_to_clean], dim=1)
    bottom = torch.cat([torch.zeros_like(clean_to_clean), clean_to_clean], dim=1)
    allowed = torch.cat([top, bottom], dim=0)
    mask = torch.zeros(allowed.shape, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]
