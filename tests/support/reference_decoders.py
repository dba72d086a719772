"""Uncached reference decoders, written from ../shared/reference/engines.md's rules (not from the
engines): every forward recomputes the whole prefix under the block-causal mask, so a cached
engine that agrees with them token for token and forward for forward has an exact cache and
the reference's rules. Run them in float64.

- ``single_block``: one block at a time, threshold with top-1 fallback (LLaDA2.0 with k = 1, and
  the multi-block engine's ``schedule: eager`` at ``buffer_size: 1``);
- ``diffulex``: Diffulex ``multi_bd`` (engines.md section 5) with explicit block statuses and
  buffer slots;
- ``llada21``: LLaDA2.1 with T2T editing and the post-step cap (engines.md section 3).

Each returns ``(output ids up to and including the first EOS, forwards)``.
"""
from __future__ import annotations

import torch

from pytest_redline.engines.modeling import block_causal_mask


def predict(engine, tokens: list[int], block_size: int):
    """Float32 top-1 probabilities and tokens at every position of one uncached forward over
    ``tokens`` (block-causal from position 0; MASK and ids beyond the tokenizer never predicted)."""
    model = engine.model
    pos = torch.arange(len(tokens))[None]
    mask = block_causal_mask(pos, pos, block_size, model.dtype)
    logits = model(input_ids=torch.tensor([tokens]), attention_mask=mask, position_ids=pos).logits[0].float()
    logits[:, engine.mask_id] = float("-inf")
    logits[:, len(engine.tokenizer) :] = float("-inf")
    conf, tok = logits.softmax(-1).max(-1)
    return conf.tolist(), tok.tolist()


def _output(engine, answer: list[int]) -> list[int]:
    for i, t in enumerate(answer):
        if t in engine.eos_ids:
            return answer[: i + 1]
    return answer


def _threshold(masked, conf, accept, fallback=True):
    chosen = [p for p in masked if conf[p] > accept]
    if not chosen and fallback and masked:
        chosen = [max(masked, key=lambda p: conf[p])]
    return chosen


def single_block(engine, ids: list[int], block_size: int, accept: float, max_new: int, complete_block: bool = True):
    """One block at a time, whole prefix recomputed every step, threshold with top-1 fallback.
    ``complete_block``: LLaDA2.0 (an EOS ends decoding after its block); else decoding ends as
    soon as an EOS is committed with every earlier position resolved, or every position up to
    the limit is (``schedule: eager``)."""
    mask_id, B = engine.mask_id, block_size
    start, limit = len(ids), len(ids) + max_new
    tokens = ids + [mask_id] * (-(-limit // B) * B - len(ids))
    forwards = 0
    for block in range(start // B, -(-limit // B)):
        lo, hi = block * B, (block + 1) * B
        while mask_id in tokens[lo:hi]:
            answer = tokens[start:limit]
            first_mask = answer.index(mask_id) if mask_id in answer else len(answer)
            if not complete_block and (first_mask == len(answer) or engine.eos_ids.intersection(answer[:first_mask])):
                return _output(engine, answer), forwards
            conf, tok = predict(engine, tokens[:hi], B)
            forwards += 1
            for p in _threshold([p for p in range(lo, hi) if tokens[p] == mask_id], conf, accept):
                tokens[p] = tok[p]
        if engine.eos_ids.intersection(tokens[start:hi]):
            break
    return _output(engine, tokens[start:limit]), forwards


def diffulex(engine, ids: list[int], block_size: int, buffer_size: int, accept: float, semi: float, add: float, max_new: int):
    """Diffulex ``multi_bd``: statuses DUMMY -> ACTIVE -> TO_CACHE -> IN_CACHE, a fixed buffer of
    slots, admission at ``add``, the D2F commit rule, in-order cache entry; one forward per step."""
    mask_id, B = engine.mask_id, block_size
    P, limit = len(ids), len(ids) + max_new
    x = ids + [mask_id] * ((-(-limit // B) + buffer_size + 2) * B - P)
    status = {b: "TO_CACHE" for b in range(P // B)}  # the prompt's complete blocks, stored by the prefill
    buffer = []
    if P % B:
        status[P // B] = "ACTIVE"  # the padded tail block
        buffer.append(P // B)
    while len(buffer) < buffer_size:
        b = P // B + len(buffer)
        status[b] = "DUMMY"
        buffer.append(b)

    def progress(b):
        return 1.0 - x[b * B : (b + 1) * B].count(mask_id) / B

    def valid():
        return [b for b in buffer if status[b] != "DUMMY"]

    def eos_committed():
        end = (valid()[-1] + 1) * B if valid() else buffer[0] * B
        return bool(engine.eos_ids.intersection(x[P:end]))

    forwards, prefill = 0, True
    while True:
        slot = next((b for b in buffer if status[b] == "DUMMY"), None)
        if slot is not None and slot * B < limit and not eos_committed():
            newest = valid()[-1] if valid() else None
            if newest is not None and progress(newest) >= add:
                status[slot] = "ACTIVE"
            elif newest is None and all(status[b] == "IN_CACHE" for b in range(slot)):
                status[slot] = "ACTIVE"
        end = ((valid()[-1] + 1) * B if valid() else P) if prefill else (buffer[-1] + 1) * B
        conf, tok = predict(engine, x[:end], B)
        forwards += 1
        start_progress = {b: progress(b) for b in buffer}
        writes = []
        for b in buffer:
            masked = [p for p in range(b * B, (b + 1) * B) if x[p] == mask_id]
            if status[b] != "ACTIVE" or not masked:
                continue
            pred_semi = b == 0 or start_progress.get(b - 1, 1.0) >= semi
            writes += [(p, tok[p]) for p in _threshold(masked, conf, accept, fallback=pred_semi)]
        for p, t in writes:
            x[p] = t
        if prefill:
            for b in range(P // B):
                status[b] = "IN_CACHE"
            prefill = False
        i = 0
        while i < len(buffer):
            b = buffer[i]
            if status[b] == "ACTIVE" and progress(b) == 1.0 and status.get(b - 1, "IN_CACHE") in ("TO_CACHE", "IN_CACHE"):
                status[b] = "TO_CACHE"
                i += 1
            elif status[b] == "TO_CACHE":
                status[b] = "IN_CACHE"
                buffer.pop(i)
                buffer.append(max(buffer + [b]) + 1)
                status[buffer[-1]] = "DUMMY"
            else:
                i += 1
        nxt = valid()[-1] + 1 if valid() else buffer[0]
        closed = eos_committed() or nxt * B >= limit
        if closed and not valid():
            return _output(engine, x[P:limit]), forwards


def llada21(engine, ids: list[int], block_size: int, accept: float, edit: float, max_post_steps: int, max_new: int):
    """LLaDA2.1: per block, M2T threshold commits with top-1 fallback plus T2T edits of filled
    non-prompt positions (top-1 differs, probability above ``edit``); once the block has no MASK,
    at most ``max_post_steps`` check forwards, ending at the first that edits nothing."""
    mask_id, B = engine.mask_id, block_size
    P, limit = len(ids), len(ids) + max_new
    x = ids + [mask_id] * (-(-limit // B) * B - P)
    forwards = 0
    for b in range(P // B, -(-limit // B)):
        lo, hi, post = b * B, (b + 1) * B, 0
        while True:
            act = [p for p in range(lo, hi) if x[p] == mask_id]
            if not act:
                post += 1
                if post > max_post_steps:
                    break
            conf, tok = predict(engine, x[:hi], B)
            forwards += 1
            chosen = _threshold(act, conf, accept)
            edits = [p for p in range(max(lo, P), hi) if p not in act and conf[p] > edit and tok[p] != x[p]]
            for p in chosen + edits:
                x[p] = tok[p]
            if not act and not edits:
                break
        if engine.eos_ids.intersection(x[P:hi]):
            break
    return _output(engine, x[P:limit]), forwards
