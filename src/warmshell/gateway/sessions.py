"""Live supervisor sessions (ConnectSupervisor), keyed by sandbox id, and the exec relay over them.

The gateway never dials a sandbox: exec requests travel down the supervisor's own session and
their output comes back up it. A sandbox has at most one session, and a healthy one (heard from
within its heartbeat window) is never superseded: whoever else holds the sandbox's token, a second
session is refused until the first has ended or gone silent.

With several gateway replicas each holds its own table: a session lives on the replica its
supervisor's connection reached, its id names that replica (so ids are unique across replicas),
and the stored record says which replica holds it (see `gateway.forwarding`).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.core.errors import AlreadyExistsError, WarmshellError
from warmshell.core.ids import SandboxId
from warmshell.core.models import now_ms
from warmshell.sandboxio.window import OutputWindow

__all__ = ["MISSED_HEARTBEATS", "ExecChannel", "SessionTable", "SupervisorSession"]

# A session that has sent nothing for this many heartbeat intervals is considered dead.
MISSED_HEARTBEATS = 3


@dataclass(eq=False)
class ExecChannel:
    """The gateway end of one exec: output chunks, then the exit.

    Flow control: the supervisor may have at most `window` bytes of output in flight (sent up,
    not yet passed on to the client); `passed_on` grants them back. So the queue is bounded by
    the window, never by dropping: a supervisor that overruns it fails the exec instead."""

    exec_id: str
    window: int = 0  # 0: no flow control (tests of the relay alone)
    # Output, then the exit, or the error that ended the exec without one (the gateway stopping).
    events: asyncio.Queue[spb.OutputData | spb.ExecExited | WarmshellError] = field(default_factory=asyncio.Queue)
    in_flight: int = 0
    _ungranted: int = 0
    # Streamed stdin not yet written to the command (None: no streamed stdin).
    input_window: OutputWindow | None = None
    # Ended because its session did (a background command runs on, for the next session).
    session_ended: bool = False

    def passed_on(self, size: int) -> int:
        """`size` bytes reached the client: the credit to grant now (0 = keep batching; grants
        go out per quarter window, not per chunk)."""
        self.in_flight -= size
        self._ungranted += size
        if self._ungranted < max(1, self.window // 4):
            return 0
        grant, self._ungranted = self._ungranted, 0
        return grant


@dataclass(eq=False)
class SupervisorSession:
    """One supervisor's open ConnectSupervisor stream."""

    sandbox_id: SandboxId
    instance_id: str
    session_id: str
    outbox: asyncio.Queue[spb.GatewayMessage | None] = field(default_factory=asyncio.Queue)
    execs: dict[str, ExecChannel] = field(default_factory=dict)
    # Results of file operations in flight (files served by the sandbox's supervisor), by op id.
    file_ops: dict[str, asyncio.Queue[spb.FileResult]] = field(default_factory=dict)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    last_seen: int = field(default_factory=now_ms)

    def send(self, message: spb.GatewayMessage) -> None:
        """Queue a message for the supervisor."""
        self.outbox.put_nowait(message)

    def close(
        self, reason: str = "", *, reconnect: bool = False, ends_execs: Callable[[], WarmshellError] | None = None
    ) -> None:
        """End the session: pending execs fail (with the error `ends_execs` makes when given, else
        as "session closed"), the stream is finished. With a reason, the supervisor is told whether to
        reconnect (gateway restart) or to stop."""
        if self.closed.is_set():
            return
        self.closed.set()
        if reason:
            self.outbox.put_nowait(spb.GatewayMessage(shutdown=spb.Shutdown(reason=reason, reconnect=reconnect)))
        self.outbox.put_nowait(None)
        for channel in self.execs.values():
            channel.session_ended = True
            closed = spb.ExecExited(exec_id=channel.exec_id, exit_code=-1, error="session closed")
            channel.events.put_nowait(ends_execs() if ends_execs is not None else closed)
        self.execs.clear()
        for op_id, results in self.file_ops.items():
            results.put_nowait(spb.FileResult(op_id=op_id, error="the sandbox's session closed"))
        self.file_ops.clear()

    def healthy(self, now: int, window_ms: int) -> bool:
        """Open and heard from within the last `window_ms` (a live supervisor answers every
        heartbeat, so a healthy session's supervisor is running)."""
        return not self.closed.is_set() and now - self.last_seen <= window_ms

    def deliver(self, message: spb.OutputData | spb.ExecExited | spb.ExecInputCredit) -> None:
        """Route an exec's output or exit to whoever is waiting for it. Output beyond the exec's
        window (a supervisor that ignores flow control) ends the exec with an error and cancels
        it in the sandbox: nothing is dropped silently."""
        channel = self.execs.get(message.exec_id)
        if channel is None:
            return
        if isinstance(message, spb.ExecInputCredit):
            if channel.input_window is not None:
                channel.input_window.grant(message.bytes)
            return
        if isinstance(message, spb.OutputData) and channel.window:
            channel.in_flight += len(message.data)
            if channel.in_flight > channel.window:
                del self.execs[message.exec_id]
                error = f"the sandbox sent more than its {channel.window}-byte output window"
                channel.events.put_nowait(spb.ExecExited(exec_id=message.exec_id, exit_code=-1, error=error))
                self.send(spb.GatewayMessage(exec_cancel=spb.ExecCancel(exec_id=message.exec_id)))
                return
        if isinstance(message, spb.ExecExited):
            del self.execs[message.exec_id]
        channel.events.put_nowait(message)


class SessionTable:
    """Which supervisor session currently speaks for each sandbox."""

    def __init__(self, *, window_ms: int = 30_000, clock: Callable[[], int] = now_ms, owner: str = "") -> None:
        """`window_ms`: how long a session may stay silent and still count as healthy (the
        gateway passes MISSED_HEARTBEATS heartbeat intervals). `owner`: this gateway replica's
        id, which prefixes every session id it hands out."""
        self.owner = owner
        self._sessions: dict[SandboxId, SupervisorSession] = {}
        self._unrecorded: dict[SandboxId, str] = {}  # closes the store missed, by session id
        self._ids = itertools.count(1)
        self._window_ms = window_ms
        self._clock = clock

    def live(self, sandbox_id: SandboxId) -> SupervisorSession | None:
        """The sandbox's session if it is healthy, else None."""
        session = self._sessions.get(sandbox_id)
        return session if session is not None and session.healthy(self._clock(), self._window_ms) else None

    def open(self, sandbox_id: SandboxId, instance_id: str) -> SupervisorSession:
        """Start a session. AlreadyExistsError while the sandbox has a healthy one; an older one
        that has gone silent is superseded and closed."""
        if self.live(sandbox_id) is not None:
            raise AlreadyExistsError(f"sandbox {sandbox_id} already has a live supervisor session")
        previous = self._sessions.get(sandbox_id)
        prefix = f"{self.owner}/" if self.owner else ""
        session = SupervisorSession(sandbox_id, instance_id, f"{prefix}s{next(self._ids)}", last_seen=self._clock())
        self._sessions[sandbox_id] = session
        if previous is not None:
            previous.close("superseded by a newer session")
        return session

    def close_if_current(self, session: SupervisorSession) -> bool:
        """Close a session; True when it was the current one for its sandbox."""
        current = self._sessions.get(session.sandbox_id) is session
        if current:
            del self._sessions[session.sandbox_id]
        session.close()
        return current

    def end(self, sandbox_id: SandboxId, reason: str) -> None:
        """Close the sandbox's session, if it has one, telling its supervisor to stop: why
        (`reason`) is its instance is over (deleted, paused, past its deadline)."""
        session = self._sessions.pop(sandbox_id, None)
        if session is not None:
            session.close(reason)

    def get(self, sandbox_id: SandboxId) -> SupervisorSession | None:
        """The live session of a sandbox."""
        return self._sessions.get(sandbox_id)

    def close_all(self, reason: str, *, ends_execs: Callable[[], WarmshellError] | None = None) -> None:
        """Gateway shutdown: tell every supervisor (they reconnect to the next gateway); the
        execs still running end with `ends_execs` (see `SupervisorSession.close`)."""
        for session in list(self._sessions.values()):
            session.close(reason, reconnect=True, ends_execs=ends_execs)
        self._sessions.clear()

    def unrecorded_close(self, sandbox_id: SandboxId, session_id: str) -> None:
        """The close of `session_id` could not be written (the store was unreachable): until it
        is, the record names this replica as the holder of a live session, and every other
        replica refuses the supervisor's reconnect (the reconciler writes it again)."""
        self._unrecorded[sandbox_id] = session_id

    def unrecorded_closes(self) -> list[tuple[SandboxId, str]]:
        """The closes still to be written, oldest first."""
        return list(self._unrecorded.items())

    def recorded_close(self, sandbox_id: SandboxId, session_id: str) -> None:
        """The close of `session_id` is written now (a later unrecorded one is kept)."""
        if self._unrecorded.get(sandbox_id) == session_id:
            del self._unrecorded[sandbox_id]

    def __len__(self) -> int:
        return len(self._sessions)
