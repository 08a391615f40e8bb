"""Interactive execs over ExecSandboxStream: a command whose stdin is streamed while it runs,
optionally on a pseudo-terminal in the sandbox (`sb.pty(...)`), with resizes and signals.

`Process` (sync) and `AsyncProcess` (asyncio) are the same API: `send` stdin, `close_stdin`,
`resize` the terminal, `signal` the command's process group, `recv` its output as
`OutputEvent`s (the last carries the exit code), `wait` for the exit code, `close` to stop it.
`stdin_requests` turns an iterable of bytes or a binary file into streamed stdin for
`run`/`run_stream`, read lazily: the gateway takes stdin only as fast as the command consumes it,
so a large input moves with flat memory on every side.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import signal as signals
import threading
import time
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator
from typing import IO, Self

import grpc
from grpc import aio

from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.sdk import calls, errors, views

__all__ = [
    "STDIN_CHUNK_BYTES",
    "AsyncProcess",
    "Process",
    "StdinSource",
    "feed_async",
    "start_request",
    "stdin_requests",
]

STDIN_CHUNK_BYTES = 64 * 1024
# What `run`/`run_stream`/`start` accept as stdin besides bytes: an iterable of chunks or a binary file.
StdinSource = Iterable[bytes] | IO[bytes]


def start_request(
    request: pb.ExecSandboxRequest, *, tty: bool, rows: int = 0, columns: int = 0
) -> pb.ExecStreamRequest:
    """The first message of an exec stream."""
    size = pb.TerminalSize(rows=rows, columns=columns)
    return pb.ExecStreamRequest(start=pb.ExecStreamStart(exec=request, tty=tty, size=size))


def _chunks(source: StdinSource) -> Iterator[bytes]:
    if hasattr(source, "read"):
        reader: Callable[[int], bytes] = getattr(source, "read1", None) or source.read
        while chunk := reader(STDIN_CHUNK_BYTES):
            yield chunk
        return
    for item in source:
        data = item.encode() if isinstance(item, str) else bytes(item)
        for at in range(0, len(data), STDIN_CHUNK_BYTES):
            yield data[at : at + STDIN_CHUNK_BYTES]


def stdin_requests(start: pb.ExecStreamRequest, source: StdinSource) -> Iterator[pb.ExecStreamRequest]:
    """`start`, then `source` as stdin messages (read as grpc sends them), then the end of stdin."""
    yield start
    for chunk in _chunks(source):
        yield pb.ExecStreamRequest(stdin=chunk)
    yield pb.ExecStreamRequest(close_stdin=True)


def _stdin(data: bytes | str) -> pb.ExecStreamRequest:
    return pb.ExecStreamRequest(stdin=data.encode() if isinstance(data, str) else data)


def _resize(rows: int, columns: int) -> pb.ExecStreamRequest:
    if not (0 < rows <= 0xFFFF and 0 < columns <= 0xFFFF):
        raise errors.InvalidArgument(f"rows, columns: must be in 1..65535 (got {rows}x{columns})")
    return pb.ExecStreamRequest(resize=pb.TerminalSize(rows=rows, columns=columns))


def _signal(signo: int) -> pb.ExecStreamRequest:
    if not 1 <= int(signo) <= 64:
        raise errors.InvalidArgument(f"signal: must be a signal number in 1..64 (got {signo})")
    return pb.ExecStreamRequest(signal=int(signo))


def _next_chunk(chunks: Iterator[bytes]) -> bytes:
    return next(chunks, b"")


# Stdin messages a sync Process may have queued before `send` waits (grpc sends one at a time,
# each once HTTP/2 flow control lets it out, so this bounds the client's memory).
MAX_QUEUED_STDIN = 4


class Process:
    """A running command in a sandbox with streamed stdin (a terminal when started by `pty`).
    One thread receives; any thread may send, resize or signal. `send` waits while the command
    is not taking its input; resizes and signals go ahead of queued stdin."""

    def __init__(
        self,
        stub_call: Callable[[Iterator[pb.ExecStreamRequest]], grpc.CallIterator[pb.ExecEvent]],
        start: pb.ExecStreamRequest,
        address: str,
    ) -> None:
        self.tty = start.start.tty
        # A background command's pid (`start(background=True)`, `connect`): closing the handle
        # then only detaches from it.
        self.pid: int | None = None
        self.exit_code: int | None = None
        # How it ended beyond its exit code (timed out, a signal, never started), once it has.
        self.outcome: views.ExecOutcome | None = None
        self._address = address
        self._changed = threading.Condition()
        self._stdin: deque[pb.ExecStreamRequest] = deque()
        self._control: deque[pb.ExecStreamRequest] = deque()
        self._stdin_closed = False
        self._ended = False  # the request stream ends (the command exited, or close)
        self._call = stub_call(self._requests(start))
        self._events = iter(self._call)
        # A read that outlived a `recv(timeout=...)`: the next recv takes its result, so no
        # output is lost or reordered by a timeout.
        self._pending: concurrent.futures.Future[pb.ExecEvent | None] | None = None

    def _requests(self, start: pb.ExecStreamRequest) -> Iterator[pb.ExecStreamRequest]:
        yield start
        while True:
            with self._changed:
                while not (self._control or self._stdin or self._ended):
                    self._changed.wait()
                if self._control:
                    item = self._control.popleft()
                elif self._stdin:
                    item = self._stdin.popleft()
                    self._changed.notify_all()
                else:
                    return
            yield item

    def send(self, data: bytes | str) -> None:
        """Write to the command's stdin (on a terminal: as typed, so b"\\x03" is Ctrl-C); waits
        while earlier input has not been taken."""
        message = _stdin(data)
        with self._changed:
            while len(self._stdin) >= MAX_QUEUED_STDIN and not (self._stdin_closed or self._ended):
                self._changed.wait()
            if self._stdin_closed or self._ended:
                raise errors.Error("this process's stdin is closed")
            self._stdin.append(message)
            self._changed.notify_all()

    def close_stdin(self) -> None:
        """End stdin (the command reads EOF; on a terminal nothing is sent). Resizes and signals
        still go through."""
        with self._changed:
            if not (self._stdin_closed or self._ended):
                self._stdin_closed = True
                self._stdin.append(pb.ExecStreamRequest(close_stdin=True))
                self._changed.notify_all()

    def _control_message(self, message: pb.ExecStreamRequest) -> None:
        with self._changed:
            if self._ended:
                raise errors.Error("this process has ended")
            self._control.append(message)
            self._changed.notify_all()

    def resize(self, rows: int, columns: int) -> None:
        """Tell the command its terminal is now `rows` x `columns` (it receives SIGWINCH)."""
        self._control_message(_resize(rows, columns))

    def signal(self, signo: int = signals.SIGINT) -> None:
        """Deliver a signal to the command's process group."""
        self._control_message(_signal(signo))

    def recv(self, timeout: float | None = None) -> views.OutputEvent | None:
        """The next output (stdout or stderr bytes; on a terminal all of it is stdout), then an
        event with the exit code, then None. With `timeout`, TimeoutError when nothing came in
        that many seconds: the command runs on, and the next recv goes on where this one left."""
        if self.exit_code is not None:
            return None
        if timeout is None and self._pending is None:
            event = self._next_event()
        else:
            # grpcio's blocking iterator has no timed read: a helper thread reads for us.
            if self._pending is None:
                self._pending = concurrent.futures.Future()
                threading.Thread(target=self._read_into, args=(self._pending,), daemon=True).start()
            try:
                event = self._pending.result(timeout)
            except concurrent.futures.TimeoutError:
                raise TimeoutError(f"no output within {timeout:g} s; the command still runs") from None
            finally:
                if self._pending.done():
                    self._pending = None
        if event is None:
            raise errors.Error("the exec stream ended without an exit code")
        out = calls.output_event(event)
        if out.exit_code is not None:
            self.exit_code, self.outcome = out.exit_code, out.outcome
            self._finish()
        return out

    def _next_event(self) -> pb.ExecEvent | None:
        with errors.translating(self._address):
            return next(self._events, None)

    def _read_into(self, result: concurrent.futures.Future[pb.ExecEvent | None]) -> None:
        try:
            result.set_result(self._next_event())
        except BaseException as exc:  # handed to the recv that waits for it
            result.set_exception(exc)

    def __iter__(self) -> Iterator[views.OutputEvent]:
        while (event := self.recv()) is not None:
            yield event

    @property
    def timed_out(self) -> bool:
        """It was killed at its timeout (known once it ended)."""
        return self.outcome is not None and self.outcome.timed_out

    def wait(self, timeout: float | None = None) -> int:
        """Read (and drop) the rest of the output; the exit code. With `timeout`, TimeoutError
        when the command has not exited within that many seconds: it runs on, and a later
        `wait` or `recv` goes on where this one left (`close` stops it)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.exit_code is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"the command did not exit within {timeout:g} s; it still runs")
            try:
                self.recv(timeout=left)
            except TimeoutError:
                raise TimeoutError(f"the command did not exit within {timeout:g} s; it still runs") from None
        return self.exit_code

    def _finish(self) -> None:
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    def kill(self) -> None:
        """Stop the command (SIGKILL to its process group), background or not."""
        self.signal(signals.SIGKILL)

    def close(self) -> None:
        """Stop the command if it still runs (the stream is cancelled; the sandbox kills it); a
        background command (`pid` set) runs on: this client only detaches."""
        self._finish()
        self._call.cancel()  # type: ignore[no-untyped-call]  # grpc-stubs leave RpcContext.cancel untyped

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncProcess:
    """`Process` for asyncio: the same methods, awaited (and `async for` over its output)."""

    def __init__(self, call: aio.StreamStreamCall[pb.ExecStreamRequest, pb.ExecEvent], address: str, tty: bool) -> None:
        self.tty = tty
        self.pid: int | None = None  # see Process.pid
        self.exit_code: int | None = None
        self.outcome: views.ExecOutcome | None = None  # see Process.outcome
        self._call = call
        self._address = address
        self._stdin_closed = False
        # A read that outlived a cancelled recv (`asyncio.timeout`): the next recv takes its
        # result. Cancelling grpc.aio's read itself would cancel the whole call.
        self._pending: asyncio.Task[object] | None = None

    @classmethod
    async def start(
        cls, call: aio.StreamStreamCall[pb.ExecStreamRequest, pb.ExecEvent], start: pb.ExecStreamRequest, address: str
    ) -> AsyncProcess:
        """Send `start` on a new stream call."""
        process = cls(call, address, start.start.tty)
        await process._write(start)
        return process

    async def _write(self, message: pb.ExecStreamRequest) -> None:
        with errors.translating(self._address):
            await self._call.write(message)

    async def send(self, data: bytes | str) -> None:
        """`Process.send`; returns once the stream took it (flow control applies)."""
        if self._stdin_closed:
            raise errors.Error("this process's stdin is closed")
        await self._write(_stdin(data))

    async def close_stdin(self) -> None:
        """`Process.close_stdin`."""
        if not self._stdin_closed:
            await self._write(pb.ExecStreamRequest(close_stdin=True))
            self._stdin_closed = True

    async def resize(self, rows: int, columns: int) -> None:
        """`Process.resize`."""
        await self._write(_resize(rows, columns))

    async def signal(self, signo: int = signals.SIGINT) -> None:
        """`Process.signal`."""
        await self._write(_signal(signo))

    async def recv(self) -> views.OutputEvent | None:
        """`Process.recv`; bound it with `asyncio.timeout(...)`, which is `Process.recv(timeout=)`:
        a recv cancelled (by a timeout or otherwise) leaves the command running, and the next
        recv goes on where it left (`close` stops the command)."""
        if self.exit_code is not None:
            return None
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._call.read())
        await asyncio.wait({self._pending})  # not cancelled with us
        read, self._pending = self._pending, None
        with errors.translating(self._address):
            event = read.result()
        if event is aio.EOF:  # type: ignore[attr-defined]  # missing from grpc-stubs
            raise errors.Error("the exec stream ended without an exit code")
        assert isinstance(event, pb.ExecEvent)
        out = calls.output_event(event)
        if out.exit_code is not None:
            self.exit_code, self.outcome = out.exit_code, out.outcome
        return out

    async def __aiter__(self) -> AsyncIterator[views.OutputEvent]:
        while (event := await self.recv()) is not None:
            yield event

    @property
    def timed_out(self) -> bool:
        """`Process.timed_out`."""
        return self.outcome is not None and self.outcome.timed_out

    async def wait(self) -> int:
        """`Process.wait`."""
        async for _ in self:
            pass
        assert self.exit_code is not None
        return self.exit_code

    async def kill(self) -> None:
        """`Process.kill`."""
        await self.signal(signals.SIGKILL)

    async def close(self) -> None:
        """`Process.close`: cancels the call (the sandbox kills the command's process group, unless
        it runs in the background) and returns once the call has ended."""
        self._call.cancel()
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        with contextlib.suppress(Exception):
            await self._call.code()  # resolves once the cancel has taken effect

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def feed_async(process: AsyncProcess, source: StdinSource | AsyncIterable[bytes]) -> None:
    """Send `source` as the process's stdin, then its end (a blocking file is read in a thread)."""
    if isinstance(source, AsyncIterable):
        async for chunk in source:
            await process.send(chunk)
    else:
        chunks = _chunks(source)
        while chunk := await asyncio.to_thread(_next_chunk, chunks):
            await process.send(chunk)
    await process.close_stdin()
