"""The BlockBatch engine: one request decoded by several branches of different block sizes.

Our version of BlockBatch ("Multi-Scale Consensus Decoding", reference systems section 6) for
block-diffusion models with an exact block-causal cache. A request runs as one *branch* per
entry of ``block_sizes``; the branches of all requests of a ``generate`` call are the rows of
one batched forward per step (finished requests leave the batch). Greedy and deterministic.

A branch is the multi-block engine with one block in flight (``engines.block_diffusion`` with
``buffer_size = 1``): its own tokens, its current block ``[start, end)`` (``[0, start)`` is
final), and its own cache row holding the K/V of ``[0, cached)``. Blocks lie on the branch's own
grid from position 0 (block ``p // B``; the prompt's last partial block is completed by generated
tokens, and a block opened after a sync ends at the next multiple of B). Every position carries
a block id (its block's start position) and the attention mask compares ids (a query attends a
key of the same or an earlier block: ``modeling.block_mask``), so rows of different block sizes,
and branches that continue from a leader's blocks, share one forward. One engine step:

1. **Forward.** Each branch computes ``[cached, end)``: the block that became final in the
   previous step (its K/V enter the cache in this forward, the "folded store"; the first forward
   is the prefill of the prompt's complete blocks), then its current block.
2. **Commit.** Each branch commits every masked position of its current block whose top-1
   probability exceeds ``accept_threshold``, or else its single most confident one (Fast-dLLM's
   rule), so every branch commits at least one token per step.
3. **Merge**, destinations in order of decoded answer positions (most first; ties: branch
   order). Branches are *compatible* when they hold the same token wherever both are decoded.
   Each still-masked position of the destination's current block takes, among the tokens that
   compatible branches hold there, the one the destination rates highest in this step's forward,
   if the destination's probability of it exceeds ``merge_threshold``. A merge never fills a
   decoded position and never inserts a token the destination's own probability rejects.
4. **Finish.** A branch finishes when it has committed an EOS with every earlier position
   resolved, or resolved every position up to the length limit. The request ends when a branch
   finishes; among branches finishing in the same step the first in ``block_sizes`` order wins,
   and its tokens are the output. Otherwise each branch with a complete current block opens its
   next block, all MASK.
5. **Sync.** The leader is the branch with the most decoded answer positions (ties: branch
   order). A branch more than ``sync_lag`` positions behind takes the leader's tokens, block ids,
   current block, cached length and cache row: its state equals the leader's, and it goes on
   with its own block size after the leader's current block.
6. **Refresh.** Each time a request's leader has decoded ``refresh_interval`` more positions
   (0: never), one extra batched forward, shared by the requests due in this step, recomputes
   each of their branches' cached prefix ``[0, cached)`` from scratch and replaces its cache row
   (it reads no logits and commits nothing; the rows of requests not due compute nothing and
   are not counted; a request with nothing cached skips it). With this engine's exact
   block-causal cache this recomputes the same K/V (outputs are unchanged; only forwards grow):
   it exists for BlockBatch's approximate Fast-dLLM caches, whose stale K/V the refresh repairs.

Confidences are float32 softmax probabilities of the unfiltered logits; the MASK id and ids
beyond the tokenizer's vocabulary are never predicted. With one branch, merges and syncs never
happen and the engine decodes as ``block_diffusion`` with ``buffer_size = 1``, token for token.

Counting (see ``engines.base``): ``forwards`` = the batched forwards the request took part in, as
the request experiences them: each step's forward counts 1 and each refresh forward 1, however
many branch rows they hold. (The NFE the BlockBatch paper reports, the winner's own forwards,
counts the same batched forwards and hides the rows too.) ``tokens`` = the winner's generated
tokens up to and including the first EOS. ``extra``: ``row_forwards`` (the rows computed for the
request: the sum over its forwards of its branch rows, the compute that the batch hides), ``merges`` (positions filled by merging), ``syncs``,
``refreshes``, ``flops`` (analytical, over all the request's rows, as in ``block_diffusion``),
``blocks`` (blocks spanned by the output) and ``block_size`` (the winning branch's).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch
from transformers import DynamicCache

from pytest_redline.engines import modeling
from pytest_redline.engines.autoregressive import encode
from pytest_redline.engines.base import Generation
from pytest_redline.engines.block_diffusion import BlockDiffusionEngine, check_params
from pytest_redline.suites.base import Prompt

DEFAULTS: dict[str, Any] = {
    "block_sizes": [4, 8, 16],  # one branch each (the paper evaluates 4-8-16-32-64)
    "accept_threshold": 0.9,  # per-branch commit: top-1 probability above this, else the top-1
    "merge_threshold": 0.5,  # a destination takes a merged token only above this probability
    "sync_lag": 8,  # a branch more than this many positions behind the leader copies it
    "refresh_interval": 0,  # leader positions between full cache refreshes; 0: never (paper: 32)
    "max_new_tokens": 96,
}


@dataclass(frozen=True)
class BatchConfig:
    block_sizes: tuple[int, ...]
    accept_threshold: float
    merge_threshold: float
    sync_lag: int
    refresh_interval: int
    max_new_tokens: int

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> "BatchConfig":
        values = modeling.with_defaults("blockbatch", params, DEFAULTS)
        sizes = values["block_sizes"]
        if (
            not isinstance(sizes, (list, tuple)) or not sizes or len(set(sizes)) != len(sizes)
            or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in sizes)
        ):
            raise ValueError(f"blockbatch: block_sizes: expected a non-empty list of distinct ints >= 1, got {sizes!r}")
        check_params(
            "blockbatch", values,
            ints={"sync_lag": 0, "refresh_interval": 0, "max_new_tokens": 1},
            numbers=("accept_threshold", "merge_threshold"),
        )
        return cls(**{**values, "block_sizes": tuple(sizes)})


@dataclass
class Branch:
    """One branch: a single-block decoder of the request with its own block size and cache row."""

    size: int  # block size of the blocks this branch opens
    tokens: list[int]  # prompt, then generated positions (MASK until committed)
    blocks: list[int]  # block id of every position: the start position of its block
    start: int  # current block [start, end); [0, start) is final
    end: int
    cached: int  # positions whose K/V are in the branch's cache row (a prefix of [0, start])
    prompt_len: int
    limit: int  # prompt_len + max_new_tokens
    forwards: int = 0  # rows computed for this branch (its row-forwards)
    flops: float = 0.0
    result: list[int] | None = None

    def follow(self, leader: "Branch") -> None:
        """Take the leader's decoding state (not its block size or counters)."""
        self.tokens, self.blocks = list(leader.tokens), list(leader.blocks)
        self.start, self.end, self.cached = leader.start, leader.end, leader.cached


@dataclass
class Request:
    prompt: Prompt
    branches: list[Branch]
    forwards: int = 0  # batched forwards (steps and refreshes)
    merges: int = 0
    syncs: int = 0
    refreshes: int = 0
    refreshed_at: int = 0  # the leader's decoded positions at the last refresh
    winner: Branch | None = None


class BlockBatchEngine(BlockDiffusionEngine):
    """``BlockBatchEngine(model=PATH, device="auto", dtype="auto", mask_token_id=None,
    trust_remote_code=False, trace=None, threads=None)``; the model defaults to the embedded bd-tiny.
    ``threads`` sets torch's intra-op threads (see ``autoregressive.set_threads``)."""

    name = "blockbatch"

    def _decode_config(self, config: Mapping[str, Any]) -> BatchConfig:
        return BatchConfig.from_params(config)

    # -- decoding ---------------------------------------------------------------------------

    @torch.no_grad()
    def decode(self, prompts: Sequence[Prompt], config: Mapping[str, Any], record: bool = False):
        """Decode ``prompts`` as one batch; returns ``(generations, trace)``. The trace (empty unless
        ``record``) has one entry per request and step: its branches' commits, merges, syncs,
        whether it was refreshed, and the winner's branch index once it finished."""
        cfg = self._decode_config(config)
        n = len(cfg.block_sizes)
        requests = [self._new_request(p, cfg) for p in prompts]
        running = list(requests)
        cache = DynamicCache(config=self.model.config)
        k_pos = torch.zeros(len(running) * n, 0, dtype=torch.long, device=self.device)
        k_valid = torch.zeros(len(running) * n, 0, dtype=torch.bool, device=self.device)
        trace: list[dict] = []
        step = 0
        while running:
            rows = [br for req in running for br in req.branches]  # request r's branches: rows r*n ...
            spans = [(br.cached, br.end) for br in rows]
            hidden, q_pos, q_valid = self._forward_rows(rows, spans, cache, k_pos, k_valid)
            probs, index = self._probabilities(rows, spans, hidden)
            committed = self._commit_rows(rows, spans, k_valid, probs, index, cfg)
            store = [br.cached for br in rows]
            ratings = self._ratings(rows, n, probs, index)
            entries = [
                self._settle(req, ratings, r * n, committed[r * n : (r + 1) * n], step, cfg)
                for r, req in enumerate(running)
            ]
            keep = [r for r, req in enumerate(running) if req.winner is None]
            keep_rows = [r * n + b for r in keep for b in range(n)]
            k_pos, k_valid = self._update_cache(cache, k_pos, k_valid, q_pos, q_valid, store, keep_rows)
            if record:
                trace += entries
            running, entries = [running[r] for r in keep], [entries[r] for r in keep]
            for r, (req, entry) in enumerate(zip(running, entries)):
                entry["synced"] = self._sync(req, r * n, cache, k_pos, k_valid, cfg)
                req.syncs += len(entry["synced"])
            due = [self._refresh_due(req, cfg) for req in running]
            if any(due):
                k_pos, k_valid = self._refresh(running, due, cache, k_pos, k_valid)
                for entry, refreshed in zip(entries, due):
                    entry["refreshed"] = refreshed
            step += 1
        return [self._generation(req, cfg) for req in requests], trace

    def _commit_rows(self, rows: list[Branch], spans, k_valid, probs, index, cfg: BatchConfig) -> list[list]:
        """Count the forward for every row (step 1: it wrote ``[cached, start)``), then commit
        (step 2); returns each row's commits ``[(position, token)]``."""
        confidence, top = (t.tolist() for t in probs.max(-1))
        n_cached = k_valid.sum(1).tolist()
        committed = []
        for row, br in enumerate(rows):
            n_queries = spans[row][1] - spans[row][0]
            self._count(br, n_queries, n_cached[row] + n_queries, len(index[row]))
            br.cached = br.start
            committed.append(self._commit_block(br, [(p, confidence[i], top[i]) for p, i in index[row].items()], cfg))
        return committed

    def _settle(self, req: Request, ratings, first_row: int, committed, step: int, cfg: BatchConfig) -> dict:
        """Steps 3 and 4 for one request after its commits: merge, finish, open the next blocks;
        returns its trace entry (syncs and refresh are filled in later)."""
        req.forwards += 1
        merged = self._merge(req, ratings, first_row, cfg)
        req.merges += len(merged)
        req.winner = next((br for br in req.branches if self._finish(br)), None)
        if req.winner is None:
            for br in req.branches:
                self._advance(br)
        return {
            "step": step, "prompt": req.prompt.id, "committed": committed, "merged": merged, "synced": [],
            "refreshed": False, "winner": None if req.winner is None else req.branches.index(req.winner),
        }

    def _new_request(self, prompt: Prompt, cfg: BatchConfig) -> Request:
        ids = encode(self.tokenizer, prompt, self.name)
        limit = len(ids) + cfg.max_new_tokens
        length = limit + max(cfg.block_sizes)  # every block starts before the limit
        tokens = ids + [self.mask_id] * (length - len(ids))
        branches = []
        for size in cfg.block_sizes:
            start = len(ids) // size * size
            grid = [p // size * size for p in range(length)]
            branches.append(Branch(size, list(tokens), grid, start, start + size, 0, len(ids), limit))
        return Request(prompt=prompt, branches=branches)

    def _decoded(self, br: Branch) -> int:
        """Resolved answer positions (up to the length limit)."""
        return br.limit - br.prompt_len - br.tokens[br.prompt_len : br.limit].count(self.mask_id)

    def _leader(self, req: Request) -> int:
        """The branch index with the most decoded answer positions; ties: the first."""
        decoded = [self._decoded(br) for br in req.branches]
        return decoded.index(max(decoded))

    # -- model calls ------------------------------------------------------------------------

    def _forward_rows(self, rows: list[Branch], spans, cache, k_pos, k_valid):
        """One batched forward: row i computes positions ``spans[i] = (lo, hi)`` of ``rows[i]``
        (right-padded with pad ids at position 0) after its cache columns ``k_pos``/``k_valid``.
        A query attends a valid key whose block id is at most its own. Returns
        ``(hidden, q_pos, q_valid)``."""
        lo = torch.tensor([s[0] for s in spans])
        count = torch.tensor([hi - lo for lo, hi in spans])
        offset = torch.arange(int(count.max()))
        q_valid = offset[None, :] < count[:, None]
        q_pos = torch.where(q_valid, lo[:, None] + offset[None, :], 0)
        length = max(len(br.tokens) for br in rows)
        tokens = torch.tensor([br.tokens + [self.pad_id] * (length - len(br.tokens)) for br in rows])
        blocks = torch.tensor([br.blocks + [0] * (length - len(br.blocks)) for br in rows])
        ids = torch.where(q_valid, tokens.gather(1, q_pos), self.pad_id)
        ids, q_pos, q_valid, blocks = (t.to(self.device) for t in (ids, q_pos, q_valid, blocks))
        mask = modeling.block_mask(
            blocks.gather(1, q_pos), blocks.gather(1, torch.cat([k_pos, q_pos], 1)), self.dtype,
            torch.cat([k_valid, q_valid], 1),
        )
        out = self.model.get_decoder()(
            input_ids=ids, attention_mask=mask, position_ids=q_pos, use_cache=True, **{self._cache_kwarg: cache}
        )
        return out.last_hidden_state, q_pos, q_valid

    def _probabilities(self, rows: list[Branch], spans, hidden):
        """The float32 distributions at the masked positions of every row's current block (MASK and
        ids beyond the tokenizer get 0), and per row ``{position: index into them}``."""
        index, row_of, column = [], [], []
        for row, (br, (lo, _)) in enumerate(zip(rows, spans)):
            masked = [p for p in range(br.start, br.end) if br.tokens[p] == self.mask_id]
            index.append({p: len(row_of) + i for i, p in enumerate(masked)})
            row_of += [row] * len(masked)
            column += [p - lo for p in masked]
        logits = self.model.get_output_embeddings()(hidden[row_of, column]).float()
        logits[:, self.mask_id] = float("-inf")
        logits[:, len(self.tokenizer) :] = float("-inf")
        return logits.softmax(-1), index

    # -- rules: commit, merge, finish, advance, sync, refresh -----------------------------------

    def _commit_block(self, br: Branch, candidates: list[tuple[int, float, int]], cfg: BatchConfig):
        """Fast-dLLM's rule on the current block's ``(position, confidence, token)`` candidates:
        every one above ``accept_threshold``, else the most confident (the first on ties)."""
        passed = [(p, t) for p, c, t in candidates if c > cfg.accept_threshold]
        best = max(candidates, key=lambda pct: pct[1])
        chosen = passed or [(best[0], best[2])]
        for p, t in chosen:
            br.tokens[p] = t
        return chosen

    def _ratings(self, rows: list[Branch], n: int, probs, index) -> dict[tuple[int, int, int], float]:
        """``{(row, position, token): probability}``: the row's own probability of every token that
        a branch of its request holds at a position still masked in the row's current block (every
        token a merge may offer; merged tokens come from those)."""
        keys = []
        for row, dst in enumerate(rows):
            group = rows[row - row % n : row - row % n + n]
            for p, i in index[row].items():
                if dst.tokens[p] == self.mask_id:
                    keys += [(row, p, t, i) for t in sorted({src.tokens[p] for src in group} - {self.mask_id})]
        values = probs[[k[3] for k in keys], [k[2] for k in keys]].tolist() if keys else []
        return {(row, p, t): v for (row, p, t, _), v in zip(keys, values)}

    def _compatible(self, a: Branch, b: Branch) -> bool:
        """Whether two branches hold the same token wherever both are decoded."""
        lo, hi = a.prompt_len, max(a.end, b.end)
        return all(x == y or self.mask_id in (x, y) for x, y in zip(a.tokens[lo:hi], b.tokens[lo:hi]))

    def _merge(self, req: Request, ratings, first_row: int, cfg: BatchConfig) -> list[tuple[int, int, int, float]]:
        """Confidence-gated merging (rule 3); returns ``(branch, position, token, probability)``
        per filled position. ``ratings[first_row + branch, position, token]`` is the branch's own
        probability from this step's forward."""
        merged = []
        order = sorted(range(len(req.branches)), key=lambda b: -self._decoded(req.branches[b]))
        for d in order:
            dst = req.branches[d]
            sources = [src for src in req.branches if src is not dst and self._compatible(dst, src)]
            for p in range(dst.start, dst.end):
                offers = sorted({src.tokens[p] for src in sources} - {self.mask_id})
                if dst.tokens[p] != self.mask_id or not offers:
                    continue
                token = max(offers, key=lambda t: ratings[first_row + d, p, t])
                prob = ratings[first_row + d, p, token]
                if prob > cfg.merge_threshold:
                    dst.tokens[p] = token
                    merged.append((d, p, token, prob))
                    sources = [src for src in sources if src.tokens[p] in (self.mask_id, token)]
        return merged

    def _advance(self, br: Branch) -> None:
        """Open the next block, all MASK, ending on the branch's own grid, once the current one is complete."""
        if self.mask_id not in br.tokens[br.start : br.end]:
            br.start, br.end = br.end, (br.end // br.size + 1) * br.size
            br.blocks[br.start : br.end] = [br.start] * (br.end - br.start)

    def _sync(self, req: Request, first_row: int, cache, k_pos, k_valid, cfg: BatchConfig) -> list[tuple[int, int]]:
        """Leader sync (rule 5), cache rows included; returns ``(follower, leader)`` branch indices."""
        lead = self._leader(req)
        ahead = self._decoded(req.branches[lead])
        synced = []
        for b, br in enumerate(req.branches):
            if ahead - self._decoded(br) > cfg.sync_lag:
                br.follow(req.branches[lead])
                f, src = first_row + b, first_row + lead
                for layer in cache.layers:
                    layer.keys[f], layer.values[f] = layer.keys[src], layer.values[src]
                k_pos[f], k_valid[f] = k_pos[src], k_valid[src]
                synced.append((b, lead))
        return synced

    def _refresh_due(self, req: Request, cfg: BatchConfig) -> bool:
        """Whether the leader decoded ``refresh_interval`` positions since the last refresh (and
        something is cached to recompute); marks the refresh as done."""
        decoded = self._decoded(req.branches[self._leader(req)])
        if not cfg.refresh_interval or decoded - req.refreshed_at < cfg.refresh_interval:
            return False
        req.refreshed_at = decoded
        return any(br.cached for br in req.branches)

    def _refresh(self, running: list[Request], due: list[bool], cache, k_pos, k_valid):
        """One batched forward recomputing ``[0, cached)`` of every branch of the due requests,
        attending only this forward's keys, which then replace the branch's cache row."""
        n = len(running[0].branches)
        rows = [br for req in running for br in req.branches]
        fresh = torch.tensor([due[row // n] for row in range(len(rows))], device=self.device)
        k_valid = k_valid & ~fresh[:, None]  # from scratch: the old columns are neither read nor kept
        spans = [(0, br.cached if due[row // n] else 0) for row, br in enumerate(rows)]
        _, q_pos, q_valid = self._forward_rows(rows, spans, cache, k_pos, k_valid)
        for req in (req for req, d in zip(running, due) if d):
            req.forwards += 1
            req.refreshes += 1
            for br in req.branches:
                self._count(br, br.cached, br.cached, 0)
        return self._update_cache(cache, k_pos, k_valid, q_pos, q_valid, [br.cached for br in rows], list(range(len(rows))))

    # -- accounting -------------------------------------------------------------------------

    def _generation(self, req: Request, cfg: BatchConfig) -> Generation:
        win = req.winner
        out = win.result or []
        text = self.tokenizer.decode([t for t in out if t not in self.eos_ids], skip_special_tokens=False)
        return Generation(
            text=text,
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
        )
