"""Attacks on a Kubernetes sandbox's egress credential (kubesim), from inside a pod, with what a
workload sees: its own proxy URL, and another sandbox's if it ever got hold of one. Pods reach
the gateway over TCP here, so each credential is bound to the address its supervisor registered
from (127.0.0.1); another pod is played by connecting from 127.0.0.9.

Every attempt is answered 407 and reaches no upstream: another sandbox's credential under the
attacker's own id, a made-up one under the victim's, none at all, the victim's whole URL from
another address, and the victim's URL from its own address after the victim was deleted."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kubesim.cluster import RunningCluster
from tests.helpers.gateway import RunningGateway, running_gateway
from tests.helpers.upstreams import Upstream, upstream
from tests.integration.drivers_kubernetes.conftest import admin, cluster, gateway_settings  # noqa: F401
from tests.integration.drivers_kubernetes.test_egress import free_port, proxy_url
from tests.integration.security.support import sandbox, sh
from warmshell.api.v1 import sandbox_pb2 as pb

pytestmark = pytest.mark.timeout(150)


@pytest.fixture
async def gw(cluster: RunningCluster, tmp_path: Path) -> AsyncIterator[RunningGateway]:  # noqa: F811
    state = tmp_path / "state"
    grpc_port, egress_port = free_port(), free_port()
    settings = gateway_settings(cluster, state) | {
        "listen_tcp": f"127.0.0.1:{grpc_port}",
        "kubernetes.gateway_address": f"127.0.0.1:{grpc_port}",
        "network.requests_may_widen": True,
        "network.proxy_listen": f"127.0.0.1:{egress_port}",
        "network.proxy_url": f"http://127.0.0.1:{egress_port}",
    }
    async with running_gateway(state, **settings) as running:
        yield running


@pytest.fixture
async def allowed() -> AsyncIterator[Upstream]:
    async with upstream("127.0.0.2") as server:
        yield server


async def test_a_credential_buys_only_its_own_live_sandbox_from_its_own_pod(
    gw: RunningGateway, allowed: Upstream
) -> None:
    allow = pb.SandboxSpec(network=pb.NetworkPolicy(allow=[allowed.authority]))
    await sandbox(gw, "victim", allow)
    await sandbox(gw, "attacker", pb.SandboxSpec())  # its own policy allows nothing
    victim_url = await proxy_url(gw, "victim")
    victim_id, _, rest = victim_url.removeprefix("http://").partition(":")
    victim_credential, _, proxy = rest.partition("@")
    attacker = (await gw.get("attacker")).id
    fetch = f"curl -sS -o /dev/null -w '%{{http_code}}' http://{allowed.authority}/"
    attempts = {
        "its own id, the victim's credential": f"{fetch} --proxy 'http://{attacker}:{victim_credential}@{proxy}'",
        "the victim's id, a made-up credential": f"{fetch} --proxy 'http://{victim_id}:wsx_AAAA.BBBB@{proxy}'",
        "no credential at all": f"{fetch} --proxy 'http://{proxy}'",
        "the victim's whole URL from another pod": f"{fetch} --interface 127.0.0.9 --proxy '{victim_url}'",
    }
    for what, command in attempts.items():
        assert await sh(gw, "attacker", command) == (0, "407", ""), what
    assert allowed.heads == []
    # From the victim's own address it works while the victim lives, and not once it is deleted.
    assert await sh(gw, "victim", fetch) == (0, "200", "")
    assert await sh(gw, "attacker", f"{fetch} --proxy '{victim_url}'") == (0, "200", "")
    await gw.delete("victim")
    assert await sh(gw, "attacker", f"{fetch} --proxy '{victim_url}'") == (0, "407", "")
    assert len(allowed.heads) == 2
