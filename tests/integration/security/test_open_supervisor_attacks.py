"""OpenSupervisor from the side of whoever holds a pod's token (its workload can read it): the
one stream is checked as the two calls it replaces are. A stream that does not start with a
registration, a hello that names another sandbox or instance than the activation, a message
other than hello after it, and a replay of the credential while the session is live are all
refused; the sandbox's real session is untouched."""

from __future__ import annotations

import asyncio

import grpc

from tests.helpers.opening import FakeGateway, HandDriven, fake_gateway, hello, register, until
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.core.ids import SandboxId

Call = grpc.aio.StreamStreamCall[spb.SupervisorMessage, spb.GatewayMessage]


async def _status(call: Call, driven: HandDriven) -> tuple[grpc.StatusCode, str]:
    """How the gateway ended the call (every message before that is a failure of the test)."""
    try:
        async with asyncio.timeout(10):
            message = await call.read()  # read(), as the caller's other reads of this call
            raise AssertionError(f"the gateway went on: {message}")
    except grpc.aio.AioRpcError as refused:
        return refused.code(), refused.details() or ""
    finally:
        driven.end()
        call.cancel()


async def _activated(gw: FakeGateway) -> tuple[Call, HandDriven, spb.SupervisorActivationMessage, str]:
    """A warm member's OpenSupervisor, activated by a create."""
    credential = gw.driver.add_warm_instance()
    call, driven = gw.open(register(credential))
    await until(lambda: gw.gateway.parts.registry.pending_count() == 1)
    await gw.create("victim")
    async with asyncio.timeout(10):
        first = await call.read()
    assert first.WhichOneof("message") == "activation"
    return call, driven, first.activation, credential


async def test_a_stream_that_does_not_start_with_a_registration_is_refused() -> None:
    async with fake_gateway() as gw:
        token, _ = gw.gateway.parts.issuer.mint(SandboxId("sbx-any"), "i-any")
        # A session's hello where the registration must be: no token is read from the stream.
        call, driven = gw.open(hello("sbx-any", "i-any"))
        code, details = await _status(call, driven)
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "must be register" in details
        assert token not in details
        assert gw.driver.identity.registrations == []
        assert len(gw.gateway.parts.manager.sessions) == 0


async def test_a_hello_naming_another_instance_than_the_activation_is_refused() -> None:
    async with fake_gateway() as gw:
        call, driven, activation, _ = await _activated(gw)
        driven.send(hello(activation.sandbox_id, "someone-else"))
        code, details = await _status(call, driven)
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert "another sandbox or instance" in details
        assert (await gw.get("victim")).status.phase != pb.SANDBOX_PHASE_READY
        assert gw.gateway.parts.manager.sessions.live(SandboxId(activation.sandbox_id)) is None


async def test_a_hello_naming_another_sandbox_than_the_activation_is_refused() -> None:
    async with fake_gateway() as gw:
        call, driven, _, credential = await _activated(gw)
        driven.send(hello("another-sandbox", credential.split(".")[1]))
        code, _ = await _status(call, driven)
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert (await gw.get("victim")).status.phase != pb.SANDBOX_PHASE_READY


async def test_anything_but_a_hello_after_the_activation_is_refused() -> None:
    async with fake_gateway() as gw:
        call, driven, _, _ = await _activated(gw)
        driven.send(spb.SupervisorMessage(heartbeat=spb.Heartbeat(sent_at_ms=1)))
        code, details = await _status(call, driven)
        assert code == grpc.StatusCode.FAILED_PRECONDITION
        assert "must be hello" in details


async def test_a_replayed_credential_gets_no_second_activation_while_the_session_is_live() -> None:
    async with fake_gateway() as gw:
        call, driven, activation, credential = await _activated(gw)
        driven.send(hello(activation.sandbox_id, credential.split(".")[1]))
        try:
            async with asyncio.timeout(10):
                assert (await call.read()).WhichOneof("message") == "accepted"
            replay, replayed = gw.open(register(credential))
            code, _ = await _status(replay, replayed)
            assert code == grpc.StatusCode.ALREADY_EXISTS
            live = gw.gateway.parts.manager.sessions.live(SandboxId(activation.sandbox_id))
            assert live is not None, "the real session is untouched"
            assert (await gw.get("victim")).status.phase == pb.SANDBOX_PHASE_READY
        finally:
            driven.end()
            call.cancel()
