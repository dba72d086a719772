"""Held-out splits: Redline on random calibration parts, measured on the other parts."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pytest_redline.report import text
from pytest_redline.lab.procedure import GridData, Procedure
from pytest_redline.lab.splits import HELDOUT_SEED, SplitOutcomes, Spread, _SplitPlan, _spread_dict


@dataclass(frozen=True, eq=False)
class HeldoutResult:
    """Redline on K random calibration parts, measured on the other parts.

    ``full_choice`` is the config deployed on all prompts. Per config: how often it is
    deployed, and the spread of its held-out gain and net accuracy over those splits.
    """

    label: str
    names: tuple[str, ...]
    reference: str
    gain_kind: str
    procedure: Procedure
    splits: int
    seed: int
    cal_size: int
    n: int
    rank: str
    full_choice: str
    outcomes: SplitOutcomes

    def counts(self) -> np.ndarray:
        return np.bincount(self.outcomes.deployed, minlength=len(self.names))

    def config_spread(self, name: str) -> tuple[Spread | None, Spread | None]:
        """(held-out gain, net accuracy) over the splits that deploy config ``name``."""
        same = self.outcomes.deployed == self.names.index(name)
        return Spread.of(self.outcomes.gain[same]), Spread.of(self.outcomes.net_accuracy[same])

    def to_dict(self) -> dict[str, Any]:
        o = self.outcomes
        configs = []
        for name, count in zip(self.names, self.counts()):
            gain, net = self.config_spread(name)
            configs.append({"name": name, "deployed": int(count), "gain": _spread_dict(gain), "net_accuracy_points": _spread_dict(net)})
        return {
            "grid": self.label,
            "alpha": o.alpha,
            "delta": self.procedure.delta,
            "correction": self.procedure.correction,
            "family": self.procedure.family,
            "reference": self.reference,
            "gain_kind": self.gain_kind,
            "n": self.n,
            "splits": self.splits,
            "seed": self.seed,
            "cal_size": self.cal_size,
            "rank": self.rank,
            "full_choice": self.full_choice,
            "gain": Spread.of(o.gain).to_dict(),
            "net_accuracy_points": Spread.of(o.net_accuracy).to_dict(),
            "exceedance": o.exceedance,
            "exceedance_pooled": o.exceedance_pooled,
            "configs": configs,
        }

    def __str__(self) -> str:
        o = self.outcomes
        spec = ".2f" if self.gain_kind == "factor" else "+.1f"
        rows = [("config", "deployed", "held-out gain [2.5, 97.5]", "d_acc [2.5, 97.5]")]
        for name, count in zip(self.names, self.counts()):
            gain, net = self.config_spread(name)
            mark = " (full sample)" if name == self.full_choice else ""
            rows.append((name + mark, str(count), gain.text(spec) if gain else "-", net.text() if net else "-"))
        return "\n".join(
            [
                f"{self.label}: held-out, alpha={o.alpha:g} delta={self.procedure.delta:g}, {self.splits} splits "
                f"(seed {self.seed}), {self.cal_size} of {self.n} prompts calibrate, ranked by {self.rank} cost",
                *text.table(rows),
                f"all splits: gain {Spread.of(o.gain).text(spec)}, d_acc {Spread.of(o.net_accuracy).text()}",
                f"exceedance (test risk > alpha): {o.exceedance:.3f}; against the pooled risk: {o.exceedance_pooled:.3f}",
            ]
        )


def heldout(
    grid: GridData,
    alpha: float,
    procedure: Procedure = Procedure(),
    splits: int = 1000,
    seed: int = HELDOUT_SEED,
    cal_fraction: float = 0.5,
    rank: str = "full",
) -> HeldoutResult:
    """Redline calibrated on each of K random parts and measured on the rest.

    ``rank="full"`` ranks configs by full-sample cost (the paper); ``"calibration"`` by the
    calibration part's cost, as an operator without the rest would.
    """
    plan = _SplitPlan.make(grid, splits, seed, cal_fraction, rank)
    return HeldoutResult(
        label=grid.label,
        names=grid.names,
        reference=grid.names[grid.reference],
        gain_kind=grid.gain_kind,
        procedure=procedure,
        splits=splits,
        seed=seed,
        cal_size=plan.parts.n_cal,
        n=grid.n,
        rank=rank,
        full_choice=grid.certify(alpha, procedure).deployed,
        outcomes=plan.redline(alpha, procedure),
    )
