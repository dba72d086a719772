"""A control group per program (docs/explanation/sandbox.md): one memory limit for everything the program's
processes hold (heap, memfd files, tmpfs pages, page cache, shared memory, pipe buffers; on v2
socket buffers too), on v1 a limit of its own for TCP buffers (``memory.kmem.tcp.limit_in_bytes``,
where the kernel has it: v1 charges them only once it is written), one pids limit for its processes and threads, one CPU quota, and its CPU time over all its
processes, on cgroup v2 (``memory.max``, ``pids.max``, ``cpu.max``) or v1 (the ``memory``,
``pids``, ``cpu`` and ``cpuacct`` hierarchies).

The groups live in a ``redline-sandbox`` folder: on v1 under the harness's own group of each
hierarchy (a limit on the harness also holds its programs); on v2 under the root of the harness's
cgroup namespace, where controllers can be enabled. A program joins its groups itself, in the
bootstrap, before any user code: the harness opens each group's ``cgroup.procs`` and passes the fd,
and writing ``0`` to it moves the writer. Where no group can be made and limited (not root, no
delegation, a v2 root that holds processes), :func:`layout` says why and the sandbox falls back to
refusing ``memfd_create`` (suites/sandbox/seccomp.py).
"""
from __future__ import annotations

import contextlib
import errno
import functools
import os
import time
from dataclasses import dataclass
from pathlib import Path

from pytest_redline.suites.sandbox.program import SandboxUnavailable
from pytest_redline.suites.sandbox.slots import SLOT_FOLDER, UID_BASE_SETTING

FOLDER = "redline-sandbox"
CPU_PERIOD_US = 100_000  # the quota's period: 0.1 s
V1 = ("memory", "pids", "cpu", "cpuacct")
V2 = ("memory", "pids", "cpu")


@dataclass(frozen=True)
class Layout:
    """Where this harness makes its programs' groups: ``parents[controller]`` (v1) or one parent
    for all (v2, under ``"unified"``)."""

    version: int
    parents: dict[str, Path]
    tcp: bool = True  # TCP buffers are charged: v1 with memory.kmem.tcp.limit_in_bytes, v2 without nosocket

    def folders(self, name: str) -> list[Path]:
        return sorted({parent / name for parent in self.parents.values()})


class GroupInUse(SandboxUnavailable):
    """A program's cgroup already holds live processes of another gate (the message says which)."""


class Cgroup:
    """One program's groups, limited; removed by :meth:`remove` once its processes are gone."""

    def __init__(self, layout: Layout, name: str, memory_bytes: int, processes: int, cpus: float,
                 tcp_bytes: int = 64 << 20):
        self.layout, self.name = layout, name
        for folder in layout.folders(name):
            if folder.exists():  # left by a gate that was killed mid-run: its processes are gone or dying
                problem = _remove(folder)
                if problem:  # live members in a slot this process holds: a gate that does not share the locks
                    raise GroupInUse(
                        f"sandbox: {problem}: it holds live processes though this gate holds its slot's lock "
                        f"(in {SLOT_FOLDER}), so another gate on this kernel takes the same slots without sharing "
                        f"that folder (a container with a /run of its own); give each such container a uid range "
                        f"of its own with ${UID_BASE_SETTING} (docs/explanation/sandbox.md, \"Slots\")")
            folder.mkdir()
        quota = max(int(cpus * CPU_PERIOD_US), 1000)
        if layout.version == 2:
            self._write("unified", "memory.max", memory_bytes)
            self._write("unified", "memory.swap.max", 0, optional=True)
            self._write("unified", "pids.max", processes)
            self._write("unified", "cpu.max", f"{quota} {CPU_PERIOD_US}")
        else:
            self._write("memory", "memory.limit_in_bytes", memory_bytes)
            self._write("memory", "memory.memsw.limit_in_bytes", memory_bytes, optional=True)  # no swap
            if layout.tcp:  # v1 charges TCP buffers only once this is written, and under this limit alone
                self._write("memory", "memory.kmem.tcp.limit_in_bytes", tcp_bytes)
            self._write("pids", "pids.max", processes)
            self._write("cpu", "cpu.cfs_period_us", CPU_PERIOD_US)
            self._write("cpu", "cpu.cfs_quota_us", quota)

    def _path(self, controller: str, name: str) -> Path:
        return self.layout.parents["unified" if self.layout.version == 2 else controller] / self.name / name

    def _write(self, controller: str, name: str, value: object, optional: bool = False) -> None:
        try:
            self._path(controller, name).write_text(f"{value}\n")
        except OSError:
            if not optional:
                raise

    def procs(self) -> list[Path]:
        """The ``cgroup.procs`` files the program writes itself into (one per hierarchy)."""
        return [folder / "cgroup.procs" for folder in self.layout.folders(self.name)]

    def usage(self) -> tuple[float, float]:
        """(CPU seconds used by all its processes, seconds its least-delayed thread waited for a
        CPU: how long a neighbour kept the program from running at all)."""
        if self.layout.version == 2:
            stat = dict(line.split() for line in self._path("unified", "cpu.stat").read_text().splitlines())
            cpu = int(stat["usage_usec"]) / 1e6
            threads = self._path("unified", "cgroup.threads")
        else:
            cpu = int(self._path("cpuacct", "cpuacct.usage").read_text()) / 1e9
            threads = self._path("pids", "tasks")
        delays = []
        for tid in threads.read_text().split():
            with contextlib.suppress(OSError, ValueError, IndexError):  # exited meanwhile
                delays.append(int(Path(f"/proc/{tid}/schedstat").read_text().split()[1]))
        return cpu, min(delays, default=0) / 1e9

    def remove(self) -> str:
        """Remove the groups once their processes are gone; '' or what is left (never raises)."""
        return "; ".join(problem for problem in map(_remove, self.layout.folders(self.name)) if problem)


def _remove(folder: Path, seconds: float = 5.0) -> str:
    """Remove the group ``folder`` once its processes are gone (they are dying: the namespace's
    init was killed, or bwrap died with its gate); '' or why not (never raises). Nothing is
    killed here: a group with live members belongs to a run, and is reported, never touched."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            folder.rmdir()
            return ""
        except FileNotFoundError:
            return ""
        except OSError as error:
            if error.errno != errno.EBUSY or time.monotonic() > deadline:
                return f"could not remove cgroup {folder}: {error.strerror}"
        time.sleep(0.01)


def sweep(layout: Layout, unheld) -> list[str]:
    """Remove the groups of ``layout`` that no run holds (left by a gate that was killed), each
    while holding its slot (``unheld(name)``: a context manager, True when the slot was free);
    the problems met."""
    problems = []
    for parent in set(layout.parents.values()):
        with contextlib.suppress(FileNotFoundError):
            for folder in parent.iterdir():
                if folder.is_dir():
                    with unheld(folder.name) as free:
                        if free:
                            problems.append(_remove(folder, seconds=0.5))
    return [problem for problem in problems if problem]


@functools.cache
def layout(root: str = "/sys/fs/cgroup") -> Layout | str:
    """Where programs' groups go on this machine, or why there is none (a sentence)."""
    if os.geteuid() != 0:
        return "not root (delegated cgroups are not used)"
    mounts = _mounts()
    unified = next((Path(point) for kind, point, _ in mounts if kind == "cgroup2" and point.startswith(root)), None)
    reasons = []
    if unified is not None:
        found = _v2(unified)
        if isinstance(found, Layout):
            return found
        reasons.append(found)
    found = _v1(mounts, root)
    if isinstance(found, Layout):
        return found
    return "; ".join(reasons + [found])


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(file system type, mount point, super options) of each cgroup mount of this process."""
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            before, _, after = line.partition(" - ")
            kind, _, options = (after.split() + ["", "", ""])[:3]
            if kind in ("cgroup", "cgroup2"):
                found.append((kind, before.split()[4], set(options.split(","))))
    return found


def _v2(mount: Path) -> Layout | str:
    try:
        available = set((mount / "cgroup.controllers").read_text().split())
        if not set(V2) <= available:
            return f"cgroup v2 at {mount}: controllers {sorted(set(V2) - available)} are not available"
        parent = mount / FOLDER
        parent.mkdir(exist_ok=True)
        for folder in (mount, parent):
            enabled = set((folder / "cgroup.subtree_control").read_text().split())
            if not set(V2) <= enabled:
                (folder / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in V2) + "\n")
    except OSError as error:
        return f"cgroup v2 at {mount}: {error.strerror} ({error.filename})"
    return Layout(2, {"unified": parent}, tcp="cgroup.memory=nosocket" not in _kernel_command_line())


def _v1(mounts: list[tuple[str, str, set[str]]], root: str, own_groups: str | None = None) -> Layout | str:
    """The v1 layout under this process's own groups (``own_groups``: /proc/self/cgroup's text)."""
    own = {}
    with contextlib.suppress(OSError):
        for line in (own_groups if own_groups is not None else Path("/proc/self/cgroup").read_text()).splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(","):
                own[controller] = path
    parents = {}
    for controller in V1:
        point = next((p for kind, p, options in mounts if kind == "cgroup" and controller in options
                      and p.startswith(root)), None)
        if point is None or controller not in own:
            return f"cgroup v1: no {controller} hierarchy"
        parents[controller] = Path(point + own[controller].rstrip("/")) / FOLDER
    try:
        for parent in set(parents.values()):
            parent.mkdir(exist_ok=True)
            if not os.access(parent, os.W_OK):
                return f"cgroup v1: {parent} is not writable"
    except OSError as error:
        return f"cgroup v1: {error.strerror} ({error.filename})"
    tcp = parents["memory"] / "memory.kmem.tcp.limit_in_bytes"
    if tcp.exists():
        # Unlimited here, so TCP accounting stays switched on between programs: each program's
        # group switching it on from nothing would patch the kernel's text (a static key) every run.
        with contextlib.suppress(OSError):
            tcp.write_text("-1\n")
    return Layout(1, parents, tcp=tcp.exists())


def _kernel_command_line() -> str:
    try:
        return Path("/proc/cmdline").read_text()
    except OSError:
        return ""
