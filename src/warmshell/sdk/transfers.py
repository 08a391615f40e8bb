"""The client's side of the gateway's byte stream (`warmshell.core.transfers`): a file's or an
archive's bytes over a plain socket, admitted by a one-time ticket from `OpenFileTransfer`, sync
and async.

A refusal on the stream raises what the gRPC call would have (`errors.error_for` on the status
name); a stream that cannot be reached at all (a TCP port a tunnel does not carry) raises
`Unreachable`, on which the caller falls back to gRPC.
"""

from __future__ import annotations

import asyncio
import os
import socket
import tempfile
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from typing import IO

from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.core.transfers import (
    FRAME_HEADER_BYTES,
    MAX_FRAME_BYTES,
    MAX_STATUS_BYTES,
    PREFACE,
    Status,
    parse_status,
)
from warmshell.sdk import connection, errors

__all__ = [
    "TRANSFER_MIN_BYTES",
    "Endpoint",
    "Unreachable",
    "download",
    "download_archive",
    "download_archive_async",
    "download_async",
    "endpoint",
    "file_size",
    "pieces_of",
    "spool",
    "upload",
    "upload_async",
]

# Files from this size go over the byte stream when the gateway offers it: below it, the
# ticket's extra round trip and connection cost more than gRPC's messages do.
TRANSFER_MIN_BYTES = 1024 * 1024
RECEIVE_BYTES = 1024 * 1024
# An archive bound for the stream is gathered first (its size goes in the ticket): in memory up
# to this, then in a temporary file.
SPOOL_MEMORY_BYTES = 16 * 1024 * 1024
# A transfer that makes no progress this long fails (the gateway's own bound is 30 s by default).
TIMEOUT_SECONDS = 60.0


class Unreachable(Exception):
    """The byte stream could not be connected to (nothing was transferred)."""


@dataclass(frozen=True)
class Endpoint:
    """Where a ticket is used: a socket family and its address, and the ticket itself."""

    family: int
    address: str | tuple[str, int]
    ticket: bytes
    gateway: str  # the gateway's gRPC address, for errors


def endpoint(gateway: str, reply: pb.FileTransferTicket) -> Endpoint | None:
    """Where to use the ticket in `reply`, reached the way the client reaches the gateway
    (its Unix socket's directory, or its TCP host); None when the gateway offered none."""
    if not reply.ticket:
        return None
    unix = connection.unix_socket_path(gateway)
    if unix is not None:
        if reply.unix_socket in ("", ".", "..") or "/" in reply.unix_socket:
            return None  # a name beside the gateway's socket, nothing else
        return Endpoint(socket.AF_UNIX, str(unix.parent / reply.unix_socket), reply.ticket, gateway)
    if not reply.tcp_port:
        return None
    host = gateway.removeprefix("dns:///").rpartition(":")[0].strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return Endpoint(family, (host or "localhost", reply.tcp_port), reply.ticket, gateway)


def _refused(status: Status, where: Endpoint) -> errors.ApiError:
    return errors.error_for(status.code, status.message, address=where.gateway)


def _cut_short(where: Endpoint, got: int, size: int) -> errors.ApiError:
    return errors.error_for(
        "UNAVAILABLE",
        f"the download ended after {got} of {size} bytes (the file changed, or the gateway stopped); retry",
        address=where.gateway,
    )


class _StatusLine:
    """Bytes up to the status line's newline; what came after it is kept for the caller."""

    def __init__(self) -> None:
        self._data = bytearray()

    def feed(self, data: bytes) -> tuple[Status, bytes] | None:
        """The status and the bytes after it once the line is complete; ValueError past the bound."""
        self._data += data
        end = self._data.find(b"\n")
        if end < 0:
            if not data or len(self._data) > MAX_STATUS_BYTES:
                raise ValueError("the byte stream ended without a status line")
            return None
        return parse_status(bytes(self._data[: end + 1])), bytes(self._data[end + 1 :])


def _connect(where: Endpoint) -> socket.socket:
    sock = socket.socket(where.family, socket.SOCK_STREAM)
    sock.settimeout(TIMEOUT_SECONDS)
    try:
        sock.connect(where.address)
    except OSError as exc:
        sock.close()
        raise Unreachable(str(exc)) from exc
    return sock


def _fed(line: _StatusLine, data: bytes, where: Endpoint) -> tuple[Status, bytes] | None:
    """`line.feed(data)`; a refusal or a line that is not one raised as the SDK's error."""
    try:
        found = line.feed(data)
    except ValueError as exc:
        raise errors.error_for("UNAVAILABLE", str(exc), address=where.gateway) from None
    if found is not None and not found[0].ok:
        raise _refused(found[0], where)
    return found


def _status(sock: socket.socket, where: Endpoint) -> tuple[Status, bytes]:
    line = _StatusLine()
    while (found := _fed(line, sock.recv(MAX_STATUS_BYTES), where)) is None:
        pass
    return found


def upload(where: Endpoint, source: bytes | IO[bytes]) -> Status:
    """Send `source` (the ticket's exact size; a file is sent by sendfile) and return what the
    gateway wrote (bytes; an archive's entries too), once in place."""
    with _connect(where) as sock:
        try:
            sock.sendall(PREFACE + where.ticket)
            if isinstance(source, bytes):
                sock.sendall(source)
            else:
                sock.sendfile(source)
            sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the gateway stopped reading: its status line says why
        return _status(sock, where)[0]


def download(where: Endpoint) -> Iterator[bytes]:
    """The file's bytes as they arrive; exactly its size, or an error."""
    with _connect(where) as sock:
        sock.sendall(PREFACE + where.ticket)
        status, first = _status(sock, where)
        got = len(first)
        if first:
            yield first
        while got < status.size:
            data = sock.recv(min(RECEIVE_BYTES, status.size - got))
            if not data:
                raise _cut_short(where, got, status.size)
            got += len(data)
            yield data


async def _connect_async(where: Endpoint) -> socket.socket:
    sock = socket.socket(where.family, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        async with asyncio.timeout(TIMEOUT_SECONDS):
            await asyncio.get_running_loop().sock_connect(sock, where.address)
    except (OSError, TimeoutError) as exc:
        sock.close()
        raise Unreachable(str(exc)) from exc
    return sock


async def _status_async(sock: socket.socket, where: Endpoint) -> tuple[Status, bytes]:
    loop = asyncio.get_running_loop()
    line = _StatusLine()
    while (found := _fed(line, await loop.sock_recv(sock, MAX_STATUS_BYTES), where)) is None:
        pass
    return found


async def upload_async(where: Endpoint, source: bytes | IO[bytes]) -> Status:
    """`upload`, awaited (a file goes by the event loop's sendfile)."""
    loop = asyncio.get_running_loop()
    with await _connect_async(where) as sock:
        async with asyncio.timeout(TIMEOUT_SECONDS) as deadline:
            try:
                await loop.sock_sendall(sock, PREFACE + where.ticket)
                if isinstance(source, bytes):
                    await loop.sock_sendall(sock, source)
                else:
                    deadline.reschedule(None)  # bounded by the gateway's idle timeout instead
                    await loop.sock_sendfile(sock, source)
                    deadline.reschedule(loop.time() + TIMEOUT_SECONDS)
                sock.shutdown(socket.SHUT_WR)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the gateway stopped reading: its status line says why
            return (await _status_async(sock, where))[0]


async def download_async(where: Endpoint) -> AsyncIterator[bytes]:
    """`download`, as an async iterator (each receive bounded on its own: a timeout around the
    whole generator would fire in whatever its consumer awaits between chunks)."""
    loop = asyncio.get_running_loop()
    with await _connect_async(where) as sock:
        async with asyncio.timeout(TIMEOUT_SECONDS):
            await loop.sock_sendall(sock, PREFACE + where.ticket)
            status, first = await _status_async(sock, where)
        got = len(first)
        if first:
            yield first
        while got < status.size:
            async with asyncio.timeout(TIMEOUT_SECONDS):
                data = await loop.sock_recv(sock, min(RECEIVE_BYTES, status.size - got))
            if not data:
                raise _cut_short(where, got, status.size)
            got += len(data)
            yield data


def _frame_length(header: bytes, where: Endpoint) -> int:
    length = int.from_bytes(header, "big")
    if length > MAX_FRAME_BYTES:
        raise errors.error_for("UNAVAILABLE", f"the byte stream sent a frame of {length} bytes", address=where.gateway)
    return length


def _ended(where: Endpoint) -> errors.ApiError:
    return errors.error_for("UNAVAILABLE", "the archive ended before its end frame; retry", address=where.gateway)


def _receive_exactly(sock: socket.socket, count: int, where: Endpoint) -> bytes:
    data = b""
    while len(data) < count:
        if not (piece := sock.recv(count - len(data))):
            raise _ended(where)
        data += piece
    return data


def download_archive(where: Endpoint) -> Iterator[bytes]:
    """A tar's bytes as they arrive (each frame's as the socket has them: no frame is put back
    together); after the end frame, the gateway's status (a refusal half-way raises here,
    after what came before it)."""
    with _connect(where) as sock:
        sock.sendall(PREFACE + where.ticket)
        while left := _frame_length(_receive_exactly(sock, FRAME_HEADER_BYTES, where), where):
            while left:
                if not (data := sock.recv(min(left, RECEIVE_BYTES))):
                    raise _ended(where)
                left -= len(data)
                yield data
        _status(sock, where)


async def _recv_async(sock: socket.socket, count: int, where: Endpoint) -> bytes:
    async with asyncio.timeout(TIMEOUT_SECONDS):
        data = await asyncio.get_running_loop().sock_recv(sock, count)
    if not data:
        raise _ended(where)
    return data


async def download_archive_async(where: Endpoint) -> AsyncIterator[bytes]:
    """`download_archive`, as an async iterator."""
    loop = asyncio.get_running_loop()
    with await _connect_async(where) as sock:
        await loop.sock_sendall(sock, PREFACE + where.ticket)
        while True:
            header = b""
            while len(header) < FRAME_HEADER_BYTES:
                header += await _recv_async(sock, FRAME_HEADER_BYTES - len(header), where)
            if not (left := _frame_length(header, where)):
                break
            while left:
                data = await _recv_async(sock, min(left, RECEIVE_BYTES), where)
                left -= len(data)
                yield data
        async with asyncio.timeout(TIMEOUT_SECONDS):
            await _status_async(sock, where)


def spool(pieces: Iterable[bytes]) -> tuple[int, bytes | IO[bytes]]:
    """An archive's pieces gathered so that its size is known before a ticket names it: in
    memory up to SPOOL_MEMORY_BYTES, past it in a temporary file (at its start; the caller
    closes it)."""
    held: list[bytes] = []
    size = 0
    spill: IO[bytes] | None = None
    for piece in pieces:
        size += len(piece)
        if spill is not None:
            spill.write(piece)
            continue
        held.append(piece)
        if size > SPOOL_MEMORY_BYTES:
            spill = tempfile.TemporaryFile()  # noqa: SIM115 - handed to the caller, who closes it
            spill.writelines(held)
            held = []
    if spill is None:
        return size, b"".join(held)
    spill.seek(0)
    return size, spill


def pieces_of(spooled: bytes | IO[bytes], chunk_bytes: int) -> Iterator[bytes]:
    """What `spool` gathered, again in chunks (for gRPC when the stream is not to be had)."""
    if isinstance(spooled, bytes):
        view = memoryview(spooled)
        for start in range(0, len(spooled), chunk_bytes):
            yield bytes(view[start : start + chunk_bytes])
        return
    while chunk := spooled.read(chunk_bytes):
        yield chunk


def file_size(handle: IO[bytes]) -> int:
    """The size of an open local file (what an upload's ticket names)."""
    return os.fstat(handle.fileno()).st_size
