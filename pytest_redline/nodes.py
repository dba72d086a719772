"""The collection tree of a grid: file -> one collector per config -> one item per prompt.

Node ids read ``redline.yaml::acc85/semi70::gsm8k/17``. The reference's collector comes
first. An item's ``setup`` gets its outcome (and the reference's) from the decoder, so an
engine or scorer failure is an *error*; an item the schedule skips on purpose is *skipped*
with the reason (a replayed grid's carries its recorded outcome). ``runtest`` never
fails: a regression (reference right, candidate wrong) passes with its own status, and the
verdict comes at session end.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from pytest_redline.decode import DecodeError, Skipped

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
        self.user_properties += [("grid", cal.label), ("config", config_name), ("prompt", cal.prompts[index].id)]
        self.candidate_outcome = self.reference_outcome = None

    @property
    def is_reference(self) -> bool:
        return self.config_name == self.cal.reference

    def setup(self) -> None:
        decoder = self.gate.decoder(self.cal)
        try:
            self.reference_outcome = decoder.outcome(self.cal.reference, self.index)
            self.candidate_outcome = decoder.outcome(self.config_name, self.index)
            return
        except Skipped as s:  # on purpose: the schedule decided this outcome cannot change the verdict
            self.user_properties.append(("scheduled", s.reason))
            if s.recorded is not None:
                self.user_properties += _outcome_properties(s.recorded, "recorded")
            skipped, message = True, s.message
        except DecodeError as e:  # an error of this item: in full the first time, then a pointer to it
            skipped, message = False, self.gate.explain(e, self.nodeid, verbose=self.config.get_verbosity() > 0)
        if skipped:
            pytest.skip(message)
        pytest.fail(message, pytrace=False)

    def runtest(self) -> None:
        out, ref = self.candidate_outcome, self.reference_outcome
        self.user_properties += _outcome_properties(out, "decoded" if out.session == self.gate.session_id else "store")
        if not self.is_reference:
            regressed = ref.correct and not out.correct
            self.user_properties.append(("regression", regressed))
            if regressed:
                self.user_properties += [("reference_answer", ref.text), ("candidate_answer", out.text)]

    def reportinfo(self):
        return self.path, None, f"redline {self.cal.grid.name}: {self.config_name} on {self.name}"


def _outcome_properties(out: Any, source: str) -> list[tuple[str, Any]]:
    return [
        ("correct", out.correct),
        ("tokens", out.tokens),
        ("forwards", out.forwards),
        ("extra", dict(out.extra)),
        ("source", source),
    ]
