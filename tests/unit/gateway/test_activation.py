"""Activation and its anti-spoofing checks, against a real SQLite store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.core.errors import (
    AlreadyExistsError,
    ConflictError,
    FailedPreconditionError,
    NotFoundError,
    PermissionDeniedError,
)
from warmshell.core.ids import Fingerprint, InstanceId, SandboxId
from warmshell.core.models import Phase, SandboxRecord
from warmshell.drivers.base import Bound, SupervisorIdentity, WarmPending
from warmshell.gateway.activation import GatewayActivator
from warmshell.gateway.events import EventBus
from warmshell.gateway.records import SandboxRecords
from warmshell.gateway.registry import Registry
from warmshell.gateway.secretvault import SecretVault
from warmshell.gateway.store.sqlite import open_sqlite_store
from warmshell.gateway.tokens import SandboxTokenIssuer, hash_secret

Activation = spb.SupervisorActivationMessage


@pytest.fixture
async def records(tmp_path: Path) -> AsyncIterator[SandboxRecords]:
    store = await open_sqlite_store(tmp_path / "db.sqlite")
    yield SandboxRecords(store, EventBus())
    await store.aclose()


@pytest.fixture
def issuer() -> SandboxTokenIssuer:
    return SandboxTokenIssuer(Ed25519PrivateKey.generate(), gateway_id="test", ttl_seconds=600)


async def make_sandbox(records: SandboxRecords, name: str, proof: str, workspace: str = "default") -> SandboxRecord:
    record = SandboxRecord(
        id=SandboxId(f"id-{name}"), name=name, workspace=workspace, activation_proof_hash=hash_secret(proof)
    )
    record.spec.command = ["echo", name]
    return await records.insert(record)


def warm(instance: str, workspace: str = "default") -> SupervisorIdentity:
    return SupervisorIdentity("local", InstanceId(instance), instance, workspace, WarmPending(Fingerprint("fp")))


async def test_warm_activation_delivers_token_and_workload(records: SandboxRecords, issuer: SandboxTokenIssuer) -> None:
    registry: Registry[Activation] = Registry()
    activator = GatewayActivator(registry, records, issuer, SecretVault(records._store, bytes(32)))
    await make_sandbox(records, "one", "proof-1")
    reg = registry.register(warm("i-1"))
    await activator.activate(instance_id=InstanceId("i-1"), sandbox_id=SandboxId("id-one"), proof="proof-1", reason="t")
    message = await reg.next_outcome()
    assert isinstance(message, Activation)
    assert message.sandbox_name == "one"
    assert list(message.workload.command) == ["echo", "one"]
    assert issuer.verify(message.token).sandbox_id == "id-one"
    stored = await records.get(SandboxId("id-one"))
    assert stored is not None
    assert stored.status.instance_id == "i-1"
    assert stored.status.timeline.activated_us > 0


async def test_claim_time_learned_at_activation_goes_on_the_timeline(
    records: SandboxRecords, issuer: SandboxTokenIssuer
) -> None:
    """A driver that learns the bind moment only now (a SandboxClaim bound after create) passes it
    along; one already on the timeline (set at create) is never overwritten."""
    registry: Registry[Activation] = Registry()
    activator = GatewayActivator(registry, records, issuer, SecretVault(records._store, bytes(32)))
    await make_sandbox(records, "late", "proof-l")
    registry.register(warm("i-l"))
    await activator.activate(
        instance_id=InstanceId("i-l"), sandbox_id=SandboxId("id-late"), proof="proof-l", reason="t", claimed_us=1234
    )
    late = await records.get(SandboxId("id-late"))
    assert late is not None
    assert late.status.timeline.claimed_us == 1234

    early = await make_sandbox(records, "early", "proof-e")
    await records.mutate(early.id, lambda r: setattr(r.status.timeline, "claimed_us", 99))
    registry.register(warm("i-e"))
    await activator.activate(
        instance_id=InstanceId("i-e"), sandbox_id=early.id, proof="proof-e", reason="t", claimed_us=1234
    )
    kept = await records.get(early.id)
    assert kept is not None
    assert kept.status.timeline.claimed_us == 99


async def test_forged_instance_id_is_refused(records: SandboxRecords, issuer: SandboxTokenIssuer) -> None:
    activator = GatewayActivator(Registry(), records, issuer, SecretVault(records._store, bytes(32)))
    await make_sandbox(records, "one", "p")
    with pytest.raises(NotFoundError):
        await activator.activate(
            instance_id=InstanceId("nobody"), sandbox_id=SandboxId("id-one"), proof="p", reason="t"
        )


async def test_replayed_activation_is_refused(records: SandboxRecords, issuer: SandboxTokenIssuer) -> None:
    registry: Registry[Activation] = Registry()
    activator = GatewayActivator(registry, records, issuer, SecretVault(records._store, bytes(32)))
    await make_sandbox(records, "one", "p")
    registry.register(warm("i-1"))
    await activator.activate(instance_id=InstanceId("i-1"), sandbox_id=SandboxId("id-one"), proof="p", reason="t")
    with pytest.raises(AlreadyExistsError):
        await activator.activate(instance_id=InstanceId("i-1"), sandbox_id=SandboxId("id-one"), proof="p", reason="t")


async def test_proof_for_another_sandbox_is_refused_and_leaks_no_token(
    records: SandboxRecords, issuer: SandboxTokenIssuer
) -> None:
    registry: Registry[Activation] = Registry()
    activator = GatewayActivator(registry, records, issuer, SecretVault(records._store, bytes(32)))
    await make_sandbox(records, "victim", "victim-proof")
    await make_sandbox(records, "mine", "my-proof")
    reg = registry.register(warm("i-1"))
    with pytest.raises(PermissionDeniedError, match="proof"):
        await activator.activate(
            instance_id=InstanceId("i-1"), sandbox_id=SandboxId("id-victim"), proof="my-proof", reason="t"
        )
    outcome = await reg.next_outcome()
    assert isinstance(outcome, PermissionDeniedError)  # the stream ends with an error, not a token


async def test_bound_instance_cannot_be_activated_for_another_sandbox(
    records: SandboxRecords, issuer: SandboxTokenIssuer
) -> None:
    registry: Registry[Activation] = Registry()
    activator = GatewayActivator(registry, records, issuer, SecretVault(records._store, bytes(32)))
    await make_sandbox(records, "a", "pa")
    await make_sandbox(records, "b", "pb")
    registry.register(SupervisorIdentity("local", InstanceId("i-a"), "i-a", "default", Bound(SandboxId("id-a"), "pa")))
    with pytest.raises(PermissionDeniedError, match="bound to another sandbox"):
        await activator.activate(instance_id=InstanceId("i-a"), sandbox_id=SandboxId("id-b"), proof="pb", reason="t")


async def test_warm_member_of_another_workspace_is_refused(records: SandboxRecords, issuer: SandboxTokenIssuer) -> None:
    registry: Registry[Activation] = Registry()
    activator = GatewayActivator(registry, records, issuer, SecretVault(records._store, bytes(32)))
    await make_sandbox(records, "one", "p", workspace="team-a")
    registry.register(warm("i-1", workspace="team-b"))
    with pytest.raises(PermissionDeniedError, match="workspace"):
        await activator.activate(instance_id=InstanceId("i-1"), sandbox_id=SandboxId("id-one"), proof="p", reason="t")


async def test_stale_session_is_refused(records: SandboxRecords, issuer: SandboxTokenIssuer) -> None:
    registry: Registry[Activation] = Registry()
    await make_sandbox(records, "one", "p")
    old = registry.register(warm("i-1"))
    registry.register(warm("i-1"))
    with pytest.raises(ConflictError):
        registry.activate_if_session(InstanceId("i-1"), old.session_id, Activation())


async def test_deleted_or_deleting_sandbox_gets_no_token(records: SandboxRecords, issuer: SandboxTokenIssuer) -> None:
    registry: Registry[Activation] = Registry()
    activator = GatewayActivator(registry, records, issuer, SecretVault(records._store, bytes(32)))
    registry.register(warm("i-1"))
    with pytest.raises(NotFoundError):
        await activator.activate(instance_id=InstanceId("i-1"), sandbox_id=SandboxId("id-gone"), proof="p", reason="t")
    record = await make_sandbox(records, "going", "p")

    def deleting(r: SandboxRecord) -> None:
        r.status.phase = Phase.DELETING

    await records.mutate(record.id, deleting)
    registry.register(warm("i-2"))
    with pytest.raises(FailedPreconditionError):
        await activator.activate(instance_id=InstanceId("i-2"), sandbox_id=record.id, proof="p", reason="t")


async def test_idle_members_are_the_warm_registrations_waiting_here(
    records: SandboxRecords, issuer: SandboxTokenIssuer
) -> None:
    """What a driver shows as idle is read from the registry alone: warm-pending registrations by
    pool fingerprint, gone once activated or once their stream ended (a member deleted unclaimed)."""
    registry: Registry[Activation] = Registry()
    activator = GatewayActivator(registry, records, issuer, SecretVault(records._store, bytes(32)))
    other = SupervisorIdentity("local", InstanceId("o-1"), "o-1", "default", WarmPending(Fingerprint("other")))
    bound = SupervisorIdentity("local", InstanceId("b-1"), "b-1", "default", Bound(SandboxId("id-b"), "p"))
    ended = registry.register(warm("i-2"))
    for identity in (warm("i-1"), warm("i-3"), other, bound):
        registry.register(identity)
    counted = activator.idle_members()
    assert counted == {Fingerprint("fp"): 3, Fingerprint("other"): 1}
    counted[Fingerprint("fp")] = 0  # the caller's own copy: the next count is not changed by it
    assert activator.idle_members() == {Fingerprint("fp"): 3, Fingerprint("other"): 1}
    late = registry.register(warm("i-4"))  # counted again once the registry changed
    assert activator.idle_members() == {Fingerprint("fp"): 4, Fingerprint("other"): 1}
    registry.remove_if_session(InstanceId("i-4"), late.session_id)
    await make_sandbox(records, "one", "proof-1")
    await activator.activate(instance_id=InstanceId("i-1"), sandbox_id=SandboxId("id-one"), proof="proof-1", reason="t")
    registry.remove_if_session(InstanceId("i-2"), ended.session_id)
    assert activator.idle_members() == {Fingerprint("fp"): 1, Fingerprint("other"): 1}
