"""One grid item's record: what an item tells the controller through its test reports.

A :class:`~pytest_redline.nodes.PromptItem` keeps an :class:`ItemRecord` and publishes it
as ``item.user_properties``; pytest copies those pairs into every report, serial or sent
by an xdist worker (plain builtins, so they cross execnet). The controller's
:class:`~pytest_redline.ledger.Ledger` reads the record back from each report with
:meth:`ItemRecord.from_properties`. The fields of :class:`ItemRecord` are the whole
contract: a new piece of an item's outcome is one more field here (default None), written
by the item and read by whoever needs it; nothing else names the property keys.

Standard library only: the plugin reads this module for every report.
"""
from __future__ import annotations

import dataclasses
import math
from collections import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping, NamedTuple

if TYPE_CHECKING:  # annotations only: record.py imports no module of the gate
    import pytest

    from pytest_redline.decode.store import StoredOutcome

#: How each property is read back from a report (values are builtins there).
_READ = {
    "correct": bool,
    "tokens": lambda v: math.nan if v is None else float(v),
    "forwards": lambda v: math.nan if v is None else float(v),
    "extra": lambda v: dict(v or {}),
    "regression": bool,
}


class PromptKey(NamedTuple):
    """Which item: a grid (its label), a config, a prompt id and the prompt's index."""

    grid: str
    config: str
    prompt: str
    index: int


@dataclass(frozen=True, eq=False, slots=True)
class ItemRecord:
    """One item's identity and what it produced, as its reports carry it.

    - identity: ``grid`` (the grid's label), ``config`` and ``prompt`` (the prompt id);
    - the outcome, once there is one: ``correct``, ``tokens`` and ``forwards`` (NaN when
      unknown), ``extra`` cost columns, and ``source``: "decoded" (this session),
      "store" (reused) or "recorded" (a replayed grid's outcome of a skipped item);
    - ``scheduled``: why the schedule skipped the item on purpose (None: it was not);
    - ``regression``: the reference is right and this config wrong; then
      ``reference_answer`` and ``candidate_answer`` hold both texts, and
      ``reference_extracted``/``reference_rule`` the reference's final answer and rule;
    - ``answer`` and ``rule``: the final answer the scorer extracted from this item's text
      and the rule that decided ("marker", "boxed", "no answer", "revised", "hedged",
      "truncated", ...; docs/explanation/scoring.md);
    - ``finish_reason``: why the engine stopped (``"length"``: at the token limit), when it says.

    A field that is None is not published. Compare records by :meth:`to_properties`
    (NaN costs make ``==`` on records meaningless, hence ``eq=False``).
    """

    grid: str
    config: str
    prompt: str
    correct: bool | None = None
    tokens: float | None = None
    forwards: float | None = None
    extra: Mapping[str, float] | None = None
    source: str | None = None
    scheduled: str | None = None
    regression: bool | None = None
    reference_answer: str | None = None
    candidate_answer: str | None = None
    answer: str | None = None
    rule: str | None = None
    reference_extracted: str | None = None
    reference_rule: str | None = None
    finish_reason: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        """(config, prompt): the item within its grid."""
        return (self.config, self.prompt)

    @property
    def has_outcome(self) -> bool:
        return self.correct is not None

    def with_outcome(self, outcome: StoredOutcome, source: str, **fields: Any) -> "ItemRecord":
        """This record with a decoded or stored outcome (a :class:`~pytest_redline.decode.store.StoredOutcome`)
        and any other ``fields`` set, in one copy."""
        return dataclasses.replace(
            self,
            correct=bool(outcome.correct),
            tokens=_float_or_nan(outcome.tokens),
            forwards=_float_or_nan(outcome.forwards),
            extra=dict(outcome.extra),
            source=source,
            answer=getattr(outcome, "answer", None),
            rule=getattr(outcome, "rule", None) or None,
            finish_reason=getattr(outcome, "finish_reason", None),
            **fields,
        )

    def regression_detail(self) -> dict[str, str]:
        """The report's regression entry: the item and both answers."""
        return {
            "config": self.config,
            "prompt": self.prompt,
            "reference_answer": self.reference_answer or "",
            "candidate_answer": self.candidate_answer or "",
            "reference_extracted": self.reference_extracted,
            "reference_rule": self.reference_rule or "",
            "candidate_extracted": self.answer,
            "candidate_rule": self.rule or "",
        }

    def to_properties(self) -> list[tuple[str, Any]]:
        """``(name, value)`` pairs for ``item.user_properties``: every field that is not
        None, in field order; a NaN cost is written as None."""
        pairs = []
        for name in FIELDS:
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, float) and math.isnan(value):
                value = None
            elif isinstance(value, (dict, abc.Mapping)):  # not typing.Mapping: its isinstance is slow
                value = dict(value)
            pairs.append((name, value))
        return pairs

    @classmethod
    def from_properties(cls, properties: Iterable[tuple[str, Any]]) -> "ItemRecord | None":
        """The record in a report's ``user_properties`` (later pairs win), or None when the
        report is not a grid item's. Properties that are not fields are ignored."""
        found = dict(properties)
        if not all(isinstance(found.get(name), str) for name in IDENTITY):
            return None
        values = {}
        for name, value in found.items():
            if name in _FIELD_SET:
                read = _READ.get(name)
                values[name] = read(value) if read else value
        return cls(**values)

    @classmethod
    def blank(cls, config: str, prompt: str) -> "ItemRecord":
        """A cell without an outcome, read as wrong with unknown costs."""
        return cls("", config, prompt, correct=False, tokens=math.nan, forwards=math.nan, extra={}, source="")


#: The fields every item publishes from collection on.
IDENTITY = ("grid", "config", "prompt")
FIELDS = tuple(f.name for f in dataclasses.fields(ItemRecord))
_FIELD_SET = frozenset(FIELDS)


def publish(user_properties: list[tuple[str, Any]], record: ItemRecord) -> None:
    """Put ``record`` into ``user_properties`` in place, replacing the pairs of an earlier
    record and keeping other plugins' pairs."""
    user_properties[:] = [p for p in user_properties if p[0] not in _FIELD_SET] + record.to_properties()


def is_regression(report: pytest.TestReport) -> bool:
    """A passed call whose item regressed (reference right, candidate wrong)."""
    if report.when != "call" or not report.passed or not any(k == "regression" and v for k, v in report.user_properties):
        return False
    record = ItemRecord.from_properties(report.user_properties)
    return record is not None and bool(record.regression)


def _float_or_nan(value: Any) -> float:
    return math.nan if value is None else float(value)
