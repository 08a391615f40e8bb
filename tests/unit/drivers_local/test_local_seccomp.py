"""The sandbox seccomp filter, run through a small classic-BPF interpreter."""

from __future__ import annotations

import errno
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmshell.drivers.local.runtime import seccomp

X86_64 = seccomp.AUDIT_ARCH_X86_64
EPERM = 0x00050000 | errno.EPERM
ENOSYS = 0x00050000 | errno.ENOSYS
EAFNOSUPPORT = 0x00050000 | errno.EAFNOSUPPORT


def run(prog: bytes, *, nr: int, arch: int = X86_64, arg0: int = 0) -> int:
    """Evaluate a filter made of the instructions the generator emits (ld abs, jeq, jge, jset, ret)."""
    data = struct.pack("=iIQ6Q", nr, arch, 0, arg0, 0, 0, 0, 0, 0)
    insns = [struct.unpack("=HBBI", prog[i : i + 8]) for i in range(0, len(prog), 8)]
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == 0x20:
            acc = struct.unpack_from("=I", data, k)[0]
            pc += 1
        elif code in (0x15, 0x35, 0x45):
            hit = acc == k if code == 0x15 else acc >= k if code == 0x35 else bool(acc & k)
            pc += 1 + (jt if hit else jf)
        elif code == 0x06:
            return k
        else:
            raise AssertionError(f"unexpected instruction {code:#x}")


PROG = seccomp.program("x86_64")


@pytest.mark.parametrize("name", sorted(seccomp.DENIED))
def test_denied_calls_fail_with_eperm(name: str) -> None:
    assert run(PROG, nr=seccomp.DENIED[name]) == EPERM


def test_the_calls_the_issue_names_are_denied() -> None:
    for name in ("ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "mount", "umount2", "unshare",
                 "setns", "keyctl", "bpf", "perf_event_open", "userfaultfd", "io_uring_setup",
                 "io_uring_enter", "init_module", "kexec_load"):  # fmt: skip
        assert name in seccomp.DENIED, name


def test_clone3_is_enosys_so_libc_falls_back_to_clone() -> None:
    assert run(PROG, nr=435) == ENOSYS


def test_clone_with_a_namespace_flag_is_denied_plain_clone_allowed() -> None:
    fork_flags = 0x01200011  # CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID | SIGCHLD, as fork() uses
    assert run(PROG, nr=seccomp.SYS_CLONE, arg0=fork_flags) == seccomp.RET_ALLOW
    for flag in (0x10000000, 0x20000000, 0x40000000, 0x00020000, 0x04000000, 0x08000000, 0x02000000):
        assert run(PROG, nr=seccomp.SYS_CLONE, arg0=fork_flags | flag) == EPERM


def test_the_calls_an_allow_list_review_refused_are_denied() -> None:
    for name in ("modify_ldt", "memfd_secret", "listmount", "statmount", "pidfd_getfd", "process_madvise"):
        assert run(PROG, nr=seccomp.DENIED[name]) == EPERM, name


def test_sockets_of_the_allowed_families_only() -> None:
    for family in (1, 2, 10, 16):  # AF_UNIX AF_INET AF_INET6 AF_NETLINK
        assert run(PROG, nr=seccomp.SYS_SOCKET, arg0=family) == seccomp.RET_ALLOW, family
    for family in (0, 17, 38, 40, 30, 21, 44):  # AF_UNSPEC PACKET ALG VSOCK TIPC RDS XDP
        assert run(PROG, nr=seccomp.SYS_SOCKET, arg0=family) == EAFNOSUPPORT, family


@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_only_the_low_word_of_a_socket_family_counts(arg0: int) -> None:
    allowed = arg0 & 0xFFFFFFFF in seccomp.SOCKET_FAMILIES
    assert run(PROG, nr=seccomp.SYS_SOCKET, arg0=arg0) == (seccomp.RET_ALLOW if allowed else EAFNOSUPPORT)


def test_ordinary_calls_are_allowed() -> None:
    for nr in (0, 1, 2, 3, 9, 57, 59, 60, 231, 257, 434):  # read write open close mmap fork execve exit ... pidfd_open
        assert run(PROG, nr=nr) == seccomp.RET_ALLOW


def test_foreign_architecture_and_x32_are_killed() -> None:
    assert run(PROG, nr=0, arch=0x40000003) == seccomp.RET_KILL_PROCESS  # i386
    assert run(PROG, nr=0x40000000 | 101) == seccomp.RET_KILL_PROCESS  # x32 ptrace


@given(st.integers(min_value=0, max_value=0x3FFFFFFF))
def test_every_syscall_number_gets_a_verdict(nr: int) -> None:
    verdict = run(PROG, nr=nr, arg0=2)  # arg0: AF_INET, for socket(2)
    expected = EPERM if nr in seccomp.DENIED.values() else ENOSYS if nr == 435 else seccomp.RET_ALLOW
    assert verdict == expected


def test_other_machines_are_refused() -> None:
    with pytest.raises(seccomp.SeccompUnsupported, match="x86_64"):
        seccomp.program("aarch64")
