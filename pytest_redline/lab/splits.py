"""Random splits of the prompts and what one split measures: the paper's permutations, the
calibration masks, bootstrap weights, each split's counts and costs (one matrix product),
the outcomes of a selection rule on the test parts, and the spread of a sample."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from pytest_redline import risk
from pytest_redline.checks import in_open_unit, positive_int
from pytest_redline.lab.procedure import GridData, Procedure


HELDOUT_SEED = 20260918
BOOTSTRAP_SEED = 20260920
#: The validity study's calibration sizes; "n//2" is half the prompts.
VALIDITY_SIZES = ("n//2", 200, 100, 50, 25)
#: Calibration sizes must leave this many prompts on each side.
MIN_PART = 15
RANKS = ("full", "calibration")


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
