"""The suite protocol: a list of prompts and a scorer. Suites know nothing of engines."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable


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


# The rules that decide an answer (``Judgement.rule``). An answer was found by the first three;
# the others score wrong whatever the gold answer is.
MARKER = "marker"            # after a final-answer marker ("####", "The answer is", "#")
BOXED = "boxed"              # the last \boxed{...}
LAST_NUMBER = "last number"  # no marker in an output that ended on its own: its last number
NO_ANSWER = "no answer"      # no marker, or a marker with nothing parseable after it
REVISED = "revised"          # a later, different final answer
HEDGED = "hedged"            # two candidate answers offered ("18 or 19")
TRUNCATED = "truncated"      # the token limit cut the output before its final answer ended
SCORED = "score"             # a suite without ``judge``: its plain ``score`` decided
FOUND = (MARKER, BOXED, LAST_NUMBER)


@dataclass(frozen=True)
class Judgement:
    """The verdict on one output: whether it is correct, the final answer extracted from it
    (None when there is none) and the rule that decided (:data:`MARKER`, :data:`BOXED`, ...)."""

    correct: bool
    answer: str | None
    rule: str


@runtime_checkable
class Judged(Protocol):
    """The optional, richer scoring call of a suite: the generation's finish reason in
    (``"eos"``, ``"stop"``, ``"length"`` or None when unknown), the answer and the rule out."""

    def judge(self, prompt: Prompt, text: str, finish_reason: str | None = None) -> Judgement: ...


def judge(suite: Any, prompt: Prompt, text: str, finish_reason: str | None = None) -> Judgement:
    """``suite.judge(...)`` when the suite has it, else its plain ``score`` as a Judgement."""
    if isinstance(suite, Judged):
        return suite.judge(prompt, text, finish_reason)
    return Judgement(bool(suite.score(prompt, text)), None, SCORED)


def judged(text: str, stop: Sequence[str], finish_reason: str | None, extract: Callable[[str, str | None], Any],
           correct: Callable[[Any], bool]) -> Judgement:
    """The judgement of a suite that extracts one final answer: ``text`` cut at the first stop
    string (an output cut there ended on its own, whatever the engine reported), then
    ``extract(text, finish_reason)`` (an object with ``answer`` and ``rule``), then ``correct``
    of it when an answer was found. Malformed output is wrong, never an error."""
    try:
        text, hit = cut_at_stop(text, stop)
        found = extract(text, "stop" if hit else finish_reason)
        return Judgement(found.rule in FOUND and bool(correct(found)), found.answer, found.rule)
    except Exception:
        return Judgement(False, None, NO_ANSWER)


def scoring_version(suite: Any) -> str:
    """What a suite's verdicts depend on beyond its data: its ``version`` (tools such as
    math-verify or the sandbox interpreter) and the revision of its scoring ``rules``."""
    version, rules = str(getattr(suite, "version", "")), str(getattr(suite, "rules", ""))
    return f"{version}; rules {rules}" if rules else version


def cut_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """``text`` before the earliest occurrence of any stop string, and whether one occurred."""
    hits = [i for i in (text.find(s) for s in stop if s) if i >= 0]
    return (text[: min(hits)], True) if hits else (text, False)


def chat(text: str) -> tuple[Mapping[str, str], ...]:
    """The chat form of a plain prompt: one user message."""
    return ({"role": "user", "content": text},)
