"""The outcome of a certification: one frozen record per alpha, and its JSON report object.
Its text table is :mod:`pytest_redline.report.redline_table` (the reporting side)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from pytest_redline.risk.binomial import ConfidenceInterval, clopper_pearson_interval


def _json_float(x: Any) -> float | None:
    x = float(x)
    return None if math.isnan(x) else x


@dataclass(frozen=True, eq=False)
class RedlineResult:
    """The outcome of :func:`certify`. Arrays have one entry per config, in input order.

    :ivar names: the configs.
    :ivar reference: the reference's name (``reference_index``: its row).
    :ivar accuracy: the fraction of prompts each config answers correctly.
    :ivar violations: V(lambda), an int per config (``risk``: V / n).
    :ivar risk_upper: the one-sided Clopper-Pearson upper bound on the risk at confidence 1 - delta.
    :ivar p_values: the raw binomial p-values (``p_adjusted``: Holm- or Bonferroni-adjusted); NaN
        for a config outside the family (the reference with ``family="candidates"``).
    :ivar valid: the null "risk > alpha" was rejected. Outside the family: False.
    :ivar deployed: the config to serve (``deployed_index``: its row; the reference when nothing
        valid is faster).
    :ivar cost: each config's cost.
    :ivar gain: each config's gain over the reference: a percentage when
        ``gain_kind == "percent"`` (37.5 means +37.5 %), a factor when ``"factor"``
        (2.81 means 2.81x better, e.g. smaller memory).
    :ivar net_accuracy: accuracy minus the reference's, in points (-4.0 means 4 points lower).
    """

    names: tuple[str, ...]
    reference: str
    reference_index: int
    accuracy: np.ndarray
    violations: np.ndarray
    risk: np.ndarray
    risk_upper: np.ndarray
    p_values: np.ndarray
    p_adjusted: np.ndarray
    valid: np.ndarray
    deployed: str
    deployed_index: int
    cost: np.ndarray
    gain: np.ndarray
    net_accuracy: np.ndarray
    alpha: float
    delta: float
    n: int
    m: int
    correction: str
    family: str
    gain_kind: str
    lower_is_better: bool

    def risk_interval(self, confidence: float = 0.95) -> ConfidenceInterval:
        """Two-sided Clopper-Pearson intervals on every config's risk (arrays)."""
        return clopper_pearson_interval(self.violations, self.n, confidence)

    def to_dict(self, alpha_min: float | None = None) -> dict[str, Any]:
        """The JSON report object of docs/reference/reports.md (plain builtins; NaN becomes None)."""
        report: dict[str, Any] = {
            "alpha": self.alpha,
            "delta": self.delta,
            "correction": self.correction,
            "family": self.family,
            "n": self.n,
            "m": self.m,
            "reference": self.reference,
            "deployed": self.deployed,
        }
        if alpha_min is not None:
            report["alpha_min"] = alpha_min
        report["configs"] = [
            {
                "name": name,
                "accuracy": float(self.accuracy[i]),
                "violations": int(self.violations[i]),
                "risk": float(self.risk[i]),
                "risk_upper": float(self.risk_upper[i]),
                "p_value": _json_float(self.p_values[i]),
                "p_adjusted": _json_float(self.p_adjusted[i]),
                "valid": bool(self.valid[i]),
                "cost": float(self.cost[i]),
                "gain": float(self.gain[i]),
                "net_accuracy_points": float(self.net_accuracy[i]),
            }
            for i, name in enumerate(self.names)
        ]
        return report
