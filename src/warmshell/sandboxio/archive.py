"""Tar archives into and out of one sandbox's root, with its workload's rights (blocking: call
from a files executor's threads, or the supervisor's).

Unpacking takes a client's tar as untrusted: every entry name passes `core.archives` (relative,
no `..`), only directories, regular files and symbolic links that stay below the destination are
written, and each entry's parent is resolved beneath the destination with
`openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV)`, so no link (in the archive,
or swapped in by the workload while it unpacks) and no mount point is ever passed through. A file
lands like a single write (a hidden temporary file, renamed over its name), with its mode and
mtime. Packing walks a tree by descriptors without following links (they travel as links), opens
only what is known to be a regular file, and skips FIFOs, sockets and device nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import secrets
import stat
import tarfile
import threading
from collections import deque
from collections.abc import Callable, Generator, Iterator
from typing import IO, Any, Protocol, cast, runtime_checkable

from warmshell.core.archives import (
    ArchiveLimits,
    ArchiveSummary,
    EntryRefused,
    entry_path,
    link_stays_inside,
    regroup,
)
from warmshell.sandboxio.rootfs import RESOLVE_NO_MAGICLINKS, Root, check_fs, openat2, refuse_mount_point

__all__ = ["ChunkPipe", "ForwardFile", "KernelCopySource", "close_pack", "forward_target", "pack", "unpack"]

RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
_BELOW = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV
# tarfile reads a pax or GNU long-name header whole: one this large is refused before it is read.
MAX_HEADER_BYTES = 64 * 1024
# tarfile's stream reads this much of the client's bytes at a time (its default, 10 KiB, costs
# a call and a copy per 10 KiB of every file).
_STREAM_BUFFER = 1024 * 1024
_BLOCK = tarfile.BLOCKSIZE
_EXTENDED = {
    tarfile.XHDTYPE,
    tarfile.XGLTYPE,
    tarfile.SOLARIS_XHDTYPE,
    tarfile.GNUTYPE_LONGNAME,
    tarfile.GNUTYPE_LONGLINK,
}


class _BoundedInfo(tarfile.TarInfo):
    """A member whose extended header is bounded before tarfile reads it into memory."""

    def _proc_member(self, tarfile: tarfile.TarFile) -> Any:
        if self.type in _EXTENDED and self.size > MAX_HEADER_BYTES:
            raise EntryRefused(f"an extended header of {self.size} bytes (at most {MAX_HEADER_BYTES})")
        return super()._proc_member(tarfile)  # type: ignore[misc]


class ChunkPipe:
    """Bytes handed from an event loop to a thread that reads them as a file (tarfile's source),
    holding at most `max_bytes` between the two."""

    def __init__(self, max_bytes: int = 4 * 1024 * 1024) -> None:
        self._max_bytes = max_bytes
        self._cond = threading.Condition()
        self._chunks: deque[memoryview] = deque()
        self._held = 0
        self._ended = False  # the writer is done (finish) or gave up (abort)
        self._aborted = False
        self._reader_gone = False
        self._position = 0
        # The one writer waiting in `send` for room: its loop and the future that wakes it.
        self._waiting: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None

    def offer(self, chunk: bytes) -> bool | None:
        """Queue `chunk` if there is room (True), False if not, None once the reader is gone."""
        with self._cond:
            if self._reader_gone:
                return None
            if self._held and self._held + len(chunk) > self._max_bytes:
                return False
            self._chunks.append(memoryview(chunk))
            self._held += len(chunk)
            self._cond.notify_all()
            return True

    async def send(self, chunk: bytes) -> bool:
        """Queue `chunk`, waiting for room without holding a thread (the reader wakes this loop
        when it frees some); False once the reader is gone.

        Not a thread blocked in `put`-like waits: with many uploads at once, the unpackers that
        wait for an executor thread hold none, and a writer blocked on such a pipe would hold one
        of the loop's few default-executor threads (6 on 2 cores) until its unpacker runs, so
        fifty uploads at once deadlocked the gateway's files on four busy unpackers."""
        while True:
            loop = asyncio.get_running_loop()
            room: asyncio.Future[None] = loop.create_future()
            with self._cond:
                offered = self.offer(chunk)
                if offered is not False:
                    return bool(offered)
                self._waiting = (loop, room)
            await room

    def _wake_writer(self) -> None:
        """Room was freed (or the reader left): wake a writer waiting in `send` (under the lock)."""
        if self._waiting is not None:
            loop, room = self._waiting
            self._waiting = None
            loop.call_soon_threadsafe(_resolve, room)

    def _fits(self, size: int) -> bool:
        return self._held + size <= self._max_bytes

    def finish(self) -> None:
        """No more bytes: the reader sees the end of the file."""
        with self._cond:
            self._ended = True
            self._cond.notify_all()

    def abort(self) -> None:
        """The writer gave up: the reader's next read fails."""
        with self._cond:
            self._ended = self._aborted = True
            self._cond.notify_all()

    def close(self) -> None:
        """The reader is done: writers stop waiting and what is queued is dropped."""
        with self._cond:
            self._reader_gone = True
            self._chunks.clear()
            self._held = 0
            self._cond.notify_all()
            self._wake_writer()

    def read(self, size: int = -1) -> bytes:
        """`size` bytes (all until the end when negative), fewer only at the end, waiting for
        them: what tarfile expects of a file (it takes a short read for a damaged archive)."""
        pieces: list[memoryview] = []
        wanted = size
        while wanted != 0 and (piece := self._take(wanted)):
            pieces.append(piece)
            wanted = wanted - len(piece) if wanted > 0 else wanted
        data = bytes(pieces[0]) if len(pieces) == 1 else b"".join(pieces)
        self._position += len(data)
        return data

    def tell(self) -> int:
        """Bytes read so far."""
        return self._position

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        """Forward only (tarfile skips a member's padding so): the bytes between are dropped."""
        target = forward_target(self._position, offset, whence)
        while self._position < target and (piece := self._take(target - self._position)):
            self._position += len(piece)
        return self._position

    def _take(self, size: int) -> memoryview:
        """Up to `size` bytes of the first chunk (all of it when negative), waiting for one;
        empty at the end."""
        with self._cond:
            self._cond.wait_for(lambda: self._chunks or self._ended)
            if self._aborted:
                raise OSError(errno.ECANCELED, "the upload was abandoned")
            if not self._chunks:
                return memoryview(b"")
            head = self._chunks[0]
            if 0 <= size < len(head):
                self._chunks[0] = head[size:]
                head = head[:size]
            else:
                self._chunks.popleft()
            self._held -= len(head)
            self._cond.notify_all()
            self._wake_writer()
            return head


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():  # a writer cancelled meanwhile
        future.set_result(None)


@runtime_checkable
class KernelCopySource(Protocol):
    """A forward-only source that can copy its next bytes into a file descriptor itself."""

    def copy_into(self, fd: int, count: int) -> None:
        """The next `count` bytes into `fd`."""
        ...


def forward_target(position: int, offset: int, whence: int) -> int:
    """Where a forward-only stream's seek goes; ESPIPE for one backwards (or from its end)."""
    target = offset if whence == os.SEEK_SET else position + offset
    if whence not in (os.SEEK_SET, os.SEEK_CUR) or target < position:
        raise OSError(errno.ESPIPE, "a stream seeks forward only")
    return target


class ForwardFile(Protocol):
    """What tarfile reads a stream through: read, tell and a forward seek (a ChunkPipe, or the
    byte stream's socket reader)."""

    def read(self, size: int = -1) -> bytes:
        """`size` bytes, fewer only at the end."""
        ...

    def tell(self) -> int:
        """Bytes read so far."""
        ...

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        """Forward only."""
        ...


def unpack(root: Root, destination: str, source: IO[bytes] | ForwardFile, limits: ArchiveLimits) -> ArchiveSummary:
    """Unpack the tar read from `source` below `destination` (created like mkdir -p)."""
    root.mkdir(destination, parents=True, mode=0o755)
    unpacker = _Unpacker(root.open_directory(destination), limits)
    try:
        return unpacker.run(source)
    finally:
        unpacker.close()


class _Unpacker:
    """One archive into one destination directory fd."""

    def __init__(self, destination: int, limits: ArchiveLimits) -> None:
        self._dest = destination
        self._limits = limits
        self._entries = 0
        self._bytes = 0
        self._parent: tuple[str, int] | None = None  # the last parent opened (tars group by directory)
        self._directories: list[tuple[str, int, int]] = []  # (path, mode, mtime): set once filled

    def close(self) -> None:
        if self._parent is not None:
            os.close(self._parent[1])
        os.close(self._dest)

    def run(self, source: IO[bytes] | ForwardFile) -> ArchiveSummary:
        # "r:" on a forward-only file: tarfile reads a member's content straight from the pipe
        # ("r|" copies every byte through its own stream buffer twice more: half an upload's CPU).
        options: dict[str, Any] = {"mode": "r:", "tarinfo": _BoundedInfo}
        try:
            # A ForwardFile has all tarfile reads of a file (read, tell, a forward seek).
            with tarfile.open(fileobj=cast(IO[bytes], source), **options) as stream:
                for member in stream:
                    self._entries += 1
                    if self._entries > self._limits.max_entries:
                        raise OSError(errno.EFBIG, f"more than {self._limits.max_entries} entries")
                    path = entry_path(member.name)
                    try:
                        self._member(stream, member, path)
                    except OSError as exc:
                        raise OSError(exc.errno, exc.strerror, path or ".") from exc
        except tarfile.TarError as exc:
            raise EntryRefused(f"not a tar archive, or a damaged one: {exc}") from exc
        for path, mode, mtime in reversed(self._directories):  # children first: their mtimes are final
            fd = openat2(self._dest, path, os.O_PATH | os.O_DIRECTORY, _BELOW)
            try:
                os.chmod(f"/proc/self/fd/{fd}", mode)
                os.utime(f"/proc/self/fd/{fd}", ns=(mtime, mtime))
            finally:
                os.close(fd)
        return ArchiveSummary(self._entries, self._bytes)

    def _filler(self, stream: tarfile.TarFile, member: tarfile.TarInfo) -> Callable[[int], None]:
        """What writes a regular member's content into a file descriptor and sets its mode: a
        source that copies in the kernel (the byte stream's socket) does, past tarfile."""
        source = stream.fileobj
        mode = member.mode & 0o777
        if isinstance(source, KernelCopySource) and not member.issparse():

            def copied(fd: int) -> None:
                source.copy_into(fd, member.size)
                os.fchmod(fd, mode)  # the gateway's umask is not the workload's

            return copied
        content = stream.extractfile(member)
        assert content is not None  # a regular member always has content
        return lambda fd: _copy_content(content, fd, mode)

    def _member(self, stream: tarfile.TarFile, member: tarfile.TarInfo, path: str) -> None:
        mtime = int(member.mtime) * 1_000_000_000
        if member.isdir():
            if path:  # the destination itself keeps its own mode
                os.close(self._directory(path))
                self._directories.append((path, member.mode & 0o777, mtime))
        elif member.isreg():
            self._bytes += member.size
            if self._bytes > self._limits.max_bytes:
                raise OSError(errno.EFBIG, f"more than {self._limits.max_bytes} bytes of content")
            self._place(path, mtime, lambda parent, temp: _write_file(parent, temp, self._filler(stream, member)))
        elif member.issym():
            if not link_stays_inside(path, member.linkname):
                raise EntryRefused(f"{path}: a symbolic link to {member.linkname!r} leads out of the destination")
            self._place(path, mtime, lambda parent, temp: os.symlink(member.linkname, temp, dir_fd=parent))
        elif member.islnk():
            raise EntryRefused(f"{path}: a hard link (only files, directories and symbolic links are unpacked)")
        else:
            raise EntryRefused(f"{path}: a device node, FIFO or other special file is never unpacked")

    def _directory(self, path: str) -> int:
        """An O_PATH fd on the directory `path` below the destination, made (mkdir -p) as needed,
        never through a link."""
        fd = os.dup(self._dest)
        try:
            for name in path.split("/") if path else []:
                try:
                    below = openat2(fd, name, os.O_PATH | os.O_DIRECTORY, _BELOW)
                except FileNotFoundError:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(name, 0o755, dir_fd=fd)
                    below = openat2(fd, name, os.O_PATH | os.O_DIRECTORY, _BELOW)
                check_fs(below)
                os.close(fd)
                fd = below
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _parent_of(self, path: str) -> tuple[int, str]:
        parent, _, name = path.rpartition("/")
        if self._parent is None or self._parent[0] != parent:
            fd = self._directory(parent)
            if self._parent is not None:
                os.close(self._parent[1])
            self._parent = (parent, fd)
        return self._parent[1], name

    def _place(self, path: str, mtime: int, make: Any) -> None:
        """Make an entry under a hidden temporary name (`make(parent_fd, temp)`), then rename it
        over `path`: whatever is there (a link included) is replaced, never followed; a directory
        or a mount point there is refused."""
        if not path:
            raise OSError(errno.EISDIR, "is the destination directory")
        parent, name = self._parent_of(path)
        with contextlib.suppress(FileNotFoundError):
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                raise OSError(errno.EISDIR, "is a directory")
            refuse_mount_point(parent, st)
        temp = f".{name[:200]}.warmshell-{secrets.token_hex(6)}"
        try:
            make(parent, temp)
            os.utime(temp, ns=(mtime, mtime), dir_fd=parent, follow_symlinks=False)
            os.rename(temp, name, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=parent)
            raise


def _write_file(parent: int, temp: str, fill: Callable[[int], None]) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY
    fd = os.open(temp, flags, 0o600, dir_fd=parent)
    try:
        fill(fd)
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy_content(content: IO[bytes], fd: int, mode: int) -> None:
    while data := content.read(_STREAM_BUFFER):
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    os.fchmod(fd, mode)  # the gateway's umask is not the workload's


def pack(root: Root, path: str, limits: ArchiveLimits, chunk_bytes: int) -> Generator[bytes, None, None]:
    """The tar of the directory (its entries, named relative to it) or the file at `path`, in
    chunks of `chunk_bytes`; symlinks as links, special files skipped. Closing the generator
    releases its descriptors."""
    top = root.open_path(path)
    try:
        st = os.fstat(top)
        if stat.S_ISDIR(st.st_mode):
            yield from regroup(_tree(Root._reopen(top, os.O_RDONLY | os.O_DIRECTORY), limits), chunk_bytes)
        elif stat.S_ISREG(st.st_mode):
            name = path.rstrip("/").rpartition("/")[2]
            _count_content(st.st_size, limits)
            yield from regroup(_ending(_file(name, Root._reopen(top, os.O_RDONLY), st)), chunk_bytes)
        else:
            raise OSError(errno.ENXIO, "not a regular file or a directory")
    finally:
        os.close(top)


def close_pack(chunks: Generator[bytes, None, None], root: Root) -> None:
    """Release a pack's descriptors (ended or not; from a thread, never while it runs) and the
    root's own."""
    try:
        chunks.close()
    finally:
        os.close(root.fd)


def _ending(pieces: Iterator[bytes]) -> Iterator[bytes]:
    yield from pieces
    yield bytes(2 * _BLOCK)


def _header(name: str, st: os.stat_result, kind: bytes, size: int = 0, link: str = "") -> bytes:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.linkname = kind, size, link
    info.mode, info.mtime = stat.S_IMODE(st.st_mode), int(st.st_mtime)
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def _count_content(total: int, limits: ArchiveLimits) -> None:
    if total > limits.max_bytes:
        raise OSError(errno.EFBIG, f"more than {limits.max_bytes} bytes of content")


def _file(name: str, fd: int, st: os.stat_result) -> Iterator[bytes]:
    """One regular file's header and content (exactly the size announced: a file that shrank
    while read is an error, one that grew is cut)."""
    try:
        yield _header(name, st, tarfile.REGTYPE, st.st_size)
        left = st.st_size
        while left:
            data = os.read(fd, min(left, _STREAM_BUFFER))
            if not data:
                raise OSError(errno.EAGAIN, f"{name}: shrank while being read")
            left -= len(data)
            yield data
        if st.st_size % _BLOCK:
            yield bytes(_BLOCK - st.st_size % _BLOCK)
    finally:
        os.close(fd)


def _tree(top: int, limits: ArchiveLimits) -> Iterator[bytes]:
    """Depth first, one descriptor per level; never follows a link, never opens a special file."""
    stack: list[tuple[str, int, Iterator[str]]] = [("", top, iter(sorted(os.listdir(top))))]
    entries = content = 0
    try:
        while stack:
            prefix, fd, names = stack[-1]
            name = next(names, None)
            if name is None:
                os.close(stack.pop()[1])
                continue
            with contextlib.suppress(FileNotFoundError):  # removed while walked
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                entries += 1
                if entries > limits.max_entries:
                    raise OSError(errno.EFBIG, f"more than {limits.max_entries} entries")
                path = prefix + name
                if stat.S_ISLNK(st.st_mode):
                    yield _header(path, st, tarfile.SYMTYPE, link=os.readlink(name, dir_fd=fd))
                elif stat.S_ISDIR(st.st_mode):
                    below = _open_below(fd, name, os.O_RDONLY | os.O_DIRECTORY)
                    if below is not None:
                        if len(stack) >= 128:
                            os.close(below)
                            raise OSError(errno.EMLINK, "deeper than 128 levels")
                        yield _header(path, st, tarfile.DIRTYPE)
                        stack.append((path + "/", below, iter(sorted(os.listdir(below)))))
                elif stat.S_ISREG(st.st_mode) and (held := _open_below(fd, name, os.O_PATH)) is not None:
                    st = os.fstat(held)
                    try:
                        if not stat.S_ISREG(st.st_mode):  # swapped for something else meanwhile
                            continue
                        reader = Root._reopen(held, os.O_RDONLY)
                    finally:
                        os.close(held)
                    content += st.st_size
                    try:
                        _count_content(content, limits)
                    except OSError:
                        os.close(reader)
                        raise
                    yield from _file(path, reader, st)
        yield bytes(2 * _BLOCK)
    finally:
        for _, fd, _ in stack:
            os.close(fd)


def _open_below(parent: int, name: str, flags: int) -> int | None:
    """`name` in `parent`, not following a link; None on a pseudo file system (never packed)."""
    fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY, dir_fd=parent)
    try:
        check_fs(fd)
    except OSError:
        os.close(fd)
        return None
    return fd
