"""Background commands as the SDK shows them: `ProcessInfo` (what `processes()` lists) and the
requests that start one and reattach to one, shared by the sync and async clients.

A background command runs until it exits, whoever is connected: its handle is an interactive
`Process`/`AsyncProcess` with a `pid`, and closing the handle only detaches (`kill()` stops it).
Another client, in another process, lists the sandbox's commands and `connect(pid)`s to read the
output the gateway kept (the last `exec_history_bytes`), then the live output and the exit.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.sdk import views

__all__ = ["ProcessInfo", "attach_request", "process_info", "start_process_request"]


@dataclass(frozen=True)
class ProcessInfo:
    """One background command: running, or exited (with its `exit_code` and `outcome`, or the
    `error` that ended it when its session closed under it); how much output it wrote and how
    much of that the gateway's ring no longer holds."""

    pid: int
    command: tuple[str, ...]
    state: str  # "running" or "exited"
    started_at: datetime
    ended_at: datetime | None
    exit_code: int | None
    outcome: views.ExecOutcome | None
    error: str
    output_bytes: int
    dropped_bytes: int
    tty: bool

    @property
    def running(self) -> bool:
        """It has not exited yet."""
        return self.state == "running"

    @property
    def timed_out(self) -> bool:
        """It was killed at its timeout."""
        return self.outcome is not None and self.outcome.timed_out


def _time(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def process_info(message: pb.ProcessInfo) -> ProcessInfo:
    """The view of one ProcessInfo."""
    ended = message.state != "running"
    return ProcessInfo(
        pid=message.pid,
        command=tuple(message.command),
        state=message.state,
        started_at=_time(message.started_at_ms),
        ended_at=_time(message.ended_at_ms) if ended and message.ended_at_ms else None,
        exit_code=message.exit_code if ended else None,
        outcome=views.exec_outcome(message.outcome) if ended else None,
        error=message.error,
        output_bytes=message.output_bytes,
        dropped_bytes=message.dropped_bytes,
        tty=message.tty,
    )


def start_process_request(start: pb.ExecStreamRequest, *, open_stdin: bool) -> pb.StartProcessRequest:
    """StartProcess for what `start` (an exec stream's first message) would run."""
    return pb.StartProcessRequest(start=start.start, open_stdin=open_stdin)


def attach_request(name: str, workspace: str, pid: int) -> pb.ExecStreamRequest:
    """ConnectProcess's first message."""
    return pb.ExecStreamRequest(attach=pb.ProcessRef(name=name, workspace=workspace, pid=pid))
