"""File access inside a sandbox, driver-neutral: what the gateway's FileService calls, and how an
OSError becomes an error that names the path and the cause.

A driver that can reach its sandboxes' files offers `FilesCapable.files(sandbox_id)`; paths are
always as the sandbox's workload sees them, and an implementation confines every one of them to
the sandbox (see the local driver's `rootfs`).
"""

from __future__ import annotations

import errno
import posixpath
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol, runtime_checkable

from warmshell.core.archives import ArchiveLimits, ArchiveSummary, EntryRefused
from warmshell.core.errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    UnavailableError,
    WarmshellError,
)
from warmshell.core.files import FileEntry, FileKind
from warmshell.core.ids import SandboxId

__all__ = [
    "ArchiveLimits",
    "ArchiveSummary",
    "FileEntry",
    "FileKind",
    "FilesCapable",
    "SandboxFiles",
    "SocketFiles",
    "archive_error",
    "file_error",
    "normalize_path",
]

MAX_PATH_BYTES = 4096


class SandboxFiles(Protocol):
    """File operations on one sandbox; every path is absolute, as its workload sees it."""

    async def stat(self, path: str) -> FileEntry:
        """The entry at `path` (a final symlink is reported, not followed)."""
        ...

    async def list(self, path: str) -> list[FileEntry]:
        """The entries of a directory, sorted by name."""
        ...

    def read(self, path: str, chunk_bytes: int, max_bytes: int) -> AsyncIterator[bytes]:
        """A regular file's content in chunks of at most `chunk_bytes` (read as they are sent)."""
        ...

    async def write(
        self, path: str, chunks: AsyncIterator[bytes], *, mode: int, make_parents: bool, max_bytes: int
    ) -> int:
        """Create or replace a regular file from `chunks`; the bytes written."""
        ...

    async def remove(self, path: str, *, recursive: bool) -> None:
        """Remove a file, a symlink, an empty directory, or (recursive) a whole tree."""
        ...

    def read_archive(self, path: str, chunk_bytes: int, limits: ArchiveLimits) -> AsyncIterator[bytes]:
        """The tar of the directory or file at `path`, in chunks of at most `chunk_bytes`."""
        ...

    async def write_archive(self, path: str, chunks: AsyncIterator[bytes], limits: ArchiveLimits) -> ArchiveSummary:
        """Unpack the tar arriving in `chunks` below the directory `path` (made when missing)."""
        ...

    async def mkdir(self, path: str, *, parents: bool, mode: int) -> FileEntry:
        """Create a directory (with `parents`: missing parents too, and an existing one is fine)."""
        ...


@runtime_checkable
class SocketFiles(Protocol):
    """Files whose bytes the driver moves between a socket and the file in the kernel (the
    gateway's byte stream), under the same confinement and rules as `write` and `read`."""

    async def receive(
        self, path: str, sock: socket.socket, size: int, *, mode: int, make_parents: bool, idle_seconds: float
    ) -> int:
        """Create or replace a regular file from exactly `size` bytes of `sock` followed by its
        end (InvalidArgumentError otherwise, and nothing is left); TimeoutError when the socket
        brings nothing for `idle_seconds`."""
        ...

    async def receive_archive(
        self, path: str, sock: socket.socket, size: int, limits: ArchiveLimits, *, idle_seconds: float
    ) -> ArchiveSummary:
        """`write_archive` from exactly `size` bytes of `sock` (a tar) followed by its end."""
        ...

    async def send_archive(self, path: str, sock: socket.socket, limits: ArchiveLimits, *, idle_seconds: float) -> int:
        """`read_archive` into `sock` in frames (`core.transfers`), the end frame included; the
        tar's bytes sent."""
        ...

    async def send(
        self,
        path: str,
        sock: socket.socket,
        max_bytes: int,
        *,
        idle_seconds: float,
        before: Callable[[int], Awaitable[None]],
    ) -> int:
        """Open a regular file, await `before(size)`, then send its bytes; the bytes sent."""
        ...


@runtime_checkable
class FilesCapable(Protocol):
    """A driver that can reach the files of its sandboxes."""

    async def files(self, sandbox_id: SandboxId) -> SandboxFiles:
        """The sandbox's files; FailedPreconditionError when it has none to reach (not running)."""
        ...


def normalize_path(path: str, field: str = "path") -> str:
    """An absolute, lexically normalised path ("/a/b/../c" -> "/a/c"; ".." above "/" stays at
    "/", as the kernel resolves it). Safe to do lexically: resolution is confined anyway, so this
    only decides which name an operation acts on."""
    if not path:
        raise InvalidArgumentError(field, "must not be empty")
    if not path.startswith("/"):
        raise InvalidArgumentError(field, f"{path!r} must be absolute (as the sandbox sees it)")
    if "\0" in path:
        raise InvalidArgumentError(field, "must not contain a NUL byte")
    if len(path.encode()) > MAX_PATH_BYTES:
        raise InvalidArgumentError(field, f"at most {MAX_PATH_BYTES} bytes")
    normal = posixpath.normpath(path)
    return "/" + normal.lstrip("/") if normal != "/" else "/"


_CAUSES: dict[int, tuple[type[WarmshellError], str]] = {
    errno.ENOENT: (NotFoundError, "no such file or directory"),
    errno.EACCES: (PermissionDeniedError, "permission denied"),
    errno.EPERM: (PermissionDeniedError, "operation not permitted"),
    errno.EROFS: (PermissionDeniedError, "read-only file system"),
    errno.EXDEV: (PermissionDeniedError, "crosses out of the sandbox"),
    errno.EISDIR: (FailedPreconditionError, "is a directory"),
    errno.ENOTDIR: (FailedPreconditionError, "not a directory"),
    errno.ENOTEMPTY: (FailedPreconditionError, "directory not empty"),
    errno.EEXIST: (AlreadyExistsError, "already exists"),
    # What rootfs reports for a parent that is a link to nothing (mkdir -p would say EEXIST).
    errno.ENOLINK: (NotFoundError, "a symbolic link on the path points to nothing"),
    errno.ELOOP: (FailedPreconditionError, "is a symbolic link (or too many levels of them)"),
    errno.ENXIO: (FailedPreconditionError, "not a regular file"),
    errno.ENAMETOOLONG: (InvalidArgumentError, "name too long"),
    errno.EFBIG: (ResourceExhaustedError, "file too large"),
    errno.ENOSPC: (ResourceExhaustedError, "no space left on device"),
    errno.EDQUOT: (ResourceExhaustedError, "disk quota exceeded"),
    errno.ESRCH: (FailedPreconditionError, "the sandbox is not running"),
    errno.EAGAIN: (UnavailableError, "changed while being resolved; retry"),
}


def file_error(path: str, exc: OSError) -> WarmshellError:
    """The domain error for an OSError on `path`: the path and the cause, never a host path."""
    cls, cause = _CAUSES.get(exc.errno or 0, (FailedPreconditionError, exc.strerror or "failed"))
    if cls is InvalidArgumentError:
        return InvalidArgumentError("path", f"{path}: {cause}")
    return cls(f"{path}: {cause}")


def archive_error(path: str, exc: OSError | EntryRefused) -> WarmshellError:
    """The domain error for a failed archive transfer below `path`: a refused entry names the
    entry and the rule; a limit says which; an OSError on an entry names that entry."""
    if isinstance(exc, EntryRefused):
        return InvalidArgumentError("archive", str(exc))
    where = posixpath.join(path, exc.filename) if isinstance(exc.filename, str) else path
    if exc.errno == errno.EFBIG and exc.strerror:
        return ResourceExhaustedError(f"{where}: {exc.strerror}")
    return file_error(where, exc)
