"""FLOPs count the parameters a token runs through: on a mixture-of-experts model, the active experts only."""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from pytest_redline.engines.modeling import active_layer_params

pytestmark = pytest.mark.slow  # builds Llama and Qwen3-MoE models: importing transformers' model classes costs ~5 s of CPU


def test_moe_counts_the_active_experts_and_a_dense_model_every_parameter() -> None:
    torch.manual_seed(0)
    moe = Qwen3MoeForCausalLM(Qwen3MoeConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_experts=8, num_experts_per_tok=2))
    layers = dict(moe.model.layers.named_parameters())
    experts = sum(p.numel() for n, p in layers.items() if ".mlp.experts." in f".{n}")
    everything = sum(p.numel() for p in layers.values())
    # by hand: per layer, experts 8 x (32x32 + 32x16) = 12,288, of which 2 of 8 run; the rest in full
    assert experts == 2 * 8 * (32 * 32 + 32 * 16)
    assert active_layer_params(moe) == everything - experts + experts * 2 / 8
    assert everything / active_layer_params(moe) > 2  # what counting every expert overstated
    dense = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=2))
    assert active_layer_params(dense) == sum(p.numel() for p in dense.model.layers.parameters())
