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


async def start_process(
    argv: list[str], *, env: dict[str, str], cwd: pathlib.Path, log_path: pathlib.Path
) -> asyncio.subprocess.Process:
    """Start ``argv`` in a new session (its own process group), output appended to ``log_path``."""
    exe = shutil.which(argv[0], path=env.get("PATH")) or argv[0]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # Opening a local log file is quick; no need to hop to a thread for it.
    with open(log_path, "ab") as log:  # noqa: ASYNC230
        return await asyncio.create_subprocess_exec(
            exe,
            *argv[1:],
            env=env,
            cwd=str(cwd),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )


def signal_group(proc: ContainerProcess, sig: int) -> None:
    """Signal the process group; the leader may be gone while its children live on."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


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
