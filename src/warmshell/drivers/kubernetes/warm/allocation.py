"""The Kubernetes driver's warm path as one component: which create goes warm, the SandboxClaim it
writes, and everything that must run for claims to work.

`WarmAllocation` is built with the driver and owns the extensions gate (`extensions`), the pool
cache (`poolcache`), the claim activation controller (`claimactivation`) and the one claim
informer, which feeds every listing and change both to the driver's `Informers` (the sandboxes'
views) and to the controller; it turns the last three on and off together as the gate finds
agent-sandbox's extension APIs served or gone. The driver hands it a create (`allocate`): the pure
decision (`core.allocation`) picks the pool, and a match writes the claim; anything else comes
back as `Cold(reason)` for the driver to create cold. Progress goes to the driver's event hub;
nothing here calls back into the driver.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
from typing import Protocol

from warmshell.core import allocation, poolshapes
from warmshell.core.config import KubernetesDriverConfig
from warmshell.core.fingerprints import SandboxShape
from warmshell.core.models import Allocation, now_us
from warmshell.core.quantities import render_cpu, render_memory
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
)
from warmshell.drivers.events import Hub
from warmshell.drivers.kubernetes import creating, kube, labels, naming, proofs, rendering, watching
from warmshell.drivers.kubernetes.objects import Obj
from warmshell.drivers.kubernetes.warm import claimactivation, claims, extensions, poolcache

__all__ = ["ClaimViews", "WarmAllocation"]

log = logging.getLogger(__name__)


class ClaimViews(claimactivation.CachedObjects, Protocol):
    """The driver's informers (`Informers`) as the claim informer feeds them, besides the claim
    controller: the sandboxes' views join each claim to its Sandbox and pod."""

    def claims_listed(self, items: list[Obj]) -> None: ...

    def claim_changed(self, kind: str, claim: Obj) -> None: ...

    def claims_stopped(self) -> None: ...


class WarmAllocation:
    """Warm pooling for one namespace: `open()`, then `start(activator)`; `aclose()` stops it all.
    `pool_cache` replaces the cache following the cluster's pools (for tests)."""

    def __init__(
        self,
        api: kube.Kube,
        config: KubernetesDriverConfig,
        sealer: proofs.ProofSealer,
        hub: Hub,
        backoff: watching.Backoff,
        informers: ClaimViews,
        *,
        gateway_id: str,
        pool_cache: poolcache.PoolCache | None = None,
    ) -> None:
        self._api = api
        self._namespace = config.namespace
        self._hub = hub
        self._backoff = backoff
        self._informers = informers
        self._gateway_id = gateway_id  # label-safe: which gateway wrote a claim (diagnostics)
        self._gate = extensions.ExtensionsGate(api, config.namespace)
        self._pools = pool_cache or poolcache.PoolCache(api, config.namespace, backoff, on_gone=self._gate.lost)
        self._claims = claimactivation.ClaimActivation(api, config.namespace, sealer, informers, hub=hub)
        self._activator: Activator = claimactivation.NOT_STARTED
        self._running = False  # the pool cache runs; with an activator, the claim informer and controller too
        self._claim_informer: asyncio.Task[None] | None = None
        self._following: asyncio.Task[None] | None = None

    # -- read-only state -------------------------------------------------------------------

    @property
    def gate(self) -> extensions.ExtensionsGate:
        """The driver's one gate on the extension APIs (shared with the profile reconciler)."""
        return self._gate

    @property
    def available(self) -> bool:
        """Whether SandboxClaims may exist now: the gate has not found the extension APIs absent
        (unknown, after a failed probe, counts as available)."""
        return self._gate.available is not False

    @property
    def running(self) -> bool:
        """Whether the pool cache runs (and, once started, the claim informer and controller)."""
        return self._running

    @property
    def started(self) -> bool:
        """Whether the gateway has handed its activator over (`start`): claims can be activated."""
        return self._activator is not claimactivation.NOT_STARTED

    @property
    def following_claims(self) -> bool:
        """Whether the claim informer runs now."""
        return self._claim_informer is not None and not self._claim_informer.done()

    @property
    def pool_cache(self) -> poolcache.PoolCache:
        """The cache of opted-in pools (empty and unsynced while off)."""
        return self._pools

    @property
    def claims(self) -> claimactivation.ClaimActivation:
        """The claim activation controller (acting once started and on)."""
        return self._claims

    # -- lifecycle -------------------------------------------------------------------------

    async def open(self) -> None:
        """Turn on now if the extension APIs are served, and follow the gate from then on."""
        try:
            if await self._gate.probe():  # absent: the gate's one warning says so
                self._on()
        except kube.Temporary as exc:
            # Not off: the gate probes again with backoff and turns it on once the API answers.
            log.warning("kubernetes driver: cannot probe the extension APIs yet (%s); retrying", exc)
        self._following = asyncio.create_task(self._follow(), name="k8s-extensions")

    def start(self, activator: Activator) -> None:
        """Activate bound claims through `activator` (now if on, else when the APIs appear)."""
        self._activator = activator
        if self._running:
            self._follow_claims()

    def lost(self) -> None:
        """A call found an extension collection gone (404): off until a probe finds them back."""
        self._gate.lost()

    async def aclose(self) -> None:
        """Stop following the gate, the claim informer and controller, and the pool cache."""
        if self._following is not None:
            self._following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._following
            self._following = None
        await self._off()

    async def _follow(self) -> None:
        """On when the APIs are served, off when a call finds them gone (404), on again when a
        probe finds them back: the gate logs each transition once."""
        while True:
            await self._gate.wait_available()
            self._on()
            await self._gate.wait_lost()
            await self._off()

    def _on(self) -> None:
        if self._running:
            return
        self._running = True
        self._pools.start()
        if self.started:
            self._follow_claims()

    async def _off(self) -> None:
        """Stop what reads the extension APIs; the informer's task is kept until it has stopped,
        so an `aclose` that interrupts this still stops it."""
        self._running = False
        if self._claim_informer is not None:
            self._claim_informer.cancel()
            await asyncio.gather(self._claim_informer, return_exceptions=True)
            self._claim_informer = None
        await self._claims.aclose()
        await self._pools.aclose()

    def _follow_claims(self) -> None:
        """Start the controller, then the claim informer that feeds it (its first listing is the
        controller's first work)."""
        self._claims.start(self._activator)
        self._claim_informer = asyncio.create_task(self._inform_claims(), name="k8s-informer:claims")

    async def _inform_claims(self) -> None:
        """The one watch on our claims: each listing and change goes to the driver's views and to
        the claim controller."""

        def listed(items: list[Obj]) -> None:
            self._informers.claims_listed(items)
            self._claims.replace(items)

        def changed(kind: str, claim: Obj) -> None:
            self._informers.claim_changed(kind, claim)
            self._claims.changed(kind, claim)

        try:
            await watching.follow(
                self._api,
                kube.SANDBOX_CLAIMS,
                self._namespace,
                label_selector=labels.claim_selector(),
                on_list=listed,
                on_event=changed,
                backoff=self._backoff,
            )
        except kube.NotFound:
            # The collection itself is gone (the extension CRDs were removed): off until a probe
            # finds them back, and the informer starts again with a fresh listing.
            self._gate.lost()
        finally:
            self._informers.claims_stopped()  # cancelled or gone: its claims are no longer current

    # -- creates ---------------------------------------------------------

    async def allocate(
        self, request: CreateRequest, shape: SandboxShape, ref: naming.ObjectRef, who: rendering.SandboxIdentity
    ) -> DriverSandbox | allocation.Cold[poolcache.CachedPool]:
        """A SandboxClaim on the one pool matching `shape`, or why the create goes cold."""
        decision = self._decide(request, shape)
        if isinstance(decision, allocation.Cold):
            return decision
        pool = decision.pool
        body = claims.render_claim(
            ref=ref, who=who, pool=pool.name, gateway_id=self._gateway_id, fingerprint=pool.fingerprint
        )
        await creating.create_settled(
            self._api, kube.SANDBOX_CLAIMS, ref, body, request.sandbox_id, is_ours=claims.is_ours
        )
        pool.stats.hits += 1
        line = ProgressLine("PoolHit", f"SandboxClaim {ref} created on warm pool {pool.name}")
        self._hub.publish(DriverEvent(request.sandbox_id, progress=line))
        # claimed_us comes later, from the claim controller, once agent-sandbox has bound the claim.
        return DriverSandbox(
            sandbox_id=request.sandbox_id,
            instance_id="",
            state=BackendState.PENDING,
            allocation=Allocation.WARM,
            pool=pool.name,
            created_us=now_us(),
            injected_environment=decision.injected,
            pool_ttl_seconds=pool.ttl_seconds,
            pool_idle_timeout_seconds=pool.idle_timeout_seconds,
        )

    def _decide(self, request: CreateRequest, shape: SandboxShape) -> allocation.Decision[poolcache.CachedPool]:
        # Before the gateway has started the driver nothing can be activated: NotReady, as on the
        # local driver.
        decision = allocation.decide(shape, self._pools, ready=self.started and self._running and self.available)
        if isinstance(decision, allocation.Cold):
            if decision.reason is MissReason.AMBIGUOUS:
                names = ", ".join(sorted(p.name for p in decision.charged))
                log.warning(
                    "create of %s/%s: pools %s share its fingerprint; going cold",
                    request.workspace,
                    request.name,
                    names,
                )
            for pool in decision.charged:
                pool.stats.misses += 1
        return decision

    def views(self) -> builtins.list[PoolView]:
        """The opted-in warm pools, with the ones that can never be matched flagged."""
        idle = self._activator.idle_members()
        entries = self._pools.entries()
        shared = poolshapes.shared_shapes((pool.name, pool.fingerprint) for pool in entries if pool.shape)
        return [self._view(pool, idle[pool.fingerprint], shared.get(pool.name, ())) for pool in entries]

    def _view(self, pool: poolcache.CachedPool, idle: int, sharing: tuple[str, ...]) -> PoolView:
        shape = pool.shape
        conditions: tuple[DriverCondition, ...] = (pool.problem,) if pool.problem else ()
        if sharing:  # every create of this shape is Ambiguous: say so where the pool is listed
            message = poolshapes.shared_shape_message(sharing, pool.fingerprint)
            conditions += (DriverCondition(poolshapes.CONDITION_TYPE, "False", poolshapes.REASON, message),)
        return PoolView(
            name=pool.name,
            workspace=pool.workspace,
            fingerprint=pool.fingerprint,
            image=shape.image if shape else "",
            environment=dict(shape.environment) if shape else {},
            cpu=render_cpu(shape.cpu_millis) if shape else "",
            memory=render_memory(shape.memory_bytes) if shape else "",
            desired=pool.desired,
            ready=pool.ready,
            # Members registered with this gateway and not activated yet; one that registered but
            # lost its readiness is still counted until its stream ends, so the pool's own ready
            # count bounds it.
            idle=min(idle, pool.ready),
            hits=pool.stats.hits,
            misses=pool.stats.misses,
            source=f"SandboxWarmPool {self._namespace}/{pool.name}",
            conditions=conditions,
            accepted_environment=shape.accepted if shape else (),
            ttl_seconds=pool.ttl_seconds,
            idle_timeout_seconds=pool.idle_timeout_seconds,
            network_allow=pool.network.allow,
            network_deny=pool.network.deny,
            secret_hosts=pool.network.secret_hosts,
        )
