"""The controller's record of what each grid item produced, from the test reports.

Every item carries its identity and outcome as user properties, written and read as one
:class:`~pytest_redline.record.ItemRecord`, so the reports alone, serial or sent by xdist
workers, tell the controller each outcome. An item the schedule skipped on
purpose carries ``scheduled`` (why) and, in a replayed grid, its recorded outcome; it is
not missing. Any other expected item without an outcome is *missing*, with a reason:
errored, skipped, deselected, or not run.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from pytest_redline.calibration import Calibration
from pytest_redline.record import ItemRecord

if TYPE_CHECKING:  # annotations only: the ledger's code calls no pytest
    import pytest

REASONS = ("errored", "skipped", "deselected", "not run")
LENGTH_WARN = Fraction(1, 20)  # warn when more than this share of a config's outcomes stopped at the token limit


_BLANK = ItemRecord.blank("", "")  # a cell without an outcome: read wrong, with unknown costs


@dataclass(frozen=True)
class Skip:
    """An item the schedule skipped on purpose."""

    reason: str  # schedule.REFERENCE_WRONG, CANNOT or CERTAIN
    recorded: ItemRecord | None  # a replayed grid's outcome (it costs nothing); None when live


@dataclass(frozen=True)
class Missing:
    config: str
    prompt: str
    reason: str


@dataclass(frozen=True)
class GridRecord:
    """What one grid's items produced: outcomes in grid order, or what is missing."""

    cal: Calibration
    entries: Mapping[tuple[str, str], ItemRecord]  # the items that ran, each with its outcome
    missing: tuple[Missing, ...]
    skips: Mapping[tuple[str, str], Skip] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return not self.missing

    def count(self, source: str) -> int:
        return sum(entry.source == source for entry in self.entries.values())

    def length_stops(self) -> dict[str, tuple[int, int]]:
        """Per config, in grid order: (outcomes that stopped at the token limit, outcomes), over
        the items that ran."""
        return dict(self._length_counts)

    def length_warned(self) -> list[str]:
        """The configs with more than LENGTH_WARN of their outcomes at the token limit (an exact
        comparison of counts): a limit too low for the suite, which shows as regressions."""
        return [c for c, (cut, total) in self._length_counts.items() if cut > LENGTH_WARN * total]

    @functools.cached_property
    def _length_counts(self) -> dict[str, tuple[int, int]]:  # counted once: every renderer asks
        counts = {c: [0, 0] for c in self.cal.configs}
        for (config, _), entry in self.entries.items():
            if entry.has_outcome and config in counts:
                counts[config][0] += entry.finish_reason == "length"
                counts[config][1] += 1
        return {c: (cut, total) for c, (cut, total) in counts.items()}

    def regressions(self) -> list[dict[str, str]]:
        """Regressions in grid order (configs, then prompts), however the reports arrived."""
        ordered = (self.entries.get((c, p.id)) for c in self.cal.configs for p in self.cal.prompts)
        return [e.regression_detail() for e in ordered if e is not None and e.regression]

    def outcome(self, config: str, prompt: str) -> ItemRecord | None:
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
        pick = (lambda c, p: self.entries.get((c, p))) if ran_only else self.outcome
        rows = [[pick(c, p.id) for p in cal.prompts] for c in cal.configs]
        if not ran_only and any(e is None for row in rows for e in row):
            return None
        rows = [[_BLANK if e is None else e for e in row] for row in rows]
        columns = sorted({k for row in rows for e in row for k in e.extra or {}})
        return OutcomeTable(
            configs=cal.configs,
            prompts=tuple(p.id for p in cal.prompts),
            correct=np.array([[e.correct for e in row] for row in rows], dtype=bool),
            tokens=np.array([[e.tokens for e in row] for row in rows], dtype=float),
            forwards=np.array([[e.forwards for e in row] for row in rows], dtype=float),
            extra={k: np.array([[(e.extra or {}).get(k, math.nan) for e in row] for row in rows], dtype=float) for k in columns},
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

    def schedule_error(self) -> str | None:
        """Why the skipped items break the schedule (a reference outcome it needed is missing, or
        right where it skipped for the reference being wrong); None when they follow it."""
        from pytest_redline.schedule import REFERENCE_WRONG

        reference_name = self.cal.grid.reference  # the field (Calibration.reference reads it)
        for (config, prompt), skip in self.skips.items():
            reference = self.entries.get((reference_name, prompt))
            if reference is None or (skip.reason == REFERENCE_WRONG and reference.correct):
                return f"{config}::{prompt} was skipped ({skip.reason}), but the reference is right there or did not run"
        return None

    def skipped(self, reason: str) -> int:
        return sum(skip.reason == reason for skip in self.skips.values())


class Ledger:
    def __init__(self, calibrations: Iterable[Calibration]) -> None:
        self._cals = {cal.label: cal for cal in calibrations}
        self._entries: dict[str, dict[tuple[str, str], ItemRecord]] = {label: {} for label in self._cals}
        self._problems: dict[str, dict[tuple[str, str], str]] = {label: {} for label in self._cals}
        self._deselected: dict[str, set[tuple[str, str]]] = {label: set() for label in self._cals}
        self._skips: dict[str, dict[tuple[str, str], Skip]] = {label: {} for label in self._cals}

    def record(self, report: pytest.TestReport) -> None:
        """Take one test report (any phase); reports of other tests are ignored."""
        if report.passed and report.when != "call":  # a passed setup or teardown says nothing
            return
        record = ItemRecord.from_properties(report.user_properties)
        if record is None or record.grid not in self._cals:
            return
        label, key = record.grid, record.key
        if report.failed or (report.skipped and hasattr(report, "wasxfail")):  # xfailed: an advisory grid's error
            self._problems[label][key] = "errored"
        elif report.skipped and record.scheduled is not None:
            self._skips[label][key] = Skip(record.scheduled, record if record.has_outcome else None)
        elif report.skipped:
            self._problems[label].setdefault(key, "skipped")
        elif report.when == "call":
            self._entries[label][key] = record

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
