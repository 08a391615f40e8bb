from typing import Any

from ksc_builders import make_pool, make_template

from kubesim.controllers import pools, rendering
from kubesim.controllers.hashing import name_hash

Obj = dict[str, Any]


def warm_sandbox(name: str = "pool-abcde") -> Obj:
    sb = pools.build_warm_sandbox(make_pool(), make_template())
    sb["metadata"].update({"name": name, "uid": "sb-uid", "resourceVersion": "11", "generation": 1})
    return sb


def test_pod_of_a_warm_sandbox_has_upstream_labels_and_annotations() -> None:
    pod = rendering.render_pod(warm_sandbox())
    meta = pod["metadata"]
    assert meta["name"] == "pool-abcde"
    assert meta["labels"] == {
        "app": "agent",
        "agents.x-k8s.io/sandbox-name-hash": name_hash("pool-abcde"),
        "agents.x-k8s.io/warm-pool-sandbox": name_hash("pool"),
        "agents.x-k8s.io/sandbox-template-ref-hash": name_hash("tmpl"),
        "agents.x-k8s.io/created-by": "controller",
    }
    # The pool's template hashes are system keys: never on the Pod.
    assert meta["annotations"] == {
        "team": "a",
        "cluster-autoscaler.kubernetes.io/safe-to-evict": "true",
        "agents.x-k8s.io/propagated-labels": "app",
        "agents.x-k8s.io/propagated-annotations": "cluster-autoscaler.kubernetes.io/safe-to-evict,team",
    }
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "agents.x-k8s.io/v1beta1",
            "kind": "Sandbox",
            "name": "pool-abcde",
            "uid": "sb-uid",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert pod["spec"]["dnsPolicy"] == "None"


def test_bare_sandbox_gets_no_extension_labels() -> None:
    sb = warm_sandbox("plain")
    sb["metadata"]["ownerReferences"] = []
    labels = rendering.render_pod(sb)["metadata"]["labels"]
    assert "agents.x-k8s.io/warm-pool-sandbox" not in labels
    assert "agents.x-k8s.io/sandbox-template-ref-hash" not in labels


def test_vct_volumes_replace_same_named_template_volumes() -> None:
    sb = warm_sandbox()
    sb["spec"]["podTemplate"]["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
    sb["spec"]["volumeClaimTemplates"] = [{"metadata": {"name": "data"}, "spec": {}}]
    vols = rendering.render_pod(sb)["spec"]["volumes"]
    assert vols == [{"name": "data", "persistentVolumeClaim": {"claimName": "data-pool-abcde"}}]


def test_metadata_patch_after_adoption_drops_pool_label_and_safe_to_evict() -> None:
    sb = warm_sandbox()
    pod = rendering.render_pod(sb)
    assert rendering.pod_metadata_patch(sb, pod) is None
    # What adoption does to the Sandbox: a claim owns it, pool label gone, template meta replaced.
    sb["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
            "kind": "SandboxClaim",
            "name": "c",
            "uid": "c-uid",
            "controller": True,
        }
    ]
    del sb["metadata"]["labels"]["agents.x-k8s.io/warm-pool-sandbox"]
    sb["metadata"]["labels"]["agents.x-k8s.io/created-by"] = "python-client"
    sb["spec"]["podTemplate"]["metadata"] = {"labels": {"app": "agent"}, "annotations": {"team": "a"}}
    patch = rendering.pod_metadata_patch(sb, pod)
    assert patch == {
        "metadata": {
            "labels": {
                "agents.x-k8s.io/warm-pool-sandbox": None,
                "agents.x-k8s.io/created-by": "python-client",
            },
            "annotations": {
                "cluster-autoscaler.kubernetes.io/safe-to-evict": None,
                "agents.x-k8s.io/propagated-annotations": "team",
            },
        }
    }


def test_headless_service_ports() -> None:
    sb = warm_sandbox()
    sb["spec"]["podTemplate"]["spec"]["containers"][0]["ports"] = [
        {"containerPort": 8080},
        {"containerPort": 9090, "name": "grpc"},
        {"containerPort": 8080},
    ]
    svc = rendering.render_service(sb)
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == {"agents.x-k8s.io/sandbox-name-hash": name_hash("pool-abcde")}
    assert [p["name"] for p in svc["spec"]["ports"]] == ["p-8080-tcp", "grpc"]
