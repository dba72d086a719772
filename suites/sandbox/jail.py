"""The namespace sandbox for one interpreter: bubblewrap's fixed command line (namespaces, the
system's read-only folders, the interpreter's prefixes), checked once by a trivial program, and
the refusal that names what is missing."""
from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import threading
from pathlib import Path

from pytest_redline.suites.sandbox import cgroup, seccomp
from pytest_redline.suites.sandbox.execute import _execute
from pytest_redline.suites.sandbox.launcher import _Jail
from pytest_redline.suites.sandbox.program import OPT_IN, Program, SandboxUnavailable, cleanup_failures
from pytest_redline.suites.sandbox.slots import _probe, _slot, unheld

SYSTEM_PATH = "/usr/bin:/bin:/usr/sbin:/sbin:/usr/local/bin"  # where bwrap, setpriv and rm are looked up
_ETC = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/localtime", "/etc/timezone")  # the loader and time
_TOP = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


_jail_lock = threading.Lock()
_jails: dict[str, _Jail] = {}
_swept: list[cgroup.Layout] = []  # layouts whose leftover groups this process removed

log = logging.getLogger(__name__)


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
    fixed += ["--perms", "0755", "--dir", "/etc"]  # readable by the slot uid: passwd, hosts and the loader's files
    fixed += [arg for path in _ETC if os.path.exists(path) for arg in ("--ro-bind", path, path)]
    fixed += ["--dev", "/dev"]
    bound = _prefixes(python)
    parents = sorted({str(parent) for path in bound for parent in Path(path).parents if str(parent) != "/"})
    prefixes = [arg for parent in parents for arg in ("--perms", "0755", "--dir", parent)]  # traversable
    prefixes += [arg for path in bound for arg in ("--ro-bind", path, path)]
    for folder in _own_folders():  # e.g. a wheel install: the data sets sit in a bound prefix
        if any(folder == path or folder.startswith(path + "/") for path in bound):
            prefixes += ["--size", "4096", "--perms", "0555", "--tmpfs", folder, "--remount-ro", folder]
    groups = _cgroups()
    return _Jail(bwrap, setpriv, tuple(fixed), tuple(prefixes + ["--proc", "/proc"]),
                 seccomp.program_filter(memfd=groups is not None), groups)


def _cgroups() -> cgroup.Layout | None:
    """Where programs' cgroups go, with the leftovers of a killed gate removed (once per
    process); None, with a warning, where none can be made (memfd_create is refused instead)."""
    found = cgroup.layout()
    if isinstance(found, str):
        log.warning("sandbox: no cgroup per program (%s): memfd_create is refused instead, and memory is bounded "
                    "per process only (docs/sandbox.md, the worst case)", found)
        return None
    if found not in _swept:
        for problem in cgroup.sweep(found, unheld):
            cleanup_failures.add(problem)
        _swept.append(found)
    return found


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
    """The folders of the project's packages (the gate, its engines and suites), found from the
    modules themselves wherever they were installed (engines are located, never imported)."""
    folders = set()
    for name in ("pytest_redline", "pytest_redline.engines", "pytest_redline.suites"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            folders.update(os.path.realpath(folder) for folder in spec.submodule_search_locations)
    return sorted(folders)


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

