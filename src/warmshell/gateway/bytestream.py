"""The byte stream: one file's bytes over a plain socket, admitted by a one-time ticket.

gRPC's message path cost a 5 MiB write about twice the CPU of the bytes themselves on both
sides (protobuf framing, the poller thread, the event loop and the executor waking each other
per 256 KiB message); here the bytes arrive by `recv_into` into megabyte buffers and go out by
`sendall`, and still pass through the driver's `SandboxFiles`: the same confinement, size bound,
disk bound and temporary-file-then-rename as `WriteFile` and `ReadFile`.

Each connection must send its hello (preface and ticket) within `hello_seconds`, and then make
progress at least every `idle_seconds`; at most `max_connections` are open at once (past it a
new one is closed at accept). The listeners are the gateway's: a Unix socket beside its gRPC
socket and, when the gateway listens on TCP, a TCP port on the same host.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from warmshell.core.errors import InvalidArgumentError, WarmshellError
from warmshell.core.transfers import HELLO_BYTES, PREFACE, Status, encode_status
from warmshell.drivers.files import SandboxFiles
from warmshell.gateway.errors import status_code_for
from warmshell.gateway.tickets import Direction, Grant, TicketBook

__all__ = ["ByteStream", "FilesFor"]

log = logging.getLogger(__name__)

# Bytes handed to the writer at a time: a megabyte costs a handful of event-loop wakes per
# file and keeps at most a few of them per upload in memory (the writer batches up to 4 MiB).
CHUNK_BYTES = 1024 * 1024
# After a refused upload, the rest the client still sends is read and dropped this long at
# most, so that it reads the refusal instead of a connection reset.
DRAIN_SECONDS = 2.0

# The sandbox's files for a grant (NotFound when the sandbox is gone, FailedPrecondition when
# it is not Ready): the same check as a FileService call.
FilesFor = Callable[[Grant], Awaitable[SandboxFiles]]


class ByteStream:
    """The listeners and their connections."""

    def __init__(
        self,
        book: TicketBook,
        files_for: FilesFor,
        *,
        hello_seconds: float,
        idle_seconds: float,
        max_connections: int,
    ) -> None:
        self.book = book
        self._files_for = files_for
        self._hello_seconds = hello_seconds
        self._idle_seconds = idle_seconds
        self._max_connections = max_connections
        self._listeners: list[socket.socket] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self.unix_path: Path | None = None
        self.tcp_port = 0
        self.completed = 0  # transfers that ended well

    @property
    def connections(self) -> int:
        """Connections open now (accepted and not yet closed)."""
        return len(self._tasks) - len(self._listeners)

    def listen_unix(self, path: Path) -> None:
        """Accept on a Unix socket at `path` (made 0600: the caller's umask is private)."""
        path.unlink(missing_ok=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path))
        path.chmod(0o600)
        self.unix_path = path
        self._start(listener)

    def listen_tcp(self, host: str, port: int) -> int:
        """Accept on TCP `host:port` (0: a free port); the port bound."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        self.tcp_port = listener.getsockname()[1]
        self._start(listener)
        return self.tcp_port

    def _start(self, listener: socket.socket) -> None:
        listener.listen(128)
        listener.setblocking(False)
        self._listeners.append(listener)
        self._track(asyncio.get_running_loop().create_task(self._accept(listener)))

    def _track(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def aclose(self) -> None:
        """Stop accepting and end every connection (a transfer cut short leaves no file)."""
        for listener in self._listeners:
            listener.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._listeners.clear()
        if self.unix_path is not None:
            self.unix_path.unlink(missing_ok=True)

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(listener)
            except OSError as exc:  # EMFILE and the like: the next accept may succeed
                log.warning("byte stream: accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            if self.connections >= self._max_connections:
                conn.close()
                continue
            conn.setblocking(False)
            self._track(loop.create_task(self._serve(conn)))

    async def _serve(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._hello_seconds):
                hello = await _receive_exactly(loop, conn, HELLO_BYTES)
            grant = self.book.take(hello[len(PREFACE) :]) if hello.startswith(PREFACE) else None
            if grant is None:
                await _send_status(
                    loop, conn, _refusal("UNAUTHENTICATED", "not a valid ticket (used, expired or never issued)")
                )
                return
            await self._transfer(loop, conn, grant)
        except (TimeoutError, ConnectionError, EOFError):
            pass  # a client gone or silent: nothing to tell it
        except Exception:
            log.exception("byte stream: a transfer failed")
        finally:
            conn.close()

    async def _transfer(self, loop: asyncio.AbstractEventLoop, conn: socket.socket, grant: Grant) -> None:
        received = _Received(loop, conn, grant.size, self._idle_seconds)
        try:
            async with asyncio.timeout(self._idle_seconds) as deadline:
                received.deadline = deadline
                files = await self._files_for(grant)
                if grant.direction is Direction.UPLOAD:
                    written = await files.write(
                        grant.path,
                        received.chunks(),
                        mode=grant.mode,
                        make_parents=grant.make_parents,
                        max_bytes=grant.size,
                    )
                    status = Status(ok=True, size=written)
                else:
                    if await self._download(loop, conn, files, grant, deadline):
                        self.completed += 1
                    return
        except TimeoutError:
            status = _refusal("DEADLINE_EXCEEDED", f"{grant.path}: no progress for {self._idle_seconds:g}s")
        except WarmshellError as exc:
            status = _status_of(exc)
        await _send_status(loop, conn, status)
        if status.ok:
            self.completed += 1
        elif grant.direction is Direction.UPLOAD:
            await received.drain()

    async def _download(
        self,
        loop: asyncio.AbstractEventLoop,
        conn: socket.socket,
        files: SandboxFiles,
        grant: Grant,
        deadline: asyncio.Timeout,
    ) -> bool:
        """The status line with the size, then exactly that many bytes (True once sent); a file
        that changed size meanwhile ends the connection early, which the client reports as such."""
        size = (await files.stat(grant.path)).size
        chunks = files.read(grant.path, CHUNK_BYTES, grant.max_bytes)
        try:
            first = await anext(chunks, b"")  # a refusal (not found, not a file) comes here
            await _send_status(loop, conn, Status(ok=True, size=size))
            sent = 0
            chunk = first
            while chunk:
                sent += len(chunk)
                if sent > size:
                    return False
                await loop.sock_sendall(conn, chunk)
                deadline.reschedule(loop.time() + self._idle_seconds)
                chunk = await anext(chunks, b"")
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_WR)
            return sent == size
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]


class _Received:
    """An upload's bytes off the socket: exactly `size`, then the end of the stream."""

    def __init__(self, loop: asyncio.AbstractEventLoop, conn: socket.socket, size: int, idle_seconds: float) -> None:
        self._loop = loop
        self._conn = conn
        self._left = size
        self._size = size
        self._idle_seconds = idle_seconds
        self.deadline: asyncio.Timeout | None = None

    async def chunks(self) -> AsyncIterator[bytes]:
        """The bytes as the socket has them (each `recv` a fresh object: the writer batches
        them and may still hold the last ones)."""
        loop, conn = self._loop, self._conn
        while self._left:
            data = await loop.sock_recv(conn, min(CHUNK_BYTES, self._left))
            if not data:
                done = self._size - self._left
                raise InvalidArgumentError(
                    "size", f"the upload ended after {done} of the {self._size} bytes its ticket names"
                )
            self._left -= len(data)
            if self.deadline is not None:
                self.deadline.reschedule(loop.time() + self._idle_seconds)
            yield data
        if await loop.sock_recv(conn, 1):
            raise InvalidArgumentError("size", f"more than the {self._size} bytes its ticket names")

    async def drain(self) -> None:
        """Read and drop what the client still sends of its declared size, briefly."""
        with contextlib.suppress(OSError, TimeoutError):
            self._conn.shutdown(socket.SHUT_WR)
            async with asyncio.timeout(DRAIN_SECONDS):
                while self._left > 0:
                    data = await self._loop.sock_recv(self._conn, CHUNK_BYTES)
                    if not data:
                        return
                    self._left -= len(data)


async def _receive_exactly(loop: asyncio.AbstractEventLoop, conn: socket.socket, count: int) -> bytes:
    data = bytearray()
    while len(data) < count:
        piece = await loop.sock_recv(conn, count - len(data))
        if not piece:
            raise EOFError
        data += piece
    return bytes(data)


async def _send_status(loop: asyncio.AbstractEventLoop, conn: socket.socket, status: Status) -> None:
    with contextlib.suppress(OSError):
        await loop.sock_sendall(conn, encode_status(status))


def _refusal(code: str, message: str) -> Status:
    return Status(ok=False, code=code, message=message)


def _status_of(exc: WarmshellError) -> Status:
    return _refusal(status_code_for(exc).name, str(exc))
