"""The sandbox's background commands, kept by its supervisor across sessions.

A background command must outlive whoever holds the supervisor's session: on Kubernetes the pod's
supervisor reconnects to another gateway (a restart, a replica that died) while the workload
runs on. So the supervisor, not the gateway, owns the command and its output ring: the command's
output goes into the ring and never waits for a session, and each session the gateway opens
follows a command from an offset (`follow`: the ring's bytes after it, then live output, then
the exit), paced by that session's output window. A new session's hello lists what is kept
(`hello`), so a gateway that has never seen the commands adopts them with their pids.

Bounds (as the gateway's, `sandboxio.outputring`): `MAX_RUNNING` running, `MAX_EXITED` exited
kept for `EXITED_RETENTION_SECONDS` at most, each with one ring of the size the gateway asked
for (capped by `MAX_HISTORY_BYTES`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.sandboxio.interactive import ExecInput
from warmshell.sandboxio.outputring import EXITED_RETENTION_SECONDS, MAX_EXITED, MAX_RUNNING, Changes, OutputRing
from warmshell.sandboxio.processes import OutputSink
from warmshell.sandboxio.window import OutputWindow

__all__ = ["MAX_HISTORY_BYTES", "BackgroundExecs"]

# A ring larger than this is refused: the most a gateway's exec_history_bytes may be (its default
# is 512 KiB); 32 rings of it bound what one sandbox's supervisor holds.
MAX_HISTORY_BYTES = 64 * 1024 * 1024

# Runs one command to its end: its start, where its output goes, its live input (if any).
RunCommand = Callable[[spb.ExecStart, OutputSink, ExecInput | None], Awaitable[spb.ExecExited]]
Send = Callable[[spb.SupervisorMessage], Awaitable[None]]


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(eq=False)
class _Command:
    start: spb.ExecStart
    ring: OutputRing
    input: ExecInput | None
    started_at_ms: int
    task: asyncio.Task[None] | None = None
    exited: spb.ExecExited | None = None
    ended_at_ms: int = 0
    changes: Changes = field(default_factory=Changes)

    def info(self) -> spb.BackgroundExec:
        message = spb.BackgroundExec(
            exec_id=self.start.exec_id,
            pid=self.start.background_pid,
            command=self.start.command,
            tty=self.start.tty,
            started_at_ms=self.started_at_ms,
            ended_at_ms=self.ended_at_ms,
            output_start=self.ring.start,
        )
        if self.exited is not None:
            message.exited.CopyFrom(self.exited)
        return message


@dataclass(eq=False)
class _Follower:
    """One session's reading of one command: how far it has sent."""

    window: OutputWindow
    sent: int
    progress: Changes = field(default_factory=Changes)
    task: asyncio.Task[None] | None = None


class BackgroundExecs:
    """The background commands of one sandbox, by exec id."""

    def __init__(self, run: RunCommand, send: Send, *, clock: Callable[[], int] = _now_ms) -> None:
        """`run`: how a command is started (the supervisor's runner); `send`: up the current
        session (the supervisor's outbox, which a new session empties of old exec messages)."""
        self._run = run
        self._send = send
        self._clock = clock
        self._commands: dict[str, _Command] = {}
        self._followers: dict[str, _Follower] = {}
        self.last_pid = 0

    async def start(self, start: spb.ExecStart, stdin: ExecInput | None) -> None:
        """Run a background command and follow it on the current session from its first byte;
        one past the bounds (or with a pid already used) ends at once with an error."""
        self._prune()
        refusal = self._refusal(start)
        if refusal:
            await self._send(
                spb.SupervisorMessage(exec_exited=spb.ExecExited(exec_id=start.exec_id, exit_code=-1, error=refusal))
            )
            return
        self.last_pid = max(self.last_pid, start.background_pid)
        command = _Command(start, OutputRing(start.history_bytes), stdin, self._clock())
        self._commands[start.exec_id] = command
        command.task = asyncio.create_task(self._keep(command), name=f"background {start.background_pid}")
        self.follow(start.exec_id, 0, start.output_window_bytes)

    def _refusal(self, start: spb.ExecStart) -> str:
        if sum(c.exited is None for c in self._commands.values()) >= MAX_RUNNING:
            return f"the sandbox already runs {MAX_RUNNING} background commands (the most it may)"
        if not 0 < start.history_bytes <= MAX_HISTORY_BYTES:
            return f"history_bytes: must be in 1..{MAX_HISTORY_BYTES}"
        if start.background_pid <= self.last_pid or start.exec_id in self._commands:
            return f"background pid {start.background_pid} was already used in this sandbox"
        return ""

    async def _keep(self, command: _Command) -> None:
        ring = command.ring

        async def sink(stderr: bool, data: bytes) -> None:
            # While a session follows, output it has not sent yet is not pushed out of the ring:
            # the command waits for the session (as a foreground exec waits for its window, which
            # the gateway grants as it receives), never for a client; with no session it never waits.
            while (follower := self._followers.get(command.start.exec_id)) is not None and (
                follower.sent < ring.end and ring.end + len(data) - follower.sent > ring.capacity
            ):
                await follower.progress.next().wait()
            ring.append(stderr, data)
            command.changes.notify()

        try:
            command.exited = await self._run(command.start, sink, command.input)
        finally:
            if command.exited is None:  # cancelled: the supervisor is stopping, or the gateway cancelled it
                command.exited = spb.ExecExited(exec_id=command.start.exec_id, exit_code=-1, error="cancelled")
            command.ended_at_ms = self._clock()
            command.changes.notify()

    def follow(self, exec_id: str, offset: int, window_bytes: int) -> bool:
        """Send the command's output from `offset` on this session, then its exit (False: no
        such command; the caller says so)."""
        command = self._commands.get(exec_id)
        if command is None:
            return False
        self._stop_following(exec_id)
        follower = _Follower(OutputWindow(window_bytes or command.ring.capacity), max(offset, command.ring.start))
        follower.task = asyncio.create_task(self._forward(command, follower), name=f"follow {exec_id}")
        self._followers[exec_id] = follower
        follower.task.add_done_callback(lambda _: self._forgotten(exec_id, follower))
        return True

    def _forgotten(self, exec_id: str, follower: _Follower) -> None:
        if self._followers.get(exec_id) is follower:
            del self._followers[exec_id]
        follower.progress.notify()  # a command waiting for it writes on

    async def _forward(self, command: _Command, follower: _Follower) -> None:
        exec_id = command.start.exec_id
        while True:
            changed = command.changes.next()
            _, chunks = command.ring.read(follower.sent)
            for chunk in chunks:
                view, offset = memoryview(chunk.data), chunk.offset
                while view:
                    size = await follower.window.take(len(view))
                    data = spb.OutputData(exec_id=exec_id, stderr=chunk.stderr, data=bytes(view[:size]), offset=offset)
                    await self._send(spb.SupervisorMessage(output=data))
                    view, offset = view[size:], offset + size
                    follower.sent = offset
                    follower.progress.notify()
            if command.exited is not None and follower.sent >= command.ring.end:
                await self._send(spb.SupervisorMessage(exec_exited=command.exited))
                return
            await changed.wait()

    def credit(self, exec_id: str, size: int) -> bool:
        """The gateway passed `size` more bytes on (False: not a command followed here)."""
        follower = self._followers.get(exec_id)
        if follower is None:
            return False
        follower.window.grant(size)
        return True

    def input(self, exec_id: str) -> ExecInput | None:
        """The running command's stdin, resizes and signals (None: none such)."""
        command = self._commands.get(exec_id)
        return None if command is None or command.exited is not None else command.input

    def cancel(self, exec_id: str) -> None:
        """Stop the command (the gateway gave up on it: its output overran the window)."""
        command = self._commands.get(exec_id)
        if command is not None and command.task is not None:
            command.task.cancel()

    def end_session(self) -> None:
        """The session ended: nobody follows any command now (they run on)."""
        for exec_id in list(self._followers):
            self._stop_following(exec_id)

    def _stop_following(self, exec_id: str) -> None:
        follower = self._followers.pop(exec_id, None)
        if follower is not None and follower.task is not None:
            follower.task.cancel()
            follower.progress.notify()

    def hello(self) -> list[spb.BackgroundExec]:
        """What a new session's hello lists: every command kept, oldest first."""
        self._prune()
        return [c.info() for c in sorted(self._commands.values(), key=lambda c: c.start.background_pid)]

    def _prune(self) -> None:
        """Forget exited commands past their retention, and past MAX_EXITED."""
        oldest = self._clock() - EXITED_RETENTION_SECONDS * 1000
        exited = sorted((c for c in self._commands.values() if c.ended_at_ms), key=lambda c: c.ended_at_ms)
        for index, command in enumerate(exited):
            if command.ended_at_ms < oldest or index < len(exited) - MAX_EXITED:
                self._stop_following(command.start.exec_id)
                del self._commands[command.start.exec_id]

    async def aclose(self) -> None:
        """The supervisor stops: its commands and followers stop with it."""
        tasks = [f.task for f in self._followers.values() if f.task is not None]
        tasks += [c.task for c in self._commands.values() if c.task is not None]
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)
