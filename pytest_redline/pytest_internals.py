"""The private parts of pytest the gate uses, checked once at start-up.

pyproject bounds pytest to ``>=8,<10`` and ``tests/meta/test_oldest_pytest.py`` runs the gate
on the oldest release of that range. Within it, or beyond it, an internal may be missing or
changed; then the gate takes pytest's public path for what the internal was for, and says so
in one line at start-up (:func:`checked`):

- ``_pytest.unraisableexception.gc_collect_iterations_key`` (pytest 9.0 and later): the exit
  cleanup collects garbage once instead of five times after a warm rerun
  (``protocol.spare_exit_collections``). Without it: pytest's own number of passes.
- ``_pytest.runner.SetupState.setup(item)`` and ``.teardown_exact(nextitem)`` on
  ``session._setupstate``, and ``CallInfo.from_call(func, when, reraise)``: the short protocol of
  settled items (``protocol.run_settled``). Without them: pytest's full run protocol.
- ``_pytest.config.findpaths.determine_setup``: the rootdir pytest would have found without
  a path option's value written after a space (``options.check_spaced_paths``). It is called
  with the keyword arguments its signature names (pytest 8.0 takes four positional-or-keyword
  ones, 8.1 makes them keyword-only, 9.0 adds ``override_ini``). Without it, or with a parameter the gate cannot fill: a path option written with
  a space is refused, as the README's rule says (write ``--redline-grid=PATH``).

Standard library and pytest only.
"""
from __future__ import annotations

import importlib
import inspect
import sys
from dataclasses import dataclass
from typing import Any, Callable

import pytest

#: What the gate can pass to ``determine_setup``, by the name pytest gives each parameter.
DETERMINE_SETUP_ARGS = frozenset({"inifile", "override_ini", "args", "rootdir_cmd_arg", "invocation_dir"})


@dataclass(frozen=True)
class Internals:
    """What this pytest offers of the internals the gate uses (None or False: the public path)."""

    exit_collections_key: Any  # a pytest.StashKey, or None
    short_protocol: bool  # SetupState.setup/teardown_exact and CallInfo.from_call(reraise=) as expected
    determine_setup: Callable[..., Any] | None  # called with keywords from DETERMINE_SETUP_ARGS
    fallbacks: tuple[str, ...] = ()  # one phrase per internal missing or changed

    def line(self) -> str | None:
        """The start-up line: what fell back to pytest's public path (None when nothing did)."""
        if not self.fallbacks:
            return None
        return f"redline: pytest {pytest.__version__}: {'; '.join(self.fallbacks)}"


def check() -> Internals:
    """Look each internal up in the installed pytest."""
    fallbacks = []
    key = getattr(_module("_pytest.unraisableexception"), "gc_collect_iterations_key", None)
    if not isinstance(key, pytest.StashKey):
        key = None
        fallbacks.append("no _pytest.unraisableexception.gc_collect_iterations_key, so the exit cleanup collects "
                         "garbage pytest's own number of times")
    short = _setup_state_as_expected() and _parameters(getattr(pytest.CallInfo, "from_call", None))[:3] == ["func", "when", "reraise"]
    if not short:
        fallbacks.append("_pytest.runner.SetupState.setup/teardown_exact or CallInfo.from_call(reraise=) differ, so "
                         "settled grid items take pytest's full run protocol")
    determine = getattr(_module("_pytest.config.findpaths"), "determine_setup", None)
    if not _fillable(determine):
        determine = None
        fallbacks.append("_pytest.config.findpaths.determine_setup is missing or changed, so a path option written with a "
                         "space (--redline-grid PATH) is refused: write --redline-grid=PATH")
    return Internals(key, short, determine, tuple(fallbacks))


_CHECKED = pytest.StashKey[Internals]()


def checked(config: pytest.Config) -> Internals:
    """:func:`check`, once per session: the first call writes the start-up line (in the
    controller or a serial session; an xdist worker keeps quiet)."""
    if _CHECKED not in config.stash:
        internals = config.stash[_CHECKED] = check()
        line = internals.line()
        if line and not hasattr(config, "workerinput"):
            sys.stderr.write(line + "\n")  # before the terminal reporter exists: it is made after pytest_configure
            sys.stderr.flush()
    return config.stash[_CHECKED]


def has_setup_state(session: pytest.Session) -> bool:
    """Whether the session holds the runner's setup state (``_pytest.runner`` sets it at session start)."""
    cls = getattr(_module("_pytest.runner"), "SetupState", None)
    return cls is not None and isinstance(getattr(session, "_setupstate", None), cls)


def _setup_state_as_expected() -> bool:
    cls = getattr(_module("_pytest.runner"), "SetupState", None)
    return (_parameters(getattr(cls, "setup", None)) == ["self", "item"]
            and _parameters(getattr(cls, "teardown_exact", None)) == ["self", "nextitem"])


def _fillable(function: Any) -> bool:
    """Whether every required parameter of ``function`` is one the gate can pass by keyword."""
    if not callable(function):
        return False
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return False
    for p in parameters:
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.default is p.empty and (
                p.kind == p.POSITIONAL_ONLY or p.name not in DETERMINE_SETUP_ARGS):
            return False
    return {"args", "invocation_dir"} <= {p.name for p in parameters}


def _parameters(function: Any) -> list[str]:
    if not callable(function):
        return []
    try:
        return list(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return []


def _module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def call_determine_setup(function: Callable[..., Any], **values: Any) -> Any:
    """``determine_setup`` with the keyword arguments among ``values`` that its signature names."""
    names = {p.name for p in inspect.signature(function).parameters.values() if p.kind != p.POSITIONAL_ONLY}
    return function(**{name: value for name, value in values.items() if name in names})
