"""The byte stream: one file's bytes over a plain socket, admitted by a one-time ticket.

gRPC's message path cost a 5 MiB write about twice the CPU of the bytes themselves on both
sides (protobuf framing, the poller thread, the event loop and the executor waking each other
per 256 KiB message); here the driver's `SocketFiles` moves them between the socket and the
file in the kernel, with the same confinement, size bound, disk bound and
temporary-file-then-rename as `WriteFile` and `ReadFile`. Tickets are issued only for
sandboxes whose files are `SocketFiles` (the local driver's); others stay on gRPC.

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
from collections.abc import Awaitable, Callable
from pathlib import Path

from warmshell.core.errors import UnavailableError, WarmshellError
from warmshell.core.transfers import FRAME_END, HELLO_BYTES, PREFACE, Status, encode_status
from warmshell.drivers.files import ArchiveLimits, SandboxFiles, SocketFiles
from warmshell.gateway.errors import status_code_for
from warmshell.gateway.tickets import Direction, Grant, TicketBook

__all__ = ["ByteStream", "FilesFor"]

log = logging.getLogger(__name__)

# Before a connection closes, what the client still sends is read and dropped this long at most.
DRAIN_SECONDS = 2.0
DRAIN_BYTES = 256 * 1024

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
        limits: ArchiveLimits,
    ) -> None:
        self.book = book
        self._limits = limits
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
        """Move the bytes a grant allows. An upload's status line comes after its bytes (the
        file in place, or why not); a download's before them, and a download cut short after
        its status line just ends the connection early, which the client reports."""
        try:
            async with asyncio.timeout(self._idle_seconds):
                files = await self._files_for(grant)
            if not isinstance(files, SocketFiles):  # tickets are issued only for these
                raise UnavailableError(f"{grant.path}: the byte stream cannot reach this sandbox's files")
            done = await self._in_kernel(loop, conn, files, grant)
        except TimeoutError:
            if grant.direction in (Direction.DOWNLOAD, Direction.DOWNLOAD_ARCHIVE):
                return  # a client that stopped reading (maybe half-way through a frame): just close
            status = _refusal("DEADLINE_EXCEEDED", f"{grant.path}: no progress for {self._idle_seconds:g}s")
        except WarmshellError as exc:
            status = _status_of(exc)
        else:
            self.completed += done is not None
            if done is not None and grant.direction is not Direction.DOWNLOAD:
                await _send_status(loop, conn, done)  # an upload's outcome
            await _drain(loop, conn)  # until the client, having read it all, closes
            return
        if grant.direction is Direction.DOWNLOAD_ARCHIVE:
            # A refusal comes from packing, between whole frames: the end frame, then why.
            await _send(loop, conn, FRAME_END)
        await _send_status(loop, conn, status)
        await _drain(loop, conn)

    async def _in_kernel(
        self, loop: asyncio.AbstractEventLoop, conn: socket.socket, files: SocketFiles, grant: Grant
    ) -> Status | None:
        """The transfer by the driver, socket to files or file to socket: what it moved (for a
        download, whose status line went first, only said here), None when cut short."""
        idle = self._idle_seconds
        if grant.direction is Direction.UPLOAD:
            mode, parents = grant.mode, grant.make_parents
            await files.receive(grant.path, conn, grant.size, mode=mode, make_parents=parents, idle_seconds=idle)
            return Status(ok=True, size=grant.size)
        if grant.direction is Direction.UPLOAD_ARCHIVE:
            summary = await files.receive_archive(grant.path, conn, grant.size, self._limits, idle_seconds=idle)
            return Status(ok=True, size=summary.bytes_written, entries=summary.entries)
        if grant.direction is Direction.DOWNLOAD_ARCHIVE:
            return Status(ok=True, size=await files.send_archive(grant.path, conn, self._limits, idle_seconds=idle))
        sizes: list[int] = []

        async def before(size: int) -> None:
            await loop.sock_sendall(conn, encode_status(Status(ok=True, size=size)))
            sizes.append(size)

        try:
            sent = await files.send(grant.path, conn, grant.max_bytes, idle_seconds=idle, before=before)
        except WarmshellError:
            if sizes:  # its status line went out, and some bytes may have: the connection ends early
                return None
            raise
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_WR)
        return Status(ok=True, size=sent) if sent == sizes[0] else None


async def _drain(loop: asyncio.AbstractEventLoop, conn: socket.socket) -> None:
    """Before closing: read and drop what the client still sends (the rest of a refused
    upload), briefly, since a socket closed with unread input resets the connection and the
    client would lose what it had not read yet (the refusal, a download's last bytes)."""
    with contextlib.suppress(OSError, TimeoutError):
        conn.shutdown(socket.SHUT_WR)
        async with asyncio.timeout(DRAIN_SECONDS):
            while await loop.sock_recv(conn, DRAIN_BYTES):
                pass


async def _receive_exactly(loop: asyncio.AbstractEventLoop, conn: socket.socket, count: int) -> bytes:
    data = bytearray()
    while len(data) < count:
        piece = await loop.sock_recv(conn, count - len(data))
        if not piece:
            raise EOFError
        data += piece
    return bytes(data)


async def _send_status(loop: asyncio.AbstractEventLoop, conn: socket.socket, status: Status) -> None:
    await _send(loop, conn, encode_status(status))


async def _send(loop: asyncio.AbstractEventLoop, conn: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):
        await loop.sock_sendall(conn, data)


def _refusal(code: str, message: str) -> Status:
    return Status(ok=False, code=code, message=message)


def _status_of(exc: WarmshellError) -> Status:
    return _refusal(status_code_for(exc).name, str(exc))
