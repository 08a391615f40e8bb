"""The gateway's Deployment, Service, ServiceAccounts, Secrets and storage as rendered: hardened,
probed on /healthz (readiness) and /livez (liveness), and wired to the files the gateway actually reads."""

from __future__ import annotations

import base64
import tomllib
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.unit.chart.rendering import RELEASE_NAMESPACE, Manifests, render
from warmshell.core.config import StatePaths
from warmshell.drivers.kubernetes import proofs
from warmshell.gateway.tokens import load_or_create_api_token, load_or_create_signing_key

FULLNAME = "ws-warmshell"


def gateway_container(manifests: Manifests) -> dict[str, Any]:
    pod = manifests.one("Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["name"] == "gateway"
    return dict(container)


def pod_spec(manifests: Manifests) -> dict[str, Any]:
    return dict(manifests.one("Deployment")["spec"]["template"]["spec"])


def mounts_by_path(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["mountPath"]: m for m in container["volumeMounts"]}


def volumes_by_name(manifests: Manifests) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in pod_spec(manifests)["volumes"]}


def config(manifests: Manifests) -> dict[str, Any]:
    return tomllib.loads(manifests.one("ConfigMap", f"{FULLNAME}-config")["data"]["gateway.toml"])


def test_container_and_pod_security_context() -> None:
    manifests = render()
    security = gateway_container(manifests)["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert "privileged" not in security
    pod = pod_spec(manifests)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not {"hostNetwork", "hostPID", "hostIPC"} & set(pod)


@pytest.mark.parametrize(("probe", "path"), [("livenessProbe", "/livez"), ("readinessProbe", "/healthz")])
def test_probes_hit_the_gateway_http_port(probe: str, path: str) -> None:
    # Liveness must not depend on the store: /healthz is 503 while a gateway waits for its
    # database, and a liveness probe on it would restart that gateway in a loop.
    manifests = render()
    container = gateway_container(manifests)
    assert container[probe]["httpGet"]["path"] == path
    port_name = container[probe]["httpGet"]["port"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports[port_name] == 9464 == config(manifests)["http_port"]
    assert config(manifests)["http_host"] == "0.0.0.0", "kubelet probes come from outside the pod's loopback"


def test_service_exposes_grpc_and_http_ports() -> None:
    manifests = render()
    service = manifests.one("Service")
    ports = {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]}
    assert ports == {"grpc": (7443, "grpc"), "http": (9464, "http")}
    container_ports = {p["name"]: p["containerPort"] for p in gateway_container(manifests)["ports"]}
    assert container_ports == {"grpc": 7443, "http": 9464}
    assert config(manifests)["listen_tcp"] == "0.0.0.0:7443"
    pod_labels = manifests.one("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()


def test_gateway_runs_with_the_rendered_config() -> None:
    manifests = render()
    container = gateway_container(manifests)
    assert container["command"] == ["warmshell", "gateway", "start", "--config", "/etc/warmshell/gateway.toml"]
    config_mount = mounts_by_path(container)["/etc/warmshell"]
    assert config_mount["readOnly"] is True
    volume = volumes_by_name(manifests)[config_mount["name"]]
    assert volume["configMap"]["name"] == f"{FULLNAME}-config"
    assert {"key": "gateway.toml", "path": "gateway.toml"} in volume["configMap"]["items"]
    annotations = manifests.one("Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert "checksum/config" in annotations, "a config change must roll the pod"


@pytest.mark.parametrize("persistence", [True, False])
def test_state_dir_is_writable_storage(persistence: bool) -> None:
    manifests = render({"persistence.enabled": persistence})
    state_dir = config(manifests)["state_dir"]
    mount = mounts_by_path(gateway_container(manifests))[state_dir]
    assert not mount.get("readOnly", False)
    volume = volumes_by_name(manifests)[mount["name"]]
    if persistence:
        claim = volume["persistentVolumeClaim"]["claimName"]
        pvc = manifests.one("PersistentVolumeClaim", claim)
        assert pvc["spec"]["resources"]["requests"]["storage"] == "1Gi"
    else:
        assert "emptyDir" in volume
        assert manifests.of_kind("PersistentVolumeClaim") == []
    tmp = volumes_by_name(manifests)[mounts_by_path(gateway_container(manifests))["/tmp"]["name"]]
    assert "emptyDir" in tmp, "the root filesystem is read-only; /tmp must be writable"
    assert manifests.one("Deployment")["spec"]["strategy"] == {"type": "Recreate"}


def test_existing_claim_is_used_and_none_is_created() -> None:
    manifests = render({"persistence.existingClaim": "my-state"})
    assert manifests.of_kind("PersistentVolumeClaim") == []
    assert volumes_by_name(manifests)["state"]["persistentVolumeClaim"]["claimName"] == "my-state"


def secret_file(manifests: Manifests, target: Path) -> tuple[str, str, int]:
    """(Secret name, key, file mode) mounted at that path in the gateway container."""
    mount = mounts_by_path(gateway_container(manifests))[str(target)]
    assert mount["readOnly"] is True
    secret = volumes_by_name(manifests)[mount["name"]]["secret"]
    (item,) = [i for i in secret["items"] if i["path"] == mount["subPath"]]
    return secret["secretName"], item["key"], secret["defaultMode"]


def test_generated_signing_key_is_mounted_where_the_gateway_reads_it(tmp_path: Path) -> None:
    manifests = render()
    paths = StatePaths(Path(config(manifests)["state_dir"]))
    name, key, mode = secret_file(manifests, paths.signing_key)
    assert mode == 0o440
    pem = base64.b64decode(manifests.one("Secret", name)["data"][key])
    # Exactly what the gateway will do with the mounted file: load it, never regenerate it.
    target = tmp_path / "signing-key.pem"
    target.write_bytes(pem)
    assert isinstance(load_or_create_signing_key(target), Ed25519PrivateKey)
    assert target.read_bytes() == pem


def test_generated_api_token_is_mounted_where_the_gateway_reads_it(tmp_path: Path) -> None:
    manifests = render()
    paths = StatePaths(Path(config(manifests)["state_dir"]))
    name, key, _ = secret_file(manifests, paths.api_token)
    token = base64.b64decode(manifests.one("Secret", name)["data"][key]).decode()
    assert len(token) >= 43, "at least 256 bits of alphanumerics"
    target = tmp_path / "api-token"
    target.write_text(token)
    assert load_or_create_api_token(target) == token


def proof_key_file(manifests: Manifests) -> tuple[str, str]:
    """(Secret name, key) of the file the config's proof_key_file names."""
    target = Path(config(manifests)["kubernetes"]["proof_key_file"])
    mount = mounts_by_path(gateway_container(manifests))[str(target.parent)]
    assert mount["readOnly"] is True
    secret = volumes_by_name(manifests)[mount["name"]]["secret"]
    assert secret["defaultMode"] == 0o440
    (item,) = [i for i in secret["items"] if i["path"] == target.name]
    return secret["secretName"], item["key"]


def test_generated_proof_key_is_mounted_where_the_config_points(tmp_path: Path) -> None:
    manifests = render()
    name, key = proof_key_file(manifests)
    content = base64.b64decode(manifests.one("Secret", name)["data"][key])
    target = tmp_path / "proof.key"
    target.write_bytes(content)
    assert len(proofs.load_or_create_key(target)) == 32
    assert target.read_bytes() == content, "the gateway must read the mounted key, not replace it"


def test_generated_keys_differ_between_renders() -> None:
    # Guards against a constant key in the template; upgrades keep keys through `lookup`.
    first, second = render(), render({"gateway.logLevel": "DEBUG"})
    for name in (
        f"{FULLNAME}-signing-key",
        f"{FULLNAME}-api-token",
        f"{FULLNAME}-proof-key",
        f"{FULLNAME}-secrets-key",
    ):
        assert first.one("Secret", name)["data"] != second.one("Secret", name)["data"]


def test_supplied_secrets_are_used_and_none_is_generated() -> None:
    manifests = render(
        {
            "signingKey.existingSecret": "my-key",
            "apiToken.existingSecret": "my-token",
            "proofKey.existingSecret": "my-proof",
            "secretsKey.existingSecret": "my-secrets-key",
        }
    )
    assert manifests.of_kind("Secret") == []
    paths = StatePaths(Path(config(manifests)["state_dir"]))
    assert secret_file(manifests, paths.signing_key)[:2] == ("my-key", "signing-key.pem")
    assert secret_file(manifests, paths.api_token)[:2] == ("my-token", "api-token")
    assert proof_key_file(manifests) == ("my-proof", "proof.key")


def test_gateway_id_is_stable_and_mounted_where_the_gateway_reads_it() -> None:
    manifests = render()
    paths = StatePaths(Path(config(manifests)["state_dir"]))
    mount = mounts_by_path(gateway_container(manifests))[str(paths.root / "gateway-id")]
    assert mount["readOnly"] is True
    data = manifests.one("ConfigMap", f"{FULLNAME}-config")["data"]
    assert data[mount["subPath"]] == render({"gateway.logLevel": "DEBUG"}).one("ConfigMap")["data"]["gateway-id"]
    assert len(data["gateway-id"]) == 16
    assert int(data["gateway-id"], 16) >= 0


@pytest.mark.parametrize("sandbox_namespace", ["", "sandboxes"])
def test_service_accounts(sandbox_namespace: str) -> None:
    manifests = render({"sandbox.namespace": sandbox_namespace})
    gateway_sa = manifests.one("ServiceAccount", FULLNAME)
    assert gateway_sa["metadata"]["namespace"] == RELEASE_NAMESPACE
    assert pod_spec(manifests)["serviceAccountName"] == FULLNAME
    sandbox_sa = manifests.one("ServiceAccount", f"{FULLNAME}-sandbox")
    assert sandbox_sa["metadata"]["namespace"] == (sandbox_namespace or RELEASE_NAMESPACE)
    assert sandbox_sa["automountServiceAccountToken"] is False
    kubernetes = config(manifests)["kubernetes"]
    assert (kubernetes["service_account"], kubernetes["namespace"]) == (
        sandbox_sa["metadata"]["name"],
        sandbox_sa["metadata"]["namespace"],
    )


def test_service_accounts_can_be_brought_by_the_operator() -> None:
    manifests = render(
        {
            "serviceAccount.create": False,
            "serviceAccount.name": "gw",
            "sandbox.serviceAccount.create": False,
            "sandbox.serviceAccount.name": "sbx",
        }
    )
    assert manifests.of_kind("ServiceAccount") == []
    assert pod_spec(manifests)["serviceAccountName"] == "gw"
    assert config(manifests)["kubernetes"]["service_account"] == "sbx"
    subjects = {s["name"] for b in manifests.of_kind("RoleBinding") for s in b["subjects"]}
    assert subjects == {"gw"}


def test_resources_and_replicas_come_from_values() -> None:
    manifests = render({"gateway.resources.requests.cpu": "1", "gateway.replicas": 0})
    assert gateway_container(manifests)["resources"] == {
        "requests": {"cpu": "1", "memory": "256Mi"},
        "limits": {"memory": "512Mi"},
    }
    assert manifests.one("Deployment")["spec"]["replicas"] == 0
