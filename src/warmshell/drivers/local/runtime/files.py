"""A local sandbox's files for the gateway's FileService: the async face of `rootfs`.

Every operation opens the sandbox's root afresh (from its pid 1, checked alive through a pidfd
after the open, so a recycled pid can never hand out the host's root) and runs the blocking part
in the driver's files executor, whose threads take the workload's rights per call. Reads and
writes move one chunk at a time between the file and the gRPC stream, so memory stays flat
whatever the size.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from warmshell.core.archives import EntryRefused
from warmshell.core.errors import InvalidArgumentError, ResourceExhaustedError, WarmshellError
from warmshell.drivers.files import ArchiveLimits, ArchiveSummary, FileEntry, archive_error, file_error
from warmshell.drivers.local.runtime import socketio
from warmshell.sandboxio import archive
from warmshell.sandboxio.rootfs import PendingWrite, Root, drop_supplementary_groups

__all__ = ["LocalFiles", "bytes_executor", "files_executor"]

T = TypeVar("T")
MAX_LIST_ENTRIES = 100_000
READ_AHEAD_BYTES = 1024 * 1024


def files_executor(*, as_root: bool) -> ThreadPoolExecutor:
    """The threads file operations run in (a gateway run as root: without supplementary groups,
    since fsuid/fsgid switch per call but groups would otherwise stay root's)."""
    return ThreadPoolExecutor(
        max_workers=4,
        thread_name_prefix="warmshell-files",
        initializer=drop_supplementary_groups if as_root else None,
    )


def bytes_executor(*, as_root: bool) -> ThreadPoolExecutor:
    """The threads that move a byte-stream transfer between its socket and its files (each
    holds one for the transfer's length, waiting on a slow client at most its idle timeout at
    a time): apart from the files executor, so that slow transfers never hold up other file
    operations; prepared as its threads are (an archive is unpacked with the workload's rights)."""
    return ThreadPoolExecutor(
        max_workers=16,
        thread_name_prefix="warmshell-bytes",
        initializer=drop_supplementary_groups if as_root else None,
    )


class LocalFiles:
    """`SandboxFiles` (and `SocketFiles`) for one local sandbox."""

    def __init__(
        self,
        open_root: Callable[[], int],
        uid: int | None,
        executor: ThreadPoolExecutor,
        bytes_threads: ThreadPoolExecutor | None = None,
    ) -> None:
        """`open_root` returns a fresh O_PATH fd on the sandbox's root (OSError when it ended);
        `uid` is the sandbox's own host uid when the gateway runs as root; `bytes_threads` run
        the byte stream's transfers (default: `executor`)."""
        self._open_root = open_root
        self._uid = uid
        self._executor = executor
        self._bytes_threads = bytes_threads or executor

    async def _call(self, path: str, operation: Callable[[Root], T], undo: Callable[[T], None] | None = None) -> T:
        """Run `operation` on a fresh root in the executor, with the workload's rights; OSError
        becomes the error naming `path`. The thread owns (and closes) the root fd, so a cancelled
        caller cannot close it under a running operation; what a cancelled caller can no longer
        receive (an open fd, a pending write) is handed to `undo` once the thread is done."""
        try:
            root = Root(self._open_root(), self._uid)
        except OSError as exc:
            raise file_error(path, exc) from exc

        def run() -> T:
            try:
                with root.rights():
                    return operation(root)
            finally:
                os.close(root.fd)

        future = asyncio.get_running_loop().run_in_executor(self._executor, run)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            if undo is not None:
                future.add_done_callback(lambda done: self._undo(done, undo))
            raise
        except OSError as exc:
            raise file_error(path, exc) from exc

    def _undo(self, done: asyncio.Future[T], undo: Callable[[T], None]) -> None:
        if not done.cancelled() and done.exception() is None:
            root = Root(-1, self._uid)
            self._executor.submit(_under_rights, root, lambda: undo(done.result()))

    async def stat(self, path: str) -> FileEntry:
        """See `SandboxFiles.stat`."""
        return await self._call(path, lambda root: root.stat(path))

    async def list(self, path: str) -> list[FileEntry]:
        """See `SandboxFiles.list`."""
        return await self._call(path, lambda root: root.list(path, MAX_LIST_ENTRIES))

    async def read(self, path: str, chunk_bytes: int, max_bytes: int) -> AsyncIterator[bytes]:
        """See `SandboxFiles.read`; a file over `max_bytes` is refused before any byte is sent."""
        fd, size = await self._call(path, lambda root: root.open_read(path), undo=lambda opened: os.close(opened[0]))
        ahead: Future[bytes] | None = None
        try:
            if size > max_bytes:
                raise ResourceExhaustedError(f"{path}: {size} bytes, over the limit of {max_bytes}")
            sent = 0
            # One read ahead, of several chunks: the client's stream takes a chunk while the
            # next megabyte is read, and a chunk costs no thread hop of its own.
            ahead = self._executor.submit(os.read, fd, max(chunk_bytes, READ_AHEAD_BYTES))
            while True:
                try:
                    data = await asyncio.wrap_future(ahead)
                except OSError as exc:
                    raise file_error(path, exc) from exc
                if not data:
                    return
                sent += len(data)
                if sent > max_bytes:  # it grew while being read
                    raise ResourceExhaustedError(f"{path}: over the limit of {max_bytes} bytes")
                ahead = self._executor.submit(os.read, fd, max(chunk_bytes, READ_AHEAD_BYTES))
                for start in range(0, len(data), chunk_bytes):
                    yield data[start : start + chunk_bytes]
        finally:
            if ahead is not None:  # no read may still be running on the fd closed below
                with contextlib.suppress(BaseException):
                    await asyncio.shield(asyncio.wrap_future(ahead))
            os.close(fd)

    async def write(
        self, path: str, chunks: AsyncIterator[bytes], *, mode: int, make_parents: bool, max_bytes: int
    ) -> int:
        """See `SandboxFiles.write`: into a hidden temporary file, renamed over `path` at the end;
        a failure or a cancel removes it."""
        pending: PendingWrite = await self._call(
            path, lambda root: root.begin_write(path, mode, make_parents), undo=lambda p: Root(-1).abort(p)
        )
        writer = _BatchedWriter(pending.fd, self._executor)
        written = 0
        committed = False
        try:
            try:
                async for chunk in chunks:
                    written += len(chunk)
                    if written > max_bytes:
                        raise ResourceExhaustedError(f"{path}: over the limit of {max_bytes} bytes")
                    await writer.write(chunk)
                await writer.finish()
            except OSError as exc:
                raise file_error(path, exc) from exc
            await self._call(path, lambda root: root.commit(pending))
            committed = True
            return written
        finally:
            if not committed:
                await writer.settle()  # no write may still be running on the fd closed below
                # Not awaited through `_call`: a cancelled write must still clean up.
                root = Root(-1, self._uid)
                future = self._executor.submit(_under_rights, root, lambda: root.abort(pending))
                with contextlib.suppress(Exception):
                    await asyncio.shield(asyncio.wrap_future(future))

    async def receive(
        self, path: str, sock: socket.socket, size: int, *, mode: int, make_parents: bool, idle_seconds: float
    ) -> int:
        """See `SocketFiles.receive`: spliced from the socket into a hidden temporary file in one
        thread, renamed over `path` at the end; a failure or a cancel removes it."""
        pending: PendingWrite = await self._call(
            path, lambda root: root.begin_write(path, mode, make_parents), undo=lambda p: Root(-1).abort(p)
        )
        committed = False
        try:
            moving = self._bytes_threads.submit(socketio.receive_into, sock.fileno(), pending.fd, size, idle_seconds)
            await _moved(path, sock, moving, size)
            await self._call(path, lambda root: root.commit(pending))
            committed = True
            return size
        finally:
            if not committed:
                root = Root(-1, self._uid)
                future = self._executor.submit(_under_rights, root, lambda: root.abort(pending))
                with contextlib.suppress(Exception):
                    await asyncio.shield(asyncio.wrap_future(future))

    async def send(
        self,
        path: str,
        sock: socket.socket,
        max_bytes: int,
        *,
        idle_seconds: float,
        before: Callable[[int], Awaitable[None]],
    ) -> int:
        """See `SocketFiles.send`: `before(size)` once the file is open, then its bytes by
        sendfile in one thread; the bytes sent."""
        fd, size = await self._call(path, lambda root: root.open_read(path), undo=lambda opened: os.close(opened[0]))
        try:
            if size > max_bytes:
                raise ResourceExhaustedError(f"{path}: {size} bytes, over the limit of {max_bytes}")
            await before(size)
            moving = self._bytes_threads.submit(socketio.send_from, sock.fileno(), fd, size, idle_seconds)
            return await _moved(path, sock, moving, size)
        finally:
            os.close(fd)

    async def receive_archive(
        self, path: str, sock: socket.socket, size: int, limits: ArchiveLimits, *, idle_seconds: float
    ) -> ArchiveSummary:
        """See `SocketFiles.receive_archive`: unpacked in one thread straight off the socket."""
        try:
            root = Root(self._open_root(), self._uid)
        except OSError as exc:
            raise file_error(path, exc) from exc

        def run() -> ArchiveSummary:
            try:
                with root.rights():
                    reader = socketio.SocketReader(sock.fileno(), size, idle_seconds)
                    summary = archive.unpack(root, path, reader, limits)
                    reader.finish()
                    return summary
            finally:
                os.close(root.fd)

        return await _moved(path, sock, self._bytes_threads.submit(run), size, archive_error)

    async def send_archive(self, path: str, sock: socket.socket, limits: ArchiveLimits, *, idle_seconds: float) -> int:
        """See `SocketFiles.send_archive`: packed and sent in frames in one thread."""
        try:
            root = Root(self._open_root(), self._uid)
        except OSError as exc:
            raise file_error(path, exc) from exc
        chunks = archive.pack(root, path, limits, READ_AHEAD_BYTES)

        def run() -> int:
            try:
                with root.rights():
                    return socketio.send_frames(sock.fileno(), chunks, idle_seconds)
            finally:
                archive.close_pack(chunks, root)

        return await _moved(path, sock, self._bytes_threads.submit(run), 0, archive_error)

    async def read_archive(self, path: str, chunk_bytes: int, limits: ArchiveLimits) -> AsyncIterator[bytes]:
        """See `SandboxFiles.read_archive`: packed a chunk at a time in the executor, as the
        client takes them."""
        try:
            root = Root(self._open_root(), self._uid)
        except OSError as exc:
            raise file_error(path, exc) from exc
        chunks = archive.pack(root, path, limits, chunk_bytes)
        loop = asyncio.get_running_loop()
        pending: asyncio.Future[bytes | None] | None = None
        try:
            while True:
                pending = loop.run_in_executor(self._executor, _under_rights, root, lambda: next(chunks, None))
                try:
                    chunk = await asyncio.shield(pending)
                except (OSError, EntryRefused) as exc:
                    raise archive_error(path, exc) from exc
                if chunk is None:
                    return
                yield chunk
        finally:
            # The generator may be running in a thread still (a cancelled caller): close it after.
            if pending is not None and not pending.done():
                with contextlib.suppress(BaseException):
                    await asyncio.wait([pending])
            await loop.run_in_executor(self._executor, archive.close_pack, chunks, root)

    async def write_archive(self, path: str, chunks: AsyncIterator[bytes], limits: ArchiveLimits) -> ArchiveSummary:
        """See `SandboxFiles.write_archive`: unpacked in one executor thread as the chunks arrive
        (at most a few MiB between the stream and the thread)."""
        try:
            root = Root(self._open_root(), self._uid)
        except OSError as exc:
            raise file_error(path, exc) from exc
        pipe = archive.ChunkPipe()

        def run() -> ArchiveSummary:
            try:
                with root.rights():
                    return archive.unpack(root, path, pipe, limits)
            finally:
                pipe.close()
                os.close(root.fd)

        unpacking = asyncio.get_running_loop().run_in_executor(self._executor, run)
        try:
            async for chunk in chunks:
                if not await pipe.send(chunk):
                    break  # the unpacker stopped: its outcome says why
            pipe.finish()
            try:
                return await asyncio.shield(unpacking)
            except (OSError, EntryRefused) as exc:
                raise archive_error(path, exc) from exc
        finally:
            if not unpacking.done():
                pipe.abort()
                with contextlib.suppress(BaseException):
                    await asyncio.wait([unpacking])

    async def remove(self, path: str, *, recursive: bool) -> None:
        """See `SandboxFiles.remove`."""
        await self._call(path, lambda root: root.remove(path, recursive))

    async def mkdir(self, path: str, *, parents: bool, mode: int) -> FileEntry:
        """See `SandboxFiles.mkdir`."""
        return await self._call(path, lambda root: root.mkdir(path, parents, mode))


async def _moved(
    path: str,
    sock: socket.socket,
    moving: Future[T],
    size: int,
    error: Callable[[str, Any], WarmshellError] = file_error,
) -> T:
    """What the thread moving a transfer's bytes returns, as the error for `path` when it
    fails (`error`: an OSError's, or an archive's). A cancelled caller shuts the socket down,
    which ends the thread's wait, and waits for it: the fds it uses are closed after."""
    waiting = asyncio.wrap_future(moving)
    try:
        return await asyncio.shield(waiting)
    except asyncio.CancelledError:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(BaseException):
            await waiting  # its outcome retrieved here: it is the cancel's consequence
        raise
    except TimeoutError:
        raise  # a client that stopped sending or reading: the caller says so
    except socketio.EndedEarly as exc:
        raise InvalidArgumentError("size", f"{path}: the upload ended after {exc.received} of {size} bytes") from None
    except socketio.TooMany:
        raise InvalidArgumentError("size", f"{path}: more than the {size} bytes announced") from None
    except (OSError, EntryRefused) as exc:
        raise error(path, exc) from exc


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _write_chunks(fd: int, chunks: list[bytes]) -> None:
    for chunk in chunks:
        _write_all(fd, chunk)


class _BatchedWriter:
    """Writes to an fd in the executor one batch at a time while the next batch gathers, so a
    chunk costs no thread hop of its own: handing 256 KiB to a worker (a queue put and a futex
    wake on a loaded 2-core host) cost the event loop about as much as the gRPC receive of it,
    a quarter of the gateway's CPU per 5 MiB upload. At most `max_batch` bytes wait."""

    def __init__(self, fd: int, executor: ThreadPoolExecutor, max_batch: int = 4 * 1024 * 1024) -> None:
        self._fd = fd
        self._executor = executor
        self._max_batch = max_batch
        self._batch: list[bytes] = []
        self._size = 0
        self._in_flight: Future[None] | None = None  # the executor's own: a cancelled await leaves it

    async def write(self, chunk: bytes) -> None:
        """Queue `chunk`; start it now if no write runs (or wait for the one running when the
        batch is full). OSError of an earlier batch surfaces here."""
        self._batch.append(chunk)
        self._size += len(chunk)
        if self._in_flight is None or self._in_flight.done() or self._size >= self._max_batch:
            await self._flush()

    async def finish(self) -> None:
        """Everything queued, written."""
        await self._flush()
        await self._flush()

    async def settle(self) -> None:
        """Wait for a running write to end, whatever its outcome (before the fd is closed)."""
        if self._in_flight is not None:
            with contextlib.suppress(BaseException):
                await asyncio.shield(asyncio.wrap_future(self._in_flight))
            self._in_flight = None

    async def _flush(self) -> None:
        if self._in_flight is not None:
            await asyncio.wrap_future(self._in_flight)
            self._in_flight = None
        if self._batch:
            batch, self._batch, self._size = self._batch, [], 0
            self._in_flight = self._executor.submit(_write_chunks, self._fd, batch)


def _under_rights(root: Root, operation: Callable[[], T]) -> T:
    with root.rights():
        return operation()
