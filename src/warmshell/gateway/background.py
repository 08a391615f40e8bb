"""Background commands: execs that run until they exit whoever is connected, kept by the gateway
that holds their sandbox's session.

A background command is an ordinary exec over the supervisor session (so it runs the same way on
every driver and under every runner) whose output nobody need be reading: a task here takes every
chunk into the command's `OutputRing` and grants the supervisor its credit at once, so the command
never waits for a reader and the gateway holds at most the ring. Clients list a sandbox's commands
and attach to one by its pid: the ring's output first (flagged with how much was dropped), then
live output, then the exit; their stdin, resizes and signals go down the session as for an
interactive exec, and leaving stops nothing.

Bounds: `MAX_RUNNING` running and `MAX_EXITED` exited commands per sandbox, an exited one kept
`EXITED_RETENTION_SECONDS` at most, each with one ring of `gateway.exec_history_bytes`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from warmshell.api.v1 import outcome_pb2
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.core.errors import NotFoundError, ResourceExhaustedError, WarmshellError
from warmshell.core.ids import SandboxId
from warmshell.core.models import now_ms
from warmshell.gateway.execs import ExecRelay, exec_failure, grant_credit
from warmshell.gateway.outputring import OutputRing
from warmshell.gateway.sessions import ExecChannel, SupervisorSession

__all__ = ["EXITED_RETENTION_SECONDS", "MAX_EXITED", "MAX_RUNNING", "BackgroundProcess", "BackgroundProcesses"]

Ctx = grpc.aio.ServicerContext[Any, Any]
MAX_RUNNING = 16
MAX_EXITED = 16
EXITED_RETENTION_SECONDS = 3600


@dataclass(eq=False)
class BackgroundProcess:
    """One background command: what it runs, its output ring, and how it ended once it has."""

    pid: int
    command: list[str]
    tty: bool
    session: SupervisorSession
    channel: ExecChannel
    ring: OutputRing
    started_at_ms: int = field(default_factory=now_ms)
    ended_at_ms: int = 0
    exited: spb.ExecExited | None = None
    failure: WarmshellError | None = None  # it ended as a call (its session closed), not by exiting
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def running(self) -> bool:
        """Not yet exited (nor ended with its session)."""
        return self.exited is None and self.failure is None

    def changed(self) -> asyncio.Event:
        """An event set at the next change (more output, or the end)."""
        return self._changed

    def notify(self) -> None:
        """Wake everyone waiting for a change."""
        self._changed.set()
        self._changed = asyncio.Event()

    def info(self) -> pb.ProcessInfo:
        """The public view."""
        message = pb.ProcessInfo(
            pid=self.pid,
            command=self.command,
            started_at_ms=self.started_at_ms,
            state="running" if self.running else "exited",
            ended_at_ms=self.ended_at_ms,
            output_bytes=self.ring.end,
            dropped_bytes=self.ring.start,
            tty=self.tty,
        )
        if self.exited is not None:
            message.exit_code = self.exited.exit_code
            message.outcome.CopyFrom(self.exited.outcome)
        if self.failure is not None:
            message.exit_code, message.error = -1, str(self.failure)
        return message


@dataclass(eq=False)
class _Sandbox:
    processes: dict[int, BackgroundProcess] = field(default_factory=dict)
    last_pid: int = 0


class BackgroundProcesses:
    """The background commands of the sandboxes whose sessions this gateway holds."""

    def __init__(
        self,
        relay: ExecRelay,
        *,
        history_bytes: int,
        touch: Callable[[SandboxId], None] = lambda _: None,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        """`touch`: told of a sandbox whose command ended (idle time counts from there)."""
        self._relay = relay
        self._touch = touch
        self._history_bytes = history_bytes
        self._clock = clock
        self._sandboxes: dict[SandboxId, _Sandbox] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def start(
        self, sandbox_id: SandboxId, session: SupervisorSession, request: pb.StartProcessRequest
    ) -> BackgroundProcess:
        """Start the command in the sandbox and keep its output. ResourceExhaustedError with
        MAX_RUNNING already running there."""
        self._prune()
        sandbox = self._sandboxes.setdefault(sandbox_id, _Sandbox())
        if sum(p.running for p in sandbox.processes.values()) >= MAX_RUNNING:
            raise ResourceExhaustedError(
                f"sandbox already runs {MAX_RUNNING} background commands (the most it may): wait for one to exit"
            )
        start = request.start
        channel = self._relay.open(session, start.exec, start)
        if not request.open_stdin:
            session.send(spb.GatewayMessage(exec_input=spb.ExecInput(exec_id=channel.exec_id, eof=True)))
        sandbox.last_pid += 1
        process = BackgroundProcess(
            pid=sandbox.last_pid,
            command=list(start.exec.command),
            tty=start.tty,
            session=session,
            channel=channel,
            ring=OutputRing(self._history_bytes),
        )
        sandbox.processes[process.pid] = process
        task = asyncio.create_task(self._keep(sandbox_id, process), name=f"background {sandbox_id} {process.pid}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return process

    def list(self, sandbox_id: SandboxId) -> list[BackgroundProcess]:
        """The sandbox's commands, running and recently exited, oldest first."""
        self._prune()
        sandbox = self._sandboxes.get(sandbox_id)
        return [] if sandbox is None else sorted(sandbox.processes.values(), key=lambda p: p.pid)

    def get(self, sandbox_id: SandboxId, pid: int) -> BackgroundProcess:
        """One command by pid; NotFoundError naming the field when the sandbox has none such."""
        sandbox = self._sandboxes.get(sandbox_id)
        process = None if sandbox is None else sandbox.processes.get(pid)
        if process is None:
            raise NotFoundError(f"pid: the sandbox has no background command {pid} (see ListProcesses)")
        return process

    async def _keep(self, sandbox_id: SandboxId, process: BackgroundProcess) -> None:
        """Take the command's output into its ring until it ends."""
        channel = process.channel
        while True:
            event = await channel.events.get()
            if isinstance(event, spb.OutputData):
                process.ring.append(event.stderr, event.data)
                grant_credit(process.session, channel, len(event.data))
                process.notify()
                continue
            process.failure = exec_failure(event)
            if process.failure is None and isinstance(event, spb.ExecExited):
                process.exited = event
            process.ended_at_ms = self._clock()
            process.notify()
            self._touch(sandbox_id)
            return

    def _prune(self) -> None:
        """Forget exited commands past their retention, and past MAX_EXITED per sandbox."""
        oldest = self._clock() - EXITED_RETENTION_SECONDS * 1000
        for sandbox_id, sandbox in list(self._sandboxes.items()):
            exited = sorted((p for p in sandbox.processes.values() if not p.running), key=lambda p: p.ended_at_ms)
            for index, process in enumerate(exited):
                if process.ended_at_ms < oldest or index < len(exited) - MAX_EXITED:
                    del sandbox.processes[process.pid]
            if not sandbox.processes:
                del self._sandboxes[sandbox_id]

    async def attach(
        self, process: BackgroundProcess, context: Ctx, requests: AsyncIterator[pb.ExecStreamRequest]
    ) -> None:
        """Write the command's held output, then its live output and its end, to the client;
        pass its stdin, resizes and signals on while it runs. Leaving stops nothing."""
        inputs: asyncio.Task[None] | None = None
        if process.running and process.channel.input_window is not None:
            relay = self._relay.relay_input(
                process.session, process.channel, requests, tty=process.tty, eof_at_end=False
            )
            inputs = asyncio.create_task(relay)
        try:
            await self._follow(process, context, inputs)
        finally:
            if inputs is not None:
                inputs.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await inputs

    async def _follow(self, process: BackgroundProcess, context: Ctx, inputs: asyncio.Task[None] | None) -> None:
        position = 0
        while True:
            changed = process.changed()
            dropped, chunks = process.ring.read(position)
            position = process.ring.end
            for chunk in chunks:
                event = pb.ExecEvent(stderr=chunk.data) if chunk.stderr else pb.ExecEvent(stdout=chunk.data)
                event.dropped_bytes, dropped = dropped, 0
                await self._relay.write(context, event)
            if not process.running:
                if process.failure is not None:
                    raise process.failure
                assert process.exited is not None
                outcome = outcome_pb2.ExecOutcome()
                outcome.CopyFrom(process.exited.outcome)
                await self._relay.write(context, pb.ExecEvent(exit_code=process.exited.exit_code, outcome=outcome))
                return
            await _wait_changed(changed, inputs)

    async def aclose(self) -> None:
        """Stop keeping output (the gateway stops; the sessions have ended the commands)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def _wait_changed(changed: asyncio.Event, inputs: asyncio.Task[None] | None) -> None:
    """Wait for the next change; a bad request on the input stream fails the call instead."""
    if inputs is None or (inputs.done() and inputs.exception() is None):
        await changed.wait()
        return
    waiting = asyncio.ensure_future(changed.wait())
    try:
        await asyncio.wait((waiting, inputs), return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiting.cancel()
    if inputs.done():
        inputs.result()  # raises what ended the input stream
