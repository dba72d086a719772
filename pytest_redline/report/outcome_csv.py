"""The outcome CSV (``--redline-outcomes``): each complete grid's outcome table, one file per grid."""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from pytest_redline.verdict import GridVerdict


def outcome_paths(path: str | os.PathLike, verdicts: Sequence[GridVerdict]) -> list[Path]:
    """Where each grid's outcomes go: PATH with one grid, PATH-<grid name> with several."""
    path = Path(path)
    if len(verdicts) == 1:
        return [path]
    return [path.with_name(f"{path.stem}-{re.sub(r'[^A-Za-z0-9_.-]+', '_', v.cal.grid.name)}{path.suffix}") for v in verdicts]



def write_outcomes(path: str | os.PathLike, verdicts: Sequence[GridVerdict]) -> list[str]:
    """Write each complete grid's outcome CSV; returns one line per grid saying what happened."""
    lines = []
    for v, target in zip(verdicts, outcome_paths(path, verdicts)):
        if v.table is None:
            lines.append(f"outcomes of {v.cal.grid.name}: not written (partial run)")
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        v.table.write_csv(target)
        lines.append(f"outcomes of {v.cal.grid.name}: {target}")
    return lines
