"""Argument checks shared by the statistics, the gate's options and the ``redline`` command.

One rule per kind of argument, with one message: a value in the open interval (0, 1), an
integer >= 1, one of a few names. The functions take ``(name, value)`` and raise a
ValueError naming both; :func:`probability_arg` wraps the (0, 1) check as an argparse
``type``. Standard library only, so that the plugin's import stays cheap.
"""
from __future__ import annotations

import argparse
import operator
from typing import Any, Callable, Sequence

#: The multiple-testing corrections of the certification.
CORRECTIONS = ("holm", "bonferroni")
#: Which configs form the family of tests: all (the paper) or the candidates only.
FAMILIES = ("all", "candidates")


def in_open_unit(x: float) -> bool:
    """Whether ``0 < x < 1`` (False for NaN): the one test behind every (0, 1) argument."""
    return 0.0 < x < 1.0


def open_unit(name: str, value: Any) -> float:
    """A float strictly inside (0, 1), or a ValueError naming the argument.

    >>> open_unit("alpha", "0.25")
    0.25
    """
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} ({value!r}) must be a number in the open interval (0, 1).") from None
    if not in_open_unit(x):
        raise ValueError(f"{name} ({value!r}) must be in the open interval (0, 1).")
    return x


def positive_int(name: str, value: Any) -> int:
    """An int >= 1; ``2.0`` is rejected rather than truncated (as scipy's _validate_int)."""
    try:
        x = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} ({value!r}) must be an integer >= 1.") from None
    if x < 1:
        raise ValueError(f"{name} ({value!r}) must be an integer >= 1.")
    return x


def choice(name: str, value: Any, allowed: Sequence[str]) -> str:
    """``value`` if it is one of ``allowed``, else a ValueError listing them."""
    if value not in allowed:
        options = ", ".join(repr(a) for a in allowed)
        raise ValueError(f"{name} ({value!r}) not recognized; must be one of {options}.")
    return value


def probability_arg(option: str | None = None) -> Callable[[str], float]:
    """An argparse ``type``: :func:`open_unit` on the text, failing with
    ``[OPTION: ]expected a number in (0, 1), got 'TEXT'``."""
    prefix = f"{option}: " if option else ""

    def parse(text: str) -> float:
        try:
            return open_unit(option or "value", text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{prefix}expected a number in (0, 1), got {text!r}") from None

    return parse
