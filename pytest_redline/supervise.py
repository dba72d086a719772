"""The supervisor of one server: ``python -m pytest_redline.supervise GRACE_S LOG -- COMMAND...``.

The gate starts every server through this small single-threaded process (see
:mod:`pytest_redline.servers`), because cleanup must hold however the gate ends:

- The server runs in a process group of its own (a new session), so that stopping it reaches
  its worker processes too (vLLM's and SGLang's): SIGTERM to the whole group, then SIGKILL
  after ``GRACE_S`` seconds.
- The gate holds the write end of this process's stdin. When the gate exits, however it
  exits (Ctrl-C, SIGTERM, SIGKILL), the kernel closes that pipe and the supervisor stops the
  group. A parent-death signal alone would not do: it reaches only the direct child, and it
  fires when the gate's thread that forked it exits, not the gate.
- The server's leader also gets SIGKILL as its parent-death signal, set here between fork and
  exec (safe: this process has one thread), in case the supervisor itself is killed.
- The supervisor is a child subreaper, so worker processes orphaned by their leader stay its
  children and are reaped, not left as zombies.

It writes the server's pid as its first line on stdout, and exits with the server's exit
status (128 + N for a server killed by signal N).
"""
from __future__ import annotations

import ctypes
import os
import select
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
POLL_S = 0.1


def _prctl(option: int, value: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the pipe still stops the server
        pass


def _die_with_parent() -> None:
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _reap(server: subprocess.Popen) -> None:
    """Reap every exited child: orphaned workers reparented to this subreaper, and the server
    (whose status is kept on ``server``)."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid == server.pid:
            server.returncode = os.waitstatus_to_exitcode(status)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_group(server: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM to the server's process group; SIGKILL to what is left after ``grace_s``."""
    pgid = server.pid
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        _reap(server)
        if not _group_alive(pgid):
            return
        time.sleep(POLL_S)
    _signal_group(pgid, signal.SIGKILL)
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and _group_alive(pgid):
        _reap(server)
        time.sleep(POLL_S)


def _status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        sys.stderr.write("usage: python -m pytest_redline.supervise GRACE_S LOG -- COMMAND...\n")
        return 2
    grace_s, log, command = float(argv[0]), argv[1], argv[3:]
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the gate's to handle: it closes the pipe
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    with open(log, "ab") as out:
        try:
            server = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                      start_new_session=True, preexec_fn=_die_with_parent)
        except OSError as e:
            out.write(f"redline: cannot start {command[0]}: {e}\n".encode())
            return 127
    sys.stdout.write(f"{server.pid}\n")
    sys.stdout.flush()
    while server.returncode is None and not stopping:
        try:
            readable, _, _ = select.select([sys.stdin], [], [], POLL_S)
        except InterruptedError:
            continue
        if readable:  # EOF: the gate closed the pipe (to stop the server) or died
            break
        _reap(server)
    stop_group(server, grace_s)  # also when the leader exited by itself: its workers may live on
    _reap(server)
    return _status(server.wait())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
