"""The speculative and quantized engines' KV cache as it was before the preallocated one
(``engines.autoregressive.RowCache``): every ``retain`` re-gathers the whole K/V of every layer
into a compact left-padded layout, and every forward appends by concatenation (DynamicCache).
Kept, unchanged but for its name and an ignored ``capacity``, as the reference that the faster
cache must reproduce token for token (tests/engines/test_speculative.py) and as the "before" row of
benchmarks/bench_overhead.py.
"""
from __future__ import annotations

import inspect
from typing import Sequence

import torch
from transformers import DynamicCache

from pytest_redline.engines import modeling
from pytest_redline.engines.autoregressive import common_prefix


class CompactRowCache:
    """One model's KV cache over a batch of left-padded rows, rolled back per row."""

    def __init__(self, model, rows: int, pad_id: int, recompute: bool = False, capacity: int = 0):
        self.model, self.pad_id, self.recompute = model, pad_id, recompute
        self.device = model.get_input_embeddings().weight.device
        self.dtype = model.get_input_embeddings().weight.dtype  # embeddings are never quantized
        forward_args = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in forward_args else "past_key_values"  # transformers 5.x vs older
        self.tokens: list[list[int]] = [[] for _ in range(rows)]  # per row, the tokens whose K/V are cached
        self._reset()

    def _reset(self) -> None:
        rows = len(self.tokens)
        self.cache = DynamicCache(config=self.model.config)
        self.k_pos = torch.zeros(rows, 0, dtype=torch.long, device=self.device)
        self.k_valid = torch.zeros(rows, 0, dtype=torch.bool, device=self.device)

    def cached(self, row: int) -> int:
        return len(self.tokens[row])

    def forward(self, feeds: Sequence[Sequence[int]], keep: int) -> torch.Tensor:
        """Feed row ``r`` the tokens ``feeds[r]`` (at least ``keep`` each); their last ``keep`` logits."""
        feeds = feeds.tolist() if isinstance(feeds, torch.Tensor) else feeds  # the engine feeds equal widths as a tensor
        if self.recompute:
            starts = [0] * len(feeds)
            feeds = [self.tokens[r] + list(f) for r, f in enumerate(feeds)]
            self._reset()
        else:
            starts = [len(t) for t in self.tokens]
        width = max(len(f) for f in feeds)
        if min(len(f) for f in feeds) < keep:
            raise ValueError(f"{min(len(f) for f in feeds)} tokens fed to a row, {keep} logits asked for")
        pads = [width - len(f) for f in feeds]
        ids = torch.tensor([[self.pad_id] * pad + list(f) for pad, f in zip(pads, feeds)], dtype=torch.long, device=self.device)
        q_pos = torch.tensor([[0] * pad + list(range(start, start + len(f))) for pad, start, f in zip(pads, starts, feeds)],
                             dtype=torch.long, device=self.device)
        q_valid = torch.arange(width, device=self.device)[None, :] >= torch.tensor(pads, device=self.device)[:, None]
        k_pos, k_valid = torch.cat([self.k_pos, q_pos], 1), torch.cat([self.k_valid, q_valid], 1)
        mask = modeling.block_causal_mask(q_pos, k_pos, 1, self.dtype, k_valid)
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=q_pos,
            **{self._cache_kwarg: self.cache},
            use_cache=True,
            logits_to_keep=keep,
        )
        self.k_pos, self.k_valid = k_pos, k_valid
        self.tokens = [list(f) if self.recompute else t + list(f) for t, f in zip(self.tokens, feeds)]
        return out.logits[:, -keep:]

    def retain(self, sequences: Sequence[Sequence[int]], rows: Sequence[int]) -> None:
        """Keep rows ``rows`` (in that order); each keeps its cached tokens that prefix ``sequences[row]``."""
        counts = [common_prefix(self.tokens[r], sequences[r]) for r in rows]
        self.tokens = [self.tokens[r][:c] for r, c in zip(rows, counts)]
        if self.recompute:
            return
        index = torch.tensor(list(rows), dtype=torch.long, device=self.device)
        valid = self.k_valid[index]
        limit = torch.tensor(counts, dtype=torch.long, device=self.device)
        keep = valid & (valid.long().cumsum(1) <= limit[:, None])
        width = max(counts, default=0)
        # left-pad each row's kept columns: invalid columns first, then the kept ones in order
        order = torch.argsort(keep.int(), dim=1, stable=True)[:, keep.shape[1] - width :]
        for layer in self.cache.layers:
            if getattr(layer, "keys", None) is None:
                continue
            gather = order[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1])
            layer.keys = layer.keys[index].gather(2, gather)
            layer.values = layer.values[index].gather(2, gather)
        self.k_pos = self.k_pos[index].gather(1, order)
        self.k_valid = keep.gather(1, order)
