"""A node starts at most ``max_parallel_pod_starts`` pods at a time: a pod holds its node's slot
from its container start until its containers run (those with a readiness probe: until they are
Ready), or one exits, or the start timeout passes."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator

import pytest
from ksc_helpers import NS, get_or_none, is_ready, wait_for

from kubesim import timing
from kubesim.cluster import RunningCluster, running_cluster
from kubesim.controllers import client as kc

Obj = dict[str, object]


def gated_pod(name: str, *, probe_less: int = 0) -> Obj:
    """A pod that runs at once but is Ready only once ``$KUBESIM_POD_ROOT/ready`` exists, with
    ``probe_less`` more containers that have no readiness probe."""
    probe = {"exec": {"command": ["sh", "-c", 'test -f "$KUBESIM_POD_ROOT/ready"']}, "periodSeconds": 0.05}
    container = {"name": "main", "image": "busybox", "command": ["sleep", "3600"], "readinessProbe": probe}
    others = [{"name": f"side-{i}", "image": "busybox", "command": ["sleep", "3600"]} for i in range(probe_less)]
    spec = {"terminationGracePeriodSeconds": 0, "containers": [container, *others]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def probe_less_pod(name: str) -> Obj:
    """A pod of two containers without readiness probes (warmshell's shape)."""
    containers = [{"name": c, "image": "busybox", "command": ["sleep", "3600"]} for c in ("supervisor", "agent")]
    spec = {"terminationGracePeriodSeconds": 0, "containers": containers}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def ready(pods: dict[str, Obj]) -> dict[str, Obj]:
    return {n: p for n, p in pods.items() if is_ready(p)}


def all_containers_running(pod: Obj) -> bool:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []  # type: ignore[union-attr]
    return len(statuses) == 2 and all("running" in (s.get("state") or {}) for s in statuses)


async def phases(api: kc.KubeClient, names: list[str]) -> dict[str, Obj]:
    return {n: obj for n in names if (obj := await get_or_none(api, kc.PODS, n)) is not None}


def running(pods: dict[str, Obj]) -> dict[str, Obj]:
    return {n: p for n, p in pods.items() if (p.get("status") or {}).get("phase") == "Running"}  # type: ignore[union-attr]


def mark_ready(cluster: RunningCluster, pod: Obj) -> None:
    assert cluster.pod_root is not None
    uid = pod["metadata"]["uid"]  # type: ignore[index]
    (directory,) = [p for p in cluster.pod_root.iterdir() if p.name.endswith(uid[:8])]
    (directory / "ready").touch()


@contextlib.asynccontextmanager
async def pods_on(
    timing_: timing.Timing, pods: list[Obj]
) -> AsyncIterator[tuple[RunningCluster, kc.KubeClient, list[str], int]]:
    """A cluster of ``timing_`` with ``pods`` created in order: the cluster, a client, the pods'
    names and the number of nodes."""
    async with running_cluster(timing=timing_) as cluster:
        api = cluster.client()
        try:
            for pod in pods:
                await api.create(kc.PODS, NS, pod)
            assert cluster.components.kubelet is not None
            names = [str(pod["metadata"]["name"]) for pod in pods]  # type: ignore[index]
            yield cluster, api, names, len(cluster.components.kubelet.nodes)
        finally:
            await api.aclose()


ONE_EACH = dataclasses.replace(timing.FAST, max_parallel_pod_starts=1, pod_start_timeout=60.0)


async def test_a_node_starts_one_pod_at_a_time_until_each_is_ready() -> None:
    async with pods_on(ONE_EACH, [gated_pod(f"gated-{i}") for i in range(6)]) as (cluster, api, names, nodes):
        first = await wait_for(lambda: phases(api, names), lambda p: len(running(p)) == nodes, what="one per node")
        await asyncio.sleep(0.5)  # long enough for an unbounded kubelet to start the rest
        still = running(await phases(api, names))
        assert set(still) == set(running(first)), "a pod started while its node's slot was held"
        assert len({p["spec"]["nodeName"] for p in still.values()}) == nodes  # type: ignore[index]
        mark_ready(cluster, next(iter(still.values())))
        later = await wait_for(
            lambda: phases(api, names), lambda p: len(running(p)) == nodes + 1, what="the freed slot used"
        )
        assert len(running(later)) == nodes + 1


async def test_a_pod_without_readiness_probes_gives_its_slot_back_once_its_containers_run() -> None:
    # Readiness 30 s after the start: with the slot held until Ready, one pod per node would run.
    slow_ready = dataclasses.replace(ONE_EACH, readiness_delay=30.0)
    async with pods_on(slow_ready, [probe_less_pod(f"plain-{i}") for i in range(6)]) as (_, api, names, _):
        started = await wait_for(
            lambda: phases(api, names),
            lambda p: len(p) == 6 and all(all_containers_running(pod) for pod in p.values()),
            what="every pod's containers running",
        )
        assert not ready(started), "the pods were Ready: the test did not separate running from Ready"


async def test_a_pod_with_a_probed_container_holds_its_slot_until_that_one_is_ready() -> None:
    mixed = [gated_pod(f"mixed-{i}", probe_less=1) for i in range(6)]
    async with pods_on(ONE_EACH, mixed) as (_, api, names, nodes):
        await wait_for(lambda: phases(api, names), lambda p: len(running(p)) == nodes, what="one per node")
        await asyncio.sleep(0.5)  # long enough for an unbounded kubelet to start the rest
        assert len(running(await phases(api, names))) == nodes, "a probe-less container freed the slot"


async def test_a_pod_that_never_gets_ready_gives_its_slot_back_after_the_start_timeout() -> None:
    short = dataclasses.replace(ONE_EACH, pod_start_timeout=0.3)
    async with pods_on(short, [gated_pod(f"never-{i}") for i in range(6)]) as (_, api, names, _):
        await wait_for(lambda: phases(api, names), lambda p: len(running(p)) == 6, what="all started")


def test_the_bound_is_configurable_from_the_environment() -> None:
    assert timing.profile("default", {"KUBESIM_MAX_PARALLEL_POD_STARTS": "3"}).max_parallel_pod_starts == 3
    assert timing.profile("fast", {}).max_parallel_pod_starts == timing.FAST.max_parallel_pod_starts
    for bad in ("-1", "many"):
        with pytest.raises(ValueError, match=r"KUBESIM_MAX_PARALLEL_POD_STARTS must be an integer >= 0"):
            timing.profile("default", {"KUBESIM_MAX_PARALLEL_POD_STARTS": bad})
