"""The rendered Sandbox: valid against the agent-sandbox CRD schema, and shaped as identity needs."""

from __future__ import annotations

import json
from typing import Any

import pytest

from warmshell.core.models import Resources, SandboxSpec
from warmshell.drivers.kubernetes import naming, rendering
from warmshell.drivers.kubernetes.proofs import ProofSealer

from . import crds
from .fakes import KEY, config

SPEC = SandboxSpec(
    image="registry.example/agent:1.2",
    environment={"API_KEY": "very-secret-value"},
    resources=Resources(cpu="0.5", memory="1Gi"),
    command=["python", "agent.py", "--flag-from-the-workload"],
    runtime_class_name="gvisor",
)


def render(spec: SandboxSpec = SPEC, api_version: str = "agents.x-k8s.io/v1beta1", **overrides: Any) -> dict[str, Any]:
    cfg = config(**overrides)
    ref = naming.object_ref(cfg, "team-a", "build-1")
    sealed = ProofSealer(KEY).seal("proof-value", namespace=ref.namespace, name=ref.name, sandbox_id="sbx-1")
    who = rendering.SandboxIdentity(sandbox_id="sbx-1", workspace="team-a", name="build-1", sealed_proof=sealed)
    return rendering.render_sandbox(cfg, api_version=api_version, ref=ref, who=who, spec=spec)


def container(obj: dict[str, Any], name: str = rendering.CONTAINER) -> dict[str, Any]:
    found = {c["name"]: c for c in obj["spec"]["podTemplate"]["spec"]["containers"]}
    assert set(found) == {rendering.CONTAINER, rendering.WORKLOAD_CONTAINER}
    return dict(found[name])


def workload(obj: dict[str, Any]) -> dict[str, Any]:
    return container(obj, rendering.WORKLOAD_CONTAINER)


@pytest.mark.parametrize(
    "spec",
    [SPEC, SandboxSpec(), SandboxSpec(resources=Resources(cpu="2")), SandboxSpec(resources=Resources(memory="64Mi"))],
)
@pytest.mark.parametrize("version", ["v1beta1", "v1alpha1"])
def test_every_rendering_validates_against_the_crd_schema(spec: SandboxSpec, version: str) -> None:
    obj = render(spec, api_version=f"agents.x-k8s.io/{version}", image_pull_policy="IfNotPresent")
    assert crds.errors(obj, version=version) == []


def test_the_strict_schema_catches_a_misspelt_field() -> None:
    obj = render()
    obj["spec"]["podTemplate"]["spec"]["automountServiceAcountToken"] = False
    assert any("automountServiceAcountToken" in e for e in crds.errors(obj))


def test_object_name_namespace_labels_and_annotations() -> None:
    obj = render()
    meta = obj["metadata"]
    assert (meta["namespace"], meta["name"]) == ("warmshell", "team-a--build-1")
    assert meta["labels"] == {
        "warmshell.dev/managed-by": "warmshell",
        "warmshell.dev/sandbox-id": "sbx-1",
        "warmshell.dev/workspace": "team-a",
    }
    assert meta["annotations"]["warmshell.dev/sandbox-id"] == "sbx-1"
    assert meta["annotations"]["warmshell.dev/sandbox-name"] == "build-1"
    template = obj["spec"]["podTemplate"]["metadata"]
    assert template["labels"] == meta["labels"]
    assert template["annotations"] == {"warmshell.dev/sandbox-id": "sbx-1"}


def test_the_proof_is_sealed_and_stays_off_the_pod() -> None:
    obj = render()
    sealed = obj["metadata"]["annotations"]["warmshell.dev/activation-proof"]
    assert "proof-value" not in json.dumps(obj)
    assert ProofSealer(KEY).open(sealed, namespace="warmshell", name="team-a--build-1", sandbox_id="sbx-1") == (
        "proof-value"
    )
    assert "warmshell.dev/activation-proof" not in json.dumps(obj["spec"])


def test_the_supervisor_is_the_entry_point_and_the_workload_is_not_in_the_pod() -> None:
    obj = render()
    text = json.dumps(obj)
    assert "very-secret-value" not in text
    assert "API_KEY" not in text
    assert "--flag-from-the-workload" not in text
    c = container(obj)
    assert (c["command"], c["args"]) == (["warmshell"], ["supervisor"])
    assert c["image"] == config().image  # the warmshell image; the request's is the workload's
    assert workload(obj)["image"] == "registry.example/agent:1.2"
    assert rendering.container_env(obj["spec"]["podTemplate"]["spec"]) == {
        "WARMSHELL_GATEWAY": "gw.warmshell.svc:8443",
        "WARMSHELL_BOOTSTRAP_FILE": "/var/run/secrets/warmshell/token",
        "WARMSHELL_RESTART_POLICY": "OnFailure",
        "WARMSHELL_AGENT_SOCKET": "/.warmshell/channel/agent.sock",
    }
    (instance,) = [e for e in c["env"] if e["name"] == "WARMSHELL_INSTANCE_ID"]
    assert instance["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}


def test_the_pod_gets_only_the_gateway_token() -> None:
    pod = render(token_expiration_seconds=1200)["spec"]["podTemplate"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["serviceAccountName"] == "warmshell-sandbox"
    (projected,) = [v for v in pod["volumes"] if "projected" in v]
    (source,) = projected["projected"]["sources"]
    assert source == {
        "serviceAccountToken": {"audience": "warmshell-gateway", "expirationSeconds": 1200, "path": "token"}
    }
    mounts = {m["mountPath"]: m for m in container({"spec": {"podTemplate": {"spec": pod}}})["volumeMounts"]}
    assert mounts["/var/run/secrets/warmshell"] == {
        "name": projected["name"],
        "mountPath": "/var/run/secrets/warmshell",
        "readOnly": True,
    }
    assert "/workspace" in mounts
    # Only the supervisor has it: no other container mounts the token's volume.
    others = [c for c in [*pod["containers"], *pod["initContainers"]] if c["name"] != rendering.CONTAINER]
    assert len(others) == 2
    assert all(m["name"] != projected["name"] for c in others for m in c["volumeMounts"])


def test_the_workload_runs_the_agent_as_pid_1_without_privilege() -> None:
    pod = render()["spec"]["podTemplate"]["spec"]
    (init,) = pod["initContainers"]
    assert (init["image"], init["command"], init["args"]) == (
        config().image,
        ["warmshell-agent"],
        ["--install", "/.warmshell/agent"],
    )
    w = workload(render())
    assert w["command"] == ["/.warmshell/agent/warmshell-agent", "--connect", "/.warmshell/channel/agent.sock"]
    assert w["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "shareProcessNamespace" not in pod
    assert "env" not in w
    mounts = {m["mountPath"]: m for m in w["volumeMounts"]}
    assert mounts["/.warmshell/agent"]["readOnly"] is True
    supervisor = {m["mountPath"]: m["name"] for m in container(render())["volumeMounts"]}
    assert supervisor["/.warmshell/channel"] == mounts["/.warmshell/channel"]["name"]
    assert supervisor["/workspace"] == mounts["/workspace"]["name"]


def test_resources_requests_equal_limits_in_canonical_units() -> None:
    c = workload(render())
    assert c["resources"] == {
        "requests": {"cpu": "500m", "memory": str(1024**3)},
        "limits": {"cpu": "500m", "memory": str(1024**3)},
    }
    assert "resources" not in workload(render(SandboxSpec()))


def test_policy_fields() -> None:
    pod = render()["spec"]["podTemplate"]["spec"]
    assert pod["restartPolicy"] == "OnFailure"
    assert pod["runtimeClassName"] == "gvisor"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert "runtimeClassName" not in render(SandboxSpec())["spec"]["podTemplate"]["spec"]


def test_the_supervisor_is_told_the_pod_restart_policy() -> None:
    """It exits 0 when the gateway has ended the sandbox, so OnFailure restarts only a crash."""
    obj = render()
    env = rendering.container_env(obj["spec"]["podTemplate"]["spec"])
    assert env["WARMSHELL_RESTART_POLICY"] == obj["spec"]["podTemplate"]["spec"]["restartPolicy"] == "OnFailure"
    assert "WARMSHELL_RESTART_POLICY" in rendering.RESERVED_ENV  # not part of a pool's shape
    with pytest.raises(ValueError, match="WARMSHELL_RESTART_POLICY"):
        rendering.pod_spec(config(), image="x", environment={"WARMSHELL_RESTART_POLICY": "Always"})


def test_the_default_image_is_used_for_an_empty_request() -> None:
    assert (
        workload(render(SandboxSpec(), image="ghcr.io/warmshell/warmshell:9"))["image"]
        == "ghcr.io/warmshell/warmshell:9"
    )
    assert "imagePullPolicy" not in container(render(SandboxSpec()))


def test_a_workspace_claim_replaces_the_emptydir_through_a_volume_claim_template() -> None:
    assert "volumeClaimTemplates" not in render()["spec"]
    obj = render(workspace_claim_size="2Gi", workspace_storage_class="fast")
    assert obj["spec"]["volumeClaimTemplates"] == [
        {
            "metadata": {"name": rendering.WORKSPACE_VOLUME},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "2Gi"}},
                "storageClassName": "fast",
            },
        }
    ]
    # Named as the pod's workspace volume: agent-sandbox mounts the claim in its place.
    volumes = {v["name"] for v in obj["spec"]["podTemplate"]["spec"]["volumes"]}
    assert rendering.WORKSPACE_VOLUME in volumes
    assert crds.errors(obj) == []
    # A profile's [storage] workspace sizes the claim as it bounds the emptyDir.
    sized = render(SandboxSpec(storage={"workspace": "5Gi"}), workspace_claim_size="2Gi")
    assert sized["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "5Gi"


def test_a_workspace_claim_size_that_is_no_quantity_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="workspace_claim_size"):
        config(workspace_claim_size="lots")
