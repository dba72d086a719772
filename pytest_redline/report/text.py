"""Plain-text formatting shared by every table the project prints: the certification
result, the gate's terminal summary and the analyses."""
from __future__ import annotations

import math
from typing import Sequence


def table(rows: Sequence[Sequence[str]], left: Sequence[int] = (0,)) -> list[str]:
    """Rows of cells as aligned lines: columns in ``left`` flush left, the others right;
    two spaces between columns, no trailing blanks.

    >>> table([("a", "bb"), ("ccc", "d")])
    ['a    bb', 'ccc   d']
    """
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(w) if c in left else cell.rjust(w) for c, (cell, w) in enumerate(zip(r, widths))).rstrip()
        for r in rows
    ]


def gain(value: float, kind: str) -> str:
    """A gain over the reference: ``2.81x`` for a factor, ``+37.5%`` for a percentage."""
    return f"{value:.2f}x" if kind == "factor" else f"{value:+.1f}%"


def number(value: float, spec: str = ".3g") -> str:
    """``format(value, spec)``, or ``-`` for NaN (a value that was not computed)."""
    return "-" if math.isnan(value) else format(value, spec)
