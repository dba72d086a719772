"""One run: the bootstrap that runs before any user code, the pipes and memfds it reads, and
the verdict (exit status 0 and the token written after the tests)."""
from __future__ import annotations

import math
import os
import secrets
import selectors
import subprocess
import time

from pytest_redline.suites.sandbox.launcher import _Fds, _Launcher
from pytest_redline.suites.sandbox.program import Limits, Program, Result, cleanup_failures

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



def _execute(program: Program, launcher: _Launcher, python: str) -> Result:
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

