"""The egress gate's attach: a sandbox whose policy allows nothing gets no proxy socket and
costs no socket path; the serving pool's view is read once per activation (none for a cold
create); a policy that allows something gets its socket and the proxy variables."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from warmshell.core import egress
from warmshell.core.config import NetworkConfig
from warmshell.core.ids import Fingerprint, SandboxId
from warmshell.core.models import NetworkRequest, SandboxRecord, SandboxSpec
from warmshell.drivers.base import PoolView
from warmshell.drivers.local.runtime import etcstage
from warmshell.gateway.egress.gate import EgressGate
from warmshell.gateway.egress.interception import CertificateAuthority
from warmshell.gateway.egress.proxy import EgressProxy

POOL = Fingerprint("f" * 16)


class Sockets:
    """A driver's egress directories (a spy: which instances were asked for)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.asked: list[str] = []

    def egress_socket(self, instance_id: str) -> Path | None:
        self.asked.append(instance_id)
        return self.directory / "proxy.sock"


class Pools:
    """The driver's pool views (a spy: how often they were made)."""

    def __init__(self, *views: PoolView) -> None:
        self.views: tuple[PoolView, ...] = views
        self.calls = 0

    def __call__(self) -> Sequence[PoolView]:
        self.calls += 1
        return self.views


def _view(*, allow: tuple[str, ...] | None = None, secret_hosts: dict[str, tuple[str, ...]] | None = None) -> PoolView:
    return PoolView(
        name="p",
        workspace="default",
        fingerprint=POOL,
        image="",
        environment={},
        cpu="1",
        memory="512Mi",
        desired=1,
        ready=1,
        idle=1,
        hits=0,
        misses=0,
        source="p.toml",
        network_allow=allow,
        secret_hosts=secret_hosts or {},
    )


def _record(*allow: str) -> SandboxRecord:
    return SandboxRecord(id=SandboxId("sb-1"), name="one", spec=SandboxSpec(network=NetworkRequest(allow=list(allow))))


def _gate(tmp_path: Path, pools: Pools, **config: object) -> tuple[EgressGate, Sockets, EgressProxy]:
    network = NetworkConfig.model_validate(config)
    proxy = EgressProxy(network)
    sockets = Sockets(tmp_path)
    return EgressGate(network, proxy, sockets, pools=pools), sockets, proxy


async def test_a_cold_sandbox_without_egress_costs_no_pool_views_and_no_socket_path(tmp_path: Path) -> None:
    pools = Pools(_view())
    gate, sockets, proxy = _gate(tmp_path, pools)
    attached = await gate.attach(_record(), "i-1", None, {"TOKEN": "t"})
    assert (attached.environment, attached.secrets) == ({}, {"TOKEN": "t"})
    assert (pools.calls, sockets.asked) == (0, [])
    assert proxy.policy("sb-1") is None
    assert not (tmp_path / "proxy.sock").exists()


async def test_a_warm_sandbox_without_egress_reads_its_pool_once_and_gets_no_socket(tmp_path: Path) -> None:
    pools = Pools(_view(secret_hosts={"TOKEN": ("api.example.com",)}))
    gate, sockets, proxy = _gate(tmp_path, pools)
    attached = await gate.attach(_record(), "i-1", POOL, {"TOKEN": "t"})
    # Its secret names a host: a placeholder, though nothing can carry it out.
    assert attached.environment == {}
    assert attached.secrets["TOKEN"] != "t"
    assert (pools.calls, sockets.asked) == (1, [])
    assert proxy.policy("sb-1") is None


async def test_a_pool_that_allows_a_host_opens_the_sandboxs_socket(tmp_path: Path) -> None:
    pools = Pools(_view(allow=("example.com",)))
    gate, sockets, proxy = _gate(tmp_path, pools)
    try:
        attached = await gate.attach(_record(), "i-1", POOL, {})
        assert attached.environment["HTTPS_PROXY"] == "http://127.0.0.1:3128"
        assert (pools.calls, sockets.asked) == (1, ["i-1"])
        assert (tmp_path / "proxy.sock").is_socket()
        policy = proxy.policy("sb-1")
        assert policy is not None
        assert policy.allows_anything
        # Activated again (a supervisor restarted in place) once its profile allows nothing:
        # the socket from before is closed and removed.
        pools.views = (_view(),)
        attached = await gate.attach(_record(), "i-1", POOL, {})
        assert attached.environment == {}
        assert proxy.policy("sb-1") is None
        assert not (tmp_path / "proxy.sock").exists()
    finally:
        await gate.aclose()


async def test_a_request_alone_cannot_open_a_socket_where_nothing_is_allowed(tmp_path: Path) -> None:
    gate, sockets, proxy = _gate(tmp_path, Pools())
    attached = await gate.attach(_record("example.com"), "i-1", None, {})
    assert (attached.environment, sockets.asked, proxy.policy("sb-1")) == ({}, [], None)
    widening, sockets, proxy = _gate(tmp_path, Pools(), requests_may_widen=True)
    try:
        attached = await widening.attach(_record("example.com"), "i-1", None, {})
        assert "HTTP_PROXY" in attached.environment
        assert sockets.asked == ["i-1"]
    finally:
        await widening.aclose()


async def test_the_gateways_own_rules_apply_without_a_pool_or_a_request(tmp_path: Path) -> None:
    gate, sockets, proxy = _gate(tmp_path, Pools(), default="all", deny=["internal.example.com"])
    try:
        await gate.attach(_record(), "i-1", None, {})
        assert sockets.asked == ["i-1"]
        policy = proxy.policy("sb-1")
        assert policy is not None
        assert policy.summary == "allow *; deny internal.example.com"
        assert policy == gate.policy(_record(), None)
        narrowed = gate.policy(_record("example.com"), None)
        assert narrowed.summary == "allow *; example.com; deny internal.example.com"
    finally:
        await gate.aclose()


@pytest.mark.parametrize("staged_etc", [True, False], ids=["host-root", "image"])
async def test_an_intercepting_activation_links_the_shared_trust_or_copies_it(tmp_path: Path, staged_etc: bool) -> None:
    """A sandbox on the host's root (its egress directory has the links made at its start: to
    the host's bundle, and its trust names into the staged /etc's shared trust) gets its system
    bundle relinked to the shared bundle; one whose /etc is an image's gets copies of the CA and
    the bundle."""
    network = NetworkConfig.model_validate({"requests_may_widen": True})
    egress_dir = tmp_path / "i-1.egress"
    egress_dir.mkdir()
    if staged_etc:
        etcstage.link_system_bundle(egress_dir)
    authority = CertificateAuthority(tmp_path / "state")
    gate = EgressGate(network, EgressProxy(network), Sockets(egress_dir), pools=Pools(), authority=authority)
    record = SandboxRecord(
        id=SandboxId("sb-1"),
        name="one",
        spec=SandboxSpec(
            network=NetworkRequest(allow=["api.example.com"]), secret_hosts={"TOKEN": ["api.example.com"]}
        ),
    )
    try:
        attached = await gate.attach(record, "i-1", None, {"TOKEN": "t"})
    finally:
        await gate.aclose()
    assert attached.environment["SSL_CERT_FILE"] == f"{egress.SANDBOX_DIR}/{egress.BUNDLE_FILE}"
    names = (egress.CA_FILE, egress.BUNDLE_FILE)
    if staged_etc:
        shared = {name: f"{egress.SHARED_TRUST_DIR}/{name}" for name in names}
        assert {name: str((egress_dir / name).readlink()) for name in names} == shared
        assert str((egress_dir / egress.SYSTEM_BUNDLE_COPY).readlink()) == shared[egress.BUNDLE_FILE]
    else:
        assert (egress_dir / egress.CA_FILE).read_bytes() == authority.certificate_pem
        assert (egress_dir / egress.BUNDLE_FILE).read_bytes() == authority.bundle_file.read_bytes()
        assert not (egress_dir / egress.SYSTEM_BUNDLE_COPY).exists()
