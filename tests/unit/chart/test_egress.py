"""The chart's egress parts: with `egress.enabled`, the proxy port on the gateway pods, the
`<fullname>-egress` Service selecting them and the `[network]` table the gateway accepts; the
NetworkPolicy that keeps sandbox pods to the gateway and the cluster DNS."""

from __future__ import annotations

import tomllib
from typing import Any

from tests.unit.chart.rendering import RELEASE_NAMESPACE, render
from warmshell.core.config import GatewayConfig, NetworkConfig
from warmshell.drivers.kubernetes import labels

FULLNAME = "ws-warmshell"
ON = {"egress.enabled": True, "egress.port": 3200, "egress.deny": ["blocked.example"]}


def _network(values: dict[str, object]) -> dict[str, Any]:
    text = render(values).one("ConfigMap", f"{FULLNAME}-config")["data"]["gateway.toml"]
    return dict(tomllib.loads(text).get("network", {}))


def test_egress_is_off_by_default_and_renders_nothing_of_its_own() -> None:
    manifests = render()
    assert [s["metadata"]["name"] for s in manifests.of_kind("Service")] == [FULLNAME]
    assert _network({}) == {}


def test_egress_renders_a_service_on_the_gateway_pods_and_a_config_the_gateway_accepts() -> None:
    manifests = render(ON)
    service = manifests.one("Service", f"{FULLNAME}-egress")
    gateway = manifests.one("Deployment", FULLNAME)
    assert service["spec"]["selector"].items() <= gateway["spec"]["template"]["metadata"]["labels"].items()
    assert service["spec"]["ports"] == [{"name": "egress", "port": 3200, "targetPort": "egress", "protocol": "TCP"}]
    ports = gateway["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert {"name": "egress", "containerPort": 3200, "protocol": "TCP"} in ports
    network = NetworkConfig(**_network(ON))
    assert network.proxy_listen == "0.0.0.0:3200"
    assert network.proxy_url == f"http://{FULLNAME}-egress.{RELEASE_NAMESPACE}.svc.cluster.local:3200"
    assert network.deny == ["blocked.example"]
    text = render(ON).one("ConfigMap", f"{FULLNAME}-config")["data"]["gateway.toml"]
    GatewayConfig.model_validate(tomllib.loads(text))


def test_the_network_policy_keeps_sandbox_pods_to_the_gateway_and_dns() -> None:
    manifests = render({**ON, "sandbox.namespace": "sandboxes"})
    policy = manifests.one("NetworkPolicy", f"{FULLNAME}-sandboxes")["spec"]
    assert manifests.one("NetworkPolicy")["metadata"]["namespace"] == "sandboxes"
    # The label every sandbox pod the driver renders carries, cold or warm.
    assert policy["podSelector"] == {"matchLabels": {labels.MANAGED_BY: labels.MANAGED_BY_VALUE}}
    assert (policy["policyTypes"], policy["ingress"]) == (["Ingress", "Egress"], [])
    to_gateway, to_dns = policy["egress"]
    gateway = manifests.one("Deployment", FULLNAME)["spec"]["template"]["metadata"]["labels"]
    (peer,) = to_gateway["to"]
    assert peer["podSelector"]["matchLabels"].items() <= gateway.items()
    assert peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": RELEASE_NAMESPACE}}
    assert [p["port"] for p in to_gateway["ports"]] == [7443, 3200]
    assert {p["port"] for p in to_dns["ports"]} == {53}
    without_egress = render({"sandbox.namespace": "sandboxes"}).one("NetworkPolicy")["spec"]["egress"][0]
    assert [p["port"] for p in without_egress["ports"]] == [7443]
    assert render({"networkPolicy.enabled": False}).of_kind("NetworkPolicy") == []
