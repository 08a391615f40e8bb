"""The seccomp filter every local sandbox runs under, generated as classic BPF (pure).

bubblewrap loads it (`--seccomp FD`) after setting no_new_privs, so it covers the agent and
everything it starts. It is a deny-list on top of the namespaces and the empty capability set:
the calls that reach another process's memory (ptrace, process_vm_*, kcmp), change mounts or
namespaces (the mount family, unshare, setns, clone with a namespace flag), or widen the kernel's
attack surface for no workload's benefit (keyctl, bpf, perf_event_open, userfaultfd, io_uring,
module and kexec loading, ...) fail with EPERM. clone3 fails with ENOSYS, because its flags live
in memory a filter cannot read; glibc then falls back to clone(2), whose flags it can. A foreign
architecture or the x32 ABI (a second syscall table that would dodge the numbers below) kills
the process.

Sockets are an allow-list: Unix, IPv4, IPv6 and netlink (getifaddrs needs NETLINK_ROUTE); any
other family fails with EAFNOSUPPORT, as on a kernel built without it (AF_VSOCK would reach a
hypervisor's services on a VM host; AF_ALG, AF_TIPC, AF_RDS, ... are kernel surface no workload
here needs). pidfd_open stays: Python's asyncio, Go and systemd manage children with it, and in
the sandbox's PID namespace it reaches only the sandbox's own processes; pidfd_getfd, the call
that would take a descriptor from another process through one, is denied.
"""

from __future__ import annotations

import errno
import platform
import struct

__all__ = ["DENIED", "NAMESPACE_FLAGS", "SOCKET_FAMILIES", "SeccompUnsupported", "program"]

AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000

# x86_64 syscall numbers (arch/x86/entry/syscalls/syscall_64.tbl).
DENIED: dict[str, int] = {
    "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312,
    "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "open_tree": 428, "move_mount": 429,
    "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
    "unshare": 272, "setns": 308,
    "keyctl": 250, "add_key": 248, "request_key": 249,
    "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "init_module": 175, "finit_module": 313, "delete_module": 176, "kexec_load": 246, "kexec_file_load": 320,
    "open_by_handle_at": 304, "name_to_handle_at": 303, "iopl": 172, "ioperm": 173,
    "swapon": 167, "swapoff": 168, "reboot": 169, "acct": 163, "quotactl": 179,
    "lookup_dcookie": 212, "syslog": 103, "uselib": 134, "personality": 135,
    # Reviewed as an allow-list would: what no workload needs, or only with a capability it has not.
    "modify_ldt": 154, "memfd_secret": 447, "listmount": 458, "statmount": 457,
    "pidfd_getfd": 438, "process_madvise": 440, "process_mrelease": 448, "fanotify_init": 300,
    "move_pages": 279, "migrate_pages": 256, "vhangup": 153, "ustat": 136, "sysfs": 139, "_sysctl": 156,
    "settimeofday": 164, "clock_settime": 227, "clock_adjtime": 305,
}  # fmt: skip
ENOSYS_CALLS: dict[str, int] = {"clone3": 435}
SYS_CLONE = 56
SYS_SOCKET = 41
AF_UNIX, AF_INET, AF_INET6, AF_NETLINK = 1, 2, 10, 16
SOCKET_FAMILIES = (AF_UNIX, AF_INET, AF_INET6, AF_NETLINK)

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x02000000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWTIME = 0x10000000, 0x20000000, 0x40000000, 0x00000080
NAMESPACE_FLAGS = (
    CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
    | CLONE_NEWTIME
)  # fmt: skip

# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6]
_OFFSET_NR, _OFFSET_ARCH, _OFFSET_ARG0 = 0, 4, 16
_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
RET_ALLOW, RET_KILL_PROCESS, _RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000


class SeccompUnsupported(RuntimeError):
    """The filter is written for x86_64 syscall numbers only."""


def _ins(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def _errno(value: int) -> int:
    return _RET_ERRNO | value


def program(machine: str | None = None) -> bytes:
    """The filter as the raw `struct sock_filter` array bwrap reads from its --seccomp fd."""
    machine = machine or platform.machine()
    if machine != "x86_64":
        raise SeccompUnsupported(f"the sandbox seccomp filter supports x86_64 only, not {machine}")
    prog = [
        _ins(_LD_W_ABS, 0, 0, _OFFSET_ARCH),
        _ins(_JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
        _ins(_RET_K, 0, 0, RET_KILL_PROCESS),
        _ins(_LD_W_ABS, 0, 0, _OFFSET_NR),
        _ins(_JGE_K, 0, 1, X32_SYSCALL_BIT),
        _ins(_RET_K, 0, 0, RET_KILL_PROCESS),
    ]
    for nr in sorted(DENIED.values()):
        prog += [_ins(_JEQ_K, 0, 1, nr), _ins(_RET_K, 0, 0, _errno(errno.EPERM))]
    for nr in sorted(ENOSYS_CALLS.values()):
        prog += [_ins(_JEQ_K, 0, 1, nr), _ins(_RET_K, 0, 0, _errno(errno.ENOSYS))]
    prog += _socket_families()
    # clone(2) whose flags (the low word of args[0]) ask for a namespace.
    prog += [
        _ins(_JEQ_K, 0, 3, SYS_CLONE),
        _ins(_LD_W_ABS, 0, 0, _OFFSET_ARG0),
        _ins(_JSET_K, 0, 1, NAMESPACE_FLAGS),
        _ins(_RET_K, 0, 0, _errno(errno.EPERM)),
        _ins(_RET_K, 0, 0, RET_ALLOW),
    ]
    return b"".join(prog)


def _socket_families() -> list[bytes]:
    """socket(2) whose family (the low word of args[0]) is not in SOCKET_FAMILIES: EAFNOSUPPORT.
    Every path returns, so the accumulator's syscall number is needed no further."""
    count = len(SOCKET_FAMILIES)
    prog = [_ins(_JEQ_K, 0, count + 3, SYS_SOCKET), _ins(_LD_W_ABS, 0, 0, _OFFSET_ARG0)]
    # The k-th family jumps over the ones after it and the refusal, to the allow.
    prog += [_ins(_JEQ_K, count - k, 0, family) for k, family in enumerate(SOCKET_FAMILIES)]
    return [*prog, _ins(_RET_K, 0, 0, _errno(errno.EAFNOSUPPORT)), _ins(_RET_K, 0, 0, RET_ALLOW)]
