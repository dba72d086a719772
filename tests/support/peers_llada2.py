"""Test shims that run the published LLaDA2.0 / LLaDA2.1 modeling code (../shared/reference/peers/llada2,
never copied into the project) on transformers 5.x.

The published code imports helpers that transformers 5.x removed; they are supplied here, only
while the peer file is imported, and the peer files are never edited:

- ``transformers.modeling_attn_mask_utils``: the two 4-D causal mask helpers. Every call here
  passes a 4-D mask, which they return unchanged (a 2-D mask or none is refused).
- ``ROPE_INIT_FUNCTIONS["default"]``: transformers 4.x's default RoPE over the rotary part of a
  head: ``inv_freq = 1 / theta^(arange(0, d, 2) / d)``, ``d = head_dim * partial_rotary_factor``,
  attention scaling 1.0.
- ``transformers.utils.import_utils.is_torch_fx_available`` (LLaDA2.0's file only, for its FX
  wrapping of the mask helper): False, so nothing is wrapped.

:func:`peer_forward_shim` adapts the official ``generate`` to a float64 run (its block mask is
built in bf16: cast to the model's dtype) and bans MASK and the embedding's padding rows (our
engines never predict them; the peer would).
"""
from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import peers

VERSIONS = {"2.0": "llada2_moe", "2.1": "llada21_moe"}


def _mask_utils() -> types.ModuleType:
    module = types.ModuleType("transformers.modeling_attn_mask_utils")

    def passthrough(attention_mask, input_shape, inputs_embeds, past_key_values_length, *args, **kwargs):
        if attention_mask is None or attention_mask.dim() != 4:
            raise NotImplementedError("test shim: only a 4-D mask passes through")
        return attention_mask.to(inputs_embeds.dtype)

    module._prepare_4d_causal_attention_mask = passthrough
    module._prepare_4d_causal_attention_mask_for_sdpa = passthrough
    return module


def default_rope(config, device=None, seq_len=None, **kwargs):
    """transformers 4.x's default RoPE over ``head_dim * partial_rotary_factor`` dimensions."""
    import torch

    dim = int(config.head_dim * getattr(config, "partial_rotary_factor", 1.0))
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim))
    return inv_freq, 1.0


def peer_modules(version: str):
    """``(configuration, modeling)`` modules of the published LLaDA2.0 or LLaDA2.1 code."""
    kind = VERSIONS[version]
    prefix = "llada2" if version == "2.0" else "llada21"
    package = f"peer_{prefix}"
    if f"{package}.modeling_{kind}" in sys.modules:
        return sys.modules[f"{package}.configuration_{kind}"], sys.modules[f"{package}.modeling_{kind}"]
    folder = peers.need_peers(f"the published LLaDA{version} modeling code and its official generate") / "llada2"
    sys.modules[package] = types.ModuleType(package)
    sys.modules[package].__path__ = []
    loaded = []
    import transformers.utils.import_utils as import_utils

    saved = sys.modules.get("transformers.modeling_attn_mask_utils")
    sys.modules["transformers.modeling_attn_mask_utils"] = _mask_utils()
    had_fx = hasattr(import_utils, "is_torch_fx_available")
    if not had_fx:
        import_utils.is_torch_fx_available = lambda: False
    try:
        for part in ("configuration", "modeling"):
            name = f"{package}.{part}_{kind}"
            spec = importlib.util.spec_from_file_location(name, folder / f"{prefix}_{part}_{kind}.py")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
            loaded.append(module)
    finally:
        if not had_fx:
            del import_utils.is_torch_fx_available
        if saved is None:
            del sys.modules["transformers.modeling_attn_mask_utils"]
        else:
            sys.modules["transformers.modeling_attn_mask_utils"] = saved
    return tuple(loaded)


def peer_model(folder: Path, version: str, dtype):
    """The published ``LLaDA2MoeModelLM`` (SDPA attention) holding a tiny folder's weights, strictly."""
    from safetensors.torch import load_file

    configuration, modeling = peer_modules(version)
    raw = json.loads((folder / "config.json").read_text())
    config = configuration.LLaDA2MoeConfig(**{k: v for k, v in raw.items() if k not in ("auto_map", "architectures", "model_type")})
    config._attn_implementation = "sdpa"
    modeling.ROPE_INIT_FUNCTIONS["default"] = default_rope
    try:
        model = modeling.LLaDA2MoeModelLM(config)
    finally:
        del modeling.ROPE_INIT_FUNCTIONS["default"]
    state = {}
    for shard in sorted(folder.glob("*.safetensors")):
        state.update(load_file(shard))
    model.load_state_dict(state, strict=True)
    return model.to(dtype).eval()


def peer_forward_shim(monkeypatch, model, banned) -> None:
    """``model.forward`` casts a 4-D mask to the model's dtype (generate builds it in bf16) and
    returns -inf logits at the banned ids."""
    forward = model.forward
    dtype = model.lm_head.weight.dtype

    def shimmed(*args, attention_mask=None, **kwargs):
        if attention_mask is not None:
            attention_mask = attention_mask.to(dtype)
        out = forward(*args, attention_mask=attention_mask, **kwargs)
        out.logits = out.logits.masked_fill(banned.to(out.logits.device), float("-inf"))
        return out

    monkeypatch.setattr(model, "forward", shimmed)
