"""The gate of one pytest process: what the hooks in plugin.py delegate to.

The same :class:`Gate` runs in a serial session, in an xdist controller and in each
worker. Workers (and serial sessions) decode; only the controller (or the serial session)
records outcomes from the reports, decides, prints and writes reports. Workers send one
small payload (deselected items, decode seconds, scheduling fallbacks) at the end.
"""
from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable

import pytest

from pytest_redline.calibration import Calibration, Level, prepare
from pytest_redline.decode import DecodeError, Decoder
from pytest_redline.decode.enginebook import EngineBook
from pytest_redline.grid import GridError, load_grid
from pytest_redline.ledger import Ledger
from pytest_redline.options import DEFAULT_GRID, GateOptions, check_spaced_paths
from pytest_redline.record import PromptKey
from pytest_redline.decode.store import OutcomeStore, StoreError
from pytest_redline.servers import ServerPool
from pytest_redline.verdict import GridVerdict, decide

GRID_SUFFIXES = (".yaml", ".yml")
PAYLOAD = "redline"  # the one key of the gate in xdist's workerinput and workeroutput


class Gate:
    def __init__(
        self,
        options: GateOptions,
        calibrations: dict[Path, Calibration],
        engines: EngineBook,
        store: OutcomeStore,
        session_id: str,
        temp_dir: Path | None = None,
        progress: Callable[[str], None] = lambda line: None,
        collect_only: bool = False,
    ) -> None:
        self.options, self.engines, self.store = options, engines, store
        self.session_id, self.temp_dir, self.progress = session_id, temp_dir, progress
        self.collect_only = collect_only  # --collect-only runs nothing, so it judges nothing
        self._calibrations = calibrations
        self._decoders: dict[str, Decoder] = {}
        self.ledger = Ledger(calibrations.values())
        self.deselected_ids: list[tuple[str, str, str]] = []
        self.verdicts: list[GridVerdict] = []
        self.file_notes: list[str] = []
        self.decode_seconds: dict[str, dict[str, float]] = {}  # per grid and config, summed over xdist workers
        self.past_stop: dict[str, dict[str, int]] = {}  # per grid and config: prompts decoded past an early stop
        self.fallbacks: dict[str, str] = {}  # per grid: why scheduling could not hold
        self.decided: dict[str, dict] = {}  # per grid: valid candidates the cost intervals settled (Decoder.decided)
        self.exitstatus: int = 1  # what the process returns, once finish() has decided it
        self.command: list[str] = []  # the command line, for the review page's provenance
        self._first_error: dict[str, str] = {}  # error message -> the item that reported it in full

    # ------------------------------------------------------------------ start and stop

    @classmethod
    def start(cls, config: pytest.Config) -> "Gate":
        """Resolve options and grids, prepare every grid and open the store: usage errors now."""
        options, calibrations, engines = prepare_grids(config)
        live = [cal.label for cal in calibrations.values() if not cal.replayed]
        if options.outcomes is not None and not options.full and live:
            raise pytest.UsageError(
                f"--redline-outcomes writes complete outcome tables, but the schedule skips items that cannot "
                f"change the verdict ({', '.join(live)}): add --redline-full to decode every config on every prompt"
            )
        for option, path, what in (("--redline-html", options.html, "the review page"),
                                   ("--redline-markdown", options.markdown, "the summary")):
            if path is not None:
                from pytest_redline.report.files import check_writable

                why = check_writable(path)
                if why:
                    raise pytest.UsageError(f"{option}: cannot write {what}: {why}")
        shared = getattr(config, "workerinput", {}).get(PAYLOAD)  # from the xdist controller
        temp_dir = None
        if shared and shared["store_dir"]:
            folder = Path(shared["store_dir"])
        elif options.no_cache:
            folder = temp_dir = Path(tempfile.mkdtemp(prefix="redline-no-cache-"))
        else:
            folder = options.cache_dir
        try:
            store = OutcomeStore.open(folder)
        except StoreError as e:
            raise pytest.UsageError(str(e)) from None
        session_id = shared["session"] if shared else uuid.uuid4().hex
        gate = cls(options, calibrations, engines, store, session_id, temp_dir, progress_writer(config),
                   collect_only=bool(config.option.collectonly))
        gate.serve(store.path.parent / "servers")
        gate.command = ["pytest", *config.invocation_params.args]
        gate.only_grids = config.args_source != pytest.Config.ArgsSource.ARGS  # no path argument: the grids alone
        return gate

    def worker_input(self) -> dict[str, Any]:
        """What workers need from the controller: the session id and a --redline-no-cache store."""
        return {PAYLOAD: {"session": self.session_id, "store_dir": str(self.temp_dir) if self.temp_dir else ""}}

    def serve(self, log_dir: Path) -> None:
        """The pool that starts configs' servers (``server:``), in the order configs decode."""
        cals = self._calibrations.values()
        served = [cal for cal in cals if any(args.get("server") for _, args in cal.engines.values())]
        bound = min((cal.grid.max_servers for cal in served), default=1)  # the tightest of the grids with servers
        self.engines.servers = ServerPool(log_dir, max_servers=bound, progress=self.progress)
        self.engines.servers.plan((config, cal.engines[config][1]) for cal in cals for config in _decode_order(cal))

    def stop_servers(self) -> None:
        """Stop every server this process started (decoding is over, or the gate is closing)."""
        if self.engines.servers is not None:
            self.engines.servers.close()

    def close(self) -> None:
        from pytest_redline.decode import pipeline

        pipeline.shutdown()  # the endpoints' connections, before their servers stop
        self.stop_servers()
        self.store.close()
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    # ------------------------------------------------------------------ collection

    def is_grid(self, path: Path) -> bool:
        return path.resolve() in self._calibrations

    def calibrations(self) -> tuple[Calibration, ...]:
        return tuple(self._calibrations.values())

    def calibration(self, path: Path) -> Calibration:
        return self._calibrations[path.resolve()]

    def plan(self, keys: Iterable[PromptKey]) -> None:
        """The selected grid items: what the decoders must get."""
        cals = {cal.label: cal for cal in self._calibrations.values()}
        for key in keys:
            self.decoder(cals[key.grid]).need(key.config, key.index)

    def deselect(self, keys: Iterable[PromptKey]) -> None:
        """Grid items deselected (-k, -m, --lf, ...): missing, for the reason "deselected"."""
        ids = [(key.grid, key.config, key.prompt) for key in keys]
        self.deselected_ids += ids
        self.ledger.deselect(ids)

    def decoder(self, cal: Calibration) -> Decoder:
        if cal.label not in self._decoders:
            self._decoders[cal.label] = Decoder(cal, self.store, self.engines, self.session_id, self.progress)
        return self._decoders[cal.label]

    def explain(self, error: DecodeError, nodeid: str, verbose: bool) -> str:
        """An item's error text: in full for the first item that meets the error, then a pointer."""
        first = self._first_error.setdefault(error.message, nodeid)
        if first == nodeid:
            return error.explain(verbose)
        return f"{error.short} (the full error is reported at {first})"

    # ------------------------------------------------------------------ xdist

    def worker_output(self) -> dict[str, Any]:
        """The small builtin payload a worker sends to the controller (a serial session merges
        its own at the end): deselected items, decode seconds, prompts decoded past early stops, and why
        scheduling fell back."""
        return {PAYLOAD: {
            "deselected": [list(ids) for ids in self.deselected_ids],
            "seconds": {label: d.config_seconds for label, d in self._decoders.items()},
            "past_stop": {label: d.past_stop for label, d in self._decoders.items() if d.past_stop},
            "fallbacks": {label: d.fallback for label, d in self._decoders.items() if d.fallback},
            "decided": {label: d.decided for label, d in self._decoders.items() if d.decided},
        }}

    def merge_worker_output(self, output: dict[str, Any]) -> None:
        payload = output.get(PAYLOAD)
        if payload is None:  # a crashed worker sends none: its items stay missing
            return
        self.ledger.deselect(tuple(ids) for ids in payload["deselected"])
        for label, per_config in payload["seconds"].items():
            merged = self.decode_seconds.setdefault(label, {})
            for config, seconds in per_config.items():
                merged[config] = merged.get(config, 0.0) + seconds
        for label, per_config in payload.get("past_stop", {}).items():
            merged = self.past_stop.setdefault(label, {})
            for config, count in per_config.items():
                merged[config] = merged.get(config, 0) + count
        for label, reason in payload["fallbacks"].items():
            self.fallbacks.setdefault(label, reason)
        for label, decided in payload.get("decided", {}).items():
            self.decided.setdefault(label, decided)

    # ------------------------------------------------------------------ verdict

    def finish(self, exitstatus: int) -> int:
        """Judge every grid, write the report files, and return the session's exit status."""
        if self.collect_only:
            return exitstatus
        if self._decoders:  # a serial session: its own decoders' figures
            self.merge_worker_output(self.worker_output())
        self.verdicts = [self._decide(cal) for cal in self._calibrations.values()]
        from pytest_redline.report import document, outcome_csv

        if self.options.report is not None:
            document.write_json(self.options.report, self.verdicts)
            self.file_notes.append(f"JSON report: {self.options.report}")
        if self.options.outcomes is not None:
            self.file_notes += outcome_csv.write_outcomes(self.options.outcomes, self.verdicts)
        if self.options.html is not None:
            from pytest_redline.report import files, review

            review.write_html(self.options.html, self.verdicts, files.provenance(self.command, self._calibrations.values(), self.engines))
            self.file_notes.append(f"review page: {self.options.html}")
        if self.options.markdown is not None:
            from pytest_redline.report import files, summary

            provenance = files.provenance(self.command, self._calibrations.values(), self.engines)
            self.file_notes += summary.write(self.options.markdown, self.verdicts, provenance, self.options.markdown_prompts)
        required = [v for v in self.verdicts if not v.cal.advisory]  # an advisory grid fails nothing
        if not all(v.certified for v in required) and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            exitstatus = pytest.ExitCode.TESTS_FAILED
        self.exitstatus = int(exitstatus)
        return exitstatus

    def _decide(self, cal: Calibration) -> GridVerdict:
        from pytest_redline.spend import spend_of

        record = self.ledger.grid(cal.label)
        if cal.reads_every_outcome and not self.options.full:
            how_run = "full: every outcome read (its engine reads recorded outcomes at no cost, so V is exact)"
        elif cal.full:
            how_run = "full (--redline-full)"
        elif cal.label in self.fallbacks:
            how_run = f"full: scheduling could not hold ({self.fallbacks[cal.label]})"
        else:
            how_run = "scheduled"
        spend = spend_of(record, self.decode_seconds.get(cal.label, {}), self.past_stop.get(cal.label, {}))
        return decide(record, spend, how_run, self.decided.get(cal.label))

    def summary(self, terminal: pytest.TerminalReporter) -> None:
        if not self.verdicts:
            return
        from pytest_redline.report.sentences import session_line, title
        from pytest_redline.report.terminal import grid_lines

        verbosity = terminal.config.get_verbosity()
        for v in self.verdicts:
            terminal.write_sep("=", f"redline: {title(v)}", bold=True)
            for line in grid_lines(v, verbosity):
                terminal.write_line(line)
        for note in self.file_notes:
            terminal.write_line(note)
        text, ok = session_line(self.verdicts, self.exitstatus)
        terminal.write_sep("=", text, bold=True, green=ok, red=not ok)


def prepare_grids(config: pytest.Config) -> tuple[GateOptions, dict[Path, Calibration], EngineBook]:
    """The options and every grid prepared (the model-free checks: usage errors now); the
    gate's start, and the whole of the preflight (--redline-plan)."""
    check_spaced_paths(config)
    options = GateOptions.from_config(config)
    paths = resolve_grids_and_rewrite_args(config, options)
    engines = EngineBook()
    level = Level(options.alpha, options.delta, len(paths), options.correction, options.deploy, options.seed, options.full)
    calibrations = {}
    for path in paths:
        try:
            calibrations[path] = prepare(load_grid(path), _label(path, Path(config.rootpath)), level, engines)
        except GridError as e:
            raise pytest.UsageError(str(e)) from None
    return options, calibrations, engines


def resolve_grids_and_rewrite_args(config: pytest.Config, options: GateOptions) -> list[Path]:
    """The grids to gate; rewrites ``config.args`` so that pytest collects them.

    Explicit path arguments are kept, and grid files among them are gated along with the
    named grids; without path arguments only the named grids (default: redline.yaml at
    the rootdir) are collected, not ``testpaths``.
    """
    here = Path(config.invocation_params.dir)
    named = [p.resolve() for p in options.grids]
    if config.args_source == pytest.Config.ArgsSource.ARGS:
        given = [(here / a.split("::")[0]).resolve() for a in config.args]
        paths = _unique([p for p in given if p.suffix in GRID_SUFFIXES] + named)
        if not paths:
            raise pytest.UsageError(
                "--redline-alpha: no grid file to gate; name one with --redline-grid PATH or as a path argument"
            )
        config.args += [str(p) for p in named if p not in given]
        return paths
    if not named:
        default = (Path(config.rootpath) / DEFAULT_GRID).resolve()
        if not default.is_file():
            raise pytest.UsageError(f"--redline-alpha: no grid file: {default} does not exist; pass --redline-grid PATH")
        named = [default]
    paths = _unique(named)
    config.args[:] = [str(p) for p in paths]
    config.args_source = pytest.Config.ArgsSource.INVOCATION_DIR  # pytest's header would say "testpaths: ..."
    return paths


def progress_writer(config: pytest.Config) -> Callable[[str], None]:
    """Progress lines that show while an item runs, even under -q or output capture.

    A serial session writes through the terminal reporter; an xdist worker writes to its
    stderr, which is the controller's terminal.
    """
    worker = getattr(config, "workerinput", {}).get("workerid")

    def write(line: str) -> None:
        capture = config.pluginmanager.get_plugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            terminal = config.pluginmanager.get_plugin("terminalreporter")
            if worker is None and terminal is not None:
                terminal.write_line(line)
            else:
                sys.stderr.write(f"[{worker}] {line}\n")
                sys.stderr.flush()

    return write


def _decode_order(cal: Calibration) -> list[str]:
    """The configs in the order the decode stage asks for their outcomes: the reference, each
    candidate's scheduled run, then the candidates finished on the prompts they skipped (every
    candidate in select and all modes, the deployed one in gate mode; none with --redline-full)."""
    order = list(cal.collection_order())
    if cal.full or cal.replayed:
        return order
    return order + ([cal.deploy] if cal.mode == "gate" else order[1:])


def _unique(paths: list[Path]) -> list[Path]:
    return list(dict.fromkeys(paths))


def _label(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root.resolve()).as_posix()
    except ValueError:
        return path.as_posix()
