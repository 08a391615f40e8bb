"""The Sandbox controller: Pod per Sandbox, status, recreation, suspend/resume, expiry."""

from __future__ import annotations

import datetime

from ksc_helpers import NS, condition, get_or_none, items, sandbox, wait_for, wait_gone, wait_ready

from kubesim.cluster import RunningCluster
from kubesim.controllers import client as kc
from kubesim.controllers.hashing import name_hash


async def test_bare_sandbox_gets_its_pod_and_status(cluster: RunningCluster, api: kc.KubeClient) -> None:
    created = await api.create(kc.SANDBOXES, NS, sandbox("box"))
    sb = await wait_ready(api, kc.SANDBOXES, "box")
    assert sb["metadata"]["annotations"]["agents.x-k8s.io/pod-name"] == "box"
    assert sb["status"]["selector"] == f"agents.x-k8s.io/sandbox-name-hash={name_hash('box')}"
    types = [c["type"] for c in sb["status"]["conditions"]]
    assert types == ["PodScheduled", "Ready", "Suspended"]
    for cond in sb["status"]["conditions"]:
        assert cond["observedGeneration"] == created["metadata"]["generation"]
    pod = await api.get(kc.PODS, NS, "box")
    assert pod["metadata"]["labels"] == {"app": "agent", "agents.x-k8s.io/sandbox-name-hash": name_hash("box")}
    assert pod["metadata"]["annotations"]["agents.x-k8s.io/propagated-labels"] == "app"
    assert pod["metadata"]["ownerReferences"][0]["uid"] == created["metadata"]["uid"]
    assert pod["spec"]["nodeName"] == sb["status"]["nodeName"]


async def test_deleted_pod_is_recreated_with_the_same_name(cluster: RunningCluster, api: kc.KubeClient) -> None:
    await api.create(kc.SANDBOXES, NS, sandbox("box"))
    await wait_ready(api, kc.SANDBOXES, "box")
    old = await api.get(kc.PODS, NS, "box")
    await api.delete(kc.PODS, NS, "box")

    async def pod_uid() -> str | None:
        pod = await get_or_none(api, kc.PODS, "box")
        return pod["metadata"]["uid"] if pod and not pod["metadata"].get("deletionTimestamp") else None

    await wait_for(pod_uid, lambda uid: uid not in (None, old["metadata"]["uid"]), what="pod recreated")
    await wait_ready(api, kc.SANDBOXES, "box")


async def test_suspend_and_resume(cluster: RunningCluster, api: kc.KubeClient) -> None:
    await api.create(kc.SANDBOXES, NS, sandbox("box"))
    await wait_ready(api, kc.SANDBOXES, "box")
    await api.patch(kc.SANDBOXES, NS, "box", {"spec": {"operatingMode": "Suspended"}})
    suspended = await wait_for(
        lambda: get_or_none(api, kc.SANDBOXES, "box"),
        lambda s: condition(s, "Suspended").get("status") == "True",
        what="suspended",
    )
    assert suspended is not None
    assert condition(suspended, "Suspended")["reason"] == "PodTerminated"
    assert (condition(suspended)["reason"], condition(suspended)["message"]) == (
        "SandboxSuspended",
        "Sandbox is suspended",
    )
    assert "podIPs" not in suspended["status"]
    assert "nodeName" not in suspended["status"]
    assert "agents.x-k8s.io/pod-name" not in suspended["metadata"].get("annotations", {})
    assert await get_or_none(api, kc.PODS, "box") is None
    await api.patch(kc.SANDBOXES, NS, "box", {"spec": {"operatingMode": "Running"}})
    resumed = await wait_ready(api, kc.SANDBOXES, "box")
    assert condition(resumed, "Suspended")["reason"] == "NotSuspended"


VCT = {
    "metadata": {"name": "data"},
    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
}


async def test_a_suspended_sandbox_keeps_its_volume_claims_and_its_new_pod_mounts_them(
    cluster: RunningCluster, api: kc.KubeClient
) -> None:
    await api.create(kc.SANDBOXES, NS, sandbox("box", volumeClaimTemplates=[VCT]))
    await wait_ready(api, kc.SANDBOXES, "box")
    claim = await api.get(kc.PVCS, NS, "data-box")
    first = await api.get(kc.PODS, NS, "box")
    await api.patch(kc.SANDBOXES, NS, "box", {"spec": {"operatingMode": "Suspended"}})
    await wait_gone(api, kc.PODS, "box")
    assert (await api.get(kc.PVCS, NS, "data-box"))["metadata"]["uid"] == claim["metadata"]["uid"]
    await api.patch(kc.SANDBOXES, NS, "box", {"spec": {"operatingMode": "Running"}})
    await wait_ready(api, kc.SANDBOXES, "box")
    second = await api.get(kc.PODS, NS, "box")
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    mounted = [
        v["persistentVolumeClaim"]["claimName"] for v in second["spec"]["volumes"] if "persistentVolumeClaim" in v
    ]
    assert mounted == ["data-box"]


async def test_a_sandbox_created_suspended_has_its_volume_claims_and_no_pod(
    cluster: RunningCluster, api: kc.KubeClient
) -> None:
    await api.create(kc.SANDBOXES, NS, sandbox("box", volumeClaimTemplates=[VCT], operatingMode="Suspended"))
    suspended = await wait_for(
        lambda: get_or_none(api, kc.SANDBOXES, "box"),
        lambda s: condition(s, "Suspended").get("status") == "True",
        what="suspended",
    )
    assert condition(suspended, "Suspended")["reason"] == "PodTerminated"
    claim = await wait_for(lambda: get_or_none(api, kc.PVCS, "data-box"), lambda c: c is not None, what="the PVC")
    assert claim["metadata"]["ownerReferences"][0]["uid"] == suspended["metadata"]["uid"]
    assert await get_or_none(api, kc.PODS, "box") is None


def _in(seconds: float) -> str:
    t = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=seconds)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


async def test_shutdown_time_with_delete_policy_removes_the_sandbox(
    cluster: RunningCluster, api: kc.KubeClient
) -> None:
    await api.create(kc.SANDBOXES, NS, sandbox("box", shutdownTime=_in(2), shutdownPolicy="Delete"))
    await wait_ready(api, kc.SANDBOXES, "box")
    await wait_gone(api, kc.SANDBOXES, "box", within=10)
    await wait_gone(api, kc.PODS, "box")


async def test_shutdown_time_with_retain_policy_keeps_conditions_only(
    cluster: RunningCluster, api: kc.KubeClient
) -> None:
    await api.create(kc.SANDBOXES, NS, sandbox("box", shutdownTime=_in(2)))
    await wait_ready(api, kc.SANDBOXES, "box")
    expired = await wait_for(
        lambda: get_or_none(api, kc.SANDBOXES, "box"),
        lambda s: (
            s is not None
            and set(s.get("status", {})) == {"conditions"}
            and condition(s).get("reason") == "SandboxExpired"
        ),
        within=10,
        what="expired",
    )
    assert expired is not None
    assert condition(expired)["message"] == "Sandbox has expired"
    await wait_gone(api, kc.PODS, "box")


async def test_terminal_pod_finishes_the_sandbox(cluster: RunningCluster, api: kc.KubeClient) -> None:
    body = sandbox("job", command=["sh", "-c", "exit 0"])
    body["spec"]["podTemplate"]["spec"]["restartPolicy"] = "Never"
    await api.create(kc.SANDBOXES, NS, body)
    done = await wait_for(
        lambda: get_or_none(api, kc.SANDBOXES, "job"),
        lambda s: condition(s, "Finished").get("status") == "True",
        what="finished",
    )
    assert condition(done, "Finished")["reason"] == "PodSucceeded"
    assert (condition(done)["status"], condition(done)["reason"]) == ("False", "PodSucceeded")
    pods = await items(api, kc.PODS)
    assert [p["status"]["phase"] for p in pods] == ["Succeeded"]


async def test_volume_claim_templates_get_owned_pvcs(cluster: RunningCluster, api: kc.KubeClient) -> None:
    vct = {
        "metadata": {"name": "data", "labels": {"tier": "disk"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    created = await api.create(kc.SANDBOXES, NS, sandbox("box", volumeClaimTemplates=[vct]))
    await wait_ready(api, kc.SANDBOXES, "box")
    pvc = await api.get(kc.PVCS, NS, "data-box")
    assert pvc["metadata"]["labels"] == {"tier": "disk", "agents.x-k8s.io/sandbox-name-hash": name_hash("box")}
    assert pvc["metadata"]["ownerReferences"][0]["uid"] == created["metadata"]["uid"]
    pod = await api.get(kc.PODS, NS, "box")
    assert {"name": "data", "persistentVolumeClaim": {"claimName": "data-box"}} in pod["spec"]["volumes"]


async def test_kubelet_registers_ready_nodes(cluster: RunningCluster, api: kc.KubeClient) -> None:
    nodes = (await api.list_objects(kc.NODES))["items"]
    assert sorted(n["metadata"]["name"] for n in nodes) == ["kubesim-node-0", "kubesim-node-1", "kubesim-node-2"]
    for node in nodes:
        assert condition(node)["status"] == "True"


async def test_foreign_pod_with_the_sandbox_name_is_a_reconciler_error(
    cluster: RunningCluster, api: kc.KubeClient
) -> None:
    foreign = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "box"},
        "spec": {"containers": [{"name": "c", "image": "busybox", "command": ["sleep", "3600"]}]},
    }
    await api.create(kc.PODS, NS, foreign)
    await api.create(kc.SANDBOXES, NS, sandbox("box"))
    failed = await wait_for(
        lambda: get_or_none(api, kc.SANDBOXES, "box"),
        lambda s: condition(s).get("reason") == "ReconcilerError",
        what="ReconcilerError",
    )
    assert condition(failed)["message"].startswith("Error seen: ")
    assert "ownerReferences" not in (await api.get(kc.PODS, NS, "box"))["metadata"]


async def test_adoptable_pod_is_adopted_not_replaced(cluster: RunningCluster, api: kc.KubeClient) -> None:
    existing = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "box", "labels": {"agents.x-k8s.io/adoptable": "true"}},
        "spec": {"containers": [{"name": "c", "image": "busybox", "command": ["sleep", "3600"]}]},
    }
    pod = await api.create(kc.PODS, NS, existing)
    created = await api.create(kc.SANDBOXES, NS, sandbox("box"))
    await wait_ready(api, kc.SANDBOXES, "box")
    adopted = await api.get(kc.PODS, NS, "box")
    assert adopted["metadata"]["uid"] == pod["metadata"]["uid"]
    assert adopted["metadata"]["ownerReferences"][0]["uid"] == created["metadata"]["uid"]
    assert adopted["metadata"]["labels"]["agents.x-k8s.io/sandbox-name-hash"] == name_hash("box")


async def test_service_true_creates_a_headless_service(cluster: RunningCluster, api: kc.KubeClient) -> None:
    body = sandbox("web", service=True)
    body["spec"]["podTemplate"]["spec"]["containers"][0]["ports"] = [{"containerPort": 8080}]
    await api.create(kc.SANDBOXES, NS, body)
    sb = await wait_ready(api, kc.SANDBOXES, "web")
    assert condition(sb)["message"] == "Pod is Ready; Service Exists"
    assert sb["status"]["service"] == "web"
    assert sb["status"]["serviceFQDN"] == f"web.{NS}.svc.cluster.local"
    svc = await api.get(kc.SERVICES, NS, "web")
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == {"agents.x-k8s.io/sandbox-name-hash": name_hash("web")}
    assert svc["spec"]["ports"][0]["name"] == "p-8080-tcp"
