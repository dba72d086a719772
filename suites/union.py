"""A suite made of other suites: ``math`` (GSM8K + MATH-500) and ``code`` (HumanEval + MBPP).

The prompts are the parts' prompts, part after part, and ``seed``/``count``/``ids`` then select
from that union. A prompt's id starts with its part's name (``gsm8k/17``), which is how
``score`` finds the part that scores it.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from pytest_redline.contracts import Judgement, Prompt, Suite, judge
from pytest_redline.suites.records import select


class Union:
    def __init__(self, name: str, parts: Sequence[Suite], seed: int | None = None, count: int | None = None,
                 ids: Sequence[str | int] | None = None):
        self.name = name
        self.parts = {part.name: part for part in parts}
        everything = [prompt for part in parts for prompt in part.prompts()]
        self._prompts = select(everything, name, seed=seed, count=count, ids=ids)

    def prompts(self) -> list[Prompt]:
        return list(self._prompts)

    @property
    def version(self) -> str:
        """The parts' scoring versions (part of the outcome store's key)."""
        return "; ".join(f"{name}: {getattr(part, 'version', '')}" for name, part in self.parts.items())

    @property
    def rules(self) -> str:
        """The parts' scoring-rule revisions (with ``version``, the scoring version)."""
        return "; ".join(f"{name}: {getattr(part, 'rules', '')}" for name, part in self.parts.items())

    def part(self, prompt: Prompt) -> Any:
        prefix = prompt.id.split("/", 1)[0]
        if prefix not in self.parts:
            raise ValueError(f"suite {self.name!r}: prompt {prompt.id!r} belongs to none of {sorted(self.parts)}")
        return self.parts[prefix]

    def score(self, prompt: Prompt, text: str) -> bool:
        return self.part(prompt).score(prompt, text)

    def judge(self, prompt: Prompt, text: str, finish_reason: str | None = None) -> Judgement:
        """The part's judgement (its plain ``score`` as one when it has no ``judge``)."""
        return judge(self.part(prompt), prompt, text, finish_reason)


def part_args(suite: str, key: str, value: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``suite_args`` of one part (``math: {gsm8k: {count: 100}}``), checked to be a mapping."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"suite {suite!r}: suite_args.{key}: expected a mapping of {key}'s suite_args, got {value!r:.80}")
    return dict(value)
