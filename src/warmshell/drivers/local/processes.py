"""One spawned supervisor process: the bootstrap pipe, its log, its end.

The credential travels through a pipe whose read end only the child inherits (`pass_fds`), so it
never appears in an environment, an argv or a file. stderr goes to a log file rather than a pipe:
asyncio reports a process as ended only once its pipes close, and a pipe inherited by something
still running in the sandbox would keep a dead sandbox "alive". Each process leads its own
process group. Under bubblewrap the sandbox itself is a second process (the init of its pid
namespace, in its own session); bwrap's `--info-fd` tells us its pid, and we hold a pidfd on it so
stopping can kill the whole namespace even if bwrap died before arming `--die-with-parent`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Launch", "SupervisorProcess", "read_tail"]

_log = logging.getLogger(__name__)
_TAIL_BYTES = 4096
_INFO_TIMEOUT = 5.0


@dataclass(frozen=True)
class Launch:
    """How to start the process, once the bootstrap (and bwrap info) fd numbers are known."""

    argv: Sequence[str]
    env: Mapping[str, str] | None = None
    cwd: Path | None = None
    reports_child: bool = False  # argv passes the info fd to bwrap's --info-fd


class SupervisorProcess:
    """A running (or ended) supervisor and the sandbox around it."""

    def __init__(
        self, process: asyncio.subprocess.Process, log_path: Path, info: asyncio.Task[_Child | None] | None
    ) -> None:
        self._process = process
        self.log_path = log_path
        self._info = info  # resolves to the pid namespace's init, when bwrap reported it

    @classmethod
    async def spawn(cls, build: Callable[[int, int], Launch], *, credential: str, log_path: Path) -> SupervisorProcess:
        """Start a process; `build(bootstrap_fd, info_fd)` makes its command line."""
        # All four fds are close-on-exec; pass_fds opens only the two ends the child needs.
        boot_read, boot_write = os.pipe()
        info_read, info_write = os.pipe()
        child_fds = (boot_read, info_write)
        try:
            # A credential is far below PIPE_BUF, so this write never blocks.
            os.write(boot_write, credential.encode())
            os.close(boot_write)
            boot_write = -1
            launch = build(boot_read, info_write)
            log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                process = await asyncio.create_subprocess_exec(
                    *launch.argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log_fd,
                    stderr=log_fd,
                    env=dict(launch.env) if launch.env is not None else None,
                    cwd=launch.cwd,
                    pass_fds=child_fds if launch.reports_child else (boot_read,),
                    start_new_session=True,
                )
            finally:
                os.close(log_fd)
        except BaseException:
            os.close(info_read)
            raise
        finally:
            for fd in (*child_fds, boot_write):
                if fd >= 0:
                    os.close(fd)
        info = asyncio.create_task(_sandbox_child(info_read)) if launch.reports_child else None
        if info is None:
            os.close(info_read)
        return cls(process, log_path, info)

    @property
    def pid(self) -> int:
        """The process id (bwrap's, when isolated)."""
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        """The exit status once it ended (negative: killed by that signal)."""
        return self._process.returncode

    async def sandbox_pid(self) -> int | None:
        """The pid (in our namespace) of the sandbox's pid-namespace init, while it runs; None
        when unisolated, ended, or bwrap did not say."""
        info = self._info
        if info is None or self._process.returncode is not None:
            return None
        if not info.done():  # known long before a claim, normally: no await on the warm path
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(info), _INFO_TIMEOUT)
        child = info.result() if info.done() else None
        return child.pid if child is not None else None

    async def wait(self) -> int:
        """Wait for the end; the exit status."""
        code = await self._process.wait()
        await self._kill_namespace()
        return code

    async def stop(self, grace: float) -> None:
        """SIGTERM the process group, SIGKILL it after `grace` seconds, then make sure the
        sandbox's pid namespace is gone; returns once everything ended."""
        if self._info is not None:
            # Learn the sandbox's pid before signalling, so no window leaves it orphaned.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._info), _INFO_TIMEOUT)
        if self._process.returncode is None:
            self._signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.shield(self._process.wait()), grace)
            except TimeoutError:
                self._signal(signal.SIGKILL)
        await self.wait()

    def _signal(self, signum: signal.Signals) -> None:
        # The group may already be gone (the process ended between the check and the kill).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, signum)

    async def _kill_namespace(self) -> None:
        """SIGKILL the pid namespace's init (a no-op when it already ended) and drop the pidfd."""
        if self._info is None:
            return
        info, self._info = self._info, None
        # Never cancelled: bwrap has exited by now, so the info pipe is closed and the read ends
        # (a cancelled task that never started would leak the fd).
        child = await info
        if child is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(child.pidfd, signal.SIGKILL)
            os.close(child.pidfd)


@dataclass(frozen=True)
class _Child:
    pid: int
    pidfd: int


async def _sandbox_child(fd: int) -> _Child | None:
    """Read bwrap's --info-fd JSON and open a pidfd on its "child-pid"."""
    data = b""
    try:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0)
        )
        try:
            data = await reader.read()  # bwrap closes the fd after writing
        finally:
            transport.close()
        pid = int(json.loads(data)["child-pid"])
        return _Child(pid, os.pidfd_open(pid))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        _log.debug("no sandbox pid from bwrap (%s): %r", exc, data[:200])
        return None


def read_tail(path: Path, lines: int = 5) -> list[str]:
    """The last lines of a log file (blocking; call through a thread)."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - _TAIL_BYTES))
            text = handle.read().decode(errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip()][-lines:]
