"""Shared pieces of the local driver's integration tests: the stand-in supervisor and process
introspection."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.gateway import runtime_dir_of
from warmshell.core.config import LocalDriverConfig, StatePaths
from warmshell.drivers.local import LocalDriver
from warmshell.drivers.local.instances import LOG_SUFFIX
from warmshell.drivers.local.supervising import Seat

DriverFactory = Callable[..., LocalDriver]

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")

# What the stand-in runs in the sandbox by default: leave what it saw in /workspace, then idle.
# (Written under a temporary name and moved into place, so a reader never sees half a file.)
STAND_IN = "env > /workspace/.env; hostname > /workspace/hostname; mv /workspace/.env /workspace/env; exec sleep 600"


def credential_of(paths: StatePaths, instance_id: str) -> Path:
    """Where the stand-in leaves its credential: host-side, in a directory named after the
    instance beside its log (which the stand-in makes: the driver makes one only for a
    workspace on the host's disk)."""
    return paths.sandboxes / instance_id / "credential"


def workspace_of(paths: StatePaths, instance_id: str) -> Path:
    """The host directory bound at the sandbox's /workspace (see `launching`)."""
    if os.geteuid() == 0:
        return LocalDriverConfig().sandbox_dir / instance_id
    return paths.sandboxes / instance_id / "workspace"


def log_of(paths: StatePaths, instance_id: str) -> Path:
    """A started instance's log: in the state directory, or for a root gateway's sandbox with
    nothing on the host's disk, in that gateway's directory of the runtime directory (unisolated,
    none is made: then the state directory's, which this makes)."""
    in_state = paths.sandboxes / f"{instance_id}{LOG_SUFFIX}"
    if in_state.exists() or os.geteuid() != 0:
        return in_state
    runtime = runtime_dir_of(LocalDriverConfig().sandbox_dir)
    return next(runtime.glob(f"gw-*/{instance_id}{LOG_SUFFIX}"), in_state)


def stand_in(paths: StatePaths, script: str) -> Callable[[Seat], object]:
    """A host-side supervisor for driver tests: keeps its credential where the test reads it
    (outside the sandbox), then runs `script` in the sandbox through the agent, its stderr into
    the instance's log, and returns the script's status."""

    async def supervise(seat: Seat) -> int:
        credential = credential_of(paths, seat.instance_id)
        partial = credential.with_suffix(".tmp")
        partial.parent.mkdir(mode=0o700, exist_ok=True)
        partial.write_text(seat.credential)
        partial.replace(credential)
        log = log_of(paths, seat.instance_id)

        async def sink(stderr: bool, data: bytes) -> None:
            if stderr:
                with log.open("ab") as handle:
                    handle.write(data)

        env = {"PATH": "/usr/bin:/bin", "HOME": "/workspace", "WARMSHELL_INSTANCE_ID": seat.instance_id}
        ended = await seat.runner(["/bin/sh", "-c", script], env=env, cwd="/workspace", sink=sink)
        return ended.exit_code

    return supervise


def driver_pids(driver: LocalDriver) -> list[int]:
    """Pids (bwrap's) of every live instance of a driver (test introspection)."""
    return [
        i.process.pid
        for i in driver._fleet.instances.values()
        if i.process is not None and i.process.returncode is None and i.process.pid
    ]


def alive(pid: int) -> bool:
    """Whether a pid exists and is not a zombie."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status and os.path.exists(f"/proc/{pid}")
