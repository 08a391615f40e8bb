"""`SandboxFiles` served by the sandbox's own supervisor, over its session (Kubernetes pods,
whose files the gateway cannot reach otherwise).

Each operation is a FileOp down the session and FileResults back (see `supervisor.fileops`,
which confines the path inside the container). Content streams under windows in both
directions: a read grants the supervisor more once the client's stream took a chunk, a write
sends chunks only as the supervisor credits them back, so a 1 GiB file never sits in the
gateway. A session that ends fails the operations in flight; a cancelled caller cancels its
operation in the sandbox (a write then leaves nothing behind).
"""

from __future__ import annotations

import asyncio
import errno
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.core.archives import ArchiveLimits, ArchiveSummary
from warmshell.core.errors import InvalidArgumentError, ResourceExhaustedError, UnavailableError
from warmshell.core.files import FileEntry, FileKind
from warmshell.drivers.files import file_error
from warmshell.gateway.sessions import SupervisorSession

__all__ = ["SessionFiles"]

CHUNKS_IN_FLIGHT = 4


def _entry(stat: spb.FileStat) -> FileEntry:
    kind = FileKind(stat.type) if stat.type in FileKind._value2member_map_ else FileKind.OTHER
    return FileEntry(stat.name, kind, stat.size, stat.mode, stat.mtime_ms, stat.link_target)


class SessionFiles:
    """One sandbox's files through its supervisor session."""

    def __init__(self, session: SupervisorSession, *, chunk_bytes: int = 256 * 1024) -> None:
        self._session = session
        self._chunk_bytes = chunk_bytes

    @contextmanager
    def _operation(self, op: spb.FileOp) -> Iterator[asyncio.Queue[spb.FileResult]]:
        """Send `op` and yield the queue its results arrive on; a caller that leaves before the
        operation is done cancels it in the sandbox."""
        results: asyncio.Queue[spb.FileResult] = asyncio.Queue()
        self._session.file_ops[op.op_id] = results
        self._session.send(spb.GatewayMessage(file_op=op))
        finished = False
        try:
            yield results
            finished = True
        finally:
            self._session.file_ops.pop(op.op_id, None)
            if not finished and not self._session.closed.is_set():
                self._session.send(spb.GatewayMessage(file_op=spb.FileOp(op_id=op.op_id, kind="cancel")))

    @staticmethod
    async def _next(path: str, results: asyncio.Queue[spb.FileResult]) -> spb.FileResult:
        """The next result; the error it carries, named by path and cause."""
        result = await results.get()
        if result.errno:
            if result.errno == errno.EFBIG:  # a size limit, worded by the supervisor
                raise ResourceExhaustedError(f"{path}: {result.error}")
            if result.errno == errno.EINVAL and result.error:  # a refused archive entry, worded there
                raise InvalidArgumentError("archive", result.error)
            raise file_error(path, OSError(result.errno, result.error))
        if result.error:
            raise UnavailableError(f"{path}: {result.error}")
        return result

    def _op(self, kind: str, path: str, **fields: object) -> spb.FileOp:
        return spb.FileOp(op_id=uuid.uuid4().hex, kind=kind, path=path, **fields)  # type: ignore[arg-type]

    async def _single(self, op: spb.FileOp) -> spb.FileResult:
        with self._operation(op) as results:
            return await self._next(op.path, results)

    async def stat(self, path: str) -> FileEntry:
        """See `SandboxFiles.stat`."""
        return _entry((await self._single(self._op("stat", path))).entries[0])

    async def list(self, path: str) -> list[FileEntry]:
        """See `SandboxFiles.list`."""
        return [_entry(e) for e in (await self._single(self._op("list", path))).entries]

    async def remove(self, path: str, *, recursive: bool) -> None:
        """See `SandboxFiles.remove`."""
        await self._single(self._op("remove", path, parents_or_recursive=recursive))

    async def mkdir(self, path: str, *, parents: bool, mode: int) -> FileEntry:
        """See `SandboxFiles.mkdir`."""
        return _entry((await self._single(self._op("mkdir", path, parents_or_recursive=parents, mode=mode))).entries[0])

    async def read(self, path: str, chunk_bytes: int, max_bytes: int) -> AsyncIterator[bytes]:
        """See `SandboxFiles.read`: the supervisor sends at most a few chunks ahead of the client."""
        async for data in self._read(self._op("read", path, chunk_bytes=chunk_bytes, max_bytes=max_bytes)):
            yield data

    async def read_archive(self, path: str, chunk_bytes: int, limits: ArchiveLimits) -> AsyncIterator[bytes]:
        """See `SandboxFiles.read_archive`: packed in the pod, streamed like a read."""
        op = self._op("tar", path, chunk_bytes=chunk_bytes, max_bytes=limits.max_bytes, max_entries=limits.max_entries)
        async for data in self._read(op):
            yield data

    async def _read(self, op: spb.FileOp) -> AsyncIterator[bytes]:
        op.window_bytes = op.chunk_bytes * CHUNKS_IN_FLIGHT
        with self._operation(op) as results:
            while not (result := await self._next(op.path, results)).done:
                yield result.data
                credit = spb.FileOp(op_id=op.op_id, kind="credit", window_bytes=len(result.data))
                self._session.send(spb.GatewayMessage(file_op=credit))

    async def write(
        self, path: str, chunks: AsyncIterator[bytes], *, mode: int, make_parents: bool, max_bytes: int
    ) -> int:
        """See `SandboxFiles.write`: chunks go down as the supervisor credits the ones before."""
        op = self._op("write", path, mode=mode, parents_or_recursive=make_parents, max_bytes=max_bytes)
        return int((await self._write(op, chunks)).bytes_written)

    async def write_archive(self, path: str, chunks: AsyncIterator[bytes], limits: ArchiveLimits) -> ArchiveSummary:
        """See `SandboxFiles.write_archive`: unpacked in the pod, streamed like a write (the
        archive's own bytes are bounded by the limits' bytes plus a header per entry)."""
        op = self._op("untar", path, max_bytes=limits.max_bytes, max_entries=limits.max_entries)
        result = await self._write(op, chunks, max_stream_bytes=limits.max_bytes + 2048 * (limits.max_entries + 1))
        return ArchiveSummary(int(result.entries_written), int(result.bytes_written))

    async def _write(
        self, op: spb.FileOp, chunks: AsyncIterator[bytes], *, max_stream_bytes: int = 0
    ) -> spb.FileResult:
        path, limit = op.path, max_stream_bytes or op.max_bytes
        window = self._chunk_bytes * CHUNKS_IN_FLIGHT
        with self._operation(op) as results:
            budget, total = window, 0
            async for chunk in chunks:
                total += len(chunk)
                if total > limit:
                    raise ResourceExhaustedError(f"{path}: over the limit of {limit} bytes")
                while budget <= 0:
                    result = await self._next(path, results)
                    if result.done:  # an archive ends before its stream does (trailing padding)
                        return result
                    budget += result.credit
                self._session.send(spb.GatewayMessage(file_op=spb.FileOp(op_id=op.op_id, kind="data", data=chunk)))
                budget -= len(chunk)
            self._session.send(spb.GatewayMessage(file_op=spb.FileOp(op_id=op.op_id, kind="data", last=True)))
            while not (result := await self._next(path, results)).done:
                pass  # credits for the last chunks
            return result
