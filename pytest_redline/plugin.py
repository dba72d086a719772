"""The pytest hooks of the Redline gate. Thin: the logic lives in plain classes.

Without ``--redline-alpha`` the plugin only adds its options: it collects nothing extra
and imports nothing heavy. With it, :class:`GateHooks` (and, when pytest-xdist is
installed, :class:`XdistHooks`) are registered around one :class:`~pytest_redline.session.Gate`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from pytest_redline.options import add_options

if TYPE_CHECKING:
    from pytest_redline.protocol import ShortProtocol
    from pytest_redline.session import Gate

GATE = pytest.StashKey["Gate"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> int | None:
    """--redline-plan: the preflight instead of the session (no collection, no model)."""
    if not config.getoption("redline_plan"):
        return None
    if config.getoption("redline_alpha") is None:
        raise pytest.UsageError("--redline-plan: expected --redline-alpha=ALPHA too (the budget the plan is for)")
    from pytest_redline import preflight
    from pytest_redline.session import prepare_grids

    calibrations = prepare_grids(config)[1]
    print("\n".join(preflight.lines(preflight.plan(cal) for cal in calibrations.values())), flush=True)
    return 0


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("redline_alpha") is None:
        return
    from pytest_redline.protocol import ShortProtocol
    from pytest_redline.session import Gate

    gate = Gate.start(config)  # a bad grid, option or store is a UsageError here: exit 4
    config.stash[GATE] = gate
    worker = hasattr(config, "workerinput")
    config.pluginmanager.register(GateHooks(gate, worker, ShortProtocol(config)), "redline-gate")
    if config.pluginmanager.hasplugin("xdist") and not worker:
        config.pluginmanager.register(XdistHooks(gate), "redline-xdist")
    if config.pluginmanager.hasplugin("html") and not worker:
        config.pluginmanager.register(PytestHtmlHooks(gate), "redline-pytest-html")


def pytest_unconfigure(config: pytest.Config) -> None:
    gate = config.stash.get(GATE, None)
    if gate is not None:
        gate.close()
        del config.stash[GATE]


class GateHooks:
    """The gate's hooks, in the controller (or a serial session) and in xdist workers."""

    def __init__(self, gate: "Gate", worker: bool, short: "ShortProtocol") -> None:
        self.gate, self.worker, self.short = gate, worker, short
        self.only_grid_items = True  # no test of the user's ran in this process

    @pytest.hookimpl(trylast=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """A run whose power at alpha/2 is below 50 % starts with a warning (after pytest's header)."""
        if self.worker:
            return
        from pytest_redline import preflight

        for cal in self.gate.calibrations():
            warning = preflight.weak_power(cal)
            if warning:
                self.gate.progress(warning)

    def pytest_report_header(self, config: pytest.Config) -> list[str] | None:
        if self.worker:
            return None
        from pytest_redline.report.terminal import session_header

        return session_header([cal.label for cal in self.gate.calibrations()], self.gate.only_grids)

    def pytest_collect_file(self, file_path, parent):
        if self.gate.is_grid(file_path):
            from pytest_redline.nodes import GridFile

            return GridFile.from_parent(parent, path=file_path, gate=self.gate)
        return None

    def pytest_deselected(self, items) -> None:
        from pytest_redline.nodes import prompt_keys

        self.gate.deselect(prompt_keys(items))

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        from pytest_redline.nodes import prompt_keys

        self.gate.plan(prompt_keys(session.items))

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None):
        """A grid item whose outcomes are settled runs by the short protocol (protocol.py)."""
        from pytest_redline.nodes import PromptItem

        if not isinstance(item, PromptItem):
            self.only_grid_items = False
            return None
        if not (item.settled() and self.short.applies(item)):
            return None
        self.short.run(item, nextitem)
        return True

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self.only_grid_items and not self.gate.engines.built_any:
            from pytest_redline.protocol import spare_exit_collections

            spare_exit_collections(config)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not self.worker:
            self.gate.ledger.record(report)

    def pytest_report_teststatus(self, report: pytest.TestReport):
        from pytest_redline.record import is_regression

        return ("regressed", "R", ("REGRESSED", {"yellow": True})) if is_regression(report) else None

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.gate.stop_servers()  # every outcome is in: no server is needed any more
        if self.worker:
            session.config.workeroutput.update(self.gate.worker_output())
        else:
            session.exitstatus = self.gate.finish(session.exitstatus)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.worker:
            self.gate.summary(terminalreporter)


class XdistHooks:
    """Controller-side xdist hooks (registered only when xdist is installed)."""

    def __init__(self, gate: "Gate") -> None:
        self.gate = gate

    def pytest_configure_node(self, node) -> None:
        node.workerinput.update(self.gate.worker_input())

    def pytest_testnodedown(self, node, error) -> None:
        self.gate.merge_worker_output(getattr(node, "workeroutput", {}))


class PytestHtmlHooks:
    """pytest-html's extras (registered only when pytest-html is installed): the verdict
    and a link to the review page in its summary."""

    def __init__(self, gate: "Gate") -> None:
        self.gate = gate

    def pytest_html_results_summary(self, prefix, summary, postfix, session) -> None:
        from pytest_redline.report.review import summary_lines

        prefix.extend(summary_lines(self.gate.verdicts, self.gate.options.html))
