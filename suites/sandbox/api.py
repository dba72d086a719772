"""The sandbox's entry points: run one program, run many in parallel, and the version that
names what scores them (part of the outcome store's key)."""
from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence, TypeVar

from pytest_redline.suites.sandbox.execute import _execute
from pytest_redline.suites.sandbox.jail import _jail
from pytest_redline.suites.sandbox.launcher import _kill_uid, _ProcessLauncher
from pytest_redline.suites.sandbox.program import Program, Result, check_sandbox
from pytest_redline.suites.sandbox.slots import _probe, _process_interpreter, _slot

STARTING = 2  # sandboxes being started per worker while the workers' programs run (run_many)
T = TypeVar("T")


def _whole(result: Result) -> Result:
    return result


def run(program: Program, python: str | None = None, sandbox: str = "namespaces") -> Result:
    """Run one program. Never raises for anything the program does; raises SandboxUnavailable
    when the namespace sandbox cannot run here and RuntimeError when no interpreter starts."""
    return _run(program, python, sandbox, contextlib.nullcontext())


def _run(program: Program, python: str | None, sandbox: str, turn: contextlib.AbstractContextManager) -> Result:
    check_sandbox(sandbox)
    python = _absolute(python)
    if sandbox == "namespaces":
        jail = _jail(python or _absolute(sys.executable))
        with _slot() as uid:
            return _execute(program, jail.launcher(uid), python or _absolute(sys.executable), turn)
    with _slot() as uid:
        python = python or _process_interpreter(uid)
        if uid is not None:
            _kill_uid(uid, python)  # leftovers of a harness that died mid-run
        return _execute(program, _ProcessLauncher(uid, python), python, turn)


def run_many(programs: Sequence[Program], workers: int | None = None, python: str | None = None,
             sandbox: str = "namespaces", keep: Callable[[Result], T] = _whole) -> list[T]:
    """Run programs concurrently, ``workers`` at a time (default: the usable CPU count);
    ``keep(result)`` of each, applied as each program finishes (``score_many`` keeps the verdict
    alone, so no output outlives its run).

    Each program already runs in its own process, so the pool only needs threads that wait on
    those processes; no copy of the caller (which may hold a model) is forked. At most ``workers``
    programs run at once; up to STARTING more sandboxes per worker are being started meanwhile
    (bwrap, the interpreter, the cgroup join: mostly waiting on the kernel, not CPU) and wait,
    before any user code, for a turn.
    """
    workers = workers or len(os.sched_getaffinity(0))
    if workers < 1:
        raise ValueError(f"workers: expected an int >= 1, got {workers!r}")
    check_sandbox(sandbox)
    python = _absolute(python)
    if sandbox == "namespaces" and programs:
        _jail(python or _absolute(sys.executable))  # refuse before anything runs
    if len(programs) <= 1:
        return [keep(run(p, python, sandbox)) for p in programs]
    turns = threading.BoundedSemaphore(workers)
    with ThreadPoolExecutor(max_workers=min(workers * (1 + STARTING), len(programs))) as pool:
        return list(pool.map(lambda p: keep(_run(p, python, sandbox, turns)), programs))


def interpreter(sandbox: str = "namespaces") -> str:
    """The interpreter programs run under by default (for the record of a run)."""
    check_sandbox(sandbox)
    if sandbox == "namespaces":
        return _absolute(sys.executable)
    with _slot() as uid:
        return _process_interpreter(uid)


@functools.cache
def python_version(path: str) -> str:
    """The ``X.Y.Z`` version of the interpreter at ``path`` (probed once per path)."""
    return _probe(path, "import sys; print('%d.%d.%d' % sys.version_info[:3])").strip() or "unknown version"


def interpreter_version(python: str | None = None, sandbox: str = "namespaces") -> str:
    """``"PATH VERSION"`` of the interpreter programs run under (``python``, else the sandbox's
    choice), for the record of a run."""
    path = _absolute(python) or interpreter(sandbox)
    return f"{path} {python_version(path)}"


def version(python: str | None = None, sandbox: str = "namespaces") -> str:
    """What scores a program: the interpreter's version and the sandbox (part of the outcome key:
    a different Python can score the same completion differently). The interpreter's path is not
    part of it, so moving into a venv of the same Python keeps a store warm. Refuses
    (SandboxUnavailable) where the namespace sandbox cannot run."""
    check_sandbox(sandbox)
    python = _absolute(python)
    if sandbox == "namespaces":
        _jail(python or _absolute(sys.executable))
    return f"Python {python_version(python or interpreter(sandbox))}; sandbox {sandbox}"


def _absolute(python: str | None) -> str | None:
    """``python`` made absolute and free of ``..`` (bwrap binds and runs that path), never
    resolved: a venv's python is a link, and resolving it would run the base interpreter without
    the venv's packages."""
    return os.path.abspath(python) if python else None
