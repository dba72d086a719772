"""The validity study: Redline on random calibration parts of several sizes, its family-wise
error checked on the rest."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from pytest_redline import risk
from pytest_redline.report import text
from pytest_redline.lab.procedure import GridData, Procedure
from pytest_redline.lab.splits import VALIDITY_SIZES, calibration_mask, calibration_sizes, validity_permutations, _parts, _pick


#: A validity combination is flagged when its FWER exceeds delta by more than this many
#: binomial standard errors of the estimate, sqrt(f (1 - f) / K).
MC_Z = 2.0


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
