"""Warm-pool profiles on kubesim: the example ConfigMaps applied with kubectl become warm pools a
real gateway serves creates from; edits replace pools, deletes remove them, an invalid profile is
reported without harming the others; and only the Lease holder reconciles."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from kubesim.cluster import RunningCluster
from kubesim.controllers import client as kc
from kubesim.controllers import crds_install
from tests.helpers.gateway import RunningGateway, pool_named, running_gateway, wait_pools
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.cli import render
from warmshell.core.config import KubernetesDriverConfig
from warmshell.drivers.kubernetes import kube, labels
from warmshell.drivers.kubernetes.profiles import lease, reconciler
from warmshell.drivers.kubernetes.warm.extensions import ExtensionsGate

from .conftest import NAMESPACE, driver_config, gateway_settings

EXAMPLES = Path(__file__).parents[3] / "examples" / "kubernetes"
PROFILES = {"default": "warm-pool-default", "env": "warm-pool-env-foo", "cpu": "warm-pool-cpu"}
# Short, so a takeover after a crash is quick; renewals every 0.2 s keep the holder well inside.
ELECTION = {"lease_duration_seconds": 2, "renew_deadline_seconds": 1.5, "retry_period_seconds": 0.2}


def profile_settings(cluster: RunningCluster, state: Path) -> dict[str, Any]:
    settings = gateway_settings(cluster, state)
    settings["kubernetes.warm_pooling"] = {"enabled": True, "profiles": {"enabled": True}}
    settings["kubernetes.leader_election"] = {**settings["kubernetes.leader_election"], **ELECTION}
    return settings


@contextlib.asynccontextmanager
async def profile_gateway(cluster: RunningCluster, tmp_path: Path) -> AsyncIterator[RunningGateway]:
    state = tmp_path / "state"
    async with running_gateway(state, **profile_settings(cluster, state)) as gw:
        yield gw


async def kubectl(cluster: RunningCluster, *args: str) -> str:
    process = await asyncio.create_subprocess_exec(
        "kubectl",
        f"--kubeconfig={cluster.kubeconfig}",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    return out.decode()


async def until(check: Callable[[], Awaitable[Any]], timeout: float = 30.0) -> Any:
    """Poll `check` (a few API reads) until it returns something truthy; no fixed sleeps stand
    in for the condition — the pause only paces the reads."""
    async with asyncio.timeout(timeout):
        while True:
            result = await check()
            if result:
                return result
            await asyncio.sleep(0.05)


async def status_of(admin: kc.KubeClient, name: str) -> dict[str, str]:
    configmap = await admin.get(kc.CONFIGMAPS, NAMESPACE, name)
    return dict(configmap["metadata"].get("annotations") or {})


async def ready_status(admin: kc.KubeClient, name: str, timeout: float = 30.0) -> dict[str, str]:
    """The ConfigMap's annotations once it reports Ready for its current version."""

    async def check() -> dict[str, str] | None:
        configmap = await admin.get(kc.CONFIGMAPS, NAMESPACE, name)
        annotations = dict(configmap["metadata"].get("annotations") or {})
        return annotations if annotations.get(labels.PROFILE_STATUS) == "Ready" else None

    result: dict[str, str] = await until(check, timeout)
    return result


async def names(admin: kc.KubeClient, resource: kc.Resource) -> set[str]:
    listed = await admin.list_objects(resource, NAMESPACE)
    return {o["metadata"]["name"] for o in listed.get("items") or []}


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl")
async def test_example_profiles_serve_warm_creates(
    cluster: RunningCluster, admin: kc.KubeClient, tmp_path: Path
) -> None:
    # kubesim serves no OpenAPI document, so kubectl cannot validate client-side.
    await kubectl(cluster, "apply", "-n", NAMESPACE, "-f", str(EXAMPLES))
    async with profile_gateway(cluster, tmp_path) as gw:
        generated = {key: (await ready_status(admin, cm))[labels.PROFILE_GENERATED] for key, cm in PROFILES.items()}
        assert set(generated.values()) <= await names(admin, kc.POOLS)
        assert set(generated.values()) <= await names(admin, kc.TEMPLATES)

        def all_idle(response: pb.ListPoolsResponse) -> bool:
            return all((p := pool_named(response, n)) is not None and p.idle >= 1 for n in generated.values())

        await wait_pools(gw, all_idle, timeout=45)
        requests = {
            "default": pb.SandboxSpec(),
            "env": pb.SandboxSpec(environment={"FOO": "bar"}),
            "cpu": pb.SandboxSpec(resources=pb.Resources(cpu="0.2")),
        }
        for key, spec in requests.items():
            await gw.create(name=f"hit-{key}", spec=spec)
        for key in requests:
            ready = await gw.wait_ready(f"hit-{key}", timeout=30)
            assert ready.status.phase == pb.SANDBOX_PHASE_READY, key
            # A SandboxClaim on the profile's pool is what a warm create writes (a cold one writes a
            # Sandbox named after the request directly).
            claim = await admin.get(kc.CLAIMS, NAMESPACE, f"default--hit-{key}")
            assert claim["spec"]["warmPoolRef"]["name"] == generated[key], key


async def test_edit_replaces_delete_removes_and_invalid_is_reported(
    cluster: RunningCluster, admin: kc.KubeClient, tmp_path: Path
) -> None:
    await apply_profile(admin, "wp-a", 'version = 1\nworkspace = "default"\nreplicas = 1\n')
    await apply_profile(admin, "wp-b", 'version = 1\nworkspace = "default"\nreplicas = 1\n[environment]\nB = "1"\n')
    async with profile_gateway(cluster, tmp_path):
        first = (await ready_status(admin, "wp-a"))[labels.PROFILE_GENERATED]
        other = (await ready_status(admin, "wp-b"))[labels.PROFILE_GENERATED]

        # Edit: a new shape is a new pair; the old one goes.
        await edit_profile(admin, "wp-a", 'version = 1\nworkspace = "default"\nreplicas = 1\n[environment]\nA = "2"\n')

        async def replaced() -> bool:
            status = await status_of(admin, "wp-a")
            pools = await names(admin, kc.POOLS)
            current = status.get(labels.PROFILE_GENERATED, first)
            return current != first and current in pools and first not in pools

        await until(replaced)
        second = (await status_of(admin, "wp-a"))[labels.PROFILE_GENERATED]
        assert first not in await names(admin, kc.TEMPLATES)

        # Invalid TOML: an Error in words; its pool stays; the other profile is untouched.
        await edit_profile(admin, "wp-a", 'version = 1\nworkspace = "default"\nreplicas = \n')

        async def errored() -> dict[str, str] | None:
            status = await status_of(admin, "wp-a")
            return status if status.get(labels.PROFILE_STATUS) == "Error" else None

        status = await until(errored)
        assert "not valid TOML" in status[labels.PROFILE_LAST_ERROR]
        assert f"configmap {NAMESPACE}/wp-a" in status[labels.PROFILE_LAST_ERROR]
        assert second in status[labels.PROFILE_LAST_ERROR]  # "keeping the previously generated ..."
        assert {second, other} <= await names(admin, kc.POOLS)
        assert (await status_of(admin, "wp-b"))[labels.PROFILE_STATUS] == "Ready"

        # Delete: its objects are gone (ownerReferences and the sweep), the other stays.
        await admin.delete(kc.CONFIGMAPS, NAMESPACE, "wp-a")

        async def swept() -> bool:
            return second not in await names(admin, kc.POOLS) and second not in await names(admin, kc.TEMPLATES)

        await until(swept)
        assert other in await names(admin, kc.POOLS)


async def apply_profile(admin: kc.KubeClient, name: str, text: str) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {labels.PROFILE: "true"}},
        "data": {labels.PROFILE_DATA_KEY: text},
    }
    await admin.create(kc.CONFIGMAPS, NAMESPACE, body)


async def edit_profile(admin: kc.KubeClient, name: str, text: str) -> None:
    await admin.patch(kc.CONFIGMAPS, NAMESPACE, name, {"data": {labels.PROFILE_DATA_KEY: text}})


# -- two replicas -------------------------------------------------------------------------------------


class Replica:
    """One gateway replica's share of the profile work: its own API client, elector and reconciler."""

    def __init__(self, api: kube.Kube, config: KubernetesDriverConfig, gate: ExtensionsGate | None = None) -> None:
        self.api = api
        self.gate = gate or ExtensionsGate(api, config.namespace)
        self.reconciler = reconciler.ProfileReconciler(api, config, gate=self.gate)
        self.elector = lease.elector_for(api, config)
        self.task = asyncio.create_task(self.elector.run(self.reconciler.lead))

    async def stop(self, *, crash: bool = False) -> None:
        if crash:
            self.elector.is_leader = False  # a killed process releases nothing
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


@contextlib.asynccontextmanager
async def replica(
    cluster: RunningCluster, tmp_path: Path, identity: str, gate: Callable[[kube.Kube], ExtensionsGate] | None = None
) -> AsyncIterator[Replica]:
    config = driver_config(
        cluster,
        tmp_path / identity,
        warm_pooling={"profiles": {"enabled": True}},
        leader_election={**ELECTION, "identity": identity},
    )
    api = await kube.Kube.connect(config)
    running = Replica(api, config, gate(api) if gate else None)
    try:
        yield running
    finally:
        await running.stop()
        await api.aclose()


async def test_only_the_lease_holder_reconciles_and_the_other_takes_over(
    cluster: RunningCluster, admin: kc.KubeClient, tmp_path: Path
) -> None:
    await apply_profile(admin, "wp-a", 'version = 1\nworkspace = "default"\nreplicas = 1\n')
    async with replica(cluster, tmp_path, "gw-1") as one, replica(cluster, tmp_path, "gw-2") as two:
        await ready_status(admin, "wp-a")
        leader, follower = (one, two) if one.elector.is_leader else (two, one)
        assert leader.elector.is_leader
        assert not follower.elector.is_leader
        assert leader.reconciler.passes >= 1
        assert follower.reconciler.passes == 0

        # The holder dies without releasing: the other must wait out the Lease, then take over.
        await leader.stop(crash=True)
        stopped = time.monotonic()
        await apply_profile(admin, "wp-b", 'version = 1\nworkspace = "default"\nreplicas = 1\n[environment]\nB = "1"\n')
        await ready_status(admin, "wp-b", timeout=10)
        took = time.monotonic() - stopped
        assert follower.elector.is_leader
        assert follower.reconciler.passes >= 1
        lease_obj = await admin.get(kc.Resource("coordination.k8s.io", "v1", "leases"), NAMESPACE, "warmshell-profiles")
        assert lease_obj["spec"]["holderIdentity"] == follower.elector.identity
        # Within the lease duration (plus a retry period and the pass itself).
        assert took < ELECTION["lease_duration_seconds"] + 1.5


def replica_settings(cluster: RunningCluster, tmp_path: Path, identity: str) -> tuple[Path, dict[str, Any]]:
    """A whole gateway replica: its own state, profiles on, the short election, its own identity."""
    state = tmp_path / identity
    settings = profile_settings(cluster, state)
    settings["kubernetes.leader_election"]["identity"] = identity  # profile_settings made this dict
    return state, settings


async def test_two_gateways_elect_one_and_a_stopping_holder_hands_over_at_once(
    cluster: RunningCluster, admin: kc.KubeClient, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two real gateways on one cluster: one takes the Lease and reconciles; a graceful stop (what
    SIGTERM does) releases it, so the other takes over well inside a lease duration."""
    caplog.set_level(logging.INFO, logger="warmshell.drivers.kubernetes.profiles.lease")
    leases = kc.Resource("coordination.k8s.io", "v1", "leases")
    await apply_profile(admin, "wp-a", 'version = 1\nworkspace = "default"\nreplicas = 1\n')
    async with contextlib.AsyncExitStack() as stack:
        replicas = []
        for identity in ("gw-1", "gw-2"):
            state, settings = replica_settings(cluster, tmp_path, identity)
            replicas.append(await stack.enter_async_context(running_gateway(state, **settings)))
        one, two = replicas
        await ready_status(admin, "wp-a")
        holder = (await admin.get(leases, NAMESPACE, "warmshell-profiles"))["spec"]["holderIdentity"]
        assert holder in ("gw-1", "gw-2")
        acquired = [r.getMessage() for r in caplog.records if "acquired by" in r.getMessage()]
        assert acquired == [f"lease {NAMESPACE}/warmshell-profiles acquired by {holder}"]  # nobody else led
        leader, follower = (one, "gw-2") if holder == "gw-1" else (two, "gw-1")

        await leader.stop()
        stopped = time.monotonic()
        await apply_profile(admin, "wp-b", 'version = 1\nworkspace = "default"\nreplicas = 1\n[environment]\nB = "1"\n')
        await ready_status(admin, "wp-b", timeout=10)
        took = time.monotonic() - stopped
        assert (await admin.get(leases, NAMESPACE, "warmshell-profiles"))["spec"]["holderIdentity"] == follower
        # Released, not waited out: well inside the lease duration the crash test has to wait.
        assert took < ELECTION["lease_duration_seconds"]


# -- extension CRDs absent ----------------------------------------------------------------------------


class CountingGate(ExtensionsGate):
    """Probes quickly and counts them, so the test can wait for "several probes happened"."""

    def __init__(self, api: kube.Kube) -> None:
        super().__init__(api, NAMESPACE, delays=(0.1,))
        self.probes = 0

    async def probe(self) -> bool:
        self.probes += 1
        return await super().probe()


async def test_without_extension_crds_one_warning_then_on_when_they_appear(
    cluster: RunningCluster, admin: kc.KubeClient, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    extension_crds = [m for m in crds_install.manifests() if m["spec"]["group"] == kube.EXTENSIONS_GROUP]
    for crd in extension_crds:
        await admin.delete(crds_install.CRDS, None, crd["metadata"]["name"])
    await until(lambda: absent(admin))
    caplog.set_level(logging.INFO, logger="warmshell.drivers.kubernetes.warm.extensions")
    await apply_profile(admin, "wp-a", 'version = 1\nworkspace = "default"\nreplicas = 1\n')
    gates: list[CountingGate] = []

    def counting(api: kube.Kube) -> CountingGate:
        gates.append(CountingGate(api))
        return gates[0]

    async with replica(cluster, tmp_path, "gw-1", counting):

        async def probed_a_few_times() -> bool:
            return bool(gates) and gates[0].probes >= 5

        await until(probed_a_few_times)
        assert gates[0].available is False
        assert labels.PROFILE_STATUS not in await status_of(admin, "wp-a")
        for crd in extension_crds:
            await admin.create(crds_install.CRDS, None, crd)
        status = await ready_status(admin, "wp-a")
        assert status[labels.PROFILE_GENERATED] in await names(admin, kc.POOLS)
    off = [r for r in caplog.records if r.levelno >= logging.WARNING and "warm pooling is off" in r.getMessage()]
    assert len(off) == 1
    assert any("warm pooling is on" in r.getMessage() for r in caplog.records)


async def absent(admin: kc.KubeClient) -> bool:
    try:
        await admin.list_objects(kc.POOLS, NAMESPACE)
    except kc.ApiError:
        return True
    return False


# -- lifetime defaults ----------------------------------------------------------------------------------


async def test_a_profile_lifetime_is_the_default_of_what_its_pool_serves(
    cluster: RunningCluster, admin: kc.KubeClient, tmp_path: Path
) -> None:
    shape = 'version = 1\nworkspace = "default"\nreplicas = 2\n[environment]\nPOOL = "timed"\n'
    await apply_profile(admin, "wp-timed", shape + "[lifetime]\nttl_seconds = 600\nidle_timeout_seconds = 300\n")
    async with profile_gateway(cluster, tmp_path) as gw:
        generated = (await ready_status(admin, "wp-timed"))[labels.PROFILE_GENERATED]
        pool = await admin.get(kc.POOLS, NAMESPACE, generated)
        assert pool["metadata"]["annotations"][labels.TTL_SECONDS] == "600"
        await wait_pools(gw, lambda r: (p := pool_named(r, generated)) is not None and p.idle >= 2, timeout=45)

        spec = pb.SandboxSpec(environment={"POOL": "timed"})
        served = await gw.create(name="defaulted", spec=spec)
        assert (served.status.allocation, served.status.pool) == ("warm", generated)
        assert served.lifetime.ttl_seconds == 600  # the profile's defaults
        assert served.lifetime.idle_timeout_seconds == 300
        assert 599_000 <= served.lifetime.expires_at_ms - served.created_at_ms <= 601_000
        shown = await gw.get("defaulted")  # what `sandbox get` reads and prints
        assert shown.lifetime == served.lifetime
        assert "(ttl 600 s); after 300 s without an exec" in render.expiry_text(shown.lifetime)

        asked = await gw.create(name="asked", spec=spec, ttl_seconds=30)  # the request wins
        assert (asked.status.allocation, asked.lifetime.ttl_seconds) == ("warm", 30)
        assert asked.lifetime.idle_timeout_seconds == 300

        cold = await gw.create(name="cold")  # no pool: the gateway's default
        assert (cold.status.allocation, cold.lifetime.ttl_seconds) == ("cold", 3600)


# -- storage ----------------------------------------------------------------------------------------------


def _workspace_volume(pod_spec: dict[str, Any]) -> dict[str, Any]:
    (volume,) = [v for v in pod_spec["volumes"] if v["name"] == "workspace"]
    return dict(volume["emptyDir"])


async def test_a_profile_workspace_size_bounds_the_pods_its_pool_serves(
    cluster: RunningCluster, admin: kc.KubeClient, tmp_path: Path
) -> None:
    shape = 'version = 1\nworkspace = "default"\nreplicas = 1\n[environment]\nPOOL = "sized"\n'
    await apply_profile(admin, "wp-sized", shape + '[storage]\nworkspace = "1Gi"\n')
    async with profile_gateway(cluster, tmp_path) as gw:
        generated = (await ready_status(admin, "wp-sized"))[labels.PROFILE_GENERATED]
        template = await admin.get(kc.TEMPLATES, NAMESPACE, generated)
        assert _workspace_volume(template["spec"]["podTemplate"]["spec"]) == {"sizeLimit": "1Gi"}
        await wait_pools(gw, lambda r: (p := pool_named(r, generated)) is not None and p.idle >= 1, timeout=45)

        served = await gw.create(name="sized", spec=pb.SandboxSpec(environment={"POOL": "sized"}))
        assert (served.status.allocation, served.status.pool) == ("warm", generated)
        pods = (await admin.list_objects(kc.PODS, NAMESPACE))["items"]
        members = [p for p in pods if p["metadata"]["name"].startswith(generated)]  # served + refill
        assert members
        assert all(_workspace_volume(p["spec"]) == {"sizeLimit": "1Gi"} for p in members)

        # Removed from the profile: the same pool (storage is not part of the shape), unbounded again.
        await edit_profile(admin, "wp-sized", shape)
        assert (await ready_status(admin, "wp-sized"))[labels.PROFILE_GENERATED] == generated

        async def unbounded() -> bool:
            template = await admin.get(kc.TEMPLATES, NAMESPACE, generated)
            return _workspace_volume(template["spec"]["podTemplate"]["spec"]) == {}

        await until(unbounded)
