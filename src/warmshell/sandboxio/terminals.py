"""Pseudo-terminals for interactive execs, made in the sandbox's own devpts.

A sandbox has a devpts instance of its own on its `/dev/pts` (bwrap mounts one in a local
sandbox, the container runtime in a pod's workload container). Whoever holds the sandbox's root
(the local runtime, or a pod's supervisor through its agent's root) opens that instance's `ptmx`
through that root (never following a link, so a workload cannot point it at a device of the
opener's) and takes the slave with TIOCGPTPEER, without looking a path up again. The agent then
makes the slave the command's controlling terminal; the opener keeps the master.
"""

from __future__ import annotations

import fcntl
import os
import stat
import struct

from warmshell.sandboxio.rootfs import openat2

__all__ = ["open_in_root"]

RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS, RESOLVE_IN_ROOT = 0x02, 0x04, 0x10
TIOCSPTLCK = 0x40045431  # _IOW('T', 0x31, int): (un)lock the slave
TIOCGPTPEER = 0x5441  # _IO('T', 0x41): open the slave of this master
PTMX_DEVICE = os.makedev(5, 2)


def open_in_root(root_fd: int, *, owner_of_root: bool = True) -> tuple[int, int]:
    """(master, slave) of a new pseudo-terminal of the devpts under `root_fd`'s `/dev/pts`
    (closes `root_fd`). The slave is owned by the owner of the root when `owner_of_root` (a local
    sandbox, whose root is its user's), else by the caller (a pod's supervisor, which runs as its
    workload's user). OSError when there is none, or `dev/pts/ptmx` is not the multiplexer."""
    try:
        # bwrap made the sandbox's root as the sandbox's user: its owner is that user, seen from here.
        root = os.fstat(root_fd)
        master = _open_multiplexer(root_fd)
    finally:
        os.close(root_fd)
    try:
        info = os.fstat(master)
        if not stat.S_ISCHR(info.st_mode) or info.st_rdev != PTMX_DEVICE:
            raise OSError(f"the sandbox's /dev/pts/ptmx is not the pseudo-terminal multiplexer ({info.st_rdev:#x})")
        fcntl.ioctl(master, TIOCSPTLCK, struct.pack("i", 0))
        slave = fcntl.ioctl(master, TIOCGPTPEER, os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    except BaseException:
        os.close(master)
        raise
    if not owner_of_root:
        return master, slave
    try:
        # devpts gives a new slave the opener's uid and gid: a gateway run as root would leave it
        # owned by a uid the sandbox cannot map (it shows as nobody there), so the workload could
        # not chmod its own terminal. A no-op when the gateway is the sandbox's user.
        os.fchown(slave, root.st_uid, root.st_gid)
    except BaseException:
        os.close(slave)
        os.close(master)
        raise
    return master, slave


def _open_multiplexer(root_fd: int) -> int:
    """The devpts instance's own `ptmx`, or, when its mode refuses the caller, the root's
    `dev/ptmx` node. A devpts mounted without `ptmxmode` (a host's own, which a container without
    a runtime's devpts shows: kubesim without root) has a `ptmx` of mode 000 that only root may
    open; the classic `/dev/ptmx` node opens the instance mounted on the `pts` beside it, the
    sandbox's, as the kernel finds it from the opened path. Links are followed by neither."""
    flags = os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC
    resolve = RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS
    try:
        return openat2(root_fd, "dev/pts/ptmx", flags, resolve)
    except PermissionError:
        return openat2(root_fd, "dev/ptmx", flags, resolve)
