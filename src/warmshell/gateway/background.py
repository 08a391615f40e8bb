"""Background commands: execs that run until they exit whoever is connected, kept by the sandbox's
supervisor and followed by the gateway that holds its session.

A background command is an exec over the supervisor session (so it runs the same way on every
driver and under every runner) that the supervisor keeps across sessions (`supervisor.background`):
the command and its output ring live on the sandbox's side, so a gateway restart or a supervisor
that reconnects loses neither. The gateway holding the session follows each command: a task here
takes every chunk into a copy of the ring, by offset, and grants the supervisor its credit at
once, so the command never waits for a reader. A new session's hello lists the commands the
supervisor keeps; the gateway adopts them under the same pids and follows each from the offset
its copy has reached (all of what the supervisor holds, after a restart). Clients list a sandbox's
commands and attach to one by its pid: the ring's output first (flagged with how much was
dropped), then live output, then the exit; their stdin, resizes and signals go down the session as
for an interactive exec, and leaving stops nothing.

Bounds (`sandboxio.outputring`): `MAX_RUNNING` running and `MAX_EXITED` exited commands per
sandbox, an exited one kept `EXITED_RETENTION_SECONDS` at most, each with one ring of
`gateway.exec_history_bytes`. A hello is the supervisor's word, taken within the same bounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import grpc

from warmshell.api.v1 import outcome_pb2
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.core import phases
from warmshell.core.errors import (
    FailedPreconditionError,
    NotFoundError,
    ResourceExhaustedError,
    UnavailableError,
    WarmshellError,
)
from warmshell.core.ids import SandboxId
from warmshell.core.models import Phase, SandboxRecord, now_ms
from warmshell.gateway.execs import ExecRelay, exec_failure, grant_credit
from warmshell.gateway.sessions import ExecChannel, SupervisorSession
from warmshell.sandboxio.outputring import EXITED_RETENTION_SECONDS, MAX_EXITED, MAX_RUNNING, Changes, OutputRing

__all__ = ["EXITED_RETENTION_SECONDS", "MAX_EXITED", "MAX_RUNNING", "BackgroundProcess", "BackgroundProcesses"]

log = logging.getLogger(__name__)

Ctx = grpc.aio.ServicerContext[Any, Any]
# What a hello may claim: pids are positive int32s; an exec id is the gateway's (32 hex digits);
# a command is kept for display only, so a long one is cut.
MAX_PID = 2**31 - 1
MAX_EXEC_ID = 64
MAX_COMMAND_ARGS = 256
MAX_COMMAND_BYTES = 64 * 1024
# How often every sandbox's commands are pruned (the one at hand is, every call): against a
# retention of an hour, a sandbox forgotten or a command ended up to this late changes nothing.
_SWEEP_INTERVAL_MS = 10_000


@dataclass(eq=False)
class BackgroundProcess:
    """One background command: what it runs, the session following it (None between sessions),
    its output ring, and how it ended once it has."""

    pid: int
    exec_id: str
    command: list[str]
    tty: bool
    ring: OutputRing
    session: SupervisorSession | None = None
    channel: ExecChannel | None = None
    started_at_ms: int = field(default_factory=now_ms)
    ended_at_ms: int = 0
    exited: spb.ExecExited | None = None
    failure: WarmshellError | None = None  # it ended as a call (its supervisor lost it), not by exiting
    # Its supervisor says it exited; the rest of its output and its exit are on their way.
    exit_reported: bool = False
    detached_at_ms: int = 0  # when its session ended (it waits for the next one)
    changes: Changes = field(default_factory=Changes)

    @property
    def running(self) -> bool:
        """Not yet exited (nor ended with its session)."""
        return self.exited is None and self.failure is None

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
    # The session its pids were last handed out or adopted on: while it is open, `last_pid` is
    # the only record of them here (a later session's hello says them again).
    session: SupervisorSession | None = None

    def forgettable(self) -> bool:
        return not self.processes and (self.session is None or self.session.closed.is_set())


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
        self._swept_at_ms = -_SWEEP_INTERVAL_MS  # (the first call sweeps)

    def start(
        self, sandbox_id: SandboxId, session: SupervisorSession, request: pb.StartProcessRequest
    ) -> BackgroundProcess:
        """Start the command in the sandbox and keep its output. ResourceExhaustedError with
        MAX_RUNNING already running there."""
        self._prune(sandbox_id)
        sandbox = self._sandboxes.setdefault(sandbox_id, _Sandbox())
        if sum(p.running and not p.exit_reported for p in sandbox.processes.values()) >= MAX_RUNNING:
            raise ResourceExhaustedError(
                f"sandbox already runs {MAX_RUNNING} background commands (the most it may): wait for one to exit"
            )
        if sandbox.last_pid >= MAX_PID:  # only a supervisor's hello can claim so many
            raise ResourceExhaustedError(f"the sandbox has used every background pid (up to {MAX_PID})")
        start = request.start
        sandbox.last_pid, sandbox.session = sandbox.last_pid + 1, session
        channel = self._relay.open(session, start.exec, start, background=(sandbox.last_pid, self._history_bytes))
        if not request.open_stdin:
            session.send(spb.GatewayMessage(exec_input=spb.ExecInput(exec_id=channel.exec_id, eof=True)))
        process = BackgroundProcess(
            pid=sandbox.last_pid,
            exec_id=channel.exec_id,
            command=list(start.exec.command),
            tty=start.tty,
            ring=OutputRing(self._history_bytes),
        )
        sandbox.processes[process.pid] = process
        self._follow_on(sandbox_id, process, session, channel)
        return process

    def adopt(self, session: SupervisorSession, hello: spb.SupervisorHello) -> None:
        """A new session: follow the commands its supervisor keeps (the hello's list, taken
        within the bounds), under their pids; a command this gateway followed that the list
        lacks ended with its supervisor (a restarted one keeps nothing)."""
        sandbox_id = SandboxId(session.sandbox_id)
        self._prune(sandbox_id)
        sandbox = self._sandboxes.setdefault(sandbox_id, _Sandbox())
        listed = _admissible(hello.background)
        sandbox.last_pid = max(sandbox.last_pid, min(hello.background_last_pid, MAX_PID), *listed)
        sandbox.session = session
        for pid, entry in listed.items():
            process = sandbox.processes.get(pid)
            if process is None or process.exec_id != entry.exec_id:
                process = _adopted(entry, OutputRing(self._history_bytes))
                sandbox.processes[pid] = process
            process.exit_reported = entry.HasField("exited")
            if process.running:
                channel = self._relay.follow(session, entry.exec_id, process.ring.end)
                self._follow_on(sandbox_id, process, session, channel)
        for process in sandbox.processes.values():
            if process.running and process.pid not in listed:
                self._end(sandbox_id, process, FailedPreconditionError("its sandbox's supervisor no longer has it"))

    def _follow_on(
        self, sandbox_id: SandboxId, process: BackgroundProcess, session: SupervisorSession, channel: ExecChannel
    ) -> None:
        process.session, process.channel = session, channel
        process.changes.notify()
        task = asyncio.create_task(
            self._keep(sandbox_id, process, session, channel), name=f"background {sandbox_id} {process.pid}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def list(self, sandbox_id: SandboxId, *, over: bool = False) -> list[BackgroundProcess]:
        """The sandbox's commands, running and recently exited, oldest first. `over`: the sandbox
        has ended, so a command waiting for its next session ended with it."""
        self._prune(sandbox_id)
        sandbox = self._sandboxes.get(sandbox_id)
        processes = [] if sandbox is None else sorted(sandbox.processes.values(), key=lambda p: p.pid)
        if over:
            for process in processes:
                if process.running and process.session is None:
                    self._end(sandbox_id, process, FailedPreconditionError("the sandbox ended"))
        return processes

    def get(self, sandbox_id: SandboxId, pid: int, *, over: bool = False) -> BackgroundProcess:
        """One command by pid; NotFoundError naming the field when the sandbox has none such."""
        process = next((p for p in self.list(sandbox_id, over=over) if p.pid == pid), None)
        if process is None:
            raise NotFoundError(f"pid: the sandbox has no background command {pid} (see ListProcesses)")
        return process

    async def _keep(
        self, sandbox_id: SandboxId, process: BackgroundProcess, session: SupervisorSession, channel: ExecChannel
    ) -> None:
        """Take the command's output into its ring until it ends, or until its session does."""
        while True:
            event = await channel.events.get()
            if process.channel is not channel:  # a newer session follows it now
                return
            if isinstance(event, spb.OutputData):
                process.ring.append_at(event.offset, event.stderr, event.data)
                grant_credit(session, channel, len(event.data))
                process.changes.notify()
                continue
            if channel.session_ended:  # it runs on in the sandbox: the next session follows it
                process.session = process.channel = None
                process.detached_at_ms = self._clock()
                process.changes.notify()
                return
            failure = exec_failure(event)
            if failure is None and isinstance(event, spb.ExecExited):
                process.exited = event
            self._end(sandbox_id, process, failure)
            return

    def _end(self, sandbox_id: SandboxId, process: BackgroundProcess, failure: WarmshellError | None) -> None:
        process.failure = failure
        process.session = process.channel = None
        process.ended_at_ms = self._clock()
        process.changes.notify()
        self._touch(sandbox_id)

    def observe(self, record: SandboxRecord) -> None:
        """Records observer: the commands of a sandbox that ended have ended with it (no next
        session will follow them); one being deleted is forgotten with them."""
        sandbox = self._sandboxes.get(record.id)
        if sandbox is None or record.status.phase not in phases.TERMINAL:
            return
        if record.status.phase == Phase.DELETING:
            del self._sandboxes[record.id]
        for process in sandbox.processes.values():
            if process.running:
                self._end(record.id, process, FailedPreconditionError("the sandbox ended"))

    def _prune(self, at_hand: SandboxId) -> None:
        """Forget exited commands past their retention, and past MAX_EXITED per sandbox; end one
        whose session ended that long ago with no next one (a sandbox this gateway did not see
        end: with replicas, deleted through another). The sandbox at hand every call; the others
        in a sweep at most every `_SWEEP_INTERVAL_MS`: every supervisor's registration calls here,
        and each idle pool member's open session keeps an entry, so a sweep per call walked every
        member per member started (76 µs of CPU a call at 100 members, 355 µs at 500)."""
        now = self._clock()
        oldest = now - EXITED_RETENTION_SECONDS * 1000
        if now - self._swept_at_ms >= _SWEEP_INTERVAL_MS:
            self._swept_at_ms = now
            for sandbox_id in list(self._sandboxes):
                self._prune_one(sandbox_id, oldest)
        elif at_hand in self._sandboxes:
            self._prune_one(at_hand, oldest)

    def _prune_one(self, sandbox_id: SandboxId, oldest: int) -> None:
        sandbox = self._sandboxes[sandbox_id]
        for process in sandbox.processes.values():
            if process.running and process.session is None and process.detached_at_ms < oldest:
                self._end(sandbox_id, process, FailedPreconditionError("its sandbox's supervisor never came back"))
        exited = sorted((p for p in sandbox.processes.values() if not p.running), key=lambda p: p.ended_at_ms)
        for index, process in enumerate(exited):
            if process.ended_at_ms < oldest or index < len(exited) - MAX_EXITED:
                del sandbox.processes[process.pid]
        if sandbox.forgettable():
            del self._sandboxes[sandbox_id]

    async def attach(
        self, process: BackgroundProcess, context: Ctx, requests: AsyncIterator[pb.ExecStreamRequest]
    ) -> None:
        """Write the command's held output, then its live output and its end, to the client;
        pass its stdin, resizes and signals on while it runs (on the session following it when
        the call began: UnavailableError once another one does). Leaving stops nothing."""
        inputs: asyncio.Task[None] | None = None
        session, channel = process.session, process.channel
        if session is not None and channel is not None and channel.input_window is not None:
            relay = self._relay.relay_input(session, channel, requests, tty=process.tty, eof_at_end=False)
            inputs = asyncio.create_task(relay)
        try:
            await self._follow(process, context, inputs, channel)
        finally:
            if inputs is not None:
                inputs.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await inputs

    async def _follow(
        self, process: BackgroundProcess, context: Ctx, inputs: asyncio.Task[None] | None, channel: ExecChannel | None
    ) -> None:
        position = 0
        while True:
            changed = process.changes.next()
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
            if inputs is not None and process.channel is not channel:
                raise UnavailableError("the sandbox's supervisor session changed: attach again to send it input")
            await _wait_changed(changed, inputs)

    async def aclose(self) -> None:
        """Stop following output (the gateway stops; the commands run on in their sandboxes)."""
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


def _admissible(entries: Collection[spb.BackgroundExec]) -> dict[int, spb.BackgroundExec]:
    """The hello's commands that fit the bounds, by pid: valid and distinct pids and exec ids, at
    most MAX_RUNNING running and the latest MAX_EXITED exited; the rest are logged and ignored."""
    running: dict[int, spb.BackgroundExec] = {}
    exited: dict[int, spb.BackgroundExec] = {}
    exec_ids: set[str] = set()
    for entry in entries:
        valid = 0 < entry.pid <= MAX_PID and 0 < len(entry.exec_id) <= MAX_EXEC_ID
        if valid and entry.exec_id not in exec_ids and entry.pid not in running and entry.pid not in exited:
            (exited if entry.HasField("exited") else running)[entry.pid] = entry
            exec_ids.add(entry.exec_id)
    kept = sorted(running.values(), key=lambda e: e.pid)[:MAX_RUNNING]
    kept += sorted(exited.values(), key=lambda e: e.ended_at_ms)[-MAX_EXITED:]
    if ignored := len(entries) - len(kept):
        log.warning("a supervisor's hello listed %d background commands past the bounds or malformed; ignored", ignored)
    return {e.pid: e for e in kept}


def _adopted(entry: spb.BackgroundExec, ring: OutputRing) -> BackgroundProcess:
    """A command first seen in a hello (this gateway never followed it)."""
    command: list[str] = []
    size = 0
    for arg in entry.command[:MAX_COMMAND_ARGS]:
        size += len(arg)
        if size > MAX_COMMAND_BYTES:
            break
        command.append(arg)
    ring.append_at(entry.output_start, False, b"")  # what the supervisor dropped before this gateway saw it
    return BackgroundProcess(
        pid=entry.pid,
        exec_id=entry.exec_id,
        command=command,
        tty=entry.tty,
        ring=ring,
        started_at_ms=entry.started_at_ms,
    )
