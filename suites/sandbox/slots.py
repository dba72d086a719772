"""The slots concurrent runs hold (as root, each runs as its slot's own uid) and the probes of
an interpreter, run so that nothing a program could have written is imported."""
from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

SLOT_UID_BASE = 61000  # as root, slot k runs as uid = gid = base + k; the base's default
UID_BASE_SETTING = "REDLINE_SANDBOX_UID_BASE"  # the base, for containers that share a kernel but not /run
SLOTS = 64  # concurrent sandboxes on one host
SLOT_FOLDER = Path("/run/redline-sandbox")  # the slots' lock files: root's own, whatever $TMPDIR is


def uid_base() -> int:
    """The first slot uid: ``$REDLINE_SANDBOX_UID_BASE``, else SLOT_UID_BASE."""
    given = os.environ.get(UID_BASE_SETTING, "").strip()
    if not given:
        return SLOT_UID_BASE
    if not given.isdigit() or not 1000 <= int(given) <= 2**31 - 1 - SLOTS:
        raise ValueError(f"sandbox: ${UID_BASE_SETTING}: expected a uid from 1000 to {2**31 - 1 - SLOTS}, got {given!r}")
    return int(given)


@contextlib.contextmanager
def _slot() -> Iterator[int | None]:
    """As root, a host-wide slot (an exclusive lock on one of SLOTS lock files in SLOT_FOLDER,
    which every gate on this host shares whatever its $TMPDIR): yields its uid. When not root,
    None (every run uses the caller's uid)."""
    if os.geteuid() != 0:
        yield None
        return
    directory, base = _slot_folder(), uid_base()
    while True:
        for slot in range(SLOTS):
            uid = base + slot
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


def slot_name(uid: int) -> str:
    """The name of ``uid``'s cgroups: from the uid, so gates with uid bases of their own never
    share one."""
    return f"uid-{uid}"


@contextlib.contextmanager
def unheld(name: str) -> Iterator[bool]:
    """Whether no run holds the slot whose cgroups are named ``name`` (e.g. ``uid-61003``, of this
    gate's uid range); while True, it is held here."""
    kind, _, number = name.partition("-")
    slot = -1
    if number.isdigit():  # slot-k: the names an older version gave
        slot = {"uid": int(number) - uid_base(), "slot": int(number)}.get(kind, -1)
    if not 0 <= slot < SLOTS:
        yield False
        return
    directory = _slot_folder()
    fd = os.open(directory / f"slot-{slot}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def _slot_folder() -> Path:
    _private_folder(SLOT_FOLDER)
    return SLOT_FOLDER


def _private_folder(directory: Path) -> None:
    """Make ``directory`` ours alone, refusing one that someone else made (e.g. a program, to
    plant symlinks for root to follow)."""
    try:
        directory.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as error:
        raise RuntimeError(f"sandbox: cannot make the slots' folder {directory}: {error.strerror}") from None
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


def _probe(python: str, code: str, uid: int | None = None, args: tuple[str, ...] = ()) -> str:
    """Run ``python -I -S -c code`` from / with an empty environment (as ``uid`` if given); its
    stdout. -I keeps the current folder, PYTHON* variables and user site out, -S every .pth file:
    nothing a program could have written is imported."""
    drop = {"user": uid, "group": uid, "extra_groups": []} if uid is not None else {}
    try:
        done = subprocess.run([python, "-I", "-S", "-c", code, *args], cwd="/", env={}, stdin=subprocess.DEVNULL,
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

