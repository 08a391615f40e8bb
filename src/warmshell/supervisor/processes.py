"""Running the workload and exec'd commands, streaming their output: the supervisor's process seam.

`Runner` is the seam; `run_streaming` here starts processes as the supervisor's own children (a
supervisor inside its sandbox: the Kubernetes pod, the local driver's unisolated mode). The local
driver's isolated sandboxes supply another implementation that starts them through the
sandbox's agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol

__all__ = ["OutputSink", "Runner", "WorkdirError", "run_streaming"]

# (is_stderr, data) -> delivered to the gateway in order.
OutputSink = Callable[[bool, bytes], Awaitable[None]]
READ_CHUNK = 64 * 1024
EXIT_TIMEOUT = 124
EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126


class WorkdirError(OSError):
    """The command's working directory cannot be entered (so it never started)."""

    def __init__(self, error: int, workdir: str) -> None:
        super().__init__(error, os.strerror(error), workdir)
        self.workdir = workdir

    def __str__(self) -> str:
        if self.errno == errno.ENOENT:
            return f"workdir {self.workdir} does not exist"
        if self.errno == errno.ENOTDIR:
            return f"workdir {self.workdir} is not a directory"
        return f"workdir {self.workdir} cannot be entered: {os.strerror(self.errno or 0).lower()}"


class Runner(Protocol):
    """Starts one command and streams its output; returns its exit status (see `run_streaming`)."""

    async def __call__(
        self,
        command: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str,
        sink: OutputSink,
        stdin: bytes = b"",
        timeout: float | None = None,  # noqa: ASYNC109 - a per-command limit
    ) -> int: ...


async def _pump(stream: asyncio.StreamReader, stderr: bool, sink: OutputSink) -> None:
    while True:
        data = await stream.read(READ_CHUNK)
        if not data:
            return
        await sink(stderr, data)


def _kill_group(process: asyncio.subprocess.Process, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)


async def run_streaming(
    command: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str,
    sink: OutputSink,
    stdin: bytes = b"",
    timeout: float | None = None,  # noqa: ASYNC109 - a per-command limit, enforced with asyncio.timeout
    started: Callable[[asyncio.subprocess.Process], None] | None = None,
) -> int:
    """Run `command`, send its output to `sink` as it comes, return its exit status.

    Exit statuses follow the shell's conventions, so scripts read them the same way:
    127 not found, 126 not executable, 124 timed out, 128+N killed by signal N. WorkdirError
    when `cwd` cannot be entered."""
    try:
        process = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,  # its own process group, so a kill reaches its children
        )
    except OSError as exc:
        if exc.filename == cwd and exc.errno is not None:  # subprocess names the cwd when chdir failed
            raise WorkdirError(exc.errno, cwd) from None
        if isinstance(exc, FileNotFoundError):
            await sink(True, f"warmshell: {command[0]}: command not found\n".encode())
            return EXIT_NOT_FOUND
        if not isinstance(exc, PermissionError):
            raise

        await sink(True, f"warmshell: {command[0]}: permission denied\n".encode())
        return EXIT_NOT_EXECUTABLE
    if started is not None:
        started(process)
    assert process.stdout is not None
    assert process.stderr is not None
    if stdin:
        assert process.stdin is not None
        process.stdin.write(stdin)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            await process.stdin.drain()
        process.stdin.close()
    pumps = asyncio.gather(_pump(process.stdout, False, sink), _pump(process.stderr, True, sink))
    try:
        async with asyncio.timeout(timeout):
            await pumps
            code = await process.wait()
    except TimeoutError:
        _kill_group(process, signal.SIGKILL)
        await process.wait()
        pumps.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pumps
        await sink(True, f"warmshell: timed out after {timeout:g}s\n".encode())
        return EXIT_TIMEOUT
    except asyncio.CancelledError:
        _kill_group(process, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            await process.wait()
        raise
    return code if code >= 0 else 128 - code
