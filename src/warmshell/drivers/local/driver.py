"""The local compute driver: each sandbox is bubblewrap with a tiny agent as pid 1, and its
supervisor runs host-side, in the gateway.

A create is served warm when exactly one pool matches its fingerprint and has a registered idle
member: the member is bound to the sandbox (recorded), renamed, and handed to the gateway's
Activator. Otherwise it goes cold: a supervisor bound to the sandbox from birth is spawned, and
the gateway activates it once it registers, through the same registry. Sandboxes, supervisors
and files are the `fleet`'s, each sandbox started by the `runtime`; pools, idle members' liveness
and refills are `pools.pooling`'s, which starts members through the fleet (`pools.members`); the
claim is this module's loop over a `pooling.Claim` (next live member, activate, taken or spent);
what a spec or profile may ask for is `admission`'s; what the host gives (bubblewrap, a uid per
sandbox, bounds, the cgroup) is settled once by `hostsetup`; this module routes, binds and reports.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import dataclasses
import functools
import logging
from collections.abc import AsyncIterator
from pathlib import Path

from warmshell.core import allocation
from warmshell.core.config import LocalDriverConfig, StatePaths
from warmshell.core.errors import AlreadyExistsError, FailedPreconditionError, NotFoundError, UnavailableError
from warmshell.core.fingerprints import shape_of
from warmshell.core.ids import InstanceId, SandboxId
from warmshell.core.models import SandboxSpec, now_us
from warmshell.core.profiles import Setup
from warmshell.drivers.base import (
    Activator,
    CreateRequest,
    DriverEvent,
    DriverSandbox,
    MissReason,
    PoolView,
    ProgressLine,
    SandboxUsage,
    SnapshotTaken,
)
from warmshell.drivers.events import Hub
from warmshell.drivers.local import admission
from warmshell.drivers.local.fleet import Fleet
from warmshell.drivers.local.hostsetup import HostSetup
from warmshell.drivers.local.identity import LocalIdentity
from warmshell.drivers.local.instances import Instance, lost_sandbox
from warmshell.drivers.local.pools import pooling, preparing, reloading
from warmshell.drivers.local.pools.members import FleetMembers
from warmshell.drivers.local.runtime import cgroups
from warmshell.drivers.local.runtime.files import LocalFiles
from warmshell.drivers.local.runtime.hostnames import HostnameSetter
from warmshell.drivers.local.runtime.launching import AGENT_BINARY
from warmshell.drivers.local.runtime.processes import SandboxProcess
from warmshell.drivers.local.snapshots import Snapshots
from warmshell.drivers.local.supervising import GatewayLink, HostSupervisors, Supervise

__all__ = ["LocalDriver"]

_log = logging.getLogger(__name__)

_LOST = "the sandbox's process ended with the previous gateway"


def _no_build(profile: str, workspace: str, base: str, setup: Setup, tag: str) -> None:
    raise preparing.BuildError("this driver was started without a builder: [setup] needs a gateway")


class LocalDriver:
    """A `ComputeDriver` running sandboxes as bwrap'd agents with host-side supervisors.

    Sandboxes are children of the gateway and die with it; on the next start the driver reports
    the sandboxes of the previous run as failed (`get`, `list`, and a `watch` event to watchers
    that subscribed before `__aenter__`). Without bubblewrap the constructor raises unless
    `config.allow_unisolated` is set; then workloads run as plain processes with no isolation
    at all (see `launching`). `build` makes the images of profiles with `[setup]` (the gateway's;
    without it such a profile's pool reports BuildFailed). `supervise` (what runs each sandbox's
    supervisor), `agent` and `cgroup` exist for tests.
    """

    name = "local"

    def __init__(
        self,
        config: LocalDriverConfig,
        paths: StatePaths,
        *,
        supervise: Supervise | None = None,
        agent: Path = AGENT_BINARY,
        cgroup: cgroups.Backend | cgroups.Unavailable | None = None,
        kill_grace_seconds: float = 2.0,
        build: preparing.Build | None = None,
    ) -> None:
        self._config = config
        self._paths = paths
        self._host = HostSetup.of(config, paths, agent=agent, cgroup=cgroup)
        self._supervisors = HostSupervisors(paths.supervisor_socket)
        self._fleet = self._new_fleet(supervise or self._supervisors, kill_grace_seconds)
        self._sandboxes: dict[SandboxId, Instance] = {}
        self._lost: dict[SandboxId, DriverSandbox] = {}
        self._creating: dict[SandboxId, asyncio.Task[DriverSandbox]] = {}
        self._hub = Hub()
        self._hostnames = HostnameSetter()
        self._activator: Activator | None = None
        self._reloader: asyncio.Task[None] | None = None
        self._build = build
        self._pools = self._pool_set() if config.pools_dir is not None else None
        self.identity = LocalIdentity(self._fleet.instances.get, self._on_registered)
        self._snapshots = self._new_snapshots()

    def _new_snapshots(self) -> Snapshots | None:
        images = self._host.launcher.images
        if images is None:
            return None

        def freeze(instance: Instance, frozen: bool) -> None:
            self._fleet.freeze_now(instance, frozen=frozen)

        return Snapshots(
            images.store,
            overlay_dirs=self._host.launcher.overlay_dirs,
            freeze=freeze,
            max_layers=self._config.max_layers,
        )

    def _new_fleet(self, supervise: Supervise, grace: float) -> Fleet:
        return Fleet(host=self._host, paths=self._paths, grace=grace, on_ended=self._on_ended, supervise=supervise)

    def _pool_set(self) -> pooling.PoolSet:
        self._preparer = preparing.Preparer(
            validate=functools.partial(admission.check_profile, host=self._host),
            build=self._build or _no_build,
            changed=lambda: pools.reapply(),
        )
        pools = pooling.PoolSet(
            members=FleetMembers(self._fleet, self._paths.sandboxes, nice=self._host.refill_nice),
            default_image=self.default_image(),
            validate=self._preparer.resolve,
            probe_seconds=self._config.member_probe_seconds,
            check_seconds=self._config.member_check_seconds,
        )
        return pools

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> LocalDriver:
        for record in await self._fleet.sweep():
            if record.sandbox_id:  # idle pool members of the previous run concern nobody
                lost = lost_sandbox(record, _LOST)
                self._lost[lost.sandbox_id] = lost
                self._hub.publish(DriverEvent(lost.sandbox_id, sandbox=lost))
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def supervise_in_process(self, link: GatewayLink) -> None:
        """Host-side supervisors reach the gateway through `link`, its in-process supervisor
        API, instead of its supervisor socket (the gateway calls this before `start`)."""
        self._supervisors.use(link)

    async def start(self, activator: Activator) -> None:
        """Keep the activator; load the warm-pool profiles and start filling the pools (the
        gateway's supervisor API is served by now: host-side supervisors register through it)."""
        self._activator = activator
        if self._pools is not None and self._config.pools_dir is not None:
            self._pools.start()
            self._reloader = asyncio.create_task(
                reloading.watch(
                    self._config.pools_dir,
                    interval=self._config.pool_reload_interval_seconds,
                    max_replicas=self._config.max_pool_replicas,
                    apply=self._pools.apply,
                    also=self._host.launcher.images.watched if self._host.launcher.images is not None else (),
                ),
                name="local-pool-profiles",
            )

    async def aclose(self) -> None:
        """Stop every sandbox and its supervisor (they could not outlive the gateway anyway) and
        end watches.

        Records of bound sandboxes stay on disk, so the next start reports them as lost."""
        if self._reloader is not None:
            self._reloader.cancel()
            await asyncio.gather(self._reloader, return_exceptions=True)
        if self._pools is not None:
            self._preparer.cancel()
            await self._pools.aclose()
        await self._fleet.aclose(keep=lambda instance: instance.sandbox_id is not None)
        await self._supervisors.aclose()
        self._hub.close()

    # -- the ComputeDriver surface ---------------------------------------------------------

    def default_image(self) -> str:
        """The host's root filesystem, read-only (see `images`)."""
        return ""

    def validate(self, workspace: str, spec: SandboxSpec) -> SandboxSpec:
        """Local meaning of a spec, and the spec as this driver runs it (an image of the image
        store pinned to its digest; see `admission.check_spec`)."""
        return admission.check_spec(spec, self._host)

    async def create(self, request: CreateRequest) -> DriverSandbox:
        """Serve the request from its warm pool if exactly one matches and has a registered
        idle member, else spawn a supervisor bound to it (cold). Idempotent per sandbox id;
        returns without waiting for a cold supervisor to register."""
        existing = self._sandboxes.get(request.sandbox_id)
        if existing is not None:
            return existing.view()
        pending = self._creating.get(request.sandbox_id)
        if pending is None:
            request = dataclasses.replace(request, spec=self.validate(request.workspace, request.spec))
            pending = asyncio.create_task(self._create(request))
            self._creating[request.sandbox_id] = pending
            pending.add_done_callback(lambda _: self._creating.pop(request.sandbox_id, None))
        # Shielded: a caller giving up does not abandon a half-made sandbox.
        return await asyncio.shield(pending)

    async def get(self, sandbox_id: SandboxId) -> DriverSandbox | None:
        """The sandbox's current view; None when this driver has no such sandbox."""
        instance = self._sandboxes.get(sandbox_id)
        return instance.view() if instance is not None else self._lost.get(sandbox_id)

    async def list(self) -> builtins.list[DriverSandbox]:
        """Every sandbox, including those lost with the previous gateway."""
        return [i.view() for i in self._sandboxes.values()] + [*self._lost.values()]

    async def delete(self, sandbox_id: SandboxId) -> bool:
        """Stop the process group, remove the workspace and the record; idempotent."""
        if self._lost.pop(sandbox_id, None) is not None:
            self._hub.publish(DriverEvent(sandbox_id, deleted=True))
            return True
        pending = self._creating.get(sandbox_id)
        if pending is not None:  # let the create finish, or a process could start after this
            await asyncio.gather(asyncio.shield(pending), return_exceptions=True)
        instance = self._sandboxes.get(sandbox_id)
        if instance is None:
            return False
        await self._fleet.stop(instance)
        if self._sandboxes.get(sandbox_id) is instance:
            del self._sandboxes[sandbox_id]
            self._hub.publish(DriverEvent(sandbox_id, deleted=True))
        return True

    async def files(self, sandbox_id: SandboxId) -> LocalFiles:
        """The files of a running, isolated sandbox, as its workload sees them (see `rootfs`)."""
        instance = self._sandboxes.get(sandbox_id)
        if instance is None or not instance.alive or instance.process is None:
            raise FailedPreconditionError(f"sandbox {sandbox_id} is not running")
        process = instance.process
        if not isinstance(process, SandboxProcess):
            raise FailedPreconditionError(
                "files need an isolated sandbox: local.allow_unisolated mode has no sandbox root to confine them to"
            )
        return self._fleet.files(instance, process)

    def egress_socket(self, instance_id: str) -> Path | None:
        """Where the gateway's egress proxy listens for this instance: in the directory bound
        into its sandbox (None: unknown, or unisolated, which has the host's network anyway)."""
        instance = self._fleet.instances.get(InstanceId(instance_id))
        if instance is None or not self._host.launcher.isolated:
            return None
        return instance.egress_dir / "proxy.sock"

    def share_authority(self, certificate_pem: bytes) -> None:
        """Blocking: the gateway's egress CA and its bundle placed once where every sandbox on
        the host's root reads them (`egress.SHARED_TRUST_DIR`); only an intercepting activation
        links a sandbox's trust to them. FailedPreconditionError when they cannot be written."""
        try:
            self._host.launcher.share_authority(certificate_pem)
        except OSError as exc:
            raise FailedPreconditionError(f"the egress CA in the staged /etc: {exc}") from exc

    async def freeze(self, sandbox_id: SandboxId, *, frozen: bool = True) -> None:
        """Freeze every process of a running sandbox (`frozen=False`: thaw them) through its
        cgroup's freezer; returns once the kernel says they are. FailedPreconditionError when it
        is not running or this host cannot freeze it (no cgroup, or no freezer)."""
        await self._fleet.freeze(self._running(sandbox_id), frozen=frozen)

    @property
    def max_fork_count(self) -> int:
        """`local.max_fork_count`: the most children one fork may ask for."""
        return self._config.max_fork_count

    async def snapshot(
        self, sandbox_id: SandboxId, *, image: str, force: bool, source: str, durable: bool = True
    ) -> SnapshotTaken:
        """Capture a running sandbox of an image as `image` (see `snapshots`)."""
        instance = self._running(sandbox_id)
        if self._snapshots is None:
            raise FailedPreconditionError("this gateway has no image store: snapshots need one (local.image_dir)")
        taken = await self._snapshots.take(instance, tag=image, force=force, source=source, durable=durable)
        return SnapshotTaken(
            digest=taken.image.digest,
            image=taken.tag,
            base_digest=taken.image.base_digest,
            layers=len(taken.image.layers),
            layer_bytes=taken.layer_bytes,
            frozen_ms=taken.frozen_ms,
            flattened=taken.flattened,
        )

    async def forget(self, digest: str) -> None:
        """Remove a snapshot by digest (see `Snapshotter.forget`); one already gone is fine."""
        images = self._host.launcher.images
        if images is not None:
            with contextlib.suppress(NotFoundError):
                await asyncio.to_thread(images.store.remove, digest)

    async def usage(self, sandbox_id: SandboxId) -> SandboxUsage:
        """cpu seconds, memory now and at its peak, and processes of a running sandbox, read from
        its cgroup, and the bytes in its /workspace (FailedPreconditionError when it is not
        running here; a figure it cannot read is None, and `unknown` says why)."""
        return await self._fleet.usage(self._running(sandbox_id))

    def _running(self, sandbox_id: SandboxId) -> Instance:
        instance = self._sandboxes.get(sandbox_id)
        if instance is None or not instance.alive:
            raise FailedPreconditionError(f"sandbox {sandbox_id} is not running")
        return instance

    def watch(self) -> AsyncIterator[DriverEvent]:
        """Events from this call on, until the driver closes."""
        return self._hub.subscribe()

    def pools(self) -> builtins.list[PoolView]:
        """The warm pools, with invalid profiles reported as pools with a condition."""
        return self._pools.views() if self._pools is not None else []

    # -- warm or cold ----------------------------------------------------------------------

    async def _create(self, request: CreateRequest) -> DriverSandbox:
        shape = shape_of(request.workspace, request.spec, default_image=self.default_image())
        decision = allocation.decide(shape, self._pools, ready=self._activator is not None)
        if isinstance(decision, allocation.Warm):
            served = await self._claim(decision.pool, request, decision.injected)
            if served is not None:
                return served
            decision = allocation.empty(decision.pool)
        # Per pool here; by reason once, in the gateway's manager, from the view's miss_reason.
        for pool in decision.charged:
            pool.misses += 1
        return await self._spawn_cold(request, decision.reason)

    async def _claim(
        self, pool: pooling.Pool, request: CreateRequest, injected: tuple[str, ...]
    ) -> DriverSandbox | None:
        """A live idle member of the pool, bound to the sandbox and activated; None if none
        was. Each member that cannot be activated is spent and the next one tried (see
        `pooling.Claim`)."""
        assert self._pools is not None
        claimed_us = now_us()
        async with self._pools.claim(pool) as claim:
            while (member := await claim.next_live()) is not None:
                if await self._activate(member, pool, request):
                    claim.taken(member)
                    break
                claim.spent(member)
        if member is None:
            return None
        self._progress(member, "PoolHit", f"activated a warm sandbox from pool {pool.name}")
        self._changed(member)
        return dataclasses.replace(
            member.view(),
            claimed_us=claimed_us,
            injected_environment=injected,
            pool_ttl_seconds=pool.profile.ttl_seconds,
            pool_idle_timeout_seconds=pool.profile.idle_timeout_seconds,
        )

    async def _activate(self, member: Instance, pool: pooling.Pool, request: CreateRequest) -> bool:
        """Bind a claimed member to the sandbox and activate it; False (unbound again) when it
        died, is no longer registered or was taken meanwhile."""
        assert self._activator is not None
        member.sandbox_id = request.sandbox_id
        member.proof = request.activation_proof
        member.name = member.hostname = request.name
        self._sandboxes[request.sandbox_id] = member
        # Written in the background: a crash before it lands only loses the report of this
        # sandbox as lost on the next start (the gateway then finds it gone anyway).
        self._fleet.save_soon(member)
        try:
            if member.process is not None:
                await member.process.prioritise()  # it was started at the refill's priority
            await self._rename(member)  # before activation: the workload may ask at once
            await self._activator.activate(
                instance_id=member.instance_id,
                sandbox_id=request.sandbox_id,
                proof=request.activation_proof,
                reason=f"pool/{pool.name}",
            )
        except (NotFoundError, UnavailableError, AlreadyExistsError, OSError) as exc:
            _log.info("warm pool %s: member %s unusable: %s", pool.name, member.instance_id, exc)
            self._unbind(member)
            return False
        except BaseException:
            self._unbind(member)
            raise
        return True

    async def _rename(self, member: Instance) -> None:
        """Give a claimed member the sandbox's name as hostname (cold ones start with it)."""
        pid = await member.process.sandbox_pid() if member.process is not None else None
        if pid is not None:
            await self._hostnames.set(pid, member.hostname)

    def _unbind(self, member: Instance) -> None:
        if member.sandbox_id is not None and self._sandboxes.get(member.sandbox_id) is member:
            del self._sandboxes[member.sandbox_id]

    async def _spawn_cold(self, request: CreateRequest, miss: MissReason) -> DriverSandbox:
        instance = Instance.cold(request, miss.value, sandboxes=self._paths.sandboxes)
        self._sandboxes[request.sandbox_id] = instance
        self._progress(instance, "Spawning", f"starting a sandbox (cold: {miss.value})")
        try:
            await self._fleet.launch(instance, request.spec)
        except BaseException:
            del self._sandboxes[request.sandbox_id]
            raise
        self._changed(instance)
        return instance.view()

    # -- events ----------------------------------------------------------------------------

    def _on_registered(self, instance: Instance) -> None:
        instance.registered = True
        if instance.sandbox_id is None and self._pools is not None:
            self._pools.member_registered(instance)
        self._progress(instance, "Registered", "the supervisor registered")

    async def _on_ended(self, instance: Instance) -> None:
        if instance.sandbox_id is None:  # an idle pool member: forget it, the pool refills
            if self._pools is not None:
                self._pools.member_ended(instance, instance.message)
            await self._fleet.discard(instance)
            return
        self._changed(instance)

    def _changed(self, instance: Instance) -> None:
        if instance.sandbox_id is not None:
            self._hub.publish(DriverEvent(instance.sandbox_id, sandbox=instance.view()))

    def _progress(self, instance: Instance, reason: str, message: str) -> None:
        if instance.sandbox_id is not None:
            line = ProgressLine(reason, message)
            self._hub.publish(DriverEvent(instance.sandbox_id, progress=line))
