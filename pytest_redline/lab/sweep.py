"""The budget sweep: the deployed config, its gain and net accuracy at each alpha, and alpha_min."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from pytest_redline import risk
from pytest_redline.report import text
from pytest_redline.lab.procedure import GridData, Procedure


@dataclass(frozen=True, eq=False)
class SweepResult:
    """The deployed config, its gain and net accuracy at each budget, and alpha_min."""

    label: str
    cost_kind: str
    gain_kind: str
    reference: str
    delta: float
    alphas: np.ndarray
    deployed: tuple[str, ...]
    gain: np.ndarray
    net_accuracy: np.ndarray
    alpha_min: float | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "grid": self.label,
            "cost": self.cost_kind,
            "gain_kind": self.gain_kind,
            "reference": self.reference,
            "delta": self.delta,
            "alpha_min": self.alpha_min,
            "alphas": [
                {"alpha": float(a), "deployed": d, "gain": float(g), "net_accuracy_points": float(x)}
                for a, d, g, x in zip(self.alphas, self.deployed, self.gain, self.net_accuracy)
            ],
        }

    def __str__(self) -> str:
        rows = [("alpha", "deployed", "gain", "d_acc")] + [
            (f"{a:.2f}", d, text.gain(g, self.gain_kind), f"{x:+.1f}")
            for a, d, g, x in zip(self.alphas, self.deployed, self.gain, self.net_accuracy)
        ]
        amin = "none on this grid" if self.alpha_min is None else f"{self.alpha_min:g}"
        head = f"{self.label}: sweep, cost {self.cost_kind}, reference {self.reference}, delta={self.delta:g}"
        return "\n".join([head] + text.table(rows, left=(1,)) + [f"alpha_min: {amin}"])


def sweep(grid: GridData, alphas: Sequence[float] = risk.DEFAULT_ALPHAS, procedure: Procedure = Procedure()) -> SweepResult:
    """:func:`risk.certify` at every budget of ``alphas`` (sorted); alpha_min is taken on that grid."""
    options = dict(names=grid.names, lower_is_better=grid.lower_is_better, **procedure.risk_options())
    results = risk.sweep(grid.correct, grid.cost, grid.reference, np.unique(alphas), procedure.delta, **options)
    amin = risk.alpha_min_of(results)
    d = np.array([r.deployed_index for r in results])
    return SweepResult(
        label=grid.label,
        cost_kind=grid.cost_kind,
        gain_kind=grid.gain_kind,
        reference=grid.names[grid.reference],
        delta=procedure.delta,
        alphas=np.array([r.alpha for r in results]),
        deployed=tuple(r.deployed for r in results),
        gain=results[0].gain[d],
        net_accuracy=results[0].net_accuracy[d],
        alpha_min=amin,
    )
