"""Egress from Kubernetes sandboxes on kubesim: the pod's workload reaches the gateway's proxy
over TCP with the per-sandbox credential its activation carried (in `HTTP_PROXY`'s user info);
an allowed host works, a denied one is refused and listed, a placeholder secret is swapped for
its host. Then the attacks a workload can make with what it sees: another sandbox's credential
under its own id (or its own under another's), a deleted sandbox's, none at all — each 407,
and nothing reaches an upstream.

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


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
async def gw(cluster: RunningCluster, tmp_path: Path) -> AsyncIterator[RunningGateway]:
    state = tmp_path / "state"
    port = _free_port()
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
    spec = pb.SandboxSpec(network=pb.NetworkPolicy(allow=list(allow)))
    return spec


async def _proxy_url(gw: RunningGateway, name: str) -> str:
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
    url = await _proxy_url(gw, "net")
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


async def test_credentials_buy_only_their_own_live_sandbox(gw: RunningGateway, allowed: Upstream) -> None:
    await sandbox(gw, "victim", _spec(allowed.authority))
    await sandbox(gw, "attacker", _spec())  # its own policy allows nothing
    victim_url = await _proxy_url(gw, "victim")
    victim_id, _, rest = victim_url.removeprefix("http://").partition(":")
    victim_credential, _, proxy = rest.partition("@")
    attacker = (await gw.get("attacker")).id
    fetch = f"curl -sS -o /dev/null -w '%{{http_code}}' http://{allowed.authority}/"
    attempts = {
        "its own id, the victim's credential": f"http://{attacker}:{victim_credential}@{proxy}",
        "the victim's id, a made-up credential": f"http://{victim_id}:wsx_AAAA.BBBB@{proxy}",
        "no credential at all": f"http://{proxy}",
    }
    for what, url in attempts.items():
        assert await sh(gw, "attacker", f"{fetch} --proxy '{url}'") == (0, "407", ""), what
    assert allowed.heads == []
    # The victim's own URL works from anywhere while it lives (it is a bearer secret of the
    # sandbox), and buys nothing once it is deleted, on this replica or any other.
    assert await sh(gw, "attacker", f"{fetch} --proxy '{victim_url}'") == (0, "200", "")
    await gw.delete("victim")
    assert await sh(gw, "attacker", f"{fetch} --proxy '{victim_url}'") == (0, "407", "")
    assert len(allowed.heads) == 1
