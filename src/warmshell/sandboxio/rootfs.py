"""File operations confined to one sandbox's root, with its workload's rights (blocking: call
from a files executor's threads).

The local supervisor runs in the gateway, outside the sandbox, so its file operations start from
a directory fd on `/proc/<agent pid>/root` (the sandbox's mount namespace root); a pod's
supervisor, in a container of its own, from an fd on the workload container's `/` that its agent
sent (`AgentLink.open_root`), as the workload's user. Either
way every path is resolved with `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`: `..` and
absolute symlinks stay inside, `/proc/<pid>/root`-style magic links are refused, and a path is
resolved once, into an fd, so a symlink swapped in later changes nothing. Final components are then acted on relative
to their parent's fd without following them. A file is opened only once it is known (through an
`O_PATH` fd of the same inode) to be a regular file: a FIFO or device node is never opened, so
it can neither hang nor trigger a driver. Objects on /proc and /sys are refused outright (the
gateway could read what the workload may not, pid 1's memory for one).

Rights: a gateway run as root switches the calling thread's fsuid/fsgid to the sandbox's uid for
each operation (and its threads carry no supplementary groups), so access checks are the
workload's and whatever it creates is owned by the sandbox's uid. A gateway run by a normal user
runs its sandboxes as that user already.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from warmshell.core.files import FileEntry, FileKind

__all__ = ["PendingWrite", "Root", "check_fs", "drop_supplementary_groups", "openat2", "refuse_mount_point"]

SYS_OPENAT2 = 437  # x86_64 and aarch64 alike
SYS_SETGROUPS = 116  # x86_64
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10
_RESOLVE = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS
# Pseudo filesystems never served: they describe processes, and the gateway may read more of
# them than the workload could.
_REFUSED_FS = {0x9FA0: "/proc", 0x62656572: "/sys", 0x74726163: "tracefs", 0xCAFE4A11: "bpffs"}
_RETRIES = 8

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class _StatFs(ctypes.Structure):
    # Only f_type is read; the rest of struct statfs is room for the kernel to write.
    _fields_ = [("f_type", ctypes.c_long), ("_rest", ctypes.c_byte * 120)]


_libc.fstatfs.argtypes = [ctypes.c_int, ctypes.POINTER(_StatFs)]


def openat2(dirfd: int, path: str, flags: int, resolve: int, mode: int = 0) -> int:
    """The raw openat2(2) (Python has no wrapper); retried on EAGAIN (a rename raced the
    resolution), OSError otherwise."""
    how = _OpenHow(flags | os.O_CLOEXEC, mode, resolve)
    encoded = path.encode()
    for _ in range(_RETRIES):
        fd = _libc.syscall(SYS_OPENAT2, dirfd, encoded, ctypes.byref(how), ctypes.sizeof(how))
        if fd >= 0:
            return int(fd)
        code = ctypes.get_errno()
        if code not in (errno.EAGAIN, errno.EINTR):
            raise OSError(code, os.strerror(code), path)
    raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN), path)


def drop_supplementary_groups() -> None:
    """Empty this thread's supplementary groups (the raw syscall is per thread; glibc's wrapper
    would change every thread of the gateway). A files executor's thread initializer."""
    if _libc.syscall(SYS_SETGROUPS, 0, None) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"setgroups: {os.strerror(code)}")


def check_fs(fd: int) -> None:
    """Refuse (EPERM) an fd on a pseudo file system the gateway never serves."""
    buf = _StatFs()
    if _libc.fstatfs(fd, ctypes.byref(buf)) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    if (buf.f_type & 0xFFFFFFFF) in _REFUSED_FS:
        raise OSError(errno.EPERM, "pseudo file system")


def _split(path: str) -> tuple[str, str]:
    """A normalised absolute path -> (parent, last component); ("/", "") for the root."""
    parent, _, name = path.rpartition("/")
    return parent or "/", name


def _kind(mode: int) -> FileKind:
    if stat.S_ISREG(mode):
        return FileKind.FILE
    if stat.S_ISDIR(mode):
        return FileKind.DIRECTORY
    if stat.S_ISLNK(mode):
        return FileKind.SYMLINK
    return FileKind.OTHER


def _entry(name: str, st: os.stat_result, link_target: str = "") -> FileEntry:
    return FileEntry(
        name=name,
        kind=_kind(st.st_mode),
        size=st.st_size,
        mode=stat.S_IMODE(st.st_mode),
        mtime_ms=st.st_mtime_ns // 1_000_000,
        link_target=link_target,
    )


@dataclass
class PendingWrite:
    """A write in progress: the parent directory's fd, the target name, the temporary file."""

    parent: int
    name: str
    temp: str
    fd: int

    def close(self) -> None:
        """Close both fds (idempotent)."""
        for fd in (self.fd, self.parent):
            if fd >= 0:
                os.close(fd)
        self.fd = self.parent = -1


@dataclass(frozen=True)
class Root:
    """One sandbox's root: an O_PATH fd on it (owned by the caller) and whose rights to use."""

    fd: int
    uid: int | None = None  # switch fsuid/fsgid to this uid (a gateway run as root)

    @contextlib.contextmanager
    def rights(self) -> Iterator[None]:
        """The workload's file-system rights on this thread, for the duration."""
        if self.uid is None:
            yield
            return
        old_gid = _libc.setfsgid(self.uid)
        old_uid = _libc.setfsuid(self.uid)
        try:
            yield
        finally:
            _libc.setfsuid(old_uid)
            _libc.setfsgid(old_gid)

    # -- resolution --------------------------------------------------------------------------

    def _open(self, path: str, flags: int, mode: int = 0) -> int:
        fd = openat2(self.fd, path, flags, _RESOLVE, mode)
        try:
            check_fs(fd)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def open_path(self, path: str) -> int:
        """An O_PATH fd on what `path` names (symlinks followed, inside the root)."""
        return self._open(path, os.O_PATH)

    def open_directory(self, path: str) -> int:
        """An O_PATH fd on the directory `path` (symlinks followed, inside the root)."""
        return self._open(path, os.O_PATH | os.O_DIRECTORY)

    def _parent(self, path: str) -> tuple[int, str]:
        """An O_PATH fd of the path's parent directory (resolved in the root) and the name."""
        parent, name = _split(path)
        return self._open(parent, os.O_PATH | os.O_DIRECTORY), name

    @staticmethod
    def _reopen(fd: int, flags: int) -> int:
        """Open the very inode an O_PATH fd holds (no second resolution, so no race)."""
        return os.open(f"/proc/self/fd/{fd}", flags | os.O_CLOEXEC | os.O_NOCTTY)

    # -- operations (each runs under `rights`) -----------------------------------------------

    def stat(self, path: str) -> FileEntry:
        """lstat semantics: a final symlink is reported with its target."""
        parent, name = self._parent(path)
        try:
            if not name:
                return _entry("", os.fstat(parent))
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            target = os.readlink(name, dir_fd=parent) if stat.S_ISLNK(st.st_mode) else ""
            return _entry(name, st, target)
        finally:
            os.close(parent)

    def list(self, path: str, limit: int) -> list[FileEntry]:
        """A directory's entries (symlinks to directories inside the sandbox are followed)."""
        fd = self._open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            entries: list[FileEntry] = []
            with os.scandir(fd) as scan:
                for item in scan:
                    if len(entries) >= limit:
                        raise OSError(errno.EFBIG, f"more than {limit} entries")
                    st = item.stat(follow_symlinks=False)
                    target = os.readlink(item.name, dir_fd=fd) if stat.S_ISLNK(st.st_mode) else ""
                    entries.append(_entry(item.name, st, target))
            return sorted(entries, key=lambda e: e.name)
        finally:
            os.close(fd)

    def open_read(self, path: str) -> tuple[int, int]:
        """An fd open for reading a regular file, and its size; symlinks followed inside."""
        holder = self._open(path, os.O_PATH)
        try:
            st = os.fstat(holder)
            if stat.S_ISDIR(st.st_mode):
                raise OSError(errno.EISDIR, "is a directory")
            if not stat.S_ISREG(st.st_mode):
                raise OSError(errno.ENXIO, "not a regular file")
            return self._reopen(holder, os.O_RDONLY), st.st_size
        finally:
            os.close(holder)

    def begin_write(self, path: str, mode: int, make_parents: bool) -> PendingWrite:
        """A new, hidden file beside `path` to write into; `commit` renames it over `path`
        (atomically: readers see the old content or the new, and a failed write leaves nothing).
        The rename replaces whatever name is there (a symlink swapped in included) without
        following it; a directory there is refused."""
        parent_path, name = _split(path)
        if not name:
            raise OSError(errno.EISDIR, "is a directory")
        if make_parents:
            self.mkdir(parent_path, parents=True, mode=0o755)
        parent = self._open(parent_path, os.O_PATH | os.O_DIRECTORY)
        try:
            with contextlib.suppress(FileNotFoundError):
                st = os.stat(name, dir_fd=parent, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    raise OSError(errno.EISDIR, "is a directory")
                refuse_mount_point(parent, st)
            for _ in range(_RETRIES):
                temp = f".{name[:200]}.warmshell-{secrets.token_hex(6)}"
                with contextlib.suppress(FileExistsError):
                    fd = os.open(
                        temp,
                        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY,
                        mode,
                        dir_fd=parent,
                    )
                    os.fchmod(fd, mode)  # the gateway's umask is not the workload's
                    return PendingWrite(parent, name, temp, fd)
            raise OSError(errno.EEXIST, "no free temporary name")
        except BaseException:
            os.close(parent)
            raise

    def commit(self, pending: PendingWrite) -> None:
        """Rename the written file over its name; closes the pending write."""
        try:
            os.fsync(pending.fd)
            os.rename(pending.temp, pending.name, src_dir_fd=pending.parent, dst_dir_fd=pending.parent)
        except BaseException:
            self.abort(pending)
            raise
        pending.close()

    def abort(self, pending: PendingWrite) -> None:
        """Remove the temporary file; closes the pending write."""
        with contextlib.suppress(OSError):
            os.unlink(pending.temp, dir_fd=pending.parent)
        pending.close()

    def remove(self, path: str, recursive: bool) -> None:
        """unlink, rmdir, or (recursive) an fd-based tree removal that never follows a link; a
        mount point (or a tree holding one) is refused."""
        parent, name = self._parent(path)
        try:
            if not name:
                raise OSError(errno.EPERM, "the root cannot be removed")
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            refuse_mount_point(parent, st)
            if not stat.S_ISDIR(st.st_mode):
                os.unlink(name, dir_fd=parent)
            elif recursive:
                _remove_tree(parent, name)
            else:
                os.rmdir(name, dir_fd=parent)
        finally:
            os.close(parent)

    def mkdir(self, path: str, parents: bool, mode: int) -> FileEntry:
        """mkdir, or (parents) mkdir -p one component at a time, each resolved in the root
        (iteratively: a path may have some two thousand components)."""
        if not parents:
            self._mkdir_one(path, mode)
            return self.stat(path)
        missing: list[str] = []  # from `path` up to the first directory that exists
        current = path
        while not self._is_dir(current):
            missing.append(current)
            current = _split(current)[0]
        for directory in reversed(missing):
            try:
                self._mkdir_one(directory, mode if directory == path else 0o755)
            except FileExistsError:
                if not self._is_dir(directory):
                    if self.stat(directory).kind == FileKind.SYMLINK:
                        # A link whose target is missing: "already exists" would send the user
                        # looking for a file that is not there.
                        raise OSError(errno.ENOLINK, f"{directory} is a symbolic link to nothing") from None
                    raise
        return self.stat(path)

    def _is_dir(self, path: str) -> bool:
        try:
            os.close(self._open(path, os.O_PATH | os.O_DIRECTORY))
        except (FileNotFoundError, NotADirectoryError):
            return False
        return True

    def _mkdir_one(self, path: str, mode: int) -> None:
        parent, name = self._parent(path)
        try:
            if not name:
                raise OSError(errno.EEXIST, "exists")
            os.mkdir(name, mode, dir_fd=parent)
            # The gateway's umask is not the workload's: set the bits asked for.
            made = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=parent)
            try:
                os.chmod(f"/proc/self/fd/{made}", mode)
            finally:
                os.close(made)
        finally:
            os.close(parent)


def refuse_mount_point(parent: int, st: os.stat_result) -> None:
    """Refuse to replace or remove what `st` (an entry of `parent`) describes when it is a mount
    point. The gateway works from outside the sandbox's mount namespace, where the kernel lets a
    rename or unlink of a mount point through and silently detaches the mount (the workload
    itself gets EBUSY). The workload cannot mount, so no mount point appears after this check."""
    if st.st_dev != os.fstat(parent).st_dev:
        raise OSError(errno.EBUSY, "is a mount point")


def _open_dir(parent: int, name: str, device: int) -> int:
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    if os.fstat(fd).st_dev != device:
        os.close(fd)
        raise OSError(errno.EBUSY, "holds a mount point")
    return fd


# A removal holds a descriptor per level, in the gateway: a workload's tree deeper than this
# (deeper than any path can name long before) is refused rather than allowed to use them up.
MAX_TREE_DEPTH = 128


def _remove_tree(parent: int, name: str) -> None:
    """rm -r of the directory `name` in `parent`: fd-based, never following a link, never into
    another mount, iterative, and at most `MAX_TREE_DEPTH` levels deep."""
    device = os.fstat(parent).st_dev
    stack = [(parent, name, _open_dir(parent, name, device))]  # (its parent's fd, name, its fd)
    try:
        while stack:
            up, current, fd = stack[-1]
            below = None
            with os.scandir(fd) as entries:
                for entry in entries:
                    st = entry.stat(follow_symlinks=False)
                    if st.st_dev != device:
                        raise OSError(errno.EBUSY, "holds a mount point")
                    if stat.S_ISDIR(st.st_mode):
                        below = entry.name
                        break
                    os.unlink(entry.name, dir_fd=fd)
            if below is not None:
                if len(stack) >= MAX_TREE_DEPTH:
                    raise OSError(errno.EMLINK, f"deeper than {MAX_TREE_DEPTH} levels: remove it from inside")
                stack.append((fd, below, _open_dir(fd, below, device)))
                continue
            stack.pop()
            os.close(fd)
            os.rmdir(current, dir_fd=up)
    finally:
        for _, _, fd in stack:
            os.close(fd)
