"""Rendering the SDK's streams: WatchSandbox events while a create waits (`StatusLine.show`, the
hook `warmshell.sdk.following.follow` calls: live status line, workload output) and ExecSandbox
(output as it comes, then the exit code).

Workload bytes go to this process's stdout/stderr untouched; the live status line goes to stderr
through rich, and only when stderr is a terminal (rich is imported only then), so piped output
stays clean and scripts do not pay for it.
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import TYPE_CHECKING, Self

from warmshell.api.v1 import sandbox_pb2
from warmshell.cli import render
from warmshell.cli.errors import CliError, ExitCode
from warmshell.sdk import views

if TYPE_CHECKING:
    from rich.status import Status

    from warmshell.sdk.client import Client

__all__ = ["ExecResult", "StatusLine", "exec_command", "outcome_line", "write_output"]


class StatusLine:
    """A spinner with the phase and the latest progress message, on stderr, while waiting."""

    def __init__(self, name: str, *, enabled: bool) -> None:
        self._name = name
        self._phase = "Provisioning"
        self._message = ""
        self._status: Status | None = None
        if enabled and sys.stderr.isatty():
            from rich.console import Console

            self._status = Console(stderr=True, highlight=False).status(self._text())

    def _text(self) -> str:
        from rich.markup import escape  # the message comes from the gateway: never markup

        suffix = f" - {escape(self._message)}" if self._message else ""
        return f"sandbox {escape(self._name)}: {self._phase}{suffix}"

    def update(self, *, phase: str | None = None, message: str | None = None) -> None:
        """Show a new phase and/or progress message."""
        self._phase = phase or self._phase
        self._message = message if message is not None else self._message
        if self._status is not None:
            self._status.update(self._text())

    def show(self, event: sandbox_pb2.SandboxEvent) -> None:
        """Render one WatchSandbox event: a phase or progress message on the line; the workload's
        output (after taking the line down) to our stdout/stderr."""
        kind = event.WhichOneof("event")
        if kind == "sandbox":
            self.update(phase=render.phase_name(event.sandbox.status.phase))
        elif kind == "progress":
            self.update(message=event.progress.message)
        elif kind == "output":
            self.stop()
            write_output(event.output.stream, event.output.data)

    def stop(self) -> None:
        """Take the line down (before workload output, and at the end); idempotent."""
        if self._status is not None:
            self._status.stop()
            self._status = None

    def __enter__(self) -> Self:
        if self._status is not None:
            self._status.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def write_output(stream: int, data: bytes) -> None:
    """Write workload bytes to our stdout or stderr as they arrive (flushed: users watch them)."""
    target = sys.stderr if stream == sandbox_pb2.OutputChunk.STREAM_STDERR else sys.stdout
    target.buffer.write(data)
    target.buffer.flush()


class ExecResult:
    """What an exec produced; output is only kept when asked to capture it."""

    def __init__(self) -> None:
        self.exit_code: int | None = None
        self.outcome = views.ExecOutcome()
        self.stdout = bytearray()
        self.stderr = bytearray()


def outcome_line(outcome: views.ExecOutcome, timeout: float | None) -> str | None:
    """What the CLI says on its own stderr about how a command ended (a timeout, or why it
    never started); None when the command's exit code says it all."""
    if outcome.error is not None:
        return f"warmshell: {outcome.error_message}"
    if outcome.timed_out:
        return f"warmshell: timed out after {timeout:g}s" if timeout else "warmshell: timed out"
    return None


def exec_command(
    client: Client, request: sandbox_pb2.ExecSandboxRequest, *, capture: bool, timeout: float | None
) -> ExecResult:
    """Run one exec: stream (or capture) its output and return once its exit code arrives
    (`timeout`: the stream's deadline, see `warmshell.sdk.calls.exec_deadline`)."""
    result = ExecResult()
    for event in client.service.exec_sandbox(request, timeout=timeout):
        kind = event.WhichOneof("event")
        if kind == "stdout":
            _emit(result.stdout, sandbox_pb2.OutputChunk.STREAM_STDOUT, event.stdout, capture)
        elif kind == "stderr":
            _emit(result.stderr, sandbox_pb2.OutputChunk.STREAM_STDERR, event.stderr, capture)
        elif kind == "exit_code":
            result.exit_code = event.exit_code
            result.outcome = views.exec_outcome(event.outcome)
    if result.exit_code is None:
        raise CliError("the exec stream ended without an exit code", ExitCode.FAILURE)
    return result


def _emit(buffer: bytearray, stream: int, data: bytes, capture: bool) -> None:
    if capture:
        buffer.extend(data)
    else:
        write_output(stream, data)
