"""`sandbox.files`: the SDK's file operations on one sandbox, sync (`Files`) and async
(`AsyncFiles`), over the gateway's FileService.

Self-contained on purpose: each class takes a channel, the sandbox's name and workspace, the call
metadata (the bearer token) and a `translate` hook that turns a failed RPC into the SDK's own
exception (the client passes its error mapping; without one the `grpc.RpcError` is raised). Data
moves in chunks both ways, so `upload`/`download` of any size keep memory flat.
"""

from __future__ import annotations

import asyncio
import io
import os
import tempfile
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NoReturn, cast

import grpc
from grpc import aio

from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.api.v1 import sandbox_pb2_grpc
from warmshell.core.archives import regroup
from warmshell.core.transfers import INLINE_MAX_BYTES, Status
from warmshell.sdk import archives, queueing, transfers
from warmshell.sdk.transfers import TRANSFER_MIN_BYTES

__all__ = ["CHUNK_BYTES", "AsyncFiles", "FileInfo", "Files", "TransferSummary", "Translate"]

# Below the gateway's default max_request_bytes (1 MiB) with room for the message's framing.
CHUNK_BYTES = 256 * 1024
_UP, _DOWN, _UP_ARCHIVE, _DOWN_ARCHIVE = (
    pb.TRANSFER_DIRECTION_UPLOAD,
    pb.TRANSFER_DIRECTION_DOWNLOAD,
    pb.TRANSFER_DIRECTION_UPLOAD_ARCHIVE,
    pb.TRANSFER_DIRECTION_DOWNLOAD_ARCHIVE,
)
Metadata = tuple[tuple[str, str], ...]
# A failed RPC -> the exception the caller sees.
Translate = Callable[[grpc.RpcError], BaseException]


@dataclass(frozen=True)
class FileInfo:
    """One entry: `type` is "file", "directory", "symlink" or "other"; `mode` the permission bits."""

    name: str
    type: str
    size: int
    mode: int
    mtime_ms: int
    link_target: str = ""

    @classmethod
    def from_proto(cls, info: pb.FileInfo) -> FileInfo:
        """From the wire form."""
        return cls(info.name, info.type, info.size, info.mode, info.mtime_ms, info.link_target)


@dataclass(frozen=True)
class TransferSummary:
    """What a bulk transfer moved: entries (files, directories, links) and the files' bytes."""

    entries: int
    bytes_written: int


def _as_bytes(data: str | bytes) -> bytes:
    return data.encode() if isinstance(data, str) else data


def _pieces(data: bytes, chunk_bytes: int) -> Iterator[bytes]:
    view = memoryview(data)
    for start in range(0, len(data), chunk_bytes):
        yield bytes(view[start : start + chunk_bytes])


def _local_chunks(local_path: str | os.PathLike[str], chunk_bytes: int) -> Iterator[bytes]:
    with open(local_path, "rb") as handle:
        while chunk := handle.read(chunk_bytes):
            yield chunk


class _Target:
    """What every call names: the sandbox, its workspace, and how to authenticate; and whether
    the gateway's byte stream is worth asking for (`address`: the gateway's, "" = never ask)."""

    def __init__(
        self,
        name: str,
        workspace: str,
        metadata: Metadata,
        translate: Translate | None,
        chunk_bytes: int,
        address: str = "",
    ) -> None:
        self._name = name
        self._workspace = workspace
        self._metadata = metadata
        self._translate = translate
        self._chunk_bytes = chunk_bytes
        self._address = address
        # Cleared once the gateway offers no stream for this sandbox or it cannot be reached.
        self._streaming = bool(address)

    def _transfer(
        self, path: str, direction: pb.TransferDirection.ValueType, size: int = 0, mode: int = 0, parents: bool = True
    ) -> Any:
        inline = INLINE_MAX_BYTES if direction == _DOWN else 0
        return pb.FileTransferRequest(
            file=self._ref(path),
            direction=direction,
            size=size,
            mode=mode,
            make_parents=parents,
            inline_max_bytes=inline,
        )

    def _endpoint_of(self, reply: pb.FileTransferTicket | None) -> transfers.Endpoint | None:
        where = transfers.endpoint(self._address, reply) if reply is not None else None
        self._streaming = where is not None
        return where

    def _answer(self, reply: pb.FileTransferTicket | None) -> bytes | transfers.Endpoint | None:
        """What a download's OpenFileTransfer said: a small file's bytes, the endpoint of its
        ticket, or None (use gRPC)."""
        if reply is not None and reply.HasField("content"):
            return reply.content
        return self._endpoint_of(reply)

    def _unimplemented(self, exc: grpc.RpcError) -> None:
        """Nothing for a gateway that does not know OpenFileTransfer (older): gRPC it is."""
        if cast(grpc.Call, exc).code() is not grpc.StatusCode.UNIMPLEMENTED:
            self._fail(exc)

    def _ref(self, path: str) -> pb.FileRef:
        return pb.FileRef(name=self._name, workspace=self._workspace, path=path)

    def _header(self, path: str, mode: int, make_parents: bool) -> pb.WriteFileRequest:
        header = pb.WriteFileHeader(
            name=self._name, workspace=self._workspace, path=path, mode=mode, make_parents=make_parents
        )
        return pb.WriteFileRequest(header=header)

    def _upload_header(self, path: str) -> pb.UploadTarRequest:
        return pb.UploadTarRequest(header=pb.UploadTarHeader(name=self._name, workspace=self._workspace, path=path))

    def _fail(self, exc: grpc.RpcError) -> NoReturn:
        if self._translate is None:
            raise exc
        raise self._translate(exc) from None


class Files(_Target):
    """Sync file operations on one sandbox (thread-safe: it holds no state between calls)."""

    def __init__(
        self,
        channel: grpc.Channel,
        name: str,
        workspace: str = "",
        *,
        metadata: Metadata = (),
        translate: Translate | None = None,
        chunk_bytes: int = CHUNK_BYTES,
        address: str = "",
    ) -> None:
        """`channel`: the client's channel to the gateway; `metadata`: its authorization;
        `address`: the gateway's, to reach its byte stream ("" = gRPC only)."""
        super().__init__(name, workspace, metadata, translate, chunk_bytes, address)
        self._stub = sandbox_pb2_grpc.FileServiceStub(channel)

    def _endpoint(self, request: pb.FileTransferRequest) -> transfers.Endpoint | None:
        """A ticket's endpoint when the gateway offers its byte stream, else None (use gRPC)."""
        return self._endpoint_of(self._ticket(request))

    def _ticket(self, request: pb.FileTransferRequest) -> pb.FileTransferTicket | None:
        """OpenFileTransfer's reply, or None when the stream is not asked for or not known."""
        if not self._streaming:
            return None
        try:
            return self._stub.OpenFileTransfer(request, metadata=self._metadata)
        except grpc.RpcError as exc:
            self._unimplemented(exc)
            return None

    def _stream_upload(self, path: str, source: bytes | IO[bytes], size: int, mode: int, parents: bool) -> int | None:
        """The bytes written over the byte stream, or None when it is not to be had."""
        where = self._endpoint(self._transfer(path, _UP, size, mode, parents)) if size >= TRANSFER_MIN_BYTES else None
        if where is None:
            return None
        try:
            return transfers.upload(where, source).size
        except transfers.Unreachable:
            self._streaming = False
            return None

    def read(self, path: str) -> bytes:
        """The whole content of a regular file."""
        where = self._answer(self._ticket(self._transfer(path, _DOWN)))
        if isinstance(where, bytes):
            return where
        if where is not None:
            try:
                return transfers.download_whole(where)
            except transfers.Unreachable:
                self._streaming = False
        return b"".join(self._called(path, self._stub.ReadFile))

    def read_chunks(self, path: str) -> Iterator[bytes]:
        """The content in chunks, as they arrive."""
        return self._received(path, _DOWN, transfers.download, self._stub.ReadFile)

    def _received(
        self,
        path: str,
        direction: pb.TransferDirection.ValueType,
        streamed: Callable[[transfers.Endpoint], Iterator[bytes]],
        call: Callable[..., Any],  # a stub's server-streaming method
    ) -> Iterator[bytes]:
        """A download over the byte stream when the gateway offers it (a small file's bytes
        in its reply), else over `call`."""
        where = self._answer(self._ticket(self._transfer(path, direction)))
        if isinstance(where, bytes):
            if where:
                yield where
            return
        if where is not None:
            try:
                yield from streamed(where)
                return
            except transfers.Unreachable:  # raised before any byte: gRPC from the start
                self._streaming = False
        yield from self._called(path, call)

    def _called(self, path: str, call: Callable[..., Any]) -> Iterator[bytes]:
        """A download over gRPC's messages."""
        try:
            for chunk in call(self._ref(path), metadata=self._metadata):
                yield chunk.data
        except grpc.RpcError as exc:
            self._fail(exc)

    def write(self, path: str, data: str | bytes, *, mode: int = 0, make_parents: bool = True) -> int:
        """Create or replace a file (atomically; parents created by default); the bytes written."""
        content = _as_bytes(data)
        written = self._stream_upload(path, content, len(content), mode, make_parents)
        if written is not None:
            return written
        return self.write_chunks(path, _pieces(content, self._chunk_bytes), mode=mode, make_parents=make_parents)

    def write_chunks(self, path: str, chunks: Iterator[bytes], *, mode: int = 0, make_parents: bool = True) -> int:
        """`write` from an iterator of chunks (each at most the gateway's max request size)."""

        def requests() -> Iterator[pb.WriteFileRequest]:
            yield self._header(path, mode, make_parents)
            for chunk in chunks:
                yield pb.WriteFileRequest(data=chunk)

        try:
            return int(self._stub.WriteFile(requests(), metadata=self._metadata).bytes_written)
        except grpc.RpcError as exc:
            self._fail(exc)

    def upload(self, local_path: str | os.PathLike[str], path: str, *, mode: int = 0, make_parents: bool = True) -> int:
        """Copy a local file into the sandbox, a chunk at a time; the bytes written."""
        with open(local_path, "rb") as handle:
            written = self._stream_upload(path, handle, transfers.file_size(handle), mode, make_parents)
        if written is not None:
            return written
        return self.write_chunks(
            path, _local_chunks(local_path, self._chunk_bytes), mode=mode, make_parents=make_parents
        )

    def download(self, path: str, local_path: str | os.PathLike[str]) -> int:
        """Copy a file out of the sandbox into `local_path` (replaced only once complete)."""
        target = Path(local_path)
        partial = target.with_name(f".{target.name}.partial")
        try:
            with open(partial, "wb") as handle:
                size = self._download_to(path, handle)
            partial.replace(target)
        finally:
            partial.unlink(missing_ok=True)
        return size

    def _download_to(self, path: str, handle: IO[bytes]) -> int:
        where = self._answer(self._ticket(self._transfer(path, _DOWN)))
        if isinstance(where, bytes):
            return handle.write(where)
        if where is not None:
            try:
                return transfers.download_to_file(where, handle)
            except transfers.Unreachable:
                self._streaming = False
        size = 0
        for chunk in self._called(path, self._stub.ReadFile):
            size += handle.write(chunk)
        return size

    def list(self, path: str) -> list[FileInfo]:
        """A directory's entries, sorted by name."""
        try:
            response = self._stub.ListFiles(self._ref(path), metadata=self._metadata)
        except grpc.RpcError as exc:
            self._fail(exc)
        return [FileInfo.from_proto(e) for e in response.entries]

    def stat(self, path: str) -> FileInfo:
        """One entry (a final symlink is reported, not followed)."""
        try:
            return FileInfo.from_proto(self._stub.StatFile(self._ref(path), metadata=self._metadata))
        except grpc.RpcError as exc:
            self._fail(exc)

    def remove(self, path: str, *, recursive: bool = False) -> None:
        """Remove a file, a symlink, an empty directory, or (recursive) a whole tree."""
        try:
            self._stub.RemoveFile(
                pb.RemoveFileRequest(file=self._ref(path), recursive=recursive), metadata=self._metadata
            )
        except grpc.RpcError as exc:
            self._fail(exc)

    def mkdir(self, path: str, *, parents: bool = True, mode: int = 0) -> FileInfo:
        """Create a directory (by default like mkdir -p)."""
        request = pb.MakeDirectoryRequest(directory=self._ref(path), parents=parents, mode=mode)
        try:
            return FileInfo.from_proto(self._stub.MakeDirectory(request, metadata=self._metadata))
        except grpc.RpcError as exc:
            self._fail(exc)

    def upload_tar(self, archive: IO[bytes] | Iterable[bytes], path: str) -> TransferSummary:
        """Unpack a tar (a binary file, or an iterable of its bytes) below the directory `path`
        in one call: directories, files and symbolic links, with modes and mtimes."""
        return self._upload(path, archives.pieces_of(archive, self._chunk_bytes))

    def upload_dir(self, local: str | os.PathLike[str], path: str) -> TransferSummary:
        """Copy a local directory's contents below `path` (like `cp -r local/. path`), in one
        call (over the byte stream its larger files are sent from the files themselves)."""
        plan = archives.plan_directory(local)
        size = archives.planned_size(plan)
        where = self._endpoint(self._transfer(path, _UP_ARCHIVE, size)) if size >= TRANSFER_MIN_BYTES else None
        if where is not None:
            try:
                return _summary(transfers.upload_planned(where, plan))
            except transfers.Unreachable:
                self._streaming = False
        return self._upload_tar(path, archives.pack_plan(plan))

    def write_files(self, files: Mapping[str, str | bytes], *, mode: int = 0o644) -> TransferSummary:
        """Write several files (absolute path -> content) in one call; parents are created."""
        destination = archives.common_directory(files)
        return self._upload(destination, archives.pack_files(files, destination, mode))

    def _upload(self, path: str, pieces: Iterator[bytes]) -> TransferSummary:
        if not self._streaming:
            return self._upload_tar(path, pieces)
        size, spooled = transfers.spool(pieces)
        try:
            where = self._endpoint(self._transfer(path, _UP_ARCHIVE, size)) if size >= TRANSFER_MIN_BYTES else None
            if where is not None:
                try:
                    return _summary(transfers.upload(where, spooled))
                except transfers.Unreachable:
                    self._streaming = False
            return self._upload_tar(path, transfers.pieces_of(spooled, self._chunk_bytes))
        finally:
            if not isinstance(spooled, bytes):
                spooled.close()

    def _upload_tar(self, path: str, pieces: Iterator[bytes]) -> TransferSummary:
        def requests() -> Iterator[pb.UploadTarRequest]:
            yield self._upload_header(path)
            for chunk in regroup(pieces, self._chunk_bytes):
                yield pb.UploadTarRequest(data=chunk)

        try:
            response = self._stub.UploadTar(requests(), metadata=self._metadata)
        except grpc.RpcError as exc:
            self._fail(exc)
        return TransferSummary(int(response.entries), int(response.bytes_written))

    def download_tar(self, path: str) -> Iterator[bytes]:
        """The tar of the directory (its entries, named relative to it) or file at `path`, in
        chunks as they arrive."""
        return self._received(path, _DOWN_ARCHIVE, transfers.download_archive, self._stub.DownloadTar)

    def download_dir(self, path: str, local: str | os.PathLike[str]) -> TransferSummary:
        """Copy the directory `path` into the local directory `local` (made when missing), in
        one call, unpacked as it arrives (a failure half-way leaves what came before it); what
        would land outside `local` is refused."""
        where = self._endpoint(self._transfer(path, _DOWN_ARCHIVE))
        if where is not None:
            try:
                return TransferSummary(*transfers.download_archive_into(where, local))
            except transfers.Unreachable:
                self._streaming = False
        reader = io.BufferedReader(archives.ChunkReader(self._called(path, self._stub.DownloadTar)))
        return TransferSummary(*archives.unpack_into(reader, local))


class AsyncFiles(_Target):
    """The same operations, awaited (`read_chunks` is an async iterator)."""

    def __init__(
        self,
        channel: aio.Channel,
        name: str,
        workspace: str = "",
        *,
        metadata: Metadata = (),
        translate: Translate | None = None,
        chunk_bytes: int = CHUNK_BYTES,
        open_call: queueing.CallOpener = queueing.open_now,
        address: str = "",
    ) -> None:
        """`channel`: the client's aio channel to the gateway; `metadata`: its authorization;
        `open_call` starts a write when the client's limit of streams allows; `address`: the
        gateway's, to reach its byte stream ("" = gRPC only)."""
        super().__init__(name, workspace, metadata, translate, chunk_bytes, address)
        self._stub = sandbox_pb2_grpc.FileServiceStub(channel)
        self._open_call = open_call

    async def _endpoint(self, request: pb.FileTransferRequest) -> transfers.Endpoint | None:
        """A ticket's endpoint when the gateway offers its byte stream, else None (use gRPC)."""
        return self._endpoint_of(await self._ticket(request))

    async def _ticket(self, request: pb.FileTransferRequest) -> pb.FileTransferTicket | None:
        """OpenFileTransfer's reply, or None when the stream is not asked for or not known."""
        if not self._streaming:
            return None
        try:
            return await self._stub.OpenFileTransfer(request, metadata=self._metadata)
        except grpc.RpcError as exc:
            self._unimplemented(exc)
            return None

    async def _stream_upload(
        self, path: str, source: bytes | IO[bytes], size: int, mode: int, parents: bool
    ) -> int | None:
        """The bytes written over the byte stream, or None when it is not to be had."""
        if (
            size < TRANSFER_MIN_BYTES
            or (where := await self._endpoint(self._transfer(path, _UP, size, mode, parents))) is None
        ):
            return None
        try:
            return (await transfers.upload_async(where, source)).size
        except transfers.Unreachable:
            self._streaming = False
            return None

    async def read(self, path: str) -> bytes:
        """The whole content of a regular file (off the byte stream in a thread, with a blocking
        socket: one receive into one buffer)."""
        where = self._answer(await self._ticket(self._transfer(path, _DOWN)))
        if isinstance(where, bytes):
            return where
        if where is not None:
            try:
                return await asyncio.to_thread(transfers.download_whole, where)
            except transfers.Unreachable:
                self._streaming = False
        return b"".join([chunk async for chunk in self._called(path, self._stub.ReadFile)])

    def read_chunks(self, path: str) -> AsyncIterator[bytes]:
        """The content in chunks, as they arrive."""
        return self._received(path, _DOWN, transfers.download_async, self._stub.ReadFile)

    async def _received(
        self,
        path: str,
        direction: pb.TransferDirection.ValueType,
        streamed: Callable[[transfers.Endpoint], AsyncIterator[bytes]],
        call: Callable[..., Any],  # a stub's server-streaming method
    ) -> AsyncIterator[bytes]:
        """A download over the byte stream when the gateway offers it (a small file's bytes
        in its reply), else over `call`."""
        where = self._answer(await self._ticket(self._transfer(path, direction)))
        if isinstance(where, bytes):
            if where:
                yield where
            return
        if where is not None:
            try:
                async for data in streamed(where):
                    yield data
                return
            except transfers.Unreachable:  # raised before any byte: gRPC from the start
                self._streaming = False
        async for data in self._called(path, call):
            yield data

    async def _called(self, path: str, call: Callable[..., Any]) -> AsyncIterator[bytes]:
        """A download over gRPC's messages."""
        try:
            async for chunk in call(self._ref(path), metadata=self._metadata):
                yield chunk.data
        except grpc.RpcError as exc:
            self._fail(exc)

    async def write(self, path: str, data: str | bytes, *, mode: int = 0, make_parents: bool = True) -> int:
        """Create or replace a file (atomically; parents created by default); the bytes written."""
        content = _as_bytes(data)
        written = await self._stream_upload(path, content, len(content), mode, make_parents)
        if written is not None:
            return written
        return await self._write(path, _pieces(content, self._chunk_bytes), mode, make_parents)

    async def write_chunks(
        self, path: str, chunks: Iterator[bytes], *, mode: int = 0, make_parents: bool = True
    ) -> int:
        """`write` from an iterator of chunks (each at most the gateway's max request size)."""
        return await self._write(path, chunks, mode, make_parents)

    async def upload(
        self, local_path: str | os.PathLike[str], path: str, *, mode: int = 0, make_parents: bool = True
    ) -> int:
        """Copy a local file into the sandbox, a chunk at a time; the bytes written."""
        handle = await asyncio.to_thread(open, local_path, "rb")
        try:
            written = await self._stream_upload(path, handle, transfers.file_size(handle), mode, make_parents)
            if written is not None:
                return written

            def chunks() -> Iterator[bytes]:
                while chunk := handle.read(self._chunk_bytes):
                    yield chunk

            return await self._write(path, chunks(), mode, make_parents, blocking=True)
        finally:
            handle.close()

    async def _write(
        self, path: str, chunks: Iterator[bytes], mode: int, make_parents: bool, *, blocking: bool = False
    ) -> int:
        call = await self._open_call(lambda: self._stub.WriteFile(metadata=self._metadata))  # type: ignore[call-arg]
        messages = (pb.WriteFileRequest(data=chunk) for chunk in chunks)
        response = await self._send(call, self._header(path, mode, make_parents), _pulled(messages, blocking))
        return int(response.bytes_written)

    async def _send(self, call: Any, header: Any, messages: AsyncIterator[Any]) -> Any:
        """Write the header and the messages on a client-streaming call; its response. The
        call's own write(): an early end by the gateway then surfaces as its status."""
        try:
            await call.write(header)
            async for message in messages:
                await call.write(message)
            await call.done_writing()
        except (grpc.RpcError, asyncio.InvalidStateError):
            pass  # the gateway ended the call early; its status (the real cause) follows
        try:
            return await call
        except grpc.RpcError as exc:
            self._fail(exc)

    async def upload_tar(
        self, archive: IO[bytes] | Iterable[bytes] | AsyncIterable[bytes], path: str
    ) -> TransferSummary:
        """Unpack a tar (a binary file, an iterable or an async iterable of its bytes) below the
        directory `path` in one call: directories, files and symbolic links, with modes and mtimes."""
        if isinstance(archive, AsyncIterable):
            return await self._upload(path, archive)
        return await self._upload_pieces(path, archives.pieces_of(archive, self._chunk_bytes), blocking=True)

    async def upload_dir(self, local: str | os.PathLike[str], path: str) -> TransferSummary:
        """Copy a local directory's contents below `path` (like `cp -r local/. path`), in one
        call: walked in a thread, and over the byte stream sent in a thread too, its larger
        files from the files themselves."""
        plan = await asyncio.to_thread(archives.plan_directory, local)
        size = archives.planned_size(plan)
        if size >= TRANSFER_MIN_BYTES and (where := await self._endpoint(self._transfer(path, _UP_ARCHIVE, size))):
            try:
                return _summary(await asyncio.to_thread(transfers.upload_planned, where, plan))
            except transfers.Unreachable:
                self._streaming = False
        return await self._upload(path, _pulled(regroup(archives.pack_plan(plan), self._chunk_bytes), True))

    async def write_files(self, files: Mapping[str, str | bytes], *, mode: int = 0o644) -> TransferSummary:
        """Write several files (absolute path -> content) in one call; parents are created."""
        destination = archives.common_directory(files)
        pieces = archives.pack_files(files, destination, mode)
        return await self._upload_pieces(destination, pieces, blocking=False)

    async def _upload_pieces(self, path: str, pieces: Iterator[bytes], *, blocking: bool) -> TransferSummary:
        """An archive's pieces (read in a thread when `blocking`), over the byte stream when the
        gateway offers it (gathered first: its size goes in the ticket), else over UploadTar."""
        if not self._streaming:
            return await self._upload(path, _pulled(regroup(pieces, self._chunk_bytes), blocking))
        size, spooled = await asyncio.to_thread(transfers.spool, pieces) if blocking else transfers.spool(pieces)
        try:
            if size >= TRANSFER_MIN_BYTES and (where := await self._endpoint(self._transfer(path, _UP_ARCHIVE, size))):
                try:
                    return _summary(await transfers.upload_async(where, spooled))
                except transfers.Unreachable:
                    self._streaming = False
            again = transfers.pieces_of(spooled, self._chunk_bytes)
            return await self._upload(path, _pulled(again, not isinstance(spooled, bytes)))
        finally:
            if not isinstance(spooled, bytes):
                spooled.close()

    async def _upload(self, path: str, chunks: AsyncIterable[bytes]) -> TransferSummary:
        call = await self._open_call(lambda: self._stub.UploadTar(metadata=self._metadata))  # type: ignore[call-arg]
        messages = (pb.UploadTarRequest(data=chunk) async for chunk in chunks)
        response = await self._send(call, self._upload_header(path), messages)
        return TransferSummary(int(response.entries), int(response.bytes_written))

    def download_tar(self, path: str) -> AsyncIterator[bytes]:
        """The tar of the directory (its entries, named relative to it) or file at `path`, in
        chunks as they arrive."""
        return self._received(path, _DOWN_ARCHIVE, transfers.download_archive_async, self._stub.DownloadTar)

    async def download_dir(self, path: str, local: str | os.PathLike[str]) -> TransferSummary:
        """Copy the directory `path` into the local directory `local` (made when missing), in
        one call; what would land outside `local` is refused. Over the byte stream the archive
        is unpacked in a thread straight off its socket (a failure half-way leaves what came
        before it); over gRPC it is spooled (in memory up to 16 MiB, then on disk), then
        unpacked in a thread, off the event loop."""
        where = await self._endpoint(self._transfer(path, _DOWN_ARCHIVE))
        if where is not None:
            try:
                return TransferSummary(*await asyncio.to_thread(transfers.download_archive_into, where, local))
            except transfers.Unreachable:
                self._streaming = False
        with tempfile.SpooledTemporaryFile(16 * 1024 * 1024) as spool:
            async for chunk in self._called(path, self._stub.DownloadTar):
                spool.write(chunk)  # page cache once on disk: cheap enough for the loop
            spool.seek(0)
            return TransferSummary(*await asyncio.to_thread(archives.unpack_into, spool, local))

    async def download(self, path: str, local_path: str | os.PathLike[str]) -> int:
        """Copy a file out of the sandbox into `local_path` (replaced only once complete)."""
        target = Path(local_path)
        partial = target.with_name(f".{target.name}.partial")
        handle = await asyncio.to_thread(open, partial, "wb")
        try:
            size = await self._download_to(path, handle)
            handle.close()
            await asyncio.to_thread(partial.replace, target)
        finally:
            handle.close()
            await asyncio.to_thread(partial.unlink, True)
        return size

    async def _download_to(self, path: str, handle: IO[bytes]) -> int:
        """A download into `handle`: over the byte stream in one thread, off its socket."""
        where = self._answer(await self._ticket(self._transfer(path, _DOWN)))
        if isinstance(where, bytes):
            return await asyncio.to_thread(handle.write, where)
        if where is not None:
            try:
                return await asyncio.to_thread(transfers.download_to_file, where, handle)
            except transfers.Unreachable:
                self._streaming = False
        size = 0
        async for chunk in self._called(path, self._stub.ReadFile):
            size += await asyncio.to_thread(handle.write, chunk)
        return size

    async def list(self, path: str) -> list[FileInfo]:
        """A directory's entries, sorted by name."""
        try:
            response = await self._stub.ListFiles(self._ref(path), metadata=self._metadata)
        except grpc.RpcError as exc:
            self._fail(exc)
        return [FileInfo.from_proto(e) for e in response.entries]

    async def stat(self, path: str) -> FileInfo:
        """One entry (a final symlink is reported, not followed)."""
        try:
            return FileInfo.from_proto(await self._stub.StatFile(self._ref(path), metadata=self._metadata))
        except grpc.RpcError as exc:
            self._fail(exc)

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        """Remove a file, a symlink, an empty directory, or (recursive) a whole tree."""
        request = pb.RemoveFileRequest(file=self._ref(path), recursive=recursive)
        try:
            await self._stub.RemoveFile(request, metadata=self._metadata)
        except grpc.RpcError as exc:
            self._fail(exc)

    async def mkdir(self, path: str, *, parents: bool = True, mode: int = 0) -> FileInfo:
        """Create a directory (by default like mkdir -p)."""
        request = pb.MakeDirectoryRequest(directory=self._ref(path), parents=parents, mode=mode)
        try:
            return FileInfo.from_proto(await self._stub.MakeDirectory(request, metadata=self._metadata))
        except grpc.RpcError as exc:
            self._fail(exc)


def _summary(status: Status) -> TransferSummary:
    return TransferSummary(status.entries, status.size)


async def _pulled(items: Iterator[Any], blocking: bool) -> AsyncIterator[Any]:
    """An iterator as an async one. One that may block (a local file, a directory walked) is
    pulled in a thread, a megabyte or so per hop: a hop per 256 KiB chunk cost the client more
    CPU than sending the chunk."""
    while True:
        batch = await asyncio.to_thread(_take, items, _PULL_BATCH) if blocking else _take(items, 1)
        for item in batch:
            yield item
        if len(batch) < (_PULL_BATCH if blocking else 1):
            return


_PULL_BATCH = 4


def _take(items: Iterator[Any], count: int) -> list[Any]:
    """Up to `count` items (fewer only at the end)."""
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == count:
            break
    return batch
