"""Running the workload and exec'd commands, streaming their output: the process seam a supervisor
runs them through.

`Runner` is the seam; `run_streaming` here starts processes as the caller's own children (a
supervisor inside its sandbox: the Kubernetes pod; the local driver's unisolated mode). The local
runtime's isolated sandboxes supply another implementation that starts them through the
sandbox's agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from warmshell.sandboxio.interactive import ExecInput, pump_fd, set_window_size, write_stdin

__all__ = ["OutputSink", "Runner", "WorkdirError", "run_streaming"]

# (is_stderr, data) -> delivered to the gateway in order.
OutputSink = Callable[[bool, bytes], Awaitable[None]]
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
        io: ExecInput | None = None,
    ) -> int:
        """`io`, when given, streams stdin (after `stdin`, which goes first), resizes and signals to the command,
        and with `io.terminal` runs it on a new pseudo-terminal (its controlling terminal, all of
        stdin, stdout and stderr; output goes to `sink` as stdout)."""
        ...


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
    io: ExecInput | None = None,
) -> int:
    """Run `command`, send its output to `sink` as it comes, return its exit status (`io`: see
    `Runner`).

    Exit statuses follow the shell's conventions, so scripts read them the same way:
    127 not found, 126 not executable, 124 timed out, 128+N killed by signal N. WorkdirError
    when `cwd` cannot be entered."""
    if io is not None and io.terminal is not None:
        return await _run_on_terminal(command, env=env, cwd=cwd, sink=sink, stdin=stdin, timeout=timeout, io=io)
    streamed = io is not None
    # Plain pipes, read by `pump_fd`: asyncio's pipe transports would make the end of the exec
    # wait for every process that inherited them (`sleep 100 &`), not for the command.
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    try:
        process = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.PIPE if stdin or streamed else asyncio.subprocess.DEVNULL,
            stdout=out_write,
            stderr=err_write,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,  # its own process group, so a kill reaches its children
        )
    except OSError as exc:
        os.close(out_read)
        os.close(err_read)
        return await _not_started(exc, command, cwd, sink)
    finally:
        os.close(out_write)
        os.close(err_write)
    if started is not None:
        started(process)
    # Read from the start: a command may write more than a pipe holds before it reads its stdin.
    ended = asyncio.ensure_future(process.wait())
    pumps = asyncio.gather(pump_fd(out_read, False, sink, ended=ended), pump_fd(err_read, True, sink, ended=ended))
    feeding = _feed(process, stdin, io)
    try:
        return await _finish(process, pumps, sink, timeout)
    finally:
        if feeding is not None:
            feeding.cancel()


async def _not_started(exc: OSError, command: Sequence[str], cwd: str, sink: OutputSink) -> int:
    """The status of a command that could not be started, told to `sink` as a shell would (127
    not found, 126 not executable); WorkdirError when `cwd` cannot be entered; anything else is
    raised again."""
    if exc.filename == cwd and exc.errno is not None:  # subprocess names the cwd when chdir failed
        raise WorkdirError(exc.errno, cwd) from None
    if isinstance(exc, FileNotFoundError):
        await sink(True, f"warmshell: {command[0]}: command not found\n".encode())
        return EXIT_NOT_FOUND
    if not isinstance(exc, PermissionError):
        raise exc
    await sink(True, f"warmshell: {command[0]}: permission denied\n".encode())
    return EXIT_NOT_EXECUTABLE


def _feed(process: asyncio.subprocess.Process, stdin: bytes, io: ExecInput | None) -> asyncio.Task[None] | None:
    """Start writing the command's stdin (`stdin`, then what `io` streams); None without a pipe.

    The pipe's own fd is written directly (a duplicate; the transport's is closed at once:
    asyncio's wait() would wait for it, held by whatever the command left running), beside
    waiting, not before it: the timeout counts while a command that does not read its stdin
    keeps the write from finishing."""
    if process.stdin is None:
        return None
    stdin_fd = os.dup(process.stdin.get_extra_info("pipe").fileno())
    process.stdin.close()
    if io is None:
        return asyncio.create_task(write_stdin(stdin_fd, stdin))
    io.feed(stdin, credited=False)
    return asyncio.create_task(io.serve(stdin_fd, kill=lambda signo: _kill_group(process, signo)))


async def _finish(
    process: asyncio.subprocess.Process,
    pumps: asyncio.Future[Any],
    sink: OutputSink,
    timeout: float | None,  # noqa: ASYNC109 - the command's own limit
) -> int:
    """Wait for the process to exit and its output to be read (killing its group on a timeout or
    a cancel); its exit status."""
    try:
        async with asyncio.timeout(timeout):
            code = await process.wait()
            await pumps
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
        pumps.cancel()
        # Not awaited (this task is being cancelled): its CancelledError is read once it is done,
        # or the collector logs "exception was never retrieved" from wherever it runs next (once
        # from inside ast.parse, which CPython 3.11 turns into a SystemError that ends pytest).
        pumps.add_done_callback(_retrieve)
        with contextlib.suppress(ProcessLookupError):
            await process.wait()
        raise
    return code if code >= 0 else 128 - code


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Read a done future's outcome so that dropping it logs nothing."""
    if not future.cancelled():
        future.exception()


# The command's first step on a terminal, in a fresh interpreter (no Python may run between fork
# and exec in this threaded process: grpc's fork handlers crash a child that does): take stdin,
# the terminal, as the controlling terminal of the new session, then become the command.
_TAKE_TERMINAL = """
import fcntl, os, sys, termios
fcntl.ioctl(0, termios.TIOCSCTTY, 0)
try:
    os.execvp(sys.argv[1], sys.argv[1:])
except OSError as exc:
    missing = isinstance(exc, FileNotFoundError)
    what = "command not found" if missing else "permission denied" if isinstance(exc, PermissionError) else exc.strerror
    os.write(2, f"warmshell: {sys.argv[1]}: {what}\\n".encode())
    os._exit(127 if missing else 126)
"""


async def _run_on_terminal(
    command: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str,
    sink: OutputSink,
    stdin: bytes,
    timeout: float | None,  # noqa: ASYNC109 - the command's own limit
    io: ExecInput,
) -> int:
    """`run_streaming` on a new pseudo-terminal of this process's devpts."""
    assert io.terminal is not None
    master, slave = os.openpty()
    try:
        set_window_size(master, io.terminal)
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-I",
                "-S",
                "-c",
                _TAKE_TERMINAL,
                *command,
                stdin=slave,
                stdout=slave,
                stderr=slave,
                env=dict(env),
                cwd=cwd,
                start_new_session=True,  # setsid in the child, before exec (no Python there)
            )
        except OSError as exc:
            if exc.filename == cwd and exc.errno is not None:
                raise WorkdirError(exc.errno, cwd) from None
            raise
    except BaseException:
        os.close(master)
        raise
    finally:
        os.close(slave)  # the command holds it now: the master reads EIO once it (and its children) closed it
    io.feed(stdin, credited=False)
    feeding = asyncio.create_task(io.serve(master, kill=lambda signo: _kill_group(process, signo)))
    try:
        ended = asyncio.ensure_future(process.wait())
        output = asyncio.ensure_future(pump_fd(master, False, sink, close=False, ended=ended))
        return await _finish(process, output, sink, timeout)
    finally:
        feeding.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await feeding
        os.close(master)
