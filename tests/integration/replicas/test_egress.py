"""Egress with two replicas on kubesim: a pod's proxy connections land on either replica
(round-robin behind an egress "Service"), each admits the credential the activating replica
issued and swaps its placeholder — inside HTTPS too, with a leaf of the CA both derive from the
secrets key they share, which the pod trusts whichever replica activated it — and `ListEgress` on
either replica lists every decision (and what the live ones know when one is gone)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from tests.helpers import testca
from tests.helpers.replicas import Balancer, Replica, ReplicaSet, balancer, wait_phase
from tests.helpers.upstreams import Upstream, upstream
from warmshell.api.v1 import sandbox_pb2 as pb

from .scenario import exec_via

pytestmark = pytest.mark.timeout(180)

SECRET = "replica-s3cr3t-" + "z" * 16
FETCHES = 4


@pytest.fixture
async def allowed() -> AsyncIterator[Upstream]:
    async with upstream("127.0.0.2") as server:
        yield server


@pytest.fixture
async def egress_front(replicas: ReplicaSet) -> AsyncIterator[Balancer]:
    """The chart's `<fullname>-egress` Service: round-robin over the replicas' proxy ports."""
    async with balancer(lambda: [r.egress for r in replicas.replicas if r.alive and r.egress]) as running:
        yield running


async def two_replicas(replicas: ReplicaSet, egress_front: Balancer, **network: Any) -> tuple[Replica, Replica]:
    """Two replicas whose proxies pods reach through `egress_front` (requests may widen rules)."""
    settings = {
        "requests_may_widen": True,
        "proxy_listen": "127.0.0.1:0",
        "proxy_url": f"http://{egress_front.address}",
        **network,
    }
    return await replicas.start_one(network=settings), await replicas.start_one(network=settings)


async def create_with_secret(stubs: list[Any], md: Any, name: str, host: str) -> None:
    """A sandbox, created on the first replica, that may reach `host` with SECRET as API_KEY for
    it; once the second sees it Ready."""
    spec = pb.SandboxSpec(command=["sleep", "600"], network=pb.NetworkPolicy(allow=[host]))
    spec.secrets["API_KEY"] = SECRET
    spec.secret_hosts["API_KEY"].hosts.append(host)
    await stubs[0].CreateSandbox(pb.CreateSandboxRequest(name=name, spec=spec), metadata=md)
    await wait_phase(stubs[1], md, name)


async def test_decisions_from_either_replica_and_credentials_on_both(
    replicas: ReplicaSet, egress_front: Balancer, allowed: Upstream
) -> None:
    first, second = await two_replicas(replicas, egress_front)
    stubs = [replicas.stub(r.tcp) for r in (first, second)]
    md = replicas.metadata
    await create_with_secret(stubs, md, "net", allowed.authority)
    fetch = f'curl -sS -H "Authorization: Bearer $API_KEY" http://{allowed.authority}/n'
    for _ in range(FETCHES):
        assert await exec_via(stubs[0], md, "net", ["sh", "-c", fetch]) == (0, b"upstream saw /n\n")
    # Both replicas served some of them, and swapped the placeholder the activating one made.
    assert sorted(egress_front.connections) == sorted([first.egress, second.egress])
    assert all(f"Authorization: Bearer {SECRET}".encode() in head for head in allowed.heads)
    assert len(allowed.heads) == FETCHES
    for stub in stubs:
        listed = await stub.ListEgress(pb.SandboxRef(name="net"), metadata=md)
        assert [(d.host, d.port, d.allowed) for d in listed.decisions] == [(allowed.host, allowed.port, True)] * FETCHES
        assert [d.time_ms for d in listed.decisions] == sorted(d.time_ms for d in listed.decisions)
    # A replica that cannot answer leaves its part out; the call still answers with the rest.
    replicas.kill(second)
    listed = await stubs[0].ListEgress(pb.SandboxRef(name="net"), metadata=md)
    assert len(listed.decisions) == egress_front.connections[first.egress]


async def test_https_placeholders_are_swapped_by_either_replica(
    replicas: ReplicaSet, egress_front: Balancer, tmp_path: Path
) -> None:
    tls, ca_file = testca.server_context(tmp_path, "127.0.0.2")
    async with upstream("127.0.0.2", tls) as api:
        first, second = await two_replicas(replicas, egress_front, upstream_ca_file=str(ca_file))
        stubs = [replicas.stub(r.tcp) for r in (first, second)]
        md = replicas.metadata
        await create_with_secret(stubs, md, "tls", api.authority)
        # One CA, whichever replica made it (its key and name): the pod trusts either one's leaves.
        files = [r.state / "egress-shared" / "ca.pem" for r in (first, second)]
        made = [x509.load_pem_x509_certificate(path.read_bytes()) for path in files]
        assert made[0].public_key() == made[1].public_key()
        assert made[0].subject == made[1].subject
        fetch = f'curl -sS -H "Authorization: Bearer $API_KEY" https://{api.authority}/s'
        for _ in range(FETCHES):
            assert await exec_via(stubs[0], md, "tls", ["sh", "-c", fetch]) == (0, b"upstream saw /s\n")
        assert sorted(egress_front.connections) == sorted([first.egress, second.egress])
        assert len(api.heads) == FETCHES
        assert all(f"Authorization: Bearer {SECRET}".encode() in head for head in api.heads)
