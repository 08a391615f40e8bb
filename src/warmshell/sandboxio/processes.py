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
import enum
import errno
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from warmshell.sandboxio.interactive import ExecInput, pump_fd, set_window_size, write_stdin

__all__ = ["Ended", "NotStarted", "OutputSink", "Runner", "StartFailure", "WorkdirError", "run_streaming"]

# (is_stderr, data) -> delivered to the gateway in order.
OutputSink = Callable[[bool, bytes], Awaitable[None]]
EXIT_TIMEOUT = 124


@dataclass(frozen=True)
class Ended:
    """How a command ended: its exit status as the shell reports it (128+N killed by signal N;
    124 timed out, as timeout(1) says), the signal that ended it (0: it exited), and whether it
    was killed at its timeout. What the system says about it goes here, never into its output."""

    exit_code: int
    signal: int = 0
    timed_out: bool = False


def ended(code: int) -> Ended:
    """The end of a process from its returncode (negative: killed by that signal)."""
    return Ended(128 - code, signal=-code) if code < 0 else Ended(code)


def timed_out() -> Ended:
    """The end of a command killed (SIGKILL, its whole group) at its timeout."""
    return Ended(EXIT_TIMEOUT, signal=signal.SIGKILL, timed_out=True)


class StartFailure(enum.Enum):
    """Why a command never started, valued by the exit status a shell gives for it."""

    WORKDIR = 125  # as env -C, chroot and nohup report their own failure to run the command
    NOT_EXECUTABLE = 126
    COMMAND_NOT_FOUND = 127


class NotStarted(OSError):
    """The command never started (it has no exit status of its own): `failure` says why."""

    def __init__(self, error: int, command: str) -> None:
        super().__init__(error, os.strerror(error), command)
        self.failure = StartFailure.COMMAND_NOT_FOUND if error == errno.ENOENT else StartFailure.NOT_EXECUTABLE

    def __str__(self) -> str:
        if self.failure is StartFailure.COMMAND_NOT_FOUND:
            return f"{self.filename}: command not found"
        if self.errno in (errno.EACCES, errno.EPERM):
            return f"{self.filename}: permission denied"
        return f"{self.filename}: {os.strerror(self.errno or 0).lower()}"


class WorkdirError(NotStarted):
    """The command's working directory cannot be entered (so it never started)."""

    def __init__(self, error: int, workdir: str) -> None:
        super().__init__(error, workdir)
        self.failure = StartFailure.WORKDIR
        self.workdir = workdir

    def __str__(self) -> str:
        if self.errno == errno.ENOENT:
            return f"workdir {self.workdir} does not exist"
        if self.errno == errno.ENOTDIR:
            return f"workdir {self.workdir} is not a directory"
        return f"workdir {self.workdir} cannot be entered: {os.strerror(self.errno or 0).lower()}"


class Runner(Protocol):
    """Starts one command and streams its output; returns how it ended (see `run_streaming`)."""

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
    ) -> Ended:
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
) -> Ended:
    """Run `command`, send its output to `sink` as it comes, return how it ended (`io`: see
    `Runner`). NotStarted when it cannot be started (WorkdirError when `cwd` cannot be entered):
    nothing is written into its output."""
    if io is not None and io.terminal is not None:
        return await _run_on_terminal(command, env=env, cwd=cwd, sink=sink, stdin=stdin, timeout=timeout, io=io)
    streamed = io is not None
    # Plain pipes, read by `pump_fd`: asyncio's pipe transports would make the end of the exec
    # wait for every process that inherited them (`sleep 100 &`), not for the command.
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    try:
        process = await _start_piped(
            command,
            stdin=asyncio.subprocess.PIPE if stdin or streamed else asyncio.subprocess.DEVNULL,
            stdout=out_write,
            stderr=err_write,
            env=env,
            cwd=cwd,
        )
    except BaseException:
        os.close(out_read)
        os.close(err_read)
        raise
    finally:
        os.close(out_write)
        os.close(err_write)
    if started is not None:
        started(process)
    # Read from the start: a command may write more than a pipe holds before it reads its stdin.
    exited = asyncio.ensure_future(process.wait())
    pumps = asyncio.gather(pump_fd(out_read, False, sink, ended=exited), pump_fd(err_read, True, sink, ended=exited))
    feeding = _feed(process, stdin, io)
    try:
        return await _finish(process, pumps, timeout)
    finally:
        if feeding is not None:
            feeding.cancel()


async def _start_piped(
    command: Sequence[str], *, stdin: int, stdout: int, stderr: int, env: Mapping[str, str], cwd: str
) -> asyncio.subprocess.Process:
    """Start `command` in a new session (its own process group, so a kill reaches its children),
    every signal at its default action: through `_RESET_AND_EXEC` when this process ignores one
    that exec would keep (a Python start: ~10 ms of CPU against ~0.6 ms for `true` started
    directly, paid only then). NotStarted or WorkdirError when it cannot start.

    Not `os.posix_spawn`, which resets signals (`setsigdef`) and makes a session without Python
    in the child: it has no working-directory action (glibc's `addchdir_np` is not exposed)."""
    if not _ignores_what_exec_keeps():
        try:
            return await asyncio.create_subprocess_exec(
                *command, stdin=stdin, stdout=stdout, stderr=stderr, env=dict(env), cwd=cwd, start_new_session=True
            )
        except OSError as exc:
            raise _not_started(exc, command, cwd) from None
    report_read, report_write = os.pipe()
    try:
        try:
            process = await _start_reset(command, report_write, (stdin, stdout, stderr), env, cwd, terminal=False)
        finally:
            os.close(report_write)
        try:
            failed = await _exec_report(report_read)
        except BaseException:  # cancelled before its exec: it must not run on unwatched
            _kill_group(process, signal.SIGKILL)
            if process.stdin is not None:
                process.stdin.close()
            raise
    finally:
        os.close(report_read)
    if failed:
        if process.stdin is not None:
            process.stdin.close()
        await process.wait()
        raise NotStarted(int(failed), command[0])
    return process


async def _exec_report(fd: int) -> bytes:
    """What `_RESET_AND_EXEC` wrote on its report pipe `fd` (an errno), or b"" once its exec
    closed the pipe unwritten."""
    loop = asyncio.get_running_loop()
    readable: asyncio.Future[None] = loop.create_future()
    loop.add_reader(fd, lambda: None if readable.done() else readable.set_result(None))
    try:
        await readable
    finally:
        loop.remove_reader(fd)
    return os.read(fd, 16)


def _not_started(exc: OSError, command: Sequence[str], cwd: str) -> OSError:
    """What to raise for a command that could not be started: WorkdirError when `cwd` cannot be
    entered, NotStarted when the command is missing or not executable, else `exc` itself."""
    if exc.filename == cwd and exc.errno is not None:  # subprocess names the cwd when chdir failed
        return WorkdirError(exc.errno, cwd)
    if isinstance(exc, FileNotFoundError | PermissionError) and exc.errno is not None:
        return NotStarted(exc.errno, command[0])
    return exc


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
    timeout: float | None,  # noqa: ASYNC109 - the command's own limit
) -> Ended:
    """Wait for the process to exit and its output to be read (killing its group on a timeout or
    a cancel); how it ended."""
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
        return timed_out()
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
    return ended(code)


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Read a done future's outcome so that dropping it logs nothing."""
    if not future.cancelled():
        future.exception()


# The command's first step when its start must change what a fork and exec keep, in a fresh
# interpreter (no Python may run between fork and exec in this threaded process: grpc's fork
# handlers crash a child that does). Every signal's action is reset first: an ignored signal stays
# ignored across exec, and this interpreter ignores SIGPIPE, and a process started in a script's
# background (or by nohup) ignores SIGINT and SIGQUIT (or SIGHUP): Ctrl-C typed on a terminal, or
# a signal sent to the command, would then do nothing. On a terminal (argv[2] "1") stdin, the
# terminal, becomes the controlling terminal of the new session. Then it becomes the command; if
# it cannot, the errno goes to the report pipe (argv[1]), which a successful exec closes unwritten.
_RESET_AND_EXEC = """
import _signal, fcntl, os, sys, termios
for number in range(1, _signal.NSIG):
    if number not in (_signal.SIGKILL, _signal.SIGSTOP):
        try:
            _signal.signal(number, _signal.SIG_DFL)
        except (OSError, ValueError):
            pass
report = int(sys.argv[1])
os.set_inheritable(report, False)
if sys.argv[2] == "1":
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
try:
    os.execvp(sys.argv[3], sys.argv[3:])
except OSError as exc:
    os.write(report, str(exc.errno).encode())
    os._exit(127)
"""
# What `subprocess` itself sets back to the default action in the child (restore_signals).
_RESTORED = frozenset({signal.SIGPIPE, signal.SIGXFSZ})


async def _start_reset(
    command: Sequence[str],
    report: int,
    stdio: tuple[int, int, int],
    env: Mapping[str, str],
    cwd: str,
    *,
    terminal: bool,
) -> asyncio.subprocess.Process:
    """Start `command` through `_RESET_AND_EXEC` in a new session (setsid in the child, before
    exec: no Python there), `stdio` its stdin, stdout and stderr, its exec's failure reported on
    fd `report`; WorkdirError when `cwd` cannot be entered."""
    argv = (sys.executable, "-I", "-S", "-c", _RESET_AND_EXEC, str(report), "1" if terminal else "0", *command)
    try:
        return await asyncio.create_subprocess_exec(
            *argv,
            stdin=stdio[0],
            stdout=stdio[1],
            stderr=stdio[2],
            pass_fds=(report,),
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
        )
    except OSError as exc:
        raise _not_started(exc, command, cwd) from None


def _ignores_what_exec_keeps() -> bool:
    """Whether this process ignores a signal `subprocess` would leave ignored in a child (one it
    inherited ignored: started by nohup, or in a script's background)."""
    with open("/proc/self/status", "rb") as status:
        for line in status:
            if line.startswith(b"SigIgn:"):
                ignored = int(line.split()[1], 16)
                return any(ignored & (1 << (number - 1)) for number in range(1, signal.NSIG) if number not in _RESTORED)
    return False


async def _run_on_terminal(
    command: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str,
    sink: OutputSink,
    stdin: bytes,
    timeout: float | None,  # noqa: ASYNC109 - the command's own limit
    io: ExecInput,
) -> Ended:
    """`run_streaming` on a new pseudo-terminal of this process's devpts."""
    assert io.terminal is not None
    master, slave = os.openpty()
    report_read, report_write = os.pipe()
    try:
        set_window_size(master, io.terminal)
        process = await _start_reset(command, report_write, (slave, slave, slave), env, cwd, terminal=True)
    except BaseException:
        os.close(master)
        os.close(report_read)
        raise
    finally:
        os.close(slave)  # the command holds it now: the master reads EIO once it (and its children) closed it
        os.close(report_write)
    io.feed(stdin, credited=False)
    feeding = asyncio.create_task(io.serve(master, kill=lambda signo: _kill_group(process, signo)))
    try:
        exited = asyncio.ensure_future(process.wait())
        output = asyncio.ensure_future(pump_fd(master, False, sink, close=False, ended=exited))
        end = await _finish(process, output, timeout)
        # The process has exited: the pipe's write end is closed, so this read does not block.
        if failed := os.read(report_read, 16):
            raise NotStarted(int(failed), command[0])
        return end
    finally:
        feeding.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await feeding
        os.close(master)
        os.close(report_read)
