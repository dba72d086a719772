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
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator

SLOT_UID_BASE = 61000  # as root, slot k runs as uid = gid = SLOT_UID_BASE + k
SLOTS = 64  # concurrent sandboxes on one host


@contextlib.contextmanager
def _slot() -> Iterator[int | None]:
    """As root, a host-wide slot (an exclusive lock on one of SLOTS lock files): yields its uid.
    When not root, None (every run uses the caller's uid)."""
    if os.geteuid() != 0:
        yield None
        return
    directory = _slot_folder()
    while True:
        for slot in range(SLOTS):
            uid = SLOT_UID_BASE + slot
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
    """The name of ``uid``'s slot (its lock file and its cgroups)."""
    return f"slot-{uid - SLOT_UID_BASE}"


@contextlib.contextmanager
def unheld(name: str) -> Iterator[bool]:
    """Whether no run holds the slot ``name`` (e.g. ``slot-3``); while True, it is held here."""
    if not name.startswith("slot-") or not name[5:].isdigit():
        yield False
        return
    directory = _slot_folder()
    fd = os.open(directory / f"{name}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
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
    directory = Path(tempfile.gettempdir()) / "redline-sandbox-slots"
    _private_folder(directory)
    return directory


def _private_folder(directory: Path) -> None:
    """Make ``directory`` ours alone, refusing one that someone else made (e.g. a program, to
    plant symlinks for root to follow)."""
    with contextlib.suppress(FileExistsError):
        directory.mkdir(mode=0o700)
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

