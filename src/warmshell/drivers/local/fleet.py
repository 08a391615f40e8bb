"""Every local instance's process and files: spawn, notice the end, stop, clean up, and sweep
what a previous gateway left behind.

The driver decides what an instance is for (a sandbox, or an idle pool member); the fleet only
runs it. An instance's files are `<sandboxes>/<id>/` (its `workspace/` is the sandbox's
/workspace, `supervisor.log` its stderr) and `<instances>/<id>.json`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

from warmshell.core.config import StatePaths
from warmshell.core.errors import UnavailableError
from warmshell.core.ids import InstanceId
from warmshell.core.models import SandboxSpec
from warmshell.drivers.base import BackendState, DriverCondition
from warmshell.drivers.local import cgroups, credentials, records
from warmshell.drivers.local.instances import Instance
from warmshell.drivers.local.launching import Launcher
from warmshell.drivers.local.processes import Launch, SupervisorProcess, read_tail

__all__ = ["Fleet"]

_log = logging.getLogger(__name__)


class Fleet:
    """The live instances, keyed by instance id."""

    def __init__(
        self,
        *,
        launcher: Launcher,
        paths: StatePaths,
        cgroup: cgroups.CgroupV2 | cgroups.Unavailable,
        grace: float,
        on_ended: Callable[[Instance], Awaitable[None]],
    ) -> None:
        self._launcher = launcher
        self._paths = paths
        self._cgroup = cgroup
        self._grace = grace
        self._on_ended = on_ended
        self.instances: dict[InstanceId, Instance] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    # -- spawning --------------------------------------------------------------------------

    async def launch(self, instance: Instance, spec: SandboxSpec) -> None:
        """Start the instance's supervisor; on failure everything it made is removed again
        (UnavailableError when the process could not be started)."""
        limits = cgroups.Limits.of(spec)
        instance.conditions = self._conditions(limits)
        credential = credentials.new_credential(instance.instance_id)
        instance.credential_digest = credentials.digest(credential)
        self.instances[instance.instance_id] = instance
        try:
            await asyncio.to_thread(self._prepare, instance, spec.image, limits)

            def build(fd: int, info_fd: int) -> Launch:
                return self._launcher.build(instance, image=spec.image, fd=fd, info_fd=info_fd)

            instance.process = await SupervisorProcess.spawn(
                build, credential=credential, log_path=instance.directory / "supervisor.log"
            )
            del credential  # from here on only its digest exists on this side
            self.save_soon(instance)
        except BaseException as exc:
            if instance.process is not None:
                await instance.process.stop(self._grace)
            await self.discard(instance)
            if isinstance(exc, OSError | ValueError):
                raise UnavailableError(f"cannot start a local supervisor: {exc}") from exc
            raise
        instance.state = BackendState.RUNNING
        instance.waiter = self.background(self._wait(instance), name=f"wait:{instance.instance_id}")

    def save_soon(self, instance: Instance) -> None:
        """Write the record in the background (a thread hop costs milliseconds on a busy host);
        `discard` waits for it, so a removal never precedes the write."""
        record = instance.record()
        previous = instance.saving

        async def write() -> None:
            if previous is not None:
                await asyncio.gather(previous, return_exceptions=True)
            try:
                await asyncio.to_thread(records.save, self._paths.instances, record)
            except OSError as exc:
                _log.warning("instance %s: cannot write its record: %s", instance.instance_id, exc)

        instance.saving = self.background(write(), name=f"save:{instance.instance_id}")

    def _prepare(self, instance: Instance, image: str, limits: cgroups.Limits) -> None:
        """Blocking: the sandbox's directories, its cgroup, the root listing."""
        self._paths.sandboxes.mkdir(mode=0o700, parents=True, exist_ok=True)
        instance.workspace_dir.mkdir(mode=0o700, parents=True)
        self._launcher.prepare(image)
        if limits and isinstance(self._cgroup, cgroups.CgroupV2):
            try:
                instance.cgroup = self._cgroup.create(instance.instance_id, limits)
            except OSError as exc:
                failed = DriverCondition("ResourceLimits", "False", "CgroupSetupFailed", str(exc))
                others = tuple(c for c in instance.conditions if c.type != "ResourceLimits")
                instance.conditions = (*others, failed)

    def _conditions(self, limits: cgroups.Limits) -> tuple[DriverCondition, ...]:
        conditions: list[DriverCondition] = []
        if not self._launcher.isolated:
            message = "local.allow_unisolated: a plain process with no isolation"
            conditions.append(DriverCondition("Isolated", "False", "Unisolated", message))
        if limits:
            if isinstance(self._cgroup, cgroups.CgroupV2):
                conditions.append(DriverCondition("ResourceLimits", "True", "CgroupV2", ""))
            else:
                reason, message = "CgroupV2Unavailable", self._cgroup.message
                conditions.append(DriverCondition("ResourceLimits", "False", reason, message))
        return tuple(conditions)

    # -- ends, stops and clean-up ----------------------------------------------------------

    async def _wait(self, instance: Instance) -> None:
        assert instance.process is not None
        code = await instance.process.wait()
        await self._release_cgroup(instance)
        instance.ended.set()
        if instance.deleting:
            return
        if instance.registered:
            instance.state = BackendState.EXITED
            instance.message = f"the supervisor exited with status {code}"
        else:
            instance.state = BackendState.FAILED
            tail = "\n".join(await asyncio.to_thread(read_tail, instance.process.log_path))
            instance.message = f"the supervisor exited with status {code} before registering"
            if tail:
                instance.message += f": {tail}"
        await self._on_ended(instance)

    async def stop(self, instance: Instance, *, keep: bool = False) -> None:
        """Kill the process group, then remove the cgroup and (unless `keep`) the directory and
        the record; concurrent calls all return once it is done."""
        if instance.deleting:
            await instance.ended.wait()
            return
        instance.deleting = True
        if instance.process is not None:
            await instance.process.stop(self._grace)
        if instance.waiter is not None:
            await instance.waiter
        if keep:
            self.instances.pop(instance.instance_id, None)
            await self._release_cgroup(instance)
        else:
            await self.discard(instance)
        instance.ended.set()

    async def discard(self, instance: Instance) -> None:
        """Forget an ended instance and remove its files."""
        self.instances.pop(instance.instance_id, None)
        if instance.saving is not None:
            await asyncio.gather(instance.saving, return_exceptions=True)
        await self._release_cgroup(instance)
        await asyncio.to_thread(self._remove_files, instance.instance_id)

    def _remove_files(self, instance_id: str) -> None:
        records.remove(self._paths.instances, instance_id)
        shutil.rmtree(self._paths.sandboxes / instance_id, ignore_errors=True)

    async def _release_cgroup(self, instance: Instance) -> None:
        if instance.cgroup is not None and isinstance(self._cgroup, cgroups.CgroupV2):
            path, instance.cgroup = instance.cgroup, None
            await asyncio.to_thread(self._cgroup.remove, path)

    def background(self, work: Coroutine[Any, Any, None], name: str | None = None) -> asyncio.Task[None]:
        """Run `work` as a task that `aclose` waits for."""
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def aclose(self, *, keep: Callable[[Instance], bool]) -> None:
        """Stop every instance (keeping the files of those `keep` selects) and wait for every
        background task."""
        await asyncio.gather(*(self.stop(i, keep=keep(i)) for i in list(self.instances.values())))
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- what a previous gateway left ------------------------------------------------------

    async def sweep(self) -> list[records.InstanceRecord]:
        """Kill any survivor of a previous gateway, remove every record and directory it left,
        and return those records."""
        found = await asyncio.to_thread(records.load_all, self._paths.instances)
        if found:
            await asyncio.to_thread(_kill_survivors, {r.instance_id for r in found})
            for record in found:
                await asyncio.to_thread(self._remove_files, record.instance_id)
            _log.info("local driver: removed %d instance records of a previous run", len(found))
        return found


def _kill_survivors(instance_ids: set[str]) -> None:
    """SIGKILL every process that belongs to one of these instances (blocking).

    Sandboxes die with the gateway (--die-with-parent), so this finds something only in corner
    cases (unisolated mode, a bwrap killed while it started); the instance id is in a bwrap'd
    process's argv (--setenv) and in an unisolated supervisor's environment."""
    markers = [
        marker
        for instance_id in instance_ids
        for marker in (
            f"WARMSHELL_INSTANCE_ID\0{instance_id}\0".encode(),
            f"WARMSHELL_INSTANCE_ID={instance_id}\0".encode(),
        )
    ]
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        for name in ("cmdline", "environ"):
            with contextlib.suppress(OSError):
                content = Path(entry.path, name).read_bytes()
                if any(marker in content for marker in markers):
                    with contextlib.suppress(OSError):
                        os.kill(int(entry.name), signal.SIGKILL)
                    break
