"""Speculative decoding: a small draft model proposes, the target verifies, batched over prompts.

Each round, for every request of the batch:

1. the draft proposes ``num_draft_tokens`` (γ) tokens greedily, one forward per token (its first
   forward also feeds whatever of the accepted sequence it has not seen yet, the prompt included);
2. the target runs **one** forward over the tokens it has not cached (at least the last accepted
   token) followed by the γ proposals, giving the distributions p_1 .. p_{γ+1} (the very first of
   these forwards is the prefill);
3. the acceptance rule keeps the first n proposals, and the target's own token argmax p_{n+1} is
   appended, so a round yields n + 1 tokens (fewer at the first EOS or at ``max_new_tokens``):

   - ``lossless``: proposal k is kept while it equals argmax p_k, so the output is exactly the
     target's greedy output (the target verifies every token);
   - ``typical`` (Medusa's typical acceptance): proposal x is kept while
     p_k(x) > min(ε, δ · exp(−H(p_k))), where p_k = softmax(target logits / ``temperature``),
     H is its entropy (exact, no smoothing), ε = ``posterior_threshold`` and
     δ = ``posterior_alpha`` (default √ε). This is lossy: a kept token need not be the target's
     argmax. At ``temperature`` 0 the rule is the lossless one. The comparison runs in log space
     (log p(x) > min(log ε, log δ − H)), so with ε = 0 every proposal is kept even where p(x)
     underflows in float32 (a logit gap of 120 gives p = 0 there, log p = −120).

4. both caches are rolled back: each keeps only K/V of tokens that are in the accepted sequence
   (``autoregressive.RowCache.retain``), so a rejected proposal never influences later logits.

Rows accept different numbers of tokens, and finished requests leave the batch.

Counting (see ``engines.base``): ``forwards`` = the target forwards of the request (rounds, the
prefill included); ``tokens`` = generated tokens up to and including the first EOS; in ``extra``:
``draft_forwards``, ``accepted_draft_tokens`` (proposals kept) and ``proposed_draft_tokens``.
The cost is ``apf`` = tokens / target forwards.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from pytest_redline.contracts import Generation, Prompt
from pytest_redline.engines import modeling, runtime
from pytest_redline.engines.autoregressive import (
    ARRequest, RowCache, fill_order, generation, new_request, new_requests, only_tokens, token_count,
)
from pytest_redline.engines.autoregressive_spec import SpecConfig, SpeculativeSpec, check_same_tokenizer
from pytest_redline.engines.common import eos_ids, set_threads
from pytest_redline.engines.runtime import AR_DRAFT, AR_TARGET

def accepted_lengths(logits: torch.Tensor, proposals: torch.Tensor, cfg: SpecConfig, best: torch.Tensor | None = None) -> torch.Tensor:
    """How many leading proposals each row keeps: ``logits`` (rows, γ+1, vocab), ``proposals`` (rows, γ);
    ``best``: ``logits.argmax(-1)``, when the caller has it (the lossless rule reads it)."""
    if cfg.acceptance == "lossless" or cfg.temperature == 0:
        keep = proposals == (logits[:, :-1].argmax(-1) if best is None else best[:, :-1])
    else:  # in log space: p(x) > min(ε, δ·exp(−H)), with log 0 = −inf, so ε = 0 keeps x even where p(x) underflows
        scores = logits[:, :-1].to(torch.promote_types(logits.dtype, torch.float32))
        logp = (scores if cfg.temperature == 1 else scores / cfg.temperature).log_softmax(-1)  # x / 1 is x exactly
        entropy = torch.special.entr(logp.exp()).sum(-1)
        log_eps = math.log(cfg.posterior_threshold) if cfg.posterior_threshold > 0 else -math.inf
        log_alpha = math.log(cfg.posterior_alpha) if cfg.posterior_alpha > 0 else -math.inf
        threshold = torch.clamp(log_alpha - entropy, max=log_eps)
        keep = logp.gather(-1, proposals[..., None])[..., 0] > threshold
    return keep.cumprod(-1).sum(-1)  # a bool cumprod counts in int64


class SpeculativeEngine(SpeculativeSpec):
    """``SpeculativeEngine(target=PATH, draft=PATH, device="auto", dtype="auto", threads=None)``;
    the models default to the embedded ``ar-target`` and ``ar-draft``, which must share one
    tokenizer. ``threads`` sets torch's intra-op threads (see ``common.set_threads``).
    Its name, config and model-free methods are in ``autoregressive_spec.SpeculativeSpec``."""

    def __init__(
        self,
        target: str | Path | None = None,
        draft: str | Path | None = None,
        device: str = "auto",
        dtype: str = "auto",
        threads: int | None = None,
        trust_remote_code: bool = False,
    ):
        set_threads(threads, self.name)
        self.target_path = Path(target) if target is not None else AR_TARGET
        self.draft_path = Path(draft) if draft is not None else AR_DRAFT
        self.target, self.tokenizer = modeling.load(self.target_path, device, dtype, trust_remote_code)
        self.draft, draft_tokenizer = modeling.load(self.draft_path, device, dtype, trust_remote_code)
        check_same_tokenizer(self.tokenizer, draft_tokenizer, self.target_path, self.draft_path)
        self.tokens = token_count(self.tokenizer, self.target, self.draft)  # ids from here on are padding rows
        self.device = next(self.target.parameters()).device
        self.dtype = next(self.target.parameters()).dtype
        self.eos = eos_ids(self.target, self.tokenizer, str(self.target_path))
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else min(self.eos)
        self._fingerprint: str | None = None

    # -- protocol ---------------------------------------------------------------------------

    def fingerprint(self) -> str:
        if self._fingerprint is None:
            self._fingerprint = runtime.fingerprint(self.target_path, self.draft_path)
        return self._fingerprint

    def describe(self) -> dict[str, str]:
        return runtime.describe(
            self.name, self.device, self.dtype, target=self.target_path, draft=self.draft_path, quantization="none"
        )

    def generate(self, prompts: Sequence[Prompt], config: Mapping[str, Any]) -> list[Generation]:
        cfg = SpecConfig.from_params(config)
        requests = new_requests(self.tokenizer, prompts, cfg.max_new_tokens, self.eos, self.name)
        self.decode(requests, cfg)
        return [self._generation(r) for r in requests]

    # -- decoding ---------------------------------------------------------------------------

    def _request(self, prompt: Prompt, cfg: SpecConfig) -> ARRequest:
        return new_request(self.tokenizer, prompt, cfg.max_new_tokens, self.eos, self.name)

    @torch.no_grad()
    def decode(self, requests: Sequence[ARRequest], cfg: SpecConfig, row_cache=RowCache) -> None:
        """Decode ``requests`` as one batch, in place (``row_cache``: the cache class, for tests)."""
        gamma = cfg.num_draft_tokens
        running = [r for r in requests if not r.done]
        capacity = max((r.limit for r in running), default=1) + gamma  # a row feeds at most γ tokens past its limit
        target = row_cache(self.target, len(running), self.pad_id, recompute=not cfg.use_cache, capacity=capacity)
        draft = row_cache(self.draft, len(running), self.pad_id, recompute=not cfg.use_cache, capacity=capacity)
        while running:
            proposals, listed = self._propose(draft, running, gamma)
            unseen = [r.tokens[len(held) :] for r, held in zip(running, target.tokens)]  # the last token, but in the prefill
            if all(len(u) == 1 for u in unseen):  # as one tensor: nothing to pad or list
                feeds = torch.cat([torch.tensor(unseen, dtype=torch.long, device=proposals.device), proposals], 1)
            else:
                feeds = [u + p for u, p in zip(unseen, listed)]
            logits = only_tokens(target.forward(feeds, keep=gamma + 1), self.tokens)
            best = logits.argmax(-1)  # the target's own token after each prefix of the proposals
            kept = accepted_lengths(logits, proposals, cfg, best)
            own = best.gather(1, kept[:, None])
            for req, (n, token), props in zip(running, torch.cat([kept[:, None], own], 1).tolist(), listed):  # one device read
                appended = req.append(props[:n] + [token])
                req.count("forwards")
                req.count("accepted_draft_tokens", min(n, appended))
            order = fill_order(len(running), [i for i, r in enumerate(running) if not r.done])
            sequences = [r.tokens for r in running]
            target.retain(sequences, order)
            draft.retain(sequences, order)
            running = [running[i] for i in order]
        for req in requests:  # every round runs the draft γ times on γ proposals
            req.count("draft_forwards", gamma * req.counts.get("forwards", 0))
            req.count("proposed_draft_tokens", gamma * req.counts.get("forwards", 0))

    def _propose(self, draft: RowCache, running: Sequence[ARRequest], gamma: int) -> tuple[torch.Tensor, list[list[int]]]:
        """γ greedy draft tokens per request, shape (rows, γ), and the same as lists."""
        feeds = [r.tokens[len(held) :] for r, held in zip(running, draft.tokens)]
        steps = []
        for _ in range(gamma):
            # never a padding id (as only_tokens, without copying the logits); the next step's feed
            feeds = draft.forward(feeds, keep=1)[:, -1, : self.tokens].argmax(-1, keepdim=True)
            steps.append(feeds)
        proposals = torch.cat(steps, 1)
        return proposals, proposals.tolist()

    def _generation(self, req: ARRequest) -> Generation:
        return generation(req, {key: float(req.counts.get(key, 0)) for key in ("draft_forwards", "proposed_draft_tokens", "accepted_draft_tokens")})
