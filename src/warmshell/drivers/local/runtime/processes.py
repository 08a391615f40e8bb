"""One local sandbox's processes: bubblewrap with the agent as pid 1 and the host end of its
control socket; or, unisolated, plain processes of the gateway.

bwrap is started off the event loop, in spawner threads (see `Spawner`): the fork-and-exec
blocks its caller until the child has exec'd, which on a busy host is milliseconds the event
loop would otherwise spend waiting; its end is noticed through a pidfd, so no watcher thread per
sandbox either. bwrap's stdout/stderr go to a log file. bwrap leads its own process group; its
`--info-fd` tells us the pid of the sandbox's init (the agent), and we hold a pidfd on it so
stopping can kill the whole pid namespace even if bwrap died before arming `--die-with-parent`.
Closing the control socket is the normal way to end a sandbox: the agent kills everything in it
and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import json
import logging
import os
import signal
import socket
import subprocess
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from warmshell.sandboxio import processes as host_processes
from warmshell.sandboxio import terminals
from warmshell.sandboxio.agentlink import AgentError, AgentLink
from warmshell.sandboxio.interactive import ExecInput
from warmshell.sandboxio.processes import OutputSink, Runner

__all__ = ["HostProcesses", "SandboxFds", "SandboxProcess", "Spawner", "read_tail"]

_log = logging.getLogger(__name__)
_TAIL_BYTES = 4096
_INFO_TIMEOUT = 5.0
HELLO_TIMEOUT = 20.0


@dataclass(frozen=True)
class SandboxFds:
    """The fd numbers bwrap inherits for one sandbox (beside the launcher's shared ones)."""

    control: int
    seccomp: int
    info: int


class Spawner:
    """A few threads that start sandboxes, so the event loop never waits for a fork and exec.

    Two by default: with one, a pool fill's starts queued for it while it sat in a start's file
    system work or waited for a core (on a loaded host 1.4 of the 8 spawn slots' starts, on
    average, each holding its slot); a second thread takes the next start meanwhile. Python's
    part of each spawn still runs under the GIL, one at a time. They run at the gateway's
    priority: a thread at a lower one would hold the GIL while it prepares each spawn and could
    be preempted doing so, stalling the event loop behind it. A refill's lower priority is set by
    the launch prefix instead (see `launching`)."""

    def __init__(self, name: str, threads: int = 2) -> None:
        self._executor = ThreadPoolExecutor(
            max_workers=threads, thread_name_prefix=name, initializer=_name_thread, initargs=(name,)
        )

    async def start(self, build: Callable[[], Sequence[str]], *, log_path: Path, pass_fds: Sequence[int]) -> _Child:
        """Start the command line `build` returns, both in a spawner thread (`build` may block:
        it is where a start's own file system work runs, with no thread hop of its own), its
        output appended to `log_path`; a `_Child` to wait for."""
        started = asyncio.get_running_loop().run_in_executor(self._executor, _popen, build, log_path, pass_fds)
        try:
            popen = await asyncio.shield(started)
        except asyncio.CancelledError:
            started.add_done_callback(_kill_started)  # the caller is gone: nothing may outlive it
            raise
        return _Child(popen)

    def close(self) -> None:
        """Let the thread end once idle."""
        self._executor.shutdown(wait=False)


_PR_SET_NAME = 15


def _name_thread(name: str) -> None:
    """Give the calling thread `name` in the kernel too (`top -H`, `/proc/<pid>/task/*/comm`),
    so its CPU can be told apart from the other threads'; best effort."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def _popen(build: Callable[[], Sequence[str]], log_path: Path, pass_fds: Sequence[int]) -> subprocess.Popen[bytes]:
    argv = build()
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=log_fd,
            env={"PATH": "/usr/bin:/bin"},
            pass_fds=pass_fds,
            start_new_session=True,
        )
    finally:
        os.close(log_fd)


def _kill_started(started: asyncio.Future[subprocess.Popen[bytes]]) -> None:
    if started.cancelled() or started.exception() is not None:
        return
    popen = started.result()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, signal.SIGKILL)
    popen.wait()  # at once: it was SIGKILLed


class _Child:
    """A child process waited for through a pidfd on the event loop (no watcher thread)."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._popen = popen  # held, so subprocess never reaps it behind our back
        self.pid = popen.pid
        self.returncode: int | None = None
        loop = asyncio.get_running_loop()
        self._ended: asyncio.Future[int] = loop.create_future()
        self._pidfd = os.pidfd_open(self.pid)  # a zombie still has one: nobody else reaps it
        loop.add_reader(self._pidfd, self._readable, loop)

    def _readable(self, loop: asyncio.AbstractEventLoop) -> None:
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        if pid == 0:
            return
        loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        self.returncode = self._popen.returncode = os.waitstatus_to_exitcode(status)
        self._ended.set_result(self.returncode)

    @property
    def ended(self) -> asyncio.Future[int]:
        """Resolves to the exit status once it ended (wait on it; never cancel it)."""
        return self._ended

    async def wait(self) -> int:
        """The exit status (negative: killed by that signal), once it ended."""
        return await asyncio.shield(self._ended)


class SandboxProcess:
    """A running (or ended) bwrap'd sandbox and the link to its agent."""

    isolated = True

    def __init__(
        self, process: _Child, link: AgentLink, log_path: Path, info: asyncio.Future[_Sandboxed | None]
    ) -> None:
        self._process = process
        self.link = link
        self.log_path = log_path
        self._info = info  # resolves to the pid namespace's init (the agent)
        self._namespace_killed = False

    @classmethod
    async def spawn(
        cls,
        build: Callable[[SandboxFds], Sequence[str]],
        *,
        seccomp: bytes,
        log_path: Path,
        spawner: Spawner,
    ) -> SandboxProcess:
        """Start bwrap (its command line from `build`, called in a spawner thread) and wait for
        the agent's hello; OSError when it does not come (the log's tail says why)."""
        host, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        seccomp_read, seccomp_write = os.pipe()
        info_read, info_write = os.pipe()
        try:
            # A filter is far below PIPE_BUF, so this write never blocks.
            os.write(seccomp_write, seccomp)
            os.close(seccomp_write)
            seccomp_write = -1
            fds = SandboxFds(control=child.fileno(), seccomp=seccomp_read, info=info_write)
            process = await spawner.start(
                lambda: build(fds), log_path=log_path, pass_fds=(child.fileno(), seccomp_read, info_write)
            )
        except BaseException:
            host.close()
            os.close(info_read)
            raise
        finally:
            child.close()
            for fd in (seccomp_read, seccomp_write, info_write):
                if fd >= 0:
                    os.close(fd)
        link = AgentLink(host)
        sandbox = cls(process, link, log_path, _sandbox_child(info_read))
        link.open_terminal = sandbox.open_terminal
        try:
            async with asyncio.timeout(HELLO_TIMEOUT):  # no task of its own, unlike wait_for
                await link.wait_hello()
        except (AgentError, TimeoutError) as exc:
            await sandbox.stop(0.5)
            tail = "; ".join(await asyncio.to_thread(read_tail, log_path))
            status = f"bwrap exited with status {process.returncode}"
            raise OSError(f"the sandbox did not start ({status}): {tail or exc}") from exc
        return sandbox

    @property
    def pid(self) -> int:
        """bwrap's process id."""
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        """bwrap's exit status once it ended (negative: killed by that signal)."""
        return self._process.returncode

    @property
    def ended(self) -> asyncio.Future[int]:
        """Done once bwrap exited (then `wait` finishes the clean-up); never cancel it."""
        return self._process.ended

    @property
    def runner(self) -> Runner:
        """The supervisor's process seam: commands run inside the sandbox, through its agent."""
        return self.link.run_streaming

    async def responsive(self, timeout: float) -> bool:  # noqa: ASYNC109 - the probe's own bound
        """Whether the sandbox runs and its agent answers a ping within `timeout` seconds."""
        return self._process.returncode is None and await self.link.ping(timeout)

    async def prioritise(self) -> None:
        """Give the agent (and so everything it starts from now on) nice 0 again: a refill is
        started at a lower priority. OSError when it may not be raised."""
        pid = await self.sandbox_pid()
        if pid is not None and os.getpriority(os.PRIO_PROCESS, pid) != 0:
            os.setpriority(os.PRIO_PROCESS, pid, 0)

    async def sandbox_pid(self) -> int | None:
        """The pid (in our namespace) of the sandbox's init while it runs; None when it ended
        or bwrap did not say."""
        if self._process.returncode is not None:
            return None
        if not self._info.done():  # known long before a claim, normally: no await on the warm path
            await self._wait_info()
        child = self._info.result() if self._info.done() else None
        return child.pid if child is not None else None

    def open_root(self) -> int:
        """An O_PATH fd on the sandbox's root directory (its pid 1's `/proc/<pid>/root`); OSError
        (ESRCH) once it ended. The pidfd is checked after the open: while the agent lives its pid
        cannot have been reused, so the fd is this sandbox's root and never the host's."""
        child = self._info.result() if self._info.done() and not self._namespace_killed else None
        if child is None or self._process.returncode is not None:
            raise OSError(errno.ESRCH, "the sandbox is not running")
        try:
            fd = os.open(f"/proc/{child.pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:  # it ended (or is a zombie) between the check and the open
            raise OSError(errno.ESRCH, "the sandbox is not running") from None
        try:
            signal.pidfd_send_signal(child.pidfd, 0)
        except OSError:
            os.close(fd)
            raise OSError(errno.ESRCH, "the sandbox is not running") from None
        return fd

    def open_terminal(self) -> tuple[int, int]:
        """A new pseudo-terminal (master, slave) of the sandbox's own devpts (bwrap mounts a new
        instance on its /dev/pts), so the command sees its terminal as /dev/pts/N there and no
        terminal of the host is ever inside. OSError when the sandbox ended or its ptmx is not
        the devpts multiplexer."""
        return terminals.open_in_root(self.open_root())

    async def wait(self) -> int:
        """Wait for the end (bwrap exits once its pid 1 did); bwrap's exit status."""
        code = await self._process.wait()
        self.link.close()
        await self._kill_namespace()
        return code

    async def stop(self, grace: float) -> None:
        """Close the control socket (the agent kills the sandbox and exits); after `grace`
        seconds SIGKILL bwrap's group and the pid namespace's init; returns once all ended."""
        if not self._info.done():  # learn the init's pid first: no orphan window
            await self._wait_info()
        self.link.close()
        if self._process.returncode is None:
            try:
                async with asyncio.timeout(grace):  # timeouts, not wait_for: no task per stop
                    await self._process.wait()
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self._process.pid, signal.SIGKILL)
        await self.wait()

    async def _wait_info(self) -> None:
        """Until bwrap said which pid the sandbox's init has (or at most `_INFO_TIMEOUT`)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_INFO_TIMEOUT):
                await asyncio.shield(self._info)

    async def _kill_namespace(self) -> None:
        """SIGKILL the pid namespace's init (a no-op when it already ended) and drop the pidfd."""
        if self._namespace_killed:
            return
        self._namespace_killed = True
        # Never cancelled: bwrap has exited by now, so the info pipe is closed and the read ends.
        child = self._info.result() if self._info.done() else await asyncio.shield(self._info)
        if child is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(child.pidfd, signal.SIGKILL)
            os.close(child.pidfd)


class HostProcesses:
    """Unisolated mode: the sandbox is nothing but the commands its supervisor starts, plain
    processes of the gateway's user in the instance's workspace directory (which stands in for
    /workspace). It ends when stopped."""

    isolated = False
    pid = 0
    returncode: int | None = None

    def __init__(self, workspace: Path, log_path: Path) -> None:
        self._workspace = workspace
        self.log_path = log_path
        self._ended: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    @property
    def runner(self) -> Runner:
        """The supervisor's process seam: commands run as children of the gateway."""
        return self._run

    async def _run(
        self,
        command: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str,
        sink: OutputSink,
        stdin: bytes = b"",
        timeout: float | None = None,  # noqa: ASYNC109 - a per-command limit
        io: ExecInput | None = None,
    ) -> host_processes.Ended:
        """Run `command` as a child of the gateway; a /workspace path means the workspace dir."""
        local = Path(cwd)
        if local == Path("/workspace") or Path("/workspace") in local.parents:
            local = self._workspace / local.relative_to("/workspace")
        try:
            return await host_processes.run_streaming(
                command, env=env, cwd=str(local), sink=sink, stdin=stdin, timeout=timeout, io=io
            )
        except host_processes.WorkdirError as exc:
            raise host_processes.WorkdirError(exc.errno or 0, cwd) from None  # the path the caller gave

    async def responsive(self, timeout: float) -> bool:  # noqa: ASYNC109 - same seam as SandboxProcess
        """There is no agent to probe: alive until stopped."""
        return not self._ended.done()

    async def prioritise(self) -> None:
        """There is no agent: commands start at the gateway's priority anyway."""

    async def sandbox_pid(self) -> int | None:
        """There is no sandbox."""
        return None

    @property
    def ended(self) -> asyncio.Future[int]:
        """Done once stopped; never cancel it."""
        return self._ended

    async def wait(self) -> int:
        """Until `stop`."""
        await asyncio.shield(self._ended)
        return 0

    async def stop(self, grace: float) -> None:
        """End it (the supervisor's commands end with their supervisor's cancellation)."""
        self.returncode = 0
        if not self._ended.done():
            self._ended.set_result(0)


@dataclass(frozen=True)
class _Sandboxed:
    pid: int
    pidfd: int


def _sandbox_child(fd: int) -> asyncio.Future[_Sandboxed | None]:
    """Read bwrap's --info-fd JSON (to EOF: bwrap closes the fd after writing) and open a pidfd on
    its "child-pid"; None when bwrap said nothing usable. A reader callback on the raw fd and a
    future, not a task: a pipe transport and stream per sandbox cost the event loop several
    times as much for these few bytes, and a task per sandbox its own steps."""
    loop = asyncio.get_running_loop()
    result: asyncio.Future[_Sandboxed | None] = loop.create_future()
    chunks: list[bytes] = []

    def finish(data: bytes) -> None:
        loop.remove_reader(fd)
        os.close(fd)
        if result.done():  # cancelled: nobody wants it
            return
        try:
            pid = int(json.loads(data)["child-pid"])
            result.set_result(_Sandboxed(pid, os.pidfd_open(pid)))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            _log.debug("no sandbox pid from bwrap (%s): %r", exc, data[:200])
            result.set_result(None)

    def readable() -> None:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            return
        except OSError as exc:
            _log.debug("reading bwrap's info fd failed: %s", exc)
            chunk, chunks[:] = b"", []
        if chunk:
            chunks.append(chunk)
            return
        finish(b"".join(chunks))

    def abandoned(done: asyncio.Future[_Sandboxed | None]) -> None:
        if done.cancelled():  # the loop is closing: stop reading, close the fd
            with contextlib.suppress(ValueError, OSError):
                loop.remove_reader(fd)
                os.close(fd)

    try:
        os.set_blocking(fd, False)
        loop.add_reader(fd, readable)
    except BaseException:
        os.close(fd)
        raise
    result.add_done_callback(abandoned)
    return result


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
