"""The gate's side of scoring: stop strings for the engines, judgements, and re-scoring.

- **Stop strings.** A suite declares them on its prompts (``Prompt.stop``; a suite-level
  ``stop`` attribute fills prompts that declare none). The engines get them when the grid's
  ``engine_stops`` is on (the default), and none when it is off; the scorer cuts at them in
  both cases. The declared strings and the switch enter the outcome key (:func:`stop_identity`).
- **Judgements.** A suite with ``judge(prompt, text, finish_reason)`` gives the answer and the
  rule; a plain ``score(prompt, text)`` still works (rule ``"score"``). An engine that sets
  ``Generation.correct`` decides alone (rule and scoring ``"engine"``).
- **Re-scoring.** Every outcome records the scoring version that decided it
  (:func:`scoring_version`: the scorer, the suite's ``version`` and its ``rules``). The decode
  part of the key leaves it out, so when only the scoring changes, stored texts are judged
  again (:func:`rescored`) and nothing is decoded.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from pytest_redline.contracts import FINISH_REASONS, Generation, Prompt, Suite, judge
from pytest_redline.decode.store import StoredOutcome

if TYPE_CHECKING:  # annotations only: scoring needs no calibration at run time
    from pytest_redline.calibration import Calibration

ENGINE = "engine"  # the scoring "version" (and rule) of outcomes whose engine set `correct`


def declared_stop(suite: Suite, prompt: Prompt) -> tuple[str, ...]:
    """The stop strings a suite declares for ``prompt``."""
    return tuple(getattr(prompt, "stop", ()) or getattr(suite, "stop", ()) or ())


def engine_stops(cal: Calibration) -> bool:
    """Whether engines honour the declared stop strings (grid key ``engine_stops``, default on)."""
    return bool(getattr(cal.grid, "engine_stops", True))


def engine_prompts(cal: Calibration, prompts: list[Prompt]) -> list[Prompt]:
    """The prompts as the engine gets them: ``stop`` filled from the suite, or empty when the
    grid turns engine-side stops off."""
    if cal.suite is None:
        return prompts
    out = []
    for p in prompts:
        stop = declared_stop(cal.suite, p) if engine_stops(cal) else ()
        out.append(dataclasses.replace(p, stop=stop) if dataclasses.is_dataclass(p) and p.stop != stop else p)
    return out


def stop_identity(cal: Calibration, prompt: Prompt) -> dict[str, Any]:
    """What the outcome key records of stop strings: those declared, and whether engines stop."""
    strings = declared_stop(cal.suite, prompt) if cal.suite is not None else ()
    return {"strings": list(strings), "engine": engine_stops(cal) and bool(strings)}


def scoring_version(cal: Calibration, scorer: str) -> str:
    """The scoring version of a grid's suite: the scorer, its ``version`` and its ``rules``."""
    return "" if cal.suite is None else f"{scorer}: {suite_version(cal.suite)}"


def suite_version(suite: Suite) -> str:
    """What a suite's judgements depend on beyond its data: its ``version`` (tools such as
    math-verify or the sandbox interpreter) and the revision of its scoring ``rules``."""
    version, rules = str(getattr(suite, "version", "")), str(getattr(suite, "rules", ""))
    return f"{version}; rules {rules}" if rules else version


def finish_reason(generation: Generation) -> str | None:
    reason = getattr(generation, "finish_reason", None)
    if reason is not None and reason not in FINISH_REASONS:
        raise ValueError(f"Generation.finish_reason must be one of {FINISH_REASONS} or None, got {reason!r}")
    return reason


def judgement(cal: Calibration, prompt: Prompt, generation: Generation, scoring: str) -> dict[str, Any]:
    """The StoredOutcome fields of the judgement on one generation."""
    finish = finish_reason(generation)
    if generation.correct is not None:
        return {"correct": bool(generation.correct), "answer": None, "rule": ENGINE, "finish_reason": finish,
                "scoring": ENGINE}
    if cal.suite is None:
        raise ValueError("the engine set no `correct` and the grid has no suite to score the text")
    judged = judge(cal.suite, prompt, generation.text, finish)
    return {"correct": bool(judged.correct), "answer": judged.answer, "rule": judged.rule, "finish_reason": finish,
            "scoring": scoring}




def rescored(cal: Calibration, prompt: Prompt, outcome: StoredOutcome, scoring: str) -> StoredOutcome | None:
    """A stored outcome judged again under the current ``scoring`` version, or None when it
    stands: it was scored so already, its engine decided, or (a store written before scoring
    versions were recorded) it has no text to judge."""
    if cal.suite is None or outcome.scoring in (scoring, ENGINE) or (not outcome.scoring and not outcome.text):
        return None
    judged = judge(cal.suite, prompt, outcome.text, outcome.finish_reason)
    return dataclasses.replace(outcome, correct=bool(judged.correct), answer=judged.answer, rule=judged.rule,
                               scoring=scoring)
