"""The local identity provider: ours or not, fail-closed, bound or warm-pending."""

from __future__ import annotations

from pathlib import Path

import pytest

from warmshell.core.errors import PermissionDeniedError
from warmshell.core.ids import Fingerprint, InstanceId, SandboxId
from warmshell.drivers.base import BackendState, Bound, WarmPending
from warmshell.drivers.local import credentials
from warmshell.drivers.local.identity import LocalIdentity
from warmshell.drivers.local.instances import Instance


def instance(instance_id: str, credential: str, **fields: object) -> Instance:
    made = Instance(
        instance_id=InstanceId(instance_id),
        workspace="default",
        hostname=instance_id,
        directory=Path("/nowhere"),
        created_us=1,
        credential_digest=credentials.digest(credential),
        state=BackendState.RUNNING,
    )
    for key, value in fields.items():
        setattr(made, key, value)
    return made


@pytest.fixture
def table() -> dict[InstanceId, Instance]:
    return {}


@pytest.fixture
def registered() -> list[InstanceId]:
    return []


@pytest.fixture
def identity(table: dict[InstanceId, Instance], registered: list[InstanceId]) -> LocalIdentity:
    return LocalIdentity(table.get, lambda i: registered.append(i.instance_id))


async def test_foreign_credentials_are_not_ours(identity: LocalIdentity) -> None:
    assert await identity.authenticate("eyJhbGciOiJSUzI1NiJ9.x.y") is None
    assert await identity.authenticate("") is None


async def test_bound_instance(
    identity: LocalIdentity, table: dict[InstanceId, Instance], registered: list[InstanceId]
) -> None:
    cred = credentials.new_credential(InstanceId("li-a"))
    table[InstanceId("li-a")] = instance("li-a", cred, sandbox_id=SandboxId("sbx-1"), proof="p1", name="demo")
    found = await identity.authenticate(cred)
    assert found is not None
    assert (found.driver, found.instance_id, found.instance_name) == ("local", "li-a", "demo")
    assert found.binding == Bound(SandboxId("sbx-1"), "p1")
    assert registered == [], "authenticating has no effect"
    identity.registered(found)
    assert registered == ["li-a"]


async def test_authenticating_again_and_again_registers_nothing(
    identity: LocalIdentity, table: dict[InstanceId, Instance], registered: list[InstanceId]
) -> None:
    """A credential presented on any RPC is authenticated; only RegisterSupervisor calls `registered`."""
    cred = credentials.new_credential(InstanceId("li-a"))
    table[InstanceId("li-a")] = instance("li-a", cred, sandbox_id=SandboxId("sbx-1"), proof="p1")
    for _ in range(5):
        assert await identity.authenticate(cred) is not None
    assert registered == []
    assert table[InstanceId("li-a")].registered is False


async def test_an_instance_that_ended_since_authentication_is_not_registered(
    identity: LocalIdentity, table: dict[InstanceId, Instance], registered: list[InstanceId]
) -> None:
    cred = credentials.new_credential(InstanceId("li-a"))
    table[InstanceId("li-a")] = instance("li-a", cred, sandbox_id=SandboxId("sbx-1"), proof="p1")
    found = await identity.authenticate(cred)
    assert found is not None
    table[InstanceId("li-a")].state = BackendState.EXITED
    identity.registered(found)
    assert registered == []


async def test_pool_member_is_warm_pending(identity: LocalIdentity, table: dict[InstanceId, Instance]) -> None:
    cred = credentials.new_credential(InstanceId("li-b"))
    table[InstanceId("li-b")] = instance("li-b", cred, pool=Fingerprint("f" * 64))
    found = await identity.authenticate(cred)
    assert found is not None
    assert found.binding == WarmPending(Fingerprint("f" * 64))
    assert found.instance_name == "li-b"


@pytest.mark.parametrize("case", ["unknown", "mismatch", "other-instance", "malformed", "ended", "deleting"])
async def test_refused(
    case: str,
    identity: LocalIdentity,
    table: dict[InstanceId, Instance],
    registered: list[InstanceId],
) -> None:
    cred_a = credentials.new_credential(InstanceId("li-a"))
    cred_b = credentials.new_credential(InstanceId("li-b"))
    table[InstanceId("li-a")] = instance("li-a", cred_a, sandbox_id=SandboxId("s"), proof="p")
    table[InstanceId("li-b")] = instance("li-b", cred_b, sandbox_id=SandboxId("t"), proof="q")
    presented = {
        "unknown": credentials.new_credential(InstanceId("li-zz")),
        "mismatch": cred_a[:-2] + "xx",
        "other-instance": "wsl1.li-a." + cred_b.rsplit(".", 1)[1],
        "malformed": "wsl1.",
        "ended": cred_a,
        "deleting": cred_a,
    }[case]
    if case == "ended":
        table[InstanceId("li-a")].state = BackendState.EXITED
    if case == "deleting":
        table[InstanceId("li-a")].deleting = True
    with pytest.raises(PermissionDeniedError) as caught:
        await identity.authenticate(presented)
    assert str(caught.value) == "local bootstrap credential rejected"
    assert registered == []
