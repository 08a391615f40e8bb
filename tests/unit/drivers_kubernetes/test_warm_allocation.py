"""The warm path's public surface: `allocate` decides and writes the claim, progress reaches the
driver's hub (a pool hit from the create, "Claimed" from the claim controller), and the idle count
is the gateway's registrations of pool members, bounded by the pool's ready count."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from warmshell.core.allocation import Cold, MissReason
from warmshell.core.config import StatePaths
from warmshell.core.errors import NotFoundError
from warmshell.core.fingerprints import shape_of
from warmshell.core.ids import Fingerprint, InstanceId, SandboxId
from warmshell.drivers.base import DriverSandbox
from warmshell.drivers.events import Hub
from warmshell.drivers.kubernetes import KubernetesDriver, naming, watching
from warmshell.drivers.kubernetes.informers import Informers, changed_since
from warmshell.drivers.kubernetes.proofs import ProofSealer
from warmshell.drivers.kubernetes.rendering import SandboxIdentity
from warmshell.drivers.kubernetes.warm import claimactivation
from warmshell.drivers.kubernetes.warm.allocation import WarmAllocation

from .fakes import KEY, NS, claim_controller, config
from .test_claim_create import IMAGE, REQUEST, Api, NoActivator, Pools, pool
from .test_warm_identity import WarmCluster

SHAPE = shape_of(REQUEST.workspace, REQUEST.spec, default_image=IMAGE)
REF = naming.object_ref(config(), REQUEST.workspace, REQUEST.name)
WHO = SandboxIdentity(sandbox_id=REQUEST.sandbox_id, workspace="default", name="one", sealed_proof="sealed")


async def opened(api: Api, pools: Pools, hub: Hub) -> WarmAllocation:
    backoff = watching.Backoff()
    warm = WarmAllocation(
        api,  # type: ignore[arg-type]
        config(),
        ProofSealer(KEY),
        hub,
        backoff,
        Informers(api, NS, hub, backoff, with_claims=True),  # type: ignore[arg-type]
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
    assert not warm.following_claims


async def test_before_start_the_warm_path_says_not_ready_and_writes_nothing() -> None:
    """As the local driver says before the gateway has started it: nothing can be activated yet."""
    api = Api([])
    warm = await opened(api, Pools(pool()), Hub())
    try:
        assert await warm.allocate(REQUEST, SHAPE, REF, WHO) == Cold(MissReason.NOT_READY)
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


class Idle(NoActivator):
    """An activator holding registrations of pool members, counted by fingerprint."""

    def __init__(self, counts: dict[Fingerprint, int]) -> None:
        self.counts = counts

    def idle_members(self) -> Counter[Fingerprint]:
        return Counter(self.counts)


async def test_idle_counts_registrations_up_to_the_pools_ready_count() -> None:
    """The idle count is the gateway's: registrations of the pool's members waiting there for a
    create, bounded by the pool's own ready count; before start there is none."""
    warm = await opened(Api([]), Pools(pool()), Hub())  # the pool says 2 ready
    try:
        assert [p.idle for p in warm.views()] == [0]
        fp = pool().fingerprint
        activator = Idle({fp: 3, Fingerprint("f" * 64): 1})
        warm.start(activator)
        assert [p.idle for p in warm.views()] == [2]
        activator.counts[fp] = 1  # one activated, or its stream ended
        assert [p.idle for p in warm.views()] == [1]
    finally:
        await warm.aclose()


async def test_an_activated_claim_publishes_claimed_once() -> None:
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

        def holds(self, instance_id: InstanceId) -> bool:
            return False

    hub = Hub()
    events = hub.subscribe()
    controller = claim_controller(cluster, Activator(), hub=hub)
    controller.replace([claim])
    await controller.wait_in_flight()
    assert [(a["instance_id"], a["sandbox_id"], a["proof"]) for a in activated] == [(pod_uid, "sbx-1", "p")]
    assert activated[0]["claimed_us"] > 0
    event = await anext(events)
    assert (event.sandbox_id, event.progress and event.progress.reason) == (SandboxId("sbx-1"), "Claimed")
    controller.replace([claim])  # seen again on a resync: done, nothing published or activated
    await controller.wait_in_flight()
    assert len(activated) == 1
    await controller.aclose()
    await events.aclose()


async def test_the_driver_builds_its_parts_once_when_it_opens(tmp_path: Path) -> None:
    """Everything exists from the moment the driver is open; `start` only hands the activator over,
    and the claim informer then runs as the claim controller's one source of claims."""
    driver = KubernetesDriver(config(), StatePaths(tmp_path), api=Api([]), pool_cache=Pools(pool()))  # type: ignore[arg-type]
    async with driver:
        warm = driver.warm_allocation
        assert warm is not None
        informers, controller = driver.informers, warm.claims
        assert warm.running
        assert not warm.started
        assert not warm.following_claims
        await driver.start(NoActivator())
        assert warm.started
        assert warm.following_claims
        subscription = driver.watch()
        assert (driver.informers, warm.claims, driver.warm_allocation) == (informers, controller, warm)
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

    cluster = WarmCluster()
    sandbox, _pod = cluster.member(cluster.pool())
    claim = cluster.claim(proof="p")
    cluster.adopt(sandbox, claim)
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

        def holds(self, instance_id: InstanceId) -> bool:
            return registered.is_set()

    hub = Hub()
    events = hub.subscribe()
    controller = claim_controller(cluster, Activator(), claim, hub=hub)  # its first resync finds the claim
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


class HeldHere:
    """An activator holding the registrations of `registered` pods; the others are elsewhere."""

    def __init__(self) -> None:
        self.registered: set[str] = set()
        self.calls: list[str] = []
        self.activated: dict[str, asyncio.Event] = {}
        self.generation = 0
        self._changed = asyncio.Event()

    def register(self, pod_uid: str) -> asyncio.Event:
        """Register `pod_uid` here; the event is set once it is activated."""
        self.registered.add(pod_uid)
        self.generation += 1
        self._changed.set()
        self._changed = asyncio.Event()
        return self.activated.setdefault(pod_uid, asyncio.Event())

    async def activate(self, *, instance_id: InstanceId, **_: Any) -> None:
        self.calls.append(instance_id)
        if instance_id not in self.registered:
            raise NotFoundError(f"instance {instance_id} is not registered")
        self.activated.setdefault(instance_id, asyncio.Event()).set()

    def holds(self, instance_id: InstanceId) -> bool:
        return instance_id in self.registered

    async def wait_registrations_changed(self, generation: int) -> int:
        while self.generation == generation:
            await self._changed.wait()
        return self.generation


def parked_scene(
    count: int, **options: Any
) -> tuple[WarmCluster, HeldHere, claimactivation.ClaimActivation, list[Any], list[str]]:
    """`count` claims bound to warm members whose pods are registered elsewhere, and a controller
    (`options` for it) that parks each after one attempt (the caller patches RETRY_DELAYS)."""
    cluster = WarmCluster()
    pool_obj = cluster.pool()
    claim_objs, pods = [], []
    for i in range(count):
        sandbox, pod = cluster.member(pool_obj, suffix=f"m{i}")
        claim = cluster.claim(sandbox_id=f"sbx-{i}", name=f"c{i}")
        cluster.adopt(sandbox, claim)
        claim_objs.append(claim)
        pods.append(pod["metadata"]["uid"])
    activator = HeldHere()
    controller = claim_controller(cluster, activator, **options)
    return cluster, activator, controller, claim_objs, pods


async def test_a_registration_wakes_only_its_own_parked_claim(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forty parked claims, more than the in-flight bound: a pod registering here wakes its own
    claim alone (one activate call), which is activated, and the others stay parked."""
    monkeypatch.setattr(claimactivation, "RETRY_DELAYS", ())  # park after the first attempt
    cluster, activator, controller, claim_objs, pods = parked_scene(40, max_in_flight=8)
    controller.replace(claim_objs)
    await controller.wait_in_flight()
    assert len(activator.calls) == 40  # each tried once, then parked
    reads = len(cluster.calls)
    for pod_uid in (pods[37], pods[3]):
        activator.calls.clear()
        activator.register(pod_uid)
        controller.registrations_changed()
        await controller.wait_in_flight()
        assert activator.calls == [pod_uid]
    assert len(cluster.calls) == reads  # a parked retry reads nothing from the API
    controller.registrations_changed()  # a change that is nobody's: nothing runs
    assert controller.in_flight == 0
    await controller.aclose()


async def test_claims_woken_beyond_the_bound_still_run_when_slots_free(monkeypatch: pytest.MonkeyPatch) -> None:
    """More woken parked claims than slots: the ones that wait for a slot keep their wake-up."""
    monkeypatch.setattr(claimactivation, "RETRY_DELAYS", ())
    _cluster, activator, controller, claim_objs, pods = parked_scene(10, max_in_flight=2)
    controller.replace(claim_objs)
    await controller.wait_in_flight()
    activator.calls.clear()
    for pod_uid in pods:
        activator.registered.add(pod_uid)  # all ten at once, then one change
    controller.registrations_changed()
    assert controller.in_flight == 2
    await controller.wait_in_flight()
    assert sorted(activator.calls) == sorted(pods)  # every one activated, none twice
    await controller.aclose()


class LateCache:
    """The informers' cache, whose Sandbox and pod arrive after the claim's binding (as they do
    when the claim's status is watched before the Sandbox's adoption)."""

    def __init__(self, claim: dict[str, Any]) -> None:
        self.claim = claim
        self.objects: dict[str, dict[str, Any]] = {}
        self.generation = 0
        self.changes: list[tuple[int, frozenset[str] | None]] = []
        self.changed = asyncio.Event()

    def cached_sandbox(self, name: str) -> dict[str, Any] | None:
        return self.objects.get(f"sandbox/{name}")

    def cached_pod(self, name: str) -> dict[str, Any] | None:
        return self.objects.get(f"pod/{name}")

    def cached_claims(self) -> list[dict[str, Any]]:
        return [self.claim]

    async def wait_objects_changed(self, generation: int) -> tuple[int, frozenset[str] | None]:
        while self.generation == generation:
            await self.changed.wait()
        return self.generation, changed_since(self.changes, generation, self.generation)

    def arrive(self, sandbox: dict[str, Any], pod: dict[str, Any]) -> None:
        self.objects |= {f"sandbox/{sandbox['metadata']['name']}": sandbox, f"pod/{pod['metadata']['name']}": pod}
        self.touch(frozenset((sandbox["metadata"]["name"],)))

    def touch(self, sandbox_names: frozenset[str] | None = frozenset(("another-member",))) -> None:
        """A change of the cached objects of `sandbox_names` (by default another pool member's:
        another pod's status write; None: a listing)."""
        self.generation += 1
        self.changes.append((self.generation, sandbox_names))
        self.changed.set()
        self.changed = asyncio.Event()


async def test_a_claim_bound_before_the_informers_see_its_sandbox_waits_for_them_not_the_api(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(claimactivation, "RETRY_DELAYS", (30.0, 30.0))  # only a change can wake it in time
    cluster = WarmCluster()
    sandbox, pod = cluster.member(cluster.pool())
    claim = cluster.claim(proof="p")
    cluster.adopt(sandbox, claim)
    activated: list[InstanceId] = []

    class Activator(NoActivator):
        async def activate(self, **kwargs: Any) -> None:
            activated.append(kwargs["instance_id"])

    cache = LateCache(claim)
    api: Any = cluster
    controller = claimactivation.ClaimActivation(api, NS, ProofSealer(KEY), cache)
    controller.start(Activator())
    for _ in range(5):
        await asyncio.sleep(0)
    assert activated == []  # waiting for the informers
    assert controller.in_flight == 1
    cache.arrive(sandbox, pod)
    async with asyncio.timeout(5):
        await controller.wait_in_flight()
    assert activated == [InstanceId(pod["metadata"]["uid"])]
    assert not [c for c in cluster.calls if c[0] == "get"]  # the chain came from the cache alone
    await controller.aclose()


class Recorded(NoActivator):
    def __init__(self) -> None:
        self.activated: list[InstanceId] = []

    async def activate(self, **kwargs: Any) -> None:
        self.activated.append(kwargs["instance_id"])


@dataclasses.dataclass
class LateScene:
    """A claim bound to a pool member whose Sandbox and pod the informers have not shown yet,
    with its controller started."""

    cluster: WarmCluster
    sandbox: dict[str, Any]
    pod: dict[str, Any]
    cache: LateCache
    activator: Recorded
    controller: claimactivation.ClaimActivation

    async def activated_once(self) -> None:
        async with asyncio.timeout(5):
            await self.controller.wait_in_flight()
        assert self.activator.activated == [InstanceId(self.pod["metadata"]["uid"])]
        await self.controller.aclose()

    def gets(self) -> list[tuple[Any, ...]]:
        return [c for c in self.cluster.calls if c[0] == "get"]


def late_scene() -> LateScene:
    cluster = WarmCluster()
    sandbox, pod = cluster.member(cluster.pool())
    claim = cluster.claim(proof="p")
    cluster.adopt(sandbox, claim)
    cache, activator = LateCache(claim), Recorded()
    api: Any = cluster
    controller = claimactivation.ClaimActivation(api, NS, ProofSealer(KEY), cache)
    controller.start(activator)
    return LateScene(cluster, sandbox, pod, cache, activator, controller)


async def test_changes_of_other_objects_do_not_send_a_bound_claim_to_the_api(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(claimactivation, "RETRY_DELAYS", (30.0, 30.0))
    scene = late_scene()
    for _ in range(3):  # other pods' status writes, before this claim's Sandbox and pod are seen
        scene.cache.touch()
        for _ in range(5):
            await asyncio.sleep(0)
    assert scene.activator.activated == []
    scene.cache.arrive(scene.sandbox, scene.pod)
    await scene.activated_once()
    assert scene.gets() == []  # still the cache alone


def count_resolutions(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Each look for a claim's chain appends to the list returned."""
    resolve = claimactivation.resolve_target
    counted: list[int] = []

    async def counting(*args: Any, **kwargs: Any) -> claimactivation.Target | None:
        counted.append(1)
        return await resolve(*args, **kwargs)

    monkeypatch.setattr(claimactivation, "resolve_target", counting)
    return counted


async def resolutions_after(scene: LateScene, counted: list[int], *changes: frozenset[str] | None) -> int:
    """How many times the scene's claim looked for its chain again after `changes`."""
    for _ in range(5):
        await asyncio.sleep(0)
    before = len(counted)
    for names in changes:
        scene.cache.touch(names)
        for _ in range(5):
            await asyncio.sleep(0)
    return len(counted) - before


async def test_only_a_change_of_its_own_sandbox_or_pod_wakes_a_resolving_claim(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(claimactivation, "RETRY_DELAYS", (30.0, 30.0))
    counted = count_resolutions(monkeypatch)
    scene = late_scene()
    others = [frozenset(("member-x",)), frozenset(("member-y", "member-z")), frozenset[str]()]
    assert await resolutions_after(scene, counted, *others) == 0  # other members' changes: not woken
    own = frozenset(("member-y", scene.sandbox["metadata"]["name"]))
    assert await resolutions_after(scene, counted, own) == 1
    assert await resolutions_after(scene, counted, None) == 1  # a listing may concern any claim
    assert scene.activator.activated == []
    scene.cache.arrive(scene.sandbox, scene.pod)
    await scene.activated_once()


async def test_a_chain_the_informers_never_show_is_read_live_after_the_cache_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(claimactivation, "CACHE_WAIT_SECONDS", 0.05)
    monkeypatch.setattr(claimactivation, "RETRY_DELAYS", (0.01, 30.0))
    scene = late_scene()
    await scene.activated_once()
    assert len(scene.gets()) == 2  # its Sandbox, then its pod
