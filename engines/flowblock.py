"""The FlowBlock engine: a wavefront of blocks refined jointly, with token editing.

Our reconstruction of FlowBlock ("Wavefront-Parallel Decoding for Self-Correcting Diffusion
Language Models") from the paper's description; its code is not public. Since token editing
repairs drafts, a block may start before its predecessor is final. It is the
multi-block engine (``engines.block_diffusion``: blocks aligned from position 0, greedy, batched,
the committed prefix in a ``DynamicCache`` and never recomputed) with other rules for admission,
commits and retirement. One engine step, per request:

1. **Admission.** The next block joins the wavefront, all MASK, when fewer than ``window``
   blocks are active, the frontier (the newest active block) is *ready* (or no block is active),
   no EOS has been committed before the new block and the length limit is not reached. Readiness
   ρ is the fraction of the frontier's masked positions whose top-1 probability exceeded
   ``accept_threshold`` in the previous step's forward (before that step's commits); a frontier
   with no masked position has ρ = 1, a block never computed ρ = 0. The frontier is ready when
   ρ >= ``spawn_threshold``. An edit that removes a committed EOS reopens admission.
2. **Forward.** One block-causal forward over the blocks retired in the previous step (their
   final tokens: the folded store writes their K/V, so a block edited in its last step still
   enters the cache exactly) and exactly the active blocks (a variable window, no placeholder
   blocks). Retired blocks are read from the cache and never recomputed.
3. **Commit.** Per active block, every masked position whose top-1 probability exceeds
   ``accept_threshold``; when none passes, the head (the oldest active block) commits its most
   confident masked position and the other blocks commit nothing. So every step with a masked
   head commits at least one token.
4. **Edit.** Per active block that was edited in fewer than ``max_edit_steps`` steps so far:
   every drafted position (resolved at this step's forward, not a prompt token) whose top-1
   differs from its token with probability above ``edit_threshold`` takes the top-1. A step that
   edits a block spends one of that block's edit steps. Editing is off when
   ``max_edit_steps`` is 0 or ``edit_threshold`` >= 1.
5. **Retirement**, front to back: the head retires when it is complete and *settled*.

A position is settled when it cannot change without a forward that sees it first: its block is
retired or out of edit budget, or nothing (commit or edit) changed this step in its block or an
earlier one (then this step's forward saw the whole context the position attends, as it is now,
and edited nothing). A request finishes when an EOS is committed with every earlier position
resolved and settled, or when every position of the length limit is. With editing off every
resolved position is settled, and the rules are the multi-block engine's: ``window = 1`` decodes
as ``block_diffusion`` with ``buffer_size = 1`` (single-block threshold decoding, top-1
fallback), token for token and forward for forward, and ``spawn_threshold = 1`` (a block starts
only when its predecessor is complete, hence final) is serial decoding for every window. With
editing on, a block retires (and a request finishes) only after a forward that saw it complete
made no change to it or before it: LLaDA2.1's check forward, which the wavefront overlaps with
the next block's denoising.

Counting (see ``engines.base``): ``forwards`` = the forwards the request took part in (the first
one is the prefill); ``tokens`` = generated tokens up to and including the first EOS, edits not
counted. ``extra["edits"]`` is the number of token edits, ``extra["flops"]`` the analytical FLOPs
of the request's forwards (the output head also over the drafted positions read for editing)
and ``extra["blocks"]`` the number of blocks the output spans.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from pytest_redline.engines import modeling
from pytest_redline.engines.base import Generation
from pytest_redline.engines.block_diffusion import BlockDiffusionEngine, Request, check_params
from pytest_redline.suites.base import Prompt

DEFAULTS: dict[str, Any] = {
    "block_size": 8,
    "window": 3,  # at most this many active blocks; 1 = one block at a time
    "accept_threshold": 0.95,  # commit a masked position above this; also the readiness cut
    # Admit the next block when the frontier's readiness reaches this. Not 0.9: a frontier with m
    # <= 9 masked positions has rho >= 0.9 only when all m pass (rho = 1), so with blocks of 8 and
    # no editing 0.9 admits a block only once its predecessor is complete: serial decoding.
    "spawn_threshold": 0.50,
    "edit_threshold": 0.90,  # replace a drafted token whose rival top-1 is above this; >= 1: no editing
    "max_edit_steps": 2,  # steps in which one block may be edited; 0: no editing
    "max_new_tokens": 96,
    "use_cache": True,  # False recomputes the whole prefix every step: the reference for tests
}


@dataclass(frozen=True)
class FlowConfig:
    block_size: int
    window: int
    accept_threshold: float
    spawn_threshold: float
    edit_threshold: float
    max_edit_steps: int
    max_new_tokens: int
    use_cache: bool

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> "FlowConfig":
        values = modeling.with_defaults("flowblock", params, DEFAULTS)
        check_params(
            "flowblock", values,
            ints={"block_size": 1, "window": 1, "max_new_tokens": 1, "max_edit_steps": 0},
            numbers=("accept_threshold", "spawn_threshold", "edit_threshold"),
            flags=("use_cache",),
        )
        return cls(**values)

    @property
    def editing(self) -> bool:
        return self.max_edit_steps > 0 and self.edit_threshold < 1

    # The multi-block engine's names for two of FlowBlock's rules, read by the code it inherits.
    @property
    def buffer_size(self) -> int:
        """Blocks in flight at most: the window."""
        return self.window

    @property
    def semi_complete_threshold(self) -> float:
        """No predecessor is ever semi-complete: when nothing passes, only the head commits its top-1."""
        return math.inf


@dataclass
class FlowRequest(Request):
    readiness: float = 0.0  # ρ of the frontier at the last forward
    edit_steps: dict[int, int] = field(default_factory=dict)  # block -> steps in which it was edited
    edits: int = 0
    step_edits: list[tuple[int, int]] = field(default_factory=list)  # (position, token) this step
    unsettled: float = math.inf  # the first position that is not settled (block-aligned)


class FlowBlockEngine(BlockDiffusionEngine):
    """``FlowBlockEngine(model=PATH, device="auto", dtype="auto", mask_token_id=None,
    trust_remote_code=False, trace=None)``; the model defaults to the embedded bd-tiny. The
    trace (one JSON line per request and step) also records the step's edits and readiness."""

    name = "flowblock"

    def _decode_config(self, config: Mapping[str, Any]) -> FlowConfig:
        return FlowConfig.from_params(config)

    def _new_request(self, prompt: Prompt, cfg: FlowConfig) -> FlowRequest:
        return FlowRequest(**vars(super()._new_request(prompt, cfg)))

    def _editable(self, req: FlowRequest, block: int, cfg: FlowConfig) -> bool:
        return cfg.editing and req.edit_steps.get(block, 0) < cfg.max_edit_steps

    # -- scheduler --------------------------------------------------------------------------

    def _ready(self, req: FlowRequest, cfg: FlowConfig) -> bool:
        """The readiness gate: the frontier's ρ at the last forward reached ``spawn_threshold``."""
        return req.readiness >= cfg.spawn_threshold

    def _computed_blocks(self, req: FlowRequest, cfg: FlowConfig) -> list[int]:
        """Exactly the active blocks: a variable window."""
        return list(req.active)

    def _read_positions(self, req: FlowRequest, cfg: FlowConfig) -> list[tuple[int, int]]:
        """The masked positions of the active blocks, then the drafted ones of blocks that may be edited."""
        drafted = [
            (b, p) for b in req.active if self._editable(req, b, cfg)
            for p in range(max(b * cfg.block_size, req.prompt_len), (b + 1) * cfg.block_size)
            if req.tokens[p] != self.mask_id
        ]
        return super()._read_positions(req, cfg) + drafted

    def _retirable(self, req: FlowRequest, block: int, cfg: FlowConfig) -> bool:
        """The head retires when it is complete and settled."""
        return super()._retirable(req, block, cfg) and (block + 1) * cfg.block_size <= req.unsettled

    def _finish(self, req: FlowRequest) -> bool:
        """The multi-block rule, and every position of the answer is settled."""
        done = super()._finish(req) and req.prompt_len + len(req.result) <= req.unsettled
        if not done:
            req.result = None
        return done

    # -- sampler ----------------------------------------------------------------------------

    def _commit(self, req: FlowRequest, logits: dict, progress: dict, cfg: FlowConfig) -> list[tuple[int, int]]:
        """Readiness, edits, then the commits (multi-block rule, fallback at the head only);
        returns the commits, records the edits and which positions are settled."""
        masked = {b: [r for r in reads if req.tokens[r[0]] == self.mask_id] for b, reads in logits.items()}
        frontier = masked.get(req.active[-1], [])
        req.readiness = sum(c > cfg.accept_threshold for _, c, _ in frontier) / len(frontier) if frontier else 1.0
        req.step_edits = []
        for b, reads in logits.items():
            edits = [(p, t) for p, c, t in reads if req.tokens[p] not in (self.mask_id, t) and c > cfg.edit_threshold]
            if edits:
                req.edit_steps[b] = req.edit_steps.get(b, 0) + 1
                req.step_edits += edits
        for p, t in req.step_edits:
            req.tokens[p] = t
        req.edits += len(req.step_edits)
        committed = super()._commit(req, masked, progress, cfg)
        changed = min((p // cfg.block_size for p, _ in committed + req.step_edits), default=math.inf)
        unsettled = [b for b in req.active if b >= changed and self._editable(req, b, cfg)]
        req.unsettled = unsettled[0] * cfg.block_size if unsettled else math.inf
        return committed

    # -- accounting -------------------------------------------------------------------------

    def _generation(self, req: FlowRequest, cfg: FlowConfig) -> Generation:
        generation = super()._generation(req, cfg)
        return dataclasses.replace(generation, extra={**generation.extra, "edits": float(req.edits)})

    def _trace_entry(self, step, req: FlowRequest, queries, committed, newly_final, stored_to, cfg) -> dict:
        entry = super()._trace_entry(step, req, queries, committed, newly_final, stored_to, cfg)
        return {**entry, "edited": req.step_edits, "readiness": req.readiness}
