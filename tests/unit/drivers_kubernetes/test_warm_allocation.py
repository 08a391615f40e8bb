"""The warm path's public surface: `allocate` decides and writes the claim, progress reaches the
driver's hub (a pool hit from the create, "Claimed" from the claim controller), and the idle count
follows registrations and activations, bounded by the pool's ready count."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from warmshell.core.allocation import Cold, MissReason
from warmshell.core.config import StatePaths
from warmshell.core.errors import NotFoundError
from warmshell.core.fingerprints import shape_of
from warmshell.core.ids import Fingerprint, InstanceId, SandboxId
from warmshell.drivers.base import DriverSandbox, WarmPending
from warmshell.drivers.events import Hub
from warmshell.drivers.kubernetes import KubernetesDriver, claimactivation, naming, poolcache, watching
from warmshell.drivers.kubernetes.proofs import ProofSealer
from warmshell.drivers.kubernetes.rendering import SandboxIdentity
from warmshell.drivers.kubernetes.warm import WarmAllocation

from .fakes import KEY, NS, config
from .test_claim_create import IMAGE, REQUEST, Api, NoActivator, Pools, pool
from .test_warm_identity import WarmCluster

SHAPE = shape_of(REQUEST.workspace, REQUEST.spec, default_image=IMAGE)
REF = naming.object_ref(config(), REQUEST.workspace, REQUEST.name)
WHO = SandboxIdentity(sandbox_id=REQUEST.sandbox_id, workspace="default", name="one", sealed_proof="sealed")


async def opened(api: Api, pools: Pools, hub: Hub) -> WarmAllocation:
    warm = WarmAllocation(
        api,  # type: ignore[arg-type]
        config(),
        ProofSealer(KEY),
        hub,
        watching.Backoff(),
        gateway_id="gw-test",
        pool_cache=pools,  # type: ignore[arg-type]
    )
    await warm.open()
    return warm


async def test_a_match_writes_the_claim_and_publishes_the_pool_hit() -> None:
    hub = Hub()
    events = hub.subscribe()
    warm = await opened(Api(["store"]), Pools(pool()), hub)
    try:
        warm.start(NoActivator())
        assert warm.running
        assert warm.available
        allocated = await warm.allocate(REQUEST, SHAPE, REF, WHO)
        assert isinstance(allocated, DriverSandbox)
        assert allocated.pool == "foo"
        event = await anext(events)
        assert event.sandbox_id == REQUEST.sandbox_id
        assert event.progress is not None
        assert event.progress.reason == "PoolHit"
        assert [(p.name, p.hits, p.misses) for p in warm.views()] == [("foo", 1, 0)]
    finally:
        await warm.aclose()
        await events.aclose()
    assert not warm.running
    assert warm.claims is None


async def test_before_start_the_warm_path_says_disabled_and_writes_nothing() -> None:
    api = Api([])
    warm = await opened(api, Pools(pool()), Hub())
    try:
        assert await warm.allocate(REQUEST, SHAPE, REF, WHO) == Cold(MissReason.DISABLED)
        assert api.calls == []
    finally:
        await warm.aclose()


async def test_an_ambiguous_match_charges_both_pools_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    warm = await opened(Api([]), Pools(pool("one"), pool("two")), Hub())
    try:
        warm.start(NoActivator())
        with caplog.at_level(logging.WARNING):
            decision = await warm.allocate(REQUEST, SHAPE, REF, WHO)
        assert isinstance(decision, Cold)
        assert decision.reason == MissReason.AMBIGUOUS
        assert sorted((p.name, p.misses) for p in warm.views()) == [("one", 1), ("two", 1)]
        assert any("one, two share its fingerprint" in r.getMessage() for r in caplog.records)
    finally:
        await warm.aclose()


async def test_idle_counts_registrations_up_to_the_pools_ready_count() -> None:
    warm = await opened(Api([]), Pools(pool()), Hub())  # the pool says 2 ready
    try:
        fp = pool().fingerprint
        for uid in ("a", "b", "c"):
            warm.registered(InstanceId(uid), WarmPending(pool=fp))
        warm.registered(InstanceId("other"), WarmPending(pool=Fingerprint("f" * 64)))
        assert [p.idle for p in warm.views()] == [2]
    finally:
        await warm.aclose()


def test_idle_members_are_counted_by_pool_until_activated() -> None:
    idle = poolcache.IdleMembers()
    a, b = Fingerprint("a" * 64), Fingerprint("b" * 64)
    idle.registered(InstanceId("p1"), a)
    idle.registered(InstanceId("p2"), a)
    idle.registered(InstanceId("p3"), b)
    idle.registered(InstanceId("p1"), a)  # the same pod registering again counts once
    idle.activated(InstanceId("p2"))
    idle.activated(InstanceId("never-registered"))
    assert idle.counts() == {a: 1, b: 1}


async def test_an_activated_claim_publishes_claimed_and_leaves_the_idle_count() -> None:
    cluster = WarmCluster()
    sandbox, pod = cluster.member(cluster.pool())
    claim = cluster.claim(proof="p")
    cluster.adopt(sandbox, claim)
    pod_uid = InstanceId(pod["metadata"]["uid"])
    activated: list[dict[str, Any]] = []

    class Activator:
        async def activate(self, **kwargs: Any) -> None:
            activated.append(kwargs)

        async def wait_registrations_changed(self, generation: int) -> int:
            await asyncio.Event().wait()
            return generation

    hub, idle = Hub(), poolcache.IdleMembers()
    events = hub.subscribe()
    idle.registered(pod_uid, pool().fingerprint)
    controller = claimactivation.ClaimActivation(
        cluster,  # type: ignore[arg-type]
        NS,
        ProofSealer(KEY),
        Activator(),
        watching.Backoff(),
        hub=hub,
        idle=idle,
    )
    controller.replace([claim])
    await controller.wait_in_flight()
    assert [(a["instance_id"], a["sandbox_id"], a["proof"]) for a in activated] == [(pod_uid, "sbx-1", "p")]
    assert activated[0]["claimed_us"] > 0
    event = await anext(events)
    assert (event.sandbox_id, event.progress and event.progress.reason) == (SandboxId("sbx-1"), "Claimed")
    assert idle.counts() == {}
    controller.replace([claim])  # seen again on a relist: done, nothing published or activated
    await controller.wait_in_flight()
    assert len(activated) == 1
    await controller.aclose()
    await events.aclose()


async def test_the_driver_exposes_its_warm_path_read_only(tmp_path: Path) -> None:
    driver = KubernetesDriver(config(), StatePaths(tmp_path), api=Api([]), pool_cache=Pools(pool()))  # type: ignore[arg-type]
    async with driver:
        warm = driver.warm_allocation
        assert warm is not None
        assert warm.pool_cache is not None
        assert warm.claims is None  # no activator yet
        await driver.start(NoActivator())
        assert warm.claims is not None
        assert driver.informers is None  # started by the first watch
        subscription = driver.watch()
        assert driver.informers is not None
        await subscription.aclose()
    unconfigured = KubernetesDriver(
        config(warm_pooling={"enabled": False}),
        StatePaths(tmp_path),
        api=Api([]),  # type: ignore[arg-type]
    )
    async with unconfigured:
        assert unconfigured.warm_allocation is None
        assert unconfigured.pools() == []


async def test_a_parked_claim_keeps_the_moment_it_was_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """The supervisor has not registered (here) when the claim is seen bound: the claim is parked
    at once with the moment it was resolved, and activated on the next registration change with
    that claimed time, without resolving (or saying "Claimed") again."""
    monkeypatch.setattr(claimactivation, "RETRY_DELAYS", (0.001,))

    class Listing(WarmCluster):
        async def list(self, resource: Any, namespace: str, **_: Any) -> dict[str, Any]:
            items = [o for (plural, _ns, _name), o in self.objects.items() if plural == resource.plural]
            return {"metadata": {"resourceVersion": "1"}, "items": items}

        async def watch(self, *_: Any, **__: Any) -> Any:
            await asyncio.Event().wait()
            yield {}

    cluster = Listing()
    sandbox, _pod = cluster.member(cluster.pool())
    cluster.adopt(sandbox, cluster.claim(proof="p"))
    attempts: list[int] = []
    registered = asyncio.Event()

    class Activator:
        async def activate(self, **kwargs: Any) -> None:
            attempts.append(kwargs["claimed_us"])
            if not registered.is_set():
                if len(attempts) == 1:  # not registered here: parked now
                    registered.set()
                raise NotFoundError("not registered yet")

        async def wait_registrations_changed(self, generation: int) -> int:
            if generation == 0:
                await registered.wait()
                return 1
            await asyncio.Event().wait()
            return generation

    hub = Hub()
    events = hub.subscribe()
    controller = claimactivation.ClaimActivation(
        cluster,  # type: ignore[arg-type]
        NS,
        ProofSealer(KEY),
        Activator(),
        watching.Backoff(),
        hub=hub,
    )
    controller.start()
    try:
        async with asyncio.timeout(5):
            while len(attempts) < 2:
                await asyncio.sleep(0.01)
        await controller.wait_in_flight()
    finally:
        await controller.aclose()
    assert len(attempts) == 2
    assert attempts[0] > 0
    assert attempts[1] == attempts[0]  # the parked retry reports the stamp it was parked with
    claimed = [e async for e in _until_closed(hub, events) if e.progress is not None]
    assert [e.progress.reason for e in claimed if e.progress] == ["Claimed"]  # one resolution


async def _until_closed(hub: Hub, events: Any) -> Any:
    hub.close()
    async for event in events:
        yield event
