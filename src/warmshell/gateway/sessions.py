"""Live supervisor sessions (ConnectSupervisor), keyed by sandbox id, and the exec relay over them.

The gateway never dials a sandbox: exec requests travel down the supervisor's own session and
their output comes back up it. A sandbox has at most one session, and a healthy one (heard from
within its heartbeat window) is never superseded: whoever else holds the sandbox's token, a second
session is refused until the first has ended or gone silent.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.core.errors import AlreadyExistsError
from warmshell.core.ids import SandboxId
from warmshell.core.models import now_ms

__all__ = ["MISSED_HEARTBEATS", "ExecChannel", "SessionTable", "SupervisorSession"]

EXEC_QUEUE = 1024
# A session that has sent nothing for this many heartbeat intervals is considered dead.
MISSED_HEARTBEATS = 3


@dataclass(eq=False)
class ExecChannel:
    """The gateway end of one exec: output chunks, then the exit."""

    exec_id: str
    events: asyncio.Queue[spb.OutputData | spb.ExecExited] = field(default_factory=lambda: asyncio.Queue(EXEC_QUEUE))


@dataclass(eq=False)
class SupervisorSession:
    """One supervisor's open ConnectSupervisor stream."""

    sandbox_id: SandboxId
    instance_id: str
    session_id: str
    outbox: asyncio.Queue[spb.GatewayMessage | None] = field(default_factory=asyncio.Queue)
    execs: dict[str, ExecChannel] = field(default_factory=dict)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    last_seen: int = field(default_factory=now_ms)

    def send(self, message: spb.GatewayMessage) -> None:
        """Queue a message for the supervisor."""
        self.outbox.put_nowait(message)

    def close(self, reason: str = "", *, reconnect: bool = False) -> None:
        """End the session: pending execs fail, the stream is finished. With a reason, the
        supervisor is told whether to reconnect (gateway restart) or to stop."""
        if self.closed.is_set():
            return
        self.closed.set()
        if reason:
            self.outbox.put_nowait(spb.GatewayMessage(shutdown=spb.Shutdown(reason=reason, reconnect=reconnect)))
        self.outbox.put_nowait(None)
        for channel in self.execs.values():
            channel.events.put_nowait(spb.ExecExited(exec_id=channel.exec_id, exit_code=-1, error="session closed"))
        self.execs.clear()

    def healthy(self, now: int, window_ms: int) -> bool:
        """Open and heard from within the last `window_ms` (a live supervisor answers every
        heartbeat, so a healthy session's supervisor is running)."""
        return not self.closed.is_set() and now - self.last_seen <= window_ms

    def deliver(self, message: spb.OutputData | spb.ExecExited) -> None:
        """Route an exec's output or exit to whoever is waiting for it."""
        channel = self.execs.get(message.exec_id)
        if channel is None:
            return
        if isinstance(message, spb.ExecExited):
            del self.execs[message.exec_id]
        try:
            channel.events.put_nowait(message)
        except asyncio.QueueFull:
            # The reader is gone or far behind; drop output but never the exit.
            if isinstance(message, spb.ExecExited):
                channel.events.get_nowait()
                channel.events.put_nowait(message)


class SessionTable:
    """Which supervisor session currently speaks for each sandbox."""

    def __init__(self, *, window_ms: int = 30_000, clock: Callable[[], int] = now_ms) -> None:
        """`window_ms`: how long a session may stay silent and still count as healthy (the
        gateway passes MISSED_HEARTBEATS heartbeat intervals)."""
        self._sessions: dict[SandboxId, SupervisorSession] = {}
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
        session = SupervisorSession(sandbox_id, instance_id, f"s{next(self._ids)}", last_seen=self._clock())
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

    def get(self, sandbox_id: SandboxId) -> SupervisorSession | None:
        """The live session of a sandbox."""
        return self._sessions.get(sandbox_id)

    def close_all(self, reason: str) -> None:
        """Gateway shutdown: tell every supervisor (they reconnect to the next gateway)."""
        for session in list(self._sessions.values()):
            session.close(reason, reconnect=True)
        self._sessions.clear()

    def __len__(self) -> int:
        return len(self._sessions)
