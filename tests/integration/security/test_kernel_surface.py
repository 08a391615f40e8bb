"""The kernel as a workload meets it in a local sandbox: every system call the seccomp filter
denies, called for real (the unit tests check the filter's program, these the kernel's answer),
the socket families it refuses and pidfd_open, which it keeps, the 32-bit and x32 entry points,
the kernel's log and knobs under /proc, and the mount flags. `drivers_local/test_attacks.py`
already tries ptrace, unshare and mount."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.helpers.gateway import RunningGateway, running_gateway
from tests.integration.drivers_local.support import needs_bwrap
from tests.integration.security.support import py, sandbox, sh, still_real
from warmshell.drivers.local.runtime.seccomp import DENIED

pytestmark = [needs_bwrap, pytest.mark.skipif(shutil.which("python3") is None, reason="no python3 in /usr")]

NAME = "victim"

CALL_EACH = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
for item in sys.argv[1].split(","):
    name, number = item.split("=")
    ctypes.set_errno(0)
    result = libc.syscall(int(number), 0, 0, 0, 0, 0, 0)
    print(name, result, ctypes.get_errno())
"""

CLONE_NEWUSER = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
result = libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0)  # clone(CLONE_NEWUSER | SIGCHLD)
if result == 0:
    os._exit(0)  # the child, had the filter let it through
print(result, ctypes.get_errno())
"""

# i386 getpid through `int $0x80` from a 64-bit process: mov eax, 20; int 0x80; ret.
INT80 = """
import ctypes, mmap
code = b"\\xb8\\x14\\x00\\x00\\x00\\xcd\\x80\\xc3"
page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
page.write(code)
address = ctypes.addressof(ctypes.c_char.from_buffer(page))
print("ALIVE", ctypes.CFUNCTYPE(ctypes.c_int)(address)(), flush=True)
"""

X32 = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
print("ALIVE", libc.syscall(0x40000000 | 39), ctypes.get_errno(), flush=True)  # x32 getpid
"""


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[RunningGateway]:
    async with running_gateway(tmp_path / "state") as running:
        await sandbox(running, NAME)
        yield running


async def test_every_denied_system_call_fails_with_eperm_in_the_kernel(gw: RunningGateway) -> None:
    calls = ",".join(f"{name}={number}" for name, number in sorted(DENIED.items()))
    code, out, err = await py(gw, NAME, CALL_EACH, calls)
    assert code == 0, err
    answers = {line.split()[0]: tuple(map(int, line.split()[1:])) for line in out.splitlines()}
    assert answers == {name: (-1, 1) for name in DENIED}  # EPERM, every one
    # clone with a namespace flag (CLONE_NEWUSER | SIGCHLD): EPERM, no child.
    code, out, _ = await py(gw, NAME, CLONE_NEWUSER)
    assert out.split() == ["-1", "1"]
    await still_real(gw, NAME)


SOCKETS = """
import errno, socket
for name, family, kind in [
    ("unix", socket.AF_UNIX, socket.SOCK_STREAM), ("inet", socket.AF_INET, socket.SOCK_STREAM),
    ("inet6", socket.AF_INET6, socket.SOCK_DGRAM), ("netlink", socket.AF_NETLINK, socket.SOCK_RAW),
    ("vsock", 40, socket.SOCK_STREAM), ("alg", 38, socket.SOCK_SEQPACKET), ("tipc", 30, socket.SOCK_RDM),
    ("rds", 21, socket.SOCK_SEQPACKET), ("packet", 17, socket.SOCK_RAW), ("xdp", 44, socket.SOCK_RAW),
]:
    try:
        socket.socket(family, kind).close()
    except OSError as e:
        print(name, errno.errorcode[e.errno])
    else:
        print(name, "OK")
print("interfaces", len(socket.if_nameindex()) > 0)  # getifaddrs' netlink, as glibc uses it
"""

PIDFD = """
import os, signal, subprocess
child = subprocess.Popen(["sleep", "60"])
fd = os.pidfd_open(child.pid)
signal.pidfd_send_signal(fd, signal.SIGTERM)
print(child.wait())
"""


async def test_sockets_of_other_families_than_unix_inet_and_netlink_are_refused(gw: RunningGateway) -> None:
    code, out, err = await py(gw, NAME, SOCKETS)
    assert code == 0, err
    answers = dict(line.split() for line in out.splitlines())
    assert answers == {
        **{name: "OK" for name in ("unix", "inet", "inet6", "netlink")},
        **{name: "EAFNOSUPPORT" for name in ("vsock", "alg", "tipc", "rds", "packet", "xdp")},
        "interfaces": "True",
    }


async def test_pidfd_open_still_manages_the_sandboxs_own_children(gw: RunningGateway) -> None:
    # Kept for Python's asyncio, Go and systemd; pidfd_getfd is among the denied calls above.
    assert await py(gw, NAME, PIDFD) == (0, "-15\n", "")


@pytest.mark.parametrize("program", [INT80, X32], ids=["i386-int80", "x32"])
async def test_the_other_system_call_entry_points_kill_the_caller(gw: RunningGateway, program: str) -> None:
    code, out, _ = await py(gw, NAME, program)
    # Killed by the filter (SIGSYS; SIGSEGV on a kernel without ia32 emulation): never served.
    assert (code, out) in ((128 + 31, ""), (128 + 11, "")), (code, out)
    await still_real(gw, NAME)


async def test_the_kernel_log_and_knobs_are_out_of_reach(gw: RunningGateway) -> None:
    attempts = [
        "dmesg",
        "head -c 1 /proc/kmsg",
        "head -c 1 /proc/kcore",
        "echo b > /proc/sysrq-trigger",
        "echo 1 > /proc/sys/kernel/sysrq",
        "echo 3 > /proc/sys/vm/drop_caches",
        "echo 1 > /proc/sys/kernel/panic",
        "echo /tmp/x > /proc/sys/kernel/core_pattern",
        "echo 1 > /proc/self/oom_score_adj && echo -1000 > /proc/self/oom_score_adj",
    ]
    for attempt in attempts:
        code, _, err = await sh(gw, NAME, attempt)
        assert code != 0, (attempt, err)
    # Kernel addresses are hidden.
    _, out, _ = await sh(gw, NAME, "head -n 3 /proc/kallsyms | cut -d' ' -f1 | sort -u")
    assert out in ("", "0000000000000000\n"), out
    await still_real(gw, NAME)


async def test_every_mount_is_nosuid_and_names_no_state_directory(gw: RunningGateway) -> None:
    _, mountinfo, _ = await sh(gw, NAME, "cat /proc/self/mountinfo")
    for line in mountinfo.splitlines():
        fields = line.split()
        point, options = fields[4], fields[5].split(",")
        assert "nosuid" in options, line
        if point not in ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty"):
            assert "nodev" in options or point == "/dev/pts", line
    # As root, the host paths bound in are the sandbox directory's, never this gateway's state
    # directory (a gateway run by a user binds from its state directory, whose path then shows).
    if os.geteuid() == 0:
        assert str(gw.gateway.paths.root) not in mountinfo
