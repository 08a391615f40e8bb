"""Egress through the gateway's proxy, from real bwrap'd sandboxes: what a policy allows
works, everything else is refused (and logged), and nothing bypasses the proxy.

Upstreams listen on 127.0.0.2 and 127.0.0.3 of the host: the sandbox's own loopback (its own
network namespace) reaches neither, so a connection that works went through the proxy."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.helpers.gateway import RunningGateway, running_gateway
from tests.helpers.upstreams import Upstream, upstream
from tests.integration.security.support import sandbox, sh
from warmshell.api.v1 import sandbox_pb2 as pb

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[RunningGateway]:
    overrides = {"network.requests_may_widen": True, "network.max_connections": 8}
    async with running_gateway(tmp_path / "state", **overrides) as running:
        yield running


@pytest.fixture
async def allowed() -> AsyncIterator[Upstream]:
    async with upstream("127.0.0.2") as server:
        yield server


@pytest.fixture
async def other() -> AsyncIterator[Upstream]:
    async with upstream("127.0.0.3") as server:
        yield server


def _spec(*allow: str, deny: tuple[str, ...] = ()) -> pb.SandboxSpec:
    return pb.SandboxSpec(network=pb.NetworkPolicy(allow=list(allow), deny=list(deny)))


async def _egress(gw: RunningGateway, name: str) -> pb.ListEgressResponse:
    return await gw.stub.ListEgress(pb.SandboxRef(name=name), metadata=gw.metadata)


async def test_an_allowed_host_works_and_a_denied_one_is_refused_and_logged(
    gw: RunningGateway, allowed: Upstream, other: Upstream
) -> None:
    ready = await sandbox(gw, "net", _spec(allowed.authority))
    network = next(c for c in ready.status.conditions if c.type == "Network")
    assert (network.status, network.reason) == ("True", "Proxy")
    assert allowed.authority in network.message
    code, out, err = await sh(gw, "net", f"curl -sS --fail-with-body http://{allowed.authority}/pkg")
    assert (code, out) == (0, "upstream saw /pkg\n"), err
    code, out, _ = await sh(gw, "net", f"curl -sS -o /dev/null -w '%{{http_code}}' http://{other.authority}/x")
    assert out == "403"
    # Python's urllib honours the variables too, and CONNECT works for any TCP.
    script = f"import urllib.request as u; print(u.urlopen('http://{allowed.authority}/py').read().decode(), end='')"
    assert await sh(gw, "net", f'python3 -c "{script}"') == (0, "upstream saw /py\n", "")
    assert other.heads == []
    decisions = (await _egress(gw, "net")).decisions
    assert [(d.host, d.port, d.allowed) for d in decisions] == [
        (allowed.host, allowed.port, True),
        (other.host, other.port, False),
        (allowed.host, allowed.port, True),
    ]
    assert decisions[0].rule == allowed.authority
    assert decisions[0].bytes_down > 0
    assert decisions[0].bytes_up > 0
    assert "no rule allows" in decisions[1].reason


async def test_nothing_bypasses_the_proxy(gw: RunningGateway, allowed: Upstream) -> None:
    await sandbox(gw, "net", _spec(allowed.authority))
    # Straight to the upstream, ignoring the variables: the namespace has no route there.
    code, _, err = await sh(gw, "net", f"curl -sS --noproxy '*' --max-time 5 http://{allowed.authority}/")
    assert code != 0
    assert "Network is unreachable" in err or "Couldn't connect" in err, err
    # No resolver either: names are resolved by the proxy, outside.
    code, _, err = await sh(gw, "net", "python3 -c \"import socket; socket.getaddrinfo('example.com', 443)\"")
    assert code != 0
    assert "gaierror" in err
    assert allowed.heads == []


async def test_no_proxy_for_a_sandbox_whose_policy_allows_nothing(gw: RunningGateway, allowed: Upstream) -> None:
    ready = await sandbox(gw, "closed")
    network = next(c for c in ready.status.conditions if c.type == "Network")
    assert (network.status, network.reason) == ("False", "NoEgress")
    assert await sh(gw, "closed", "echo ${HTTP_PROXY:-unset}") == (0, "unset\n", "")
    # Even through the agent's port: no socket behind it, the connection is just closed.
    code, _, _ = await sh(gw, "closed", f"curl -sS --max-time 5 -x http://127.0.0.1:3128 http://{allowed.authority}/")
    assert code != 0
    assert allowed.heads == []


async def test_ssrf_into_the_host_is_refused(gw: RunningGateway, allowed: Upstream) -> None:
    # Every name allowed: still not the gateway's own HTTP port, nor anything on loopback.
    await sandbox(gw, "net", _spec("*.example.org", allowed.authority))
    for target in (f"127.0.0.1:{gw.gateway.http_port}", f"localhost:{gw.gateway.http_port}", "127.0.0.2:22"):
        _code, out, _ = await sh(
            gw,
            "net",
            f"curl -sS -o /dev/null -w '%{{http_code}}' --noproxy '' -x http://127.0.0.1:3128 http://{target}/metrics",
        )
        assert out == "403", target
    decisions = (await _egress(gw, "net")).decisions
    assert [d.allowed for d in decisions] == [False, False, False]
