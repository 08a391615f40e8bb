"""A create's secrets handed in memory to its own activation (`gateway/secrethandover.py`),
attacked: whoever else asks for them (another sandbox's activation, a second activation of the
same sandbox, a replica that did not receive the create, a fork's child, a wrong proof) gets the
sealed row or nothing; the values are held no longer than the create's driver call, nor past
their bound; a gateway restarted between the create and the activation activates from the
sealed row. The gateway's parts are real (SQLite store, registry, vault, activator, manager);
the driver is the fake one, paused where an attack needs the create to be in flight, and one
warm create goes through the real local driver and its real activation."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.helpers.gateway import running_gateway, wait_pools
from tests.integration.gateway.test_warm_pools import idle, write_profile
from tests.integration.security.support import sandbox, sh
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.core import specs
from warmshell.core.errors import PermissionDeniedError, UnavailableError
from warmshell.core.ids import InstanceId, SandboxId
from warmshell.core.models import SandboxRecord
from warmshell.drivers.base import Bound, CreateRequest, DriverSandbox, SupervisorIdentity, WarmPending
from warmshell.drivers.fake import FakeDriver
from warmshell.gateway import forking
from warmshell.gateway.activation import GatewayActivator
from warmshell.gateway.events import EventBus
from warmshell.gateway.manager import SandboxManager
from warmshell.gateway.records import SandboxRecords
from warmshell.gateway.registry import Registry
from warmshell.gateway.secrethandover import SecretHandover
from warmshell.gateway.secretvault import KIND_SECRETS, SecretVault
from warmshell.gateway.sessions import SessionTable
from warmshell.gateway.store.base import Store
from warmshell.gateway.store.sqlite import open_sqlite_store
from warmshell.gateway.tokens import SandboxTokenIssuer

pytestmark = pytest.mark.timeout(60)

Activation = spb.SupervisorActivationMessage
KEY = bytes(range(32))
_MEMBERS = itertools.count()


class _PausedDriver(FakeDriver):
    """The fake driver, the create of the sandbox named `held` kept at `gate` until it is set;
    `entered` is set once that create waits there."""

    def __init__(self, handler: Callable[[CreateRequest], None] | None = None) -> None:
        super().__init__(handler)
        self.held = ""
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()
        self.requests: list[CreateRequest] = []

    async def create(self, request: CreateRequest) -> DriverSandbox:
        self.requests.append(request)
        if request.name == self.held:
            self.entered.set()
            await self.gate.wait()
        return await super().create(request)


@dataclass
class _Replica:
    """One gateway's parts over a store (several replicas may share one)."""

    store: Store
    driver: _PausedDriver = field(default_factory=_PausedDriver)
    registry: Registry[Activation] = field(default_factory=Registry)
    sealed_reads: list[SandboxId] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.records = SandboxRecords(self.store, EventBus())
        self.vault = SecretVault(self.store, KEY)
        issuer = SandboxTokenIssuer(Ed25519PrivateKey.generate(), gateway_id="g", ttl_seconds=600)
        self.activator = GatewayActivator(self.registry, self.records, issuer, self.vault)
        self.manager = SandboxManager(
            records=self.records, driver=self.driver, bus=EventBus(), sessions=SessionTable(), vault=self.vault
        )
        get = self.vault.get

        async def counted(sandbox_id: SandboxId) -> dict[str, str]:
            self.sealed_reads.append(sandbox_id)
            return await get(sandbox_id)

        self.vault.get = counted  # type: ignore[method-assign]

    async def start(self) -> None:
        await self.driver.start(self.activator)

    def warm_member(self) -> InstanceId:
        """A pool member the fake driver gives to its next create, registered and waiting here."""
        return self.member(InstanceId(self.driver.add_warm_instance().split(".")[1]))

    def member(self, instance: InstanceId | None = None) -> InstanceId:
        """A pool member registered and waiting here, which the driver does not know of (a test
        activates it itself; the driver's creates go cold)."""
        instance = instance or InstanceId(f"m-{next(_MEMBERS)}")
        self.registry.register(SupervisorIdentity("fake", instance, instance, "default", WarmPending(self.driver.pool)))
        return instance

    async def activation(self, instance: InstanceId, record: SandboxRecord, proof: str) -> Activation:
        """Activate `instance` for `record` here, as a driver would; what it was sent."""
        registration = self.registry.pending(instance)
        await self.activator.activate(instance_id=instance, sandbox_id=record.id, proof=proof, reason="test")
        sent = await registration.next_outcome()
        assert isinstance(sent, Activation), sent
        return sent

    def reregister(self, instance: InstanceId, sandbox: SandboxId, proof: str, incarnation: int) -> None:
        """The instance's supervisor registered again, bound to `sandbox` (a restart in place)."""
        identity = SupervisorIdentity("fake", instance, instance, "default", Bound(sandbox, proof), incarnation)
        self.registry.register(identity)

    def close(self) -> None:
        self.manager.close()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    opened = await open_sqlite_store(tmp_path / "db.sqlite")
    yield opened
    await opened.aclose()


@pytest.fixture
async def replica(store: Store) -> AsyncIterator[_Replica]:
    made = _Replica(store)
    await made.start()
    yield made
    made.close()


def _new(name: str, secrets: dict[str, str] | None = None) -> specs.NewSandbox:
    return specs.new_sandbox(
        workspace="",
        name=name,
        labels={},
        spec=lambda: specs.build_spec(
            image="", environment={}, cpu="", memory="", command=["sleep", "1"], runtime_class_name=""
        ),
        secrets=secrets,
    )


async def _held(replica: _Replica, new: specs.NewSandbox) -> tuple[asyncio.Task[SandboxRecord], SandboxRecord, str]:
    """A create of `new` started and held inside its driver call (its values offered): the
    create's task, its record and its proof."""
    replica.driver.held = new.name
    replica.driver.gate.clear()
    replica.driver.entered.clear()
    creating = asyncio.create_task(replica.manager.create(new))
    await replica.driver.entered.wait()
    request = replica.driver.requests[-1]
    record = await replica.records.get(request.sandbox_id)
    assert record is not None
    return creating, record, request.activation_proof


@contextlib.asynccontextmanager
async def _in_flight(replica: _Replica, new: specs.NewSandbox) -> AsyncIterator[tuple[SandboxRecord, str]]:
    """A create of `new` held inside its driver call for the body; its record and proof. On
    leaving, the create is let through and awaited (it must not fail)."""
    creating, record, proof = await _held(replica, new)
    try:
        yield record, proof
    finally:
        replica.driver.gate.set()
        await creating


async def _settles(condition: Callable[[], bool], within: float = 5.0) -> None:
    async with asyncio.timeout(within):
        while not condition():
            await asyncio.sleep(0.01)


async def test_a_warm_create_s_own_activation_takes_them_from_memory_and_nothing_stays(
    replica: _Replica, store: Store
) -> None:
    replica.warm_member()
    created = await replica.manager.create(_new("own", {"API_KEY": "own-value"}))
    assert created.status.allocation == "warm"
    assert replica.sealed_reads == []  # never read back: handed over
    assert len(replica.vault.handover) == 0  # taken, and nothing left behind
    assert await store.get(KIND_SECRETS, created.id) is not None  # still sealed, for a later activation


async def test_a_failed_or_cancelled_create_leaves_nothing_held(replica: _Replica) -> None:
    def fail(request: CreateRequest) -> None:
        raise UnavailableError("backend down")

    replica.driver._handler = fail
    with pytest.raises(UnavailableError):
        await replica.manager.create(_new("fails", {"API_KEY": "v"}))
    assert len(replica.vault.handover) == 0
    replica.driver._handler = None
    creating, _, _ = await _held(replica, _new("cancelled", {"API_KEY": "v"}))
    assert len(replica.vault.handover) == 1  # offered for the length of the driver call
    creating.cancel()
    with pytest.raises(asyncio.CancelledError):
        await creating
    assert len(replica.vault.handover) == 0


async def test_an_offer_is_dropped_after_its_bound_and_the_activation_reads_the_sealed_row(
    replica: _Replica,
) -> None:
    replica.vault.handover = SecretHandover(hold_seconds=0.05)
    member = replica.member()
    async with _in_flight(replica, _new("slow", {"API_KEY": "slow-value"})) as (record, proof):
        assert len(replica.vault.handover) == 1
        await _settles(lambda: len(replica.vault.handover) == 0)
        sent = await replica.activation(member, record, proof)
        assert dict(sent.workload.secrets) == {"API_KEY": "slow-value"}
        assert replica.sealed_reads == [record.id]


async def test_another_sandbox_s_activation_or_a_wrong_proof_never_takes_them(replica: _Replica) -> None:
    other = await replica.manager.create(_new("other", {"API_KEY": "other-value"}))  # cold: nothing waits
    other_proof = replica.driver.requests[-1].activation_proof
    first, second = replica.member(), replica.member()
    async with _in_flight(replica, _new("victim", {"API_KEY": "victim-value"})) as (victim, proof):
        # The other sandbox's own activation gets its own secrets, from its sealed row.
        sent = await replica.activation(first, other, other_proof)
        assert dict(sent.workload.secrets) == {"API_KEY": "other-value"}
        assert replica.sealed_reads == [other.id]
        # The victim's id with another sandbox's proof is refused before anything is opened.
        with pytest.raises(PermissionDeniedError, match="proof"):
            await replica.activator.activate(instance_id=second, sandbox_id=victim.id, proof=other_proof, reason="x")
        assert len(replica.vault.handover) == 1  # still there for its own activation
        assert replica.vault.handover.take(victim.id, other_proof) is None
        assert replica.vault.handover.take(other.id, proof) is None
    assert len(replica.vault.handover) == 0


async def test_a_second_activation_of_the_same_sandbox_reads_the_sealed_row_or_gets_nothing(
    replica: _Replica, store: Store
) -> None:
    member = replica.warm_member()
    created = await replica.manager.create(_new("again", {"API_KEY": "again-value"}))
    proof = replica.driver.requests[-1].activation_proof
    assert replica.sealed_reads == []
    # Its supervisor restarted in place (a later incarnation): the values come from the sealed row.
    replica.reregister(member, created.id, proof, incarnation=1)
    sent = await replica.activation(member, created, proof)
    assert dict(sent.workload.secrets) == {"API_KEY": "again-value"}
    assert replica.sealed_reads == [created.id]
    # With the sealed row gone, a further one gets nothing: no copy was kept in memory.
    await store.delete(KIND_SECRETS, created.id)
    replica.reregister(member, created.id, proof, incarnation=2)
    assert dict((await replica.activation(member, created, proof)).workload.secrets) == {}


async def test_an_activation_retried_after_the_take_reads_the_sealed_row(replica: _Replica, store: Store) -> None:
    # The first member took the values, then its activation failed after the take (here: its
    # registration replaced meanwhile); the next attempt must not find them in memory.
    member = replica.member()
    async with _in_flight(replica, _new("retried", {"API_KEY": "retried-value"})) as (record, proof):
        assert replica.vault.handover.take(record.id, proof) == {"API_KEY": "retried-value"}
        sent = await replica.activation(member, record, proof)
        assert dict(sent.workload.secrets) == {"API_KEY": "retried-value"}
        assert replica.sealed_reads == [record.id]


async def test_a_replica_that_did_not_receive_the_create_reads_the_sealed_row(replica: _Replica, store: Store) -> None:
    elsewhere = _Replica(store)
    await elsewhere.start()
    try:
        member = elsewhere.member()
        async with _in_flight(replica, _new("spread", {"API_KEY": "spread-value"})) as (record, proof):
            sent = await elsewhere.activation(member, record, proof)  # e.g. a pod registered there
            assert dict(sent.workload.secrets) == {"API_KEY": "spread-value"}
            assert elsewhere.sealed_reads == [record.id]
            assert len(elsewhere.vault.handover) == 0
            assert len(replica.vault.handover) == 1  # the receiving replica's, untouched
        assert len(replica.vault.handover) == 0
    finally:
        elsewhere.close()


async def test_a_gateway_restarted_between_create_and_activation_uses_the_sealed_row(tmp_path: Path) -> None:
    path = tmp_path / "restart.sqlite"
    first = _Replica(await open_sqlite_store(path))
    await first.start()
    try:
        created = await first.manager.create(_new("restarted", {"API_KEY": "kept-value"}))  # cold
        proof = first.driver.requests[-1].activation_proof
    finally:
        first.close()
        await first.store.aclose()
    second = _Replica(await open_sqlite_store(path))
    try:
        member = second.member()  # the sandbox's supervisor, registering with the new gateway
        record = await second.records.get(created.id)
        assert record is not None
        sent = await second.activation(member, record, proof)
        assert dict(sent.workload.secrets) == {"API_KEY": "kept-value"}
        assert second.sealed_reads == [created.id]
    finally:
        second.close()
        await second.store.aclose()


async def test_a_fork_s_child_never_takes_its_parent_s_secrets(replica: _Replica) -> None:
    # A fork opens the parent's sealed row only when asked to pass them on, and each child's
    # create offers them under its own id and proof; without them a child gets none, even while
    # its parent's own create still holds them.
    replica.warm_member()
    replica.warm_member()
    async with _in_flight(replica, _new("parent", {"API_KEY": "parent-value"})) as (parent, proof):
        child = await replica.manager.create(forking.child_sandbox(parent, "bare", image="snap", secrets=None))
        assert child.status.allocation == "warm"
        assert replica.vault.handover.take(child.id, proof) is None
        assert len(replica.vault.handover) == 1  # the parent's, still its own
        assert replica.sealed_reads == []
        passed = forking.child_sandbox(parent, "passed", image="snap", secrets={"API_KEY": "parent-value"})
        with_secrets = await replica.manager.create(passed)
        assert with_secrets.status.allocation == "warm"
    # The parent's create went cold once let through (both members served the children): its
    # offer was dropped with its driver call, and nothing was read from a sealed row.
    assert replica.sealed_reads == []
    assert len(replica.vault.handover) == 0


async def test_a_real_warm_create_hands_its_secret_over_and_the_workload_sees_it(tmp_path: Path) -> None:
    pools = tmp_path / "pools"
    write_profile(pools, "p", 'version = 1\nworkspace = "default"\nreplicas = 1\nimage = ""\n')
    settings: dict[str, Any] = {"local.pools_dir": str(pools), "local.pool_reload_interval_seconds": 0.1}
    async with running_gateway(tmp_path / "state", **settings) as gw:
        await wait_pools(gw, idle("p", 1))
        vault = gw.gateway.parts.vault
        reads: list[str] = []
        get: Callable[[SandboxId], Awaitable[dict[str, str]]] = vault.get

        async def counted(sandbox_id: SandboxId) -> dict[str, str]:
            reads.append(sandbox_id)
            return await get(sandbox_id)

        vault.get = counted  # type: ignore[method-assign]
        ready = await sandbox(gw, "real", pb.SandboxSpec(secrets={"API_KEY": "real-value"}))
        assert ready.status.allocation == "warm"
        assert await sh(gw, "real", 'printf %s "$API_KEY"') == (0, "real-value", "")
        assert reads == []
        assert len(vault.handover) == 0
        assert await gw.gateway.parts.store.get(KIND_SECRETS, ready.id) is not None
