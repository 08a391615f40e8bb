"""Where a root gateway keeps what a sandbox needs only while it lives: its egress directory (the
proxy's socket, its copy of the system CA bundle) and its uid lease (`uidlease`).

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
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path

__all__ = ["TMPFS_CANDIDATES", "choose", "ensure", "host_tmpfs", "named_for", "tmpfs_mount_points"]

# Where a tmpfs is looked for, in order: /run on a systemd host (sized for runtime state);
# /dev/shm on any Linux (in a container often the only tmpfs, though small: 64 MB in Docker).
TMPFS_CANDIDATES = (Path("/run"), Path("/dev/shm"))


def tmpfs_mount_points(mounts: str) -> set[Path]:
    """The mount points of tmpfs file systems in a /proc/self/mounts text (pure)."""
    found = set()
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "tmpfs":
            found.add(Path(fields[1].replace("\\040", " ")))
    return found


def named_for(sandbox_dir: Path, base: Path) -> Path:
    """The runtime directory under `base` of the gateways that use `sandbox_dir` (pure)."""
    digest = hashlib.sha256(str(sandbox_dir).encode()).hexdigest()[:16]
    return base / f"warmshell-sandboxes-{digest}"


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


def ensure(path: Path) -> None:
    """Make `path` this process's own directory, mode 0711, if missing (blocking); PermissionError
    naming `local.runtime_dir` when it is a symlink, not a directory, another uid's, or writable
    by anyone else: in a directory every user may write to, such a one may have been planted."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):  # checked below, whatever it is (a dangling symlink too)
        os.mkdir(path, 0o711)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise PermissionError(
            f"local.runtime_dir: {str(path)!r} must be a directory (not a symlink) owned by uid {os.geteuid()}"
            " and writable by nobody else; remove it or set local.runtime_dir"
        )
    if stat.S_IMODE(info.st_mode) != 0o711:
        os.chmod(path, 0o711)
