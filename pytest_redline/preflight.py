"""The preflight: what a grid's calibration set can certify, before any model loads.

``pytest --redline-alpha=A --redline-plan`` prepares every grid as the gate does (the
model-free checks included: a bad grid is still exit 4), prints one row per grid and exits 0
without decoding. A row: n, m, the family-wise level (the grid's share of delta) and Holm's
hardest step (that level over m); the power to certify a config whose true risk is alpha/2
and alpha/4 at that step; and the prompts that would give 80 % power at those risks
(:func:`pytest_redline.planning.prompts_needed`). A gate run whose power at alpha/2 is below
50 % starts with a warning (:func:`weak_power`).

No engine is built beyond what preparing a grid builds (a replay engine reads its file), so
no torch is imported for the engines shipped here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from pytest_redline.report import text

if TYPE_CHECKING:
    from pytest_redline.calibration import Calibration

TARGET = 0.8  # the power the prompts are planned for
WEAK = 0.5  # below this power at alpha/2, a gate run starts with a warning
FRACTIONS = (2, 4)  # true risks alpha/2 and alpha/4


@dataclass(frozen=True)
class Plan:
    """One grid's preflight figures (``power`` and ``needed`` at alpha/2, then alpha/4)."""

    grid: str
    alpha: float
    n: int
    m: int
    level: float  # family-wise: the grid's share of delta
    step: float  # Holm's hardest step: level / m
    power: tuple[float, ...]
    needed: tuple[int, ...]
    alpha_source: str = "--redline-alpha"  # or "grid file" (its alpha:)


def plan(cal: Calibration) -> Plan:
    from pytest_redline.planning import power, prompts_needed

    risks = [cal.alpha / k for k in FRACTIONS]
    step = cal.delta_share / cal.m
    return Plan(
        grid=cal.grid.name, alpha=cal.alpha, n=cal.n, m=cal.m, level=cal.delta_share, step=step,
        power=tuple(float(power(cal.n, cal.alpha, r, step)) for r in risks),
        needed=tuple(prompts_needed(cal.alpha, r, cal.m, cal.delta_share, power=TARGET) for r in risks),
        alpha_source=cal.alpha_source,
    )


def lines(plans: Iterable[Plan]) -> list[str]:
    plans = list(plans)
    rows = [("grid", "alpha", "n", "m", "level", "step", "power a/2", "power a/4", "n80 a/2", "n80 a/4")]
    for p in plans:
        rows.append((p.grid, f"{p.alpha:g} ({p.alpha_source})", str(p.n), str(p.m), f"{p.level:g}", f"{p.step:.4g}",
                     *(f"{x:.3f}" for x in p.power), *(str(x) for x in p.needed)))
    alphas = sorted({p.alpha for p in plans})
    out = [f"redline plan: alpha={', '.join(f'{a:g}' for a in alphas)}; no model loaded, nothing decoded"]
    out += text.table(rows)
    out.append("level: the family-wise error level of each grid (delta, split over the grids); step: Holm's hardest "
               "step, level / m; power a/2, a/4: the chance to certify a config whose true risk is alpha/2, alpha/4 "
               "with these n prompts; n80: the prompts for 80% power at that risk")
    out += [_warning(p.grid, p.n, p.alpha, p.power[0], p.needed[0]) for p in plans if p.power[0] < WEAK]
    return out


def weak_power(cal: Calibration) -> str | None:
    """The warning at the start of a gate run whose power at alpha/2 is below :data:`WEAK`
    (None otherwise). The power costs a few p-values; the prompts needed are computed only
    for the warning."""
    from pytest_redline.planning import power, prompts_needed

    risk = cal.alpha / FRACTIONS[0]
    chance = float(power(cal.n, cal.alpha, risk, cal.delta_share / cal.m))
    if chance >= WEAK:
        return None
    needed = prompts_needed(cal.alpha, risk, cal.m, cal.delta_share, power=TARGET)
    return _warning(cal.grid.name, cal.n, cal.alpha, chance, needed)


def _warning(grid: str, n: int, alpha: float, chance: float, needed: int) -> str:
    return (f"redline warning: {grid}: with n={n} prompts a config at risk alpha/2 = {alpha / 2:g} is certified "
            f"with probability {chance:.2f} (< {WEAK:.0%}); {needed} prompts give 80%")
