"""The controllers and kubelet in the API server's process (``kubesim.inprocess``) are served by the
same handler as any client: their writes are checked, logged and seen by external watchers, faults
reach them, and the stored objects they share with the store are never edited in place."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from ksc_helpers import NS, claim, pool, template, wait_for, wait_pool_ready, wait_ready

from kubesim.cluster import RunningCluster
from kubesim.controllers import client as kc
from kubesim.inprocess import InProcessClient
from kubesim.jsonwire import dumps

ADMIN = "kubesim-admin"


def _edited_in_place(cluster: RunningCluster) -> list[str]:
    """Stored objects whose cached encoding no longer matches the object: someone holding the
    store's own dict (an informer's consumer) edited it after it was stored."""
    store = cluster.server.store
    found = []
    for (group, plural), bucket in store._buckets.items():
        # Earlier versions too (the watch window's): a status write shares what it leaves unchanged.
        versions = [*bucket.objects.values(), *(s for e in bucket.events for s in (e.new, e.old) if s is not None)]
        for stored in versions:
            for api_version, encoded in stored._json.items():
                if encoded != dumps({**stored.obj, "apiVersion": api_version}):
                    found.append(f"{group}/{plural} {stored.obj['metadata']['name']}")
    return found


async def test_a_warm_claim_leaves_every_stored_object_as_it_was_written(
    cluster: RunningCluster, api: kc.KubeClient
) -> None:
    store = cluster.server.store
    await api.create(kc.TEMPLATES, NS, template())
    await api.create(kc.POOLS, NS, pool(replicas=2))
    await wait_pool_ready(api, "pool", 2)
    # Encode every object now (as a GET or a watcher would), so a later in-place edit shows.
    for bucket in list(store._buckets.values()):
        for stored in [*bucket.objects.values(), *(e.new for e in bucket.events)]:
            stored.encoded()
    await api.create(kc.CLAIMS, NS, claim("c1"))
    await wait_ready(api, kc.CLAIMS, "c1")
    await wait_pool_ready(api, "pool", 2)
    await api.delete(kc.CLAIMS, NS, "c1")
    await wait_pool_ready(api, "pool", 2)
    assert _edited_in_place(cluster) == []


async def test_the_controllers_writes_are_logged_and_seen_by_an_external_watch(
    cluster: RunningCluster, api: kc.KubeClient
) -> None:
    await api.create(kc.TEMPLATES, NS, template())
    listed = await api.list_objects(kc.CLAIMS, NS)
    seen: list[kc.Obj] = []

    async def watch() -> None:
        rv = listed["metadata"]["resourceVersion"]
        async for event in api.watch(kc.CLAIMS, NS, resource_version=rv, timeout_seconds=30):
            seen.append(event)

    watching = asyncio.create_task(watch())
    try:
        await api.create(kc.POOLS, NS, pool(replicas=1))
        await wait_pool_ready(api, "pool", 1)
        cluster.server.log.clear()
        await api.create(kc.CLAIMS, NS, claim("c1"))
        await wait_ready(api, kc.CLAIMS, "c1")

        def bound_seen() -> bool:
            return any((e["object"].get("status") or {}).get("sandbox") for e in seen)

        await wait_for(lambda: asyncio.sleep(0.01, bound_seen()), bool, what="the claim's status on the watch")
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
    assert cluster.server.log.count(user=ADMIN, resource="sandboxclaims.extensions.agents.x-k8s.io/status") >= 1


async def test_faults_and_an_offline_server_reach_the_in_process_client(cluster: RunningCluster) -> None:
    server = cluster.server
    client = InProcessClient(server, server.admin_token)
    server.faults.fail_next(1, code=403, verb="get", resource="namespaces", user=ADMIN)
    with pytest.raises(kc.ApiError) as refused:
        await client.get(kc.NAMESPACES, None, NS)
    assert refused.value.status == 403
    assert (await client.get(kc.NAMESPACES, None, NS))["metadata"]["name"] == NS
    await server.go_offline(0.5)
    with pytest.raises(aiohttp.ClientConnectionError):
        await client._exchange("GET", kc.NAMESPACES.path(None, NS), None, None, "")
    await wait_for(lambda: asyncio.sleep(0.05, server.online), bool, what="back online")
    assert (await client.get(kc.NAMESPACES, None, NS))["metadata"]["name"] == NS


async def test_an_unknown_token_is_refused_in_process_too(cluster: RunningCluster) -> None:
    client = InProcessClient(cluster.server, "not-a-token")
    with pytest.raises(kc.ApiError) as refused:
        await client.get(kc.NAMESPACES, None, NS)
    assert refused.value.status == 401


async def test_a_status_write_answers_with_the_stored_object_and_any_other_write_with_a_copy(
    cluster: RunningCluster,
) -> None:
    api = InProcessClient(cluster.server, cluster.server.admin_token)
    bucket = cluster.server.store.bucket("", "pods")
    # Bound to a node no kubelet runs: nothing but this test writes it.
    body = {"metadata": {"name": "p"}, "spec": {"nodeName": "elsewhere", "containers": [{"name": "c", "image": "i"}]}}
    await api.create(kc.PODS, NS, body)
    status = await api.patch(kc.PODS, NS, "p", {"status": {"message": "m"}}, sub="status")
    assert any(e.new.obj is status for e in bucket.events)  # read-only, as a watch event's object
    labelled = await api.patch(kc.PODS, NS, "p", {"metadata": {"labels": {"a": "b"}}})
    assert labelled["metadata"]["labels"] == {"a": "b"}
    assert labelled["status"]["message"] == "m"
    assert not any(e.new.obj is labelled for e in bucket.events)
