"""What a program could take from the whole host (docs/explanation/sandbox.md): TCP buffers, which cgroup v1
charges only under a limit of their own, and pseudo-terminals, which every devpts instance draws
from one host-wide pool."""
from __future__ import annotations

import pytest

from pytest_redline.suites.sandbox import Limits, Program, cgroup, run

pytestmark = pytest.mark.slow  # bubblewrap jails

LAYOUT = cgroup.layout()

# Opens loopback connections and queues data on each without ever reading it, until nothing
# more goes in; prints what it queued (MiB).
TCP_HOG = r"""
import socket
queued = 0
try:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    pairs, chunk = [], b"x" * 65536
    for _ in range(200):
        sender = socket.create_connection(server.getsockname())
        pairs.append((sender, server.accept()[0]))
        sender.setblocking(False)
        while True:
            try:
                queued += sender.send(chunk)
            except OSError:
                break
except OSError as error:
    print("refused:", error)
print("queued", queued >> 20)
"""


def queued_mib(output: str) -> int:
    return int(output.split("queued")[-1].split()[0])


def test_capped_tcp_buffers_sandbox():
    # On cgroup v1 TCP buffers are charged only under memory.kmem.tcp.limit_in_bytes: a program
    # under a 128 MiB cap queued 952 MiB in loopback buffers, and the group was charged 19 MiB
    # (this one: 755 MiB on 2e7674c).
    limits = Limits(cpu_seconds=5, memory_bytes=128 << 20, open_files=512, tcp_bytes=32 << 20)
    result = run(Program(TCP_HOG, "pass\n", limits))
    assert result.passed, result
    queued = queued_mib(result.output)
    if isinstance(LAYOUT, cgroup.Layout) and LAYOUT.tcp:
        assert "refused" not in result.output, result.output  # inet sockets work: they are charged
    else:
        assert "refused" in result.output and queued == 0, result.output  # seccomp refuses inet sockets
    assert queued <= 2 * (limits.tcp_bytes >> 20), result.output


def test_honest_loopback_tcp_sandbox():
    # A program that talks to itself over loopback TCP still works where TCP buffers are charged.
    code = ("import socket, threading\nserver = socket.create_server(('127.0.0.1', 0))\n"
            "def echo():\n    peer = server.accept()[0]\n    peer.sendall(peer.recv(100) * 2)\n"
            "threading.Thread(target=echo).start()\nclient = socket.create_connection(server.getsockname())\n"
            "client.sendall(b'ping')\nanswer = client.recv(100)\n")
    result = run(Program(code, "assert answer == b'pingping', answer\n"))
    if isinstance(LAYOUT, cgroup.Layout) and LAYOUT.tcp:
        assert result.passed, result
    else:
        assert not result.passed and "PermissionError" in result.output, result


PTYS = r"""
import os
held = []
for _ in range(600):
    try:
        held.append(os.openpty())
    except OSError as error:
        print("refused:", error)
        break
print("ptys", len(held))
"""


def test_no_ptys_sandbox():
    # Each jail had a devpts instance of its own, uncapped, drawing on the host's one pool of
    # ptys (3,072 here): one program took 490 in a bounded run.
    result = run(Program(PTYS, "pass\n", Limits(cpu_seconds=5, open_files=2048)))
    assert result.passed, result
    assert "ptys 0" in result.output and "refused" in result.output, result.output


def test_inet_refused_where_tcp_uncharged_sandbox(monkeypatch):
    # Where no cgroup charges TCP buffers (v1 without the knob, v2 booted with nosocket), the
    # seccomp filter refuses inet sockets; Unix sockets still work. Shown here by a layout that
    # says so (this host has the knob).
    from dataclasses import replace

    from pytest_redline.suites.sandbox import jail

    if not isinstance(LAYOUT, cgroup.Layout):
        pytest.skip(f"no cgroup per program here: {LAYOUT} (inet sockets are refused anyway)")
    monkeypatch.setattr(jail, "_cgroups", lambda: replace(LAYOUT, tcp=False))
    monkeypatch.setattr(jail, "_jails", {})
    result = run(Program(TCP_HOG, "pass\n", Limits(cpu_seconds=5, open_files=512)))
    assert result.passed and "refused: [Errno 1]" in result.output and queued_mib(result.output) == 0, result.output
    pair = "import socket\nleft, right = socket.socketpair()\nleft.sendall(b'hi')\ngot = right.recv(2)\n"
    assert run(Program(pair, "assert got == b'hi'\n")).passed
