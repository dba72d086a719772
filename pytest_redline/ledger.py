"""The controller's record of what each grid item produced, from the test reports.

Every item carries its identity and outcome as user properties (``grid``, ``config``,
``prompt``, ``correct``, ``tokens``, ``forwards``, ...), so the reports alone, serial or
sent by xdist workers, tell the controller each outcome. An item the schedule skipped on
purpose carries ``scheduled`` (why) and, in a replayed grid, its recorded outcome; it is
not missing. Any other expected item without an outcome is *missing*, with a reason:
errored, skipped, deselected, or not run.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
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
class Skip:
    """An item the schedule skipped on purpose."""

    reason: str  # schedule.REFERENCE_WRONG, CANNOT or CERTAIN
    recorded: Entry | None  # a replayed grid's outcome (it costs nothing); None when live


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
    skips: Mapping[tuple[str, str], Skip] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return not self.missing

    def count(self, source: str) -> int:
        return sum(entry.source == source for entry in self.entries.values())

    def regressions(self) -> list[dict[str, str]]:
        """Regressions in grid order (configs, then prompts), however the reports arrived."""
        ordered = (self.entries.get((c, p.id)) for c in self.cal.configs for p in self.cal.prompts)
        return [e.regression for e in ordered if e is not None and e.regression is not None]

    def outcome(self, config: str, prompt: str) -> Entry | None:
        """The outcome of an item that ran, else a skipped item's recorded one, else None."""
        entry = self.entries.get((config, prompt))
        if entry is None and (config, prompt) in self.skips:
            entry = self.skips[(config, prompt)].recorded
        return entry

    def table(self, ran_only: bool = False):
        """The outcomes as an :class:`~pytest_redline.outcomes.OutcomeTable` (recorded outcomes
        of skipped items included unless ``ran_only``); None unless every cell has one.

        With ``ran_only`` every cell is filled: cells without an item that ran read wrong,
        with NaN costs (for the schedule's arrays, alongside :meth:`ran`)."""
        import numpy as np

        from pytest_redline.outcomes import OutcomeTable

        cal = self.cal
        blank = Entry(False, math.nan, math.nan, {}, "", None)
        pick = (lambda c, p: self.entries.get((c, p))) if ran_only else self.outcome
        rows = [[pick(c, p.id) for p in cal.prompts] for c in cal.configs]
        if not ran_only and any(e is None for row in rows for e in row):
            return None
        rows = [[blank if e is None else e for e in row] for row in rows]
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

    def ran(self):
        """Bool array (configs x prompts): the items that ran (not skipped on purpose)."""
        import numpy as np

        cal = self.cal
        return np.array([[(c, p.id) in self.entries for p in cal.prompts] for c in cal.configs], dtype=bool)

    def stops(self) -> tuple[str | None, ...]:
        """Per config, why the schedule stopped it early (None: it was not stopped)."""
        from pytest_redline.schedule import STOPS

        found: dict[str, str] = {}
        for (config, _), skip in self.skips.items():
            if skip.reason in STOPS:
                found.setdefault(config, skip.reason)
        return tuple(found.get(c) for c in self.cal.configs)

    def skipped(self, reason: str) -> int:
        return sum(skip.reason == reason for skip in self.skips.values())


def is_regression(report: Any) -> bool:
    """A passed call whose item regressed (reference right, candidate wrong)."""
    return report.when == "call" and report.passed and ("regression", True) in map(tuple, report.user_properties)


class Ledger:
    def __init__(self, calibrations: Iterable[Calibration]) -> None:
        self._cals = {cal.label: cal for cal in calibrations}
        self._entries: dict[str, dict[tuple[str, str], Entry]] = {label: {} for label in self._cals}
        self._problems: dict[str, dict[tuple[str, str], str]] = {label: {} for label in self._cals}
        self._deselected: dict[str, set[tuple[str, str]]] = {label: set() for label in self._cals}
        self._skips: dict[str, dict[tuple[str, str], Skip]] = {label: {} for label in self._cals}

    def record(self, report: Any) -> None:
        """Take one test report (any phase); reports of other tests are ignored."""
        props = dict(report.user_properties)
        label = props.get("grid")
        if label not in self._cals:
            return
        key = (props["config"], props["prompt"])
        if report.failed:
            self._problems[label][key] = "errored"
        elif report.skipped and "scheduled" in props:
            self._skips[label][key] = Skip(props["scheduled"], _entry(props) if "correct" in props else None)
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
        entries, problems, skips = self._entries[label], self._problems[label], self._skips[label]
        missing = []
        for config in cal.configs:
            for prompt in cal.prompts:
                key = (config, prompt.id)
                if key in problems:
                    missing.append(Missing(config, prompt.id, problems[key]))
                elif key not in entries and key not in skips:
                    reason = "deselected" if key in self._deselected[label] else "not run"
                    missing.append(Missing(config, prompt.id, reason))
        ok = {k: e for k, e in entries.items() if k not in problems}
        return GridRecord(cal, ok, tuple(missing), {k: s for k, s in skips.items() if k not in problems})


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
