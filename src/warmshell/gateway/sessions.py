"""Live supervisor sessions (ConnectSupervisor), keyed by sandbox id, and the exec relay over them.

The gateway never dials a sandbox: exec requests travel down the supervisor's own session and
their output comes back up it.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field

from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.core.ids import SandboxId
from warmshell.core.models import now_ms

__all__ = ["ExecChannel", "SessionTable", "SupervisorSession"]

EXEC_QUEUE = 1024


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

    def __init__(self) -> None:
        self._sessions: dict[SandboxId, SupervisorSession] = {}
        self._ids = itertools.count(1)

    def open(self, sandbox_id: SandboxId, instance_id: str) -> SupervisorSession:
        """Start a session; an older one for the same sandbox is superseded and closed."""
        previous = self._sessions.get(sandbox_id)
        session = SupervisorSession(sandbox_id, instance_id, f"s{next(self._ids)}")
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
