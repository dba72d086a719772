"""``schedule: fast_dllm``: Fast-dLLM's dual cache, for the full-attention families (LLaDA, Dream).

LLaDA and Dream were trained with full attention over the whole canvas, and their users serve
them with Fast-dLLM's dual cache. Per request, with P prompt tokens, G = ``max_new_tokens`` (a
multiple of the block B, checked model-free) and the canvas = the prompt then G positions:

- **Blocks are counted from the prompt's end**: block k = [P + kB, P + (k+1)B).
- **Refresh** (each block's first forward): the whole canvas (prompt, committed tokens, the MASK
  suffix) with full attention; the K/V of every position are kept. LLaDA commits in block k by
  the threshold rule; Dream commits the block's first position whatever its confidence (Dream's
  first-position rule), predicted, as every Dream position, from the one before it (shifted logits).
- **Block steps**: only block k is computed, with full attention over the kept K/V of every
  other position (the prefix, and the suffix as it was at the refresh) and its own fresh K/V;
  commit by the threshold rule until block k has no MASK. As in Fast-dLLM, a refresh is always
  followed by at least one block step, even when it completed the block (that step commits
  nothing): so forwards equal Fast-dLLM's count.
- **Threshold rule** (Fast-dLLM's): the block's most confident masked position, and every other
  one whose confidence is at least ``accept_threshold``. Confidences are softmax probabilities in
  float32, or in the model's dtype when wider (``BlockDiffusionEngine.predict``); MASK and ids beyond the tokenizer are never predicted (as in every engine here).
- A request ends once its answer is resolved up to an EOS, or its last block is done: later
  forwards could not change those tokens (Fast-dLLM decodes the whole length regardless).

Batched: rows are left-padded to one width (the longest prompt + G), so every row's block k
spans the same columns; padding is never attended and positions start at each row's first real
token. An engine step runs at most two forwards: the refresh of the rows starting a block and the
block step of the others. The kept K/V are per-layer tensors (rows, heads, width, head dim); a
block step attends them with the row's stale block columns blocked and the block's fresh K/V
appended by the forward, where Fast-dLLM overwrites them in place: the same keys and values,
attended in another order.

Counting: ``forwards`` = refreshes + block steps (``extra["refresh_forwards"]``: refreshes);
``tokens`` up to and including the first EOS; ``extra["blocks"]``: blocks spanned by the output,
counted from the prompt's end; ``extra["flops"]`` as in the other schedules.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch
from transformers import DynamicCache

from pytest_redline.contracts import Generation, Prompt
from pytest_redline.engines.common import encode

# families whose refresh commits the block's first position only (Dream's block generation)
FIRST_POSITION = frozenset({"dream"})


@dataclass
class DualRequest:
    """One prompt's state; the fields the engine's finishing, stop-string and counting helpers
    read are named as in ``block_diffusion.BlockRequest``."""

    prompt: Prompt
    tokens: list[int]  # the canvas: prompt, then max_new_tokens positions (MASK until committed)
    prompt_len: int
    limit: int  # prompt_len + max_new_tokens
    block: int = 0  # the block being decoded, counted from the prompt's end
    refresh: bool = True  # its next forward is the block's refresh
    forwards: int = 0
    flops: float = 0.0
    result: list[int] | None = None  # the output ids once the request has finished
    finish_reason: str | None = None
    extra: dict[str, float] = field(default_factory=dict)


def decode(engine, prompts: Sequence[Prompt], cfg, record: bool = False):
    """Decode ``prompts`` as one batch under ``schedule: fast_dllm``; returns ``(generations, trace)``."""
    requests = [_request(engine, p, cfg) for p in prompts]
    if not requests:
        return [], []
    width = max(r.prompt_len for r in requests) + cfg.max_new_tokens
    running = list(requests)
    kv: list[tuple[torch.Tensor, torch.Tensor]] = []
    trace: list[dict] = []
    step = 0
    while running:
        commits: dict[int, list[tuple[int, int]]] = {}
        refresh = [i for i, r in enumerate(running) if r.refresh]
        steps = [i for i, r in enumerate(running) if not r.refresh]
        if refresh:
            hidden, fresh = _refresh(engine, [running[i] for i in refresh], width)
            if not kv:  # the first step refreshes every row
                kv = fresh
            else:
                index = torch.tensor(refresh, device=engine.device)
                for (keys, values), (k, v) in zip(kv, fresh):
                    keys[index], values[index] = k, v
            commits.update(_commit(engine, [running[i] for i in refresh], refresh, hidden, width, cfg, True))
        if steps:
            hidden = _block_step(engine, running, steps, kv, width, cfg)
            commits.update(_commit(engine, [running[i] for i in steps], steps, hidden, width, cfg, False))
        keep = []
        for i, req in enumerate(running):
            was_refresh, block = req.refresh, req.block
            _advance(engine, req, cfg)
            if req.prompt.stop and req.result is None:
                engine.stop_at_string(req, req.prompt.stop, cfg)
            if record:
                trace.append({"step": step, "prompt": req.prompt.id, "block": block,
                              "forward": "refresh" if was_refresh else "block", "committed": commits[i],
                              "finished": req.finish_reason})
            if req.result is None:
                keep.append(i)
        if len(keep) < len(running):
            index = torch.tensor(keep, dtype=torch.long, device=engine.device)
            kv = [(k[index], v[index]) for k, v in kv]
            running = [running[i] for i in keep]
        step += 1
    return [_generation(engine, req, cfg) for req in requests], trace


def _request(engine, prompt: Prompt, cfg) -> DualRequest:
    ids = encode(engine.tokenizer, prompt, engine.name)
    limit = len(ids) + cfg.max_new_tokens
    tokens = ids + [engine.mask_id] * cfg.max_new_tokens
    return DualRequest(prompt=prompt, tokens=tokens, prompt_len=len(ids), limit=limit)


def _decoder(engine):
    """The bare transformer (no head): the shift of Dream's logits is applied here, per forward."""
    return engine.model.base_model


def _forward(engine, ids, pos, key_ok, cache):
    """One forward of ``ids`` at ``pos`` (rows, queries), attending the keys flagged in
    ``key_ok`` (rows, cached + queries) with full attention; returns the last hidden states."""
    mask = torch.zeros(key_ok.shape[0], 1, ids.shape[1], key_ok.shape[1], dtype=engine.dtype, device=engine.device)
    mask.masked_fill_(~key_ok[:, None, None, :], torch.finfo(engine.dtype).min)
    out = _decoder(engine)(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                           **{engine._cache_kwarg: cache})
    return out.last_hidden_state


def _refresh(engine, reqs: Sequence[DualRequest], width: int):
    """The whole canvas of each row, left-padded to ``width``; returns the hidden states and the
    K/V of every column, per layer."""
    pads = [width - r.limit for r in reqs]
    ids = torch.tensor([[engine.pad_id] * pad + r.tokens for pad, r in zip(pads, reqs)], device=engine.device)
    cols = torch.arange(width, device=engine.device)[None, :]
    pad = torch.tensor(pads, device=engine.device)[:, None]
    cache = DynamicCache(config=engine.model.config)
    hidden = _forward(engine, ids, (cols - pad).clamp(min=0), (cols >= pad).expand(len(reqs), -1), cache)
    layers = [layer for layer in cache.layers if getattr(layer, "is_initialized", True)]
    for req in reqs:
        engine.count_forward(req, req.limit, req.limit, 0)
        req.extra["refresh_forwards"] = req.extra.get("refresh_forwards", 0.0) + 1
    return hidden, [(layer.keys, layer.values) for layer in layers]


def _block_step(engine, running, rows: Sequence[int], kv, width: int, cfg):
    """Block k of each row in ``rows``, attending the kept K/V (its own stale block columns and
    padding blocked) and the block's fresh K/V."""
    B, G = cfg.block_size, cfg.max_new_tokens
    reqs = [running[i] for i in rows]
    if len(rows) == len(running):
        stored = kv
    else:
        index = torch.tensor(list(rows), dtype=torch.long, device=engine.device)
        stored = [(k[index], v[index]) for k, v in kv]
    cache = DynamicCache(ddp_cache_data=stored, config=engine.model.config)
    starts = [r.prompt_len + r.block * B for r in reqs]
    ids = torch.tensor([r.tokens[s : s + B] for r, s in zip(reqs, starts)], device=engine.device)
    pos = torch.tensor(starts, device=engine.device)[:, None] + torch.arange(B, device=engine.device)
    cols = torch.arange(width, device=engine.device)[None, :]
    pad = torch.tensor([width - r.limit for r in reqs], device=engine.device)[:, None]
    block = width - G + torch.tensor([r.block * B for r in reqs], device=engine.device)[:, None]
    kept = (cols >= pad) & ((cols < block) | (cols >= block + B))
    key_ok = torch.cat([kept, torch.ones(len(reqs), B, dtype=torch.bool, device=engine.device)], 1)
    hidden = _forward(engine, ids, pos, key_ok, cache)
    for req in reqs:
        engine.count_forward(req, B, req.limit, 0)
    return hidden


def _commit(engine, reqs, rows, hidden, width: int, cfg, refresh: bool) -> dict[int, list[tuple[int, int]]]:
    """Read each row's block and commit: the threshold rule, or at a Dream refresh the block's
    first position. Returns {row: [(position, token)]}."""
    B, shift = cfg.block_size, engine.checkpoint.logit_shift
    first_only = refresh and engine.checkpoint.family in FIRST_POSITION
    where, sources = [], []
    for n, req in enumerate(reqs):
        start = req.prompt_len + req.block * B
        masked = [p for p in range(start, start + B) if req.tokens[p] == engine.mask_id]
        for p in masked[:1] if first_only else masked:
            # a block step shifts within the block, as Fast-dLLM's Dream does: the block's first
            # position reads its own state (unreached under Dream's rule: the refresh commits it)
            column = p - shift + width - req.limit if refresh else max(p - shift - start, 0)
            where.append((n, p))
            sources.append((n, column))
    result: dict[int, list[tuple[int, int]]] = {row: [] for row in rows}
    if not where:
        return result
    n_idx, c_idx = zip(*sources)
    conf, tok = engine.predict(hidden[list(n_idx), list(c_idx)])
    read: dict[int, list[tuple[int, float, int]]] = {}
    for (n, p), c, t in zip(where, conf.tolist(), tok.tolist()):
        read.setdefault(n, []).append((p, c, t))
    for n, candidates in read.items():
        req = reqs[n]
        req.flops += engine._head_flops * len(candidates)
        best = max(candidates, key=lambda pct: pct[1])
        chosen = [best] if first_only else [best] + [x for x in candidates if x is not best and x[1] >= cfg.accept_threshold]
        for p, _, t in chosen:
            req.tokens[p] = t
        result[rows[n]] = [(p, t) for p, _, t in chosen]
    return result


def _advance(engine, req: DualRequest, cfg) -> None:
    """After a forward: the next forward's kind, the next block, and the end of the request."""
    B = cfg.block_size
    start = req.prompt_len + req.block * B
    if req.refresh:
        req.refresh = False  # a block step always follows a refresh, as in Fast-dLLM
    elif engine.mask_id not in req.tokens[start : start + B]:
        req.block += 1
        req.refresh = True
    answer = req.tokens[req.prompt_len : req.limit]
    end = answer.index(engine.mask_id) if engine.mask_id in answer else len(answer)
    if engine.eos_ids.intersection(answer[:end]) or req.block * B == cfg.max_new_tokens:
        engine.finish(req, answer[:end])


def _generation(engine, req: DualRequest, cfg) -> Generation:
    out = req.result or []
    return Generation(
        text=engine.output_text(req, req.prompt),
        tokens=len(out),
        forwards=req.forwards,
        extra={"flops": req.flops, "blocks": float(-(-max(len(out), 1) // cfg.block_size)), **req.extra},
        finish_reason=req.finish_reason,
    )
