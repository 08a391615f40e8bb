"""Every local instance's sandbox, supervisor and files: start, notice the end, stop, clean up,
and sweep what a previous gateway left behind.

The driver decides what an instance is for (a sandbox, or an idle pool member); the fleet only
runs it: the sandbox (bwrap + agent, see `launching`) and, host-side, its supervisor with a fresh
bootstrap credential (see `supervising`). Whichever of the two ends first ends the other. An
instance's files are `<sandboxes>/<id>.log` (bwrap's output), `<sandboxes>/<id>/workspace/` when
its /workspace is a directory on the host's disk there, and, once bound to a sandbox,
`<instances>/<id>.json`. Most instances (a tmpfs workspace, or one under `local.sandbox_dir`) have
no directory: on ext4 under churn, allocating a directory's inode was the largest part of the
gateway's own kernel time per member start. For the same reason a root gateway keeps what lives
only as long as the sandbox in its runtime directory, a tmpfs (see `runtimedir`): the egress
directory, the uid lease and, for a sandbox with nothing on the host's disk, the log
(`<runtime>/<gateway>/<id>.log`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import shutil
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from warmshell.core.config import StatePaths
from warmshell.core.errors import FailedPreconditionError, UnavailableError, WarmshellError
from warmshell.core.ids import InstanceId
from warmshell.core.models import SandboxSpec
from warmshell.drivers.base import BackendState, DriverCondition, SandboxUsage
from warmshell.drivers.local import credentials, records
from warmshell.drivers.local.hostsetup import HostSetup
from warmshell.drivers.local.instances import EGRESS_SUFFIX, LOG_SUFFIX, Instance, egress_dir
from warmshell.drivers.local.runtime import cgroups, holding, imageroots, runtimedir
from warmshell.drivers.local.runtime import limits as resource_limits
from warmshell.drivers.local.runtime import usage as runtime_usage
from warmshell.drivers.local.runtime.files import LocalFiles, bytes_executor, files_executor
from warmshell.drivers.local.runtime.launching import Launcher, traversable_dir
from warmshell.drivers.local.runtime.processes import SandboxProcess, read_tail
from warmshell.drivers.local.runtime.uidlease import UidLeases
from warmshell.drivers.local.supervising import Seat, Supervise

__all__ = ["ISOLATION", "Fleet"]

_log = logging.getLogger(__name__)
# The start-up sweep's scans for a previous run's processes: until one finds none, at most ~2 s.
_SURVIVOR_SCANS = 100
_SURVIVOR_RESCAN_SECONDS = 0.02
ISOLATION = (
    "user, pid, net, ipc, uts, mount namespaces; no capabilities; seccomp; host paths: allow-list; supervisor outside"
)


class Fleet:
    """The live instances, keyed by instance id."""

    def __init__(
        self,
        *,
        host: HostSetup,
        paths: StatePaths,
        grace: float,
        on_ended: Callable[[Instance], Awaitable[None]],
        supervise: Supervise,
    ) -> None:
        """Sandboxes start with `host`'s launcher, in its cgroup; with its uid range, each runs as
        its own uid and its workspace lives under its workspace directory (see `launching`)."""
        self._launcher: Launcher = host.launcher
        self._as_root = host.root
        self._files_executor: ThreadPoolExecutor | None = None
        self._bytes_executor: ThreadPoolExecutor | None = None
        self._supervise = supervise
        self._uids: UidLeases | None = host.uids
        self._workspaces: Path | None = host.workspaces
        self._runtime: Path | None = host.runtime
        self._logs: Path | None = host.logs
        self._runtime_made = False  # `runtime` checked (and made) by the sweep or the first start
        self._held: list[holding.Hold] = []  # `runtime` and `logs`, kept from other gateways' sweeps
        self._paths = paths
        self._cgroup: cgroups.Backend | cgroups.Unavailable = host.cgroup
        self._grace = grace
        self._on_ended = on_ended
        self.instances: dict[InstanceId, Instance] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._removals: list[tuple[InstanceId, bool, asyncio.Future[None]]] = []
        self._remover: asyncio.Task[None] | None = None
        self._saves: list[tuple[records.InstanceRecord, asyncio.Future[None]]] = []
        self._saver: asyncio.Task[None] | None = None
        self._sandboxes_made = False  # `paths.sandboxes` exists (made by the first start)
        self._conditions_of: dict[resource_limits.Bounds | None, tuple[DriverCondition, ...]] = {}

    # -- spawning --------------------------------------------------------------------------

    async def launch(self, instance: Instance, spec: SandboxSpec, *, nice: int = 0) -> None:
        """Start the instance's sandbox (at nice value `nice`), then its supervisor; on failure
        everything it made is removed again (UnavailableError when the sandbox could not be
        started)."""
        defaults = self._launcher.bounds
        instance.bounds = defaults.for_spec(spec) if defaults is not None else None
        instance.conditions = self._conditions(instance.bounds)
        credential = credentials.new_credential(instance.instance_id)
        instance.credential_digest = credentials.digest(credential)
        self.instances[instance.instance_id] = instance
        try:
            if self._uids is not None and self._launcher.isolated:
                instance.workspaces, instance.runtime = self._workspaces, self._runtime
                if instance.bounds is not None and instance.bounds.workspace_bytes is not None:
                    # Nothing of it on disk, so neither its log, by which a sweep finds it. With
                    # a workspace on disk the log stays in the state directory, where a sweep
                    # after a reboot (which empties a tmpfs) still finds it, and the workspace.
                    instance.logs = self._logs
            # Prepared in a spawner thread, right before the spawn (one thread hop per start).
            prepare = functools.partial(self._prepare, instance, spec.image)
            instance.process = await self._launcher.start(instance, image=spec.image, nice=nice, prepare=prepare)
            await self._make_workdir(instance)
            # An idle member's record is first written when a create claims it: until then it
            # concerns nobody after a crash, and the sweep finds its log without one.
            if instance.sandbox_id is not None:
                self.save_soon(instance)
        except BaseException as exc:
            if instance.process is not None:
                await instance.process.stop(self._grace)
            await self.discard(instance)
            if isinstance(exc, OSError | ValueError):
                raise UnavailableError(f"cannot start a local sandbox: {exc}") from exc
            raise
        image = instance.image_root
        seat = Seat(
            instance.instance_id,
            credential,
            instance.process.runner,
            environment=image.environment if image is not None else {},
            workdir=image.config.working_dir if image is not None else "",
        )
        del credential  # from here on only the supervisor holds it; the driver keeps its digest
        instance.state = BackendState.RUNNING
        instance.supervisor = asyncio.create_task(self._supervise(seat), name=f"supervisor:{instance.instance_id}")
        instance.waiter = self.background(self._wait(instance), name=f"wait:{instance.instance_id}")

    async def _make_workdir(self, instance: Instance) -> None:
        """Make the image's WorkingDir where its layers lack it, as container runtimes do at
        start: with the sandbox's own rights, so it belongs to the image's User inside and is
        resolved in the sandbox's root (a link in the image cannot lead it out). One that cannot
        be made (a file of that name) fails the start, naming it."""
        image, process = instance.image_root, instance.process
        if image is None or not image.config.working_dir or not isinstance(process, SandboxProcess):
            return
        path = image.config.working_dir
        try:
            await self.files(instance, process).mkdir(path, parents=True, mode=0o755)
        except WarmshellError as exc:
            raise FailedPreconditionError(f"spec.image: the image's WorkingDir {path!r} cannot be made: {exc}") from exc

    def files(self, instance: Instance, process: SandboxProcess) -> LocalFiles:
        """The files of an instance's running sandbox, used with its own rights (see `files`)."""
        if self._files_executor is None:
            self._files_executor = files_executor(as_root=self._as_root)
            self._bytes_executor = bytes_executor(as_root=self._as_root)
        return LocalFiles(process.open_root, instance.uid, self._files_executor, self._bytes_executor)

    def save_soon(self, instance: Instance) -> None:
        """Write the record in the background, with every record queued meanwhile: one thread
        hop per batch (a thread hop costs milliseconds on a busy host, and a burst of claims
        used to start a write each, whose threads fought the event loop for the GIL: ~1 ms of
        the gateway's CPU per warm create). `discard` waits for it, so a removal never precedes
        the write; the writes of one instance keep their order (one batch at a time, in order)."""
        saved = asyncio.get_running_loop().create_future()
        self._saves.append((instance.record(), saved))
        instance.saving = saved
        if self._saver is None:
            self._saver = self.background(self._save_pending(), name="save-instance-records")

    async def _save_pending(self) -> None:
        batch: list[tuple[records.InstanceRecord, asyncio.Future[None]]] = []
        try:
            while self._saves:
                batch, self._saves = self._saves, []
                await asyncio.to_thread(self._save_files, [record for record, _ in batch])
                for _, saved in batch:
                    saved.set_result(None)
                batch = []
        finally:
            self._saver = None
            for _, saved in [*batch, *self._saves]:  # only when cancelled: the loop is closing
                saved.cancel()
            self._saves = []

    def _save_files(self, batch: list[records.InstanceRecord]) -> None:
        """Blocking: write these records, in order; one that cannot be written is logged."""
        for record in batch:
            try:
                records.save(self._paths.instances, record)
            except OSError as exc:
                _log.warning("instance %s: cannot write its record: %s", record.instance_id, exc)

    def _prepare(self, instance: Instance, image: str) -> None:
        """Blocking: the sandbox's uid (leased host-wide: see `uidlease`), its directories (a
        workspace on the host's disk owned by its uid, unless it is a tmpfs), its cgroup, the
        root filesystem's bind sources."""
        self._make_runtime()  # before the uid lease in it
        if self._uids is not None and self._launcher.isolated:
            instance.uid = self._uids.acquire()
        if not self._sandboxes_made:
            self._paths.sandboxes.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._sandboxes_made = True
        bounds = instance.bounds
        if bounds is None or bounds.workspace_bytes is None:
            if instance.workspaces is not None:
                traversable_dir(instance.workspaces)
            else:
                instance.directory.mkdir(mode=0o700)
            instance.workspace_dir.mkdir(mode=0o700)
            if instance.uid is not None:
                os.chown(instance.workspace_dir, instance.uid, instance.uid)
        if self._launcher.isolated:
            # The log first: it is what a later start-up sweep finds an instance by, so a gateway
            # killed right after the mkdir below leaves nothing the sweep cannot name.
            os.close(os.open(instance.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600))
            # Its own uid alone may traverse it (the socket in it is 0666): on the host, the
            # instance id in bwrap's argv must not be enough to reach another sandbox's proxy.
            instance.egress_dir.mkdir(mode=0o700)
            if instance.uid is not None:
                os.chown(instance.egress_dir, instance.uid, instance.uid)
        self._launcher.prepare(image)
        if imageroots.is_reference(image) and self._launcher.images is not None:
            instance.image_root = self._launcher.images.acquire(image)
        if bounds is not None and not isinstance(self._cgroup, cgroups.Unavailable):
            try:
                instance.cgroup = self._cgroup.create(instance.instance_id, bounds.cgroup_limits())
            except OSError as exc:  # the sandbox runs without: say exactly what that leaves
                unavailable = cgroups.Unavailable(f"its cgroup could not be set up: {exc}")
                exact = resource_limits.condition(bounds, unavailable, uid_per_sandbox=self._uids is not None)
                failed = dataclasses.replace(exact, reason="CgroupSetupFailed")
                others = tuple(c for c in instance.conditions if c.type != "ResourceLimits")
                instance.conditions = (*others, failed)

    def _make_runtime(self) -> None:
        """Blocking, once: check (or make) the runtime directory (see `runtimedir`), and this
        gateway's directory of logs in it."""
        if self._runtime is None or self._runtime_made:
            return
        assert self._workspaces is not None  # a runtime directory only with a uid per sandbox
        self._held.append(holding.hold(self._runtime, self._workspaces))
        if self._logs is not None:  # in a directory nobody else may write to
            self._held.append(holding.hold(self._logs, self._paths.root.resolve(), mode=0o700))
        self._runtime_made = True

    def _conditions(self, bounds: resource_limits.Bounds | None) -> tuple[DriverCondition, ...]:
        """What an instance with these bounds reports (the same for every member of a pool:
        remembered for the last few bounds seen)."""
        conditions = self._conditions_of.get(bounds)
        if conditions is None:
            if len(self._conditions_of) >= 32:
                self._conditions_of.clear()
            conditions = self._conditions_of[bounds] = self._describe(bounds)
        return conditions

    def _describe(self, bounds: resource_limits.Bounds | None) -> tuple[DriverCondition, ...]:
        if not self._launcher.isolated:
            message = "local.allow_unisolated: plain processes of the gateway's user, no isolation at all"
            unbounded = "local.allow_unisolated: no storage, memory, cpu or process bounds at all"
            return (
                DriverCondition("Isolated", "False", "Unisolated", message),
                DriverCondition("ResourceLimits", "False", "Unisolated", unbounded),
            )
        conditions = [DriverCondition("Isolated", "True", "Bubblewrap", ISOLATION)]
        if bounds is not None:
            uid_per_sandbox = self._uids is not None
            conditions.append(resource_limits.condition(bounds, self._cgroup, uid_per_sandbox=uid_per_sandbox))
        return tuple(conditions)

    # -- ends, stops and clean-up ----------------------------------------------------------

    async def _wait(self, instance: Instance) -> None:
        """Until the sandbox or its supervisor ends; then end the other."""
        assert instance.process is not None
        assert instance.supervisor is not None
        supervisor = instance.supervisor
        # The process's own future, not a task around `wait()`: one task less per instance.
        await asyncio.wait([instance.process.ended, supervisor], return_when=asyncio.FIRST_COMPLETED)
        if supervisor.done():
            code = _status(supervisor)
            await instance.process.stop(self._grace)
            what = f"the supervisor exited with status {code}"
        else:
            code = await instance.process.wait()
            if not instance.deleting:  # `stop` cancelled it already: a second cancel would cut
                supervisor.cancel()  # short its clean-up (killing and reaping its processes)
            await asyncio.gather(supervisor, return_exceptions=True)
            what = f"the sandbox ended (bwrap status {code})"
        await self._release(instance)
        instance.ended.set()
        if instance.deleting:
            return
        if instance.registered:
            instance.state = BackendState.EXITED
            instance.message = what
        else:
            instance.state = BackendState.FAILED
            tail = "\n".join(await asyncio.to_thread(read_tail, instance.process.log_path))
            instance.message = f"{what} before registering"
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
        if instance.supervisor is not None:
            instance.supervisor.cancel()
        if instance.process is not None:
            await instance.process.stop(self._grace)
        if instance.waiter is not None:
            await instance.waiter
        if keep:  # the record stays, for the next start to report the sandbox as lost
            self.instances.pop(instance.instance_id, None)
            await self._release(instance)
            if instance.workspaces is not None:  # outside the state directory: nobody else cleans it
                await asyncio.to_thread(shutil.rmtree, instance.workspace_dir, True)
            if instance.runtime is not None:  # nor the runtime directory, and what ran is gone
                await asyncio.to_thread(_remove_dir, instance.egress_dir)
        else:
            await self.discard(instance)
        instance.ended.set()

    async def discard(self, instance: Instance) -> None:
        """Forget an ended instance and remove its files."""
        self.instances.pop(instance.instance_id, None)
        recorded = instance.saving is not None  # an idle member never had a record
        if instance.saving is not None:
            await asyncio.gather(instance.saving, return_exceptions=True)
        await self._release(instance)
        removed = asyncio.get_running_loop().create_future()
        self._removals.append((instance.instance_id, recorded, removed))
        if self._remover is None:
            self._remover = self.background(self._remove_pending(), name="remove-instance-files")
        await asyncio.shield(removed)  # removed even when the caller gives up

    async def _remove_pending(self) -> None:
        """Remove the files of every instance discarded meanwhile, in one thread hop per batch
        (a pool drained or refilled at once ends many instances in the same moment)."""
        batch: list[tuple[InstanceId, bool, asyncio.Future[None]]] = []
        try:
            while self._removals:
                batch, self._removals = self._removals, []
                await asyncio.to_thread(self._remove_files, [(i, recorded) for i, recorded, _ in batch])
                for _, _, removed in batch:
                    removed.set_result(None)
                batch = []
        finally:
            self._remover = None
            for _, _, removed in [*batch, *self._removals]:  # only when cancelled: the loop is closing
                removed.cancel()
            self._removals = []

    def _remove_files(self, instances: list[tuple[str, bool]]) -> None:
        """Blocking: each instance's record (when it had one), directory and workspace; what
        cannot be removed is logged and left (the next start's sweep tries again)."""
        for instance_id, recorded in instances:
            try:
                if recorded:
                    records.remove(self._paths.instances, instance_id)
                for logs in (self._paths.sandboxes, self._logs) if self._logs else (self._paths.sandboxes,):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(logs / (instance_id + LOG_SUFFIX))
                _remove_dir(self._paths.sandboxes / instance_id)
                _remove_dir(egress_dir(self._runtime or self._paths.sandboxes, instance_id))
                if self._workspaces is not None:
                    _remove_dir(self._workspaces / instance_id)
            except OSError as exc:
                _log.warning("instance %s: cannot remove its files: %s", instance_id, exc)

    async def _release(self, instance: Instance) -> None:
        """Give back the cgroup and, once nothing of the sandbox runs, its uid (one thread hop)."""
        group, uid, image = instance.cgroup, instance.uid, instance.image_root
        instance.cgroup = instance.image_root = None
        if image is not None and self._launcher.images is not None:
            self._launcher.images.release(image.pinned)
        if instance.process is not None and instance.process.returncode is None:
            uid = None  # something of it may still run as that uid: kept
        if uid is not None:
            instance.uid = None
        if group is not None or uid is not None:
            await asyncio.to_thread(self._give_back, group, uid)

    def _give_back(self, group: cgroups.Group | None, uid: int | None) -> None:
        if group is not None and not isinstance(self._cgroup, cgroups.Unavailable):
            self._cgroup.remove(group)
        if uid is not None and self._uids is not None:
            self._uids.release(uid)

    async def freeze(self, instance: Instance, *, frozen: bool) -> None:
        """Freeze (or thaw) every process of the instance's sandbox, through its cgroup;
        FailedPreconditionError when it has none or the host has no freezer."""
        await asyncio.to_thread(functools.partial(self.freeze_now, instance, frozen=frozen))

    def freeze_now(self, instance: Instance, *, frozen: bool) -> None:
        """Blocking `freeze`, for a caller already in a worker thread."""
        backend, group = self._cgroup_of(instance, "freezer")
        try:
            backend.freeze(group, frozen=frozen)
        except OSError as exc:
            raise FailedPreconditionError(f"instance {instance.instance_id}: cannot freeze or thaw: {exc}") from exc

    async def usage(self, instance: Instance) -> SandboxUsage:
        """What the instance's sandbox uses now (see `runtime.usage`); what cannot be read (no
        cgroup, a /workspace on the host's disk) is unknown, saying why."""
        return await asyncio.to_thread(runtime_usage.read, self._usage_sources(instance))

    def _usage_sources(self, instance: Instance) -> runtime_usage.Sources:
        missing = []
        try:
            group: tuple[cgroups.Backend, cgroups.Group] | None = self._cgroup_of(instance, None)
        except FailedPreconditionError as exc:
            group = None
            missing.append(f"cpu, memory and processes: {exc}")
        process, bounds = instance.process, instance.bounds
        opener = None
        if isinstance(process, SandboxProcess) and bounds is not None and bounds.workspace_bytes is not None:
            opener = process.open_root
        else:
            missing.append("/workspace bytes: it is a directory on the host's disk, not a filesystem of its own")
        return runtime_usage.Sources(group, opener, tuple(missing))

    def _cgroup_of(self, instance: Instance, controller: str | None) -> tuple[cgroups.Backend, cgroups.Group]:
        """The backend and the instance's cgroup, when it has one (and the backend `controller`)."""
        backend = self._cgroup
        if isinstance(backend, cgroups.Unavailable) or instance.cgroup is None:
            why = backend.message if isinstance(backend, cgroups.Unavailable) else "none was made"
            raise FailedPreconditionError(f"instance {instance.instance_id} has no cgroup ({why})")
        if controller is not None and controller not in backend.controllers:
            raise FailedPreconditionError(f"this host's {backend.version} hierarchies have no {controller}")
        return backend, instance.cgroup

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
        await asyncio.to_thread(self._launcher.close)
        if not isinstance(self._cgroup, cgroups.Unavailable):
            await asyncio.to_thread(self._cgroup.close)
        for executor in (self._files_executor, self._bytes_executor):
            if executor is not None:
                executor.shutdown(wait=False, cancel_futures=True)
        for held in reversed(self._held):  # logs gone once empty; a kept sandbox's log waits for the next start
            await asyncio.to_thread(functools.partial(held.close, remove_if_empty=held.path == self._logs))
        self._held = []

    # -- what a previous gateway left ------------------------------------------------------

    async def sweep(self) -> list[records.InstanceRecord]:
        """Kill any survivor of a previous gateway, remove every record and directory it left,
        and return those records.

        Idle members have no record, and a gateway killed between starting an instance and
        writing its record leaves none either: every instance with a log or a directory under
        the state dir is swept too (with its workspace, when that lives in `local.sandbox_dir`,
        a directory gateways share: there only the workspaces of instances found here are
        removed). The log is made right before the sandbox is started."""
        cgroup = self._cgroup  # its sweep kills what ran in them, too
        if not isinstance(cgroup, cgroups.Unavailable) and (swept := await asyncio.to_thread(cgroup.sweep)):
            _log.info("local driver: removed %d cgroups of a previous run's sandboxes", len(swept))
        await asyncio.to_thread(records.remove_partial, self._paths.instances)
        found = await asyncio.to_thread(records.load_all, self._paths.instances)
        await asyncio.to_thread(self._make_runtime)  # a planted one is refused before it is read
        if self._runtime is not None:  # those of deleted sandbox and state directories, held by nobody
            await asyncio.to_thread(_sweep_abandoned, self._runtime)
        unowned = await asyncio.to_thread(_instances_on_disk, self._paths.sandboxes)
        if self._logs is not None:
            unowned |= await asyncio.to_thread(_instances_on_disk, self._logs)
        unowned -= {r.instance_id for r in found}
        if found or unowned:
            await asyncio.to_thread(_kill_survivors, {r.instance_id for r in found} | unowned)
            left = [(instance_id, True) for instance_id in sorted({r.instance_id for r in found} | unowned)]
            await asyncio.to_thread(self._remove_files, left)
            _log.info(
                "local driver: removed %d instance records and the files of %d unrecorded instances of a previous run",
                len(found),
                len(unowned),
            )
        return found


def _sweep_abandoned(runtime: Path) -> None:
    """Blocking: remove the runtime directories of deleted sandbox directories on the host's
    tmpfs, and in `runtime` the directories of logs of deleted state directories (see `holding`)."""
    mounted = runtimedir.host_tmpfs()
    removed = [
        path
        for base in runtimedir.TMPFS_CANDIDATES
        if base in mounted
        for path in holding.sweep_abandoned(base, runtimedir.RUNTIME_PREFIX, runtimedir.runtime_named)
    ]
    removed += holding.sweep_abandoned(runtime, runtimedir.GATEWAY_PREFIX, runtimedir.gateway_named)
    if removed:
        _log.info("local driver: removed %d directories of deleted sandbox or state directories", len(removed))


def _remove_dir(path: Path) -> None:
    """Remove a directory and everything in it (blocking; a missing one is fine): one call for
    what most instances have (none, or an empty one), where `shutil.rmtree` makes a dozen."""
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError:  # not empty (a workspace on the host's disk, say): the whole tree
        shutil.rmtree(path, ignore_errors=True)


def _instances_on_disk(directory: Path) -> set[str]:
    """The instances with a directory or a log under `directory` (blocking; none when it does
    not exist)."""
    try:
        entries = [entry.name for entry in os.scandir(directory)]
    except FileNotFoundError:
        return set()
    names = (name.removesuffix(LOG_SUFFIX).removesuffix(EGRESS_SUFFIX) for name in entries)
    return {name for name in names if name.startswith(credentials.INSTANCE_PREFIX)}


def _status(supervisor: asyncio.Task[int]) -> int:
    """A finished supervisor task's exit status (1 when it failed)."""
    if supervisor.cancelled():
        return 1
    if (error := supervisor.exception()) is not None:
        _log.error("a host-side supervisor failed", exc_info=error)
        return 1
    return supervisor.result()


def _kill_survivors(instance_ids: set[str]) -> None:
    """SIGKILL every process that belongs to one of these instances (blocking).

    Sandboxes die with the gateway (--die-with-parent, and their agent when its control socket
    closes), so this finds something only in corner cases (a bwrap killed while it started); the
    instance id is in a bwrap'd process's argv (--setenv). Such a survivor may be forking as it is
    killed (bwrap starting the sandbox's init, which has not set its parent-death signal yet) and a
    killed process takes a moment to go, so the scan is repeated until it finds none (seen once in
    a CI rehearsal: one scan left a process of the old run)."""
    markers = [
        marker
        for instance_id in instance_ids
        for marker in (
            f"WARMSHELL_INSTANCE_ID\0{instance_id}\0".encode(),
            f"WARMSHELL_INSTANCE_ID={instance_id}\0".encode(),
        )
    ]
    for _ in range(_SURVIVOR_SCANS):
        found = _marked_processes(markers)
        if not found:
            return
        for pid in found:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(_SURVIVOR_RESCAN_SECONDS)
    _log.warning("processes of a previous run's sandboxes would not die: %s", sorted(_marked_processes(markers)))


def _marked_processes(markers: list[bytes]) -> list[int]:
    """Pids (not this process) whose argv or environment holds one of `markers` (blocking)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        for name in ("cmdline", "environ"):
            with contextlib.suppress(OSError):
                if any(marker in Path(entry.path, name).read_bytes() for marker in markers):
                    found.append(int(entry.name))
                    break
    return found
