"""A small seccomp filter for sandboxed programs (docs/explanation/sandbox.md), as classic BPF for bwrap's
``--seccomp FD``.

Namespaces already keep a program away from the host and other programs. The filter closes what
namespaces leave shared or open, returning ``EPERM``:

- kernel keyrings (``keyctl``, ``add_key``, ``request_key``): as root, a slot uid's keyring would
  outlive the run and be seen by the next program in that slot;
- new namespaces from inside (``unshare``, ``setns``, ``clone`` with ``CLONE_NEWUSER``): a user
  namespace of its own would let a program mount an uncapped tmpfs;
- ``ptrace``, ``process_vm_readv``/``process_vm_writev``: no tracing, not even of bwrap's init;
- where no cgroup bounds the program's memory, ``memfd_create`` (its files are not on a capped
  tmpfs and count towards no rlimit; the harness makes the program's memfds before the filter loads);
- where no cgroup charges TCP buffers (cgroup v1 without ``memory.kmem.tcp.limit_in_bytes``, v2
  booted with ``cgroup.memory=nosocket``, or no cgroup at all), ``socket`` for AF_INET and
  AF_INET6 (the network namespace has only loopback anyway; Unix sockets stay);
- ``clone3`` returns ``ENOSYS`` (its flags sit behind a pointer the filter cannot read; glibc then
  uses ``clone``), and a syscall through any other ABI (32-bit ``int 0x80``, x32) kills the process.

Only x86_64 and aarch64 are described; elsewhere :func:`program_filter` returns None and the
sandbox runs without a filter (namespaces and rlimits still hold).
"""
from __future__ import annotations

import errno
import platform
import struct

# audit arch, and the syscall numbers of this ABI
_ARCHES = {
    "x86_64": (0xC000003E, {"ptrace": 101, "keyctl": 250, "add_key": 248, "request_key": 249, "unshare": 272,
                            "setns": 308, "process_vm_readv": 310, "process_vm_writev": 311, "clone": 56,
                            "clone3": 435, "memfd_create": 319, "socket": 41}),
    "aarch64": (0xC00000B7, {"ptrace": 117, "keyctl": 219, "add_key": 217, "request_key": 218, "unshare": 97,
                             "setns": 268, "process_vm_readv": 270, "process_vm_writev": 271, "clone": 220,
                             "clone3": 435, "memfd_create": 279, "socket": 198}),
}
DENIED = ("ptrace", "keyctl", "add_key", "request_key", "unshare", "setns", "process_vm_readv", "process_vm_writev")
CLONE_NEWUSER = 0x10000000
AF_INET, AF_INET6 = 2, 10
X32_SYSCALL_BIT = 0x40000000

_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|{JEQ,JGE,JSET}|K, BPF_RET|K
_ALLOW, _ERRNO, _KILL = 0x7FFF0000, 0x00050000, 0x80000000  # SECCOMP_RET_{ALLOW,ERRNO,KILL_PROCESS}
_NR, _ARCH, _ARG0 = 0, 4, 16  # offsets in struct seccomp_data (arg0's low 32 bits: little-endian)


def program_filter(machine: str | None = None, memfd: bool = True, inet: bool = True) -> bytes | None:
    """The filter for ``machine`` (default: this one) as ``struct sock_filter`` bytes, or None.
    ``memfd=False`` also refuses ``memfd_create`` (where no cgroup bounds a program's memory: a
    memfd's pages count towards no rlimit); ``inet=False`` refuses ``socket`` for AF_INET and
    AF_INET6 (where no cgroup charges TCP buffers: they would count towards nothing but the
    host's ``tcp_mem``)."""
    arch = _ARCHES.get(machine or platform.machine())
    if arch is None:
        return None
    audit_arch, numbers = arch
    deny, nosys = _ERRNO | errno.EPERM, _ERRNO | errno.ENOSYS
    # (code, jump-if-true label, jump-if-false label, k); labels are resolved to offsets below
    body: list[tuple[int, str | None, str | None, int]] = [
        (_LD_ABS, None, None, _ARCH),
        (_JEQ, None, "kill", audit_arch),
        (_LD_ABS, None, None, _NR),
        (_JGE, "kill", None, X32_SYSCALL_BIT),
        (_JEQ, "nosys", None, numbers["clone3"]),
        (_JEQ, "clone", None, numbers["clone"]),
        *([] if inet else [(_JEQ, "socket", None, numbers["socket"])]),
        *[(_JEQ, "deny", None, numbers[name]) for name in DENIED + (() if memfd else ("memfd_create",))],
        (_RET, None, None, _ALLOW),
        ("clone", None, None, 0),
        (_LD_ABS, None, None, _ARG0),
        (_JSET, "deny", None, CLONE_NEWUSER),
        (_RET, None, None, _ALLOW),
        *([] if inet else [("socket", None, None, 0),
                           (_LD_ABS, None, None, _ARG0),
                           (_JEQ, "deny", None, AF_INET),
                           (_JEQ, "deny", None, AF_INET6),
                           (_RET, None, None, _ALLOW)]),
        ("deny", None, None, 0),
        (_RET, None, None, deny),
        ("nosys", None, None, 0),
        (_RET, None, None, nosys),
        ("kill", None, None, 0),
        (_RET, None, None, _KILL),
    ]
    labels, instructions = {}, []
    for code, true, false, k in body:
        if isinstance(code, str):
            labels[code] = len(instructions)
        else:
            instructions.append((code, true, false, k))
    out = bytearray()
    for at, (code, true, false, k) in enumerate(instructions):
        jt = labels[true] - at - 1 if true else 0
        jf = labels[false] - at - 1 if false else 0
        out += struct.pack("=HBBI", code, jt, jf, k)
    return bytes(out)
