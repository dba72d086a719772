"""The multi-block block-diffusion engine (the semantics of Diffulex's ``multi_bd`` strategy).

Each request decodes its answer in blocks of ``block_size`` positions, aligned from position 0
(the prompt's last partial block is completed by generated tokens). Up to ``buffer_size`` blocks
are in flight at once and are decoded in one block-causal forward; greedy, deterministic, and
batched over the prompts of a ``generate`` call (finished requests leave the batch).

One engine step, per request:

1. **Admission.** If fewer than ``buffer_size`` blocks are in flight, the newest one's resolved
   fraction is at least ``add_block_threshold`` (or none is in flight), no EOS has been committed
   and the length limit is not reached, the next block is admitted, all MASK.
2. **Forward.** One forward over: the blocks that became final in the previous step (their K/V
   enter the cache in this forward: the "folded store", so no separate store forward is needed,
   and the very first forward is the prefill of the prompt's complete blocks), then the blocks
   in flight, then, unless ``skip_masked_blocks``, all-MASK placeholder blocks up to the buffer
   size (the fixed-shape window). The committed prefix is read from a ``DynamicCache`` and never
   recomputed. ``skip_masked_blocks`` is the static skip rule: a block that is still fully masked
   is not computed while an older block is in flight (placeholders are never computed then).
3. **Commit** (the sampler), for every computed block in flight that still has MASK positions:
   commit every masked position whose top-1 probability exceeds ``accept_threshold``. If none
   passes, a block whose predecessor is semi-complete (resolved fraction at least
   ``semi_complete_threshold`` at the start of the step) or final commits its single most
   confident position; otherwise it commits nothing this step. The oldest block in flight always
   has a final predecessor, so every step commits at least one token.
4. **Cache entry** (the scheduler), front to back: a fully resolved block whose predecessors are
   all final becomes final in the same step; its K/V are written by the next forward.

A request finishes when an EOS is committed and every position before it is resolved, or when
``max_new_tokens`` positions are resolved. Confidences are float32 softmax probabilities of the
unfiltered logits; the MASK id and ids beyond the tokenizer's vocabulary are never predicted.

Counting (see ``engines.base``): ``forwards`` = the forwards the request took part in (the first
one is the prefill); ``tokens`` = generated tokens up to and including the first EOS.
``extra["flops"]`` is an analytical count of the request's forwards (weights, attention and output
head over the positions computed for it, batch padding excluded), which shows what the skip rule
saves; ``extra["blocks"]`` the number of blocks spanned by the output.
"""
from __future__ import annotations

import inspect
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from transformers import DynamicCache

from pytest_redline.engines import modeling
from pytest_redline.engines.autoregressive import encode, eos_ids, set_threads
from pytest_redline.engines.base import Generation
from pytest_redline.suites.base import Prompt

DEFAULTS: dict[str, Any] = {
    "block_size": 8,
    "buffer_size": 2,
    "accept_threshold": 0.95,
    "semi_complete_threshold": 0.90,
    "add_block_threshold": 0.10,
    "skip_masked_blocks": False,
    "max_new_tokens": 96,
    "use_cache": True,  # False recomputes the whole prefix every step: the reference for tests
}


@dataclass(frozen=True)
class DecodeConfig:
    block_size: int
    buffer_size: int
    accept_threshold: float
    semi_complete_threshold: float
    add_block_threshold: float
    skip_masked_blocks: bool
    max_new_tokens: int
    use_cache: bool

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> "DecodeConfig":
        values = modeling.with_defaults("block_diffusion", params, DEFAULTS)
        check_params(
            "block_diffusion", values,
            ints={"block_size": 1, "buffer_size": 1, "max_new_tokens": 1},
            numbers=("accept_threshold", "semi_complete_threshold", "add_block_threshold"),
            flags=("skip_masked_blocks", "use_cache"),
        )
        return cls(**values)


def check_params(
    engine: str,
    values: Mapping[str, Any],
    ints: Mapping[str, int],
    numbers: Sequence[str] = (),
    flags: Sequence[str] = (),
) -> None:
    """A ValueError naming the engine, the key and the value unless ``values[key]`` is an int of at
    least ``ints[key]`` (bools are not ints), a number >= 0 for each key of ``numbers``, and a bool
    for each key of ``flags``."""
    for key, least in ints.items():
        if isinstance(values[key], bool) or not isinstance(values[key], int) or values[key] < least:
            raise ValueError(f"{engine}: {key}: expected int >= {least}, got {values[key]!r}")
    for key in numbers:
        if isinstance(values[key], bool) or not isinstance(values[key], (int, float)) or values[key] < 0:
            raise ValueError(f"{engine}: {key}: expected a number >= 0, got {values[key]!r}")
    for key in flags:
        if not isinstance(values[key], bool):
            raise ValueError(f"{engine}: {key}: expected true or false, got {values[key]!r}")


@dataclass
class Request:
    """One prompt's decoding state. Blocks are indices into ``tokens`` (block b = [bB, (b+1)B))."""

    prompt: Prompt
    tokens: list[int]  # prompt, then generated positions (MASK until committed)
    prompt_len: int
    limit: int  # prompt_len + max_new_tokens
    cached: int  # positions whose K/V are in the cache (a prefix)
    final: int  # positions [0, final) are final: complete blocks, in order
    active: list[int] = field(default_factory=list)  # blocks in flight, ascending
    forwards: int = 0
    flops: float = 0.0
    result: list[int] | None = None


class BlockDiffusionEngine:
    """``BlockDiffusionEngine(model=PATH, device="auto", dtype="auto", mask_token_id=None,
    trust_remote_code=False, trace=None, threads=None)``; the model defaults to the embedded bd-tiny.
    ``threads`` sets torch's intra-op threads (see ``autoregressive.set_threads``)."""

    name = "block_diffusion"

    def __init__(
        self,
        model: str | Path | None = None,
        device: str = "auto",
        dtype: str = "auto",
        mask_token_id: int | None = None,
        trust_remote_code: bool = False,
        trace: str | Path | None = None,
        threads: int | None = None,
    ):
        set_threads(threads, self.name)
        self.path = Path(model) if model is not None else modeling.EMBEDDED_MODEL
        self.model, self.tokenizer = modeling.load(self.path, device, dtype, trust_remote_code)
        self.device = next(self.model.parameters()).device
        self.dtype = next(self.model.parameters()).dtype
        self.mask_id = self._mask_token_id(mask_token_id)
        self.eos_ids = eos_ids(self.model, self.tokenizer, str(self.path))
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else min(self.eos_ids)
        self.trace_path = Path(trace) if trace is not None else None
        self._fingerprint: str | None = None
        decoder_args = inspect.signature(self.model.get_decoder().forward).parameters
        self._cache_kwarg = "cache" if "cache" in decoder_args else "past_key_values"  # transformers 5.x vs remote code
        cfg = self.model.config
        self._layer_params = sum(p.numel() for p in self.model.get_decoder().layers.parameters())
        self._attn_width = cfg.num_hidden_layers * cfg.num_attention_heads * getattr(cfg, "head_dim", cfg.hidden_size // cfg.num_attention_heads)
        self._head_flops = 2 * cfg.hidden_size * cfg.vocab_size

    # -- protocol ---------------------------------------------------------------------------

    def fingerprint(self) -> str:
        if self._fingerprint is None:
            self._fingerprint = modeling.fingerprint(self.path)
        return self._fingerprint

    def describe(self) -> dict[str, str]:
        return modeling.describe(self.name, self.device, self.dtype, model=self.path)

    def generate(self, prompts: Sequence[Prompt], config: Mapping[str, Any]) -> list[Generation]:
        generations, trace = self.decode(prompts, config, record=self.trace_path is not None)
        if self.trace_path is not None:
            with open(self.trace_path, "a") as handle:
                for entry in trace:
                    handle.write(json.dumps(entry) + "\n")
        return generations

    # -- decoding ---------------------------------------------------------------------------

    @torch.no_grad()
    def decode(self, prompts: Sequence[Prompt], config: Mapping[str, Any], record: bool = False):
        """Decode ``prompts`` as one batch; returns ``(generations, trace)`` (trace empty unless ``record``)."""
        cfg = self._decode_config(config)
        requests = [self._new_request(p, cfg) for p in prompts]
        trace: list[dict] = []
        running = list(requests)
        cache = DynamicCache(config=self.model.config)
        k_pos = torch.zeros(len(running), 0, dtype=torch.long, device=self.device)
        k_valid = torch.zeros(len(running), 0, dtype=torch.bool, device=self.device)
        step = 0
        while running:
            for req in running:
                self._admit(req, cfg)
            progress = [{b: self._progress(req, b, cfg) for b in req.active} for req in running]
            queries = [self._queries(req, cfg) for req in running]
            if not cfg.use_cache:  # the reference: no cache, every forward starts at position 0
                cache = DynamicCache(config=self.model.config)
                k_pos, k_valid = k_pos[: len(running), :0], k_valid[: len(running), :0]
            hidden, q_pos, q_valid = self._forward(running, queries, cache, k_pos, k_valid, cfg)
            logits = self._logits(running, queries, hidden, cfg)
            keep_rows, store = [], []
            for row, req in enumerate(running):
                n_keys = int(k_valid[row].sum()) + len(queries[row])
                self._count(req, len(queries[row]), n_keys, sum(len(v) for v in logits[row].values()))
                committed = self._commit(req, logits[row], progress[row], cfg)
                stored_to, req.cached = req.cached, req.final  # the forward wrote [cached, final)
                newly_final = self._promote(req, cfg)
                if record:
                    trace.append(self._trace_entry(step, req, queries[row], committed, newly_final, stored_to, cfg))
                if not self._finish(req):
                    keep_rows.append(row)
                store.append(req.cached)
            if cfg.use_cache:
                k_pos, k_valid = self._update_cache(cache, k_pos, k_valid, q_pos, q_valid, store, keep_rows)
            running = [running[r] for r in keep_rows]
            step += 1
        return [self._generation(req, cfg) for req in requests], trace

    def _decode_config(self, config: Mapping[str, Any]) -> DecodeConfig:
        """The validated config object of one ``generate`` call (subclasses bring their own)."""
        return DecodeConfig.from_params(config)

    def _new_request(self, prompt: Prompt, cfg: DecodeConfig) -> Request:
        ids = encode(self.tokenizer, prompt, self.name)
        limit = len(ids) + cfg.max_new_tokens
        span = (-(-limit // cfg.block_size) + cfg.buffer_size) * cfg.block_size  # room for placeholders
        tokens = ids + [self.mask_id] * (span - len(ids))
        start = (len(ids) // cfg.block_size) * cfg.block_size
        return Request(prompt=prompt, tokens=tokens, prompt_len=len(ids), limit=limit, cached=0, final=start)

    # -- scheduler: admission, window, cache entry, finishing -------------------------------

    def _progress(self, req: Request, block: int, cfg: DecodeConfig) -> float:
        span = req.tokens[block * cfg.block_size : (block + 1) * cfg.block_size]
        return sum(t != self.mask_id for t in span) / cfg.block_size

    def _admit(self, req: Request, cfg: DecodeConfig) -> None:
        nxt = req.active[-1] + 1 if req.active else req.final // cfg.block_size
        if len(req.active) >= cfg.buffer_size or nxt * cfg.block_size >= req.limit:
            return
        if any(t in self.eos_ids for t in req.tokens[req.prompt_len : nxt * cfg.block_size]):
            return
        if req.active and not self._ready(req, cfg):
            return
        req.active.append(nxt)

    def _ready(self, req: Request, cfg: DecodeConfig) -> bool:
        """The admission gate: the newest block in flight's resolved fraction reached ``add_block_threshold``."""
        return self._progress(req, req.active[-1], cfg) >= cfg.add_block_threshold

    def _computed_blocks(self, req: Request, cfg: DecodeConfig) -> list[int]:
        """The blocks in flight that this step computes, then the placeholders."""
        blocks = [
            b for i, b in enumerate(req.active)
            if not (cfg.skip_masked_blocks and i > 0 and self._progress(req, b, cfg) == 0.0)
        ]
        if not cfg.skip_masked_blocks:
            newest = req.active[-1] if req.active else req.final // cfg.block_size - 1
            blocks += range(newest + 1, newest + 1 + cfg.buffer_size - len(req.active))
        return blocks

    def _queries(self, req: Request, cfg: DecodeConfig) -> list[int]:
        """Positions fed to this step's forward: the uncached final prefix, then the computed blocks."""
        start = req.cached if cfg.use_cache else 0
        positions = list(range(start, req.final))
        for b in self._computed_blocks(req, cfg):
            positions += range(b * cfg.block_size, (b + 1) * cfg.block_size)
        return positions

    def _promote(self, req: Request, cfg: DecodeConfig) -> list[int]:
        """Front to back: complete blocks whose predecessors are final become final (default rule)."""
        newly = []
        while req.active and self._retirable(req, req.active[0], cfg):
            newly.append(req.active.pop(0))
            req.final += cfg.block_size
        return newly

    def _retirable(self, req: Request, block: int, cfg: DecodeConfig) -> bool:
        """Whether the oldest block in flight becomes final now: when it is fully resolved."""
        return self._progress(req, block, cfg) == 1.0

    def _finish(self, req: Request) -> bool:
        """Finished: an EOS with every earlier position resolved, or the whole length resolved."""
        answer = req.tokens[req.prompt_len : req.limit]
        for i, t in enumerate(answer):
            if t == self.mask_id:
                return False
            if t in self.eos_ids:
                req.result = answer[: i + 1]
                return True
        req.result = answer
        return True

    # -- model calls ------------------------------------------------------------------------

    def _forward(self, running, queries, cache, k_pos, k_valid, cfg: DecodeConfig):
        width = max(len(q) for q in queries)
        ids = torch.full((len(running), width), self.pad_id, dtype=torch.long)
        q_pos = torch.zeros(len(running), width, dtype=torch.long)
        q_valid = torch.zeros(len(running), width, dtype=torch.bool)
        for row, (req, q) in enumerate(zip(running, queries)):
            ids[row, : len(q)] = torch.tensor([req.tokens[p] for p in q])
            q_pos[row, : len(q)] = torch.tensor(q)
            q_valid[row, : len(q)] = True
        ids, q_pos, q_valid = ids.to(self.device), q_pos.to(self.device), q_valid.to(self.device)
        mask = modeling.block_causal_mask(
            q_pos, torch.cat([k_pos, q_pos], 1), cfg.block_size, self.dtype, torch.cat([k_valid, q_valid], 1)
        )
        out = self.model.get_decoder()(
            input_ids=ids, attention_mask=mask, position_ids=q_pos, use_cache=True, **{self._cache_kwarg: cache}
        )
        return out.last_hidden_state, q_pos, q_valid

    def _logits(self, running, queries, hidden, cfg: DecodeConfig) -> list[dict[int, list[tuple[int, float, int]]]]:
        """Per row: {block: [(position, confidence, token)] for the positions ``_read_positions``
        names (the masked ones), greedy."""
        rows, cols, where = [], [], []
        for row, (req, q) in enumerate(zip(running, queries)):
            index = {p: c for c, p in enumerate(q)}
            for b, p in self._read_positions(req, cfg):
                if p in index:
                    rows.append(row), cols.append(index[p]), where.append((row, b, p))
        result: list[dict] = [{} for _ in running]
        if not rows:
            return result
        logits = self.model.get_output_embeddings()(hidden[rows, cols]).float()
        logits[:, self.mask_id] = float("-inf")
        logits[:, len(self.tokenizer) :] = float("-inf")  # padding rows of the embedding are no tokens
        conf, tok = logits.softmax(-1).max(-1)
        for (row, b, p), c, t in zip(where, conf.tolist(), tok.tolist()):
            result[row].setdefault(b, []).append((p, c, t))
        return result

    def _read_positions(self, req: Request, cfg: DecodeConfig) -> list[tuple[int, int]]:
        """``(block, position)`` pairs whose logits a step reads: the masked positions of the blocks in flight."""
        return [
            (b, p) for b in req.active
            for p in range(b * cfg.block_size, (b + 1) * cfg.block_size) if req.tokens[p] == self.mask_id
        ]

    def _update_cache(self, cache, k_pos, k_valid, q_pos, q_valid, store, keep_rows):
        """Keep the old valid columns and the new columns below each row's stored length; drop
        finished rows. Uses ``crop`` when no row stored anything, else a per-row gather."""
        keep = torch.cat([k_valid, q_valid & (q_pos < torch.tensor(store, device=self.device)[:, None])], 1)
        positions = torch.cat([k_pos, q_pos], 1)
        rows = torch.tensor(keep_rows, dtype=torch.long, device=self.device)
        keep, positions = keep[rows], positions[rows]
        old = k_pos.shape[1]
        if not keep[:, old:].any() and len(keep_rows) == k_pos.shape[0]:
            cache.crop(old - cache.get_seq_length())  # a negative count: drop this step's columns
            return k_pos, k_valid
        width = int(keep.sum(1).max()) if len(keep_rows) else 0
        # left-pad each row's kept columns: invalid padding first, then the kept columns in order
        order = torch.argsort(keep.int(), dim=1, stable=True)[:, keep.shape[1] - width :]
        for layer in cache.layers:
            index = order[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1])
            layer.keys = layer.keys[rows].gather(2, index)
            layer.values = layer.values[rows].gather(2, index)
        return positions.gather(1, order), keep.gather(1, order)

    # -- sampler ----------------------------------------------------------------------------

    def _commit(self, req: Request, logits: dict, progress: dict, cfg: DecodeConfig) -> list[tuple[int, int]]:
        committed = []
        for i, b in enumerate(req.active):
            candidates = logits.get(b)
            if not candidates:
                continue
            chosen = [(p, t) for p, c, t in candidates if c > cfg.accept_threshold]
            fallback = i == 0 or progress[req.active[i - 1]] >= cfg.semi_complete_threshold
            if not chosen and fallback:
                p, _, t = max(candidates, key=lambda pct: pct[1])
                chosen = [(p, t)]
            for p, t in chosen:
                req.tokens[p] = t
            committed += chosen
        return committed

    # -- accounting -------------------------------------------------------------------------

    def _count(self, req: Request, n_queries: int, n_keys: int, n_logits: int) -> None:
        req.forwards += 1
        req.flops += 2 * self._layer_params * n_queries + 4 * self._attn_width * n_queries * n_keys
        req.flops += self._head_flops * n_logits

    def _generation(self, req: Request, cfg: DecodeConfig) -> Generation:
        out = req.result or []
        last = req.prompt_len + max(len(out), 1) - 1
        blocks = last // cfg.block_size - req.prompt_len // cfg.block_size + 1
        text = self.tokenizer.decode([t for t in out if t not in self.eos_ids], skip_special_tokens=False)
        return Generation(
            text=text,
            tokens=len(out),
            forwards=req.forwards,
            extra={"flops": req.flops, "blocks": float(blocks)},
        )

    def _trace_entry(self, step, req, queries, committed, newly_final, stored_to, cfg) -> dict:
        return {
            "step": step,
            "prompt": req.prompt.id,
            "stored": [stored_to, req.cached],
            "computed": sorted({p // cfg.block_size for p in queries}),
            "committed": committed,
            "became_final": newly_final,
            "in_flight": [[b, self._progress(req, b, cfg)] for b in req.active],
            "final": req.final,
        }

    # -- checkpoint metadata ----------------------------------------------------------------

    def _mask_token_id(self, override: int | None) -> int:
        candidates = (override, self.tokenizer.mask_token_id, getattr(self.model.config, "mask_token_id", None))
        for value in candidates:
            if value is not None:
                return int(value)
        raise ValueError(f"{self.path}: no mask token id; pass engine_args.mask_token_id")
