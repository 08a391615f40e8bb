"""The Kubernetes driver alone against kubesim: create, identity, get/list/watch, delete, faults."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from kubesim.cluster import RunningCluster
from kubesim.controllers import client as kc
from warmshell.core.errors import AlreadyExistsError, PermissionDeniedError, UnavailableError
from warmshell.core.ids import SandboxId
from warmshell.core.models import SandboxSpec
from warmshell.drivers.base import BackendState, Bound, CreateRequest
from warmshell.drivers.events import Subscription
from warmshell.drivers.kubernetes import KubernetesDriver, kube

from .conftest import BROKEN_IMAGE, NAMESPACE
from .waiting import next_event

USER = "kubesim-user"  # the driver's kubeconfig user; controllers run as admin and are not faulted
SANDBOXES = "sandboxes.agents.x-k8s.io"  # the resource label in kubesim's request log and fault rules


def request(name: str, sandbox_id: str = "", image: str = "", proof: str = "proof-of-") -> CreateRequest:
    return CreateRequest(
        sandbox_id=SandboxId(sandbox_id or f"id-{name}"),
        name=name,
        workspace="default",
        spec=SandboxSpec(image=image),
        activation_proof=proof + name,
    )


@contextlib.asynccontextmanager
async def watching(driver: KubernetesDriver) -> AsyncIterator[Subscription]:
    events = driver.watch()
    try:
        yield events
    finally:
        await events.aclose()


def running(sandbox_id: str) -> Any:
    return lambda e: e.sandbox_id == sandbox_id and e.sandbox is not None and e.sandbox.state == BackendState.RUNNING


def token_file(cluster: RunningCluster, pod: dict[str, Any]) -> Path:
    meta = pod["metadata"]
    assert cluster.pod_root is not None
    pod_dir = cluster.pod_root / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"
    return pod_dir / ".volumes" / "warmshell-token" / "token"


async def test_create_runs_a_pod_whose_token_identifies_it_as_bound(
    driver: KubernetesDriver, cluster: RunningCluster, admin: kc.KubeClient
) -> None:
    async with watching(driver) as events:
        created = await driver.create(request("one"))
        assert created.state == BackendState.PENDING
        assert created.created_us > 0
        up = await next_event(events, running("id-one"))
    assert up.sandbox is not None
    pod = await admin.get(kc.PODS, NAMESPACE, "default--one")
    assert up.sandbox.instance_id == pod["metadata"]["uid"]
    identity = await driver.identity.authenticate(token_file(cluster, pod).read_text().strip())
    assert identity is not None
    assert identity.instance_id == pod["metadata"]["uid"]
    assert identity.binding == Bound(SandboxId("id-one"), "proof-of-one")


async def test_a_token_for_another_audience_is_refused(driver: KubernetesDriver, admin: kc.KubeClient) -> None:
    async with watching(driver) as events:
        await driver.create(request("aud"))
        await next_event(events, running("id-aud"))
    pod = await admin.get(kc.PODS, NAMESPACE, "default--aud")
    issued = await admin.request_token(
        NAMESPACE, "warmshell-sandbox", audiences=["https://kubernetes.default.svc"], expiration_seconds=600, pod=pod
    )
    with pytest.raises(PermissionDeniedError, match="not authenticated"):
        await driver.identity.authenticate(issued["token"])


async def test_a_token_of_a_deleted_pod_is_refused(
    driver: KubernetesDriver, cluster: RunningCluster, admin: kc.KubeClient
) -> None:
    async with watching(driver) as events:
        await driver.create(request("gone"))
        await next_event(events, running("id-gone"))
        pod = await admin.get(kc.PODS, NAMESPACE, "default--gone")
        token = token_file(cluster, pod).read_text().strip()
        assert await driver.delete(SandboxId("id-gone"))
        await next_event(events, lambda e: e.sandbox_id == "id-gone" and e.deleted)
    with contextlib.suppress(kc.ApiError):
        await admin.delete(kc.PODS, NAMESPACE, "default--gone", grace_period=0)
    with pytest.raises(PermissionDeniedError):
        await driver.identity.authenticate(token)


async def test_create_is_idempotent_by_name_and_refuses_a_foreign_owner(
    driver: KubernetesDriver, cluster: RunningCluster
) -> None:
    first = await driver.create(request("same"))
    again = await driver.create(request("same"))
    assert again.sandbox_id == first.sandbox_id
    assert [v.sandbox_id for v in await driver.list()] == ["id-same"]
    with pytest.raises(AlreadyExistsError, match="belongs to another sandbox"):
        await driver.create(request("same", sandbox_id="id-intruder"))
    assert cluster.server.log.count(verb="create", resource=SANDBOXES, user=USER) == 3


async def test_get_and_list_see_only_labelled_sandboxes(driver: KubernetesDriver, admin: kc.KubeClient) -> None:
    await driver.create(request("mine"))
    foreign = {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {"name": "foreign", "labels": {"warmshell.dev/sandbox-id": "id-foreign"}},
        "spec": {"podTemplate": {"spec": {"containers": [{"name": "c", "image": "busybox", "command": ["true"]}]}}},
    }
    await admin.create(kc.SANDBOXES, NAMESPACE, foreign)
    assert [v.sandbox_id for v in await driver.list()] == ["id-mine"]
    assert await driver.get(SandboxId("id-foreign")) is None
    assert await driver.get(SandboxId("id-unknown")) is None
    found = await driver.get(SandboxId("id-mine"))
    assert found is not None
    assert found.sandbox_id == "id-mine"


async def test_delete_carries_the_uid_and_spares_a_replacement(driver: KubernetesDriver, admin: kc.KubeClient) -> None:
    await driver.create(request("swap"))
    stale = await admin.get(kc.SANDBOXES, NAMESPACE, "default--swap")
    await admin.delete(kc.SANDBOXES, NAMESPACE, "default--swap")
    await driver.create(request("swap"))  # the same sandbox, recreated: a new uid
    resource = await driver.api.sandbox_resource(NAMESPACE)
    with pytest.raises(kube.Conflict):
        await driver.api.delete(resource, NAMESPACE, "default--swap", uid=stale["metadata"]["uid"])
    assert await driver.get(SandboxId("id-swap")) is not None
    assert await driver.delete(SandboxId("id-swap"))
    assert await driver.get(SandboxId("id-swap")) is None
    assert not await driver.delete(SandboxId("id-swap"))


async def test_a_failing_container_fails_the_sandbox_with_its_exit(driver: KubernetesDriver) -> None:
    async with watching(driver) as events:
        await driver.create(request("broken", image=BROKEN_IMAGE))
        failed = await next_event(events, lambda e: e.sandbox is not None and e.sandbox.state == BackendState.FAILED)
    assert failed.sandbox is not None
    assert "exited with code 3" in failed.sandbox.message
    conditions = {c.type: c for c in failed.sandbox.conditions}
    assert conditions["ContainerRunning"].status == "False"


async def test_pod_events_become_progress_lines(driver: KubernetesDriver, admin: kc.KubeClient) -> None:
    async with watching(driver) as events:
        await driver.create(request("evt"))
        await next_event(events, lambda e: e.progress is not None and e.progress.reason == "Created")
        await next_event(events, running("id-evt"))
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": "default--evt.1"},
            "involvedObject": {"kind": "Pod", "name": "default--evt", "namespace": NAMESPACE},
            "reason": "Pulling",
            "message": 'Pulling image "ghcr.io/warmshell/warmshell:test"',
            "type": "Normal",
        }
        await admin.create(kc.EVENTS, NAMESPACE, event)
        line = await next_event(events, lambda e: e.progress is not None and e.progress.reason == "Pulling")
    assert line.sandbox_id == "id-evt"
    assert line.progress is not None
    assert "Pulling image" in line.progress.message


async def test_the_watch_relists_after_410_and_resumes_after_a_drop(
    driver: KubernetesDriver, cluster: RunningCluster
) -> None:
    async with watching(driver) as events:
        await driver.create(request("w1"))
        await next_event(events, running("id-w1"))
        # History compacted and every watch closed: resuming gets 410, the informers relist.
        cluster.server.compact()
        cluster.server.close_watches()
        await driver.create(request("w2"))
        await next_event(events, running("id-w2"))
        lists_before = cluster.server.log.count(verb="list", resource=SANDBOXES, user=USER)
        cluster.server.close_watches()  # a plain drop resumes from the last version, no relist
        assert await driver.delete(SandboxId("id-w1"))
        await next_event(events, lambda e: e.sandbox_id == "id-w1" and e.deleted)
        assert cluster.server.log.count(verb="list", resource=SANDBOXES, user=USER) == lists_before + 1  # delete's


async def test_500s_during_create_are_settled_by_reading_back(
    driver: KubernetesDriver, cluster: RunningCluster
) -> None:
    cluster.server.faults.fail_next(1, code=500, verb="create", resource=SANDBOXES, user=USER)
    created = await driver.create(request("r500"))
    assert created.sandbox_id == "id-r500"
    # One failed create, one read back (404), one successful create.
    assert cluster.server.log.count(verb="create", resource=SANDBOXES, user=USER) == 2
    assert [v.sandbox_id for v in await driver.list()] == ["id-r500"]


async def test_429s_during_create_are_retried_after_retry_after(
    driver: KubernetesDriver, cluster: RunningCluster
) -> None:
    cluster.server.faults.fail_next(2, code=429, verb="create", resource=SANDBOXES, user=USER, retry_after=0)
    await driver.create(request("r429"))
    assert cluster.server.log.count(verb="create", resource=SANDBOXES, user=USER) == 3


async def test_an_outcome_that_cannot_be_settled_is_unavailable(
    driver: KubernetesDriver, cluster: RunningCluster
) -> None:
    await driver.list()  # the Sandbox API version is probed before the outage
    cluster.server.faults.fail_next(100, code=500, resource=SANDBOXES, user=USER)
    with pytest.raises(UnavailableError, match="outcome unknown"):
        await driver.create(request("unknown"))
    cluster.server.faults.clear()
    assert await driver.list() == []


async def test_500s_and_429s_during_delete_are_retried(driver: KubernetesDriver, cluster: RunningCluster) -> None:
    await driver.create(request("del"))
    cluster.server.faults.fail_next(1, code=500, verb="delete", resource=SANDBOXES, user=USER)
    cluster.server.faults.fail_next(1, code=429, verb="delete", resource=SANDBOXES, user=USER, retry_after=0)
    assert await driver.delete(SandboxId("id-del"))
    assert await driver.get(SandboxId("id-del")) is None


async def test_merge_patches_reach_custom_resources(driver: KubernetesDriver, admin: kc.KubeClient) -> None:
    await driver.create(request("patched"))
    resource = await driver.api.sandbox_resource(NAMESPACE)
    patched = await driver.api.merge_patch(
        resource, NAMESPACE, "default--patched", {"metadata": {"labels": {"example.com/tier": "gold"}}}
    )
    assert patched["metadata"]["labels"]["example.com/tier"] == "gold"
    assert patched["metadata"]["labels"]["warmshell.dev/sandbox-id"] == "id-patched"  # merged, not replaced


async def test_every_call_is_bounded_by_the_api_timeout(cluster: RunningCluster, tmp_path: Path) -> None:
    from warmshell.core.config import StatePaths

    from .conftest import driver_config

    state = tmp_path / "slow"
    settings = driver_config(cluster, state, api_timeout_seconds=0.2, retry_delays_seconds=[0.0])
    async with KubernetesDriver(settings, StatePaths(state)) as slow:
        await slow.list()
        cluster.server.faults.add_latency(5.0, verb="list", user=USER)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(UnavailableError, match=r"no answer within 0\.2s"):
            await slow.list()
        assert loop.time() - started < 2.0
        cluster.server.faults.clear()
