"""Relaying one exec between a client's ExecSandbox call and the sandbox's supervisor session,
flow-controlled end to end.

The supervisor may have at most a window of output in flight; the gateway grants it more only
after the client's stream has taken the bytes (a gRPC write completes once HTTP/2 flow control
lets it out). A slow reader therefore slows the command's writes down to the pipe it writes
into; nothing is buffered without bound and nothing is dropped. A client that takes nothing for
`stall_seconds` ends the exec with an explicit error (and the command is killed): output is
complete, or the call fails — never an exit status after missing output.

An interactive exec (ExecSandboxStream) also streams the other way: the client's stdin, resizes
and signals go down the session as they arrive. Stdin is read from the client only while the
sandbox has room for it (an input window the supervisor credits back as the command consumes it),
so a large upload moves at the command's pace through HTTP/2 flow control, with flat memory here.
Both directions are plain message streams, so a replica can relay the call unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc

from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.core.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    ResourceExhaustedError,
    WarmshellError,
)
from warmshell.gateway import metrics
from warmshell.gateway.sessions import ExecChannel, SupervisorSession
from warmshell.sandboxio.window import OutputWindow

__all__ = ["MAX_TERMINAL_CELLS", "ExecRelay", "check_terminal_size", "grant_credit"]

Ctx = grpc.aio.ServicerContext[Any, Any]
MAX_TERMINAL_CELLS = 0xFFFF  # struct winsize holds unsigned shorts
MAX_SIGNAL = 64
# Streamed stdin in flight per exec (sent down, not yet written to the command): enough to keep a
# pipe busy, small beside the output window, since it sits in the supervisor until written.
MAX_INPUT_WINDOW_BYTES = 1024 * 1024


def check_terminal_size(size: pb.TerminalSize, field: str) -> None:
    """InvalidArgumentError naming the field when a dimension does not fit a terminal."""
    for name, value in (("rows", size.rows), ("columns", size.columns)):
        if value > MAX_TERMINAL_CELLS:
            raise InvalidArgumentError(f"{field}.{name}", f"at most {MAX_TERMINAL_CELLS}")


def grant_credit(session: SupervisorSession, channel: ExecChannel, size: int) -> None:
    """`size` bytes of the exec's output were passed on: let the supervisor send more (in
    batches of a quarter window, see `ExecChannel.passed_on`)."""
    if grant := channel.passed_on(size):
        session.send(spb.GatewayMessage(exec_credit=spb.ExecCredit(exec_id=channel.exec_id, bytes=grant)))


def exec_failure(event: spb.ExecExited | WarmshellError) -> WarmshellError | None:
    """The error an exec's end stands for when it is no exit (None: the command exited): the
    session ended under it, or the supervisor could not run it."""
    if isinstance(event, WarmshellError):
        return event
    return FailedPreconditionError(f"exec failed: {event.error}") if event.error else None


class ExecRelay:
    """Runs execs over supervisor sessions with the gateway's flow-control settings, and counts
    the execs in flight through this gateway (so a stop can let them finish)."""

    def __init__(self, *, window_bytes: int, stall_seconds: float) -> None:
        self.window_bytes = window_bytes
        self.stall_seconds = stall_seconds
        self._in_flight = 0
        self._none_in_flight = asyncio.Event()
        self._none_in_flight.set()

    @contextlib.contextmanager
    def counted(self) -> Iterator[None]:
        """One exec in flight for as long as the block runs (run here or forwarded to the
        replica that holds its session)."""
        self._in_flight += 1
        self._none_in_flight.clear()
        try:
            yield
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                self._none_in_flight.set()

    async def wait_none_in_flight(self, timeout: float) -> int:  # noqa: ASYNC109
        """Wait until no exec is in flight, `timeout` seconds at most; returns how many still are."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._none_in_flight.wait(), timeout)
        return self._in_flight

    async def run(
        self,
        session: SupervisorSession,
        request: pb.ExecSandboxRequest,
        context: Ctx,
        *,
        interactive: tuple[pb.ExecStreamStart, AsyncIterator[pb.ExecStreamRequest]] | None = None,
    ) -> None:
        """Start the exec in the sandbox and write its events to the client until its exit;
        `interactive`: the stream's start and the rest of the client's requests (stdin, resizes,
        signals), relayed while it runs. FailedPreconditionError when it could not run;
        ResourceExhaustedError when the client stopped reading for longer than `stall_seconds`;
        InvalidArgumentError for a bad request on the stream; UnavailableError when the gateway
        stopped before the exec ended."""
        channel = self.open(session, request, interactive[0] if interactive is not None else None)
        inputs: asyncio.Task[None] | None = None
        if interactive is not None:
            inputs = asyncio.create_task(self.relay_input(session, channel, interactive[1], tty=interactive[0].tty))
        finished = False
        try:
            while True:
                event = await self._next(channel, inputs)
                if isinstance(event, spb.OutputData):
                    out = pb.ExecEvent(stderr=event.data) if event.stderr else pb.ExecEvent(stdout=event.data)
                    await self.write(context, out)
                    grant_credit(session, channel, len(event.data))
                    continue
                finished = True
                if (failure := exec_failure(event)) is not None:
                    metrics.EXECS.labels(result="error").inc()
                    raise failure
                assert isinstance(event, spb.ExecExited)
                metrics.EXECS.labels(result="ok").inc()
                await self.write(context, pb.ExecEvent(exit_code=event.exit_code, outcome=event.outcome))
                return
        finally:
            if inputs is not None:
                inputs.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await inputs
            if not finished:  # the client went away or stalled: stop the command in the sandbox
                session.execs.pop(channel.exec_id, None)
                session.send(spb.GatewayMessage(exec_cancel=spb.ExecCancel(exec_id=channel.exec_id)))

    def open(
        self,
        session: SupervisorSession,
        request: pb.ExecSandboxRequest,
        interactive: pb.ExecStreamStart | None,
        *,
        background: tuple[int, int] | None = None,
    ) -> ExecChannel:
        """Start the exec in the sandbox (stdin streamed when `interactive`); its channel, on
        which its output and exit arrive. `background`: (pid, history bytes) of a command the
        supervisor keeps across sessions."""
        channel = ExecChannel(exec_id=uuid.uuid4().hex, window=self.window_bytes)
        start = self._start_message(channel, request, interactive)
        if background is not None:
            start.background = True
            start.background_pid, start.history_bytes = background
        session.execs[channel.exec_id] = channel
        session.send(spb.GatewayMessage(exec_start=start))
        return channel

    def follow(self, session: SupervisorSession, exec_id: str, offset: int) -> ExecChannel:
        """Receive a background command the supervisor keeps on this session, from its output's
        `offset` on (its channel, as an interactive exec's from `open`)."""
        channel = ExecChannel(exec_id=exec_id, window=self.window_bytes)
        channel.input_window = OutputWindow(min(self.window_bytes, MAX_INPUT_WINDOW_BYTES))
        session.execs[exec_id] = channel
        follow = spb.ExecFollow(exec_id=exec_id, offset=offset, output_window_bytes=self.window_bytes)
        session.send(spb.GatewayMessage(exec_follow=follow))
        return channel

    def _start_message(
        self, channel: ExecChannel, request: pb.ExecSandboxRequest, interactive: pb.ExecStreamStart | None
    ) -> spb.ExecStart:
        """What starts the exec in the sandbox; an interactive one streams its stdin (through an
        input window, on `channel`), maybe on a terminal."""
        start = spb.ExecStart(
            exec_id=channel.exec_id,
            command=request.command,
            environment=request.environment,
            workdir=request.workdir,
            timeout_seconds=request.timeout_seconds,
            stdin=request.stdin,
            output_window_bytes=self.window_bytes,
        )
        if interactive is not None:
            start.stream_stdin = True
            start.tty = interactive.tty
            start.rows, start.columns = interactive.size.rows, interactive.size.columns
            channel.input_window = OutputWindow(min(self.window_bytes, MAX_INPUT_WINDOW_BYTES))
        return start

    @staticmethod
    async def _next(
        channel: ExecChannel, inputs: asyncio.Task[None] | None
    ) -> spb.OutputData | spb.ExecExited | WarmshellError:
        """The exec's next event; a bad request on the input stream fails the call instead."""
        if inputs is None or (inputs.done() and inputs.exception() is None):
            return await channel.events.get()
        getting = asyncio.ensure_future(channel.events.get())
        try:
            await asyncio.wait((getting, inputs), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not getting.done():
                getting.cancel()
        if getting.done() and not getting.cancelled():
            return getting.result()
        inputs.result()  # raises what ended the input stream
        return await channel.events.get()

    async def relay_input(
        self,
        session: SupervisorSession,
        channel: ExecChannel,
        requests: AsyncIterator[pb.ExecStreamRequest],
        *,
        tty: bool,
        eof_at_end: bool = True,
    ) -> None:
        """Pass the client's requests down the session, stdin no faster than the sandbox takes it.
        With `eof_at_end`, the client's end of the stream is the end of stdin."""
        assert channel.input_window is not None
        exec_id = channel.exec_id
        async for message in requests:
            kind = message.WhichOneof("message")
            if kind == "stdin":
                view = memoryview(message.stdin)
                while view:
                    size = await channel.input_window.take(len(view))
                    session.send(spb.GatewayMessage(exec_input=spb.ExecInput(exec_id=exec_id, data=bytes(view[:size]))))
                    view = view[size:]
            elif kind == "close_stdin":
                session.send(spb.GatewayMessage(exec_input=spb.ExecInput(exec_id=exec_id, eof=True)))
            elif kind == "resize":
                check_terminal_size(message.resize, "resize")
                if not tty:
                    raise InvalidArgumentError("resize", "only an exec on a terminal (tty) can be resized")
                resize = spb.ExecResize(exec_id=exec_id, rows=message.resize.rows, columns=message.resize.columns)
                session.send(spb.GatewayMessage(exec_resize=resize))
            elif kind == "signal":
                if not 1 <= message.signal <= MAX_SIGNAL:
                    raise InvalidArgumentError("signal", f"must be a signal number in 1..{MAX_SIGNAL}")
                session.send(spb.GatewayMessage(exec_signal=spb.ExecSignal(exec_id=exec_id, signal=message.signal)))
            elif kind in ("start", "attach"):
                raise InvalidArgumentError(kind, f"only the first message of the stream may be its {kind}")
        if eof_at_end:
            session.send(spb.GatewayMessage(exec_input=spb.ExecInput(exec_id=exec_id, eof=True)))

    async def write(self, context: Ctx, event: pb.ExecEvent) -> None:
        """Write one event to the client, ResourceExhaustedError once it has read nothing for
        `stall_seconds`."""
        # A timeout scope, not wait_for: Python 3.11's wait_for drops a cancel that arrives as
        # the write completes, which is exactly when a client that leaves after a chunk cancels
        # (about one exec in four, in a loop that breaks after the first chunk); the exec then
        # waited for the command's next output instead of killing it.
        try:
            async with asyncio.timeout(self.stall_seconds):
                await context.write(event)
        except TimeoutError:
            metrics.EXECS.labels(result="stalled").inc()
            raise ResourceExhaustedError(
                f"the client read none of the exec's output for {self.stall_seconds:g}s "
                "(gateway.exec_stall_timeout_seconds): the command was killed and its output is incomplete"
            ) from None
