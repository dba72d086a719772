"""The paper's evaluation on recorded outcomes: budget sweeps, held-out splits, baselines,
the validity study and bootstrap intervals.

Everything is vectorized over splits and budgets. K splits of n prompts are a (K, n)
boolean calibration mask; one matrix product of that mask with the stacked (configs x
prompts) arrays gives every split's calibration counts and costs, and the test part's are
the totals minus those. Nothing loops over prompts.

The paper's protocols are the defaults:

- held-out splits (:func:`heldout`, :func:`baselines`): one generator
  ``numpy.random.default_rng(20260918)`` draws K permutations; the calibration part is the
  first ``round(cal_fraction * n)`` indices of each; configs are ranked by full-sample cost;
- the validity study (:func:`validity`): split s is ``default_rng(s).permutation(n)``, and
  every calibration size takes the first n_cal indices of the same permutation;
- the bootstrap (:func:`intervals`): ``default_rng(20260920).multinomial(n, [1/n]*n, size=B)``
  weight vectors, the same weights for the deployed config and the reference.

numpy and scipy only (through :mod:`pytest_redline.risk`); never torch. Validity, the
deployment rule and the text tables are the gate's own (:func:`risk.reject_rows`,
:func:`risk.select_deployed`, :mod:`pytest_redline.text`), so an analysis measures the
procedure the gate runs.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, Sequence

import numpy as np

from pytest_redline import risk, text
from pytest_redline.checks import CORRECTIONS, FAMILIES, choice, in_open_unit, open_unit, positive_int
from pytest_redline.outcomes import OutcomeError, OutcomeTable, cost_direction, gain_kind

__all__ = [
    "BOOTSTRAP_SEED",
    "HELDOUT_SEED",
    "MEAN_ACCURACY_TOLERANCES",
    "BaselinesResult",
    "GridData",
    "HeldoutResult",
    "IntervalsResult",
    "Procedure",
    "Spread",
    "SplitOutcomes",
    "SweepResult",
    "ValidityResult",
    "baselines",
    "bootstrap_weights",
    "calibration_mask",
    "calibration_sizes",
    "heldout",
    "heldout_permutations",
    "intervals",
    "sweep",
    "validity",
    "validity_permutations",
]

HELDOUT_SEED = 20260918
BOOTSTRAP_SEED = 20260920
#: Tolerances t (accuracy points) of the mean-accuracy rule.
MEAN_ACCURACY_TOLERANCES = (0, 1, 2, 3, 4, 5, 6, 7, 8, 10)
#: The validity study's calibration sizes; "n//2" is half the prompts.
VALIDITY_SIZES = ("n//2", 200, 100, 50, 25)
#: Calibration sizes must leave this many prompts on each side.
MIN_PART = 15
#: A validity combination is flagged when its FWER exceeds delta by more than this many
#: binomial standard errors of the estimate, sqrt(f (1 - f) / K).
MC_Z = 2.0
#: The corrections of a Procedure: certification's, and "none" (each config tested at delta).
PROCEDURE_CORRECTIONS = (*CORRECTIONS, "none")
RANKS = ("full", "calibration")


# --------------------------------------------------------------------------- inputs


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


# --------------------------------------------------------------------------- splits


def heldout_permutations(n: int, splits: int, seed: int = HELDOUT_SEED) -> np.ndarray:
    """The paper's held-out protocol: one generator draws ``splits`` permutations, (K, n)."""
    rng = np.random.default_rng(seed)
    return np.stack([rng.permutation(n) for _ in range(positive_int("splits", splits))])


def validity_permutations(n: int, splits: int) -> np.ndarray:
    """The validity study's protocol: split s is ``default_rng(s).permutation(n)``, (K, n)."""
    return np.stack([np.random.default_rng(s).permutation(n) for s in range(positive_int("splits", splits))])


def calibration_mask(permutations: np.ndarray, n_cal: int) -> np.ndarray:
    """(K, n) bool: the first ``n_cal`` indices of each permutation are the calibration part."""
    mask = np.zeros(permutations.shape, dtype=bool)
    np.put_along_axis(mask, permutations[:, :n_cal], True, axis=1)
    return mask


def bootstrap_weights(n: int, boot: int, seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """(B, n) multinomial counts: ``default_rng(seed).multinomial(n, [1/n]*n, size=B)``."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(n, np.full(n, 1.0 / n), size=positive_int("boot", boot))


def calibration_sizes(n: int, sizes: Sequence[int | str] = VALIDITY_SIZES) -> tuple[int, ...]:
    """The sizes of ``sizes`` ("n//2" is n // 2) that leave 15 prompts each side, ascending."""
    values = {n // 2 if s == "n//2" else int(s) for s in sizes}
    kept = tuple(sorted(s for s in values if MIN_PART <= s <= n - MIN_PART))
    if not kept:
        raise ValueError(
            f"sizes ({list(sizes)!r}): no calibration size in [{MIN_PART}, {n - MIN_PART}] "
            f"(at least {MIN_PART} prompts on each side of n = {n})."
        )
    return kept


def _cal_size(n: int, cal_fraction: float) -> int:
    n_cal = int(round(cal_fraction * n))
    if not in_open_unit(cal_fraction) or not 1 <= n_cal <= n - 1:
        raise ValueError(
            f"cal_fraction ({cal_fraction!r}) must leave at least one prompt in each part of n = {n}; "
            f"it gives {n_cal} calibration prompts."
        )
    return n_cal


@dataclass(frozen=True, eq=False)
class _Parts:
    """Each split's calibration counts and test-part measures, all (K, m)."""

    n_cal: int
    cal_violations: np.ndarray  # int
    cal_correct: np.ndarray  # int
    cal_cost: np.ndarray
    test_cost: np.ndarray
    test_accuracy: np.ndarray
    test_risk: np.ndarray


def _parts(grid: GridData, mask: np.ndarray) -> _Parts:
    """One matrix product of the (K, n) mask with every per-prompt array; tests are totals minus that."""
    m = grid.m
    stacked = np.concatenate([grid.joint, grid.correct, grid.cost_num, grid.cost_den]).astype(float)  # (4m, n)
    cal = mask.astype(float) @ stacked.T  # (K, 4m)
    test = stacked.sum(axis=1) - cal
    n_cal = int(mask[0].sum())
    n_test = grid.n - n_cal
    counts = np.rint(cal[:, : 2 * m]).astype(np.int64)  # exact: sums of 0/1 in float64
    return _Parts(
        n_cal=n_cal,
        cal_violations=counts[:, :m],
        cal_correct=counts[:, m:],
        cal_cost=cal[:, 2 * m : 3 * m] / cal[:, 3 * m :],
        test_cost=test[:, 2 * m : 3 * m] / test[:, 3 * m :],
        test_accuracy=test[:, m : 2 * m] / n_test,
        test_risk=test[:, :m] / n_test,
    )


def _pick(values: np.ndarray, index: np.ndarray) -> np.ndarray:
    """values[..., index] row by row: (..., m) and (...) -> (...)."""
    return np.take_along_axis(values, index[..., None], axis=-1)[..., 0]


# --------------------------------------------------------------------------- summaries


@dataclass(frozen=True)
class Spread:
    """Mean and 2.5 / 97.5 percentiles of a sample."""

    mean: float
    low: float
    high: float

    @classmethod
    def of(cls, x: np.ndarray, confidence: float = 0.95) -> "Spread | None":
        if len(x) == 0:
            return None
        tail = 50.0 * (1.0 - confidence)
        return cls(float(np.mean(x)), float(np.percentile(x, tail)), float(np.percentile(x, 100.0 - tail)))

    def to_dict(self) -> dict[str, float]:
        return {"mean": self.mean, "low": self.low, "high": self.high}

    def text(self, spec: str = "+.1f") -> str:
        return f"{self.mean:{spec}} [{self.low:{spec}}, {self.high:{spec}}]"


def _spread_dict(s: Spread | None) -> dict[str, float] | None:
    return None if s is None else s.to_dict()


# --------------------------------------------------------------------------- sweep


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


# --------------------------------------------------------------------------- held-out splits


@dataclass(frozen=True, eq=False)
class SplitOutcomes:
    """What one selection rule deployed on each of K splits, measured on each test part.

    ``gain`` and ``net_accuracy`` compare the deployed config with the reference on the
    test part (gain as in :class:`GridData`, accuracy in points). ``test_risk`` is the
    deployed config's risk on the test part, ``pooled_risk`` its risk on all prompts.
    """

    rule: str
    alpha: float
    deployed: np.ndarray
    gain: np.ndarray
    net_accuracy: np.ndarray
    test_risk: np.ndarray
    pooled_risk: np.ndarray

    @property
    def exceedance(self) -> float:
        """Share of splits in which the deployed config's test risk exceeds alpha."""
        return float(np.mean(self.test_risk > self.alpha))

    @property
    def exceedance_pooled(self) -> float:
        """Share of splits in which the deployed config's full-sample risk exceeds alpha."""
        return float(np.mean(self.pooled_risk > self.alpha))

    @property
    def mean_gain(self) -> float:
        return float(np.mean(self.gain))

    @property
    def mean_net_accuracy(self) -> float:
        return float(np.mean(self.net_accuracy))


def _outcomes(rule: str, alpha: float, grid: GridData, parts: _Parts, deployed: np.ndarray) -> SplitOutcomes:
    ref = grid.reference
    return SplitOutcomes(
        rule=rule,
        alpha=alpha,
        deployed=deployed,
        gain=grid.gain(_pick(parts.test_cost, deployed), parts.test_cost[:, ref]),
        net_accuracy=100.0 * (_pick(parts.test_accuracy, deployed) - parts.test_accuracy[:, ref]),
        test_risk=_pick(parts.test_risk, deployed),
        pooled_risk=grid.joint.sum(axis=1)[deployed] / grid.n,
    )


@dataclass(frozen=True, eq=False)
class _SplitPlan:
    """The paper's held-out protocol, evaluated once and shared by heldout and baselines."""

    grid: GridData
    parts: _Parts
    score: np.ndarray  # (m,) or (K, m)

    @classmethod
    def make(cls, grid: GridData, splits: int, seed: int, cal_fraction: float, rank: str) -> "_SplitPlan":
        if rank not in RANKS:
            raise ValueError(f"rank ({rank!r}) not recognized; must be one of {', '.join(RANKS)}.")
        n_cal = _cal_size(grid.n, cal_fraction)
        parts = _parts(grid, calibration_mask(heldout_permutations(grid.n, splits, seed), n_cal))
        return cls(grid, parts, grid.score(grid.cost if rank == "full" else parts.cal_cost))

    def run(self, rule: str, alpha: float, valid: np.ndarray) -> SplitOutcomes:
        return _outcomes(rule, alpha, self.grid, self.parts, risk.select_deployed(valid, self.score, self.grid.reference))

    def redline(self, alpha: float, procedure: Procedure, rule: str = "redline") -> SplitOutcomes:
        parts = self.parts
        return self.run(rule, alpha, procedure.valid(parts.cal_violations, parts.n_cal, [alpha], self.grid.reference)[0])


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


# --------------------------------------------------------------------------- baselines


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


# --------------------------------------------------------------------------- validity


@dataclass(frozen=True, eq=False)
class ValidityResult:
    """Family-wise error and coverage out of sample, per (calibration size, alpha).

    Arrays have shape (len(sizes), len(alphas)):

    - ``fwer``: share of splits in which some valid config has test risk above alpha;
    - ``fwer_pooled``: the same against the risk on all prompts;
    - ``coverage``: share of splits in which the deployed config's test risk is at most alpha;
    - ``mc_error``: MC_Z binomial standard errors of ``fwer``; ``flagged`` where
      ``fwer - delta`` exceeds it.
    """

    label: str
    n: int
    m: int
    delta: float
    splits: int
    sizes: tuple[int, ...]
    alphas: np.ndarray
    fwer: np.ndarray
    fwer_pooled: np.ndarray
    coverage: np.ndarray

    @property
    def mc_error(self) -> np.ndarray:
        return MC_Z * np.sqrt(self.fwer * (1.0 - self.fwer) / self.splits)

    @property
    def flagged(self) -> np.ndarray:
        return self.fwer - self.delta > self.mc_error

    def to_dict(self) -> dict[str, Any]:
        return {
            "grid": self.label,
            "n": self.n,
            "m": self.m,
            "delta": self.delta,
            "splits": self.splits,
            "max_fwer": float(self.fwer.max()),
            "min_coverage": float(self.coverage.min()),
            "flagged": int(self.flagged.sum()),
            "combinations": [
                {
                    "n_cal": size,
                    "alpha": float(a),
                    "fwer": float(self.fwer[s, j]),
                    "fwer_pooled": float(self.fwer_pooled[s, j]),
                    "coverage": float(self.coverage[s, j]),
                    "mc_error": float(self.mc_error[s, j]),
                    "flagged": bool(self.flagged[s, j]),
                }
                for s, size in enumerate(self.sizes)
                for j, a in enumerate(self.alphas)
            ],
        }

    def __str__(self) -> str:
        rows = [("n_cal", "max fwer", "at alpha", "max pooled fwer", "min coverage", "flagged")]
        for s, size in enumerate(self.sizes):
            j = int(np.argmax(self.fwer[s]))
            rows.append((
                str(size), f"{self.fwer[s, j]:.3f}", f"{self.alphas[j]:.2f}", f"{self.fwer_pooled[s].max():.3f}",
                f"{self.coverage[s].min():.3f}", str(int(self.flagged[s].sum())),
            ))
        flagged = int(self.flagged.sum())
        verdict = "within delta" if not flagged else f"{flagged} combination(s) exceed delta beyond Monte-Carlo error"
        return "\n".join([
            f"{self.label}: validity, n={self.n}, m={self.m}, delta={self.delta:g}, {self.splits} splits, "
            f"{len(self.alphas)} budgets {self.alphas.min():.2f}..{self.alphas.max():.2f}",
            *text.table(rows),
            f"{verdict} (flag: fwer - delta > {MC_Z:g} standard errors)",
        ])


def validity(
    grid: GridData,
    alphas: Sequence[float] = risk.DEFAULT_ALPHAS,
    sizes: Sequence[int | str] = VALIDITY_SIZES,
    splits: int = 1000,
    procedure: Procedure = Procedure(),
) -> ValidityResult:
    """The validity study: Redline on random calibration parts of several sizes, checked on the rest.

    Configs are ranked by full-sample cost. Cost: one matrix product per size, and the
    certification of K splits x len(alphas) budgets as array operations.
    """
    try:
        grid_sizes = calibration_sizes(grid.n, sizes)
    except ValueError as e:
        raise ValueError(f"{grid.label}: {e}") from None
    a = np.asarray(alphas, dtype=float)
    perms = validity_permutations(grid.n, splits)
    pooled = grid.joint.sum(axis=1) / grid.n
    score = grid.score(grid.cost)
    shape = (len(grid_sizes), len(a))
    fwer, fwer_pooled, coverage = np.empty(shape), np.empty(shape), np.empty(shape)
    for s, n_cal in enumerate(grid_sizes):
        parts = _parts(grid, calibration_mask(perms, n_cal))
        valid = procedure.valid(parts.cal_violations, n_cal, a, grid.reference)  # (A, K, m)
        over = parts.test_risk[None] > a[:, None, None]
        deployed = risk.select_deployed(valid, score, grid.reference)  # (A, K)
        fwer[s] = np.any(valid & over, axis=-1).mean(axis=-1)
        fwer_pooled[s] = np.any(valid & (pooled > a[:, None, None]), axis=-1).mean(axis=-1)
        coverage[s] = np.mean(~_pick(over, deployed), axis=-1)
    return ValidityResult(grid.label, grid.n, grid.m, procedure.delta, splits, grid_sizes, a, fwer, fwer_pooled, coverage)


# --------------------------------------------------------------------------- intervals


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
