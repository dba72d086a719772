"""The controller's record of what each grid item produced, from the test reports.

Every item carries its identity and outcome as user properties (``grid``, ``config``,
``prompt``, ``correct``, ``tokens``, ``forwards``, ...), so the reports alone, serial or
sent by xdist workers, tell the controller each outcome. An expected item without an
outcome is *missing*, with a reason: errored, skipped, deselected, or not run.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from pytest_redline.calibration import Calibration

REASONS = ("errored", "skipped", "deselected", "not run")


@dataclass(frozen=True)
class Entry:
    """One item's outcome as its report carried it."""

    correct: bool
    tokens: float
    forwards: float
    extra: Mapping[str, float]
    source: str  # "store" (reused) or "decoded" (this session)
    regression: dict[str, str] | None


@dataclass(frozen=True)
class Missing:
    config: str
    prompt: str
    reason: str


@dataclass(frozen=True)
class GridRecord:
    """What one grid's items produced: outcomes in grid order, or what is missing."""

    cal: Calibration
    entries: Mapping[tuple[str, str], Entry]
    missing: tuple[Missing, ...]

    @property
    def complete(self) -> bool:
        return not self.missing

    def count(self, source: str) -> int:
        return sum(entry.source == source for entry in self.entries.values())

    def regressions(self) -> list[dict[str, str]]:
        """Regressions in grid order (configs, then prompts), however the reports arrived."""
        ordered = (self.entries.get((c, p.id)) for c in self.cal.configs for p in self.cal.prompts)
        return [e.regression for e in ordered if e is not None and e.regression is not None]

    def table(self):
        """The complete outcomes as an :class:`~pytest_redline.outcomes.OutcomeTable`."""
        import numpy as np

        from pytest_redline.outcomes import OutcomeTable

        cal = self.cal
        rows = [[self.entries[(c, p.id)] for p in cal.prompts] for c in cal.configs]
        columns = sorted({k for row in rows for e in row for k in e.extra})
        return OutcomeTable(
            configs=cal.configs,
            prompts=tuple(p.id for p in cal.prompts),
            correct=np.array([[e.correct for e in row] for row in rows], dtype=bool),
            tokens=np.array([[e.tokens for e in row] for row in rows], dtype=float),
            forwards=np.array([[e.forwards for e in row] for row in rows], dtype=float),
            extra={k: np.array([[e.extra.get(k, math.nan) for e in row] for row in rows], dtype=float) for k in columns},
            source=f"{cal.label} (this session's outcomes)",
        )


def is_regression(report: Any) -> bool:
    """A passed call whose item regressed (reference right, candidate wrong)."""
    return report.when == "call" and report.passed and ("regression", True) in map(tuple, report.user_properties)


class Ledger:
    def __init__(self, calibrations: Iterable[Calibration]) -> None:
        self._cals = {cal.label: cal for cal in calibrations}
        self._entries: dict[str, dict[tuple[str, str], Entry]] = {label: {} for label in self._cals}
        self._problems: dict[str, dict[tuple[str, str], str]] = {label: {} for label in self._cals}
        self._deselected: dict[str, set[tuple[str, str]]] = {label: set() for label in self._cals}

    def record(self, report: Any) -> None:
        """Take one test report (any phase); reports of other tests are ignored."""
        props = dict(report.user_properties)
        label = props.get("grid")
        if label not in self._cals:
            return
        key = (props["config"], props["prompt"])
        if report.failed:
            self._problems[label][key] = "errored"
        elif report.skipped:
            self._problems[label].setdefault(key, "skipped")
        elif report.when == "call":
            self._entries[label][key] = _entry(props)

    def deselect(self, ids: Iterable[Iterable[str]]) -> None:
        """Items deselected (-k, -m, --lf, ...), as (grid, config, prompt) triples."""
        for label, config, prompt in ids:
            if label in self._deselected:
                self._deselected[label].add((config, prompt))

    def grid(self, label: str) -> GridRecord:
        cal = self._cals[label]
        entries, problems = self._entries[label], self._problems[label]
        missing = []
        for config in cal.configs:
            for prompt in cal.prompts:
                key = (config, prompt.id)
                if key in problems:
                    missing.append(Missing(config, prompt.id, problems[key]))
                elif key not in entries:
                    reason = "deselected" if key in self._deselected[label] else "not run"
                    missing.append(Missing(config, prompt.id, reason))
        ok = {k: e for k, e in entries.items() if k not in problems}
        return GridRecord(cal, ok, tuple(missing))


def _entry(props: Mapping[str, Any]) -> Entry:
    regression = None
    if props.get("regression"):
        regression = {
            "config": props["config"],
            "prompt": props["prompt"],
            "reference_answer": props.get("reference_answer", ""),
            "candidate_answer": props.get("candidate_answer", ""),
        }
    return Entry(
        correct=bool(props["correct"]),
        tokens=math.nan if props.get("tokens") is None else float(props["tokens"]),
        forwards=math.nan if props.get("forwards") is None else float(props["forwards"]),
        extra=dict(props.get("extra") or {}),
        source=props.get("source", "decoded"),
        regression=regression,
    )
