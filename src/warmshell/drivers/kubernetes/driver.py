"""The Kubernetes compute driver: each sandbox is an agent-sandbox `Sandbox` (one pod), created
directly (cold) or bound from a warm pool through a `SandboxClaim` (warm).

A create is fingerprinted and looked up in the pool cache (`poolcache`); exactly one match writes
a SandboxClaim naming that pool (`claims`), and the claim activation controller (`claimactivation`)
activates the warm pod agent-sandbox binds to it. Anything else goes cold: a cold create renders
the Sandbox (`rendering`), seals the activation proof onto it (`proofs`) and creates it — one API
write. agent-sandbox makes the pod; its supervisor registers with the pod's projected token and
`identity` binds it to the sandbox. Reads go to the API (`get`, `list`);
`watch` is fed by `informers` over our Sandboxes, their pods and the namespace's Events, started
by the first watcher and shared by all.

The pool cache, the claim controller and the claim informer need agent-sandbox's extension CRDs:
they run while the driver's one `extensions.ExtensionsGate` (shared with the profile reconciler)
finds them served, and stop and start again as the CRDs go and come — meanwhile creates go cold.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import dataclasses
import logging
import re
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from warmshell.core import matching, poolshapes
from warmshell.core.config import KubernetesDriverConfig, StatePaths
from warmshell.core.errors import AlreadyExistsError, FailedPreconditionError, InvalidArgumentError, UnavailableError
from warmshell.core.fingerprints import fingerprint, shape_of
from warmshell.core.ids import InstanceId, SandboxId
from warmshell.core.models import Allocation, SandboxSpec, now_us
from warmshell.drivers.base import (
    Activator,
    BackendState,
    CreateRequest,
    DriverCondition,
    DriverEvent,
    DriverSandbox,
    MissReason,
    PoolView,
    ProgressLine,
    WarmPending,
    invalid_profile_view,
)
from warmshell.drivers.events import Hub, Subscription
from warmshell.drivers.kubernetes import (
    claimactivation,
    claims,
    extensions,
    kube,
    labels,
    naming,
    poolcache,
    profiles,
    proofs,
    rendering,
    status,
    watching,
)
from warmshell.drivers.kubernetes.identity import KubernetesIdentity
from warmshell.drivers.kubernetes.informers import Informers

__all__ = ["KubernetesDriver"]

log = logging.getLogger(__name__)

Obj = dict[str, Any]
# Creates after an ambiguous failure: each is preceded by a read proving the object is absent.
CREATE_ATTEMPTS = 3
DELETE_ATTEMPTS = 3


class KubernetesDriver:
    """A `ComputeDriver` creating agent-sandbox Sandboxes in one namespace (shared mode)."""

    name = "kubernetes"

    def __init__(
        self,
        config: KubernetesDriverConfig,
        paths: StatePaths,
        *,
        api: kube.Kube | None = None,
        watch_backoff: watching.Backoff | None = None,
        gateway_id: str = "",
    ) -> None:
        if not config.gateway_address:
            raise FailedPreconditionError(
                "kubernetes.gateway_address is not set: the gateway's supervisor API as pods reach it"
            )
        self._config = config
        self._key_path = Path(config.proof_key_file) if config.proof_key_file else paths.root / "kubernetes-proof.key"
        self._api = api
        self._owns_api = api is None
        self._backoff = watch_backoff or watching.Backoff()
        self._identity: KubernetesIdentity | None = None
        self._activator: Activator | None = None
        self._sealer: proofs.ProofSealer | None = None
        self._hub = Hub()
        self._informers: Informers | None = None  # started by the first watch()
        self._profiles: asyncio.Task[None] | None = None  # the profile reconciler (lease-elected)
        self._profile_problems: dict[str, str] = {}  # invalid profile ConfigMaps, while leading
        # Label-safe: which gateway wrote a claim (diagnostics; any replica may activate it).
        self._gateway_id = _label_value(gateway_id or socket.gethostname())
        # Warm pooling as configured; on while the gate says the extension APIs are served.
        self._gate: extensions.ExtensionsGate | None = None
        self._allocating = False  # the pool cache, claim controller and claim informer are running
        self._following: asyncio.Task[None] | None = None  # turns them on and off with the gate
        self._pools: poolcache.PoolCache | None = None
        self._claims: claimactivation.ClaimActivation | None = None
        self._idle: dict[InstanceId, str] = {}  # warm-pending pods registered here -> fingerprint

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
        self._sealer = proofs.ProofSealer(key)
        if self._api is None:
            self._api = await kube.Kube.connect(self._config)
        self._identity = KubernetesIdentity(
            self._api, self._config, self._sealer, on_registered=self._registered, on_warm=self._warm_registered
        )
        try:
            await self._api.sandbox_resource(self._config.namespace)
        except kube.Temporary as exc:
            # Not fatal: the probe runs again on first use.
            log.warning("kubernetes driver: cannot reach the API yet (%s)", exc)
        if self._config.warm_pooling.enabled:
            await self._enter_warm(self._api)

    async def _enter_warm(self, api: kube.Kube) -> None:
        """Claim allocation needs the agent-sandbox extension CRDs: it starts now if they are
        served, and follows the gate from then on (`_follow_extensions`)."""
        self._gate = gate = extensions.ExtensionsGate(api, self._config.namespace)
        self._pools = poolcache.PoolCache(api, self._config.namespace, self._backoff, on_gone=gate.lost)
        try:
            if await gate.probe():  # absent: the gate's one warning says so
                self._allocation_on()
        except kube.Temporary as exc:
            # Not off: the gate probes again with backoff and turns it on once the API answers.
            log.warning("kubernetes driver: cannot probe the extension APIs yet (%s); retrying", exc)
        self._following = asyncio.create_task(self._follow_extensions(gate), name="k8s-extensions")

    async def _follow_extensions(self, gate: extensions.ExtensionsGate) -> None:
        """On when the APIs are served, off when a call finds them gone (404), on again when a
        probe finds them back: the gate logs each transition once."""
        while True:
            await gate.wait_available()
            self._allocation_on()
            await gate.wait_lost()
            await self._allocation_off()

    def _allocation_on(self) -> None:
        if self._allocating:
            return
        self._allocating = True
        assert self._pools is not None
        self._pools.start()
        if self._activator is not None:
            self._start_claims(self._activator)
        if self._informers is not None:
            self._informers.follow_claims()

    async def _allocation_off(self) -> None:
        """Stop what reads the extension APIs; each keeps its reference until it has stopped, so
        an `aclose` that interrupts this still stops it."""
        self._allocating = False
        if self._claims is not None:
            await self._claims.aclose()
            self._claims = None
        if self._pools is not None:
            await self._pools.aclose()
        if self._informers is not None:
            await self._informers.unfollow_claims()

    def _start_claims(self, activator: Activator) -> None:
        assert self._api is not None
        assert self._sealer is not None
        self._claims = claimactivation.ClaimActivation(
            self._api,
            self._config.namespace,
            self._sealer,
            activator,
            self._backoff,
            on_bound=self._claim_bound,
            on_activated=self._claim_activated,
            on_gone=self._extensions_gone,
        )
        self._claims.start()

    def _extensions_gone(self) -> None:
        """A call got 404 on an extension collection: the gate turns claim allocation off."""
        if self._gate is not None:
            self._gate.lost()

    @property
    def warm_allocation_on(self) -> bool:
        """Whether SandboxClaims may exist for us now: warm pooling is configured and the gate has
        not found the extension APIs absent (unknown, after a failed probe, counts as on)."""
        return self._gate is not None and self._gate.available is not False

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def start(self, activator: Activator) -> None:
        """Cold sandboxes are activated by registration alone; warm ones by the claim controller."""
        self._activator = activator
        if self._allocating and self._claims is None:
            self._start_claims(activator)  # otherwise the gate starts it when the APIs appear
        if self._gate is not None and self._config.warm_pooling.profiles.enabled and self._profiles is None:
            # Profiles run even while the extension APIs are absent: they wait on the same gate.
            self._profiles = asyncio.create_task(
                profiles.run_elected(self.api, self._config, gate=self._gate, on_problems=self._set_profile_problems),
                name="k8s-profiles",
            )

    def _set_profile_problems(self, problems: dict[str, str]) -> None:
        self._profile_problems = problems

    async def aclose(self) -> None:
        """Stop the informers and end watches; sandboxes keep running in the cluster."""
        await _cancel(self._following)
        self._following = None
        await _cancel(self._profiles)  # which releases the Lease: another replica takes over at once
        self._profiles = None
        if self._claims is not None:
            await self._claims.aclose()
            self._claims = None
        if self._pools is not None:
            await self._pools.aclose()
            self._pools = None
        if self._informers is not None:
            await self._informers.aclose()
            self._informers = None
        self._hub.close()
        if self._owns_api and self._api is not None:
            await self._api.aclose()
            self._api = None

    @property
    def identity(self) -> KubernetesIdentity:
        """Verifies the projected tokens of sandbox pods."""
        if self._identity is None:
            raise FailedPreconditionError("the kubernetes driver is not started (use `async with`)")
        return self._identity

    @property
    def api(self) -> kube.Kube:
        """The API adapter (after `__aenter__`)."""
        if self._api is None:
            raise FailedPreconditionError("the kubernetes driver is not started (use `async with`)")
        return self._api

    # -- the ComputeDriver surface ---------------------------------------------------------

    def default_image(self) -> str:
        """The configured supervisor image."""
        return self._config.image

    def validate(self, workspace: str, spec: SandboxSpec) -> None:
        """An image is a container image reference that ships `warmshell` (see the README)."""
        if spec.image and any(c.isspace() for c in spec.image):
            raise InvalidArgumentError("spec.image", f"{spec.image!r} is not a container image reference")

    async def create(self, request: CreateRequest) -> DriverSandbox:
        """A SandboxClaim when exactly one warm pool matches, else a cold Sandbox. Either is
        idempotent by name; an ambiguous failure is settled by reading back, never by writing
        blindly again (and never by falling back to the other path); UnavailableError when it
        cannot be settled."""
        ref = naming.object_ref(self._config, request.workspace, request.name)
        self.validate(request.workspace, request.spec)
        found = self._lookup(request)
        if isinstance(found, poolcache.CachedPool):
            return await self._create_claim(request, ref, found)
        return await self._create_cold(request, ref, found)

    def _lookup(self, request: CreateRequest) -> poolcache.CachedPool | MissReason:
        if self._pools is None or self._activator is None:
            return MissReason.DISABLED
        if not self._allocating or not self.warm_allocation_on:
            return MissReason.NOT_READY  # no pools can be known while the extension APIs are absent
        shape = shape_of(request.workspace, request.spec, default_image=self.default_image())
        result = self._pools.lookup(fingerprint(shape))
        if isinstance(result, matching.Match):
            return result.pool
        if isinstance(result, matching.Ambiguous):
            names = ", ".join(sorted(p.name for p in result.pools))
            log.warning(
                "create of %s/%s: pools %s share its fingerprint; going cold", request.workspace, request.name, names
            )
            for pool in result.pools:
                pool.stats.misses += 1
            return MissReason.AMBIGUOUS
        return MissReason.NOT_READY if isinstance(result, matching.NotReady) else MissReason.NO_MATCH

    async def _create_claim(
        self, request: CreateRequest, ref: naming.ObjectRef, pool: poolcache.CachedPool
    ) -> DriverSandbox:
        body = claims.render_claim(
            ref=ref,
            who=self._identity_of(request, ref),
            pool=pool.name,
            gateway_id=self._gateway_id,
            fingerprint=pool.fingerprint,
        )
        await self._create_settled(kube.SANDBOX_CLAIMS, ref, body, request.sandbox_id, is_ours=claims.is_ours)
        pool.stats.hits += 1
        self._progress(request.sandbox_id, "PoolHit", f"SandboxClaim {ref} created on warm pool {pool.name}")
        # claimed_us comes later, from the claim controller, once agent-sandbox has bound the claim.
        return DriverSandbox(
            sandbox_id=request.sandbox_id,
            instance_id="",
            state=BackendState.PENDING,
            allocation=Allocation.WARM,
            pool=pool.name,
            created_us=now_us(),
        )

    async def _create_cold(self, request: CreateRequest, ref: naming.ObjectRef, reason: MissReason) -> DriverSandbox:
        resource = await self.api.sandbox_resource(ref.namespace)
        body = rendering.render_sandbox(
            self._config,
            api_version=resource.api_version,
            ref=ref,
            who=self._identity_of(request, ref),
            spec=request.spec,
        )
        created = await self._create_settled(resource, ref, body, request.sandbox_id, is_ours=status.is_managed)
        self._progress(request.sandbox_id, "Created", f"Sandbox {ref} created (cold: {reason.value})")
        return dataclasses.replace(status.view(created, None), created_us=now_us(), miss_reason=reason.value)

    async def get(self, sandbox_id: SandboxId) -> DriverSandbox | None:
        """The Sandbox (or the SandboxClaim) carrying this id and its pod, read from the API now."""
        resource = await self.api.sandbox_resource(self._config.namespace)
        found = await self._find(resource, sandbox_id)
        if found is not None:
            return status.view(found, await self._pod_of(found))
        claim = await self._find_claim(sandbox_id)
        if claim is None:
            return None
        sandbox: Obj | None = None
        pod: Obj | None = None
        if bound := claims.bound_sandbox_name(claim):
            try:
                sandbox = await self.api.get(resource, self._config.namespace, bound)
            except kube.NotFound:
                sandbox = None
            pod = await self._pod_of(sandbox) if sandbox is not None else None
        return claims.view(claim, sandbox, pod)

    async def list(self) -> list[DriverSandbox]:
        """Every Sandbox and SandboxClaim with our labels (others are ignored), with its pod."""
        namespace = self._config.namespace
        resource = await self.api.sandbox_resource(namespace)
        selector = labels.managed_selector()
        warm = self.warm_allocation_on
        if warm:
            # Adopted pool members carry no sandbox id of ours: read every Sandbox and every pod of
            # ours, and join them to the claims.
            selector = f"{labels.MANAGED_BY}={labels.MANAGED_BY_VALUE}"
        sandboxes = await self.api.list(resource, namespace, label_selector="" if warm else selector)
        pods = await self.api.list(kube.PODS, namespace, label_selector=selector)
        pods_by_name = {p["metadata"]["name"]: p for p in pods.get("items") or []}
        sandboxes_by_name = {s["metadata"]["name"]: s for s in sandboxes.get("items") or []}

        def pod_of(sandbox: Obj) -> Obj | None:
            return status.own_pod(sandbox, pods_by_name.get(status.owned_pod_name(sandbox)))

        views = [status.view(s, pod_of(s)) for s in sandboxes_by_name.values() if status.is_managed(s)]
        if warm:
            try:
                listed = await self.api.list(kube.SANDBOX_CLAIMS, namespace, label_selector=labels.claim_selector())
            except kube.NotFound:
                self._extensions_gone()  # the collection is gone, and every claim with it
                listed = {}
            for claim in listed.get("items") or []:
                if not claims.is_ours(claim):
                    continue
                sandbox = sandboxes_by_name.get(claims.bound_sandbox_name(claim))
                views.append(claims.view(claim, sandbox, pod_of(sandbox) if sandbox is not None else None))
        return views

    async def delete(self, sandbox_id: SandboxId) -> bool:
        """Delete the SandboxClaim or the Sandbox (the Sandbox and pod go with it) with its uid as
        precondition, so an object recreated meanwhile under the same name is never deleted by
        mistake."""
        resource = await self.api.sandbox_resource(self._config.namespace)
        if self.warm_allocation_on:
            try:
                if await self._delete_found(kube.SANDBOX_CLAIMS, sandbox_id):
                    return True
            except kube.NotFound:
                self._extensions_gone()  # the claim collection is gone: only a Sandbox can be left
        return await self._delete_found(resource, sandbox_id)

    async def _delete_found(self, resource: kube.Resource, sandbox_id: SandboxId) -> bool:
        for _ in range(DELETE_ATTEMPTS):
            found = await self._find(resource, sandbox_id)
            if found is None:
                return False
            meta = found["metadata"]
            try:
                await self.api.delete(resource, meta["namespace"], meta["name"], uid=meta["uid"])
            except kube.NotFound:
                return False
            except kube.Conflict:
                continue  # replaced between the read and the delete: look again
            return True
        raise UnavailableError(f"{resource.kind} of {sandbox_id} kept changing; delete not confirmed")

    def watch(self) -> Subscription:
        """Sandbox and pod changes and pod Events as progress lines, from this call on, until the
        driver closes (`aclose()` the result to stop early)."""
        if self._informers is None:
            self._informers = Informers(
                self.api,
                self._config.namespace,
                self._hub,
                self._backoff,
                with_claims=self._gate is not None,
                on_claims_gone=self._extensions_gone,
            )
            self._informers.start()
            if self._allocating:
                self._informers.follow_claims()  # otherwise the gate adds it when the APIs appear
        return self._hub.subscribe()

    def pools(self) -> builtins.list[PoolView]:
        """The opted-in warm pools, with the ones that can never be matched flagged."""
        if self._pools is None:
            return []
        idle: dict[str, int] = {}
        for fp in self._idle.values():
            idle[fp] = idle.get(fp, 0) + 1
        views = []
        entries = self._pools.entries()
        shared = poolshapes.shared_shapes((pool.name, pool.fingerprint) for pool in entries if pool.shape)
        for pool in entries:
            shape = pool.shape
            conditions: tuple[DriverCondition, ...] = (pool.problem,) if pool.problem else ()
            if pool.name in shared:
                message = poolshapes.shared_shape_message(shared[pool.name], pool.fingerprint)
                conditions += (DriverCondition(poolshapes.CONDITION_TYPE, "False", poolshapes.REASON, message),)
            views.append(
                PoolView(
                    name=pool.name,
                    workspace=pool.workspace,
                    fingerprint=pool.fingerprint,
                    image=shape.image if shape else "",
                    environment=dict(shape.environment) if shape else {},
                    cpu=shape.cpu if shape else "",
                    memory=shape.memory if shape else "",
                    desired=pool.desired,
                    ready=pool.ready,
                    # Registrations this gateway saw minus activations; a member deleted unclaimed
                    # stays counted, so the pool's own ready count bounds it.
                    idle=min(idle.get(pool.fingerprint, 0), pool.ready),
                    hits=pool.stats.hits,
                    misses=pool.stats.misses,
                    source=f"SandboxWarmPool {self._config.namespace}/{pool.name}",
                    conditions=conditions,
                )
            )
        # Invalid profiles have no pool: listed by their ConfigMap (known on the profile leader).
        for name, error in sorted(self._profile_problems.items()):
            views.append(invalid_profile_view(name, source=f"configmap {self._config.namespace}/{name}", message=error))
        return views

    # -- create helpers --------------------------------------------------------------------

    def _identity_of(self, request: CreateRequest, ref: naming.ObjectRef) -> rendering.SandboxIdentity:
        """Who the object is for, with the activation proof sealed to it (namespace, name, id)."""
        assert self._sealer is not None
        sealed = self._sealer.seal(
            request.activation_proof, namespace=ref.namespace, name=ref.name, sandbox_id=request.sandbox_id
        )
        return rendering.SandboxIdentity(
            sandbox_id=request.sandbox_id, workspace=request.workspace, name=request.name, sealed_proof=sealed
        )

    async def _create_settled(
        self,
        resource: kube.Resource,
        ref: naming.ObjectRef,
        body: Obj,
        sandbox_id: SandboxId,
        *,
        is_ours: Callable[[Obj], bool],
    ) -> Obj:
        last: Exception | None = None
        for attempt in range(1, CREATE_ATTEMPTS + 1):
            try:
                return await self.api.create(resource, ref.namespace, body)
            except kube.AlreadyExists:
                pass  # the name is taken, perhaps by our own earlier attempt: read it
            except (kube.Temporary, kube.Conflict) as exc:
                last = exc
                log.warning(
                    "create of %s %s: %s; reading back (attempt %d/%d)",
                    resource.kind,
                    ref,
                    exc,
                    attempt,
                    CREATE_ATTEMPTS,
                )
            try:
                return self._ours(await self.api.get(resource, ref.namespace, ref.name), ref, sandbox_id, is_ours)
            except kube.NotFound:
                continue  # provably absent: creating again cannot make a second one
            except kube.Temporary as exc:
                raise UnavailableError(
                    f"creating {resource.kind} {ref}: outcome unknown ({last}; read back: {exc})"
                ) from exc
        raise UnavailableError(
            f"creating {resource.kind} {ref}: outcome unknown after {CREATE_ATTEMPTS} attempts ({last})"
        )

    @staticmethod
    def _ours(existing: Obj, ref: naming.ObjectRef, sandbox_id: SandboxId, is_ours: Callable[[Obj], bool]) -> Obj:
        if status.sandbox_id_of(existing) != sandbox_id or not is_ours(existing):
            kind = existing.get("kind") or "object"
            raise AlreadyExistsError(f"Kubernetes {kind} {ref} already exists and belongs to another sandbox")
        return existing

    async def _find(self, resource: kube.Resource, sandbox_id: SandboxId) -> Obj | None:
        """The oldest object of `resource` carrying this sandbox id."""
        # Lookups by id go through the label, never the name alone.
        selector = labels.sandbox_selector(sandbox_id)
        found = await self.api.list(resource, self._config.namespace, label_selector=selector)
        items = [s for s in found.get("items") or [] if status.sandbox_id_of(s) == sandbox_id]
        if len(items) > 1:
            log.warning("%d Sandboxes carry sandbox id %s; using the oldest", len(items), sandbox_id)
            items.sort(key=lambda s: s["metadata"].get("creationTimestamp") or "")
        return items[0] if items else None

    async def _find_claim(self, sandbox_id: SandboxId) -> Obj | None:
        """Our SandboxClaim carrying this id, while claims can exist."""
        if not self.warm_allocation_on:
            return None
        try:
            return await self._find(kube.SANDBOX_CLAIMS, sandbox_id)
        except kube.NotFound:
            self._extensions_gone()  # the collection itself answered 404
            return None

    async def _pod_of(self, sandbox: Obj) -> Obj | None:
        try:
            pod = await self.api.get(kube.PODS, sandbox["metadata"]["namespace"], status.owned_pod_name(sandbox))
        except kube.NotFound:
            return None
        return status.own_pod(sandbox, pod)

    # -- progress --------------------------------------------------------------------------

    def _warm_registered(self, instance_id: InstanceId, binding: WarmPending) -> None:
        self._idle[instance_id] = binding.pool

    def _claim_bound(self, sandbox_id: SandboxId) -> None:
        self._progress(sandbox_id, "Claimed", "agent-sandbox bound the SandboxClaim to a warm Sandbox")

    def _claim_activated(self, sandbox_id: SandboxId, instance_id: InstanceId) -> None:
        self._idle.pop(instance_id, None)

    def _registered(self, sandbox_id: SandboxId, pod_name: str) -> None:
        self._progress(sandbox_id, "Registered", f"the supervisor in pod {pod_name} registered")

    def _progress(self, sandbox_id: SandboxId, reason: str, message: str) -> None:
        self._hub.publish(DriverEvent(sandbox_id, progress=ProgressLine(reason, message)))


async def _cancel(task: asyncio.Task[None] | None) -> None:
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _label_value(text: str) -> str:
    """`text` as a valid label value: allowed characters only, at most 63, alphanumeric ends."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", text)[:63].strip("._-") or "gateway"
