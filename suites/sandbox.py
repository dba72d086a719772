"""Run untrusted Python programs in a child process, with limits. NOT a security boundary.

Generated code is untrusted, so every program runs in its own child process:

- a fresh temporary working directory, removed afterwards;
- a stripped environment (``HOME`` and ``TMPDIR`` point at that directory) and no stdin;
- resource limits: CPU seconds, address space, processes, file size, open files, no core files;
- its own session (so its own process group), killed as a whole when it ends or times out;
- stdout and stderr captured together, up to a size cap (past it the program is killed).

When the harness runs as root, root is not bound by ``RLIMIT_NPROC`` and may signal any
process, so each concurrent run takes a *slot* (a lock file shared by every process on the
host) and runs as that slot's own unprivileged uid and gid (``SLOT_UID_BASE + slot``). The
process limit then binds per slot, a ``kill(-1)`` reaches only that slot's processes, and after
the run everything left under the uid is killed. A fork bomb in one slot cannot stop a program
in another slot from forking, and cannot kill it.

A program passes only if its tests ran to the end: the program's code and its tests are
compiled separately (the code cannot swallow the tests), run one after the other as
``__main__`` in one namespace, and the harness then writes a sentinel to a private pipe. A
program that calls ``sys.exit(0)`` or ``os._exit(0)`` before its tests never writes it.

What this does not protect against (the shape and the warning come from openai/human-eval's
``execution.py``): reads of any world-readable file, writes to world-writable places such as
``/tmp``, the network, and, when not root, anything the harness's own user may do (signal the
harness, touch its files, exhaust its process count). The memory cap is per process, so a
program may use up to ``processes`` times ``memory_bytes``. Run it inside a container or VM
whose total memory and network are limited when the code may be hostile.
"""
from __future__ import annotations

import fcntl
import functools
import math
import os
import pwd
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

SLOT_UID_BASE = 61000  # slot k runs as uid = gid = SLOT_UID_BASE + k (only when root)
SLOTS = 64  # concurrent sandboxes on one host

# Runs inside the child, as the unprivileged user: set the limits, run the code, then the
# tests, then write the sentinel. argv: token, sentinel fd, then the rlimits (soft values).
_BOOTSTRAP = r"""
import os, resource, sys
token, fd, cpu, memory, processes, file_bytes, open_files = sys.argv[1:8]
sys.argv = ["program.py"]
for which, soft, hard in (
    (resource.RLIMIT_CPU, int(cpu), int(cpu) + 1),
    (resource.RLIMIT_AS, int(memory), int(memory)),
    (resource.RLIMIT_NPROC, int(processes), int(processes)),
    (resource.RLIMIT_FSIZE, int(file_bytes), int(file_bytes)),
    (resource.RLIMIT_NOFILE, int(open_files), int(open_files)),
    (resource.RLIMIT_CORE, 0, 0),
):
    resource.setrlimit(which, (soft, hard))
with open("program.py", encoding="utf-8") as f:
    program = compile(f.read(), "program.py", "exec")
with open("tests.py", encoding="utf-8") as f:
    tests = compile(f.read(), "tests.py", "exec")
namespace = {"__name__": "__main__", "__builtins__": __builtins__}
exec(program, namespace)
exec(tests, namespace)
for stream in (sys.stdout, sys.stderr):
    try:
        stream.flush()
    except Exception:
        pass
os.write(int(fd), token.encode())
os._exit(0)
"""


@dataclass(frozen=True)
class Limits:
    """Resource limits for one program. ``wall_seconds`` defaults to 3 x CPU + 5 s."""

    cpu_seconds: float = 10.0
    wall_seconds: float | None = None
    memory_bytes: int = 1 << 30
    processes: int = 16
    file_bytes: int = 16 << 20
    open_files: int = 64
    output_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        for name in ("cpu_seconds", "memory_bytes", "processes", "file_bytes", "open_files", "output_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"Limits.{name}: expected a number > 0, got {value!r}")
        if self.wall_seconds is not None and not self.wall_seconds > 0:
            raise ValueError(f"Limits.wall_seconds: expected a number > 0, got {self.wall_seconds!r}")

    @property
    def wall(self) -> float:
        return self.wall_seconds if self.wall_seconds is not None else 3 * self.cpu_seconds + 5


@dataclass(frozen=True)
class Program:
    """``code`` runs first, then ``tests``, in one namespace named ``__main__``."""

    code: str
    tests: str = ""
    limits: Limits = field(default_factory=Limits)

    def __post_init__(self) -> None:
        for name in ("code", "tests"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise TypeError(f"Program.{name}: expected str, got {type(value).__name__}")
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as error:  # e.g. a lone surrogate from a broken decode
                raise ValueError(f"Program.{name}: not valid Unicode ({error.reason} at {error.start})") from None


@dataclass(frozen=True)
class Result:
    passed: bool
    reason: str  # "passed", "timed out after 5.0 s", "exit status 1", "exited before its tests finished", ...
    output: str  # stdout and stderr, at most Limits.output_bytes
    seconds: float


def run(program: Program, python: str | None = None) -> Result:
    """Run one program in the sandbox. Never raises for anything the program does; raises
    RuntimeError when no interpreter can be started at all."""
    if os.geteuid() != 0:
        return _run_as(program, python or sys.executable, uid=None)
    with _Slot() as uid:
        python = python or _interpreter(uid)
        _kill_uid(uid, python)  # leftovers of a harness that died mid-run
        return _run_as(program, python, uid=uid)


def run_many(programs: Sequence[Program], workers: int | None = None, python: str | None = None) -> list[Result]:
    """Run programs concurrently, ``workers`` at a time (default: the usable CPU count).

    Each program already runs in its own process, so the pool only needs threads that wait on
    those processes; no copy of the caller (which may hold a model) is forked.
    """
    workers = workers or len(os.sched_getaffinity(0))
    if workers < 1:
        raise ValueError(f"workers: expected an int >= 1, got {workers!r}")
    if len(programs) <= 1 or workers == 1:
        return [run(p, python) for p in programs]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda p: run(p, python), programs))


# --- one run ----------------------------------------------------------------------------------


def _run_as(program: Program, python: str, uid: int | None) -> Result:
    limits, start = program.limits, time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="redline-sandbox-"))
    read_end, write_end = os.pipe()
    try:
        (workdir / "program.py").write_text(program.code, encoding="utf-8")
        (workdir / "tests.py").write_text(program.tests, encoding="utf-8")
        if uid is not None:
            for path in (workdir, workdir / "program.py", workdir / "tests.py"):
                os.chown(path, uid, uid)
        token = secrets.token_hex(16)
        argv = [python, "-s", "-c", _BOOTSTRAP, token, str(write_end), str(math.ceil(limits.cpu_seconds)),
                str(limits.memory_bytes), str(limits.processes), str(limits.file_bytes), str(limits.open_files)]
        drop = {"user": uid, "group": uid, "extra_groups": []} if uid is not None else {}
        try:
            child = subprocess.Popen(argv, cwd=workdir, env=_environment(workdir), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, pass_fds=(write_end,),
                                     start_new_session=True, **drop)
        except OSError as error:  # the harness's environment, not the program: say so loudly
            raise RuntimeError(f"sandbox: could not start {python}: {error}") from error
        os.close(write_end)
        write_end = -1
        try:
            output, sentinel, stop = _collect(child, read_end, limits, start)
        finally:
            _kill_all(child, uid, python)
        seconds = time.monotonic() - start
        text = output.decode("utf-8", errors="replace")
        if stop:
            return Result(False, stop, text, seconds)
        if sentinel == token.encode():
            return Result(True, "passed", text, seconds)
        return Result(False, _exit_reason(child.returncode), text, seconds)
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)
        _remove(workdir)


def _collect(child: subprocess.Popen, sentinel_fd: int, limits: Limits, start: float) -> tuple[bytes, bytes, str]:
    """Read output and sentinel until both close; the third item says why it was stopped early."""
    output, sentinel = bytearray(), bytearray()
    selector = selectors.DefaultSelector()
    selector.register(child.stdout, selectors.EVENT_READ, output)
    selector.register(sentinel_fd, selectors.EVENT_READ, sentinel)
    deadline = start + limits.wall
    try:
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return bytes(output), bytes(sentinel), f"timed out after {limits.wall:.1f} s"
            for key, _ in selector.select(min(remaining, 0.5)):
                data = os.read(key.fd, 65536)
                if not data:
                    selector.unregister(key.fileobj)
                    continue
                key.data.extend(data)
                if len(output) > limits.output_bytes:
                    return bytes(output[: limits.output_bytes]), bytes(sentinel), f"output over {limits.output_bytes} bytes"
            if child.poll() is not None and not selector.select(0):
                break  # exited; pipes may still be held by stray descendants, killed next
        child.wait(timeout=max(deadline - time.monotonic(), 0.1))
    except subprocess.TimeoutExpired:
        return bytes(output), bytes(sentinel), f"timed out after {limits.wall:.1f} s"
    finally:
        selector.close()
        child.stdout.close()
    return bytes(output), bytes(sentinel), ""


def _kill_all(child: subprocess.Popen, uid: int | None, python: str) -> None:
    """Kill the program's process group and, as root, every process left under its uid."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    child.wait()
    if uid is not None:
        _kill_uid(uid, python)


def _kill_uid(uid: int, python: str, patience: float = 5.0) -> None:
    """Kill every process of ``uid`` and wait until they are gone (zombies count for RLIMIT_NPROC)."""
    deadline = time.monotonic() + patience
    while _processes_of(uid) and time.monotonic() < deadline:
        # kill(-1) sent as the slot's own uid reaches exactly that uid's processes, atomically.
        subprocess.run([python, "-S", "-c", "import os; os.kill(-1, 9)"], user=uid, group=uid, extra_groups=[],
                       cwd="/", env={}, stdin=subprocess.DEVNULL, capture_output=True, check=False)
        time.sleep(0.01)


def _processes_of(uid: int) -> list[int]:
    pids = []
    for entry in os.scandir("/proc"):
        try:
            if entry.name.isdigit() and entry.stat().st_uid == uid:
                pids.append(int(entry.name))
        except FileNotFoundError:
            pass  # exited meanwhile
    return pids


def _exit_reason(returncode: int) -> str:
    if returncode == 0:
        return "exited before its tests finished"
    if returncode < 0:
        name = signal.Signals(-returncode).name
        return f"killed by {name}" + (" (CPU limit)" if name == "SIGXCPU" else "")
    return f"exit status {returncode}"


def _environment(workdir: Path) -> dict[str, str]:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(workdir), "TMPDIR": str(workdir), "LANG": "C.UTF-8",
           "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONSAFEPATH": "1",
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    for name in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):  # some CPUs need them for OpenBLAS
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def _remove(workdir: Path) -> None:
    try:
        shutil.rmtree(workdir)
    except OSError:  # the program took permissions away from its own files (matters when not root)
        for folder, _, _ in os.walk(workdir):
            os.chmod(folder, 0o700)
        shutil.rmtree(workdir, ignore_errors=True)


# --- slots and interpreter (root only) -----------------------------------------------------------


class _Slot:
    """A host-wide slot: an exclusive lock on one of SLOTS lock files; yields the slot's uid."""

    directory = Path(tempfile.gettempdir()) / "redline-sandbox-slots"

    def __enter__(self) -> int:
        self.directory.mkdir(mode=0o700, exist_ok=True)
        while True:
            for slot in range(SLOTS):
                uid = SLOT_UID_BASE + slot
                if _has_account(uid):
                    continue  # a real user: never run programs as, or kill, it
                handle = open(self.directory / f"slot-{slot}.lock", "w")
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    handle.close()
                    continue
                self.handle = handle
                return uid
            time.sleep(0.05)

    def __exit__(self, *exc) -> None:
        self.handle.close()


def _has_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


_interpreter_lock = threading.Lock()
_chosen: list[str] = []  # the interpreter found by the first probe


def _interpreter(uid: int) -> str:
    """The first Python the unprivileged uid can run: this one, else python3 on the usual paths.

    (A Python installed under /root, as pyenv does, is not executable by other users.)
    """
    with _interpreter_lock:
        if not _chosen:
            candidates = [sys.executable, shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")]
            _chosen.extend(c for c in dict.fromkeys(candidates) if c and _runs_as(c, uid))
            if not _chosen:
                raise RuntimeError(f"sandbox: no Python interpreter is executable by uid {uid} "
                                   f"(tried {candidates}); pass python=PATH to a world-readable one")
        return _chosen[0]


def _runs_as(python: str, uid: int) -> bool:
    try:
        probe = subprocess.run([python, "-c", "pass"], user=uid, group=uid, extra_groups=[], cwd="/",
                               stdin=subprocess.DEVNULL, capture_output=True, check=False)
    except OSError:
        return False
    return probe.returncode == 0


@functools.cache
def interpreter_version(python: str | None = None) -> str:
    """``"PATH VERSION"`` of the interpreter programs run under (``python``, else the sandbox's
    choice): a different Python can score the same completion differently."""
    path = python or interpreter()
    probe = subprocess.run([path, "-c", "import platform; print(platform.python_version())"],
                           capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL)
    return f"{path} {probe.stdout.strip() or 'unknown version'}"


def interpreter() -> str:
    """The interpreter programs run under (for the record of a run)."""
    if os.geteuid() != 0:
        return sys.executable
    with _Slot() as uid:
        return _interpreter(uid)
