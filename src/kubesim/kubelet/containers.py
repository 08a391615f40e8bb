"""One container = one local process in its own process group (so the whole tree can be signalled),
plus the bookkeeping a containerStatus needs."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import pathlib
import shutil
import signal
import subprocess
from typing import Any, Protocol

from kubesim.controllers import objects as o

Obj = dict[str, Any]


@dataclasses.dataclass
class ContainerState:
    """What the kubelet knows about a container, rendered into ``containerStatuses``."""

    name: str
    image: str
    restart_count: int = 0
    started_at: str | None = None
    ready: bool = False
    waiting_reason: str | None = "ContainerCreating"
    waiting_message: str = ""
    terminated: Obj | None = None
    last_terminated: Obj | None = None
    pid: int | None = None

    def status(self, pod_uid: str) -> Obj:
        state: Obj
        if self.terminated is not None:
            state = {"terminated": self.terminated}
        elif self.waiting_reason is not None:
            waiting: Obj = {"reason": self.waiting_reason}
            if self.waiting_message:
                waiting["message"] = self.waiting_message
            state = {"waiting": waiting}
        else:
            state = {"running": {"startedAt": self.started_at}}
        out: Obj = {
            "name": self.name,
            "image": self.image,
            "imageID": f"kubesim://{self.image}",
            "ready": self.ready,
            "restartCount": self.restart_count,
            "started": self.terminated is None and self.waiting_reason is None,
            "state": state,
            "lastState": {"terminated": self.last_terminated} if self.last_terminated else {},
        }
        if self.pid is not None:
            out["containerID"] = f"kubesim://{pod_uid}/{self.name}/{self.restart_count}"
        return out


class ContainerProcess(Protocol):
    """What the kubelet needs of a container's process, however it was started."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...


class ReportedProcess:
    """A container process whose exit is observed elsewhere and told with ``exited``."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self._returncode: int | None = None
        self._exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def returncode(self) -> int | None:
        return self._returncode

    def exited(self, code: int) -> None:
        if self._returncode is None:
            self._returncode = code
            self._exited.set_result(code)

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)


class HostProcess(ReportedProcess):
    """A process started by ``start_process``, reaped through a pidfd on the event loop (no
    thread per child, as asyncio's default child watcher would start)."""

    def __init__(self, pid: int) -> None:
        super().__init__(pid)
        self._pidfd: int | None = os.pidfd_open(pid)
        asyncio.get_running_loop().add_reader(self._pidfd, self._reap)

    def _reap(self) -> None:
        if self._pidfd is None:
            return
        result = os.waitid(os.P_PIDFD, self._pidfd, os.WEXITED | os.WNOHANG)
        if result is None:
            return
        asyncio.get_running_loop().remove_reader(self._pidfd)
        os.close(self._pidfd)
        self._pidfd = None
        # As asyncio reports it: the exit status, or -N when killed by signal N.
        self.exited(result.si_status if result.si_code == os.CLD_EXITED else -result.si_status)


class PipedProcess:
    """A helper process the kubelet talks to through pipes (a fork server, a network namespace
    holder), started through asyncio.

    asyncio closes a child's transport by itself only once it has seen the child exit *and* every
    pipe close, a chain of callbacks that a kubelet closing with its event loop may never run; the
    transport is then reported unclosed whenever it is collected, in whatever test runs then. So
    whoever stops one closes it (``close``), which also kills the child if it still runs.

    A child killed that way is reaped only when its exit reaches the loop, again by a callback: if
    the loop closes first, its ``Popen`` keeps no exit status and is reported "still running"
    when collected (a CI failure). The kubelet therefore waits for those last (``reap_killed``)."""

    def __init__(self, transport: asyncio.SubprocessTransport, process: asyncio.subprocess.Process) -> None:
        self._transport = transport
        self._loop = asyncio.get_running_loop()
        self.process = process

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    async def wait(self) -> int:
        code = await self.process.wait()
        _killed.discard(self)
        return code

    def close(self) -> None:
        """Close its pipes and kill it if it still runs (``reap_killed`` waits for its exit)."""
        self._transport.close()
        if self.process.returncode is None:
            _killed.add(self)


# Helper processes killed by `PipedProcess.close` whose exit their loop has not seen yet.
_killed: set[PipedProcess] = set()
# A SIGKILLed child is gone within milliseconds; one stuck in the kernel longer is not waited for.
_REAP_SECONDS = 5.0


async def reap_killed() -> None:
    """Wait (at most `_REAP_SECONDS`) until every helper process that this loop killed on close
    has been seen to exit."""
    loop = asyncio.get_running_loop()
    # Those of a loop already closed can no longer be reaped: forget them.
    _killed.difference_update([p for p in _killed if p._loop.is_closed()])
    waits = [asyncio.ensure_future(p.wait()) for p in _killed if p._loop is loop]
    if waits:
        _, pending = await asyncio.wait(waits, timeout=_REAP_SECONDS)
        for wait in pending:
            wait.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


async def start_piped(argv: list[str], **popen: Any) -> PipedProcess:
    """``asyncio.create_subprocess_exec(*argv, **popen)``, keeping the transport to close."""
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.subprocess_exec(
        lambda: asyncio.subprocess.SubprocessStreamProtocol(limit=2**16, loop=loop), *argv, **popen
    )
    return PipedProcess(transport, asyncio.subprocess.Process(transport, protocol, loop))


def _spawn(exe: str, argv: list[str], env: dict[str, str], cwd: pathlib.Path, log_path: pathlib.Path) -> int:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        popen = subprocess.Popen(
            [exe, *argv[1:]],
            env=env,
            cwd=str(cwd),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    # HostProcess reaps the child through its pidfd: Popen must not (nor warn that it did not).
    popen.returncode = 0
    return popen.pid


async def start_process(
    argv: list[str], *, env: dict[str, str], cwd: pathlib.Path, log_path: pathlib.Path
) -> HostProcess:
    """Start ``argv`` in a new session (its own process group), output appended to ``log_path``.

    The fork and exec run on a worker thread: on a loaded host they block their caller for tens
    of ms (until the child has exec'd), which on the loop would stall every other pod."""
    exe = shutil.which(argv[0], path=env.get("PATH")) or argv[0]
    spawn = asyncio.get_running_loop().run_in_executor(None, _spawn, exe, argv, env, cwd, log_path)
    try:
        return HostProcess(await asyncio.shield(spawn))
    except asyncio.CancelledError:
        # The thread goes on and may still start the process: it must not outlive its pod.
        spawn.add_done_callback(_kill_started)
        with contextlib.suppress(asyncio.CancelledError, OSError):
            await asyncio.shield(spawn)  # a fork and exec: milliseconds
        raise


def _kill_started(spawn: asyncio.Future[int]) -> None:
    if spawn.cancelled() or spawn.exception() is not None:
        return
    pid = spawn.result()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    HostProcess(pid)  # reaps it


def signal_group(proc: ContainerProcess, sig: int) -> None:
    """Signal the process group; the leader may be gone while its children live on. A process
    that leads no group yet is signalled itself: a fork server reports its child's pid before the
    child's `setsid`, and a pod stopped in that window (a replacement pod at a test's teardown,
    on a loaded host: most starts stopped at once) lost both signals and its stop waited forever."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        if proc.returncode is None:  # its pid is not yet free for another process to take
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(proc.pid, sig)
    except PermissionError:
        pass


async def stop_process(proc: ContainerProcess, grace: float) -> None:
    """SIGTERM the group, SIGKILL after ``grace`` seconds (the kubelet's graceful stop)."""
    if proc.returncode is None:
        signal_group(proc, signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(proc.wait()), timeout=max(grace, 0.0))
    # Children that ignored SIGTERM (or outlived the leader) go too.
    signal_group(proc, signal.SIGKILL)
    if proc.returncode is None:
        await proc.wait()


def terminated(exit_code: int, started_at: str | None, *, reason: str | None = None) -> Obj:
    if reason is None:
        reason = "Completed" if exit_code == 0 else "Error"
    return {
        "exitCode": exit_code,
        "reason": reason,
        "startedAt": started_at,
        "finishedAt": o.rfc3339(o.now()),
    }
