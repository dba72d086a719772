"""The BlockBatch engine: one request decoded by several branches of different block sizes.

BlockBatch ("Multi-Scale Consensus Decoding", engines.md section 6) for block-diffusion models
with an exact block-causal cache. A request runs as one *branch* per entry of ``block_sizes``;
the branches of all requests of a ``generate`` call are the rows of one batched forward per step
(finished requests leave the batch). Greedy and deterministic.

A branch is a single-block decoder with its own tokens, its current block ``[start, end)``
(``[0, start)`` is final), and its own cache row holding the K/V of ``[0, cached)``. Blocks lie on
the branch's own grid from position 0 (block ``p // B``; the prompt's last partial block is
completed by generated tokens, and a block opened after a sync ends at the next multiple of B).
Every position carries a block id (its block's start position) and the attention mask compares
ids (``modeling.block_mask``), so rows of different block sizes, and branches that continue from
a leader's blocks, share one forward. A branch follows the block life cycle of
``engines.block_diffusion.BlockLifecycle``: ``admit`` opens its next block, ``step`` names what
its row computes and reads, ``commit`` applies the per-branch rule, ``retire`` makes a complete
block final and ends the branch. One engine step, per request:

1. **Forward.** Each branch computes ``[cached, end)``: the block that became final in the
   previous step (its K/V enter the cache in this forward, the "folded store"; the first forward
   is the prefill of the prompt's complete blocks, on every row), then its current block.
2. **Commit** (paper). Each branch commits every masked position of its current block whose top-1
   probability exceeds ``accept_threshold``, else its single most confident one (Fast-dLLM's
   rule), and keeps its *proposals*: at each position it read, the tokens it gives a probability
   above ``proposal_threshold``.
3. **Merge** (paper), destinations furthest ahead first (most decoded answer positions; ties:
   branch order). A destination's sources are the branches strictly behind it that are
   *compatible* (the same token wherever both are decoded). Each still-masked position of the
   destination's current block takes, among the sources' proposals there, the token the
   destination rates highest in this step's forward, if the destination's probability of it
   exceeds ``merge_threshold``; a source it then contradicts offers nothing more.
4. **End** (paper). A branch ends when its current block is fully decoded and holds an EOS, or
   it has decoded every position up to the length limit. The request ends when a branch ends:
   among the branches ending with an EOS, the one that gave its EOS the highest probability
   wins (ties: branch order), else the branch with the most progress. Its tokens are the output.
5. **Sync** (paper). The leader is the branch with the most decoded answer positions (ties: branch
   order). A branch more than ``sync_lag`` positions behind takes the leader's tokens, block ids,
   current block, cached length and cache row, and goes on with its own block size.
6. **Refresh** (paper). Each time a request's leader has decoded ``refresh_interval`` more
   positions (0: never), one extra batched forward, shared by the requests due in this step,
   recomputes each of their branches' ``[0, end)`` from scratch, replaces its cache row, and
   commits in its current block again by the rule of step 2; then step 4 (rows of requests not
   due compute nothing and are not counted). With this engine's exact cache the recomputed K/V
   equal the cached ones: a refresh costs a forward and acts as one more commit step.

Our choices where the paper's description leaves one open, or where its LLaDA setting differs:
the prefill runs on every row (blocks of different sizes give the prompt different K/V under a
block-causal mask, so one row's prefill cannot be copied exactly), "behind" is strictly fewer
decoded positions, a branch that reaches the length limit ends the run at once (none can make
more progress), a refresh commits but does not merge or sync, and a sync copies the leader's
cache row instead of recomputing it. Confidences are float32 softmax probabilities of the
unfiltered logits; the MASK id and ids beyond the tokenizer's vocabulary are never predicted.
With one branch, merges and syncs never happen and the engine decodes as single-block threshold
decoding (``block_diffusion`` with ``schedule: eager`` and ``buffer_size: 1``) except that a block
holding an EOS is decoded to its end. A prompt's stop strings end a branch at the first one in
its resolved answer prefix.

Counting (see ``engines.base``): ``forwards`` = the batched forwards the request took part in, as
the request experiences them: each step's forward counts 1 and each refresh forward 1, however
many branch rows they hold (the paper's NFE, the winner's own forwards, counts the same).
``tokens`` = the winner's generated tokens up to and including the first EOS. ``extra``:
``row_forwards`` (the rows computed for the request: the compute that the batch hides),
``merges`` (positions filled by merging), ``syncs``, ``refreshes``, ``flops`` (analytical, over
all the request's rows), ``blocks`` (blocks spanned by the output) and ``block_size`` (the
winning branch's).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch

from pytest_redline.contracts import Generation, Prompt, Step
from pytest_redline.engines import modeling
from pytest_redline.engines.block_diffusion import BlockDiffusionEngine, KVRows
from pytest_redline.engines.common import encode
from pytest_redline.engines.diffusion_spec import BatchConfig, BlockBatchSpec

@dataclass
class Branch:
    """One branch: a single-block decoder of the request with its own block size and cache row."""

    size: int  # block size of the blocks this branch opens
    tokens: list[int]  # prompt, then generated positions (MASK until committed)
    blocks: list[int]  # block id of every position: the start position of its block
    start: int  # current block [start, end); [0, start) is final (start == end: none open)
    end: int
    cached: int  # positions whose K/V are in the branch's cache row (a prefix of [0, start])
    prompt_len: int
    limit: int  # prompt_len + max_new_tokens
    forwards: int = 0  # rows computed for this branch (its row-forwards)
    flops: float = 0.0
    eos_prob: float = 0.0  # the probability the branch gave its first EOS when it was placed
    proposals: dict[int, list[int]] = field(default_factory=dict)  # position -> tokens above the proposal cut
    result: list[int] | None = None
    finish_reason: str | None = None

    def follow(self, leader: "Branch") -> None:
        """Take the leader's decoding state (not its block size or counters)."""
        self.tokens, self.blocks = list(leader.tokens), list(leader.blocks)
        self.start, self.end, self.cached, self.eos_prob = leader.start, leader.end, leader.cached, leader.eos_prob


@dataclass
class BranchedRequest:
    prompt: Prompt
    branches: list[Branch]
    forwards: int = 0  # batched forwards (steps and refreshes)
    merges: int = 0
    syncs: int = 0
    refreshes: int = 0
    refreshed_at: int = 0  # the leader's decoded positions at the last refresh
    winner: Branch | None = None


class BlockBatchEngine(BlockBatchSpec, BlockDiffusionEngine):
    """``BlockBatchEngine(model=PATH, device="auto", dtype="auto", mask_token_id=None,
    trust_remote_code=False, trace=None, threads=None)``; the model defaults to the embedded bd-tiny.
    ``threads`` sets torch's intra-op threads (see ``common.set_threads``)."""

    refresh_from_scratch = True  # False: a refresh reuses the cache (the law that it is exact)

    # -- decoding ---------------------------------------------------------------------------

    @torch.no_grad()
    def decode(self, prompts: Sequence[Prompt], config: Mapping[str, Any], record: bool = False):
        """Decode ``prompts`` as one batch; returns ``(generations, trace)``. The trace (empty unless
        ``record``) has one entry per request and step: its branches' commits, merges, syncs,
        whether it was refreshed, and the winner's branch index once it finished."""
        cfg = self.Config.from_params(config)
        n = len(cfg.block_sizes)
        requests = [self.new_request(p, cfg) for p in prompts]
        running = list(requests)
        rows = KVRows(self.model.config, len(running) * n, self.device)
        trace: list[dict] = []
        step = 0
        while running:
            branches = [br for req in running for br in req.branches]  # request r's branches: rows r*n ...
            for br in branches:
                self.admit(br, cfg)
            committed, probs, index, q = self._step_rows(branches, [self.step(br, cfg) for br in branches], rows, cfg)
            entries = []
            for r, req in enumerate(running):
                req.forwards += 1
                merged = self._merge(req, probs, index, r * n, cfg)
                req.merges += len(merged)
                self._end(req, cfg)
                entries.append({
                    "step": step, "prompt": req.prompt.id, "committed": committed[r * n : (r + 1) * n], "merged": merged,
                    "synced": [], "refreshed": False, "winner": self._winner_index(req),
                })
            if record:
                trace += entries
            running, entries = self._keep_running(running, entries, rows, q, n)
            for r, (req, entry) in enumerate(zip(running, entries)):
                entry["synced"] = self._sync(req, r * n, rows, cfg)
                req.syncs += len(entry["synced"])
            due = [self._refresh_due(req, cfg) for req in running]
            if any(due):
                q = self._refresh(running, due, rows, cfg)
                for req, entry, refreshed in zip(running, entries, due):
                    entry["refreshed"], entry["winner"] = refreshed, self._winner_index(req)
                running, entries = self._keep_running(running, entries, rows, q, n)
            step += 1
        return [self._request_generation(req, cfg) for req in requests], trace

    def _keep_running(self, running, entries, rows: KVRows, q, n: int):
        """After a forward: keep each row's stored columns and the requests without a winner."""
        keep = [r for r, req in enumerate(running) if req.winner is None]
        rows.keep(*q, [br.cached for req in running for br in req.branches], [r * n + b for r in keep for b in range(n)])
        return [running[r] for r in keep], [entries[r] for r in keep]

    @staticmethod
    def _winner_index(req: BranchedRequest) -> int | None:
        return None if req.winner is None else req.branches.index(req.winner)

    def new_request(self, prompt: Prompt, cfg: BatchConfig) -> BranchedRequest:
        ids = encode(self.tokenizer, prompt, self.name)
        limit = len(ids) + cfg.max_new_tokens
        length = limit + max(cfg.block_sizes)  # every block starts before the limit
        tokens = ids + [self.mask_id] * (length - len(ids))
        branches = []
        for size in cfg.block_sizes:
            start = len(ids) // size * size
            grid = [p // size * size for p in range(length)]
            branches.append(Branch(size, list(tokens), grid, start, start + size, 0, len(ids), limit))
        return BranchedRequest(prompt=prompt, branches=branches)

    # -- a branch's block life cycle ----------------------------------------------------------

    def admit(self, br: Branch, cfg: BatchConfig) -> list[int]:
        """Open the next block, all MASK, ending on the branch's own grid, once none is open."""
        if br.start < br.end:
            return []
        br.end = (br.start // br.size + 1) * br.size
        br.blocks[br.start : br.end] = [br.start] * (br.end - br.start)
        return [br.start]

    def step(self, br: Branch, cfg: BatchConfig) -> Step:
        """The row computes the uncached final prefix and the current block; reads its masked positions."""
        reads = [(br.start, p) for p in range(br.start, br.end) if br.tokens[p] == self.mask_id]
        return Step(list(range(br.cached, br.end)), reads, br.start)

    def commit(self, br: Branch, reads, cfg: BatchConfig) -> list[tuple[int, int]]:
        """Fast-dLLM's rule on the current block's ``(position, confidence, token)`` reads: every one
        above ``accept_threshold``, else the most confident (the first on ties)."""
        candidates = reads.get(br.start, [])
        if not candidates:
            return []
        passed = [(p, c, t) for p, c, t in candidates if c > cfg.accept_threshold]
        chosen = passed or [max(candidates, key=lambda pct: pct[1])]
        for p, c, t in chosen:
            self._place(br, p, t, c)
        return [(p, t) for p, _, t in chosen]

    def retire(self, br: Branch, cfg: BatchConfig) -> list[int]:
        """A complete current block becomes final; the branch ends when it held an EOS or reached the limit."""
        if self.mask_id in br.tokens[br.start : br.end]:
            return []
        block, br.start = br.start, br.end
        answer = br.tokens[br.prompt_len : br.limit]
        if self.eos_ids.intersection(br.tokens[br.prompt_len : br.start]) or br.start >= br.limit:
            self.finish(br, answer)
        return [block]

    # -- model calls ------------------------------------------------------------------------

    def _step_rows(self, branches: list[Branch], steps: list[Step], rows: KVRows, cfg: BatchConfig):
        """One batched forward over the branches' steps, counted per row; commits every row;
        returns ``(commits per row, probabilities at the reads, {(row, position): index}, (q_pos, q_valid))``;
        rows that compute nothing are neither counted nor committed."""
        hidden, q_pos, q_valid = self._forward_rows(branches, steps, rows)
        index, row_of, column = {}, [], []
        for row, s in enumerate(steps):
            for _, p in s.reads:
                index[row, p] = len(row_of)
                row_of.append(row), column.append(p - s.queries[0])
        logits = self.model.get_output_embeddings()(hidden[row_of, column]).float()
        probs = logits.masked_fill_(self._banned, float("-inf")).softmax(-1)
        confidence, top = (t.tolist() for t in probs.max(-1))
        proposals = (probs > cfg.proposal_threshold).nonzero().tolist()
        committed = []
        for row, (br, s) in enumerate(zip(branches, steps)):
            if not s.queries:
                committed.append([])
                continue
            self.count_forward(br, len(s.queries), rows.width(row) + len(s.queries), len(s.reads))
            br.cached = s.store
            br.proposals = {}
            reads = {br.start: [(p, confidence[index[row, p]], top[index[row, p]]) for _, p in s.reads]}
            committed.append(self.commit(br, reads, cfg))
        at = {i: (row, p) for (row, p), i in index.items()}
        for i, t in proposals:
            row, p = at[i]
            branches[row].proposals.setdefault(p, []).append(t)
        return committed, probs, index, (q_pos, q_valid)

    def _forward_rows(self, branches: list[Branch], steps: list[Step], rows: KVRows):
        """One batched forward: row i computes ``steps[i].queries`` of ``branches[i]`` (right-padded
        with pad ids at position 0) after its cache columns. A query attends a valid key whose
        block id is at most its own. Returns ``(hidden, q_pos, q_valid)``."""
        lo = torch.tensor([s.queries[0] if s.queries else 0 for s in steps])
        count = torch.tensor([len(s.queries) for s in steps])
        offset = torch.arange(max(int(count.max()), 1))
        q_valid = offset[None, :] < count[:, None]
        q_pos = torch.where(q_valid, lo[:, None] + offset[None, :], 0)
        length = max(len(br.tokens) for br in branches)
        tokens = torch.tensor([br.tokens + [self.pad_id] * (length - len(br.tokens)) for br in branches])
        blocks = torch.tensor([br.blocks + [0] * (length - len(br.blocks)) for br in branches])
        ids = torch.where(q_valid, tokens.gather(1, q_pos), self.pad_id)
        ids, q_pos, q_valid, blocks = (t.to(self.device) for t in (ids, q_pos, q_valid, blocks))
        mask = modeling.block_mask(
            blocks.gather(1, q_pos), blocks.gather(1, torch.cat([rows.pos, q_pos], 1)), self.dtype,
            torch.cat([rows.valid, q_valid], 1),
        )
        out = self.model.get_decoder()(
            input_ids=ids, attention_mask=mask, position_ids=q_pos, use_cache=True, **{self._cache_kwarg: rows.cache}
        )
        return out.last_hidden_state, q_pos, q_valid

    # -- rules: merge, end, sync, refresh -------------------------------------------------------

    def _place(self, br: Branch, position: int, token: int, prob: float) -> None:
        """Write ``token`` at ``position``, recording its probability if it is the branch's first EOS."""
        br.tokens[position] = token
        if token in self.eos_ids and not self.eos_ids.intersection(br.tokens[br.prompt_len : position]):
            br.eos_prob = prob

    def _decoded(self, br: Branch) -> int:
        """Resolved answer positions (up to the length limit)."""
        return br.limit - br.prompt_len - br.tokens[br.prompt_len : br.limit].count(self.mask_id)

    def _leader(self, req: BranchedRequest) -> int:
        """The branch index with the most decoded answer positions; ties: the first."""
        decoded = [self._decoded(br) for br in req.branches]
        return decoded.index(max(decoded))

    def _compatible(self, a: Branch, b: Branch) -> bool:
        """Whether two branches hold the same token wherever both are decoded."""
        lo, hi = a.prompt_len, max(a.end, b.end)
        return all(x == y or self.mask_id in (x, y) for x, y in zip(a.tokens[lo:hi], b.tokens[lo:hi]))

    def _merge(self, req: BranchedRequest, probs, index, first_row: int, cfg: BatchConfig) -> list[tuple[int, int, int, float]]:
        """Confidence-gated merging (rule 3); returns ``(branch, position, token, probability)``
        per filled position; ``probs[index[row, position]]`` is the row's distribution there."""
        merged = []
        decoded = [self._decoded(br) for br in req.branches]
        order = sorted(range(len(req.branches)), key=lambda b: -decoded[b])
        for d in order:
            dst = req.branches[d]
            sources = [src for s, src in enumerate(req.branches) if decoded[s] < decoded[d] and self._compatible(dst, src)]
            for p in range(dst.start, dst.end):
                offers = sorted({t for src in sources for t in src.proposals.get(p, ())})
                if dst.tokens[p] != self.mask_id or not offers or (first_row + d, p) not in index:
                    continue
                rated = probs[index[first_row + d, p], offers].tolist()
                prob = max(rated)
                token = offers[rated.index(prob)]
                if prob > cfg.merge_threshold:
                    self._place(dst, p, token, prob)
                    merged.append((d, p, token, prob))
                    sources = [src for src in sources if src.tokens[p] in (self.mask_id, token)]
        return merged

    def _end(self, req: BranchedRequest, cfg: BatchConfig) -> None:
        """Rule 4 and stop strings: retire complete blocks; the request ends when a branch ends."""
        for br in req.branches:
            self.retire(br, cfg)
            if req.prompt.stop:
                self.stop_at_string(br, req.prompt.stop, cfg)
        ended = [br for br in req.branches if br.result is not None]
        if not ended:
            return
        eos = [br for br in ended if br.finish_reason == "eos"]
        req.winner = max(eos, key=lambda br: br.eos_prob) if eos else max(ended, key=self._decoded)

    def _sync(self, req: BranchedRequest, first_row: int, rows: KVRows, cfg: BatchConfig) -> list[tuple[int, int]]:
        """Leader sync (rule 5), cache rows included; returns ``(follower, leader)`` branch indices."""
        lead = self._leader(req)
        ahead = self._decoded(req.branches[lead])
        synced = []
        for b, br in enumerate(req.branches):
            if ahead - self._decoded(br) > cfg.sync_lag:
                br.follow(req.branches[lead])
                rows.copy_row(first_row + b, first_row + lead)
                synced.append((b, lead))
        return synced

    def _refresh_due(self, req: BranchedRequest, cfg: BatchConfig) -> bool:
        """Whether the leader decoded ``refresh_interval`` positions since the last refresh (and
        something is cached to recompute); marks the refresh as done."""
        decoded = self._decoded(req.branches[self._leader(req)])
        if not cfg.refresh_interval or decoded - req.refreshed_at < cfg.refresh_interval:
            return False
        req.refreshed_at = decoded
        return any(br.cached for br in req.branches)

    def _refresh(self, running: list[BranchedRequest], due: list[bool], rows: KVRows, cfg: BatchConfig):
        """Rule 6: one batched forward recomputing ``[0, end)`` of every branch of the due requests
        from scratch (their cache rows are forgotten first), committing in the current blocks, then
        rule 4; the other rows compute nothing. Returns the forward's ``(q_pos, q_valid)``."""
        n = len(running[0].branches)
        branches = [br for req in running for br in req.branches]
        fresh = [due[row // n] for row in range(len(branches))]
        if self.refresh_from_scratch:
            rows.forget(fresh)
        steps = []
        for br, f in zip(branches, fresh):
            if not f:
                steps.append(Step([], [], br.cached))
                continue
            self.admit(br, cfg)
            s = self.step(br, cfg)
            steps.append(Step(list(range(0 if self.refresh_from_scratch else br.cached, br.end)), s.reads, s.store))
        q = self._step_rows(branches, steps, rows, cfg)[3]
        for req, d in zip(running, due):
            if d:
                req.forwards += 1
                req.refreshes += 1
                self._end(req, cfg)
        return q

    # -- accounting -------------------------------------------------------------------------

    def _request_generation(self, req: BranchedRequest, cfg: BatchConfig) -> Generation:
        win = req.winner
        out = win.result or []
        return Generation(
            text=self.output_text(win, req.prompt),
            tokens=len(out),
            forwards=req.forwards,
            extra={
                "row_forwards": float(sum(br.forwards for br in req.branches)),
                "merges": float(req.merges),
                "syncs": float(req.syncs),
                "refreshes": float(req.refreshes),
                "flops": sum(br.flops for br in req.branches),
                "blocks": float(len(set(win.blocks[win.prompt_len : win.prompt_len + max(len(out), 1)]))),
                "block_size": float(win.size),
            },
            finish_reason=win.finish_reason,
        )
