"""File operations the gateway asks a pod's supervisor for (FileOp down the session, FileResult
back up): stat, list, read, write, remove and mkdir in the workload container's filesystem.

The supervisor runs in a container of its own (with the pod's token), as the workload's user; it
serves files under the workload container's root, an fd its agent sent (`AgentLink.open_root`),
so an operation has exactly the workload's rights and view: every path is resolved by
`rootfs.Root` within the workload's `/` (`..` and symlinks stay inside, magic links and /proc and
/sys are refused), never in the supervisor's own filesystem. Content moves in
chunks under a window both ways: a read sends at most `window_bytes` ahead of the gateway's
credit, a write credits each chunk once it is on disk, so neither side holds a file in memory.
The blocking calls run in threads, off the session's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
from collections.abc import Callable
from typing import TypeVar

from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.core.archives import ArchiveLimits, ArchiveSummary, EntryRefused
from warmshell.core.files import FileEntry
from warmshell.sandboxio import archive
from warmshell.sandboxio.rootfs import PendingWrite, Root
from warmshell.sandboxio.window import OutputWindow

__all__ = ["FileServer", "entry_to_stat"]

T = TypeVar("T")
MAX_LIST_ENTRIES = 20_000  # a listing is one session message
DEFAULT_CHUNK = 256 * 1024


def entry_to_stat(entry: FileEntry) -> spb.FileStat:
    """An entry as it travels up the session."""
    return spb.FileStat(
        name=entry.name,
        type=entry.kind.value,
        size=entry.size,
        mode=entry.mode,
        mtime_ms=entry.mtime_ms,
        link_target=entry.link_target,
    )


class FileServer:
    """One task per operation; `handle` routes each FileOp to it."""

    def __init__(self, send: Callable[[spb.SupervisorMessage], None], open_root: Callable[[], int]) -> None:
        """`open_root` returns a new O_PATH fd on the workload's root for each operation (the
        server closes it)."""
        self._send = send
        self._open_root = open_root
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._windows: dict[str, OutputWindow] = {}
        self._writes: dict[str, asyncio.Queue[spb.FileOp]] = {}

    def handle(self, op: spb.FileOp) -> None:
        """Start an operation, or pass a credit, a chunk or a cancel to a running one."""
        if op.kind == "credit":
            if (window := self._windows.get(op.op_id)) is not None:
                window.grant(op.window_bytes)
        elif op.kind == "data":
            if (chunks := self._writes.get(op.op_id)) is not None:
                chunks.put_nowait(op)
        elif op.kind == "cancel":
            if (task := self._tasks.get(op.op_id)) is not None:
                task.cancel()
        elif op.op_id not in self._tasks:
            if op.kind in ("read", "tar"):
                self._windows[op.op_id] = OutputWindow(op.window_bytes or DEFAULT_CHUNK * 4)
            elif op.kind in ("write", "untar"):
                self._writes[op.op_id] = asyncio.Queue()
            self._tasks[op.op_id] = asyncio.create_task(self._serve(op))

    def close(self) -> None:
        """Abandon every operation (the session ended)."""
        for task in self._tasks.values():
            task.cancel()

    def _result(self, op_id: str, **fields: object) -> None:
        self._send(spb.SupervisorMessage(file_result=spb.FileResult(op_id=op_id, **fields)))  # type: ignore[arg-type]

    async def _call(self, operation: Callable[[Root], T]) -> T:
        def run() -> T:
            root = Root(self._open_root())
            try:
                return operation(root)
            finally:
                os.close(root.fd)

        return await asyncio.to_thread(run)

    async def _serve(self, op: spb.FileOp) -> None:
        try:
            if op.kind == "stat":
                entry = await self._call(lambda root: root.stat(op.path))
                self._result(op.op_id, entries=[entry_to_stat(entry)], done=True)
            elif op.kind == "list":
                entries = await self._call(lambda root: root.list(op.path, MAX_LIST_ENTRIES))
                self._result(op.op_id, entries=[entry_to_stat(e) for e in entries], done=True)
            elif op.kind == "mkdir":
                entry = await self._call(lambda root: root.mkdir(op.path, op.parents_or_recursive, op.mode))
                self._result(op.op_id, entries=[entry_to_stat(entry)], done=True)
            elif op.kind == "remove":
                await self._call(lambda root: root.remove(op.path, op.parents_or_recursive))
                self._result(op.op_id, done=True)
            elif op.kind == "read":
                await self._read(op)
            elif op.kind == "write":
                await self._write(op)
            elif op.kind == "tar":
                await self._tar(op)
            elif op.kind == "untar":
                await self._untar(op)
            else:
                self._result(op.op_id, error=f"unknown file operation {op.kind!r}")
        except EntryRefused as exc:
            self._result(op.op_id, errno=errno.EINVAL, error=str(exc))
        except OSError as exc:
            where = f"{exc.filename}: " if op.kind == "untar" and isinstance(exc.filename, str) else ""
            self._result(op.op_id, errno=exc.errno or errno.EIO, error=where + (exc.strerror or str(exc)))
        finally:
            self._tasks.pop(op.op_id, None)
            self._windows.pop(op.op_id, None)
            self._writes.pop(op.op_id, None)

    async def _read(self, op: spb.FileOp) -> None:
        fd, size = await self._call(lambda root: root.open_read(op.path))
        try:
            if size > op.max_bytes:
                self._result(op.op_id, errno=errno.EFBIG, error=f"{size} bytes, over the limit of {op.max_bytes}")
                return
            window, sent = self._windows[op.op_id], 0
            while True:
                data = await asyncio.to_thread(os.read, fd, op.chunk_bytes or DEFAULT_CHUNK)
                if not data:
                    self._result(op.op_id, done=True)
                    return
                sent += len(data)
                if sent > op.max_bytes:
                    self._result(op.op_id, errno=errno.EFBIG, error=f"over the limit of {op.max_bytes} bytes")
                    return
                await self._send_data(op.op_id, window, data)
        finally:
            os.close(fd)

    async def _send_data(self, op_id: str, window: OutputWindow, data: bytes) -> None:
        taken = 0
        while taken < len(data):  # the window holds several chunks: wait for room for this one
            taken += await window.take(len(data) - taken)
        self._result(op_id, data=data)

    async def _tar(self, op: spb.FileOp) -> None:
        root = Root(self._open_root())
        limits = ArchiveLimits(op.max_entries, op.max_bytes)
        chunks = archive.pack(root, op.path, limits, op.chunk_bytes or DEFAULT_CHUNK)
        window = self._windows[op.op_id]
        try:
            while (data := await asyncio.to_thread(next, chunks, None)) is not None:
                await self._send_data(op.op_id, window, data)
            self._result(op.op_id, done=True)
        finally:
            await asyncio.shield(asyncio.to_thread(archive.close_pack, chunks, root))

    async def _untar(self, op: spb.FileOp) -> None:
        root = Root(self._open_root())
        pipe = archive.ChunkPipe()

        def run() -> ArchiveSummary:
            try:
                return archive.unpack(root, op.path, pipe, ArchiveLimits(op.max_entries, op.max_bytes))
            finally:
                pipe.close()
                os.close(root.fd)

        unpacking = asyncio.ensure_future(asyncio.to_thread(run))
        chunks = self._writes[op.op_id]
        try:
            while not unpacking.done():
                getting = asyncio.ensure_future(chunks.get())
                await asyncio.wait([getting, unpacking], return_when=asyncio.FIRST_COMPLETED)
                if not getting.done():
                    getting.cancel()
                    break
                chunk = getting.result()
                if chunk.data and await pipe.send(chunk.data):
                    self._result(op.op_id, credit=len(chunk.data))
                if chunk.last:
                    pipe.finish()
                    break
            summary = await unpacking
            self._result(op.op_id, done=True, bytes_written=summary.bytes_written, entries_written=summary.entries)
        finally:
            if not unpacking.done():
                pipe.abort()
                with contextlib.suppress(BaseException):
                    await asyncio.wait([unpacking])

    async def _write(self, op: spb.FileOp) -> None:
        pending: PendingWrite = await self._call(
            lambda root: root.begin_write(op.path, op.mode or 0o644, op.parents_or_recursive)
        )
        chunks, written, committed = self._writes[op.op_id], 0, False
        try:
            while True:
                chunk = await chunks.get()
                if chunk.data:
                    written += len(chunk.data)
                    if written > op.max_bytes:
                        raise OSError(errno.EFBIG, f"over the limit of {op.max_bytes} bytes")
                    await asyncio.to_thread(_write_all, pending.fd, chunk.data)
                    self._result(op.op_id, credit=len(chunk.data))
                if chunk.last:
                    await self._call(lambda root: root.commit(pending))
                    committed = True
                    self._result(op.op_id, done=True, bytes_written=written)
                    return
        finally:
            if not committed:
                with contextlib.suppress(OSError):
                    await asyncio.shield(asyncio.to_thread(Root(-1).abort, pending))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
