"""The FlowBlock engine: a wavefront of blocks refined jointly, with LLaDA2.1's token editing.

Our reconstruction of FlowBlock ("Wavefront-Parallel Decoding for Self-Correcting Diffusion
Language Models", engines.md section 7) from the paper's description; its code is not public.
Since token editing repairs drafts, a block may start before its predecessor is final. It is
built on the multi-block engine's block life cycle (``engines.block_diffusion.BlockLifecycle``:
blocks aligned from position 0, greedy, batched, the retired prefix in a ``DynamicCache`` and never
recomputed) with its own ``admit``, ``step``, ``commit`` and ``retire``. One engine step, per request:

1. **Admission** (``admit``). The next block joins the wavefront, all MASK, when fewer than
   ``window`` blocks are active, the frontier (the newest active block) is *ready* (or no block
   is active), no EOS has been committed before the new block and the length limit is not
   reached. Readiness ρ is the fraction of the frontier's masked positions whose top-1
   probability exceeded ``accept_threshold`` in the previous step's forward (before that step's
   commits); a frontier with no masked position has ρ = 1, a block never computed ρ = 0. The
   frontier is ready when ρ >= ``spawn_threshold``. An edit that removes a committed EOS
   reopens admission.
2. **Forward** (``step``). One block-causal forward over the blocks retired in the previous step
   (the folded store writes their final K/V, so a block edited in its last step still enters the
   cache exactly) and exactly the active blocks (a variable window, no placeholder blocks).
3. **Commit and edit** (``commit``), LLaDA2.1's rules per active block: every masked position whose
   top-1 probability exceeds ``accept_threshold`` (M2T); when none passes, the head (the oldest
   active block) commits its most confident masked position and the other blocks commit nothing.
   With editing on (``edit_threshold`` < 1), every position that was filled before this step
   (not a prompt token) whose top-1 differs from its token with probability above
   ``edit_threshold`` takes the top-1 (T2T), in every step, as in LLaDA2.1.
4. **Retirement** (``retire``), front to back: the head retires when it has no MASK and is
   *stable*: editing is off; or it was complete at the start of this step and nothing (commit or
   edit) changed in it or an earlier active block (a check forward that saw it, as it is now,
   changed nothing: LLaDA2.1's convergence); or it has had ``max_post_steps`` check forwards
   (forwards that saw it complete: LLaDA2.1's post-step cap, 0: none). A request finishes when an
   EOS lies in the retired prefix, or the retired prefix reaches the length limit.

With ``window: 1`` this is LLaDA2.1 (engines.md section 3: threshold M2T with top-1 fallback, T2T
edits, at most ``max_post_steps`` post steps per block, the block after an EOS's block never
started), token for token and forward for forward; without editing it is LLaDA2.0 (k = 1, no
check forward) at ``max_new_tokens`` of a block or more (below it LLaDA2.0 caps its steps per
block, which only ``block_diffusion`` follows). ``spawn_threshold`` above 1 admits a block only once its predecessor retired:
serial decoding for every window.

Counting (see ``engines.base``): ``forwards`` = the forwards the request took part in (the first
one is the prefill); ``tokens`` = generated tokens up to and including the first EOS, edits not
counted. ``extra["edits"]`` is the number of token edits, ``extra["flops"]`` the analytical FLOPs
of the request's forwards (the output head also over the drafted positions read for editing)
and ``extra["blocks"]`` the number of blocks the output spans. Stop strings are looked for in the
retired prefix (the text that can no longer change).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from pytest_redline.contracts import Reads, Step
from pytest_redline.engines.block_diffusion import BlockDiffusionEngine, BlockRequest
from pytest_redline.engines.diffusion_spec import FlowBlockSpec, FlowConfig

@dataclass
class FlowRequest(BlockRequest):
    readiness: float = 0.0  # ρ of the frontier at the last forward
    post_steps: dict[int, int] = field(default_factory=dict)  # block -> check forwards that saw it complete
    complete_at_start: frozenset[int] = frozenset()  # active blocks without MASK when the step began
    changed: float = math.inf  # the first block a commit or edit changed in the last step


class FlowBlockEngine(FlowBlockSpec, BlockDiffusionEngine):
    """``FlowBlockEngine(model=PATH, device="auto", dtype="auto", mask_token_id=None,
    trust_remote_code=False, trace=None, threads=None)``; the model defaults to the embedded
    bd-tiny. The trace (one JSON line per request and step) also records the step's edits and readiness."""

    Request = FlowRequest  # name, rules and Config: FlowBlockSpec

    def admit(self, req: FlowRequest, cfg: FlowConfig) -> list[int]:
        B = cfg.block_size
        nxt = req.active[-1] + 1 if req.active else req.final // B
        if nxt * B >= req.limit or self.eos_ids.intersection(req.tokens[req.prompt_len : nxt * B]):
            return []
        if req.active and (len(req.active) >= cfg.window or req.readiness < cfg.spawn_threshold):
            return []
        req.active.append(nxt)
        return [nxt]

    def step(self, req: FlowRequest, cfg: FlowConfig) -> Step:
        """The uncached retired prefix and the active blocks; reads their masked positions and,
        with editing, their filled non-prompt positions. Counts the check forwards."""
        B = cfg.block_size
        req.complete_at_start = frozenset(b for b in req.active if self.mask_id not in req.tokens[b * B : (b + 1) * B])
        for b in req.complete_at_start:
            req.post_steps[b] = req.post_steps.get(b, 0) + 1
        queries = list(range(req.cached if cfg.use_cache else 0, req.final))
        reads = []
        for b in req.active:
            queries += range(b * B, (b + 1) * B)
            reads += [
                (b, p) for p in range(max(b * B, req.prompt_len), (b + 1) * B)
                if cfg.editing or req.tokens[p] == self.mask_id
            ]
        return Step(queries, reads, req.final)

    def commit(self, req: FlowRequest, reads: Reads, cfg: FlowConfig) -> list[tuple[int, int]]:
        """Readiness of the frontier, M2T commits (top-1 fallback at the head only), T2T edits."""
        committed, edits = [], []
        for i, b in enumerate(req.active):
            masked = [r for r in reads.get(b, []) if req.tokens[r[0]] == self.mask_id]
            chosen = [(p, t) for p, c, t in masked if c > cfg.accept_threshold]
            if b == req.active[-1]:
                req.readiness = len(chosen) / len(masked) if masked else 1.0
            if not chosen and masked and i == 0:
                p, _, t = max(masked, key=lambda pct: pct[1])
                chosen = [(p, t)]
            committed += chosen
            if cfg.editing:
                edits += [(p, t) for p, c, t in reads.get(b, []) if req.tokens[p] not in (self.mask_id, t) and c > cfg.edit_threshold]
        for p, t in committed + edits:
            req.tokens[p] = t
        req.extra["edits"] = req.extra.get("edits", 0.0) + len(edits)
        req.changed = min((p // cfg.block_size for p, _ in committed + edits), default=math.inf)
        req.log = {"edited": edits, "readiness": req.readiness}
        return committed

    def retire(self, req: FlowRequest, cfg: FlowConfig) -> list[int]:
        """Front to back, complete and stable heads retire; then the finishing rule."""
        B = cfg.block_size
        newly = []
        while req.active and self.mask_id not in req.tokens[req.active[0] * B : (req.active[0] + 1) * B]:
            head = req.active[0]
            converged = head in req.complete_at_start and req.changed > head
            if cfg.editing and not converged and req.post_steps.get(head, 0) < cfg.max_post_steps:
                break
            newly.append(req.active.pop(0))
            req.final += B
        retired = req.tokens[req.prompt_len : min(req.final, req.limit)]
        if req.final >= req.limit or self.eos_ids.intersection(retired):
            self.finish(req, retired)
        return newly

    def settled(self, req: FlowRequest, cfg: FlowConfig) -> int:
        """Edits may change any active block: only the retired prefix is settled."""
        return max(req.final, req.prompt_len)
