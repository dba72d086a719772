"""The suite protocol: a list of prompts and a scorer. Suites know nothing of engines."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable


@dataclass(frozen=True)
class Prompt:
    """One calibration prompt.

    ``text`` is the plain prompt; ``messages`` is the same prompt as chat messages
    (``[{"role": "user", "content": ...}]``), which an engine renders with its tokenizer's
    chat template when it has one. ``meta`` carries what the scorer needs (gold answer, tests).
    ``stop`` lists the stop strings an engine honours for this prompt: it ends the request at
    the first one and returns the text before it. The gate empties it when a grid turns
    engine-side stops off; the scorer still cuts at its suite's own stop strings.
    """

    id: str
    text: str
    messages: tuple[Mapping[str, str], ...] = ()
    meta: Mapping[str, Any] = field(default_factory=dict)
    stop: tuple[str, ...] = ()


@runtime_checkable
class Suite(Protocol):
    name: str

    def prompts(self) -> Sequence[Prompt]: ...

    def score(self, prompt: Prompt, text: str) -> bool: ...


def cut_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """``text`` before the earliest occurrence of any stop string, and whether one occurred."""
    hits = [i for i in (text.find(s) for s in stop if s) if i >= 0]
    return (text[: min(hits)], True) if hits else (text, False)


def chat(text: str) -> tuple[Mapping[str, str], ...]:
    """The chat form of a plain prompt: one user message."""
    return ({"role": "user", "content": text},)
