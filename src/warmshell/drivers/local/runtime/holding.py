"""Directories that live only as long as another one (their owner): a runtime directory on a tmpfs
as long as its `local.sandbox_dir`, a gateway's directory of logs in it as long as the gateway's
state directory (see `runtimedir`). When the owner is deleted with no gateway running, nothing
that would sweep the directory starts again: a full test suite left ~40 runtime directories on
/dev/shm and ~700 directories of logs in the shared one.

So such a directory records its owner's path (`RECORD`), every gateway that uses it holds a
shared `flock` on it while it runs (two gateways that share a sandbox directory share its runtime
directory), and a sweep removes, from one readdir of the parent, each whose owner is gone and
which nobody holds. A sweep touches only what the gateway itself could have made: a directory
(not a link) of its own uid that nobody else may write to (`runtimedir.owned`), named as its
record says. Blocking I/O: callers use a thread.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path

from warmshell.drivers.local.runtime import runtimedir

__all__ = ["RECORD", "Hold", "abandoned", "hold", "sweep_abandoned"]

_log = logging.getLogger(__name__)

# The owner's path (a dot: no instance, lease or gateway directory's name starts with one).
RECORD = ".owner"
# The name a directory has, from its owner's path (`runtimedir.runtime_named`, `gateway_named`).
Named = Callable[[Path], str]
_RECORD_BYTES = 4096  # PATH_MAX: a longer record is no path of ours
_HOLD_ATTEMPTS = 3  # each lost only to a sweep renaming the directory away in the same moment
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# A swept directory is first renamed `<name>.swept-<random>` (so that a gateway starting
# meanwhile makes a fresh one), then removed; one a crash left half removed goes at the next sweep.
_SWEPT = re.compile(r".+\.swept-[0-9a-f]{8}")


class Hold:
    """A gateway's shared lock on a directory: while it is held, no sweep removes it."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def close(self, *, remove_if_empty: bool = False) -> None:
        """Release the lock (idempotent); first, with `remove_if_empty`, remove the directory
        if nothing but its record is left in it."""
        if self._fd is None:
            return
        try:
            if remove_if_empty and os.listdir(self._fd) == [RECORD]:
                os.unlink(RECORD, dir_fd=self._fd)
                os.rmdir(self.path)
        except OSError as exc:
            _log.warning("%s: cannot remove it: %s", self.path, exc)
        finally:
            os.close(self._fd)
            self._fd = None


def hold(path: Path, owner: Path, *, mode: int = 0o711) -> Hold:
    """`runtimedir.ensure` the directory (`mode`), lock it shared and record `owner` in it
    (unless it is `owner`); PermissionError as `ensure`. A sweep that removes it in the same
    moment renames it away first: the lock is then on the old one, which is noticed here, and
    the new one made."""
    for _ in range(_HOLD_ATTEMPTS):
        runtimedir.ensure(path, mode)
        try:
            fd = os.open(path, _OPEN_DIR)
        except FileNotFoundError:  # renamed away right after it was checked
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # a sweep holds it exclusively only for its rename
            info = os.fstat(fd)
            if not runtimedir.owned(info):  # planted in the moment a sweep had renamed ours away
                runtimedir.ensure(path, mode)  # raises, naming it
            if _same(info, path):
                if path != owner:  # on no tmpfs the runtime directory is the sandbox directory
                    _record(fd, owner)
                held, fd = Hold(path, fd), -1
                return held
        finally:
            if fd >= 0:
                os.close(fd)
    raise OSError(f"local.runtime_dir: {str(path)!r} was removed each time it was made ({_HOLD_ATTEMPTS} times)")


def abandoned(name: str, recorded: Path | None, *, exists: bool, named: Named) -> bool:
    """Whether a directory `name` whose record names `recorded` (which `exists` or not) is
    abandoned (pure): its owner is gone, and it is named for that owner, so that a record copied
    under another name is no reason to remove anything."""
    return recorded is not None and not exists and named(recorded) == name


def sweep_abandoned(parent: Path, prefix: str, named: Named) -> list[Path]:
    """Remove every directory in `parent` whose name starts with `prefix` that is `abandoned`
    and held by nobody, and what an interrupted sweep left; those removed. Only this uid's
    directories, writable by nobody else, are read, let alone removed; links are not followed."""
    try:
        parent_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:  # no such tmpfs, or no runtime directory yet
        return []
    try:
        return [
            parent / name
            for name in os.listdir(parent_fd)
            if name.startswith(prefix) and _sweep(parent_fd, name, named)
        ]
    finally:
        os.close(parent_fd)


def _sweep(parent_fd: int, name: str, named: Named) -> bool:
    """Remove `name` if it is abandoned (see `sweep_abandoned`): locked exclusively, so that no
    gateway holds it, and renamed aside before it is emptied, so that none starts using it meanwhile."""
    try:  # a symlink (ELOOP) or a file (ENOTDIR) is refused here, whatever its name
        fd = os.open(name, _OPEN_DIR, dir_fd=parent_fd)
    except OSError:
        return False
    try:
        if not runtimedir.owned(os.fstat(fd)):
            return False
        if not _SWEPT.fullmatch(name):  # a grave needs no check: nobody holds it or uses it
            recorded = _read_record(fd)
            if not abandoned(name, recorded, exists=recorded is not None and os.path.lexists(recorded), named=named):
                return False
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # a live gateway's
                return False
            if not _same(os.fstat(fd), name, parent_fd):  # swept and made again meanwhile
                return False
            name, old = f"{name}.swept-{secrets.token_hex(4)}", name
            os.rename(old, name, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
    except OSError as exc:
        _log.warning("%s: cannot sweep it: %s", name, exc)
        return False
    finally:
        os.close(fd)
    shutil.rmtree(name, dir_fd=parent_fd, ignore_errors=True)
    return True


def _same(info: os.stat_result, path: Path | str, dir_fd: int | None = None) -> bool:
    """Whether `path` is still the directory `info` describes."""
    try:
        now = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return (now.st_dev, now.st_ino) == (info.st_dev, info.st_ino)


def _record(directory: int, owner: Path) -> None:
    """Write `RECORD` in the open `directory` unless it already names `owner`: written aside
    and renamed into place, so that a sweep never reads half of one."""
    if _read_record(directory) == owner:
        return
    partial = f"{RECORD}.{secrets.token_hex(4)}"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=directory)
    try:
        os.write(fd, os.fsencode(owner) + b"\n")
    finally:
        os.close(fd)
    os.replace(partial, RECORD, src_dir_fd=directory, dst_dir_fd=directory)


def _read_record(directory: int) -> Path | None:
    """The owner `RECORD` names in the open `directory`; None when there is none, or it is no
    absolute path."""
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
