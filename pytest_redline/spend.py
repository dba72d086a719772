"""What a grid's run spent, against what the naive full grid (every config on every prompt)
would have spent.

Forwards come from the outcomes (the ``forwards`` column). Those of the items that ran
count whether they were decoded now or reused from the store: the figure compares
schedules, not caches. The naive figure is exact when every cell's forwards are known (a
full run, or a replayed grid, whose skipped items carry their recorded outcomes); else each
config's skipped cells are estimated at its mean forwards per prompt run. Wall time is the
time spent in ``engine.generate`` in this session, per config and in all; the naive time is
estimated from it in proportion to forwards. pytest charges decoding to the few items that
trigger it (docs/explanation/session.md), so the per-config seconds are the honest figure.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from pytest_redline.ledger import GridRecord


@dataclass(frozen=True)
class Spend:
    items_run: int
    items: int  # m * n
    forwards: float | None  # forwards of the items that ran (None: the column is empty)
    naive_forwards: float | None  # forwards of the full grid
    exact: bool  # naive_forwards is exact, not estimated
    decoded_forwards: float | None  # forwards decoded in this session
    decode_seconds: float  # wall time in engine.generate, this session
    config_seconds: Mapping[str, float] = field(default_factory=dict)  # the same, per config that decoded
    past_stop: Mapping[str, int] = field(default_factory=dict)  # per config: prompts decoded past its early stop

    @property
    def decoded_past_stops(self) -> int:
        """Prompts an I/O-bound engine decoded past early stops: sent ahead before the stop was
        decided, stored (a rerun reuses them), and not items of this run."""
        return sum(self.past_stop.values())

    @property
    def ratio(self) -> float | None:
        if self.forwards is None or not self.naive_forwards:
            return None
        return self.forwards / self.naive_forwards

    @property
    def naive_seconds(self) -> float | None:
        """Estimated wall time of decoding the full grid, from this session's decoding."""
        if not self.decoded_forwards or self.naive_forwards is None:
            return None
        return self.decode_seconds * self.naive_forwards / self.decoded_forwards

    def to_dict(self) -> dict[str, Any]:
        return {
            "items_run": self.items_run,
            "items": self.items,
            "forwards": self.forwards,
            "naive_forwards": self.naive_forwards,
            "ratio": self.ratio,
            "exact": self.exact,
            "decoded_forwards": self.decoded_forwards,
            "decode_seconds": round(self.decode_seconds, 3),
            "naive_seconds_estimate": None if self.naive_seconds is None else round(self.naive_seconds, 3),
            "decoded_past_stops": self.decoded_past_stops,
        }


def spend_of(record: GridRecord, config_seconds: Mapping[str, float] | None = None,
             past_stop: Mapping[str, int] | None = None) -> Spend:
    """What ``record``'s run spent; ``config_seconds``: this session's decoding time per config;
    ``past_stop``: per config, the prompts decoded past its early stop."""
    config_seconds = dict(config_seconds or {})
    cal = record.cal
    ran_forwards = [e.forwards for e in record.entries.values()]
    decoded = [e.forwards for e in record.entries.values() if e.source == "decoded"]
    naive, exact = _naive(record)
    return Spend(
        items_run=len(record.entries),
        items=cal.m * cal.n,
        forwards=_total(ran_forwards),
        naive_forwards=naive,
        exact=exact,
        decoded_forwards=_total(decoded),
        decode_seconds=sum(config_seconds.values()),
        config_seconds=config_seconds,
        past_stop=dict(past_stop or {}),
    )


def _naive(record: GridRecord) -> tuple[float | None, bool]:
    cal = record.cal
    total, exact = 0.0, True
    for config in cal.configs:
        cells = [record.outcome(config, p.id) for p in cal.prompts]
        known = [e.forwards for e in cells if e is not None]
        if any(math.isnan(f) for f in known):
            return None, False
        unknown = len(cells) - len(known)
        if unknown:
            if not known:
                return None, False
            exact = False
        total += sum(known) + unknown * sum(known) / max(len(known), 1)
    return total, exact


def _total(values: list[float]) -> float | None:
    if any(math.isnan(v) for v in values):
        return None
    return float(sum(values))
