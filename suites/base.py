"""What suites share beyond the contracts: the rules that decide an answer, and helpers.

The vocabulary a suite shares with engines and the gate (``Prompt``, ``Judgement``, the
``Suite`` protocol, ``cut_at_stop``) lives in :mod:`pytest_redline.contracts`; the old names
here still work until pytest-redline 0.2, with a DeprecationWarning. Suites know nothing of
engines.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from pytest_redline import contracts

# The rules that decide an answer (``Judgement.rule``). An answer was found by the first three;
# the others score wrong whatever the gold answer is.
MARKER = "marker"            # after a final-answer marker ("####", "The answer is", "#")
BOXED = "boxed"              # the last \boxed{...}
LAST_NUMBER = "last number"  # no marker in an output that ended on its own: its last number
NO_ANSWER = "no answer"      # no marker, or a marker with nothing parseable after it
REVISED = "revised"          # a later, different final answer
HEDGED = "hedged"            # two candidate answers offered ("18 or 19")
TRUNCATED = "truncated"      # the token limit cut the output before its final answer ended
FOUND = (MARKER, BOXED, LAST_NUMBER)

__getattr__ = contracts.moved(__name__, ("Prompt", "Suite", "Judgement", "Judged", "judge", "cut_at_stop", "SCORED"),
                    "pytest_redline.contracts")


def judged(text: str, stop: Sequence[str], finish_reason: str | None, extract: Callable[[str, str | None], Any],
           correct: Callable[[Any], bool]) -> contracts.Judgement:
    """The judgement of a suite that extracts one final answer: ``text`` cut at the first stop
    string (an output cut there ended on its own, whatever the engine reported), then
    ``extract(text, finish_reason)`` (an object with ``answer`` and ``rule``), then ``correct``
    of it when an answer was found. Malformed output is wrong, never an error."""
    try:
        text, hit = contracts.cut_at_stop(text, stop)
        found = extract(text, "stop" if hit else finish_reason)
        return contracts.Judgement(found.rule in FOUND and bool(correct(found)), found.answer, found.rule)
    except Exception:
        return contracts.Judgement(False, None, NO_ANSWER)


def chat(text: str) -> tuple[Mapping[str, str], ...]:
    """The chat form of a plain prompt: one user message."""
    return ({"role": "user", "content": text},)
