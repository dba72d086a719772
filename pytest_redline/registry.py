"""Engines and suites by name, through entry-point groups.

A package registers an engine under ``redline.engines`` and a suite under ``redline.suites``;
the entry point's value is a callable ``(**args) -> Engine`` (or ``Suite``). Ours register
the same way (see pyproject.toml), so a user's engine is gated exactly like ours.
Names are looked up without importing anything; a factory is imported only when built.
"""
from __future__ import annotations

import functools
import sys
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Callable

ENGINES = "redline.engines"
SUITES = "redline.suites"
_KIND = {ENGINES: "engine", SUITES: "suite"}


class RegistryError(LookupError):
    """An unknown name, or an entry point that cannot be loaded."""


def _group(group: str) -> tuple[EntryPoint, ...]:
    """The entry points of ``group``, read once per ``sys.path`` (each read scans every installed
    distribution's metadata, about 15 ms here, and a grid asks once per config)."""
    return _read_group(group, tuple(sys.path))


@functools.lru_cache(maxsize=16)
def _read_group(group: str, path: tuple[str, ...]) -> tuple[EntryPoint, ...]:
    return tuple(entry_points(group=group))


def known(group: str) -> list[str]:
    """The registered names of ``group``, sorted."""
    return sorted({ep.name for ep in _group(group)})


def _entry_point(group: str, name: str) -> EntryPoint:
    found = [ep for ep in _group(group) if ep.name == name]
    if not found:
        names = ", ".join(known(group)) or "none registered"
        raise RegistryError(f"unknown {_KIND[group]} {name!r}; known {_KIND[group]}s: {names}")
    return found[0]


def check(group: str, name: str) -> None:
    """Raise :class:`RegistryError` unless ``name`` is registered in ``group``."""
    _entry_point(group, name)


def factory(group: str, name: str) -> Callable[..., Any]:
    """Import and return the callable registered as ``name`` in ``group``."""
    ep = _entry_point(group, name)
    try:
        return ep.load()
    except Exception as e:  # an import error in a plugin package: say which entry point
        raise RegistryError(f"{_KIND[group]} {name!r} ({ep.value}) failed to import: {type(e).__name__}: {e}") from e
