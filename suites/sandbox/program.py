"""What runs in the sandbox and what comes back: limits, programs, results, the refusal, and
the teardown problems counted across runs."""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

SANDBOXES = ("namespaces", "process")  # the default first; "process" is the weaker opt-in
OPT_IN = "suite_args: {sandbox: process}"  # how a grid opts into the weaker sandbox

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    """Resource limits for one program (docs/explanation/sandbox.md). ``wall_seconds`` defaults to 3 x CPU +
    5 s. With a cgroup (the default where one can be made): ``memory_bytes`` bounds everything the
    program's processes hold together, ``processes`` its processes and threads together, ``cpus``
    its CPU share (a quota) and ``cpu_seconds`` its CPU time over all its processes. Every
    process also has ``memory_bytes`` of address space and ``cpu_seconds`` of CPU (rlimits), and
    ``processes`` bounds the slot uid's tasks. ``disk_bytes`` is the size of each private tmpfs
    (work folder, /tmp, /dev/shm); ``output_bytes`` how much of the end of the output is read and
    kept, and of that ``output_chars`` characters at most as text. ``tcp_bytes`` bounds the TCP
    buffers of its sockets on cgroup v1, which charges them under a limit of their own (beside
    ``memory_bytes``; v2 charges them under ``memory_bytes``)."""

    cpu_seconds: float = 10.0
    wall_seconds: float | None = None
    memory_bytes: int = 1 << 30
    processes: int = 64  # threads count: ThreadPoolExecutor() and Pool() on a 16-core machine fit
    file_bytes: int = 16 << 20
    open_files: int = 64
    output_bytes: int = 1 << 20
    output_chars: int = 1 << 18  # 1 MiB as a str even of 4-byte characters
    tcp_bytes: int = 64 << 20
    disk_bytes: int = 64 << 20
    cpus: float = 1.0

    def __post_init__(self) -> None:
        for name in ("cpu_seconds", "memory_bytes", "processes", "file_bytes", "open_files", "output_bytes",
                     "output_chars", "tcp_bytes", "disk_bytes", "cpus"):
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
                value.isascii() or value.encode("utf-8")  # isascii: no copy of a long text
            except UnicodeEncodeError as error:  # e.g. a lone surrogate from a broken decode
                raise ValueError(f"Program.{name}: not valid Unicode ({error.reason} at {error.start})") from None


@dataclass(frozen=True)
class Result:
    passed: bool
    reason: str  # "passed", "timed out after 5.0 s", "exit status 1", "exited before its tests finished", ...
    output: str  # the end of stdout and stderr: of the last Limits.output_bytes, Limits.output_chars characters at most
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

