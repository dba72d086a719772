"""What an analysis runs on: the certification procedure (:class:`Procedure`) and the outcome
arrays of one grid (:class:`GridData`)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

import numpy as np

from pytest_redline import risk
from pytest_redline.checks import CORRECTIONS, FAMILIES, choice, open_unit
from pytest_redline.outcomes import OutcomeError, OutcomeTable, cost_direction, gain_kind


#: The corrections of a Procedure: certification's, and "none" (each config tested at delta).
PROCEDURE_CORRECTIONS = (*CORRECTIONS, "none")


@dataclass(frozen=True)
class Procedure:
    """How configs are certified: family-wise level ``delta``, the correction and the family.

    ``correction="none"`` tests each config at delta (the ablation without the multiplicity
    correction); ``family="all"`` counts the reference in the family (the paper).
    """

    delta: float = 0.10
    correction: str = "holm"
    family: str = "all"

    def __post_init__(self) -> None:
        open_unit("delta", self.delta)
        choice("correction", self.correction, PROCEDURE_CORRECTIONS)
        choice("family", self.family, FAMILIES)

    def valid(self, violations: np.ndarray, n: int, alphas: Sequence[float], reference: int) -> np.ndarray:
        """Which configs are certified, for every budget and split at once.

        ``violations`` has shape (K, m): each split's calibration counts on ``n`` prompts.
        Returns a bool array (len(alphas), K, m). Agrees with :func:`risk.certify` on each
        split (the same p-values and the same step-down; ties in config order).
        """
        tested = risk.family_mask(violations.shape[1], reference, self.family)
        # p-values of every possible count, per budget; then look each split's counts up.
        table = np.stack([risk.binom_pvalue(np.arange(n + 1), n, a) for a in alphas])  # (A, n + 1)
        return risk.reject_rows(table[:, violations], self.delta, tested, self.correction)  # (A, K, m)

    def risk_options(self) -> dict[str, str]:
        """Keyword arguments for :func:`risk.certify` (which has no ``"none"`` correction)."""
        if self.correction == "none":
            raise ValueError("correction 'none' is only for the baselines; certify with 'holm' or 'bonferroni'.")
        return {"correction": self.correction, "family": self.family}


@dataclass(frozen=True, eq=False)
class GridData:
    """The outcome arrays an analysis needs: who is right, and what each prompt costs.

    The cost of config i on prompts weighted by w (a 0/1 mask or bootstrap counts) is
    ``(w @ cost_num[i]) / (w @ cost_den[i])``: tpf pools tokens over forwards; apf and
    extra columns average a per-prompt value (their denominator is 1 on every prompt).
    ``cost`` is the full-sample cost, as :meth:`OutcomeTable.cost` gives it.
    """

    names: tuple[str, ...]
    reference: int
    correct: np.ndarray
    cost: np.ndarray
    cost_num: np.ndarray
    cost_den: np.ndarray
    cost_kind: str = "tpf"
    lower_is_better: bool = False
    label: str = "grid"

    @classmethod
    def from_table(
        cls,
        table: OutcomeTable,
        reference: str,
        cost_kind: str = "tpf",
        lower_is_better: bool | None = None,
        label: str | None = None,
    ) -> "GridData":
        """From an outcome table; ``lower_is_better`` defaults to the cost's usual direction."""
        cost = table.cost(cost_kind)  # an OutcomeError naming the column if a needed cell is empty
        if not np.all(cost > 0):
            raise OutcomeError(f"{table.source}: cost '{cost_kind}' must be positive for every config, got {cost.tolist()}")
        if cost_kind == "tpf":
            num, den = table.tokens, table.forwards
        elif cost_kind == "apf":
            num, den = table.tokens / np.maximum(table.forwards, 1.0), np.ones(table.correct.shape)
        else:
            num, den = table.extra[cost_kind], np.ones(table.correct.shape)
        if lower_is_better is None:
            lower_is_better = cost_direction(cost_kind) == "lower"
        return cls(
            names=table.configs,
            reference=table.index(reference),
            correct=table.correct,
            cost=cost,
            cost_num=num,
            cost_den=den,
            cost_kind=cost_kind,
            lower_is_better=bool(lower_is_better),
            label=table.source if label is None else label,
        )

    @property
    def m(self) -> int:
        return len(self.names)

    @property
    def n(self) -> int:
        return self.correct.shape[1]

    @property
    def gain_kind(self) -> str:
        return gain_kind("lower" if self.lower_is_better else "higher")

    @cached_property
    def joint(self) -> np.ndarray:
        """The violations, (m, n) bool: the reference is right and the config is wrong."""
        return self.correct[self.reference] & ~self.correct

    def weighted_cost(self, weights: np.ndarray, rows: Sequence[int] | None = None) -> np.ndarray:
        """The cost of each config (or of ``rows``) under each weight vector: (K, m) from (K, n)."""
        num, den = (self.cost_num, self.cost_den) if rows is None else (self.cost_num[rows], self.cost_den[rows])
        return (weights @ num.T) / (weights @ den.T)

    def gain(self, cost: np.ndarray, reference_cost: np.ndarray) -> np.ndarray:
        """Gain over the reference: percent (37.5 = +37.5 %) or a factor (2.81 = 2.81x better)."""
        ratio = reference_cost / cost if self.lower_is_better else cost / reference_cost
        return 100.0 * (ratio - 1.0) if self.gain_kind == "percent" else ratio

    def score(self, cost: np.ndarray) -> np.ndarray:
        """Higher is better: the cost, or its negative when lower cost is better."""
        return -cost if self.lower_is_better else cost

    def certify(self, alpha: float, procedure: Procedure) -> risk.RedlineResult:
        """:func:`risk.certify` on all prompts."""
        return risk.certify(
            self.correct, self.cost, self.reference, alpha, procedure.delta,
            names=self.names, lower_is_better=self.lower_is_better, **procedure.risk_options(),
        )
