"""The multi-block block-diffusion engine: Diffulex's ``multi_bd`` strategy, exactly.

Each request decodes its answer in blocks of ``block_size`` positions, aligned from position 0
(the prompt's last partial block is completed by generated tokens). Up to ``buffer_size`` buffer
slots hold the blocks in flight, decoded in one block-causal forward; greedy, deterministic, and
batched over the prompts of a ``generate`` call (finished requests leave the batch). A block's
status is Diffulex's: DUMMY (an all-MASK placeholder slot) -> ACTIVE -> TO_CACHE (complete, its
K/V are written by the next forward) -> IN_CACHE.

``schedule: diffulex`` (the default) follows Diffulex ``multi_bd`` (engines.md section 5) rule for
rule, in tokens and forwards. One engine step, per request:

1. **Admission** (``admit``). The first DUMMY slot becomes ACTIVE when a slot is free (the ACTIVE
   and TO_CACHE blocks fill fewer than ``buffer_size`` slots), no EOS has been committed, the
   new block starts before the length limit, and either the newest valid block (ACTIVE or
   TO_CACHE) has a resolved fraction of at least ``add_block_threshold``, or no block is valid
   and every earlier block is IN_CACHE (Diffulex's all-DUMMY rule).
2. **Forward** (``step``). The prefill step (a request's first) computes the prompt's complete
   blocks and the ACTIVE blocks: when the prompt fills its last block (P % B = 0) that is a pure
   prefill that commits nothing; otherwise the padded tail block starts ACTIVE and is decoded by
   it. Every later step computes all ``buffer_size`` slots: TO_CACHE blocks (their K/V enter the
   cache in this forward, the "folded store"), ACTIVE blocks, then DUMMY placeholders (unless
   ``skip_masked_blocks``). The cached prefix is read from a ``DynamicCache``, never recomputed.
3. **Commit** (``commit``, the sampler). Per ACTIVE block with MASK positions: every masked
   position whose top-1 probability exceeds ``accept_threshold``; if fewer than the step's
   transfer count pass, that many of its most confident ones when its predecessor is semi-complete
   (resolved fraction at least ``semi_complete_threshold`` at the start of the step) or final,
   else nothing. The transfer count is 1, except on LLaDA2.0 checkpoints (``model_type:
   llada2_moe``), whose official ``generate`` caps its steps per block at the generation length:
   with ``max_new_tokens`` n below the block B, a block's step s (its s-th forward that reads it)
   transfers ``B // n`` positions, one more while ``s < B % n``.
4. **Cache entry** (``retire``, the scheduler), front to back: TO_CACHE blocks (written by this
   forward) become IN_CACHE and free their slots; then an ACTIVE block that is complete and whose
   predecessor is TO_CACHE or IN_CACHE becomes TO_CACHE, keeping its slot for one more step.
   A request finishes once an EOS has been committed or the limit's last block admitted, and
   every admitted block is complete and IN_CACHE: the blocks after the EOS are completed and the
   last block is stored first. At ``buffer_size: 1`` every block thus costs one store forward.

``schedule: eager`` keeps this engine's earlier rules (fewer forwards, same commit rule): a
complete block frees its slot at once (its K/V are folded into the next forward, which may
already hold the next block), the prefill is folded into the first step, the padded tail block is
admitted by the first step like any other, and a request finishes as soon as an EOS is committed
with every earlier position resolved (or the limit is resolved). ``buffer_size: 1`` is then
single-block threshold decoding with top-1 fallback, without store forwards.

Both schedules: confidences are softmax probabilities of the unfiltered logits, in float32, or in
the model's dtype when it is wider (float64: the official decoders' own arithmetic; a float32
softmax over a float64 model rounds near-ties into ties); the MASK id and ids beyond the
tokenizer's vocabulary are never predicted. A prompt's stop strings
(``Prompt.stop``) end the request at the first one in its resolved answer prefix.

**The block life cycle** (``BlockLifecycle``) is the public extension protocol of this engine and
of FlowBlock: ``admit`` (blocks joining the window), ``step`` (what the forward computes and
reads), ``commit`` (apply the predictions) and ``retire`` (blocks becoming final, and the request
ending). A subclass overrides those four and its ``Config``/``Request`` classes, nothing private.

Counting (see ``engines.base``): ``forwards`` = the forwards the request took part in, prefill and
stores included; ``tokens`` = generated tokens up to and including the first EOS (or up to the
stop string's last token). ``extra["flops"]`` is an analytical count of the request's forwards
(weights, attention and output head over the positions computed for it, batch padding excluded);
``extra["blocks"]`` the number of blocks spanned by the output.
"""
from __future__ import annotations

import inspect
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from transformers import DynamicCache

from pytest_redline.contracts import BlockLifecycle  # noqa: F401  (re-exported: this engine's extension protocol)
from pytest_redline.contracts import Generation, Prompt, Reads, Step, cut_at_stop
from pytest_redline.engines import checkpoints, dual_cache, modeling, runtime
from pytest_redline.engines.common import encode, eos_ids, set_threads
from pytest_redline.engines.diffusion_spec import BlockDiffusionSpec, DecodeConfig

@dataclass
class BlockRequest:
    """One prompt's decoding state. Blocks are indices into ``tokens`` (block b = [bB, (b+1)B)).

    Statuses: blocks below ``cached // B`` are IN_CACHE, those in ``[cached, final)`` TO_CACHE,
    ``active`` lists the ACTIVE ones (ascending); the rest are DUMMY."""

    prompt: Prompt
    tokens: list[int]  # prompt, then generated positions (MASK until committed)
    prompt_len: int
    limit: int  # prompt_len + max_new_tokens
    cached: int  # positions whose K/V are in the cache (a prefix)
    final: int  # positions [0, final) are complete blocks, in order (TO_CACHE or IN_CACHE)
    first: int  # the first block's start position: the prompt's last complete block boundary
    active: list[int] = field(default_factory=list)  # ACTIVE blocks, ascending
    progress: dict[int, float] = field(default_factory=dict)  # resolved fraction of the active blocks at the step's start
    block_steps: dict[int, int] = field(default_factory=dict)  # block -> forwards that read its masked positions
    forwards: int = 0
    flops: float = 0.0
    result: list[int] | None = None  # the output ids once the request has finished
    finish_reason: str | None = None
    extra: dict[str, float] = field(default_factory=dict)  # engine-specific counters, into Generation.extra
    log: dict[str, Any] = field(default_factory=dict)  # engine-specific trace fields of the last step


def cut_at_eos(answer: Sequence[int], eos: frozenset[int]) -> tuple[list[int], bool]:
    """``answer`` up to and including its first EOS, and whether it had one."""
    for i, t in enumerate(answer):
        if t in eos:
            return list(answer[: i + 1]), True
    return list(answer), False


class BlockDiffusionEngine(BlockDiffusionSpec):
    """``BlockDiffusionEngine(model=PATH, device="auto", dtype="auto", mask_token_id=None,
    trust_remote_code=False, trace=None, threads=None, eos_token_id=None)``; the model defaults to
    the embedded bd-tiny. ``eos_token_id`` replaces the EOS ids the checkpoint declares.
    ``threads`` sets torch's intra-op threads (see ``common.set_threads``). Its name,
    config, rules version and model-free methods are in ``diffusion_spec.BlockDiffusionSpec``."""

    Request = BlockRequest

    def __init__(
        self,
        model: str | Path | None = None,
        device: str = "auto",
        dtype: str = "auto",
        mask_token_id: int | None = None,
        trust_remote_code: bool = False,
        trace: str | Path | None = None,
        threads: int | None = None,
        eos_token_id: int | None = None,
    ):
        set_threads(threads, self.name)
        self.path = Path(model) if model is not None else runtime.EMBEDDED_MODEL
        # what the checkpoint declares (family, block size, mask id), then its stock-class loader
        self.checkpoint = checkpoints.read_checkpoint(self.path, mask_token_id, eos_token_id)
        self.model, self.tokenizer = checkpoints.load(self.checkpoint, device, dtype, trust_remote_code)
        self.device = next(self.model.parameters()).device
        self.dtype = next(self.model.parameters()).dtype
        self.mask_id = self._mask_token_id(self.checkpoint.mask_token_id)
        declared_eos = self.checkpoint.eos_token_id  # LLaDA2's (one EOS, as its generate), or the grid's
        self.eos_ids = frozenset([declared_eos]) if declared_eos is not None else eos_ids(self.model, self.tokenizer, str(self.path))
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else min(self.eos_ids)
        self.trace_path = Path(trace) if trace is not None else None
        self._fingerprint: str | None = None
        decoder_args = inspect.signature(self.model.get_decoder().forward).parameters
        self._cache_kwarg = "cache" if "cache" in decoder_args else "past_key_values"  # transformers 5.x vs remote code
        cfg = self.model.config
        self._layer_params = modeling.active_layer_params(self.model)  # MoE: the active experts only
        self._attn_width = cfg.num_hidden_layers * cfg.num_attention_heads * getattr(cfg, "head_dim", cfg.hidden_size // cfg.num_attention_heads)
        self._head_flops = 2 * cfg.hidden_size * cfg.vocab_size
        self._banned = torch.zeros(cfg.vocab_size, dtype=torch.bool, device=self.device)
        self._banned[len(self.tokenizer):] = True  # padding rows of the embedding are no tokens
        if self.mask_id < cfg.vocab_size:
            self._banned[self.mask_id] = True

    # -- protocol ---------------------------------------------------------------------------

    def fingerprint(self) -> str:
        if self._fingerprint is None:
            self._fingerprint = runtime.fingerprint(self.path)
        return self._fingerprint

    def describe(self) -> dict[str, str]:
        return runtime.describe(self.name, self.device, self.dtype, model=self.path,
                                rules=self.rules_for(str(self.dtype).removeprefix("torch."), self.checkpoint.family), **self.checkpoint.describe())

    def generate(self, prompts: Sequence[Prompt], config: Mapping[str, Any]) -> list[Generation]:
        config = self.with_declared(config, self.checkpoint.block_size)  # the spec's rule, as reported
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
        cfg = self.Config.from_params(config)
        if getattr(cfg, "schedule", None) == "fast_dllm":
            return dual_cache.decode(self, prompts, cfg, record)
        requests = [self.new_request(p, cfg) for p in prompts]
        trace: list[dict] = []
        running = list(requests)
        rows = KVRows(self.model.config, len(running), self.device)
        step = 0
        while running:
            admitted = [self.admit(req, cfg) for req in running]
            steps = [self.step(req, cfg) for req in running]
            if not cfg.use_cache:  # the reference: no cache, every forward starts at position 0
                rows = KVRows(self.model.config, len(running), self.device)
            hidden, q_pos, q_valid = self._forward(running, steps, rows, cfg.block_size)
            reads = self._read(running, steps, hidden)
            keep_rows, store = [], []
            for row, (req, plan) in enumerate(zip(running, steps)):
                self.count_forward(req, len(plan.queries), rows.width(row) + len(plan.queries), len(plan.reads))
                committed = self.commit(req, reads[row], cfg)
                stored_to, req.cached = req.cached, plan.store
                newly_final = self.retire(req, cfg)
                if req.prompt.stop:
                    self.stop_at_string(req, req.prompt.stop, cfg)
                if record:
                    trace.append(self._trace_entry(step, req, plan, admitted[row], committed, newly_final, stored_to, cfg))
                if req.result is None:
                    keep_rows.append(row)
                store.append(req.cached)
            if cfg.use_cache:
                rows.keep(q_pos, q_valid, store, keep_rows)
            running = [running[r] for r in keep_rows]
            step += 1
        return [self._generation(req, cfg) for req in requests], trace

    def new_request(self, prompt: Prompt, cfg: DecodeConfig) -> BlockRequest:
        """A request's initial state (the schedule's initial statuses)."""
        ids = encode(self.tokenizer, prompt, self.name)
        limit = len(ids) + cfg.max_new_tokens
        span = (-(-limit // cfg.block_size) + cfg.buffer_size + 1) * cfg.block_size  # room for placeholders
        tokens = ids + [self.mask_id] * (span - len(ids))
        first = (len(ids) // cfg.block_size) * cfg.block_size
        req = self.Request(prompt=prompt, tokens=tokens, prompt_len=len(ids), limit=limit, cached=0, final=first, first=first)
        if getattr(cfg, "schedule", "eager") == "diffulex" and first < len(ids):
            req.active.append(first // cfg.block_size)  # the padded tail block starts ACTIVE
        return req

    # -- the block life cycle ---------------------------------------------------------------

    def admit(self, req: BlockRequest, cfg: DecodeConfig) -> list[int]:
        """Admission (scheduler): at most one block per step joins the window (see the docstring)."""
        B = cfg.block_size
        nxt = req.active[-1] + 1 if req.active else req.final // B
        if nxt * B >= req.limit:
            return []
        if self.eos_ids.intersection(req.tokens[req.prompt_len : nxt * B]):
            return []
        if cfg.schedule == "diffulex":
            stored = max(req.cached, req.first)  # TO_CACHE prompt blocks hold no slot
            if len(req.active) + (req.final - stored) // B >= cfg.buffer_size:
                return []
            if req.active or req.final > stored:  # the newest valid block: ACTIVE, else TO_CACHE
                if self.progress(req, nxt - 1, B) < cfg.add_block_threshold:
                    return []
            elif req.cached < req.final:  # no valid block: only once every block is IN_CACHE
                return []
        elif req.active and (len(req.active) >= cfg.buffer_size or self.progress(req, req.active[-1], B) < cfg.add_block_threshold):
            return []
        req.active.append(nxt)
        return [nxt]

    def step(self, req: BlockRequest, cfg: DecodeConfig) -> Step:
        """The forward: the uncached final prefix (TO_CACHE), the ACTIVE blocks, the placeholders;
        reads the masked positions of the ACTIVE blocks."""
        B = cfg.block_size
        req.progress = {b: self.progress(req, b, B) for b in req.active}
        blocks = [
            b for i, b in enumerate(req.active)
            if not (cfg.skip_masked_blocks and i > 0 and req.progress[b] == 0.0)
        ]
        prefill = req.forwards == 0
        if not cfg.skip_masked_blocks and not (prefill and cfg.schedule == "diffulex"):
            used = len(req.active) + ((req.final - max(req.cached, req.first)) // B if cfg.schedule == "diffulex" else 0)
            newest = req.active[-1] if req.active else req.final // B - 1
            blocks += range(newest + 1, newest + 1 + cfg.buffer_size - used)
        start = req.cached if cfg.use_cache else 0
        queries = list(range(start, req.final))
        for b in blocks:
            queries += range(b * B, (b + 1) * B)
        computed = set(blocks)
        reads = [
            (b, p) for b in req.active if b in computed
            for p in range(b * B, (b + 1) * B) if req.tokens[p] == self.mask_id
        ]
        return Step(queries, reads, req.final)

    def commit(self, req: BlockRequest, reads: Reads, cfg: DecodeConfig) -> list[tuple[int, int]]:
        """The sampler: threshold, else the step's transfer count of most confident positions when
        the predecessor is semi-complete or final."""
        committed = []
        for i, b in enumerate(req.active):
            candidates = reads.get(b)
            if not candidates:
                continue
            step = req.block_steps.get(b, 0)
            req.block_steps[b] = step + 1
            chosen = [(p, t) for p, c, t in candidates if c > cfg.accept_threshold]
            fallback = i == 0 or req.progress[req.active[i - 1]] >= cfg.semi_complete_threshold
            count = self.transfer_count(step, cfg)
            if len(chosen) < count and fallback:
                ranked = sorted(candidates, key=lambda pct: -pct[1])[:count]  # stable: ties go to the earlier position
                chosen = sorted((p, t) for p, _, t in ranked)
            for p, t in chosen:
                req.tokens[p] = t
            committed += chosen
        return committed

    def retire(self, req: BlockRequest, cfg: DecodeConfig) -> list[int]:
        """Cache entry, front to back (complete blocks behind final ones become final), then the
        finishing rule of the schedule."""
        B = cfg.block_size
        newly = []
        while req.active and self.mask_id not in req.tokens[req.active[0] * B : (req.active[0] + 1) * B]:
            newly.append(req.active.pop(0))
            req.final += B
        answer = req.tokens[req.prompt_len : req.limit]
        if cfg.schedule == "diffulex":
            nxt = req.active[-1] + 1 if req.active else req.final // B
            closed = nxt * B >= req.limit or self.eos_ids.intersection(answer[: nxt * B - req.prompt_len])
            if closed and not req.active and req.cached == req.final:
                self.finish(req, answer)
        else:
            end = answer.index(self.mask_id) if self.mask_id in answer else len(answer)
            if end == len(answer) or self.eos_ids.intersection(answer[:end]):
                self.finish(req, answer[:end])
        return newly

    # -- helpers the life cycle shares ------------------------------------------------------

    def transfer_count(self, step: int, cfg: DecodeConfig) -> int:
        """The fewest positions a block's ``step``-th forward commits when the fallback applies: 1,
        or LLaDA2.0's schedule, whose official ``generate`` runs ``min(B, gen_length)`` steps per
        block and splits the block evenly over them (the first ``B % steps`` steps one more)."""
        if self.checkpoint.config.get("model_type") != "llada2_moe" or cfg.max_new_tokens >= cfg.block_size:
            return 1
        base, extra = divmod(cfg.block_size, cfg.max_new_tokens)
        return base + (step < extra)

    def progress(self, req: BlockRequest, block: int, block_size: int) -> float:
        """The block's resolved fraction."""
        span = req.tokens[block * block_size : (block + 1) * block_size]
        return 1.0 - span.count(self.mask_id) / block_size

    def finish(self, req: BlockRequest, answer: Sequence[int]) -> None:
        """End the request with ``answer`` cut after its first EOS ("eos"), else whole ("length")."""
        req.result, eos = cut_at_eos(answer, self.eos_ids)
        req.finish_reason = "eos" if eos else "length"

    def settled(self, req: BlockRequest, cfg: DecodeConfig) -> int:
        """The end of the answer prefix that can no longer change: resolved positions up to the first MASK."""
        answer = req.tokens[req.prompt_len : req.limit]
        return req.prompt_len + (answer.index(self.mask_id) if self.mask_id in answer else len(answer))

    def stop_at_string(self, req: BlockRequest, stop: Sequence[str], cfg) -> None:
        """End the request at the first stop string in its output, or (still running) in its
        settled answer prefix cut after an EOS: the output becomes the shortest token prefix whose
        text holds the stop string, and the finish reason "stop"."""
        if req.result is None:
            answer, _ = cut_at_eos(req.tokens[req.prompt_len : self.settled(req, cfg)], self.eos_ids)
        else:
            answer = req.result
        text = self._text(answer)
        _, hit = cut_at_stop(text, stop)
        if not hit:
            return
        n = next(n for n in range(1, len(answer) + 1) if cut_at_stop(self._text(answer[:n]), stop)[1])
        req.result, req.finish_reason = answer[:n], "stop"

    def _text(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode([t for t in ids if t not in self.eos_ids], skip_special_tokens=False)

    def output_text(self, state, prompt: Prompt) -> str:
        """The text of a finished request's (or branch's) output; at a stop string, the text before it."""
        text = self._text(state.result or [])
        return cut_at_stop(text, prompt.stop)[0] if state.finish_reason == "stop" else text

    # -- model calls ------------------------------------------------------------------------

    def _forward(self, running, steps: Sequence[Step], rows: "KVRows", block_size: int):
        width = max(len(s.queries) for s in steps)
        lengths = torch.tensor([len(s.queries) for s in steps])
        q_pos = torch.tensor([s.queries + [0] * (width - len(s.queries)) for s in steps])
        q_valid = torch.arange(width)[None, :] < lengths[:, None]
        ids = torch.tensor([
            [req.tokens[p] for p in s.queries] + [self.pad_id] * (width - len(s.queries)) for req, s in zip(running, steps)
        ])
        ids, q_pos, q_valid = ids.to(self.device), q_pos.to(self.device), q_valid.to(self.device)
        mask = modeling.block_causal_mask(
            q_pos, torch.cat([rows.pos, q_pos], 1), block_size, self.dtype, torch.cat([rows.valid, q_valid], 1)
        )
        out = self.model.get_decoder()(
            input_ids=ids, attention_mask=mask, position_ids=q_pos, use_cache=True, **{self._cache_kwarg: rows.cache}
        )
        return out.last_hidden_state, q_pos, q_valid

    def _read(self, running, steps: Sequence[Step], hidden) -> list[dict[int, list[tuple[int, float, int]]]]:
        """Per row: {block: [(position, confidence, token)]} at the step's read positions, greedy."""
        rows, cols, where = [], [], []
        for row, s in enumerate(steps):
            if not s.reads:
                continue
            first = s.queries[0]
            contiguous = s.queries[-1] - first + 1 == len(s.queries)
            index = None if contiguous else {p: c for c, p in enumerate(s.queries)}
            for b, p in s.reads:
                rows.append(row), cols.append(p - first if contiguous else index[p]), where.append((row, b, p))
        result: list[dict] = [{} for _ in running]
        if not rows:
            return result
        conf, tok = self.predict(hidden[rows, cols])
        for (row, b, p), c, t in zip(where, conf.tolist(), tok.tolist()):
            result[row].setdefault(b, []).append((p, c, t))
        return result

    def predict(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-1 probability and token per row of ``hidden`` (MASK and padding ids banned), in
        float32 or the model's dtype when wider."""
        logits = self.model.get_output_embeddings()(hidden)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        logits.masked_fill_(self._banned, float("-inf"))
        return logits.softmax(-1).max(-1)

    # -- accounting -------------------------------------------------------------------------

    def count_forward(self, req, n_queries: int, n_keys: int, n_logits: int) -> None:
        """One forward for ``req`` (or a branch): its analytical FLOPs."""
        req.forwards += 1
        req.flops += 2 * self._layer_params * n_queries + 4 * self._attn_width * n_queries * n_keys
        req.flops += self._head_flops * n_logits

    def _generation(self, req: BlockRequest, cfg: DecodeConfig) -> Generation:
        out = req.result or []
        last = req.prompt_len + max(len(out), 1) - 1
        blocks = last // cfg.block_size - req.prompt_len // cfg.block_size + 1
        return Generation(
            text=self.output_text(req, req.prompt),
            tokens=len(out),
            forwards=req.forwards,
            extra={"flops": req.flops, "blocks": float(blocks), **req.extra},
            finish_reason=req.finish_reason,
        )

    def _trace_entry(self, step, req: BlockRequest, plan: Step, admitted, committed, newly_final, stored_to, cfg) -> dict:
        return {
            "step": step,
            "prompt": req.prompt.id,
            "admitted": admitted,
            "stored": [stored_to, req.cached],
            "computed": sorted({p // cfg.block_size for p in plan.queries}),
            "committed": committed,
            "became_final": newly_final,
            "in_flight": [[b, self.progress(req, b, cfg.block_size)] for b in req.active],
            "final": req.final,
            "finished": req.finish_reason,
            **req.log,
        }

    # -- checkpoint metadata ----------------------------------------------------------------

    def _mask_token_id(self, override: int | None) -> int:
        candidates = (override, self.tokenizer.mask_token_id, getattr(self.model.config, "mask_token_id", None))
        for value in candidates:
            if value is not None:
                return int(value)
        raise ValueError(f"{self.path}: no mask token id; pass engine_args.mask_token_id")


class KVRows:
    """A batched ``DynamicCache`` whose rows hold different cached prefixes: ``pos`` / ``valid``
    (batch, columns) give each column's absolute position and whether it is a kept key. A forward
    appends its columns; ``keep`` then keeps, per row, the columns below that row's stored length
    and drops finished rows."""

    compact_below = 0.5  # regather when the kept keys fill less than this share of the columns

    def __init__(self, config, batch: int, device):
        self.cache = DynamicCache(config=config)
        self.pos = torch.zeros(batch, 0, dtype=torch.long, device=device)
        self.valid = torch.zeros(batch, 0, dtype=torch.bool, device=device)
        self._counts: list[int] = [0] * batch

    def width(self, row: int) -> int:
        """The number of kept keys of ``row``."""
        return self._counts[row]

    def keep(self, q_pos, q_valid, store: Sequence[int], keep_rows: Sequence[int]) -> None:
        """After a forward: keep the new columns below each row's ``store`` and the rows ``keep_rows``.

        A row's stored columns are a prefix of its queries, so the cache keeps the first ``m`` new
        columns (``m`` = the most any row stored) with ``crop`` and marks the rest of each row's
        invalid; finished rows leave with one batch index. Only when the kept keys fill less than
        ``compact_below`` of the columns is each row's cache regathered, left-padded, into the
        width it needs."""
        stored = q_valid & (q_pos < torch.tensor(list(store), device=q_pos.device)[:, None])
        new = stored.sum(1)
        m = int(new.max()) if new.numel() else 0
        self.cache.crop(self.pos.shape[1] + m - self.cache.get_seq_length())  # a count <= 0: drop the rest
        self.pos, self.valid = torch.cat([self.pos, q_pos[:, :m]], 1), torch.cat([self.valid, stored[:, :m]], 1)
        counts = [c + n for c, n in zip(self._counts, new.tolist())]
        if len(keep_rows) < self.pos.shape[0]:
            rows = torch.tensor(list(keep_rows), dtype=torch.long, device=q_pos.device)
            for layer in self.cache.layers:
                if layer.is_initialized:
                    layer.keys, layer.values = layer.keys[rows], layer.values[rows]
            self.pos, self.valid = self.pos[rows], self.valid[rows]
            counts = [counts[r] for r in keep_rows]
        self._counts = counts
        if counts and sum(counts) < self.compact_below * len(counts) * self.pos.shape[1]:
            self._compact()

    def _compact(self) -> None:
        """Regather every row's valid columns, left-padded, into the width the widest row needs."""
        width = max(self._counts)
        order = torch.argsort(self.valid.to(torch.int8), dim=1, stable=True)[:, self.valid.shape[1] - width :]
        batch = torch.arange(order.shape[0], device=order.device)[:, None]
        for layer in self.cache.layers:
            if layer.is_initialized:  # (batch, heads, columns, dim): pick whole head rows per column
                layer.keys = layer.keys.transpose(1, 2)[batch, order].transpose(1, 2)
                layer.values = layer.values.transpose(1, 2)[batch, order].transpose(1, 2)
        self.pos, self.valid = self.pos.gather(1, order), self.valid.gather(1, order)

    def copy_row(self, dst: int, src: int) -> None:
        """Row ``dst`` becomes a copy of row ``src`` (keys, values, positions, validity)."""
        for layer in self.cache.layers:
            layer.keys[dst], layer.values[dst] = layer.keys[src], layer.values[src]
        self.pos[dst], self.valid[dst] = self.pos[src], self.valid[src]
        self._counts[dst] = self._counts[src]

    def forget(self, rows: Sequence[bool]) -> None:
        """Mark every kept column of the flagged rows invalid (a recompute from scratch follows)."""
        fresh = torch.tensor(list(rows), device=self.pos.device)
        self.valid = self.valid & ~fresh[:, None]
        self._counts = [0 if f else c for f, c in zip(rows, self._counts)]
