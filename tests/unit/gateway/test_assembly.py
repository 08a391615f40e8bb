"""The composition root on its own: `assemble` builds a gateway's parts without a running loop,
a socket or a file, and wires them to each other; a shared (Postgres) store, and only that,
makes the gateway a replica."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import asyncpg
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from warmshell.core.config import GatewayConfig, StoreConfig, load_config
from warmshell.drivers.fake import FakeDriver
from warmshell.gateway.assembly import GatewayParts, Keys, assemble
from warmshell.gateway.inprocess import InProcessLink
from warmshell.gateway.replication import ReplicaWiring
from warmshell.gateway.store.base import Store
from warmshell.gateway.store.postgres import PostgresStore
from warmshell.sandboxio.link import GatewayLink

KEYS = Keys(
    api_token="client-token",
    gateway_id="gw-test",
    signing_key=Ed25519PrivateKey.generate(),
    secrets_key=bytes(32),
    replica_token="replica-token",
)


class UntouchedStore:
    """A store the assembly must not call: building parts is not I/O."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the assembly called store.{name}")


class LeadingDriver(FakeDriver):
    """A fake driver that elects a leader among replicas (as the Kubernetes driver does)."""

    def __init__(self) -> None:
        super().__init__()
        self.leads = False
        self.campaigns = 0

    def campaign(self) -> None:
        self.campaigns += 1

    def leading(self) -> bool:
        return self.leads


class HostingDriver(FakeDriver):
    """A fake driver whose supervisors run in the gateway process (as the local driver's do)."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[GatewayLink] = []

    def supervise_in_process(self, link: GatewayLink) -> None:
        self.links.append(link)


@pytest.fixture
def config(tmp_path: Path) -> GatewayConfig:
    return load_config(None, {"state_dir": str(tmp_path / "state"), "replicas.drain_seconds": 8.0})


def shared_store() -> PostgresStore:
    """A Postgres store never connected: its pool is never reached while assembling."""
    return PostgresStore(cast(asyncpg.Pool, UntouchedStore()), where="nowhere", config=StoreConfig())


def assert_wired(parts: GatewayParts) -> None:
    """Every part uses the same records, sessions, registry, issuer and manager as the others."""
    manager = parts.manager
    assert (manager.records, manager.bus, manager.sessions, manager.driver, manager.vault) == (
        parts.records,
        parts.bus,
        parts.sessions,
        parts.driver,
        parts.vault,
    )
    service = parts.supervisor_service
    assert (service._manager, service._registry, service._activator, service._issuer, service._auth) == (
        manager,
        parts.registry,
        parts.activator,
        parts.issuer,
        parts.auth,
    )
    activator = parts.activator
    assert (activator._registry, activator._records, activator._issuer, activator._vault) == (
        parts.registry,
        parts.records,
        parts.issuer,
        parts.vault,
    )
    assert parts.sandbox_service._execs is parts.execs
    for public in (parts.sandbox_service, parts.file_service):
        assert (public._manager, public._auth) == (manager, parts.auth)
    assert parts.reconciler._manager is manager
    assert parts.expiry._manager is manager
    # The tokens the issuer mints are the ones the authenticator accepts.
    token, _ = parts.issuer.mint(cast(Any, "sbx-1"), "i-1")
    assert parts.auth._issuer.verify(token).sandbox_id == "sbx-1"


def test_a_lone_gateway_is_assembled_without_a_loop_a_socket_or_a_file(config: GatewayConfig, tmp_path: Path) -> None:
    driver = FakeDriver()
    parts = assemble(config, store=cast(Store, UntouchedStore()), driver=driver, keys=KEYS)
    assert_wired(parts)
    assert parts.driver is driver
    assert (parts.replication, parts.wiring, parts.supervisor_link, parts.leadership) == (
        None,
        ReplicaWiring(),
        None,
        None,
    )
    assert parts.leading()
    assert parts.sessions.owner == ""
    assert parts.supervisor_service._replicas is None
    assert (parts.sandbox_service._forwarder, parts.file_service._forwarder) == (None, None)
    assert parts.reconciler._share_progress is None
    assert list(tmp_path.iterdir()) == [], "assembling wrote nothing"


def test_a_shared_store_makes_the_gateway_one_replica_among_others(config: GatewayConfig) -> None:
    driver = LeadingDriver()
    parts = assemble(config, store=shared_store(), driver=driver, keys=KEYS, replica_id="replica-a")
    assert_wired(parts)
    replication = parts.replication
    assert replication is not None
    assert replication.replica_id == "replica-a"
    assert parts.wiring == replication.wiring
    assert parts.wiring.owner == parts.sessions.owner == "replica-a"
    assert parts.wiring.max_connection_age_seconds == 4.0  # half the drain: connections move away in it
    # The session takeover rule and the forwarding read the same directory.
    assert parts.supervisor_service._replicas is replication.directory
    assert (replication.forwarder._directory, replication.forwarder._auth) == (replication.directory, parts.auth)
    assert parts.sandbox_service._forwarder is replication.forwarder
    assert parts.file_service._forwarder is replication.forwarder
    assert parts.reconciler._share_progress == replication.feed.share
    assert parts.auth._replica_token == "replica-token"
    # The singleton work follows the driver's election, and nothing has campaigned yet.
    assert parts.leadership is driver
    assert driver.campaigns == 0
    assert (parts.leading(), parts.reconciler._leading(), parts.expiry._leading()) == (False, False, False)
    driver.leads = True
    assert (parts.leading(), parts.reconciler._leading(), parts.expiry._leading()) == (True, True, True)
    assert replication.loops.tasks == ()


def test_a_lone_gateway_leads_whatever_its_driver_says(config: GatewayConfig) -> None:
    driver = LeadingDriver()
    parts = assemble(config, store=cast(Store, UntouchedStore()), driver=driver, keys=KEYS)
    assert parts.leadership is None
    assert (parts.leading(), parts.reconciler._leading(), parts.expiry._leading()) == (True, True, True)


def test_a_driver_hosting_supervisors_reaches_the_same_supervisor_api_in_process(config: GatewayConfig) -> None:
    driver = HostingDriver()
    parts = assemble(config, store=cast(Store, UntouchedStore()), driver=driver, keys=KEYS)
    assert isinstance(parts.supervisor_link, InProcessLink)
    assert driver.links == [parts.supervisor_link]
    assert parts.supervisor_link._service is parts.supervisor_service
