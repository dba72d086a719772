"""The collection tree of a grid: file -> one collector per config -> one item per prompt.

Node ids read ``redline.yaml::acc85/semi70::gsm8k/17``. The reference's collector comes
first. An item's ``setup`` gets its outcome (and the reference's) from the decoder, so an
engine or scorer failure is an *error*; an item the schedule skips on purpose is *skipped*
with the reason (a replayed grid's carries its recorded outcome); in an advisory grid
(``required: false``) an error is an *xfail*, which pytest shows and never counts as a
failure. ``runtest`` never fails: a regression (reference right, candidate wrong) passes
with its own status, and the verdict comes at session end.

Each item keeps an :class:`~pytest_redline.record.ItemRecord` (identity from collection on,
the outcome once it has one) and publishes it as its ``user_properties``, which the
controller's ledger reads back from the reports.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Iterable

import pytest

from pytest_redline.decode import DecodeError, Skipped
from pytest_redline.record import ItemRecord, PromptKey, publish

ADVISORY_ERROR = "redline: error in an advisory grid (required: false), which fails nothing"

if TYPE_CHECKING:
    from pytest_redline.calibration import Calibration
    from pytest_redline.session import Gate


class GridFile(pytest.File):
    def __init__(self, *, gate: "Gate", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.gate = gate

    def collect(self):
        cal = self.gate.calibration(self.path)
        for config in cal.collection_order():
            yield ConfigCollector.from_parent(self, name=config, gate=self.gate, cal=cal)


class ConfigCollector(pytest.Collector):
    """One config of a grid: that config's suite of prompts."""

    def __init__(self, *, gate: "Gate", cal: "Calibration", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.gate, self.cal = gate, cal

    def collect(self):
        for index, prompt in enumerate(self.cal.prompts):
            yield PromptItem.from_parent(self, name=prompt.id, gate=self.gate, cal=self.cal, config_name=self.name, index=index)


class PromptItem(pytest.Item):
    """One calibration prompt under one config."""

    def __init__(self, *, gate: "Gate", cal: "Calibration", config_name: str, index: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.gate, self.cal, self.config_name, self.index = gate, cal, config_name, index
        self.record = ItemRecord(cal.label, config_name, cal.prompts[index].id)
        publish(self.user_properties, self.record)
        self.candidate_outcome = self.reference_outcome = None

    @property
    def key(self) -> PromptKey:
        return PromptKey(self.cal.label, self.config_name, self.record.prompt, self.index)

    def _publish(self, record: ItemRecord) -> None:
        self.record = record
        publish(self.user_properties, record)

    @property
    def is_reference(self) -> bool:
        return self.config_name == self.cal.reference

    def settled(self) -> bool:
        """Whether both outcomes this item needs are known without decoding (from earlier
        items, or a skip the schedule decided): then it may run by the short protocol."""
        decoder = self.gate.decoder(self.cal)
        return decoder.ready(self.cal.reference, self.index) and decoder.ready(self.config_name, self.index)

    def setup(self) -> None:
        decoder = self.gate.decoder(self.cal)
        try:
            self.reference_outcome = decoder.outcome(self.cal.reference, self.index)
            self.candidate_outcome = decoder.outcome(self.config_name, self.index)
            return
        except Skipped as s:  # on purpose: the schedule decided this outcome cannot change the verdict
            record = dataclasses.replace(self.record, scheduled=s.reason)
            self._publish(record if s.recorded is None else record.with_outcome(s.recorded, "recorded"))
            skipped, message = True, s.message
        except DecodeError as e:  # an error of this item: in full the first time, then a pointer to it
            skipped, message = False, self.gate.explain(e, self.nodeid, verbose=self.config.get_verbosity() > 0)
        if skipped:
            pytest.skip(message)
        if self.cal.advisory:  # visible (XFAIL; JUnit XML <skipped type="pytest.xfail">), never a failure
            raise pytest.xfail.Exception(f"{ADVISORY_ERROR}: {message}")
        pytest.fail(message, pytrace=False)

    def runtest(self) -> None:
        out, ref = self.candidate_outcome, self.reference_outcome
        source = "decoded" if out.session == self.gate.session_id else "store"
        if self.is_reference:
            self._publish(self.record.with_outcome(out, source))
        elif ref.correct and not out.correct:  # a regression: both answers
            self._publish(self.record.with_outcome(out, source, regression=True, reference_answer=ref.text, candidate_answer=out.text,
                                                   reference_extracted=ref.answer, reference_rule=ref.rule or None))
        else:
            self._publish(self.record.with_outcome(out, source, regression=False))

    def reportinfo(self):
        return self.path, None, f"redline {self.cal.grid.name}: {self.config_name} on {self.name}"


def prompt_keys(items: Iterable[pytest.Item]) -> list[PromptKey]:
    """The keys of the grid items among ``items`` (what the gate plans and deselects by)."""
    return [item.key for item in items if isinstance(item, PromptItem)]
