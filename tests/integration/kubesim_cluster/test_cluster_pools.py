"""Warm pools fill with Sandboxes of the upstream shape, report status, scale and recreate."""

from __future__ import annotations

from ksc_helpers import NS, condition, get_or_none, items, pool, pool_members, template, wait_for, wait_pool_ready

from kubesim.cluster import RunningCluster
from kubesim.controllers import client as kc
from kubesim.controllers.hashing import name_hash


async def test_pool_fills_with_upstream_shaped_sandboxes_and_pods(cluster: RunningCluster, api: kc.KubeClient) -> None:
    await api.create(kc.TEMPLATES, NS, template())
    await api.create(kc.POOLS, NS, pool(replicas=3))
    status = (await wait_pool_ready(api, "pool", 3))["status"]
    created = await api.get(kc.POOLS, NS, "pool")
    assert status["selector"] == f"agents.x-k8s.io/warm-pool-sandbox={name_hash('pool')}"
    assert status["observedGeneration"] == created["metadata"]["generation"]
    tmpl = await api.get(kc.TEMPLATES, NS, "tmpl")
    assert tmpl["metadata"]["labels"]["agents.x-k8s.io/sandbox-template-ref-hash"] == name_hash("tmpl")

    members = await pool_members(api)
    assert len(members) == 3
    for sb in members:
        meta = sb["metadata"]
        assert meta["name"].startswith("pool-")
        assert len(meta["name"]) == len("pool-") + 5
        assert meta["labels"]["agents.x-k8s.io/launch-type"] == "warm"
        assert meta["labels"]["agents.x-k8s.io/created-by"] == "controller"
        assert meta["annotations"]["agents.x-k8s.io/sandbox-template-ref"] == "tmpl"
        assert meta["annotations"]["agents.x-k8s.io/pod-name"] == meta["name"]
        (owner,) = meta["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("SandboxWarmPool", "pool", created["metadata"]["uid"])
        assert owner["controller"] is True
        assert sb["spec"]["operatingMode"] == "Running"
        assert sb["spec"]["shutdownPolicy"] == "Retain"
        ready = condition(sb)
        assert (ready["status"], ready["reason"], ready["message"]) == ("True", "DependenciesReady", "Pod is Ready")
        assert condition(sb, "Suspended")["reason"] == "NotSuspended"
        assert condition(sb, "PodScheduled")["status"] == "True"
        assert sb["status"]["selector"] == f"agents.x-k8s.io/sandbox-name-hash={name_hash(meta['name'])}"
        assert sb["status"]["podIPs"]
        assert sb["status"]["nodeName"].startswith("kubesim-node-")

        pod = await api.get(kc.PODS, NS, meta["name"])
        assert pod["status"]["phase"] == "Running"
        assert pod["status"]["podIPs"] == [{"ip": sb["status"]["podIPs"][0]}]
        assert pod["metadata"]["labels"] == {
            "app": "agent",
            "agents.x-k8s.io/sandbox-name-hash": name_hash(meta["name"]),
            "agents.x-k8s.io/warm-pool-sandbox": name_hash("pool"),
            "agents.x-k8s.io/sandbox-template-ref-hash": name_hash("tmpl"),
            "agents.x-k8s.io/created-by": "controller",
        }
        assert pod["metadata"]["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "true"
        (pod_owner,) = pod["metadata"]["ownerReferences"]
        assert (pod_owner["kind"], pod_owner["uid"]) == ("Sandbox", meta["uid"])


async def test_missing_template_creates_nothing_until_it_appears(cluster: RunningCluster, api: kc.KubeClient) -> None:
    await api.create(kc.POOLS, NS, pool(replicas=2))
    created = await wait_for(
        lambda: get_or_none(api, kc.POOLS, "pool"),
        lambda p: ((p or {}).get("status") or {}).get("observedGeneration") == 1,
        what="pool status",
    )
    assert created is not None
    assert created["status"]["replicas"] == 0
    assert await pool_members(api) == []
    await api.create(kc.TEMPLATES, NS, template())
    await wait_pool_ready(api, "pool", 2)


async def test_scale_subresource_and_scale_down(cluster: RunningCluster, api: kc.KubeClient) -> None:
    await api.create(kc.TEMPLATES, NS, template())
    await api.create(kc.POOLS, NS, pool(replicas=1))
    await wait_pool_ready(api, "pool", 1)
    scale = await api.get(kc.POOLS, NS, "pool/scale")
    scale["spec"]["replicas"] = 4
    await api.request("PUT", kc.POOLS.path(NS, "pool", "scale"), body=scale)
    await wait_pool_ready(api, "pool", 4)
    await api.patch(kc.POOLS, NS, "pool", {"spec": {"replicas": 2}})
    await wait_pool_ready(api, "pool", 2)
    await wait_for(lambda: pool_members(api), lambda m: len(m) == 2, what="surplus deleted")


async def test_recreate_strategy_replaces_stale_members(cluster: RunningCluster, api: kc.KubeClient) -> None:
    await api.create(kc.TEMPLATES, NS, template())
    await api.create(kc.POOLS, NS, pool(replicas=2, updateStrategy={"type": "Recreate"}))
    await wait_pool_ready(api, "pool", 2)
    before = {m["metadata"]["name"] for m in await pool_members(api)}
    patch = {
        "spec": {
            "podTemplate": {
                "spec": {"containers": [{"name": "main", "image": "busybox:1.37", "command": ["sleep", "3601"]}]}
            }
        }
    }
    await api.patch(kc.TEMPLATES, NS, "tmpl", patch)

    async def fresh_ready() -> list[str]:
        members = await pool_members(api)
        return [m["metadata"]["name"] for m in members if condition(m).get("status") == "True"]

    names = await wait_for(
        fresh_ready, lambda n: len(n) == 2 and not set(n) & before, what="members recreated", within=30
    )
    for name in names:
        sb = await api.get(kc.SANDBOXES, NS, name)
        assert sb["spec"]["podTemplate"]["spec"]["containers"][0]["image"] == "busybox:1.37"


async def test_on_replenish_keeps_stale_members(cluster: RunningCluster, api: kc.KubeClient) -> None:
    await api.create(kc.TEMPLATES, NS, template())
    await api.create(kc.POOLS, NS, pool(replicas=2))
    await wait_pool_ready(api, "pool", 2)
    before = {m["metadata"]["uid"] for m in await pool_members(api)}
    await api.patch(
        kc.TEMPLATES,
        NS,
        "tmpl",
        {
            "spec": {
                "podTemplate": {
                    "spec": {"containers": [{"name": "main", "image": "busybox:1.37", "command": ["sleep", "3601"]}]}
                }
            }
        },
    )
    # Wait for the template controller to see the edit (it re-labels nothing, so watch the pool).
    await wait_pool_ready(api, "pool", 2)
    assert {m["metadata"]["uid"] for m in await pool_members(api)} == before


async def test_pool_deletion_collects_its_unclaimed_sandboxes(cluster: RunningCluster, api: kc.KubeClient) -> None:
    await api.create(kc.TEMPLATES, NS, template())
    await api.create(kc.POOLS, NS, pool(replicas=2))
    await wait_pool_ready(api, "pool", 2)
    await api.delete(kc.POOLS, NS, "pool")
    await wait_for(lambda: items(api, kc.SANDBOXES), lambda s: s == [], what="sandboxes collected")
    await wait_for(lambda: items(api, kc.PODS), lambda p: p == [], what="pods collected")


async def test_template_network_policy_managed_then_unmanaged(cluster: RunningCluster, api: kc.KubeClient) -> None:
    created = await api.create(kc.TEMPLATES, NS, template())
    policy = await wait_for(
        lambda: get_or_none(api, kc.NETWORKPOLICIES, "tmpl-network-policy"), lambda p: p is not None, what="policy"
    )
    assert policy is not None
    assert policy["spec"]["podSelector"] == {
        "matchLabels": {"agents.x-k8s.io/sandbox-template-ref-hash": name_hash("tmpl")}
    }
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert policy["metadata"]["ownerReferences"][0]["uid"] == created["metadata"]["uid"]
    await api.patch(kc.TEMPLATES, NS, "tmpl", {"spec": {"networkPolicyManagement": "Unmanaged"}})
    await wait_for(
        lambda: get_or_none(api, kc.NETWORKPOLICIES, "tmpl-network-policy"), lambda p: p is None, what="policy gone"
    )
