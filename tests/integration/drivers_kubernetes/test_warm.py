"""Warm allocation on kubesim: pools applied as SandboxTemplate + SandboxWarmPool with warmshell's
labels (as an operator would with kubectl), creates that match exactly one go through a
SandboxClaim, and the claim controller activates the warm pod agent-sandbox binds."""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path
from typing import Any

import pytest

from kubesim.cluster import RunningCluster
from kubesim.controllers import client as kc
from tests.helpers.gateway import RunningGateway, pool_named, running_gateway, wait_pools
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.core.fingerprints import SandboxShape
from warmshell.drivers.kubernetes import KubernetesDriver
from warmshell.drivers.kubernetes.warm import claimactivation, warmpools

from .conftest import IMAGE, NAMESPACE, driver_config, gateway_settings

SHAPE = SandboxShape(workspace="default", image=IMAGE, environment={"FOO": "bar"})
USER = "kubesim-user"
CLAIMS = "sandboxclaims.extensions.agents.x-k8s.io"  # the resource label in kubesim's request log


async def apply_pool(
    cluster: RunningCluster, admin: kc.KubeClient, state: Path, name: str, replicas: int, **shape: Any
) -> None:
    """Apply a template + pool pair the way the profile reconciler (issue 8) will render it, for
    the gateway whose state directory is `state` (its supervisor socket is the pods' gateway)."""
    config = driver_config(cluster, state)
    template, pool = warmpools.render_pool_pair(
        config, name=name, namespace=NAMESPACE, shape=SandboxShape(**{**SHAPE.__dict__, **shape}), replicas=replicas
    )
    await admin.create(kc.TEMPLATES, NAMESPACE, template)
    await admin.create(kc.POOLS, NAMESPACE, pool)


async def wait_idle(gw: RunningGateway, name: str, idle: int, timeout: float = 30.0) -> None:
    """Until the pool's members have registered as warm pending with the gateway."""

    def done(response: pb.ListPoolsResponse) -> bool:
        pool = pool_named(response, name)
        return pool is not None and pool.idle >= idle

    await wait_pools(gw, done, timeout)


def gateway(cluster: RunningCluster, tmp_path: Path) -> Any:
    state = tmp_path / "state"
    return running_gateway(state, **gateway_settings(cluster, state))


async def test_a_matching_create_goes_warm(cluster: RunningCluster, admin: kc.KubeClient, tmp_path: Path) -> None:
    await apply_pool(cluster, admin, tmp_path / "state", "foo", 2)
    async with gateway(cluster, tmp_path) as gw:
        await wait_idle(gw, "foo", 2)
        members = {p["metadata"]["uid"] for p in (await admin.list_objects(kc.PODS, NAMESPACE))["items"]}
        await gw.create(name="hot", spec=pb.SandboxSpec(environment={"FOO": "bar"}))
        ready = await gw.wait_ready("hot", timeout=30)
        assert ready.status.phase == pb.SANDBOX_PHASE_READY
        assert ready.status.allocation == "warm"
        assert ready.status.instance_id in members  # a pod started before the request
        claim = await admin.get(kc.CLAIMS, NAMESPACE, "default--hot")
        assert claim["spec"] == {"warmPoolRef": {"name": "foo"}}
        code, out, _ = await gw.exec("hot", ["sh", "-c", 'echo "$FOO from $(pwd)"'])
        assert (code, out) == (0, b"bar from /workspace\n")
        timeline = ready.status.timeline
        assert timeline.requested_us <= timeline.claimed_us <= timeline.activated_us <= timeline.ready_us
        await gw.delete("hot")
        with pytest.raises(kc.ApiError):
            await admin.get(kc.CLAIMS, NAMESPACE, "default--hot")


async def test_a_non_matching_create_goes_cold(cluster: RunningCluster, admin: kc.KubeClient, tmp_path: Path) -> None:
    await apply_pool(cluster, admin, tmp_path / "state", "foo", 1)
    async with gateway(cluster, tmp_path) as gw:
        await wait_idle(gw, "foo", 1)
        await gw.create(name="cold", spec=pb.SandboxSpec(environment={"FOO": "other"}))
        ready = await gw.wait_ready("cold", timeout=30)
        assert ready.status.phase == pb.SANDBOX_PHASE_READY
        assert ready.status.allocation == "cold"
        allocated = {c.type: c for c in ready.status.conditions}["Allocated"]
        assert allocated.message == "NoMatch"


async def test_two_pools_with_one_fingerprint_go_cold_as_ambiguous(
    cluster: RunningCluster, admin: kc.KubeClient, tmp_path: Path
) -> None:
    await apply_pool(cluster, admin, tmp_path / "state", "one", 1)
    await apply_pool(cluster, admin, tmp_path / "state", "two", 1)
    async with gateway(cluster, tmp_path) as gw:
        await wait_idle(gw, "one", 1)
        await wait_idle(gw, "two", 1)
        await gw.create(name="amb", spec=pb.SandboxSpec(environment={"FOO": "bar"}))
        ready = await gw.wait_ready("amb", timeout=30)
        assert ready.status.allocation == "cold"
        assert {c.type: c for c in ready.status.conditions}["Allocated"].message == "Ambiguous"


async def test_a_drained_pool_still_yields_a_sandbox(
    cluster: RunningCluster, admin: kc.KubeClient, tmp_path: Path
) -> None:
    """agent-sandbox's cold fallback: no warm member, so the claim gets a Sandbox named after it;
    its pod registers bound through the claim and is activated at once."""
    await apply_pool(cluster, admin, tmp_path / "state", "empty", 0)
    async with gateway(cluster, tmp_path) as gw:
        await wait_pools(gw, lambda r: pool_named(r, "empty") is not None)
        await gw.create(name="fallback", spec=pb.SandboxSpec(environment={"FOO": "bar"}))
        ready = await gw.wait_ready("fallback", timeout=30)
        assert ready.status.phase == pb.SANDBOX_PHASE_READY
        assert ready.status.allocation == "warm"  # a claim, served cold by agent-sandbox
        # ... and so no instant start: its member registered after the request.
        allocated = {c.type: c for c in ready.status.conditions}["Allocated"]
        assert allocated.reason == "Refilled"
        assert allocated.message.startswith("empty: waited ")
        assert ready.status.timeline.registered_us > ready.status.timeline.requested_us
        sandbox = await admin.get(kc.SANDBOXES, NAMESPACE, "default--fallback")
        assert sandbox["metadata"]["labels"]["agents.x-k8s.io/launch-type"] == "cold"
        code, out, _ = await gw.exec("fallback", ["sh", "-c", "echo ok"])
        assert (code, out) == (0, b"ok\n")


async def test_fifty_concurrent_creates_against_a_pool_of_twenty(
    cluster: RunningCluster, admin: kc.KubeClient, tmp_path: Path
) -> None:
    await apply_pool(cluster, admin, tmp_path / "state", "big", 20)
    async with gateway(cluster, tmp_path) as gw:
        await wait_idle(gw, "big", 20, timeout=60)
        names = [f"c{i}" for i in range(50)]
        await asyncio.gather(*(gw.create(name=n, spec=pb.SandboxSpec(environment={"FOO": "bar"})) for n in names))
        ready = await asyncio.gather(*(gw.wait_ready(n, timeout=90) for n in names))
        assert all(s.status.phase == pb.SANDBOX_PHASE_READY for s in ready)
        # Every sandbox has its own pod: no warm member was activated twice.
        assert len({s.status.instance_id for s in ready}) == 50
        # All warm; the twenty idle members were instant starts, and so was any refilled member
        # that registered before a later create was received (kubesim's fast pods can); the
        # others waited for the pool to refill, and say so.
        assert {s.status.allocation for s in ready} == {"warm"}
        reasons = collections.Counter({c.type: c for c in s.status.conditions}["Allocated"].reason for s in ready)
        assert reasons["PoolHit"] >= 20, reasons
        assert reasons["PoolHit"] + reasons["Refilled"] == 50, reasons
        for s in ready:
            waited = s.status.timeline.registered_us > s.status.timeline.requested_us
            assert ({c.type: c for c in s.status.conditions}["Allocated"].reason == "Refilled") == waited
        code, out, _ = await gw.exec("c49", ["sh", "-c", "echo $FOO"])
        assert (code, out) == (0, b"bar\n")


async def test_a_gateway_restart_between_claim_and_activation(
    cluster: RunningCluster, admin: kc.KubeClient, tmp_path: Path
) -> None:
    """The claim is written by the first gateway, which stops before activating anything; the pod
    re-registers with the second one (bound through the claim, or warm pending and then found by
    its claim controller) and the sandbox becomes Ready."""
    await apply_pool(cluster, admin, tmp_path / "state", "foo", 1)
    state = tmp_path / "state"
    settings = gateway_settings(cluster, state)
    async with running_gateway(state, **settings) as first:
        await wait_idle(first, "foo", 1)
        # Stop the claim controller first, so the activation can only come from the second gateway.
        driver = first.gateway.parts.driver
        assert isinstance(driver, KubernetesDriver)
        warm = driver.warm_allocation
        assert warm is not None
        assert warm.claims is not None
        await warm.claims.aclose()
        await first.create(name="survivor", spec=pb.SandboxSpec(environment={"FOO": "bar"}))
        await first.stop()
    async with running_gateway(state, **settings) as second:
        ready = await second.wait_ready("survivor", timeout=30)
        assert ready.status.phase == pb.SANDBOX_PHASE_READY
        assert ready.status.allocation == "warm"


async def test_claim_activation_survives_a_dropped_watch_and_a_resync(
    cluster: RunningCluster, admin: kc.KubeClient, tmp_path: Path
) -> None:
    """With history compacted and every watch dropped, the claim informer relists and the bound
    claim is still activated; a resync from the informer's cache (every 15 s, shortened here)
    keeps finding it and never activates it a second time."""
    await apply_pool(cluster, admin, tmp_path / "state", "foo", 1)
    original = claimactivation.RESYNC_SECONDS
    claimactivation.RESYNC_SECONDS = 0.3
    try:
        async with gateway(cluster, tmp_path) as gw:
            await wait_idle(gw, "foo", 1)
            driver = gw.gateway.parts.driver
            assert isinstance(driver, KubernetesDriver)
            warm = driver.warm_allocation
            assert warm is not None
            cluster.server.compact()
            cluster.server.close_watches()  # resuming gets 410: every informer lists again
            await gw.create(name="relisted", spec=pb.SandboxSpec(environment={"FOO": "bar"}))
            ready = await gw.wait_ready("relisted", timeout=30)
            assert ready.status.phase == pb.SANDBOX_PHASE_READY
            first = ready.status.timeline
            assert first.claimed_us
            assert first.activated_us >= first.claimed_us
            warm.claims.resync()
            await asyncio.sleep(0.5)  # resyncs keep running meanwhile
            again = (await gw.get("relisted")).status.timeline
            assert (again.claimed_us, again.activated_us) == (first.claimed_us, first.activated_us)
    finally:
        claimactivation.RESYNC_SECONDS = original


async def test_a_gateway_watches_each_resource_once(
    cluster: RunningCluster, admin: kc.KubeClient, tmp_path: Path
) -> None:
    """One watch per resource per gateway, through a warm create: the claim activation controller
    takes its claims from the driver's one claim informer, not a watch of its own."""
    await apply_pool(cluster, admin, tmp_path / "state", "foo", 1)
    async with gateway(cluster, tmp_path) as gw:
        await wait_idle(gw, "foo", 1)
        await gw.create(name="counted", spec=pb.SandboxSpec(environment={"FOO": "bar"}))
        await gw.wait_ready("counted", timeout=30)
    # Counted once the gateway has stopped: kubesim logs a watch when its stream ends.
    counters = cluster.server.log.counters.items()
    watches = {r: n for (user, verb, r), n in counters if (user, verb) == (USER, "watch")}
    assert watches[CLAIMS] == 1
    assert set(watches.values()) == {1}, watches


async def test_the_relist_judges_from_the_informers_which_say_what_a_list_says(
    cluster: RunningCluster, admin: kc.KubeClient, tmp_path: Path
) -> None:
    """The informers' views of a warm and a cold sandbox are the ones a live LIST joins; the
    relist (every 0.5 s here) lists live once, at the start, and then judges from them."""
    await apply_pool(cluster, admin, tmp_path / "state", "foo", 1)
    async with gateway(cluster, tmp_path) as gw:
        await wait_idle(gw, "foo", 1)
        await gw.create(name="hot", spec=pb.SandboxSpec(environment={"FOO": "bar"}))
        await gw.create(name="cold", spec=pb.SandboxSpec(environment={"FOO": "other"}))
        assert (await gw.wait_ready("hot", timeout=30)).status.allocation == "warm"
        assert (await gw.wait_ready("cold", timeout=30)).status.allocation == "cold"
        driver = gw.gateway.parts.driver
        assert isinstance(driver, KubernetesDriver)

        def by_id(views: list[Any] | None) -> list[Any]:
            assert views is not None
            return sorted(views, key=lambda v: v.sandbox_id)

        for _ in range(100):  # the informers may be an event behind the API for a moment
            live = by_id(await driver.list())
            if by_id(driver.cached_list()) == live:
                break
            await asyncio.sleep(0.05)
        assert by_id(driver.cached_list()) == live
        assert {v.allocation.value for v in live} == {"warm", "cold"}
        lists = cluster.server.log.count(verb="list", resource=CLAIMS, user=USER)
        await asyncio.sleep(1.6)  # three relists or more
        assert cluster.server.log.count(verb="list", resource=CLAIMS, user=USER) == lists
