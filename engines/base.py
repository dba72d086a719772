"""The engine protocol. Engines know nothing of pytest or statistics.

Counting conventions, shared by every engine of this package:

- ``forwards`` is every model call made for the request (prefill, denoising steps, cache
  stores or refreshes, verification). A batched call counts 1 for each request it serves.
- ``tokens`` is the number of generated tokens up to and including the first EOS; token
  edits are not counted. A request cut at a stop string (``Prompt.stop``) counts the tokens
  and forwards up to the cut.
- ``finish_reason`` is ``"eos"``, ``"stop"`` (a stop string) or ``"length"`` (the token
  limit); ``None`` when the engine cannot tell.
- Breakdowns (prefill, draft forwards, FLOPs, memory) go to ``extra``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

from pytest_redline.suites.base import Prompt


@dataclass(frozen=True)
class Generation:
    text: str
    tokens: int
    forwards: int
    extra: Mapping[str, float] = field(default_factory=dict)
    correct: bool | None = None  # set only by engines that already know it (replay)
    finish_reason: str | None = None  # "eos" | "stop" | "length"

FINISH_REASONS = ("eos", "stop", "length")


@runtime_checkable
class Engine(Protocol):
    """Built once per session from ``engine_args`` (the model loads then)."""

    name: str

    def fingerprint(self) -> str: ...

    def generate(self, prompts: Sequence[Prompt], config: Mapping[str, Any]) -> list[Generation]: ...
