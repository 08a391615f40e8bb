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

A runtime directory named for a `sandbox_dir` that is later deleted (a host's state directory
removed, a test suite's temporary ones) would outlive it until the next reboot: none of the
gateways that could sweep it will start again. So each one records the sandbox directory it is
for (`.sandbox-dir`), and every gateway holds a shared `flock` on it while it runs; any root
gateway's start (`sweep_abandoned`: one readdir of each tmpfs candidate) removes those whose
sandbox directory is gone and which no gateway holds, and nothing that fails the rules above.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import secrets
import shutil
import stat
from collections.abc import Iterable
from pathlib import Path

__all__ = [
    "RECORD",
    "TMPFS_CANDIDATES",
    "Hold",
    "abandoned_name",
    "choose",
    "ensure",
    "hold",
    "host_tmpfs",
    "named_for",
    "sweep_abandoned",
    "tmpfs_mount_points",
]

_log = logging.getLogger(__name__)

# Where a tmpfs is looked for, in order: /run on a systemd host (sized for runtime state);
# /dev/shm on any Linux (in a container often the only tmpfs, though small: 64 MB in Docker).
TMPFS_CANDIDATES = (Path("/run"), Path("/dev/shm"))
# In a runtime directory: the `sandbox_dir` it is named for (a dot: no instance, lease or
# gateway directory starts with one).
RECORD = ".sandbox-dir"
_PREFIX = "warmshell-sandboxes-"
# A swept directory is first renamed to `<name>.swept-<random>` (so a gateway starting meanwhile
# makes a fresh one), then removed; one a crash left half removed goes at the next sweep.
_SWEPT = re.compile(re.escape(_PREFIX) + r"[0-9a-f]{16}\.swept-[0-9a-f]{8}")
_RECORD_BYTES = 4096  # PATH_MAX: a longer record is no path of ours
_HOLD_ATTEMPTS = 3  # each lost only to a sweep renaming the directory away in the same moment


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
    return base / _name_for(sandbox_dir)


def _name_for(sandbox_dir: Path) -> str:
    return _PREFIX + hashlib.sha256(str(sandbox_dir).encode()).hexdigest()[:16]


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
    if not _owned(info):
        raise PermissionError(_refused(path))
    if stat.S_IMODE(info.st_mode) != 0o711:
        os.chmod(path, 0o711)


def _owned(info: os.stat_result) -> bool:
    """A directory (not a symlink) of this process's uid that nobody else may write to."""
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o022


def _refused(path: Path) -> str:
    return (
        f"local.runtime_dir: {str(path)!r} must be a directory (not a symlink) owned by uid {os.geteuid()}"
        " and writable by nobody else; remove it or set local.runtime_dir"
    )


class Hold:
    """A gateway's shared lock on its runtime directory: while it is held, no sweep removes the
    directory. Released by `close` (or the process's end)."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    def close(self) -> None:
        """Release the lock (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def hold(path: Path, sandbox_dir: Path) -> Hold:
    """`ensure` the runtime directory, lock it shared and record `sandbox_dir` in it (blocking;
    PermissionError as `ensure`). A sweep that removes the directory in the same moment renames
    it away first: the lock then holds the old one, which is noticed here and the new one made."""
    for _ in range(_HOLD_ATTEMPTS):
        ensure(path)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:  # renamed away right after it was checked
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # a sweep holds it exclusively only for its rename
            info = os.fstat(fd)
            if not _owned(info):
                raise PermissionError(_refused(path))
            if _same(info, path):
                if path != sandbox_dir:  # on no tmpfs it is the sandbox directory itself
                    _record(fd, sandbox_dir)
                held, fd = Hold(fd), -1
                return held
        finally:
            if fd >= 0:
                os.close(fd)
    raise OSError(f"local.runtime_dir: {str(path)!r} was removed each time it was made ({_HOLD_ATTEMPTS} times)")


def _same(info: os.stat_result, path: Path) -> bool:
    try:
        now = os.lstat(path)
    except FileNotFoundError:
        return False
    return (now.st_dev, now.st_ino) == (info.st_dev, info.st_ino)


def _record(directory: int, sandbox_dir: Path) -> None:
    """Write `RECORD` in the directory `directory` unless it already says `sandbox_dir`: written
    aside and renamed into place, so a sweep never reads half of it."""
    if _read_record(directory) == sandbox_dir:
        return
    partial = f"{RECORD}.{secrets.token_hex(4)}"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=directory)
    try:
        os.write(fd, os.fsencode(sandbox_dir) + b"\n")
    finally:
        os.close(fd)
    os.replace(partial, RECORD, src_dir_fd=directory, dst_dir_fd=directory)


def _read_record(directory: int) -> Path | None:
    """The sandbox directory `RECORD` names; None when there is none or it is no absolute path."""
    try:
        fd = os.open(RECORD, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory)
    except OSError:
        return None
    try:
        text = os.read(fd, _RECORD_BYTES + 1)
    finally:
        os.close(fd)
    if len(text) > _RECORD_BYTES or not text.endswith(b"\n") or not text.startswith(b"/"):
        return None
    return Path(os.fsdecode(text[:-1]))


def abandoned_name(name: str, recorded: Path | None, *, exists: bool) -> bool:
    """Whether a directory `name` recording `recorded` (whose existence is `exists`) is a
    runtime directory whose sandbox directory is gone (pure): named as `named_for` names the
    directory it records, so a record copied under another name is no reason to remove it."""
    return recorded is not None and not exists and _name_for(recorded) == name


def sweep_abandoned(bases: Iterable[Path]) -> list[Path]:
    """Remove every runtime directory in `bases` whose sandbox directory is gone and which no
    gateway holds, and what an interrupted sweep left; return those removed (blocking). Only this
    uid's directories, writable by nobody else, are read, let alone removed; links are not followed."""
    removed: list[Path] = []
    for base in bases:
        try:
            base_fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            for name in os.listdir(base_fd):
                if name.startswith(_PREFIX) and _sweep_one(base, base_fd, name):
                    removed.append(base / name)
        finally:
            os.close(base_fd)
    return removed


def _sweep_one(base: Path, base_fd: int, name: str) -> bool:
    """Remove `base/name` if it is abandoned (see `sweep_abandoned`): locked exclusively, so no
    gateway holds it, and renamed aside before it is emptied, so none starts using it meanwhile."""
    try:  # a symlink (ELOOP) or a file (ENOTDIR) is refused here, whatever its name
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=base_fd)
    except OSError:
        return False
    try:
        if not _owned(os.fstat(fd)):
            return False
        if not _SWEPT.fullmatch(name):
            recorded = _read_record(fd)
            exists = recorded is not None and os.path.lexists(recorded)
            if not abandoned_name(name, recorded, exists=exists):
                return False
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # a live gateway's
                return False
            if not _same(os.fstat(fd), base / name):  # swept and made again meanwhile
                return False
            name, old = f"{name}.swept-{secrets.token_hex(4)}", name
            os.rename(old, name, src_dir_fd=base_fd, dst_dir_fd=base_fd)
    except OSError as exc:
        _log.warning("runtime directory %s: cannot sweep it: %s", base / name, exc)
        return False
    finally:
        os.close(fd)
    shutil.rmtree(name, dir_fd=base_fd, ignore_errors=True)
    return True
