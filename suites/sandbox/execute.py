"""One run: the bootstrap that runs before any user code, the pipes and memfds it reads, and
the verdict (exit status 0 and the token written after the tests)."""
from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import resource
import secrets
import selectors
import subprocess
import time

from pytest_redline.suites.sandbox.launcher import _Fds, _Launcher
from pytest_redline.suites.sandbox.program import Limits, Program, Result, cleanup_failures
from pytest_redline.suites.sandbox.slots import _probe

# Runs inside the child as the unprivileged user, before any user code: set the limits, take the
# token off its pipe, compile both parts, then run them through references taken here; only its own
# process (its pid, recorded before user code) runs the tests and writes the token, and the tests'
# namespace and builtins hold only keys of type exactly str when the tests start. argv: token
# fd, result fd, program and tests source fds, the cgroups' cgroup.procs fds (comma-separated, maybe
# none: writing 0 moves the writer), then the rlimits (soft values); none is secret. The interpreter starts
# with -S (site's .pth files cost 4x the start-up and would run code from site-packages); SITE, filled
# in by _bootstrap, is what site would set (a venv's prefixes and the site-packages folders), probed
# once per interpreter. Neither site nor os is imported (os alone is about 3 ms of CPU a program), so the
# interactive texts copyright, credits and license (each imports os) are not defined.
_BOOTSTRAP = r"""
import builtins, posix, sys, _ctypes, _sitebuiltins
sys.prefix, sys.exec_prefix, paths = SITE
sys.path.extend(paths)
builtins.quit, builtins.exit = (_sitebuiltins.Quitter(name, "Ctrl-D (i.e. EOF)") for name in ("quit", "exit"))
builtins.help = _sitebuiltins._Helper()

# libc through _ctypes (ctypes itself costs 4 ms a start; resource, 0.5 ms, is not needed then)
class Int(_ctypes._SimpleCData):
    _type_ = "i"

class Long(_ctypes._SimpleCData):
    _type_ = "L"

class Function(_ctypes.CFuncPtr):
    _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
    _restype_ = Int

def libc(name, *args, functions={}, handle=_ctypes.dlopen(None)):  # a call that returns 0 on success
    if name not in functions:
        functions[name] = Function(_ctypes.dlsym(handle, name))
    if functions[name](*args) != 0:
        raise OSError(_ctypes.get_errno(), name)

def setrlimit(which, soft, hard, width=_ctypes.sizeof(Long), order=sys.byteorder):
    libc("setrlimit", which, soft.to_bytes(width, order) + hard.to_bytes(width, order))  # struct rlimit

class Source:  # __main__.__loader__: linecache, so inspect.getsource, finds the program's lines through it
    def __init__(self, text):
        self.text = text

    def get_source(self, name):
        return self.text

def sandboxed(argv, exec=exec, compile=compile, open=open, read=posix.read, write=posix.write, close=posix.close,
              exit=posix._exit, getpid=posix.getpid, setrlimit=setrlimit, libc=libc, streams=(sys.stdout, sys.stderr),
              type=type, str=str, list=list, namespaces_of=(builtins.__dict__,)):
    token_fd, result_fd, code_fd, tests_fd = map(int, argv[:4])
    cpu, memory, processes, file_bytes, open_files = map(int, argv[5:])
    for fd in map(int, filter(None, argv[4].split(","))):  # the run's cgroups: joined before any user code
        write(fd, b"0")
        close(fd)
    token = read(token_fd, 64)
    close(token_fd)
    with open(code_fd, encoding="utf-8") as f:  # the sources come on fds, closed before user code
        source = f.read()
    program = compile(source, "program.py", "exec")
    with open(tests_fd, encoding="utf-8") as f:
        tests = compile(f.read(), "<tests>", "exec")  # <...>: no line of it is looked up anywhere
    rlimit_cpu, rlimit_as, rlimit_nproc, rlimit_fsize, rlimit_nofile, rlimit_core = RLIMITS
    for which, soft, hard in (
        (rlimit_cpu, cpu, cpu + 1),
        (rlimit_as, memory, memory),
        (rlimit_nproc, processes, processes),
        (rlimit_fsize, file_bytes, file_bytes),
        (rlimit_nofile, open_files, open_files),
        (rlimit_core, 0, 0),
    ):
        setrlimit(which, soft, hard)
    # Not dumpable (prctl PR_SET_DUMPABLE, 0): /proc/self/mem (every /proc/<pid>/mem of this process)
    # is root's alone, so the token cannot be read back through it; forked children inherit it.
    libc("prctl", 4, 0, 0, 0, 0)
    main = type(sys)("__main__")
    main.__loader__ = Source(source)
    sys.modules["__main__"] = main
    pid, held = getpid(), []

    def leave_if_forked():  # a forked child that returned here: it never runs the tests nor writes the token
        if getpid() != pid:
            flush()
            exit(0)

    def flush():
        for stream in streams:
            try:
                stream.flush()
            except BaseException:
                pass

    exec(program, main.__dict__)
    leave_if_forked()
    for namespace in (main.__dict__, *namespaces_of):  # keys of type exactly str: lookups take the str-only way
        items = list(namespace.items())
        held.append(items)  # what is dropped stays alive (no __del__ runs) until the process exits
        namespace.clear()
        namespace.update([item for item in items if type(item[0]) is str])
    exec(tests, main.__dict__)
    leave_if_forked()
    flush()
    write(result_fd, token)
    exit(0)

sys.argv, argv = ["program.py"], sys.argv[1:]
sandboxed(argv)
"""



TOKEN_BYTES = 32  # the pass token: 16 random bytes in hex
STARVED_FACTOR = 5  # a starved program's run lasts at most this many times its wall-clock limit


def _execute(program: Program, launcher: _Launcher, python: str,
             turn: contextlib.AbstractContextManager = contextlib.nullcontext()) -> Result:
    """Run ``program``. The sandbox starts at once, up to the bootstrap's read of the token (bwrap,
    the interpreter, the cgroup join: no user code); the token is written, and the program's clock
    started, only inside ``turn`` (run_many's: at most ``workers`` programs past it at once), which
    is held until the run is torn down."""
    limits, fds = program.limits, _Fds()
    try:
        token = secrets.token_hex(TOKEN_BYTES // 2).encode()
        token_read, token_write = fds.pipe()  # the write end never reaches the child
        result_read, result_write = fds.pipe()
        code, tests = fds.memfd("program.py", program.code), fds.memfd("tests.py", program.tests)
        joins = launcher.prepare(program, fds)  # fds of the cgroups the bootstrap joins, if any
        passed = (token_read, result_write, code, tests)
        argv = [python, "-S", "-c", _bootstrap(python), *map(str, passed), ",".join(map(str, joins)),
                str(math.ceil(limits.cpu_seconds)), str(limits.memory_bytes), str(limits.processes),
                str(limits.file_bytes), str(limits.open_files)]
        child = launcher.start(program, argv, (*passed, *joins), fds)
        fds.close(result_write, code, tests, *joins)  # the token's read end stays open here: was it taken?
        stopped = False
        try:
            with turn:
                start = time.monotonic()
                os.write(token_write, token)  # 32 bytes: fits the pipe; the bootstrap waits for it before user code
                fds.close(token_write)
                try:
                    output, sentinel, stop = _collect(child, result_read, limits, start, launcher)
                finally:
                    problem, stopped = launcher.stop(child), True
        finally:
            if not stopped:  # the turn never came (an error while waiting): no sandbox outlives it
                launcher.stop(child)
        text = _text(output, limits.output_chars)
        if not stop and _unread(token_read):  # the bootstrap never ran: the harness's environment
            raise RuntimeError(f"sandbox: {python} did not start the program (exit status {child.returncode}): "
                               f"{text.strip()[-500:]}")
        if problem:
            cleanup_failures.add(problem)
            return Result(False, f"cleanup failed: {problem}", text, time.monotonic() - start)
        if stop:
            return Result(False, stop, text, time.monotonic() - start)
        if _tokens(sentinel, token) and child.returncode == 0:
            return Result(True, "passed", text, time.monotonic() - start)
        return Result(False, launcher.exit_reason(child.returncode), text, time.monotonic() - start)
    finally:
        fds.close_all()


# What site would set for a program, without running any .pth file: a venv's prefixes (site.venv) and
# its site-packages folders (site.getsitepackages(), a venv's first), in site's order.
_SITE = r"""
import json, site, sys
site.venv(None)
print(json.dumps([sys.prefix, sys.exec_prefix, list(dict.fromkeys(site.getsitepackages()))]))
"""


@functools.cache
def _bootstrap(python: str) -> str:
    """The bootstrap for ``python``, with what site would set (probed once per interpreter)."""
    prefix, exec_prefix, paths = json.loads(_probe(python, _SITE))
    rlimits = (resource.RLIMIT_CPU, resource.RLIMIT_AS, resource.RLIMIT_NPROC, resource.RLIMIT_FSIZE,
               resource.RLIMIT_NOFILE, resource.RLIMIT_CORE)  # this machine's numbers, as the program's
    return _BOOTSTRAP.replace("SITE", repr((prefix, exec_prefix, paths)), 1).replace("RLIMITS", repr(rlimits), 1)


def _tokens(sentinel: bytes, token: bytes) -> bool:
    """Whether the result pipe held the token once and nothing else: only the bootstrap's own
    process writes it, after the tests ran there to the end."""
    return sentinel == token


def _text(output: bytes, chars: int) -> str:
    """The kept output as text: its last ``chars`` characters (a str of 4-byte characters holds 4
    bytes each, so bytes alone do not bound it)."""
    text = output.decode("utf-8", errors="replace")
    if len(text) <= chars:
        return text
    return f"[earlier output dropped: the last {chars} characters are kept]\n" + text[-chars:]


def _unread(fd: int) -> bool:
    """Whether the pipe ``fd`` still holds data (the child never read its token)."""
    os.set_blocking(fd, False)
    try:
        return bool(os.read(fd, 1))
    except BlockingIOError:
        return False


def _collect(child: subprocess.Popen, sentinel_fd: int, limits: Limits, start: float,
             launcher: _Launcher) -> tuple[bytes, bytes, str]:
    """Read output and sentinel until both close; the third item says why it was stopped early.

    Every read is bounded: of the output only the last ``limits.output_bytes`` are kept (the rest
    is dropped, never a failure), and of the result pipe at most one token (more stops the
    program). Where the launcher meters the program (a cgroup), its CPU time over all its
    processes is held to ``limits.cpu_seconds``, and time its processes spent waiting for a CPU
    does not count towards the wall-clock limit: a neighbour cannot make it time out."""
    tail, dropped, sentinel, cap = bytearray(), 0, bytearray(), TOKEN_BYTES
    selector = selectors.DefaultSelector()
    selector.register(child.stdout, selectors.EVENT_READ)
    selector.register(sentinel_fd, selectors.EVENT_READ)

    def output() -> bytes:
        with memoryview(tail) as view:  # one copy of the kept end, not two
            kept = view[-limits.output_bytes:]
            skipped = dropped + len(tail) - len(kept)
            return (f"[{skipped} earlier bytes of output dropped]\n".encode() if skipped else b"") + kept

    timeout, spent = f"timed out after {limits.wall:.1f} s", _Clock(start, limits, launcher)
    try:
        while selector.get_map():
            stop = spent.stop()
            if stop:
                return output(), bytes(sentinel), stop
            for key, _ in selector.select(spent.poll):
                if key.fd == sentinel_fd:
                    data = os.read(sentinel_fd, cap + 1 - len(sentinel))
                    sentinel += data
                    if len(sentinel) > cap:  # a flood: the program fails now, and nothing more is read
                        return output(), b"", "wrote more than the token to the result pipe"
                else:
                    data = os.read(key.fd, 65536)  # small reads: no MiB-sized buffer per read
                    tail += data
                    if len(tail) > 2 * limits.output_bytes:
                        dropped += len(tail) - limits.output_bytes
                        del tail[:-limits.output_bytes]
                if not data:
                    selector.unregister(key.fileobj)
            if child.poll() is not None and not selector.select(0):
                break  # exited; pipes may still be held by stray descendants, killed next
        child.wait(timeout=max(start + limits.wall - time.monotonic(), 0.1))
    except subprocess.TimeoutExpired:
        return output(), bytes(sentinel), timeout
    finally:
        selector.close()
        child.stdout.close()
    return output(), bytes(sentinel), ""


class _Clock:
    """The run's time limits. Without a meter: wall-clock time. With one (a cgroup): the CPU time
    of all its processes against ``cpu_seconds``, and as the program's time the largest of: the
    wall-clock time since it joined its cgroup less the time its least-delayed thread waited for
    a CPU (a neighbour that starves it, or a loaded machine slowing its start, does not make it
    time out), its CPU time over its share (a program that keeps its share busy gets no
    extension) and a fifth of the wall-clock time (no run lasts over 5 x ``wall``, however loaded
    the machine)."""

    def __init__(self, start: float, limits: Limits, launcher: _Launcher):
        self.start, self.limits, self.launcher = start, limits, launcher
        self.poll, self.asked, self.joined, self.waited = 0.5, start, None, 0.0
        self.before: float | None = None  # the wait seen at the first look: the start-up's, before its turn

    def stop(self) -> str:
        """Why the program must stop now, or ''; sets ``poll``, the wait before asking again."""
        now, used = time.monotonic(), self.launcher.usage()
        elapsed = spent = now - self.start
        if used is not None:
            cpu, waited = used
            if cpu > self.limits.cpu_seconds:
                return f"CPU limit: {cpu:.1f} s over all its processes"
            if self.joined is None and cpu > 0:
                self.joined = self.asked  # it joined since the last look: count from then
            if self.before is None:
                self.before = waited
            self.waited = max(self.waited, waited - self.before)  # threads come and go: keep what was seen
            ran = now - self.joined - self.waited if self.joined is not None else 0.0
            spent = max(ran, cpu / self.limits.cpus, elapsed / STARVED_FACTOR)
        self.asked = now
        if spent >= self.limits.wall:
            return f"timed out after {self.limits.wall:.1f} s" + (f" ({elapsed:.1f} s on the clock)" if elapsed > spent + 0.5 else "")
        self.poll = min(self.limits.wall - spent, 0.25 if used is not None else 0.5)
        return ""
