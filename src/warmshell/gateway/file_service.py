"""The public FileService: read, write, list, stat, remove and mkdir inside a Ready sandbox.

The gateway checks the caller, the request and the sandbox's phase here, then hands the
operation to its driver's `SandboxFiles`, which confines the path to the sandbox (or, for a driver
that cannot reach its sandboxes' files, a Kubernetes pod, to the sandbox's supervisor through its
session: `session_files`). Content streams
through in chunks in both directions (a client-streaming write is read one message at a time, a
read yields as the transport takes it), so no file is ever held whole in the gateway.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc

from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.api.v1 import sandbox_pb2_grpc
from warmshell.core import phases
from warmshell.core.config import FilesConfig
from warmshell.core.errors import InvalidArgumentError, NotFoundError, ResourceExhaustedError, WarmshellError
from warmshell.core.models import DEFAULT_WORKSPACE, Phase, SandboxRecord
from warmshell.core.transfers import INLINE_MAX_BYTES
from warmshell.core.validation import validate_workspace
from warmshell.drivers.files import (
    ArchiveLimits,
    FileEntry,
    FilesCapable,
    SandboxFiles,
    SocketFiles,
    normalize_path,
)
from warmshell.gateway.auth import Authenticator
from warmshell.gateway.bytestream import ByteStream
from warmshell.gateway.calls import abort_for, drain_before_refusal, streaming, unary
from warmshell.gateway.forwarding import Forwarder, Target
from warmshell.gateway.manager import SandboxManager
from warmshell.gateway.session_files import SessionFiles
from warmshell.gateway.tickets import Direction, Grant

__all__ = ["FileService", "entry_to_proto"]

Ctx = grpc.aio.ServicerContext[Any, Any]
DEFAULT_FILE_MODE = 0o644
DEFAULT_DIR_MODE = 0o755
_SERVICE = "/warmshell.v1.FileService/"
# A refused write or upload reads and drops what its client still sends before it answers
# (`drain_before_refusal`), within these bounds. 256 MiB over a local socket is a fraction of a
# second, and anything larger goes over the byte stream.
_DRAIN_BYTES = 256 * 1024 * 1024
_DRAIN_SECONDS = 5.0
_DIRECTIONS = {
    pb.TRANSFER_DIRECTION_UPLOAD: Direction.UPLOAD,
    pb.TRANSFER_DIRECTION_DOWNLOAD: Direction.DOWNLOAD,
    pb.TRANSFER_DIRECTION_UPLOAD_ARCHIVE: Direction.UPLOAD_ARCHIVE,
    pb.TRANSFER_DIRECTION_DOWNLOAD_ARCHIVE: Direction.DOWNLOAD_ARCHIVE,
}


def entry_to_proto(entry: FileEntry) -> pb.FileInfo:
    """The wire form of one entry."""
    return pb.FileInfo(
        name=entry.name,
        type=entry.kind.value,
        size=entry.size,
        mode=entry.mode,
        mtime_ms=entry.mtime_ms,
        link_target=entry.link_target,
    )


def _mode(mode: int, default: int, field: str) -> int:
    if mode > 0o7777:
        raise InvalidArgumentError(field, f"{mode:#o} is not a permission mode (at most 0o7777)")
    return mode or default


async def _header_first(requests: AsyncIterator[Any], what: str) -> Any:
    """The first message of a client stream, which must be its header."""
    first = await anext(aiter(requests), None)
    if first is None or not first.HasField("header"):
        raise InvalidArgumentError("header", f"the first message of {what} must be its header")
    return first


async def _replayed(first: Any, rest: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """The stream again from its first message (forwarded to the replica that serves it)."""
    yield first
    async for message in rest:
        yield message


async def _data(rest: AsyncIterator[Any], what: str) -> AsyncIterator[bytes]:
    """The content after the header; a second header is refused."""
    async for message in rest:
        if message.HasField("header"):
            raise InvalidArgumentError("header", f"only the first message of {what} is a header")
        yield message.data


@contextlib.asynccontextmanager
async def _refused_once_sent(requests: AsyncIterator[Any], context: Ctx, where: str) -> AsyncIterator[None]:
    """A refusal (a `WarmshellError`) raised inside waits until the client has sent the rest
    of `requests`, which are dropped (see `_DRAIN_BYTES`), and goes out as the call's status
    itself: the handler's wrapper would drain again, up to its own bound (which is for callers
    not yet authenticated) after this one's was reached."""
    try:
        yield
    except WarmshellError as exc:
        await drain_before_refusal(requests, seconds=_DRAIN_SECONDS, max_bytes=_DRAIN_BYTES)
        await abort_for(context, exc, where)


class FileService(sandbox_pb2_grpc.FileServiceServicer):
    """gRPC handlers; the confinement lives in the driver's `SandboxFiles`. Each handler
    authenticates before it reads or validates anything, so a caller without the API token
    learns nothing and is not kept waiting for a message it may never send."""

    def __init__(
        self, manager: SandboxManager, auth: Authenticator, config: FilesConfig, forwarder: Forwarder | None = None
    ) -> None:
        self._manager = manager
        self._auth = auth
        self._config = config
        self._forwarder = forwarder
        self._stream: ByteStream | None = None

    def offer_stream(self, stream: ByteStream) -> None:
        """Issue tickets for `stream` (the gateway listens on it once serving)."""
        self._stream = stream

    @property
    def stream(self) -> ByteStream | None:
        """The byte stream tickets are issued for, if any."""
        return self._stream

    async def _owner(self, workspace: str, name: str, context: Ctx) -> Target | None:
        """The replica to forward to when another one holds the sandbox's session (files that
        travel through the supervisor are served there); None to serve here."""
        if self._forwarder is None:
            return None
        record = await self._record(workspace, name)
        if record.status.phase != Phase.READY or self._manager.sessions.get(record.id) is not None:
            return None
        return await self._forwarder.target(record, context)

    async def _files(self, workspace: str, name: str, context: Ctx) -> SandboxFiles:
        return await self._files_of(await self._record(workspace, name))

    async def _record(self, workspace: str, name: str, field: str = "name") -> SandboxRecord:
        validate_workspace(workspace or DEFAULT_WORKSPACE)
        if not name:
            raise InvalidArgumentError(field, "must not be empty")
        return await self._manager.records.get_by_name(workspace or DEFAULT_WORKSPACE, name)

    async def files_for_grant(self, grant: Grant) -> SandboxFiles:
        """The files a byte-stream ticket names, checked as a call's are (the sandbox may have
        been deleted, or stopped being Ready, since the ticket was issued)."""
        record = await self._manager.records.get(grant.sandbox_id)
        if record is None:
            raise NotFoundError(f"{grant.path}: the sandbox this ticket was issued for no longer exists")
        return await self._files_of(record)

    async def _files_of(self, record: SandboxRecord) -> SandboxFiles:
        if record.status.phase != Phase.READY:
            raise phases.not_servable(f"{record.workspace}/{record.name}", record.status, operation="file operation")
        driver = self._manager.driver
        if isinstance(driver, FilesCapable):
            return await driver.files(record.id)
        # No host-side way in (a pod): the sandbox's own supervisor does the operations.
        session = self._manager.sessions.get(record.id)
        if session is None:
            raise phases.not_servable(f"{record.workspace}/{record.name}", record.status, operation="file operation")
        return SessionFiles(session, chunk_bytes=self._config.chunk_bytes)

    @streaming
    async def ReadFile(self, request: pb.FileRef, context: Ctx) -> AsyncIterator[pb.FileChunk]:
        await self._auth.require_client(context)
        path = normalize_path(request.path)
        if self._forwarder is not None and (target := await self._owner(request.workspace, request.name, context)):
            async for chunk in self._forwarder.unary_stream(
                target, _SERVICE + "ReadFile", request, pb.FileChunk.FromString, context
            ):
                yield chunk
            return
        files = await self._files(request.workspace, request.name, context)
        chunks = files.read(path, self._config.chunk_bytes, self._config.max_file_bytes)
        try:
            async for data in chunks:
                yield pb.FileChunk(data=data)
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]

    @unary
    async def WriteFile(
        self, request_iterator: AsyncIterator[pb.WriteFileRequest], context: Ctx
    ) -> pb.WriteFileResponse:
        await self._auth.require_client(context)
        async with _refused_once_sent(request_iterator, context, "WriteFile"):
            first = await _header_first(request_iterator, "a write")
            header = first.header
            path = normalize_path(header.path)
            mode = _mode(header.mode, DEFAULT_FILE_MODE, "mode")
            if self._forwarder is not None and (target := await self._owner(header.workspace, header.name, context)):
                return await self._forwarder.stream_unary(
                    target,
                    _SERVICE + "WriteFile",
                    _replayed(first, request_iterator),
                    pb.WriteFileResponse.FromString,
                    context,
                )
            files = await self._files(header.workspace, header.name, context)
            chunks = _data(request_iterator, "a write")
            written = await files.write(
                path, chunks, mode=mode, make_parents=header.make_parents, max_bytes=self._config.max_file_bytes
            )
        return pb.WriteFileResponse(bytes_written=written)

    @unary
    async def StatFile(self, request: pb.FileRef, context: Ctx) -> pb.FileInfo:
        await self._auth.require_client(context)
        path = normalize_path(request.path)
        if self._forwarder is not None and (target := await self._owner(request.workspace, request.name, context)):
            return await self._forwarder.unary_unary(
                target, _SERVICE + "StatFile", request, pb.FileInfo.FromString, context
            )
        files = await self._files(request.workspace, request.name, context)
        return entry_to_proto(await files.stat(path))

    @unary
    async def ListFiles(self, request: pb.FileRef, context: Ctx) -> pb.ListFilesResponse:
        await self._auth.require_client(context)
        path = normalize_path(request.path)
        if self._forwarder is not None and (target := await self._owner(request.workspace, request.name, context)):
            return await self._forwarder.unary_unary(
                target, _SERVICE + "ListFiles", request, pb.ListFilesResponse.FromString, context
            )
        files = await self._files(request.workspace, request.name, context)
        return pb.ListFilesResponse(entries=[entry_to_proto(e) for e in await files.list(path)])

    @unary
    async def RemoveFile(self, request: pb.RemoveFileRequest, context: Ctx) -> pb.RemoveFileResponse:
        await self._auth.require_client(context)
        path = normalize_path(request.file.path, "file.path")
        if self._forwarder is not None and (
            target := await self._owner(request.file.workspace, request.file.name, context)
        ):
            return await self._forwarder.unary_unary(
                target, _SERVICE + "RemoveFile", request, pb.RemoveFileResponse.FromString, context
            )
        files = await self._files(request.file.workspace, request.file.name, context)
        await files.remove(path, recursive=request.recursive)
        return pb.RemoveFileResponse()

    @unary
    async def MakeDirectory(self, request: pb.MakeDirectoryRequest, context: Ctx) -> pb.FileInfo:
        await self._auth.require_client(context)
        path = normalize_path(request.directory.path, "directory.path")
        mode = _mode(request.mode, DEFAULT_DIR_MODE, "mode")
        if self._forwarder is not None and (
            target := await self._owner(request.directory.workspace, request.directory.name, context)
        ):
            return await self._forwarder.unary_unary(
                target, _SERVICE + "MakeDirectory", request, pb.FileInfo.FromString, context
            )
        files = await self._files(request.directory.workspace, request.directory.name, context)
        return entry_to_proto(await files.mkdir(path, parents=request.parents, mode=mode))

    @unary
    async def UploadTar(
        self, request_iterator: AsyncIterator[pb.UploadTarRequest], context: Ctx
    ) -> pb.UploadTarResponse:
        await self._auth.require_client(context)
        async with _refused_once_sent(request_iterator, context, "UploadTar"):
            first = await _header_first(request_iterator, "an upload")
            header = first.header
            path = normalize_path(header.path)
            if self._forwarder is not None and (target := await self._owner(header.workspace, header.name, context)):
                return await self._forwarder.stream_unary(
                    target,
                    _SERVICE + "UploadTar",
                    _replayed(first, request_iterator),
                    pb.UploadTarResponse.FromString,
                    context,
                )
            files = await self._files(header.workspace, header.name, context)
            summary = await files.write_archive(path, _data(request_iterator, "an upload"), self.archive_limits())
        return pb.UploadTarResponse(entries=summary.entries, bytes_written=summary.bytes_written)

    @streaming
    async def DownloadTar(self, request: pb.FileRef, context: Ctx) -> AsyncIterator[pb.FileChunk]:
        await self._auth.require_client(context)
        path = normalize_path(request.path)
        if self._forwarder is not None and (target := await self._owner(request.workspace, request.name, context)):
            async for chunk in self._forwarder.unary_stream(
                target, _SERVICE + "DownloadTar", request, pb.FileChunk.FromString, context
            ):
                yield chunk
            return
        files = await self._files(request.workspace, request.name, context)
        chunks = files.read_archive(path, self._config.chunk_bytes, self.archive_limits())
        try:
            async for data in chunks:
                yield pb.FileChunk(data=data)
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]

    @unary
    async def OpenFileTransfer(self, request: pb.FileTransferRequest, context: Ctx) -> pb.FileTransferTicket:
        await self._auth.require_client(context)
        ref = request.file
        path = normalize_path(ref.path, "file.path")
        direction = _DIRECTIONS.get(request.direction)
        if direction is None:
            raise InvalidArgumentError(
                "direction", "must be one of TRANSFER_DIRECTION_UPLOAD, _DOWNLOAD, _UPLOAD_ARCHIVE, _DOWNLOAD_ARCHIVE"
            )
        mode = _mode(request.mode, DEFAULT_FILE_MODE, "mode")
        limit = self._config.max_file_bytes
        # An archive's own bytes: its files' plus a header per entry (as a pod's supervisor bounds them).
        bound = (
            limit + 2048 * (self._config.max_archive_entries + 1) if direction is Direction.UPLOAD_ARCHIVE else limit
        )
        if direction in (Direction.UPLOAD, Direction.UPLOAD_ARCHIVE) and request.size > bound:
            raise ResourceExhaustedError(f"{path}: {request.size} bytes, over the limit of {bound}")
        stream = self._stream
        if stream is None:
            return pb.FileTransferTicket()  # not offered: the client uses WriteFile/ReadFile
        if self._forwarder is not None and await self._owner(ref.workspace, ref.name, context):
            return pb.FileTransferTicket()  # another replica holds it: gRPC forwards there
        record = await self._record(ref.workspace, ref.name, "file.name")
        files = await self._files_of(record)  # Ready, else refused here
        if not isinstance(files, SocketFiles):
            return pb.FileTransferTicket()
        if direction is Direction.DOWNLOAD and request.inline_max_bytes:
            content = await self._small(files, path, min(request.inline_max_bytes, INLINE_MAX_BYTES, limit))
            if content is not None:
                return pb.FileTransferTicket(content=content)
        grant = Grant(record.id, path, direction, request.size, limit, mode, request.make_parents)
        ticket, expires = stream.book.issue(grant)
        return pb.FileTransferTicket(
            ticket=ticket,
            unix_socket=stream.unix_path.name if stream.unix_path is not None else "",
            tcp_port=stream.tcp_port,
            expires_ms=int((time.time() + expires - time.monotonic()) * 1000),
        )

    async def _small(self, files: SandboxFiles, path: str, bound: int) -> bytes | None:
        """The file's bytes when it has at most `bound`, read by the driver's confined reader
        with its checks (a regular file under the sandbox's root, the size bound before any
        byte, a file that grows while read); None when it is larger (a ticket then)."""
        chunks = files.read(path, self._config.chunk_bytes, bound)
        try:
            return b"".join([data async for data in chunks])
        except ResourceExhaustedError:
            return None
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]

    def archive_limits(self) -> ArchiveLimits:
        """The bounds of one archive transfer."""
        return ArchiveLimits(max_entries=self._config.max_archive_entries, max_bytes=self._config.max_file_bytes)
