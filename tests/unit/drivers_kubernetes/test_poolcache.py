"""The pool cache's informers: a template is read once per resourceVersion, however many pool
events (a readiness change per member) rebuild the index after it."""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import pytest

from warmshell.core import matching
from warmshell.core.fingerprints import SandboxShape, fingerprint
from warmshell.drivers.kubernetes import kube, labels, watching
from warmshell.drivers.kubernetes.warm import poolcache, warmpools

from .fakes import NS, config

Obj = dict[str, Any]
SHAPE = SandboxShape(workspace="team-a", image="img:1", environment={"FOO": "bar"}, cpu_millis=500, memory_bytes=2**30)


class Cluster:
    """Lists from a dict per resource, then watch events pushed by the test."""

    def __init__(self, items: dict[str, list[Obj]]) -> None:
        self.items = items
        self.events: dict[str, asyncio.Queue[Obj]] = {plural: asyncio.Queue() for plural in items}

    async def list(self, resource: kube.Resource, namespace: str, *, label_selector: str = "") -> Obj:
        return {"metadata": {"resourceVersion": "1"}, "items": copy.deepcopy(self.items[resource.plural])}

    async def watch(
        self, resource: kube.Resource, namespace: str, *, resource_version: str, label_selector: str = ""
    ) -> AsyncGenerator[Obj, None]:
        while True:
            yield await self.events[resource.plural].get()


def versioned(obj: Obj, version: str) -> Obj:
    obj = copy.deepcopy(obj)
    obj["metadata"]["resourceVersion"] = version
    return obj


async def settled(cluster: Cluster) -> None:
    for _ in range(100):
        if all(q.empty() for q in cluster.events.values()):
            break
        await asyncio.sleep(0)
    await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def synced_cache(cluster: Cluster) -> AsyncIterator[poolcache.PoolCache]:
    """A pool cache on `cluster`, once both its informers have listed; closed after."""
    cache = poolcache.PoolCache(cluster, NS, watching.Backoff())  # type: ignore[arg-type]
    cache.start()
    try:
        async with asyncio.timeout(5):
            while not cache.synced:
                await asyncio.sleep(0.01)
        yield cache
    finally:
        await cache.aclose()


async def test_a_template_is_read_once_per_version_not_on_every_pool_event(monkeypatch: pytest.MonkeyPatch) -> None:
    template, pool = warmpools.render_pool_pair(config(), name="foo", namespace=NS, shape=SHAPE, replicas=3)
    template, pool = versioned(template, "10"), versioned(pool, "11")
    reads: list[str] = []
    real = warmpools.shape_of_template

    def counted(obj: Any) -> SandboxShape | None:
        reads.append(obj["metadata"]["resourceVersion"])
        return real(obj)

    monkeypatch.setattr(warmpools, "shape_of_template", counted)
    cluster = Cluster({kube.SANDBOX_WARM_POOLS.plural: [pool], kube.SANDBOX_TEMPLATES.plural: [template]})
    async with synced_cache(cluster) as cache:
        for ready in range(1, 4):  # members becoming Ready: a pool status change each
            status = versioned(pool, str(20 + ready))
            status["status"] = {"readyReplicas": ready}
            cluster.events[kube.SANDBOX_WARM_POOLS.plural].put_nowait({"type": "MODIFIED", "object": status})
        await settled(cluster)
        entry = cache.entry("foo")
        assert entry is not None
        assert entry.ready == 3
        assert entry.fingerprint == fingerprint(SHAPE)
        assert reads == ["10"]
        # The same version again (a re-watch replays it): still not read again.
        cluster.events[kube.SANDBOX_TEMPLATES.plural].put_nowait({"type": "MODIFIED", "object": template})
        await settled(cluster)
        assert reads == ["10"]
        # A new version of the template is read, and it changes what the pool serves.
        foreign = versioned(template, "30")
        foreign["spec"]["podTemplate"]["spec"]["containers"][0]["args"] = ["something-else"]
        cluster.events[kube.SANDBOX_TEMPLATES.plural].put_nowait({"type": "MODIFIED", "object": foreign})
        await settled(cluster)
        assert reads == ["10", "30"]
        entry = cache.entry("foo")
        assert entry is not None
        assert entry.shape is None
        assert entry.problem is not None
        assert entry.problem.reason == "TemplateNotOurs"


async def test_a_change_of_a_pools_counts_alone_keeps_the_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """A member's readiness changes the pool's counts only: its entry takes them and the index is
    not rebuilt; any other change of the pool (here its sandboxes' lifetime) rebuilds it."""
    template, pool = warmpools.render_pool_pair(config(), name="foo", namespace=NS, shape=SHAPE, replicas=3)
    builds: list[int] = []
    real = poolcache.index_pools

    def counted(pools: Any, templates: Any) -> list[poolcache.CachedPool]:
        built = real(pools, templates)
        builds.append(len(built))
        return built

    monkeypatch.setattr(poolcache, "index_pools", counted)
    cluster = Cluster({kube.SANDBOX_WARM_POOLS.plural: [pool], kube.SANDBOX_TEMPLATES.plural: [template]})
    async with synced_cache(cluster) as cache:
        built = len(builds)
        for ready in (1, 2, 3, 2):
            status = copy.deepcopy(pool)
            status["status"] = {"readyReplicas": ready}
            cluster.events[kube.SANDBOX_WARM_POOLS.plural].put_nowait({"type": "MODIFIED", "object": status})
        await settled(cluster)
        assert len(builds) == built
        entry = cache.entry("foo")
        assert entry is not None
        assert (entry.desired, entry.ready, entry.ttl_seconds) == (3, 2, None)
        assert cache.match(SHAPE) == matching.Match(entry)  # the index's entry has the counts too
        expiring = copy.deepcopy(status)
        expiring["metadata"].setdefault("annotations", {})[labels.TTL_SECONDS] = "60"
        cluster.events[kube.SANDBOX_WARM_POOLS.plural].put_nowait({"type": "MODIFIED", "object": expiring})
        await settled(cluster)
        assert len(builds) == built + 1
        entry = cache.entry("foo")
        assert entry is not None
        assert (entry.ready, entry.ttl_seconds) == (2, 60)
        matched = cache.match(SHAPE)
        assert isinstance(matched, matching.Match)
        assert matched.pool.ttl_seconds == 60
