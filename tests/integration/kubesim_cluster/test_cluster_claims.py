"""Claims bind warm pool members (or cold Sandboxes) exactly as agent-sandbox does."""

from __future__ import annotations

import asyncio
import datetime

from ksc_helpers import (
    NS,
    claim,
    condition,
    get_or_none,
    pool,
    pool_members,
    template,
    wait_for,
    wait_gone,
    wait_pool_ready,
    wait_ready,
)

from kubesim.cluster import RunningCluster
from kubesim.controllers import client as kc
from kubesim.controllers.hashing import name_hash


async def setup_pool(api: kc.KubeClient, replicas: int = 2, **tspec: object) -> None:
    await api.create(kc.TEMPLATES, NS, template(**tspec))
    await api.create(kc.POOLS, NS, pool(replicas=replicas))
    await wait_pool_ready(api, "pool", replicas)


async def test_warm_claim_adopts_a_pool_member_and_the_pool_replenishes(
    cluster: RunningCluster, api: kc.KubeClient
) -> None:
    await setup_pool(api)
    members = {m["metadata"]["name"]: m for m in await pool_members(api)}
    created = await api.create(kc.CLAIMS, NS, claim("c1"))
    bound = await wait_ready(api, kc.CLAIMS, "c1")
    name = bound["status"]["sandbox"]["name"]
    assert name in members
    warm = members[name]
    sb = await api.get(kc.SANDBOXES, NS, name)
    # Ready is forwarded verbatim, lastTransitionTime included (it predates the claim).
    ready = condition(bound)
    assert ready["reason"] == "DependenciesReady"
    assert ready["lastTransitionTime"] == condition(warm)["lastTransitionTime"]
    assert ready["observedGeneration"] == created["metadata"]["generation"]
    assert bound["status"]["sandbox"]["podIPs"] == sb["status"]["podIPs"]
    assert bound["metadata"]["annotations"]["agents.x-k8s.io/sandbox-name"] == name

    labels = sb["metadata"]["labels"]
    assert labels["agents.x-k8s.io/claim-uid"] == created["metadata"]["uid"]
    assert labels["agents.x-k8s.io/launch-type"] == "warm"
    assert labels["agents.x-k8s.io/created-by"] == "python-client"
    assert labels["agents.x-k8s.io/sandbox-template-ref-hash"] == name_hash("tmpl")
    for gone in ("warm-pool-sandbox", "sandbox-template-hash", "sandbox-pod-template-hash"):
        assert f"agents.x-k8s.io/{gone}" not in labels
    (owner,) = sb["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("SandboxClaim", "c1", created["metadata"]["uid"])
    ptmeta = sb["spec"]["podTemplate"]["metadata"]
    assert ptmeta["labels"]["agents.x-k8s.io/claim-uid"] == created["metadata"]["uid"]
    assert "cluster-autoscaler.kubernetes.io/safe-to-evict" not in (ptmeta.get("annotations") or {})

    async def pod_relabelled() -> dict[str, str]:
        pod = await api.get(kc.PODS, NS, name)
        return dict(pod["metadata"]["labels"])

    pod_labels = await wait_for(
        pod_relabelled, lambda lab: "agents.x-k8s.io/warm-pool-sandbox" not in lab, what="pod relabelled"
    )
    assert pod_labels["agents.x-k8s.io/created-by"] == "python-client"
    assert pod_labels["agents.x-k8s.io/sandbox-template-ref-hash"] == name_hash("tmpl")
    assert "agents.x-k8s.io/claim-uid" not in pod_labels  # system prefix: never on the Pod
    pod = await api.get(kc.PODS, NS, name)
    assert pod["metadata"]["uid"] == (await api.get(kc.PODS, NS, name))["metadata"]["uid"]
    assert "cluster-autoscaler.kubernetes.io/safe-to-evict" not in pod["metadata"].get("annotations", {})

    await wait_pool_ready(api, "pool", 2)
    assert name not in {m["metadata"]["name"] for m in await pool_members(api)}
    event = await wait_for(lambda: claim_events(api, "c1"), lambda evs: bool(evs), what="SandboxAdopted event")
    assert (event[0]["reason"], event[0]["note"]) == ("SandboxAdopted", f'Adopted warm pool Sandbox "{name}"')


async def test_cold_claim_when_pool_is_empty(cluster: RunningCluster, api: kc.KubeClient) -> None:
    await setup_pool(api, replicas=0)
    created = await api.create(kc.CLAIMS, NS, claim("cold-one"))
    bound = await wait_ready(api, kc.CLAIMS, "cold-one")
    assert bound["status"]["sandbox"]["name"] == "cold-one"
    sb = await api.get(kc.SANDBOXES, NS, "cold-one")
    assert sb["metadata"]["labels"]["agents.x-k8s.io/launch-type"] == "cold"
    assert sb["metadata"]["labels"]["agents.x-k8s.io/claim-uid"] == created["metadata"]["uid"]
    assert sb["metadata"]["annotations"]["agents.x-k8s.io/sandbox-template-ref"] == "tmpl"
    assert sb["metadata"]["ownerReferences"][0]["uid"] == created["metadata"]["uid"]
    pod = await api.get(kc.PODS, NS, "cold-one")
    assert pod["status"]["phase"] == "Running"
    (event,) = await wait_for(lambda: claim_events(api, "cold-one"), lambda evs: bool(evs), what="event")
    assert (event["type"], event["reason"]) == ("Normal", "SandboxProvisioned")
    assert event["note"] == 'Created Sandbox "cold-one"'


async def test_env_forces_cold_and_template_policy_rejects(cluster: RunningCluster, api: kc.KubeClient) -> None:
    await setup_pool(api, replicas=1)
    await api.create(kc.CLAIMS, NS, claim("with-env", env=[{"name": "FOO", "value": "bar"}]))
    rejected = await wait_for(
        lambda: get_or_none(api, kc.CLAIMS, "with-env"),
        lambda c: condition(c).get("reason") == "EnvVarsInjectionRejected",
        what="EnvVarsInjectionRejected",
    )
    assert condition(rejected)["status"] == "False"
    await api.patch(kc.TEMPLATES, NS, "tmpl", {"spec": {"envVarsInjectionPolicy": "Allowed"}})
    await api.delete(kc.CLAIMS, NS, "with-env")
    await wait_gone(api, kc.CLAIMS, "with-env")
    await api.create(kc.CLAIMS, NS, claim("with-env2", env=[{"name": "FOO", "value": "bar"}]))
    bound = await wait_ready(api, kc.CLAIMS, "with-env2")
    assert bound["status"]["sandbox"]["name"] == "with-env2"  # cold although a warm one is Ready
    env = (await api.get(kc.PODS, NS, "with-env2"))["spec"]["containers"][0]["env"]
    assert {"name": "FOO", "value": "bar"} in env
    assert len(await pool_members(api)) == 1


async def test_missing_pool_then_template_reasons_and_recovery(cluster: RunningCluster, api: kc.KubeClient) -> None:
    await api.create(kc.CLAIMS, NS, claim("early"))
    no_pool = await wait_for(
        lambda: get_or_none(api, kc.CLAIMS, "early"),
        lambda c: condition(c).get("reason") == "WarmPoolNotFound",
        what="WarmPoolNotFound",
    )
    assert condition(no_pool)["message"] == 'SandboxWarmPool "pool" not found'
    await api.create(kc.POOLS, NS, pool(replicas=0))
    no_tmpl = await wait_for(
        lambda: get_or_none(api, kc.CLAIMS, "early"),
        lambda c: condition(c).get("reason") == "TemplateNotFound",
        what="TemplateNotFound",
    )
    assert condition(no_tmpl)["message"] == 'SandboxTemplate "tmpl" not found'
    await api.create(kc.TEMPLATES, NS, template())
    bound = await wait_ready(api, kc.CLAIMS, "early")
    assert bound["status"]["sandbox"]["name"] == "early"


async def test_claim_rebinds_when_its_sandbox_is_deleted(cluster: RunningCluster, api: kc.KubeClient) -> None:
    await setup_pool(api, replicas=1)
    await api.create(kc.CLAIMS, NS, claim("c"))
    bound = await wait_ready(api, kc.CLAIMS, "c")
    warm_name = bound["status"]["sandbox"]["name"]
    # The pool's status may still count the adopted member for a moment: wait for its successor.
    await wait_for(
        lambda: api.list_objects(
            kc.SANDBOXES, NS, label_selector=f"agents.x-k8s.io/warm-pool-sandbox={name_hash('pool')}"
        ),
        lambda listed: any(condition(s).get("status") == "True" for s in listed["items"]),
        what="a Ready replenished member",
    )
    await api.delete(kc.SANDBOXES, NS, warm_name)
    rebound = await wait_for(
        lambda: get_or_none(api, kc.CLAIMS, "c"),
        lambda c: (
            condition(c).get("status") == "True"
            and (c or {}).get("status", {}).get("sandbox", {}).get("name") not in (None, warm_name)
        ),
        what="claim re-bound",
    )
    assert rebound["status"]["sandbox"]["name"].startswith("pool-")  # the replenished warm member


async def test_claim_deletion_collects_sandbox_and_pod(cluster: RunningCluster, api: kc.KubeClient) -> None:
    await setup_pool(api, replicas=1)
    await api.create(kc.CLAIMS, NS, claim("c"))
    name = (await wait_ready(api, kc.CLAIMS, "c"))["status"]["sandbox"]["name"]
    await api.delete(kc.CLAIMS, NS, "c")
    await wait_gone(api, kc.SANDBOXES, name)
    await wait_gone(api, kc.PODS, name)


async def claim_events(api: kc.KubeClient, claim_name: str) -> list[dict[str, object]]:
    listed = await api.list_objects(kc.EVENTS_V1, NS)
    return [e for e in listed.get("items") or [] if e.get("regarding", {}).get("name") == claim_name]


def _in(seconds: float) -> str:
    t = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=seconds)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


async def test_claim_shutdown_time_delete_policy(cluster: RunningCluster, api: kc.KubeClient) -> None:
    await setup_pool(api, replicas=0)
    await api.create(kc.CLAIMS, NS, claim("ttl", lifecycle={"shutdownTime": _in(2), "shutdownPolicy": "Delete"}))
    await wait_ready(api, kc.CLAIMS, "ttl")
    await wait_gone(api, kc.CLAIMS, "ttl", within=10)
    await wait_gone(api, kc.SANDBOXES, "ttl")


async def test_claim_shutdown_time_retain_policy(cluster: RunningCluster, api: kc.KubeClient) -> None:
    await setup_pool(api, replicas=0)
    await api.create(kc.CLAIMS, NS, claim("keep", lifecycle={"shutdownTime": _in(2)}))
    await wait_ready(api, kc.CLAIMS, "keep")
    await wait_gone(api, kc.SANDBOXES, "keep", within=10)
    kept = await wait_for(
        lambda: get_or_none(api, kc.CLAIMS, "keep"),
        lambda c: c is not None and "sandbox" not in (c.get("status") or {}),
        what="claim status cleared",
    )
    assert condition(kept)["reason"] == "ClaimExpired"
    assert condition(kept)["message"] == "Claim expired. Sandbox cleanup initiated."


async def test_additional_pod_metadata_reaches_the_adopted_pod(cluster: RunningCluster, api: kc.KubeClient) -> None:
    await setup_pool(api, replicas=1)
    extra = {"labels": {"sandbox.users.io/team": "a"}, "annotations": {"example.com/note": "x"}}
    await api.create(kc.CLAIMS, NS, claim("meta", additionalPodMetadata=extra))
    name = (await wait_ready(api, kc.CLAIMS, "meta"))["status"]["sandbox"]["name"]
    assert name.startswith("pool-")

    async def pod_meta() -> tuple[dict[str, str], dict[str, str]]:
        pod = await api.get(kc.PODS, NS, name)
        return pod["metadata"].get("labels", {}), pod["metadata"].get("annotations", {})

    _labels, annotations = await wait_for(
        pod_meta, lambda m: m[0].get("sandbox.users.io/team") == "a", what="pod metadata propagated"
    )
    assert annotations["example.com/note"] == "x"
    assert "sandbox.users.io/team" in annotations["agents.x-k8s.io/propagated-labels"].split(",")


async def test_invalid_additional_metadata_is_terminal(cluster: RunningCluster, api: kc.KubeClient) -> None:
    await setup_pool(api, replicas=1)
    await api.create(kc.CLAIMS, NS, claim("bad", additionalPodMetadata={"labels": {"evil.io/x": "y"}}))
    bad = await wait_for(
        lambda: get_or_none(api, kc.CLAIMS, "bad"),
        lambda c: condition(c).get("reason") == "InvalidMetadata",
        what="InvalidMetadata",
    )
    assert "sandbox" not in (bad or {}).get("status", {})
    assert len(await pool_members(api)) == 1


async def test_ttl_after_finished_deletes_the_claim(cluster: RunningCluster, api: kc.KubeClient) -> None:
    await api.create(kc.TEMPLATES, NS, template(command=["sh", "-c", "exit 0"]))
    await api.patch(kc.TEMPLATES, NS, "tmpl", {"spec": {"podTemplate": {"spec": {"restartPolicy": "Never"}}}})
    await api.create(kc.POOLS, NS, pool(replicas=0))
    # Watched, not polled: the claim is Finished for only its TTL, which a poll on a loaded host
    # (a late mirror, then a late read) missed, seeing only the deletion.
    since = (await api.list_objects(kc.CLAIMS, NS))["metadata"]["resourceVersion"]
    events: list[kc.Obj] = []

    async def watch() -> None:
        async for event in api.watch(kc.CLAIMS, NS, resource_version=since, timeout_seconds=60):
            if event["object"].get("metadata", {}).get("name") == "job":
                events.append(event)
                if event["type"] == "DELETED":
                    return

    watching = asyncio.create_task(watch())
    try:
        lifecycle = {"ttlSecondsAfterFinished": 1, "shutdownPolicy": "Delete"}
        await api.create(kc.CLAIMS, NS, claim("job", lifecycle=lifecycle))
        await asyncio.wait_for(asyncio.shield(watching), 30)  # a pod's run and the TTL, on a loaded host
    finally:
        watching.cancel()
    finished = [e["object"] for e in events if condition(e["object"], "Finished").get("status") == "True"]
    assert finished, [e["type"] for e in events]
    assert condition(finished[0], "Finished")["reason"] == "PodSucceeded"
    assert condition(finished[0])["reason"] == "PodSucceeded"
    assert events[-1]["type"] == "DELETED"
    await wait_gone(api, kc.SANDBOXES, "job")
