"""Where a root gateway keeps what a sandbox needs only while it lives: its egress directory (the
proxy's socket, the link its system CA bundle leads through) and its uid lease (`uidlease`).

None of it outlives the host's sandboxes, so it belongs on a tmpfs, like /run: a gateway killed
with -9 leaves it for its next start's sweep to repair (a tmpfs survives a process), and after a
reboot there is no sandbox left and nothing to repair. On disk each of these was a file or a
directory created per member start; on an ext4 without a journal, where the inode allocator
skips every inode deleted in the last minute, one cost 0.1-0.37 ms of CPU at a fill of a few
hundred members (0.005 ms on tmpfs).

`local.runtime_dir` unset: the first of /run and /dev/shm that is a tmpfs, under a name derived
from `local.sandbox_dir`, so that the gateways that share a sandbox directory share one runtime
directory too (their uid leases must meet), and those that do not, do not; neither a tmpfs: the
sandbox directory itself, as before. /dev/shm is writable by every user of the host: the
directory is made root-owned 0711 and refused when found otherwise (another user's, writable by
another, or a symlink), so nobody can plant one for a gateway to use.

A runtime directory outlives its sandbox directory if that is deleted (a host's state removed, a
test suite's temporary directories), and a gateway's directory of logs in it outlives its state
directory: nothing would sweep them until a reboot. So each records what it belongs to, running
gateways hold it, and any root gateway's start removes those abandoned (`holding`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path

__all__ = [
    "GATEWAY_PREFIX",
    "RUNTIME_PREFIX",
    "TMPFS_CANDIDATES",
    "choose",
    "digest_of",
    "ensure",
    "gateway_named",
    "host_tmpfs",
    "named_for",
    "owned",
    "runtime_named",
    "tmpfs_mount_points",
]

# Where a tmpfs is looked for, in order: /run on a systemd host (sized for runtime state);
# /dev/shm on any Linux (in a container often the only tmpfs, though small: 64 MB in Docker).
TMPFS_CANDIDATES = (Path("/run"), Path("/dev/shm"))
RUNTIME_PREFIX = "warmshell-sandboxes-"  # then the digest of the sandbox directory
GATEWAY_PREFIX = "gw-"  # then the digest of the gateway's state directory (resolved)


def tmpfs_mount_points(mounts: str) -> set[Path]:
    """The mount points of tmpfs file systems in a /proc/self/mounts text (pure)."""
    found = set()
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "tmpfs":
            found.add(Path(fields[1].replace("\\040", " ")))
    return found


def digest_of(path: Path) -> str:
    """A short digest of a path, for names derived from it (pure)."""
    return hashlib.sha256(str(path).encode()).hexdigest()[:16]


def runtime_named(sandbox_dir: Path) -> str:
    """The name of the runtime directory of the gateways that use `sandbox_dir` (pure)."""
    return RUNTIME_PREFIX + digest_of(sandbox_dir)


def gateway_named(state_dir: Path) -> str:
    """A gateway's name on this host (its directory of logs in the runtime directory, its
    cgroups), from its resolved state directory, of which only one gateway runs at a time (pure)."""
    return GATEWAY_PREFIX + digest_of(state_dir)


def named_for(sandbox_dir: Path, base: Path) -> Path:
    """The runtime directory under `base` of the gateways that use `sandbox_dir` (pure)."""
    return base / runtime_named(sandbox_dir)


def choose(configured: Path | None, sandbox_dir: Path, tmpfs: Iterable[Path]) -> Path:
    """The runtime directory: `configured` when set; else one named for `sandbox_dir` on the
    first of `TMPFS_CANDIDATES` among the `tmpfs` mount points; else `sandbox_dir` (pure)."""
    if configured is not None:
        return configured
    mounted = set(tmpfs)
    base = next((candidate for candidate in TMPFS_CANDIDATES if candidate in mounted), None)
    return named_for(sandbox_dir, base) if base is not None else sandbox_dir


def host_tmpfs() -> set[Path]:
    """This host's tmpfs mount points, as this process sees them (blocking)."""
    try:
        return tmpfs_mount_points(Path("/proc/self/mounts").read_text())
    except OSError:
        return set()


def ensure(path: Path, mode: int = 0o711) -> None:
    """Make `path` this process's own directory, mode `mode`, if missing (blocking); PermissionError
    naming `local.runtime_dir` when it is a symlink, not a directory, another uid's, or writable
    by anyone else: in a directory every user may write to, such a one may have been planted."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):  # checked below, whatever it is (a dangling symlink too)
        os.mkdir(path, mode)
    info = os.lstat(path)
    if not owned(info):
        raise PermissionError(
            f"local.runtime_dir: {str(path)!r} must be a directory (not a symlink) owned by uid {os.geteuid()}"
            " and writable by nobody else; remove it or set local.runtime_dir"
        )
    if stat.S_IMODE(info.st_mode) != mode:
        os.chmod(path, mode)


def owned(info: os.stat_result) -> bool:
    """Whether `info` is of a directory (not a symlink) of this process's uid that nobody else
    may write to: the only kind this module's callers use, or remove."""
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o022
