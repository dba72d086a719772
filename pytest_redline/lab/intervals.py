"""Intervals for the deployed config: a paired bootstrap for its gain and net accuracy, exact
(Clopper-Pearson) intervals for its risk."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pytest_redline import risk
from pytest_redline.checks import open_unit
from pytest_redline.lab.procedure import GridData, Procedure
from pytest_redline.lab.splits import BOOTSTRAP_SEED, Spread, bootstrap_weights


@dataclass(frozen=True, eq=False)
class IntervalsResult:
    """Paired bootstrap intervals for the deployed config, and exact intervals for its risk."""

    label: str
    alpha: float
    delta: float
    deployed: str
    reference: str
    gain_kind: str
    boot: int
    seed: int
    confidence: float
    gain: float
    gain_interval: risk.ConfidenceInterval
    net_accuracy: float
    net_accuracy_interval: risk.ConfidenceInterval
    violations: int
    n: int
    risk_interval: risk.ConfidenceInterval
    risk_upper: float

    @property
    def risk(self) -> float:
        return self.violations / self.n

    def to_dict(self) -> dict[str, Any]:
        def interval(ci: risk.ConfidenceInterval) -> list[float]:
            return [float(ci.low), float(ci.high)]

        return {
            "grid": self.label,
            "alpha": self.alpha,
            "delta": self.delta,
            "deployed": self.deployed,
            "reference": self.reference,
            "gain_kind": self.gain_kind,
            "boot": self.boot,
            "seed": self.seed,
            "confidence": self.confidence,
            "gain": self.gain,
            "gain_interval": interval(self.gain_interval),
            "net_accuracy_points": self.net_accuracy,
            "net_accuracy_interval": interval(self.net_accuracy_interval),
            "violations": self.violations,
            "n": self.n,
            "risk": self.risk,
            "risk_interval": interval(self.risk_interval),
            "risk_upper": self.risk_upper,
        }

    def __str__(self) -> str:
        g, x, r = self.gain_interval, self.net_accuracy_interval, self.risk_interval
        pct = f"{100 * self.confidence:g}%"
        if self.gain_kind == "factor":
            gain = f"{self.gain:.2f}x [{g.low:.2f}, {g.high:.2f}]"
        else:
            gain = f"{self.gain:+.1f}% [{g.low:+.1f}, {g.high:+.1f}]"
        return "\n".join([
            f"{self.label}: alpha={self.alpha:g} delta={self.delta:g}, deployed {self.deployed} (reference {self.reference})",
            f"gain {gain}  (paired bootstrap, {self.boot} resamples, seed {self.seed}, {pct})",
            f"net accuracy {self.net_accuracy:+.1f} [{x.low:+.1f}, {x.high:+.1f}] points",
            f"risk {self.risk:.4f} = {self.violations}/{self.n}, Clopper-Pearson {pct} [{r.low:.4f}, {r.high:.4f}], "
            f"upper bound at 1 - delta: {self.risk_upper:.4f}",
        ])


def intervals(
    grid: GridData,
    alpha: float,
    procedure: Procedure = Procedure(),
    boot: int = 10_000,
    seed: int = BOOTSTRAP_SEED,
    confidence: float = 0.95,
) -> IntervalsResult:
    """Intervals for the config deployed on all prompts at budget ``alpha``.

    The gain and the net accuracy come from a paired bootstrap over prompts: each of the B
    weight vectors reweights the deployed config and the reference alike, and the gain is
    the ratio of weighted sums (pooled TPF). The risk gets a two-sided Clopper-Pearson
    interval at ``confidence`` and the one-sided upper bound at 1 - delta.
    """
    open_unit("confidence", confidence)
    result = grid.certify(alpha, procedure)
    d, ref = result.deployed_index, grid.reference
    weights = bootstrap_weights(grid.n, boot, seed).astype(float)
    cost = grid.weighted_cost(weights, rows=[d, ref])
    accuracy = weights @ grid.correct[[d, ref]].T.astype(float) / grid.n

    def percentiles(x: np.ndarray) -> risk.ConfidenceInterval:
        spread = Spread.of(x, confidence)
        return risk.ConfidenceInterval(spread.low, spread.high)

    v = int(result.violations[d])
    return IntervalsResult(
        label=grid.label,
        alpha=alpha,
        delta=procedure.delta,
        deployed=result.deployed,
        reference=result.reference,
        gain_kind=grid.gain_kind,
        boot=boot,
        seed=seed,
        confidence=confidence,
        gain=float(result.gain[d]),
        gain_interval=percentiles(grid.gain(cost[:, 0], cost[:, 1])),
        net_accuracy=float(result.net_accuracy[d]),
        net_accuracy_interval=percentiles(100.0 * (accuracy[:, 0] - accuracy[:, 1])),
        violations=v,
        n=grid.n,
        risk_interval=risk.clopper_pearson_interval(v, grid.n, confidence),
        risk_upper=float(result.risk_upper[d]),
    )
