"""LLaDA2's mixture-of-experts transformer (BailingMoeV2: LLaDA2.0 and LLaDA2.1), written from the
architecture; no remote code is imported or run.

The arithmetic follows the published modeling code step for step, so that a float64 run equals
it: RMS norms computed in float32; rotary cos/sin from float32 frequencies over
``head_dim * partial_rotary_factor`` dimensions (the rest of each head passes through); the router
in float32 whatever the weights' dtype, sigmoid scores, ``expert_bias`` added for the choice only,
group-limited top-k (the ``topk_group`` groups with the largest sum of their two best scores),
the chosen scores normalised when top-k > 1 and scaled by ``routed_scaling_factor``; the experts'
outputs weighted and summed in float32; logits returned in float32.

The mixture is batched by expert: the (token, slot) pairs are sorted by expert once and each
active expert runs one gate-and-up matmul (its gate and up projections are stacked) and one down
matmul over its tokens (inference only: the parameters are loaded without gradients). The
decoder takes the engines' additive 4-D block masks and a ``DynamicCache`` (``cache``), as the
stock transformers decoders the engines drive; grouped-query attention runs in SDPA
(``enable_gqa``), without copies of the key and value heads.

``expert_bias`` is a buffer kept in float32 (float64 in a float64 model), so a bf16 load does not
round it. Loading from a published folder is in ``llada2_load``; the config in ``llada2_config``.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationConfig, PretrainedConfig


class LLaDA2Config(PretrainedConfig):
    """The fields of a published config.json the model reads (``llada2_config.model_config``
    fills it after the model-free checks). No sliding window: the cache keeps every position."""

    model_type = "llada2_moe_native"

    def __init__(self, **fields):
        fields.setdefault("sliding_window", None)
        super().__init__(**fields)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class Rotary:
    """Cos and sin of the default RoPE over the first ``dim`` dimensions of a head (not a module:
    the frequencies are recomputed, never loaded)."""

    def __init__(self, dim: int, theta: float):
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim))

    def __call__(self, position_ids: torch.Tensor, dtype: torch.dtype):
        inv = self.inv_freq.to(position_ids.device)[None, :, None].expand(position_ids.shape[0], -1, 1)
        freqs = (inv @ position_ids[:, None, :].float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on the first ``cos.shape[-1]`` dimensions of each head; the rest pass through."""
    cos, sin = cos[:, None], sin[:, None]
    dim = cos.shape[-1]
    rot, rest = x[..., :dim], x[..., dim:]
    return torch.cat([rot * cos + _rotate_half(rot) * sin, rest], dim=-1)


class Attention(nn.Module):
    """Fused QKV, RMS QK-norm, partial rotary, grouped-query attention under an additive 4-D mask."""

    def __init__(self, cfg: LLaDA2Config, layer: int):
        super().__init__()
        self.layer = layer
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.query_key_value = nn.Linear(cfg.hidden_size, (self.heads + 2 * self.kv_heads) * self.head_dim, bias=cfg.use_qkv_bias)
        if cfg.use_qk_norm:
            self.query_layernorm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.key_layernorm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.qk_norm = cfg.use_qk_norm
        self.dense = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=cfg.use_bias)

    def forward(self, x, mask, cos, sin, cache):
        batch, length, _ = x.shape
        qkv = self.query_key_value(x).view(batch, length, self.heads + 2 * self.kv_heads, self.head_dim)
        q, k, v = (t.transpose(1, 2) for t in qkv.split([self.heads, self.kv_heads, self.kv_heads], dim=-2))
        if self.qk_norm:
            q, k = self.query_layernorm(q), self.key_layernorm(k)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, self.layer)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.head_dim**-0.5,
                                             enable_gqa=self.heads != self.kv_heads)
        return self.dense(out.transpose(1, 2).reshape(batch, length, -1))


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Router(nn.Module):
    """Sigmoid scores in float32; the choice adds ``expert_bias`` and is limited to the best groups."""

    def __init__(self, cfg: LLaDA2Config):
        super().__init__()
        self.top_k, self.experts = cfg.num_experts_per_tok, cfg.num_experts
        self.n_group, self.topk_group, self.scale = cfg.n_group, cfg.topk_group, cfg.routed_scaling_factor
        self.weight = nn.Parameter(torch.empty(cfg.num_experts, cfg.hidden_size))
        self.register_buffer("expert_bias", torch.zeros(cfg.num_experts, dtype=torch.float32))

    def _apply(self, fn, recurse=True):
        # a dtype cast (model.to(bfloat16)) must not round the bias: float32 (float64 in float64)
        bias = self.expert_bias
        super()._apply(fn, recurse)
        kept = torch.float64 if self.weight.dtype == torch.float64 else torch.float32
        if bias.is_meta:
            self.expert_bias = torch.empty(bias.shape, dtype=kept, device=self.weight.device)
        else:
            self.expert_bias = bias.to(device=self.weight.device, dtype=kept)
        return self

    def forward(self, x: torch.Tensor):
        """``(indices (T, k), weights (T, k) float32, logits (T, E) float32)`` for tokens ``x`` (T, H)."""
        logits = F.linear(x.to(torch.float32), self.weight.to(torch.float32))
        scores = torch.sigmoid(logits)
        choice = scores + self.expert_bias
        tokens = choice.shape[0]
        groups = choice.view(tokens, self.n_group, -1).topk(2, dim=-1)[0].sum(dim=-1)
        best = torch.topk(groups, k=self.topk_group, dim=-1, sorted=False)[1]
        keep = torch.zeros_like(groups).scatter_(1, best, 1).bool()
        keep = keep[:, :, None].expand(tokens, self.n_group, self.experts // self.n_group).reshape(tokens, -1)
        index = torch.topk(choice.masked_fill(~keep, float("-inf")), k=self.top_k, dim=-1)[1]
        weights = torch.gather(scores, 1, index).to(logits.dtype)
        if self.top_k > 1:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return index, weights * self.scale, logits


class Experts(nn.Module):
    """The routed experts, stacked: ``gate_up`` (E, 2I, H) holds each expert's gate then up
    projection, ``down`` (E, H, I). The published per-expert names load into their slices."""

    def __init__(self, count: int, hidden: int, intermediate: int):
        super().__init__()
        self.intermediate = intermediate
        self.gate_up = nn.Parameter(torch.empty(count, 2 * intermediate, hidden))
        self.down = nn.Parameter(torch.empty(count, hidden, intermediate))

    def forward(self, x: torch.Tensor, index: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Sum over each token's chosen experts of weight x expert(token): one pair of matmuls per
        active expert over its tokens, sorted by expert."""
        tokens, k = index.shape
        flat = index.reshape(-1)
        order = flat.argsort()
        counts = torch.bincount(flat, minlength=self.gate_up.shape[0]).tolist()
        rows = x[order // k]
        out = torch.empty_like(rows)
        start, inner = 0, self.intermediate
        for expert, count in enumerate(counts):
            if count == 0:
                continue
            h = torch.mm(rows[start : start + count], self.gate_up[expert].t())
            torch.mm(F.silu(h[:, :inner]).mul_(h[:, inner:]), self.down[expert].t(), out=out[start : start + count])
            start += count
        slots = torch.empty_like(out)
        slots[order] = out
        return (slots.view(tokens, k, -1).to(weights.dtype) * weights[..., None]).sum(dim=1).to(x.dtype)


class SparseMoe(nn.Module):
    def __init__(self, cfg: LLaDA2Config):
        super().__init__()
        self.gate = Router(cfg)
        self.experts = Experts(cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size)
        shared = cfg.num_shared_experts or 0
        self.shared_experts = MLP(cfg.hidden_size, cfg.moe_intermediate_size * shared) if shared else None

    def forward(self, x: torch.Tensor, routes: list | None = None) -> torch.Tensor:
        batch, length, size = x.shape
        flat = x.reshape(-1, size)
        index, weights, logits = self.gate(flat)
        if routes is not None:
            routes.append((index.view(batch, length, -1), logits.view(batch, length, -1)))
        y = self.experts(flat, index, weights).view(batch, length, size)
        return y + self.shared_experts(x) if self.shared_experts is not None else y


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LLaDA2Config, layer: int):
        super().__init__()
        self.attention = Attention(cfg, layer)
        moe = cfg.num_experts is not None and layer >= cfg.first_k_dense_replace
        self.mlp = SparseMoe(cfg) if moe else MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, mask, cos, sin, cache, routes):
        x = x + self.attention(self.input_layernorm(x), mask, cos, sin, cache)
        h = self.post_attention_layernorm(x)
        return x + (self.mlp(h, routes) if isinstance(self.mlp, SparseMoe) else self.mlp(h))


class LLaDA2Decoder(nn.Module):
    """Embeddings, layers and the final norm (the published ``model.*`` tree)."""

    def __init__(self, cfg: LLaDA2Config):
        super().__init__()
        self.config = cfg
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = Rotary(int(cfg.head_dim * cfg.partial_rotary_factor), cfg.rope_theta)

    def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None, use_cache=True, routes=None, **_):
        """``attention_mask``: additive (or boolean) ``(batch, 1, queries, keys)`` over the cache
        then the input; None attends every key. ``routes``: a list that receives each MoE layer's
        ``(chosen experts, router logits)``."""
        x = self.word_embeddings(input_ids)
        if position_ids is None:
            seen = cache.get_seq_length() if cache is not None else 0
            position_ids = torch.arange(seen, seen + input_ids.shape[1], device=x.device)[None].expand(input_ids.shape[0], -1)
        if attention_mask is not None and attention_mask.dtype == torch.bool:
            attention_mask = torch.zeros(attention_mask.shape, dtype=x.dtype, device=x.device).masked_fill_(
                ~attention_mask, torch.finfo(x.dtype).min)
        elif attention_mask is not None:
            attention_mask = attention_mask.to(x.dtype)
        cos, sin = self.rotary(position_ids, x.dtype)
        for layer in self.layers:
            x = layer(x, attention_mask, cos, sin, cache if use_cache else None, routes)
        return SimpleNamespace(last_hidden_state=self.norm(x), past_key_values=cache)


class LLaDA2MoeLM(nn.Module):
    """The published ``LLaDA2MoeModelLM`` tree (``model``, ``lm_head``); float32 logits."""

    def __init__(self, cfg: LLaDA2Config, generation_config: GenerationConfig | None = None):
        super().__init__()
        self.config = cfg
        self.generation_config = generation_config or GenerationConfig()
        self.model = LLaDA2Decoder(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.word_embeddings.weight

    def get_decoder(self) -> LLaDA2Decoder:
        return self.model

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.word_embeddings

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None, use_cache=False, routes=None, **_):
        out = self.model(input_ids, attention_mask, position_ids, cache, use_cache, routes)
        return SimpleNamespace(logits=self.lm_head(out.last_hidden_state).float(), past_key_values=cache)
