"""The timing knobs reach the components: a slow container start delays cold claims, not warm ones."""

from __future__ import annotations

import dataclasses
import time

from ksc_helpers import NS, claim, pool, pool_members, template, wait_for, wait_pool_ready, wait_ready

from kubesim import timing
from kubesim.cluster import running_cluster
from kubesim.controllers import client as kc


async def test_container_start_delay_applies_to_cold_claims_only() -> None:
    slow_start = dataclasses.replace(timing.FAST, container_start_delay=0.5, api_latency=0.002)
    async with running_cluster(timing=slow_start) as cluster:
        api = cluster.client()
        try:
            assert cluster.server.faults.delay_for("create", "pods", "kubesim-admin") == 0.002
            await api.create(kc.TEMPLATES, NS, template())
            await api.create(kc.POOLS, NS, pool(replicas=1))
            await wait_pool_ready(api, "pool", 1)
            start = time.perf_counter()
            await api.create(kc.CLAIMS, NS, claim("warm"))
            await wait_ready(api, kc.CLAIMS, "warm")
            warm_s = time.perf_counter() - start
            # Drain the pool (the replacement member too) so the next claim must start cold.
            await api.patch(kc.POOLS, NS, "pool", {"spec": {"replicas": 0}})
            await wait_for(lambda: pool_members(api), lambda m: m == [], what="pool drained")
            start = time.perf_counter()
            await api.create(kc.CLAIMS, NS, claim("cold"))
            await wait_ready(api, kc.CLAIMS, "cold")
            cold_s = time.perf_counter() - start
        finally:
            await api.aclose()
    assert warm_s < 0.5
    assert cold_s >= 0.5


async def test_a_pods_transitions_within_the_status_window_are_one_status_write() -> None:
    # Two containers start and become ready within the window: one Running-and-Ready report
    # after the first (Pending) one, as a kubelet that learns of them in one relist writes it.
    profile = dataclasses.replace(timing.FAST, status_batch_window=1.0)
    async with running_cluster(timing=profile) as cluster:
        api = cluster.client()
        try:
            two = template(name="two")
            main = two["spec"]["podTemplate"]["spec"]["containers"][0]
            two["spec"]["podTemplate"]["spec"]["containers"].append({**main, "name": "side"})
            await api.create(kc.TEMPLATES, NS, two)
            await api.create(kc.POOLS, NS, pool(replicas=1, template_name="two"))
            await wait_pool_ready(api, "pool", 1)
            (member,) = await pool_members(api)
            name = member["metadata"]["name"]
            pod = await api.get(kc.PODS, NS, name)
            assert [c["ready"] for c in pod["status"]["containerStatuses"]] == [True, True]
            writes = [
                e for e in cluster.server.log.entries if e.resource == "pods/status" and e.name == name and e.code < 300
            ]
            assert len(writes) <= 2, writes
        finally:
            await api.aclose()
