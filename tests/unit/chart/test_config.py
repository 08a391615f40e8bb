"""The gateway config the chart renders into its ConfigMap parses with tomllib and is accepted by
the gateway's own schema (`warmshell.core.config.GatewayConfig`), for every toggle combination."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest
from pydantic import BaseModel

from tests.unit.chart.rendering import RELEASE_NAMESPACE, TOGGLES, render
from warmshell.core.config import GatewayConfig

FULLNAME = "ws-warmshell"

# Keys the chart renders for features still being built; none left.
PENDING_KEYS: frozenset[tuple[str, ...]] = frozenset()


def rendered(values: dict[str, object] | None = None) -> dict[str, Any]:
    text = render(values).one("ConfigMap", f"{FULLNAME}-config")["data"]["gateway.toml"]
    return tomllib.loads(text)


def leaves(data: dict[str, Any], prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    found: set[tuple[str, ...]] = set()
    for key, value in data.items():
        if isinstance(value, dict):
            found |= leaves(value, (*prefix, key))
        else:
            found.add((*prefix, key))
    return found


def known_to_schema(path: tuple[str, ...], model: type[BaseModel] = GatewayConfig) -> bool:
    """Whether GatewayConfig has a field at that dotted path."""
    head, *rest = path
    field = model.model_fields.get(head)
    if field is None:
        return False
    if not rest:
        return True
    annotation = field.annotation
    return (
        isinstance(annotation, type) and issubclass(annotation, BaseModel) and known_to_schema(tuple(rest), annotation)
    )


def without(data: dict[str, Any], paths: set[tuple[str, ...]]) -> dict[str, Any]:
    """A copy of the config without those keys (and without tables they leave empty)."""
    result: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            inner = without(value, {p[1:] for p in paths if p[0] == key and len(p) > 1})
            if inner:
                result[key] = inner
        elif (key,) not in paths:
            result[key] = value
    return result


@pytest.mark.parametrize(("warm", "profiles"), TOGGLES)
def test_config_validates_against_gateway_config(warm: bool, profiles: bool) -> None:
    data = rendered({"warmPooling.enabled": warm, "warmPooling.profiles.enabled": profiles})
    unknown = {path for path in leaves(data) if not known_to_schema(path)}
    assert unknown <= PENDING_KEYS, f"the chart renders keys GatewayConfig does not know: {sorted(unknown)}"
    config = GatewayConfig.model_validate(without(data, unknown))
    assert config.driver == "kubernetes"
    assert config.kubernetes.credentials == "in-cluster"


def test_every_rendered_key_exists_in_gateway_config() -> None:
    data = rendered({"warmPooling.profiles.enabled": True})
    missing = sorted(".".join(path) for path in leaves(data) if not known_to_schema(path))
    assert not missing, f"GatewayConfig does not accept these rendered keys yet: {missing}"
    GatewayConfig.model_validate(data)


@pytest.mark.parametrize(("warm", "profiles"), TOGGLES)
def test_toggles_reach_the_config(warm: bool, profiles: bool) -> None:
    pooling = rendered({"warmPooling.enabled": warm, "warmPooling.profiles.enabled": profiles})["kubernetes"][
        "warm_pooling"
    ]
    # Profiles generate pools for claim allocation: without warm pooling they stay off.
    assert pooling == {"enabled": warm, "profiles": {"enabled": warm and profiles, "max_replicas": 20}}


def test_values_reach_the_config() -> None:
    data = rendered(
        {
            "sandbox.image": "registry.example/agent:1",
            "sandbox.namespace": "sandboxes",
            "warmPooling.profiles.maxReplicas": 7,
            "gateway.logLevel": "DEBUG",
            "gateway.sandboxTokenTtlSeconds": 600,
            "gateway.orphanGraceSeconds": 2.5,
            "clusterDomain": "corp.internal",
        }
    )
    assert data["log_level"] == "DEBUG"
    assert data["sandbox_token_ttl_seconds"] == 600
    assert data["orphan_grace_seconds"] == 2.5
    kubernetes = data["kubernetes"]
    assert kubernetes["image"] == "registry.example/agent:1"
    assert kubernetes["namespace"] == "sandboxes"
    assert kubernetes["gateway_address"] == f"{FULLNAME}.{RELEASE_NAMESPACE}.svc.corp.internal:7443"
    assert kubernetes["warm_pooling"]["profiles"]["max_replicas"] == 7


def test_defaults_point_sandboxes_at_the_gateway_service_and_image() -> None:
    manifests = render()
    kubernetes = rendered()["kubernetes"]
    service = manifests.one("Service")
    host, port = kubernetes["gateway_address"].rsplit(":", 1)
    assert host == f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc.cluster.local"
    assert int(port) == next(p["port"] for p in service["spec"]["ports"] if p["name"] == "grpc")
    container = manifests.one("Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert kubernetes["image"] == container["image"], "the gateway image ships the supervisor"
    assert kubernetes["namespace"] == RELEASE_NAMESPACE


def test_lease_in_config_is_the_chart_lease() -> None:
    manifests = render()
    election = rendered()["kubernetes"]["leader_election"]
    lease = manifests.one("Lease")
    assert (election["lease_name"], election["lease_namespace"]) == (
        lease["metadata"]["name"],
        lease["metadata"]["namespace"],
    )


def test_strings_cannot_break_out_of_the_toml() -> None:
    hostile = 'img"\nlog_level = "DEBUG'
    data = rendered({"sandbox.image": hostile})
    assert data["kubernetes"]["image"] == hostile
    assert data["log_level"] == "INFO"


def test_a_workspace_claim_reaches_the_config() -> None:
    assert (rendered()["kubernetes"]["workspace_claim_size"], rendered()["kubernetes"]["workspace_storage_class"]) == (
        "",
        "",
    )
    data = rendered({"sandbox.workspaceClaim.size": "10Gi", "sandbox.workspaceClaim.storageClass": "fast-ssd"})
    config = GatewayConfig.model_validate(data)
    assert (config.kubernetes.workspace_claim_size, config.kubernetes.workspace_storage_class) == ("10Gi", "fast-ssd")
