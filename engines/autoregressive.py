"""Batched autoregressive decoding over a KV cache that is rolled back per request.

The speculative and the quantized engines decode a chunk of prompts as one batch. Requests in a
batch hold different numbers of tokens, and after a speculative round each keeps a different
number of the tokens it fed, so the batch is stored as left-padded rows that may contain holes:

- :class:`RowCache` is one model's cache over the rows. ``forward`` feeds each row its own tokens
  (left-padded to a common width; padding slots are invalid keys) and returns the last logits.
  ``retain`` rolls the cache back: each row keeps the longest prefix of its cached tokens that
  agrees with the row's accepted sequence, every other column is dropped (a rejected token's
  K/V never stays), and finished rows leave the batch. With ``recompute=True`` nothing is
  cached: every forward recomputes the row from its first token (the reference for tests).
- Attention uses an explicit 4-D additive mask: a query attends the valid keys at positions up to
  its own (``modeling.block_causal_mask`` with block size 1). Position ids count from 0 at each
  row's first token, as in training (no BOS).
- :func:`greedy` is plain greedy decoding on a :class:`RowCache`; :class:`Request` keeps one
  prompt's tokens and stops at the first EOS or at ``max_new_tokens``.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import torch
from transformers import DynamicCache

from pytest_redline.engines import modeling
from pytest_redline.suites.base import Prompt

AR_TARGET = modeling.EMBEDDED_MODEL.parent / "ar-target"  # the embedded autoregressive models
AR_DRAFT = modeling.EMBEDDED_MODEL.parent / "ar-draft"


def set_threads(threads: int | None, engine: str) -> None:
    """``engine_args.threads``: torch's intra-op threads for the process (None leaves them alone).

    Small models decode fastest on one thread: on a shared 2-core CPU the default two threads
    cost 7x the CPU time of one (measured with the embedded ar-target), spent waiting in barriers.
    """
    if threads is None:
        return
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"{engine}: engine_args.threads: expected int >= 1 or null, got {threads!r}")
    torch.set_num_threads(threads)


def encode(tokenizer, prompt: Prompt, engine: str) -> list[int]:
    """The prompt's token ids: its chat messages through the chat template when the tokenizer has one."""
    if getattr(tokenizer, "chat_template", None) and prompt.messages:
        ids = tokenizer.apply_chat_template(list(prompt.messages), add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if isinstance(ids, Mapping) else ids
    else:
        ids = tokenizer(prompt.text).input_ids
    if not ids:
        raise ValueError(f"{engine}: prompt {prompt.id!r} encodes to no tokens")
    return list(ids)


def eos_ids(model, tokenizer, where: str) -> frozenset[int]:
    """The tokenizer's EOS and the generation config's EOS ids."""
    ids = {tokenizer.eos_token_id}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos])
    ids.discard(None)
    if not ids:
        raise ValueError(f"{where}: no EOS token id in the tokenizer or generation config")
    return frozenset(int(i) for i in ids)


@dataclass
class Request:
    """One prompt's tokens; ``output`` is what follows the prompt, cut after the first EOS."""

    tokens: list[int]
    prompt_len: int
    limit: int  # prompt_len + max_new_tokens
    eos: frozenset[int]
    done: bool = False
    counts: dict[str, int] = field(default_factory=dict)

    def append(self, new: Sequence[int]) -> int:
        """Append tokens up to the first EOS and the length limit; returns how many were appended."""
        taken = 0
        for token in new[: self.limit - len(self.tokens)]:
            self.tokens.append(int(token))
            taken += 1
            if token in self.eos:
                self.done = True
                break
        self.done = self.done or len(self.tokens) >= self.limit
        return taken

    def count(self, key: str, value: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + value

    @property
    def output(self) -> list[int]:
        return self.tokens[self.prompt_len :]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class RowCache:
    """One model's KV cache over a batch of left-padded rows, rolled back per row."""

    def __init__(self, model, rows: int, pad_id: int, recompute: bool = False):
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


@torch.no_grad()
def greedy(model, requests: Sequence[Request], pad_id: int, recompute: bool = False) -> None:
    """Greedy decoding of ``requests`` as one batch, in place; counts ``forwards`` per request.

    The first forward is the prefill (it yields the first token); each later one feeds the last
    token. Finished requests leave the batch.
    """
    running = [r for r in requests if not r.done]
    cache = RowCache(model, len(running), pad_id, recompute)
    while running:
        logits = cache.forward([r.tokens[cache.cached(i) :] for i, r in enumerate(running)], keep=1)
        for req, token in zip(running, logits[:, -1].argmax(-1).tolist()):
            req.append([token])
            req.count("forwards")
        keep = [i for i, r in enumerate(running) if not r.done]
        cache.retain([r.tokens for r in running], keep)
        running = [running[i] for i in keep]
