"""How one run's process is started and stopped: the namespace launcher (bubblewrap) and the
opted-in process launcher, the run's file descriptors, and teardown (reaping, killing a slot
uid's processes, removing a work folder)."""
from __future__ import annotations

import abc
import contextlib
import fcntl
import json
import os
import select
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from pytest_redline.suites.sandbox.cgroup import Cgroup, Layout
from pytest_redline.suites.sandbox.program import Program
from pytest_redline.suites.sandbox.slots import slot_name

REAP_SECONDS = 5.0  # how long teardown waits for killed processes before it reports them
WORKDIR = "/sandbox"  # the program's folder inside the namespaces


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

    def file(self, path: Path) -> int:
        """``path`` opened for writing (a cgroup's cgroup.procs, passed to the bootstrap)."""
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        self.open.append(fd)
        return fd

    def close(self, *fds: int) -> None:
        for fd in fds:
            if fd in self.open:
                self.open.remove(fd)
                with contextlib.suppress(OSError):
                    os.close(fd)

    def close_all(self) -> None:
        self.close(*list(self.open))



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

    def prepare(self, program: Program, fds: _Fds) -> tuple[int, ...]:
        """Before the argv is built: the fds of the groups the bootstrap joins (none here)."""
        return ()

    def usage(self) -> tuple[float, float] | None:
        """(CPU seconds of all the run's processes, seconds they waited for a CPU), where metered."""
        return None

    def exit_reason(self, returncode: int) -> str:
        if returncode == 0:
            return "exited before its tests finished"
        if returncode < 0:
            return _killed(_signal_name(-returncode))
        return f"exit status {returncode}"


def _etc_files(uid: int | None) -> dict[str, str]:
    """A user entry for the program's uid and a host name for loopback: getpass.getuser() and
    socket.getaddrinfo('localhost') work, and no host account or address is shown."""
    uid = os.getuid() if uid is None else uid  # not root: the user namespace maps the caller's uid
    return {"/etc/passwd": f"root:x:0:0:root:/root:/bin/sh\nsandbox:x:{uid}:{uid}:sandbox:{WORKDIR}:/bin/sh\n",
            "/etc/group": f"root:x:0:\nsandbox:x:{uid}:\n",
            "/etc/hosts": "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n",
            "/etc/nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n"}


OUTPUT_PIPE_BYTES = 1 << 20  # the output pipe's buffer: a program's output seldom waits for the harness to read


def _popen(argv: list[str], **kwargs) -> subprocess.Popen:
    try:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 start_new_session=True, **kwargs)
    except OSError as error:  # the harness's environment, not the program: say so loudly
        raise RuntimeError(f"sandbox: could not start {argv[0]}: {error}") from error
    # 64 KiB by default: 1 MiB of output took 16 round trips between the program and the harness,
    # each waiting for a CPU on a loaded machine. The pages are charged to the writer's cgroup.
    with contextlib.suppress(OSError):
        fcntl.fcntl(child.stdout.fileno(), fcntl.F_SETPIPE_SZ, OUTPUT_PIPE_BYTES)
    return child


def _environment(home: str, tmp: str) -> dict[str, str]:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": tmp, "LANG": "C.UTF-8",
           "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONSAFEPATH": "1",
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "MALLOC_ARENA_MAX": "2"}  # glibc reserves 64 MiB of address space per thread's arena otherwise
    for name in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):  # some CPUs need them for OpenBLAS
        if name in os.environ:
            env[name] = os.environ[name]
    return env


# --- the namespace sandbox (bubblewrap) --------------------------------------------------------


@dataclass(frozen=True)
class _Jail:
    """The namespace sandbox for one interpreter: the fixed part of bwrap's command line."""

    bwrap: str
    setpriv: str | None  # as root: drops to the slot uid inside the namespaces
    system: tuple[str, ...]  # namespaces, the system's read-only folders, /dev
    interpreter: tuple[str, ...]  # the interpreter's read-only prefixes, masked folders, /proc
    seccomp: bytes | None  # suites/sandbox/seccomp.py's filter for this machine (None: not described)
    cgroups: Layout | None  # where each program's cgroup goes (None: memfd_create is refused instead)

    def launcher(self, uid: int | None) -> "_NamespaceLauncher":
        return _NamespaceLauncher(self, uid)



class _NamespaceLauncher(_Launcher):
    def __init__(self, jail: _Jail, uid: int | None):
        self.jail, self.uid, self.init, self.cgroup = jail, uid, None, None

    def prepare(self, program: Program, fds: _Fds) -> tuple[int, ...]:
        if self.jail.cgroups is None or self.uid is None:
            return ()
        limits = program.limits
        self.cgroup = Cgroup(self.jail.cgroups, slot_name(self.uid), limits.memory_bytes, limits.processes, limits.cpus,
                             limits.tcp_bytes)
        return tuple(fds.file(path) for path in self.cgroup.procs())

    def usage(self) -> tuple[float, float] | None:
        if self.cgroup is None:
            return None
        try:
            return self.cgroup.usage()
        except (OSError, ValueError, KeyError):
            return None

    def start(self, program: Program, argv: list[str], pass_fds: tuple[int, ...], fds: _Fds) -> subprocess.Popen:
        size = str(program.limits.disk_bytes)
        info_read, info_write = fds.pipe()
        command = [self.jail.bwrap, *self.jail.system]
        for folder in (WORKDIR, "/tmp", "/dev/shm"):  # before the prefixes, which may lie in /tmp
            command += ["--size", size, "--perms", "1777", "--tmpfs", folder]
        if self.jail.seccomp is not None:
            command += ["--seccomp", str(fds.memfd("seccomp", self.jail.seccomp))]
        for path, text in _etc_files(self.uid).items():  # names an honest program looks up
            command += ["--perms", "0644", "--ro-bind-data", str(fds.memfd(path, text)), path]
        command += [*self.jail.interpreter, "--remount-ro", "/", "--chdir", WORKDIR, "--info-fd", str(info_write), "--"]
        if self.uid is not None:
            command += [self.jail.setpriv, f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups",
                        "--no-new-privs", "--bounding-set=-all", "--inh-caps=-all", "--"]
        extra = (info_write, *(int(command[at + 1]) for at, arg in enumerate(command) if arg in ("--seccomp", "--ro-bind-data")))
        child = _popen(command + argv, env=_environment(WORKDIR, "/tmp"), pass_fds=(*pass_fds, *extra))
        fds.close(*extra)
        started, self.init = _namespace_init(child, info_read)
        if not started:  # bwrap failed before creating the namespaces: the harness's environment
            child.kill()
            try:
                child.wait(timeout=REAP_SECONDS)
                said = child.stdout.read(1 << 16).decode("utf-8", errors="replace").strip()  # bounded
            except (subprocess.TimeoutExpired, OSError):
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
        problem = _reap(child, "bwrap")
        if self.cgroup is not None and not problem:  # the groups go once every process is gone
            problem = self.cgroup.remove()
        return problem

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
        if not chunk or len(data) > 1 << 16:  # bwrap writes one small JSON object
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

