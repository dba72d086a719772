"""The short run protocol of a settled grid item: pytest's reports, without the phase hooks.

pytest runs an item in three phases (setup, call, teardown). Each phase runs inside the
``pytest_runtest_setup/call/teardown`` hooks, whose implementations capture output and
logs, evaluate skip and xfail marks, collect unraisable and thread exceptions and set
``PYTEST_CURRENT_TEST``; then ``pytest_runtest_makereport`` turns the phase into a report
and ``pytest_runtest_logreport`` hands it to everyone who reads reports (terminal, JUnit
XML, --lf, -x/--maxfail, xdist, pytest-html, the gate's ledger). A warm rerun of a grid
runs thousands of items whose outcomes are already known, and those wrappers were most of
its run loop.

:func:`run_settled` runs such an item's phases directly, as ``_pytest.runner`` does after
its hooks: the setup state (``session._setupstate``, so the collectors' and other modules'
fixtures are set up and torn down exactly as before, whatever item comes next), the
item's own ``setup()`` and ``runtest()``, and for each phase ``CallInfo.from_call``, the
makereport and logreport hooks and, on an error, ``pytest_exception_interact``. The
reports are the full protocol's (the same fields, sections, user properties and skip
locations); ``tests/gate/test_protocol.py`` compares them, and the JUnit XML, terminal
output and JSON report, against runs that take the full protocol.

:class:`ShortProtocol` decides when it applies: only when the phase hooks have nothing to
do for the item. An item without marks, no ``--setup-show/--setup-only/--setup-plan``, and
every implementation of the three phase hooks one of :data:`INERT` (a conftest's or another
plugin's phase hook may do anything, so its presence keeps the full protocol). Whether the
item's outcomes are settled is the gate's question (``PromptItem.settled``): an item that
decodes always runs under the full protocol, with capture and timeouts. A pytest whose setup
state or ``CallInfo.from_call`` differs from what this module expects takes the full
protocol too (``pytest_internals``, checked at start-up, says so in one line).

Standard library and pytest only.
"""
from __future__ import annotations

import bdb
import sys
import types
from typing import Any, Callable

import pytest

from pytest_redline import pytest_internals

#: The plugins whose phase hooks do nothing for an item without marks that writes nothing
#: (capture, logging, skip/xfail marks, unraisable and thread exceptions, hypothesis,
#: pytest-benchmark, and pytest 8.0's nose support, which returns for an item that is not a
#: python test function), or whose work the short protocol does itself (the runner's setup state).
INERT = frozenset({
    "_pytest.runner", "_pytest.capture", "_pytest.logging", "_pytest.skipping", "_pytest.unraisableexception",
    "_pytest.threadexception", "_pytest.nose", "_hypothesis_pytestplugin", "pytest_benchmark.plugin",
})
PHASE_HOOKS = ("pytest_runtest_setup", "pytest_runtest_call", "pytest_runtest_teardown")
SETUP_OPTIONS = ("setupshow", "setuponly", "setupplan")  # they print or skip phases: the full protocol


class ShortProtocol:
    """Whether an item may take the short protocol, beyond its outcomes being settled."""

    def __init__(self, config: pytest.Config) -> None:
        self.enabled = pytest_internals.checked(config).short_protocol and not any(
            config.getoption(name, False) for name in SETUP_OPTIONS)
        self._session: pytest.Session | None = None  # checked to hold the runner's setup state
        self.reraise = (pytest.exit.Exception,) if config.getoption("usepdb", False) else (pytest.exit.Exception, KeyboardInterrupt)
        self._hooks: dict[Any, tuple[Any, bool]] = {}  # per item path: its hook proxy, whether the phase hooks are inert

    def applies(self, item: pytest.Item) -> bool:
        if not self.enabled or next(item.iter_markers(), None) is not None:
            return False
        if item.session is not self._session:
            self._session = item.session
            if not pytest_internals.has_setup_state(item.session):
                self.enabled = False
                sys.stderr.write("redline: this pytest's session holds no _pytest.runner.SetupState as _setupstate, "
                                 "so settled grid items take pytest's full run protocol\n")
                return False
        return self._hooks_of(item)[1]

    def run(self, item: pytest.Item, nextitem: pytest.Item | None) -> None:
        run_settled(item, nextitem, self._hooks_of(item)[0], self.reraise)


    def _hooks_of(self, item: pytest.Item) -> tuple[Any, bool]:
        """``item.ihook`` (the hooks of the conftests that apply to the item's path) and whether
        its phase hooks are inert, once per path: where a conftest does not apply, each
        ``item.ihook`` is a new proxy that builds each hook it is asked for again."""
        if item.path not in self._hooks:
            ihook = item.ihook
            self._hooks[item.path] = (ihook, inert_phase_hooks(ihook))
        return self._hooks[item.path]


def spare_exit_collections(config: pytest.Config) -> None:
    """pytest's exit cleanup collects garbage once rather than five times. For a session that
    ran only grid items and built no engine (a warm rerun): the five passes (a constant from
    Trio, ``_pytest.unraisableexception``) give chains of finalizers in test code the chance
    to raise, for pytest to report; no test or engine code ran here, and on a warm rerun of
    6,144 items each pass costs 0.1-0.2 s. The stash key is the one pytester sets to 0 for
    in-process runs; a value already set is kept. A pytest without the key (before 9.0) keeps
    its own number of passes."""
    key = pytest_internals.checked(config).exit_collections_key
    if key is not None:
        config.stash.setdefault(key, 1)


def inert_phase_hooks(ihook: Any) -> bool:
    """Whether every implementation of the phase hooks seen from ``ihook`` is in :data:`INERT`."""
    return all(_owner(impl.plugin) in INERT for name in PHASE_HOOKS for impl in getattr(ihook, name).get_hookimpls())


def _owner(plugin: Any) -> str:
    return plugin.__name__ if isinstance(plugin, types.ModuleType) else type(plugin).__module__


def run_settled(item: pytest.Item, nextitem: pytest.Item | None, ihook: Any, reraise: tuple[type[BaseException], ...]) -> None:
    """``_pytest.runner.runtestprotocol`` for ``item`` without the phase hooks (``ihook``: ``item.ihook``)."""
    session = item.session
    ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    if _phase(ihook, item, "setup", lambda: session._setupstate.setup(item), reraise).passed:
        _phase(ihook, item, "call", item.runtest, reraise)
    if session.shouldfail or session.shouldstop:  # as the runner: tear everything down
        nextitem = None
    _phase(ihook, item, "teardown", lambda: session._setupstate.teardown_exact(nextitem), reraise)
    ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)


def _phase(ihook: Any, item: pytest.Item, when: str, func: Callable[[], None], reraise: tuple) -> pytest.TestReport:
    call = pytest.CallInfo.from_call(func, when=when, reraise=reraise)
    report = ihook.pytest_runtest_makereport(item=item, call=call)
    ihook.pytest_runtest_logreport(report=report)
    if call.excinfo is not None and not hasattr(report, "wasxfail") and not isinstance(
        call.excinfo.value, (pytest.skip.Exception, bdb.BdbQuit)
    ):
        ihook.pytest_exception_interact(node=item, call=call, report=report)
    return report
