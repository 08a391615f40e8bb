"""A warm create whose caller waits for Ready (`wait_ready`, what the SDK sends) is written once
after its insert: the create's result, its activation and its session in one write, made once
the sandbox is Ready. A whole gateway on real sockets with the fake driver (a store of its own)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from tests.helpers.gateway import count_updates
from tests.helpers.opening import FakeGateway, HandDriven, fake_gateway, hello, register, until
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.core.ids import SandboxId
from warmshell.core.models import Phase, SandboxRecord
from warmshell.gateway.records import KIND_SANDBOX


async def _stored(gw: FakeGateway, sandbox_id: str) -> SandboxRecord | None:
    row = await gw.gateway.parts.store.get(KIND_SANDBOX, sandbox_id)
    return None if row is None else SandboxRecord.model_validate_json(row.payload)


Call = grpc.aio.StreamStreamCall[spb.SupervisorMessage, spb.GatewayMessage]


async def _activated(
    gw: FakeGateway, name: str
) -> tuple[Call, HandDriven, asyncio.Task[pb.Sandbox], spb.SupervisorMessage]:
    """A warm member registered, a create of `name` that waits for Ready sent, its activation
    read; returns the stream, its requests, the create and the member's hello."""
    credential = gw.driver.add_warm_instance()
    call, driven = gw.open(register(credential))
    await until(lambda: gw.gateway.parts.registry.pending_count() == 1)
    request = pb.CreateSandboxRequest(name=name, wait_ready=True, ready_timeout_ms=20_000)

    async def create() -> pb.Sandbox:
        return await gw.sandboxes.CreateSandbox(request, metadata=gw._metadata())

    creating = asyncio.create_task(create())
    async with asyncio.timeout(10):
        first = await call.read()
    assert first.WhichOneof("message") == "activation"
    return call, driven, creating, hello(first.activation.sandbox_id, credential.split(".")[1])


async def test_a_waiting_warm_create_is_written_once_after_its_insert_and_answers_ready(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with fake_gateway() as gw:
        updated = count_updates(gw.gateway.parts.store, monkeypatch)
        call, driven, creating, greeting = await _activated(gw, "held")
        sandbox_id = greeting.hello.sandbox_id
        try:
            await asyncio.sleep(0.2)
            assert not creating.done(), "answered before Ready"
            stored = await _stored(gw, sandbox_id)
            assert stored is not None
            assert stored.status.phase == Phase.PROVISIONING  # only the insert
            driven.send(greeting)
            async with asyncio.timeout(10):
                created = await creating
            assert created.status.phase == pb.SANDBOX_PHASE_READY
            assert created.status.allocation == "warm"
            assert updated.count(sandbox_id) == 1, updated
            stored = await _stored(gw, sandbox_id)
            assert stored is not None
            assert stored.status.phase == Phase.READY
            assert stored.status.pool
            timeline = stored.status.timeline
            assert min(timeline.claimed_us, timeline.activated_us, timeline.ready_us) > 0
            assert stored.status.connected_incarnation == stored.status.activated_incarnation >= 0
        finally:
            driven.end()
            call.cancel()


async def test_a_delete_of_a_held_create_writes_its_mark_before_the_backend_goes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with fake_gateway() as gw:
        call, driven, creating, greeting = await _activated(gw, "doomed")
        sandbox_id = greeting.hello.sandbox_id
        seen: list[Phase | None] = []
        delete = gw.driver.delete

        async def checked(sid: SandboxId) -> bool:
            stored = await _stored(gw, sid)
            seen.append(stored.status.phase if stored is not None else None)
            return await delete(sid)

        monkeypatch.setattr(gw.driver, "delete", checked)
        try:
            await gw.sandboxes.DeleteSandbox(pb.SandboxRef(name="doomed"), metadata=gw._metadata())
            assert seen == [Phase.DELETING], "the mark is on disk before the backend is deleted"
            async with asyncio.timeout(10):
                answer = (await asyncio.gather(creating, return_exceptions=True))[0]
            # Deleting, or NOT_FOUND when the removal came before the create's own write.
            if isinstance(answer, grpc.aio.AioRpcError):
                assert answer.code() == grpc.StatusCode.NOT_FOUND
            else:
                assert isinstance(answer, pb.Sandbox)
                assert answer.status.phase == pb.SANDBOX_PHASE_DELETING
            assert await _stored(gw, sandbox_id) is None
        finally:
            driven.end()
            call.cancel()
