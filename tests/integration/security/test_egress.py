"""Egress through the gateway's proxy, from real bwrap'd sandboxes: what a policy allows
works, everything else is refused (and logged), and nothing bypasses the proxy.

Upstreams listen on 127.0.0.2 and 127.0.0.3 of the host: the sandbox's own loopback (its own
network namespace) reaches neither, so a connection that works went through the proxy."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.helpers import testca
from tests.helpers.gateway import RunningGateway, pool_named, running_gateway, wait_pools
from tests.helpers.upstreams import Upstream, upstream
from tests.integration.security.support import sandbox, sh
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.core.egress import SYSTEM_BUNDLE
from warmshell.core.errors import FailedPreconditionError

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


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


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
    # No placeholder, no interception: the system bundle is the host's, as it is.
    assert (await sh(gw, "net", f"sha256sum < {SYSTEM_BUNDLE}"))[1].split()[0] == _sha256(Path(SYSTEM_BUNDLE))


async def test_no_proxy_for_a_sandbox_whose_policy_allows_nothing(gw: RunningGateway, allowed: Upstream) -> None:
    ready = await sandbox(gw, "closed")
    network = next(c for c in ready.status.conditions if c.type == "Network")
    assert (network.status, network.reason) == ("False", "NoEgress")
    assert await sh(gw, "closed", "echo ${HTTP_PROXY:-unset}") == (0, "unset\n", "")
    # No socket was ever made for it: its egress directory holds no proxy path.
    code, listing, _ = await sh(gw, "closed", "ls -A /run/warmshell/egress")
    assert code == 0
    assert "proxy.sock" not in listing.split()
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


async def test_deleting_a_sandbox_cuts_its_open_connections(gw: RunningGateway, allowed: Upstream) -> None:
    await sandbox(gw, "net", _spec(allowed.authority))
    # A connection that stays open (the upstream holds it) in the background of the sandbox.
    script = (
        f"curl -sS -N http://{allowed.authority}/hold > /tmp/held 2>&1 & until [ -s /tmp/held ]; do sleep 0.05; done"
    )
    assert (await sh(gw, "net", script))[0] == 0
    assert allowed.open_connections == 1
    allowed.closed.clear()
    await gw.delete("net")
    async with asyncio.timeout(10):
        await allowed.closed.wait()
    assert allowed.open_connections == 0


async def test_a_flood_is_refused_for_its_sandbox_alone(gw: RunningGateway, allowed: Upstream, other: Upstream) -> None:
    await sandbox(gw, "flood", _spec(allowed.authority))
    await sandbox(gw, "calm", _spec(other.authority))
    # Holds 8 (network.max_connections) open, then 20 more: each is closed at accept (a 429
    # written first, which the client may or may not read before the close).
    flood = f"""
for i in $(seq 8); do curl -sS -N http://{allowed.authority}/hold > /tmp/h$i 2>&1 & done
until [ $(cat /tmp/h* 2>/dev/null | grep -c holding) -eq 8 ]; do sleep 0.05; done
for i in $(seq 20); do curl -s -o /dev/null -w '%{{http_code}}\\n' http://{allowed.authority}/more || true; done
"""
    code, out, err = await sh(gw, "flood", flood)
    assert code == 0, err
    assert len(out.split()) == 20
    assert set(out.split()) <= {"429", "000"}
    assert [head.split(b" ")[1] for head in allowed.heads] == [b"/hold"] * 8
    # The other sandbox's traffic and the API are unaffected.
    assert await sh(gw, "calm", f"curl -sS http://{other.authority}/calm") == (0, "upstream saw /calm\n", "")
    assert (await gw.get("flood")).status.phase == pb.SANDBOX_PHASE_READY


async def test_a_malformed_request_or_a_huge_header_is_refused(gw: RunningGateway, allowed: Upstream) -> None:
    await sandbox(gw, "net", _spec(allowed.authority))
    client = f"""
import socket, sys
def ask(data):
    with socket.create_connection(("127.0.0.1", 3128)) as s:
        try:
            s.sendall(data)
        except OSError:
            pass
        return s.recv(100).split(b"\\r\\n")[0].decode()
print(ask(b"NOT A REQUEST\\r\\n\\r\\n"))
print(ask(b"GET /origin-form HTTP/1.1\\r\\nHost: {allowed.authority}\\r\\n\\r\\n"))
print(ask(b"GET http://{allowed.authority}/ HTTP/1.1\\r\\nX-Big: " + b"a" * (1 << 20) + b"\\r\\n\\r\\n"))
"""
    code, out, err = await sh(gw, "net", f"python3 -c '{client}'")
    assert code == 0, err
    assert out.splitlines() == [
        "HTTP/1.1 400 Bad Request",
        "HTTP/1.1 400 Bad Request",
        "HTTP/1.1 431 Request Header Fields Too Large",
    ]
    assert allowed.heads == []


async def test_a_create_with_a_policy_is_served_warm(tmp_path: Path, allowed: Upstream) -> None:
    # The policy is applied at activation, outside the sandbox: never part of the pool match.
    pools = tmp_path / "pools"
    pools.mkdir()
    (pools / "p.toml").write_text('version = 1\nworkspace = "default"\nreplicas = 1\nimage = ""\n')
    settings = {
        "local.pools_dir": str(pools),
        "local.pool_reload_interval_seconds": 0.1,
        "network.requests_may_widen": True,
    }
    async with running_gateway(tmp_path / "state", **settings) as gw:
        await wait_pools(gw, lambda r: (p := pool_named(r, "p")) is not None and p.idle >= 1)
        ready = await sandbox(gw, "warm", _spec(allowed.authority))
        assert ready.status.allocation == "warm"
        assert await sh(gw, "warm", f"curl -sS http://{allowed.authority}/warm") == (0, "upstream saw /warm\n", "")


async def test_a_profile_allows_and_a_request_only_narrows(tmp_path: Path, allowed: Upstream, other: Upstream) -> None:
    pools = tmp_path / "pools"
    pools.mkdir()
    profile = 'version = 1\nworkspace = "default"\nreplicas = 2\nimage = ""\n[network]\nallow = ["127.0.0.0/8"]\n'
    (pools / "p.toml").write_text(profile)
    settings = {"local.pools_dir": str(pools), "local.pool_reload_interval_seconds": 0.1}
    async with running_gateway(tmp_path / "state", **settings) as gw:
        await wait_pools(gw, lambda r: (p := pool_named(r, "p")) is not None and p.idle >= 2)
        await sandbox(gw, "profile")
        assert await sh(gw, "profile", f"curl -sS http://{other.authority}/p") == (0, "upstream saw /p\n", "")
        # Narrowed to one host of the profile's network, and a host outside it asked for too.
        ready = await sandbox(gw, "narrow", _spec(allowed.authority, "pypi.example"))
        assert ready.status.allocation == "warm"
        assert await sh(gw, "narrow", f"curl -sS http://{allowed.authority}/n") == (0, "upstream saw /n\n", "")
        _code, out, _ = await sh(gw, "narrow", f"curl -sS -o /dev/null -w '%{{http_code}}' http://{other.authority}/")
        assert out == "403"
        narrowed = (await _egress(gw, "narrow")).decisions
        assert [d.allowed for d in narrowed] == [True, False]


async def test_a_placeholder_secret_is_swapped_for_its_host_and_refused_elsewhere(
    gw: RunningGateway, allowed: Upstream, other: Upstream
) -> None:
    value = "s3cr3t-" + "v" * 24
    spec = _spec(allowed.authority, other.authority)
    spec.secrets["API_KEY"] = value
    spec.secret_hosts["API_KEY"].hosts.append(allowed.authority)
    await sandbox(gw, "sec", spec)
    code, seen, _ = await sh(gw, "sec", 'printf %s "$API_KEY"')
    assert code == 0
    assert seen.startswith("wsp_")
    header = '-H "Authorization: Bearer $API_KEY"'
    assert await sh(gw, "sec", f"curl -sS {header} http://{allowed.authority}/api") == (0, "upstream saw /api\n", "")
    assert f"Authorization: Bearer {value}".encode() in allowed.heads[0]
    assert seen.encode() not in allowed.heads[0]
    code, out, _ = await sh(gw, "sec", f"curl -sS -o /dev/null -w '%{{http_code}}' {header} http://{other.authority}/")
    assert out == "403"
    assert other.heads == []
    refused = (await _egress(gw, "sec")).decisions[-1]
    assert (refused.host, refused.allowed) == (other.host, False)
    assert "placeholder of secret API_KEY" in refused.reason
    # The value is nowhere inside: no process's environment, no file the workload can read.
    # (Searched for as a pattern that does not match itself: this command's own argv is in /proc.)
    pattern = "s3cr3t-v\\{24\\}"
    search = (
        f"cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | grep -c '{pattern}';"
        f" grep -rl '{pattern}' /workspace /tmp /run /etc 2>/dev/null | wc -l"
    )
    assert (await sh(gw, "sec", search))[1].split() == ["0", "0"]


async def test_a_placeholder_goes_into_the_url_only_of_a_host_marked_for_it(
    gw: RunningGateway, allowed: Upstream, other: Upstream
) -> None:
    spec = _spec(allowed.authority, other.authority)
    spec.secrets["MAPS_KEY"] = "maps-key-value"
    spec.secret_hosts["MAPS_KEY"].hosts.extend([allowed.authority + "?", other.authority])
    await sandbox(gw, "url", spec)
    assert await sh(gw, "url", f'curl -sS "http://{allowed.authority}/geo?key=$MAPS_KEY"') == (
        0,
        "upstream saw /geo?key=maps-key-value\n",
        "",
    )
    # The other host takes it in headers only: its URL keeps the placeholder.
    code, out, _ = await sh(gw, "url", f'curl -sS -H "X-Key: $MAPS_KEY" "http://{other.authority}/geo?key=$MAPS_KEY"')
    assert code == 0
    assert out.startswith("upstream saw /geo?key=wsp_")
    assert b"X-Key: maps-key-value" in other.heads[0]


async def test_a_profile_names_the_hosts_of_a_requests_secret(tmp_path: Path, allowed: Upstream) -> None:
    pools = tmp_path / "pools"
    pools.mkdir()
    profile = 'version = 1\nworkspace = "default"\nreplicas = 1\nimage = ""\n[network]\nallow = ["127.0.0.0/8"]\n'
    profile += '[activation]\nsecret_hosts = { API_KEY = ["127.0.0.2"] }\n'
    (pools / "p.toml").write_text(profile)
    settings = {"local.pools_dir": str(pools), "local.pool_reload_interval_seconds": 0.1}
    async with running_gateway(tmp_path / "state", **settings) as gw:
        await wait_pools(gw, lambda r: (p := pool_named(r, "p")) is not None and p.idle >= 1)
        spec = pb.SandboxSpec()
        spec.secrets["API_KEY"] = "profile-placed-value"  # the request names no hosts for it
        ready = await sandbox(gw, "sec", spec)
        assert ready.status.allocation == "warm"
        code, seen, _ = await sh(gw, "sec", 'printf %s "$API_KEY"')
        assert (code, seen[:4]) == (0, "wsp_")
        header = '-H "Authorization: Bearer $API_KEY"'
        assert await sh(gw, "sec", f"curl -sS {header} http://{allowed.authority}/p") == (0, "upstream saw /p\n", "")
        assert b"Authorization: Bearer profile-placed-value" in allowed.heads[0]


async def test_a_placeholder_is_swapped_inside_https_to_its_host_only(tmp_path: Path) -> None:
    tls, ca_file = testca.server_context(tmp_path, "127.0.0.2")
    overrides = {"network.requests_may_widen": True, "network.upstream_ca_file": str(ca_file)}
    async with (
        upstream("127.0.0.2", tls) as api,
        upstream("127.0.0.3", tls) as elsewhere,
        running_gateway(tmp_path / "state", **overrides) as gw,
    ):
        spec = _spec(api.authority, elsewhere.authority)
        spec.secrets["API_KEY"] = "real-api-key-value"
        spec.secret_hosts["API_KEY"].hosts.append(api.authority)
        await sandbox(gw, "tls", spec)
        header = '-H "Authorization: Bearer $API_KEY"'
        # curl trusts the bundle the sandbox was given (the host's CAs and the gateway's).
        code, out, err = await sh(gw, "tls", f"curl -sS {header} https://{api.authority}/secure")
        assert (code, out) == (0, "upstream saw /secure\n"), err
        assert b"Authorization: Bearer real-api-key-value" in api.heads[0]
        # Another host is tunnelled untouched: its certificate is its own (the gateway's CA is
        # not in it), and the placeholder goes there as it is, never the value.
        code, _, err = await sh(gw, "tls", f"curl -sS {header} https://127.0.0.3:{elsewhere.port}/")
        assert code != 0
        assert "certificate" in err
        python = (
            f"import ssl, urllib.request as u; print(u.urlopen('https://{api.authority}/py').read().decode(), end='')"
        )
        assert await sh(gw, "tls", f'python3 -c "{python}"') == (0, "upstream saw /py\n", "")
        decisions = (await _egress(gw, "tls")).decisions
        assert "TLS intercepted" in decisions[0].reason
        assert "TLS intercepted" not in decisions[1].reason
        # A tool told nothing reads the system path: the host's CAs there, and the gateway's.
        bare = f"env -u SSL_CERT_FILE -u CURL_CA_BUNDLE curl -sS {header} https://{api.authority}/system"
        assert await sh(gw, "tls", bare) == (0, "upstream saw /system\n", "")
        host_count = Path(SYSTEM_BUNDLE).read_text().count("BEGIN CERTIFICATE")
        counted = await sh(gw, "tls", f"grep -c 'BEGIN CERTIFICATE' {SYSTEM_BUNDLE}")
        assert counted == (0, f"{host_count + 1}\n", "")


async def test_an_intercepted_connection_serves_several_requests_each_swapped(tmp_path: Path) -> None:
    tls, ca_file = testca.server_context(tmp_path, "127.0.0.2")
    overrides = {"network.requests_may_widen": True, "network.upstream_ca_file": str(ca_file)}
    async with upstream("127.0.0.2", tls) as api, running_gateway(tmp_path / "state", **overrides) as gw:
        spec = _spec(api.authority)
        spec.secrets["API_KEY"] = "real-api-key-value"
        spec.secret_hosts["API_KEY"].hosts.append(api.authority)
        spec.secrets["OTHER"] = "other-value"
        spec.secret_hosts["OTHER"].hosts.append("other.example")
        await sandbox(gw, "ka", spec)
        # curl reuses its connection for a second URL: both requests, a body each, one upstream connection.
        command = f'curl -sS -H "Authorization: Bearer $API_KEY" -d hello https://{api.authority}/one https://{api.authority}/two'
        assert await sh(gw, "ka", command) == (0, "upstream saw /one\nupstream saw /two\n", "")
        assert api.accepted == 1
        assert [head.split(b" ")[1] for head in api.heads] == [b"/one", b"/two"]
        assert all(b"Authorization: Bearer real-api-key-value" in head for head in api.heads)
        assert api.bodies == [b"hello", b"hello"]
        # On one connection: a chunked body, then a request carrying a placeholder not for this host.
        client = f"""
import http.client, os
c = http.client.HTTPSConnection("127.0.0.1", 3128)
c.set_tunnel("{api.authority}")
c.request("POST", "/chunked", body=iter([b"ab", b"cd"]), headers={{"X-Key": os.environ["API_KEY"]}})
r = c.getresponse(); print(r.status, r.read().decode().strip())
c.request("GET", "/leak", headers={{"X-Key": os.environ["OTHER"]}})
r = c.getresponse(); print(r.status, r.read().decode().strip())
"""
        code, out, err = await sh(gw, "ka", f"python3 -c '{client}'")
        assert code == 0, err
        lines = out.splitlines()
        assert lines[0] == "200 upstream saw /chunked"
        assert lines[1].startswith("403 ")
        assert "placeholder of secret OTHER" in lines[1]
        assert b"X-Key: real-api-key-value" in api.heads[2]
        assert api.bodies[2] == b"abcd"
        assert [head.split(b" ")[1] for head in api.heads] == [b"/one", b"/two", b"/chunked"]
        refused = (await _egress(gw, "ka")).decisions[-1]
        assert (refused.allowed, refused.host) == (False, api.host)


async def test_a_proxy_that_cannot_start_fails_the_gateway_start_in_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-ca.pem"
    with pytest.raises(FailedPreconditionError) as caught:
        async with running_gateway(tmp_path / "state", **{"network.upstream_ca_file": str(missing)}):
            pass
    assert str(missing) in str(caught.value)
    assert "network.upstream_ca_file" in str(caught.value)
    assert "\n" not in str(caught.value)
