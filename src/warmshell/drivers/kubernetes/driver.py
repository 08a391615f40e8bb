"""The Kubernetes compute driver: each sandbox is an agent-sandbox `Sandbox` (one pod), created
directly (cold) or bound from a warm pool through a `SandboxClaim` (warm).

This module assembles and routes. Opening the driver builds every part once (`_Parts`): the
identity provider, the informers over our Sandboxes, their pods and the namespace's Events, the
warm path (`warm.allocation.WarmAllocation`, with its claim informer and claim activation
controller) and the Lease (`profiles.leadership`). A create is offered to the warm path, which
decides (`core.allocation`) and, on one matching pool, writes the SandboxClaim; its claim
activation controller later activates the warm pod agent-sandbox binds to it. Anything else goes
cold: the Sandbox is rendered (`rendering`) with the activation proof sealed onto it (`proofs`)
and created — one API write (`creating`). agent-sandbox makes the pod; its supervisor registers
with the pod's projected token and `identity` binds it to the sandbox. Reads go to the API
(`get`, `list`); `watch` subscribes to the driver's one event hub, which every part publishes to.
No part calls back into the driver.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import socket
from dataclasses import dataclass
from pathlib import Path

from warmshell.core.config import KubernetesDriverConfig, StatePaths
from warmshell.core.errors import FailedPreconditionError, InvalidArgumentError
from warmshell.core.fingerprints import shape_of
from warmshell.core.ids import SandboxId
from warmshell.core.models import SandboxSpec
from warmshell.drivers.base import (
    Activator,
    CreateRequest,
    DriverEvent,
    DriverSandbox,
    MissReason,
    PoolView,
    ProgressLine,
)
from warmshell.drivers.events import Hub, Subscription
from warmshell.drivers.kubernetes import (
    creating,
    finding,
    kube,
    labels,
    naming,
    proofs,
    rendering,
    status,
    suspending,
    watching,
)
from warmshell.drivers.kubernetes.identity import KubernetesIdentity
from warmshell.drivers.kubernetes.informers import Informers
from warmshell.drivers.kubernetes.objects import Obj
from warmshell.drivers.kubernetes.profiles.leadership import Leadership
from warmshell.drivers.kubernetes.warm import allocation, claims, poolcache

__all__ = ["KubernetesDriver"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Parts:
    """The driver's parts, each built once when it opens."""

    api: kube.Kube
    sealer: proofs.ProofSealer
    identity: KubernetesIdentity
    informers: Informers
    leadership: Leadership  # the profile reconciler and the gateway's singletons
    warm: allocation.WarmAllocation | None  # while warm pooling is configured


class KubernetesDriver:
    """A `ComputeDriver` creating agent-sandbox Sandboxes in one namespace (shared mode).
    `api` and `pool_cache` replace what the driver would connect to (for tests)."""

    name = "kubernetes"

    def __init__(
        self,
        config: KubernetesDriverConfig,
        paths: StatePaths,
        *,
        api: kube.Kube | None = None,
        watch_backoff: watching.Backoff | None = None,
        gateway_id: str = "",
        pool_cache: poolcache.PoolCache | None = None,
    ) -> None:
        if not config.gateway_address:
            raise FailedPreconditionError(
                "kubernetes.gateway_address is not set: the gateway's supervisor API as pods reach it"
            )
        self._config = config
        self._key_path = Path(config.proof_key_file) if config.proof_key_file else paths.root / "kubernetes-proof.key"
        self._given_api = api
        self._backoff = watch_backoff or watching.Backoff()
        self._pool_cache = pool_cache
        self._hub = Hub()
        self._parts: _Parts | None = None  # from `__aenter__` to `aclose`
        # Label-safe: which gateway wrote a claim (diagnostics; any replica may activate it).
        self._gateway_id = labels.label_value(gateway_id or socket.gethostname())

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> KubernetesDriver:
        try:
            await self._enter()
        except BaseException:
            # A context manager whose entry fails is never exited: release what entry opened.
            await self.aclose()
            raise
        return self

    async def _enter(self) -> None:
        key = await asyncio.to_thread(proofs.load_or_create_key, self._key_path)
        api = self._given_api or await kube.Kube.connect(self._config)
        self._parts = parts = self._build(api, proofs.ProofSealer(key))
        try:
            await api.sandbox_resource(self._config.namespace)
        except kube.Temporary as exc:
            # Not fatal: the probe runs again on first use.
            log.warning("kubernetes driver: cannot reach the API yet (%s)", exc)
        parts.informers.start()
        if parts.warm is not None:
            await parts.warm.open()

    def _build(self, api: kube.Kube, sealer: proofs.ProofSealer) -> _Parts:
        """Every part, wired to the others once (no I/O)."""
        config, warm_on = self._config, self._config.warm_pooling.enabled
        informers = Informers(api, config.namespace, self._hub, self._backoff, with_claims=warm_on)
        warm = (
            allocation.WarmAllocation(
                api,
                config,
                sealer,
                self._hub,
                self._backoff,
                informers,
                gateway_id=self._gateway_id,
                pool_cache=self._pool_cache,
            )
            if warm_on
            else None
        )
        identity = KubernetesIdentity(api, config, sealer, self._hub)
        return _Parts(api, sealer, identity, informers, Leadership(api, config), warm)

    @property
    def _opened(self) -> _Parts:
        if self._parts is None:
            raise FailedPreconditionError("the kubernetes driver is not started (use `async with`)")
        return self._parts

    @property
    def warm_allocation(self) -> allocation.WarmAllocation | None:
        """The warm path, while warm pooling is configured (after `__aenter__`)."""
        return self._opened.warm

    @property
    def informers(self) -> Informers:
        """The informers feeding `watch` (after `__aenter__`)."""
        return self._opened.informers

    @property
    def warm_allocation_on(self) -> bool:
        """Whether SandboxClaims may exist for us now: warm pooling is configured and the gate has
        not found the extension APIs absent (unknown, after a failed probe, counts as on)."""
        warm = self._opened.warm
        return warm is not None and warm.available

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def start(self, activator: Activator) -> None:
        """Cold sandboxes are activated by registration alone; warm ones by the claim controller."""
        parts = self._opened
        if parts.warm is None:
            return
        parts.warm.start(activator)
        if self._config.warm_pooling.profiles.enabled:
            parts.leadership.run_profiles(parts.warm.gate)

    def campaign(self) -> None:
        """See `drivers.base.Leadership`: the gateway's singletons follow the profile reconciler's
        Lease; without profiles, the Lease is held for them alone."""
        self._opened.leadership.campaign()

    def leading(self) -> bool:
        """See `drivers.base.Leadership`."""
        return self._parts is not None and self._parts.leadership.leading()

    async def aclose(self) -> None:
        """Stop every part and end watches; sandboxes keep running in the cluster."""
        parts, self._parts = self._parts, None
        if parts is not None:
            await parts.leadership.aclose()
            if parts.warm is not None:
                await parts.warm.aclose()
            await parts.informers.aclose()
            if self._given_api is None:
                await parts.api.aclose()
        self._hub.close()

    @property
    def identity(self) -> KubernetesIdentity:
        """Verifies the projected tokens of sandbox pods."""
        return self._opened.identity

    @property
    def api(self) -> kube.Kube:
        """The API adapter (after `__aenter__`)."""
        return self._opened.api

    # -- the ComputeDriver surface ---------------------------------------------------------

    def default_image(self) -> str:
        """The configured supervisor image."""
        return self._config.image

    def validate(self, workspace: str, spec: SandboxSpec) -> SandboxSpec:
        """An image is a container image reference that ships `warmshell` (see the README); the
        spec runs as asked."""
        if spec.image and any(c.isspace() for c in spec.image):
            raise InvalidArgumentError("spec.image", f"{spec.image!r} is not a container image reference")
        if spec.resources.pids:  # a pod's process limit is the node's (kubelet podPidsLimit)
            raise InvalidArgumentError("spec.resources.pids", "must be 0 on the Kubernetes driver (set by the node)")
        return spec

    async def create(self, request: CreateRequest) -> DriverSandbox:
        """A SandboxClaim when exactly one warm pool matches, else a cold Sandbox. Either is
        idempotent by name; an ambiguous failure is settled by reading back, never by writing
        blindly again (and never by falling back to the other path); UnavailableError when it
        cannot be settled."""
        ref = naming.object_ref(self._config, request.workspace, request.name)
        self.validate(request.workspace, request.spec)
        who = self._identity_of(request, ref)
        reason, warm = MissReason.DISABLED, self._opened.warm
        if warm is not None:
            shape = shape_of(request.workspace, request.spec, default_image=self.default_image())
            allocated = await warm.allocate(request, shape, ref, who)
            if isinstance(allocated, DriverSandbox):
                return allocated
            reason = allocated.reason
        view = await creating.create_sandbox(self.api, self._config, request, ref, who, miss=reason)
        self._progress(request.sandbox_id, "Created", f"Sandbox {ref} created (cold: {reason.value})")
        return view

    async def get(self, sandbox_id: SandboxId) -> DriverSandbox | None:
        """The Sandbox (or the SandboxClaim) carrying this id and its pod, read from the API now."""
        resource = await self.api.sandbox_resource(self._config.namespace)
        found = await finding.find(self.api, self._config.namespace, resource, sandbox_id)
        if found is not None:
            return status.view(found, await finding.pod_of(self.api, found))
        claim = await self._find_claim(sandbox_id)
        return (
            await finding.claim_view(self.api, self._config.namespace, resource, claim) if claim is not None else None
        )

    async def list(self) -> list[DriverSandbox]:
        """Every Sandbox and SandboxClaim with our labels (others are ignored), with its pod."""
        namespace = self._config.namespace
        resource = await self.api.sandbox_resource(namespace)
        selector = labels.managed_selector()
        warm_on = self.warm_allocation_on
        if warm_on:
            # Adopted pool members carry no sandbox id of ours: read every Sandbox and every pod of
            # ours, and join them to the claims.
            selector = f"{labels.MANAGED_BY}={labels.MANAGED_BY_VALUE}"
        sandboxes = await self.api.list(resource, namespace, label_selector="" if warm_on else selector)
        pods = await self.api.list(kube.PODS, namespace, label_selector=selector)
        pods_by_name = {p["metadata"]["name"]: p for p in pods.get("items") or []}
        sandboxes_by_name = {s["metadata"]["name"]: s for s in sandboxes.get("items") or []}
        views = [
            status.view(s, finding.own_pod_in(s, pods_by_name))
            for s in sandboxes_by_name.values()
            if status.is_managed(s)
        ]
        if warm_on:
            try:
                views += await finding.claim_views(self.api, namespace, sandboxes_by_name, pods_by_name)
            except kube.NotFound:
                self._extensions_gone()  # the collection is gone, and every claim with it
        return views

    def cached_list(self) -> builtins.list[DriverSandbox] | None:
        """What `list` would say, from the informers' objects (no request): None until they have
        listed, and while claims may exist and the claim informer does not run (see
        `drivers.base.CachedLister`)."""
        parts = self._opened
        if parts.warm is not None and not parts.warm.following_claims:
            return None  # claims stopped being followed, or not yet: only a LIST says which exist
        return parts.informers.cached_views()

    async def delete(self, sandbox_id: SandboxId) -> bool:
        """Delete the SandboxClaim or the Sandbox (the Sandbox and pod go with it) with its uid as
        precondition, so an object recreated meanwhile under the same name is never deleted by
        mistake. A claim the informer holds is deleted without a LIST first."""
        resource = await self.api.sandbox_resource(self._config.namespace)
        if self.warm_allocation_on:
            try:
                cached = self._opened.informers.claim_of(sandbox_id)
                if await finding.delete_cached(self.api, kube.SANDBOX_CLAIMS, cached) or await finding.delete_found(
                    self.api, self._config.namespace, kube.SANDBOX_CLAIMS, sandbox_id
                ):
                    return True
            except kube.NotFound:
                self._extensions_gone()  # the claim collection is gone: only a Sandbox can be left
        return await finding.delete_found(self.api, self._config.namespace, resource, sandbox_id)

    # -- pause and resume (drivers.base.Suspender) ---------------------------------------------

    async def check_suspend(self) -> None:
        """See `drivers.base.Suspender.check_suspend`: the cluster's Sandbox API must have the
        operating mode."""
        suspending.check_served(await self.api.sandbox_resource(self._config.namespace))

    async def suspend(self, sandbox_id: SandboxId) -> None:
        """agent-sandbox's `Suspended` mode on the sandbox's Sandbox: one write; agent-sandbox
        deletes the pod and keeps the Sandbox, its Service and its PVCs."""
        resource, found = await self._suspendable(sandbox_id)
        if not status.is_suspended(found.sandbox):
            meta = found.sandbox["metadata"]
            await self.api.merge_patch(resource, meta["namespace"], meta["name"], suspending.mode_patch("Suspended"))
        self._progress(sandbox_id, "Suspended", f"Sandbox {found.sandbox['metadata']['name']} suspended")

    async def unsuspend(self, sandbox_id: SandboxId, activation_proof: str) -> DriverSandbox:
        """Back to `Running` with the new activation proof sealed where the pod's supervisor will
        be checked against it: on a cold Sandbox, one write of both; on a warm one, its claim's
        proof first, then the mode. The new pod is a new instance (a new uid)."""
        resource, found = await self._suspendable(sandbox_id)
        meta, sealer = found.sandbox["metadata"], self._opened.sealer
        patch = suspending.mode_patch(suspending.RUNNING)
        if found.claim is None:
            patch |= suspending.proof_patch(suspending.seal_for(sealer, found.sandbox, sandbox_id, activation_proof))
        else:
            claim_meta = found.claim["metadata"]
            sealed = suspending.seal_for(sealer, found.claim, sandbox_id, activation_proof)
            await self.api.merge_patch(
                kube.SANDBOX_CLAIMS, claim_meta["namespace"], claim_meta["name"], suspending.proof_patch(sealed)
            )
        written = await self.api.merge_patch(resource, meta["namespace"], meta["name"], patch)
        self._progress(sandbox_id, "Resumed", f"Sandbox {meta['name']} running again; a new pod starts")
        # No pod yet: agent-sandbox makes it after this write.
        return status.view(written, None) if found.claim is None else claims.view(found.claim, written, None)

    async def _suspendable(self, sandbox_id: SandboxId) -> tuple[kube.Resource, suspending.Found]:
        resource = await self.api.sandbox_resource(self._config.namespace)
        suspending.check_served(resource)
        claim = await self._find_claim(sandbox_id)
        return resource, await suspending.sandbox_of(self.api, self._config.namespace, resource, sandbox_id, claim)

    def watch(self) -> Subscription:
        """Sandbox and pod changes and pod Events as progress lines, from this call on, until the
        driver closes (`aclose()` the result to stop early)."""
        return self._hub.subscribe()

    def pools(self) -> builtins.list[PoolView]:
        """The opted-in warm pools, with the ones that can never be matched flagged."""
        parts = self._opened
        views = parts.warm.views() if parts.warm is not None else []
        return views + parts.leadership.invalid_profiles()

    # -- helpers ---------------------------------------------------------------------------

    def _identity_of(self, request: CreateRequest, ref: naming.ObjectRef) -> rendering.SandboxIdentity:
        """Who the object is for, with the activation proof sealed to it (namespace, name, id)."""
        sealed = self._opened.sealer.seal(
            request.activation_proof, namespace=ref.namespace, name=ref.name, sandbox_id=request.sandbox_id
        )
        return rendering.SandboxIdentity(
            sandbox_id=request.sandbox_id, workspace=request.workspace, name=request.name, sealed_proof=sealed
        )

    async def _find_claim(self, sandbox_id: SandboxId) -> Obj | None:
        """Our SandboxClaim carrying this id, while claims can exist."""
        if not self.warm_allocation_on:
            return None
        try:
            return await finding.find(self.api, self._config.namespace, kube.SANDBOX_CLAIMS, sandbox_id)
        except kube.NotFound:
            self._extensions_gone()  # the collection itself answered 404
            return None

    def _extensions_gone(self) -> None:
        """A call got 404 on an extension collection: the warm path turns claim allocation off."""
        if (warm := self._opened.warm) is not None:
            warm.lost()

    def _progress(self, sandbox_id: SandboxId, reason: str, message: str) -> None:
        self._hub.publish(DriverEvent(sandbox_id, progress=ProgressLine(reason, message)))
