"""The baselines against Redline on the same held-out splits: the mean-accuracy rule, the
plug-in rule and Redline without the multiplicity correction."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

from pytest_redline.report import text
from pytest_redline.lab.procedure import GridData, Procedure
from pytest_redline.lab.splits import HELDOUT_SEED, SplitOutcomes, _SplitPlan


#: Tolerances t (accuracy points) of the mean-accuracy rule.
MEAN_ACCURACY_TOLERANCES = (0, 1, 2, 3, 4, 5, 6, 7, 8, 10)


@dataclass(frozen=True, eq=False)
class BaselinesResult:
    """Redline and the other selection rules on the same splits: mean held-out gain and exceedance."""

    label: str
    gain_kind: str
    alpha: float
    delta: float
    splits: int
    cal_size: int
    tolerances: tuple[float, ...]
    rules: tuple[SplitOutcomes, ...]

    def rule(self, name: str) -> SplitOutcomes:
        for r in self.rules:
            if r.rule == name:
                return r
        raise KeyError(f"no rule {name!r}; rules: {', '.join(r.rule for r in self.rules)}")

    def mean_accuracy(self) -> list[SplitOutcomes]:
        return [self.rule(mean_accuracy_rule(t)) for t in self.tolerances]

    def to_dict(self) -> dict[str, Any]:
        return {
            "grid": self.label,
            "alpha": self.alpha,
            "delta": self.delta,
            "gain_kind": self.gain_kind,
            "splits": self.splits,
            "cal_size": self.cal_size,
            "rules": [
                {
                    "rule": r.rule,
                    "mean_gain": r.mean_gain,
                    "mean_net_accuracy_points": r.mean_net_accuracy,
                    "exceedance": r.exceedance,
                    "exceedance_pooled": r.exceedance_pooled,
                }
                for r in self.rules
            ],
        }

    def __str__(self) -> str:
        rows = [("rule", "mean gain", "mean d_acc", "exceedance", "pooled")] + [
            (r.rule, text.gain(r.mean_gain, self.gain_kind), f"{r.mean_net_accuracy:+.2f}", f"{r.exceedance:.3f}", f"{r.exceedance_pooled:.3f}")
            for r in self.rules
        ]
        head = (
            f"{self.label}: baselines at alpha={self.alpha:g} (nominal exceedance delta={self.delta:g}), "
            f"{self.splits} splits, {self.cal_size} prompts calibrate; gain and d_acc held out, averaged over all splits"
        )
        return "\n".join([head] + text.table(rows))


def mean_accuracy_rule(t: float) -> str:
    return f"mean-accuracy {t:g} pts"


PLUG_IN = "plug-in (risk <= alpha)"
UNCORRECTED = "redline without correction"


def baselines(
    grid: GridData,
    alpha: float,
    procedure: Procedure = Procedure(),
    splits: int = 1000,
    seed: int = HELDOUT_SEED,
    cal_fraction: float = 0.5,
    rank: str = "full",
    tolerances: Sequence[float] = MEAN_ACCURACY_TOLERANCES,
) -> BaselinesResult:
    """Redline against the simple rules, on the held-out splits of :func:`heldout`.

    - mean accuracy: the fastest config whose calibration accuracy is within t points of
      the reference's, for each t of ``tolerances``;
    - plug-in: the fastest config whose calibration risk V / n_cal is at most alpha;
    - Redline without the multiplicity correction: each config tested at delta.
    """
    plan = _SplitPlan.make(grid, splits, seed, cal_fraction, rank)
    parts, ref = plan.parts, grid.reference
    rules = [plan.redline(alpha, procedure)]
    for t in tolerances:
        if not t >= 0:
            raise ValueError(f"tolerances ({list(tolerances)!r}) must be accuracy points >= 0.")
        # within t points, in integers: 100 (C_ref - C_i) <= t n_cal
        within = 100 * (parts.cal_correct[:, [ref]] - parts.cal_correct) <= t * parts.n_cal
        rules.append(plan.run(mean_accuracy_rule(t), alpha, within))
    rules.append(plan.run(PLUG_IN, alpha, parts.cal_violations / parts.n_cal <= alpha))
    rules.append(plan.redline(alpha, replace(procedure, correction="none"), UNCORRECTED))
    return BaselinesResult(
        label=grid.label,
        gain_kind=grid.gain_kind,
        alpha=alpha,
        delta=procedure.delta,
        splits=splits,
        cal_size=parts.n_cal,
        tolerances=tuple(tolerances),
        rules=tuple(rules),
    )
