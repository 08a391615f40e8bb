"""Egress from Kubernetes sandboxes on kubesim: the pod's workload reaches the gateway's proxy
over TCP with the per-sandbox credential its activation carried (in `HTTP_PROXY`'s user info);
an allowed host works, a denied one is refused and listed, a placeholder secret is swapped for
its host. (The attacks with a credential: `security/test_egress_pod_credentials.py`.)

Upstreams listen on 127.0.0.2 and 127.0.0.3 of the host. kubesim's sandbox pods share the host's
network (kubesim does not enforce NetworkPolicies), so what is checked here is the proxy's
admission and decisions, not that a pod has no other way out."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kubesim.cluster import RunningCluster
from tests.helpers.gateway import RunningGateway, running_gateway
from tests.helpers.upstreams import Upstream, upstream
from tests.integration.security.support import sandbox, sh
from warmshell.api.v1 import sandbox_pb2 as pb

from .conftest import gateway_settings

pytestmark = pytest.mark.timeout(120)

SECRET = "k8s-s3cr3t-" + "q" * 20


def free_port() -> int:
    """A port nothing listens on now (for a listener whose address must be known beforehand)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
async def gw(cluster: RunningCluster, tmp_path: Path) -> AsyncIterator[RunningGateway]:
    state = tmp_path / "state"
    port = free_port()
    network = {
        "network.requests_may_widen": True,
        "network.proxy_listen": f"127.0.0.1:{port}",
        "network.proxy_url": f"http://127.0.0.1:{port}",
    }
    async with running_gateway(state, **gateway_settings(cluster, state), **network) as running:
        yield running


@pytest.fixture
async def allowed() -> AsyncIterator[Upstream]:
    async with upstream("127.0.0.2") as server:
        yield server


@pytest.fixture
async def other() -> AsyncIterator[Upstream]:
    async with upstream("127.0.0.3") as server:
        yield server


def _spec(*allow: str) -> pb.SandboxSpec:
    return pb.SandboxSpec(network=pb.NetworkPolicy(allow=list(allow)))


async def proxy_url(gw: RunningGateway, name: str) -> str:
    """The proxy URL (with its credential) the sandbox's workload was given."""
    code, url, err = await sh(gw, name, 'printf %s "$HTTP_PROXY"')
    assert code == 0, err
    return url


async def test_a_pod_goes_out_through_the_proxy_under_its_policy_with_its_placeholder_swapped(
    gw: RunningGateway, allowed: Upstream, other: Upstream
) -> None:
    spec = _spec(allowed.authority)
    spec.secrets["API_KEY"] = SECRET
    spec.secret_hosts["API_KEY"].hosts.append(allowed.authority)
    ready = await sandbox(gw, "net", spec)
    network = next(c for c in ready.status.conditions if c.type == "Network")
    assert (network.status, network.reason) == ("True", "Proxy"), network
    url = await proxy_url(gw, "net")
    assert url.startswith(f"http://{ready.id}:wsx_")
    assert url.endswith(f"@127.0.0.1:{gw.gateway.egress_port}")
    code, seen, _ = await sh(gw, "net", 'printf %s "$API_KEY"')
    assert (code, seen.startswith("wsp_")) == (0, True)

    header = '-H "Authorization: Bearer $API_KEY"'
    assert await sh(gw, "net", f"curl -sS {header} http://{allowed.authority}/api") == (0, "upstream saw /api\n", "")
    assert f"Authorization: Bearer {SECRET}".encode() in allowed.heads[0]
    assert b"roxy-authorization" not in allowed.heads[0].lower()  # the credential stays with the proxy
    code, out, _ = await sh(gw, "net", f"curl -sS -o /dev/null -w '%{{http_code}}' http://{other.authority}/")
    assert out == "403"
    assert other.heads == []

    decisions = (await gw.stub.ListEgress(pb.SandboxRef(name="net"), metadata=gw.metadata)).decisions
    assert [(d.host, d.port, d.allowed) for d in decisions] == [
        (allowed.host, allowed.port, True),
        (other.host, other.port, False),
    ]
    assert decisions[0].rule == allowed.authority
    assert decisions[0].bytes_down > 0
