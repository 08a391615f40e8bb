"""Egress from Kubernetes sandboxes on kubesim: the pod's workload reaches the gateway's proxy
over TCP with the per-sandbox credential its activation carried (in `HTTP_PROXY`'s user info);
an allowed host works, a denied one is refused and listed, a placeholder secret is swapped for
its host, in HTTPS too (the proxy's CA in the workload's trust); a warm pool's profile rules and
secret hosts apply to the sandboxes it serves. (The attacks with a credential:
`security/test_egress_pod_credentials.py`.)

Upstreams listen on 127.0.0.2 and 127.0.0.3 of the host. kubesim's sandbox pods share the host's
network (kubesim does not enforce NetworkPolicies), so what is checked here is the proxy's
admission and decisions, not that a pod has no other way out."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from kubesim.cluster import RunningCluster
from kubesim.controllers import client as kc
from tests.helpers import testca
from tests.helpers.gateway import RunningGateway, running_gateway
from tests.helpers.upstreams import Upstream, upstream
from tests.integration.security.support import sandbox, sh
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.core.fingerprints import SandboxShape
from warmshell.drivers.kubernetes.warm import warmpools

from .conftest import IMAGE, NAMESPACE, driver_config, gateway_settings
from .test_warm import wait_idle

pytestmark = pytest.mark.timeout(120)

SECRET = "k8s-s3cr3t-" + "q" * 20


def free_port() -> int:
    """A port nothing listens on now (for a listener whose address must be known beforehand)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.asynccontextmanager
async def egress_gateway(cluster: RunningCluster, tmp_path: Path, **extra: Any) -> AsyncIterator[RunningGateway]:
    """A gateway on `cluster` whose proxy pods reach over TCP (requests may widen its rules)."""
    state = tmp_path / "state"
    port = free_port()
    network = {
        "network.requests_may_widen": True,
        "network.proxy_listen": f"127.0.0.1:{port}",
        "network.proxy_url": f"http://127.0.0.1:{port}",
        **extra,
    }
    async with running_gateway(state, **gateway_settings(cluster, state), **network) as running:
        yield running


@pytest.fixture
async def gw(cluster: RunningCluster, tmp_path: Path) -> AsyncIterator[RunningGateway]:
    async with egress_gateway(cluster, tmp_path) as running:
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


async def test_https_to_a_secrets_host_gets_the_value_through_the_proxys_ca_in_the_pods_trust(
    cluster: RunningCluster, tmp_path: Path
) -> None:
    for name in ("api", "other"):
        (tmp_path / name).mkdir()
    api_tls, api_ca = testca.server_context(tmp_path / "api", "127.0.0.2")
    other_tls, other_ca = testca.server_context(tmp_path / "other", "127.0.0.3")
    upstream_cas = tmp_path / "upstream-cas.pem"
    upstream_cas.write_bytes(api_ca.read_bytes() + other_ca.read_bytes())
    async with (
        upstream("127.0.0.2", api_tls) as api,
        upstream("127.0.0.3", other_tls) as elsewhere,
        egress_gateway(cluster, tmp_path, **{"network.upstream_ca_file": str(upstream_cas)}) as gw,
    ):
        spec = _spec(api.authority, elsewhere.authority)
        spec.secrets["API_KEY"] = SECRET
        spec.secret_hosts["API_KEY"].hosts.append(api.authority)
        spec.secrets["OTHER_KEY"] = "other-" + SECRET  # makes 127.0.0.3's TLS intercepted too
        spec.secret_hosts["OTHER_KEY"].hosts.append(elsewhere.authority)
        await sandbox(gw, "tls", spec)
        header = '-H "Authorization: Bearer $API_KEY"'
        # curl reads SSL_CERT_FILE: its container's CAs and the proxy's, written by the supervisor.
        code, out, err = await sh(gw, "tls", f"curl -sS {header} https://{api.authority}/secure")
        assert (code, out) == (0, "upstream saw /secure\n"), err
        assert f"Authorization: Bearer {SECRET}".encode() in api.heads[0]
        python = f"import urllib.request as u; print(u.urlopen('https://{api.authority}/py').read().decode(), end='')"
        assert await sh(gw, "tls", f'python3 -c "{python}"') == (0, "upstream saw /py\n", "")
        # API_KEY's placeholder to another intercepted host: refused, never sent.
        code, out, err = await sh(gw, "tls", f"curl -sS -w '%{{http_code}}' {header} https://{elsewhere.authority}/")
        assert (code, out[-3:]) == (0, "403"), err
        assert elsewhere.heads == []
        decisions = (await gw.stub.ListEgress(pb.SandboxRef(name="tls"), metadata=gw.metadata)).decisions
        assert "TLS intercepted" in decisions[0].reason
        assert not decisions[-1].allowed
        assert "placeholder of secret API_KEY" in decisions[-1].reason

        # What the workload was given is a certificate: no key anywhere it reads, and none on
        # the gateway's disk either (derived from the secrets key, held in memory only).
        given = 'printf "%s\\n" "$SSL_CERT_FILE" "$NODE_EXTRA_CA_CERTS"; ls "${SSL_CERT_FILE%/*}"'
        code, out, _ = await sh(gw, "tls", given)
        bundle, ca, *listed = out.split()
        assert (code, sorted(listed)) == (0, ["ca-bundle.pem", "ca.pem"])
        channel = ca.rsplit("/", 2)[0]
        search = f"grep -rl 'PRIVATE KEY' {channel} /workspace 2>/dev/null | wc -l; env | grep -c 'PRIVATE KEY'"
        assert (await sh(gw, "tls", search))[1].split() == ["0", "0"]
        assert (await sh(gw, "tls", f"grep -c 'BEGIN CERTIFICATE' {ca}"))[1] == "1\n"
        # The bundle: its container's CAs, then the proxy's.
        ends_with_ca = f'[ "$(tail -c "$(wc -c < {ca})" {bundle})" = "$(cat {ca})" ] && grep -c "BEGIN CERT" {bundle}'
        code, counted, _ = await sh(gw, "tls", ends_with_ca)
        assert (code, int(counted) > 1) == (0, True)
        on_disk = [p.read_bytes() for p in (tmp_path / "state").rglob("*") if p.is_file() and "egress" in str(p)]
        assert len(on_disk) == 2  # the certificate and the bundle
        assert not any(b"PRIVATE KEY" in data for data in on_disk)


async def test_a_pools_profile_rules_and_secret_hosts_apply_to_the_sandboxes_it_serves(
    cluster: RunningCluster, tmp_path: Path, allowed: Upstream, other: Upstream
) -> None:
    """The profile says what its sandboxes reach and which hosts a request's secret is for; the
    request names neither, and the gateway's default is none. The member was started before any
    of that was known, and trusts the proxy's CA from its activation on (HTTPS to 127.0.0.4)."""
    state = tmp_path / "state"
    tls, ca_file = testca.server_context(tmp_path, "127.0.0.4")
    async with upstream("127.0.0.4", tls) as api:
        hosts = (allowed.authority, api.authority)
        network = warmpools.PoolEgress(allow=hosts, secret_hosts={"API_KEY": hosts})
        template, pool = warmpools.render_pool_pair(
            driver_config(cluster, state),
            name="net",
            namespace=NAMESPACE,
            shape=SandboxShape(workspace="default", image=IMAGE, environment={}),
            replicas=1,
            network=network,
        )
        admin = cluster.client()
        try:
            await admin.create(kc.TEMPLATES, NAMESPACE, template)
            await admin.create(kc.POOLS, NAMESPACE, pool)
        finally:
            await admin.aclose()
        settings = {"network.requests_may_widen": False, "network.upstream_ca_file": str(ca_file)}
        async with egress_gateway(cluster, tmp_path, **settings) as gw:
            await wait_idle(gw, "net", 1)
            spec = pb.SandboxSpec()
            spec.secrets["API_KEY"] = SECRET
            ready = await sandbox(gw, "pooled", spec)
            assert ready.status.allocation == "warm"
            network_condition = next(c for c in ready.status.conditions if c.type == "Network")
            assert network_condition.message.endswith(f"allow {', '.join(hosts)}"), network_condition
            code, seen, _ = await sh(gw, "pooled", 'printf %s "$API_KEY"')
            assert (code, seen[:4]) == (0, "wsp_")
            header = '-H "Authorization: Bearer $API_KEY"'
            fetch = f"curl -sS {header} http://{allowed.authority}/p"
            assert await sh(gw, "pooled", fetch) == (0, "upstream saw /p\n", "")
            assert f"Authorization: Bearer {SECRET}".encode() in allowed.heads[0]
            code, out, err = await sh(gw, "pooled", f"curl -sS {header} https://{api.authority}/tls")
            assert (code, out) == (0, "upstream saw /tls\n"), err
            assert f"Authorization: Bearer {SECRET}".encode() in api.heads[0]
            refused = f"curl -sS -o /dev/null -w '%{{http_code}}' http://{other.authority}/"
            assert await sh(gw, "pooled", refused) == (0, "403", "")
            decisions = (await gw.stub.ListEgress(pb.SandboxRef(name="pooled"), metadata=gw.metadata)).decisions
            assert [(d.allowed, d.rule) for d in decisions] == [
                (True, allowed.authority),
                (True, api.authority),
                (False, ""),
            ]
