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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from pytest_redline.engines import modeling
from pytest_redline.engines.autoregressive import (
    AR_DRAFT, AR_TARGET, Request, RowCache, eos_ids, fill_order, generation, new_request, only_tokens, set_threads, token_count,
)
from pytest_redline.engines.base import Generation
from pytest_redline.suites.base import Prompt

ACCEPTANCE = ("lossless", "typical")
DEFAULTS: dict[str, Any] = {
    "acceptance": "lossless",
    "num_draft_tokens": 4,
    "posterior_threshold": 0.09,  # ε (Medusa's default)
    "posterior_alpha": None,  # δ; None: √ε
    "temperature": 1.0,  # of the softmax that the typical criterion reads
    "max_new_tokens": 96,
    "use_cache": True,  # False recomputes every forward from the first token: the reference for tests
}
TYPICAL_ONLY = ("posterior_threshold", "posterior_alpha", "temperature")


@dataclass(frozen=True)
class SpecConfig:
    acceptance: str
    num_draft_tokens: int
    posterior_threshold: float
    posterior_alpha: float
    temperature: float
    max_new_tokens: int
    use_cache: bool

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> "SpecConfig":
        values = modeling.with_defaults("speculative", params, DEFAULTS)
        if values["acceptance"] not in ACCEPTANCE:
            raise ValueError(f"speculative: acceptance: expected one of {', '.join(ACCEPTANCE)}, got {values['acceptance']!r}")
        if values["acceptance"] == "lossless":
            given = [key for key in TYPICAL_ONLY if key in params]
            if given:
                raise ValueError(f"speculative: {given[0]}: applies only to acceptance: typical, got acceptance: lossless")
        for key in ("num_draft_tokens", "max_new_tokens"):
            if isinstance(values[key], bool) or not isinstance(values[key], int) or values[key] < 1:
                raise ValueError(f"speculative: {key}: expected int >= 1, got {values[key]!r}")
        if values["posterior_alpha"] is None:
            values["posterior_alpha"] = _number(values, "posterior_threshold", 0.0, 1.0) ** 0.5
        _number(values, "posterior_threshold", 0.0, 1.0)
        _number(values, "posterior_alpha", 0.0, math.inf)
        _number(values, "temperature", 0.0, math.inf)
        if not isinstance(values["use_cache"], bool):
            raise ValueError(f"speculative: use_cache: expected true or false, got {values['use_cache']!r}")
        return cls(**values)


def _number(values: Mapping[str, Any], key: str, low: float, high: float) -> float:
    value = values[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ValueError(f"speculative: {key}: expected a number in [{low}, {high}], got {value!r}")
    return float(value)


def accepted_lengths(logits: torch.Tensor, proposals: torch.Tensor, cfg: SpecConfig) -> torch.Tensor:
    """How many leading proposals each row keeps: ``logits`` (rows, γ+1, vocab), ``proposals`` (rows, γ)."""
    scores = logits[:, :-1].to(torch.promote_types(logits.dtype, torch.float32))
    if cfg.acceptance == "lossless" or cfg.temperature == 0:
        keep = proposals == scores.argmax(-1)
    else:  # in log space: p(x) > min(ε, δ·exp(−H)), with log 0 = −inf, so ε = 0 keeps x even where p(x) underflows
        logp = (scores / cfg.temperature).log_softmax(-1)
        entropy = torch.special.entr(logp.exp()).sum(-1)
        log_eps = math.log(cfg.posterior_threshold) if cfg.posterior_threshold > 0 else -math.inf
        log_alpha = math.log(cfg.posterior_alpha) if cfg.posterior_alpha > 0 else -math.inf
        threshold = torch.clamp(log_alpha - entropy, max=log_eps)
        keep = logp.gather(-1, proposals[..., None])[..., 0] > threshold
    return keep.long().cumprod(-1).sum(-1)


class SpeculativeEngine:
    """``SpeculativeEngine(target=PATH, draft=PATH, device="auto", dtype="auto", threads=None)``;
    the models default to the embedded ``ar-target`` and ``ar-draft``, which must share one
    tokenizer. ``threads`` sets torch's intra-op threads (see ``autoregressive.set_threads``)."""

    name = "speculative"

    @classmethod
    def check_config(cls, params: Mapping[str, Any]) -> None:
        """Check a config's parameters without a model: the gate calls it while preparing a grid."""
        SpecConfig.from_params(params)

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

    @staticmethod
    def check_engine_args(engine_args: Mapping[str, Any]) -> None:
        """The gate's model-free check at prepare time: see :func:`check_tokenizer_files`."""
        check_tokenizer_files(engine_args)

    # -- protocol ---------------------------------------------------------------------------

    def fingerprint(self) -> str:
        if self._fingerprint is None:
            self._fingerprint = modeling.fingerprint(self.target_path, self.draft_path)
        return self._fingerprint

    def describe(self) -> dict[str, str]:
        return modeling.describe(
            self.name, self.device, self.dtype, target=self.target_path, draft=self.draft_path, quantization="none"
        )

    @classmethod
    def identity(cls, engine_args: Mapping[str, Any], cache_dir: str | Path | None = None) -> dict[str, Any]:
        """Model-free: what ``fingerprint()`` and ``describe()`` return once built (a warm rerun's
        key); weight hashes are cached in ``cache_dir``."""
        args = modeling.engine_arguments(cls, engine_args, cache_dir)
        target = Path(args["target"]) if args["target"] is not None else AR_TARGET
        draft = Path(args["draft"]) if args["draft"] is not None else AR_DRAFT
        return modeling.identity(
            cls.name, args["device"], args["dtype"], [target, draft], target=target, draft=draft, quantization="none"
        )

    def generate(self, prompts: Sequence[Prompt], config: Mapping[str, Any]) -> list[Generation]:
        cfg = SpecConfig.from_params(config)
        requests = [self._request(p, cfg) for p in prompts]
        self.decode(requests, cfg)
        return [self._generation(r) for r in requests]

    # -- decoding ---------------------------------------------------------------------------

    def _request(self, prompt: Prompt, cfg: SpecConfig) -> Request:
        return new_request(self.tokenizer, prompt, cfg.max_new_tokens, self.eos, self.name)

    @torch.no_grad()
    def decode(self, requests: Sequence[Request], cfg: SpecConfig, row_cache=RowCache) -> None:
        """Decode ``requests`` as one batch, in place (``row_cache``: the cache class, for tests)."""
        gamma = cfg.num_draft_tokens
        running = [r for r in requests if not r.done]
        capacity = max((r.limit for r in running), default=1) + gamma  # a row feeds at most γ tokens past its limit
        target = row_cache(self.target, len(running), self.pad_id, recompute=not cfg.use_cache, capacity=capacity)
        draft = row_cache(self.draft, len(running), self.pad_id, recompute=not cfg.use_cache, capacity=capacity)
        while running:
            proposals, listed = self._propose(draft, running, gamma)
            feeds = [r.tokens[target.cached(i) :] + p for i, (r, p) in enumerate(zip(running, listed))]
            logits = only_tokens(target.forward(feeds, keep=gamma + 1), self.tokens)
            kept = accepted_lengths(logits, proposals, cfg)
            own = logits[torch.arange(len(running), device=logits.device), kept].argmax(-1)
            for req, (n, token), props in zip(running, torch.stack([kept, own], 1).tolist(), listed):  # one device read
                appended = req.append(props[:n] + [token])
                req.count("forwards")
                req.count("draft_forwards", gamma)
                req.count("proposed_draft_tokens", gamma)
                req.count("accepted_draft_tokens", min(n, appended))
            order = fill_order(len(running), [i for i, r in enumerate(running) if not r.done])
            sequences = [r.tokens for r in running]
            target.retain(sequences, order)
            draft.retain(sequences, order)
            running = [running[i] for i in order]

    def _propose(self, draft: RowCache, running: Sequence[Request], gamma: int) -> tuple[torch.Tensor, list[list[int]]]:
        """γ greedy draft tokens per request, shape (rows, γ), and the same as lists."""
        steps = []
        feeds = [r.tokens[draft.cached(i) :] for i, r in enumerate(running)]
        for _ in range(gamma):
            step = draft.forward(feeds, keep=1)[:, -1, : self.tokens].argmax(-1)  # never a padding id (as only_tokens, no copy)
            steps.append(step)
            feeds = [[t] for t in step.tolist()]  # the next forward needs them as lists anyway
        proposals = torch.stack(steps, 1)
        return proposals, proposals.tolist()

    def _generation(self, req: Request) -> Generation:
        return generation(req, {key: float(req.counts.get(key, 0)) for key in ("draft_forwards", "proposed_draft_tokens", "accepted_draft_tokens")})


def check_tokenizer_files(engine_args: Mapping[str, Any]) -> None:
    """Model-free, while the gate prepares a grid: the draft must tokenize as the target does,
    read from their tokenizer files (no model loads). Vocabulary sizes may differ by embedding
    padding only; the engine never picks a padding id (``autoregressive.only_tokens``)."""
    from transformers import AutoTokenizer

    paths = {key: Path(engine_args[key]) if engine_args.get(key) is not None else default
             for key, default in (("target", AR_TARGET), ("draft", AR_DRAFT))}
    trust = bool(engine_args.get("trust_remote_code", False))
    tokenizers = {key: AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=trust) for key, path in paths.items()}
    check_same_tokenizer(tokenizers["target"], tokenizers["draft"], paths["target"], paths["draft"])


def check_same_tokenizer(target, draft, target_path: Path, draft_path: Path) -> None:
    """Raise ValueError unless the draft and the target tokenize alike (same vocabulary and specials)."""
    where = f"speculative: engine_args.draft: the draft's tokenizer ({draft_path}) differs from the target's ({target_path})"
    t_vocab, d_vocab = target.get_vocab(), draft.get_vocab()
    for token in sorted(set(t_vocab) | set(d_vocab)):
        if t_vocab.get(token) != d_vocab.get(token):
            raise ValueError(f"{where}: token {token!r} has id {t_vocab.get(token)} in the target, {d_vocab.get(token)} in the draft")
    for special in ("eos_token_id", "pad_token_id", "bos_token_id"):
        if getattr(target, special) != getattr(draft, special):
            raise ValueError(f"{where}: {special} is {getattr(target, special)} in the target, {getattr(draft, special)} in the draft")
