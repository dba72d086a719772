"""The verdict on one grid: certify its outcomes and decide what the mode requires.

- ``all`` (no ``deploy``): every candidate must be valid;
- ``gate`` (``deploy: NAME``): that config must be valid;
- ``select`` (``deploy: fastest``): nothing must be, and the deployed config is reported.

A partial run (some item produced no outcome) certifies nothing, in every mode.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pytest_redline.calibration import Calibration
from pytest_redline.ledger import GridRecord, Missing

POWER = 0.8


@dataclass(frozen=True)
class GridVerdict:
    cal: Calibration
    record: GridRecord
    result: Any = None  # risk.RedlineResult, when the run was complete
    alpha_min: float | None = None
    table: Any = None  # outcomes.OutcomeTable, when the run was complete
    error: str | None = None  # the outcomes could not be certified (e.g. a cost column is empty)

    @property
    def complete(self) -> bool:
        return self.record.complete

    @property
    def missing(self) -> tuple[Missing, ...]:
        return self.record.missing

    @property
    def required(self) -> tuple[str, ...]:
        """The configs this grid's mode requires to be certified."""
        cal = self.cal
        if cal.mode == "select":
            return ()
        if cal.mode == "gate":
            return (cal.deploy,)
        return tuple(c for c in cal.configs if c != cal.reference)

    @property
    def not_certified(self) -> tuple[str, ...]:
        """Required configs that are not valid (all of them when nothing was certified)."""
        if self.result is None:
            return self.required
        valid = dict(zip(self.result.names, self.result.valid))
        return tuple(c for c in self.required if not valid[c])

    @property
    def certified(self) -> bool:
        return self.complete and self.result is not None and not self.not_certified

    def prompts_needed(self, name: str) -> int | None:
        """Prompts that would certify ``name`` with 80 % power if its observed risk held; None if no n would."""
        from pytest_redline.risk import prompts_needed

        i = self.result.names.index(name)
        risk = float(self.result.risk[i])
        if risk >= self.cal.alpha:
            return None
        return prompts_needed(self.cal.alpha, risk, self.cal.m, self.cal.delta_share, power=POWER)


def judge(record: GridRecord) -> GridVerdict:
    """Certify a grid's outcomes (nothing is certified from a partial run)."""
    if not record.complete:
        return GridVerdict(record.cal, record)
    from pytest_redline import risk
    from pytest_redline.outcomes import OutcomeError, gain_kind

    cal = record.cal
    table = record.table()
    options = dict(
        names=cal.configs,
        lower_is_better=cal.grid.lower_is_better,
        gain=gain_kind(cal.grid.direction),
        correction=cal.correction,
    )
    try:
        cost = table.cost(cal.grid.cost)
        result = risk.certify(table.correct, cost, cal.reference, cal.alpha, cal.delta_share, **options)
        alpha_min = risk.alpha_min(table.correct, cost, cal.reference, cal.delta_share, **options)
    except (OutcomeError, ValueError) as e:
        return GridVerdict(cal, record, table=table, error=f"{cal.label}: cannot certify: {e}")
    return GridVerdict(cal, record, result=result, alpha_min=alpha_min, table=table)
