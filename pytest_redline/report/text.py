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


WIDTH = 120  # the terminal width every line of the gate's summary fits


def fitted_table(rows: Sequence[Sequence[str]], keys: int, groups: Sequence[Sequence[int]],
                 left: Sequence[int] = (0,), width: int = WIDTH) -> list[list[str]]:
    """A table as one block of lines per group of columns, each led by the first ``keys`` columns
    (the row's name), so every line fits ``width``; a group that is still too wide is split
    further, one column at a time. (Always by group, so a table's layout does not depend on its
    figures' widths.)"""
    blocks, head = [], list(range(keys))
    for group in groups:
        chunk: list[int] = []
        for c in group:
            trial = _project(rows, head + chunk + [c], left)
            if chunk and max(len(line) for line in trial) > width:
                blocks.append(_project(rows, head + chunk, left))
                chunk = []
            chunk.append(c)
        if chunk:
            blocks.append(_project(rows, head + chunk, left))
    return blocks


def _project(rows: Sequence[Sequence[str]], columns: Sequence[int], left: Sequence[int]) -> list[str]:
    return table([[r[c] for c in columns] for r in rows], [i for i, c in enumerate(columns) if c in left])


def wrapped(line: str, width: int = WIDTH, indent: str = "  ") -> list[str]:
    """A long prose line broken at spaces into lines of at most ``width`` characters, the
    continuation lines indented (a word longer than the width is broken inside)."""
    import textwrap

    if len(line) <= width:
        return [line]
    return textwrap.wrap(line, width=width, subsequent_indent=indent, break_on_hyphens=False, break_long_words=False,
                         drop_whitespace=True) or [line]
