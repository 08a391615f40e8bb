"""Attacks with a stolen sandbox token on a live sandbox: a forged hello and a second session are
refused (and logged without the token), and the real supervisor keeps answering exec."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc
import pytest

from tests.helpers.gateway import RunningGateway
from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.api.v1 import supervisor_pb2_grpc


async def _hello(sandbox_id: str, instance_id: str) -> AsyncIterator[spb.SupervisorMessage]:
    # The gateway decides on the hello alone, so the stream may half-close after it.
    yield spb.SupervisorMessage(hello=spb.SupervisorHello(sandbox_id=sandbox_id, instance_id=instance_id))


async def _first_message(call: grpc.aio.StreamStreamCall[spb.SupervisorMessage, spb.GatewayMessage]) -> None:
    async with asyncio.timeout(10):
        async for message in call:
            raise AssertionError(f"the gateway accepted the session: {message}")


async def _refusal(gw: RunningGateway, token: str, sandbox_id: str, instance_id: str) -> grpc.aio.AioRpcError:
    stub = supervisor_pb2_grpc.SupervisorServiceStub(gw.channel)
    call = stub.ConnectSupervisor(_hello(sandbox_id, instance_id), metadata=(("authorization", f"Bearer {token}"),))
    try:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _first_message(call)
    finally:
        call.cancel()
    return caught.value


async def test_a_hello_naming_another_instance_than_the_token_is_refused(
    gw: RunningGateway, caplog: pytest.LogCaptureFixture
) -> None:
    await gw.create(name="victim")
    victim = await gw.wait_ready("victim")
    # The token a workload would have stolen, but bound to another instance than the hello names.
    token, _ = gw.gateway.parts.issuer.mint(victim.id, "li-someone-else")
    with caplog.at_level(logging.WARNING, logger="warmshell.gateway.supervisor_service"):
        refused = await _refusal(gw, token, victim.id, victim.status.instance_id)
    assert refused.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "another sandbox or instance" in (refused.details() or "")
    assert "refused supervisor session" in caplog.text
    assert token not in caplog.text
    assert token.split(".")[2] not in caplog.text
    assert await gw.exec("victim", ["echo", "REAL"]) == (0, b"REAL\n", b"")


async def test_a_second_session_is_refused_while_the_real_one_is_live(
    gw: RunningGateway, caplog: pytest.LogCaptureFixture
) -> None:
    await gw.create(name="victim")
    victim = await gw.wait_ready("victim")
    token, _ = gw.gateway.parts.issuer.mint(victim.id, victim.status.instance_id)  # a perfect copy of its token
    with caplog.at_level(logging.WARNING, logger="warmshell.gateway.supervisor_service"):
        refused = await _refusal(gw, token, victim.id, victim.status.instance_id)
    assert refused.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "second supervisor session" in caplog.text
    assert token not in caplog.text
    # The real supervisor still answers, with the real output and the request's env.
    code, out, _ = await gw.exec("victim", ["sh", "-c", "echo REAL $API_KEY"], environment={"API_KEY": "s3cr3t"})
    assert (code, out) == (0, b"REAL s3cr3t\n")
    after = await gw.get("victim")
    assert after.status.instance_id == victim.status.instance_id
