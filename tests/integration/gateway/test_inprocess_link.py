"""Host-side supervisors reach their gateway in process (real gateway, real bwrap'd sandboxes):
the supervisor socket is not on their path, and the in-process calls meet the same fail-closed
checks as calls over a socket — a forged credential, a forged or misdirected token and a call
to a stopping gateway are refused with the status a socket call would get."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from tests.helpers.gateway import RunningGateway, running_gateway, wait_pools
from tests.integration.gateway.test_warm_pools import idle, profile, write_profile
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.gateway.inprocess import InProcessLink
from warmshell.sandboxio.link import SessionCall


def link_of(gw: RunningGateway) -> InProcessLink:
    link = gw.gateway.parts.supervisor_link
    assert link is not None, "the local driver's gateway serves its supervisors in process"
    return link


async def _hello(sandbox_id: str, instance_id: str) -> AsyncIterator[spb.SupervisorMessage]:
    yield spb.SupervisorMessage(hello=spb.SupervisorHello(sandbox_id=sandbox_id, instance_id=instance_id))
    await asyncio.Event().wait()  # a supervisor keeps its side open


async def _first_message(call: SessionCall) -> None:
    async with asyncio.timeout(10):
        async for message in call:
            raise AssertionError(f"the gateway accepted the session: {message}")


async def _session_refusal(link: InProcessLink, token: str, sandbox_id: str, instance_id: str) -> grpc.aio.AioRpcError:
    call = link.connect(_hello(sandbox_id, instance_id), token)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _first_message(call)
    finally:
        call.cancel()
    return caught.value


async def test_local_supervisors_do_not_need_the_supervisor_socket(tmp_path: Path) -> None:
    pools_dir = tmp_path / "pools"
    overrides = {"local.pools_dir": str(pools_dir), "local.pool_reload_interval_seconds": 0.1}
    async with running_gateway(tmp_path / "state", **overrides) as gw:
        # Nothing can connect to the supervisor socket any more: warm and cold sandboxes register,
        # are activated and hold their sessions all the same.
        gw.gateway.paths.supervisor_socket.unlink()
        write_profile(pools_dir, "p", profile(1, env='POOL = "p"'))
        await wait_pools(gw, idle("p", 1))
        warm = await gw.create(name="warm", spec=pb.SandboxSpec(environment={"POOL": "p"}))
        cold = await gw.create(name="cold")
        assert (warm.status.allocation, cold.status.allocation) == ("warm", "cold")
        for name in ("warm", "cold"):
            await gw.wait_ready(name)
            assert await gw.exec(name, ["sh", "-c", "echo $WARMSHELL_SANDBOX_NAME"]) == (0, f"{name}\n".encode(), b"")


async def test_a_session_told_to_reconnect_comes_back_in_process(gw: RunningGateway) -> None:
    await gw.create(name="back")
    ready = await gw.wait_ready("back")
    session = gw.gateway.parts.sessions.get(ready.id)  # type: ignore[arg-type]
    assert session is not None
    session.close("testing a reconnect", reconnect=True)
    async with asyncio.timeout(10):
        while (again := gw.gateway.parts.sessions.live(ready.id)) is None or again is session:  # type: ignore[arg-type]
            await asyncio.sleep(0.02)
    assert await gw.exec("back", ["echo", "again"]) == (0, b"again\n", b"")


async def test_a_forged_bootstrap_credential_is_refused(gw: RunningGateway) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await link_of(gw).register(spb.RegisterSupervisorRequest(bootstrap_credential="li-made-up.secret"))
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_sessions_and_refreshes_need_the_sandbox_s_own_token(gw: RunningGateway) -> None:
    await gw.create(name="victim")
    victim = await gw.wait_ready("victim")
    link = link_of(gw)
    forged = await _session_refusal(link, "not-a-token", victim.id, victim.status.instance_id)
    assert forged.code() == grpc.StatusCode.UNAUTHENTICATED
    elsewhere, _ = gw.gateway.parts.issuer.mint(victim.id, "li-someone-else")  # type: ignore[arg-type]
    misdirected = await _session_refusal(link, elsewhere, victim.id, victim.status.instance_id)
    assert misdirected.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "another sandbox or instance" in (misdirected.details() or "")
    # The real supervisor's session is live: a copy of its token cannot take it over.
    own, _ = gw.gateway.parts.issuer.mint(victim.id, victim.status.instance_id)  # type: ignore[arg-type]
    second = await _session_refusal(link, own, victim.id, victim.status.instance_id)
    assert second.code() == grpc.StatusCode.ALREADY_EXISTS
    with pytest.raises(grpc.aio.AioRpcError) as refresh:
        await link.refresh_token(gw.token)  # the client's API token is not a sandbox's
    assert refresh.value.code() == grpc.StatusCode.PERMISSION_DENIED
    refreshed = await link.refresh_token(own)
    assert gw.gateway.parts.issuer.verify(refreshed.token).sandbox_id == victim.id
    assert await gw.exec("victim", ["echo", "REAL"]) == (0, b"REAL\n", b"")


async def test_a_stopping_gateway_refuses_in_process_calls(gw: RunningGateway) -> None:
    link = link_of(gw)
    await gw.stop()
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await link.register(spb.RegisterSupervisorRequest(bootstrap_credential="anything"))
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(grpc.aio.AioRpcError) as connect:
        link.connect(_hello("sb-x", "li-x"), "anything")
    assert connect.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_a_session_refused_in_process_reads_nothing_after_the_hello(gw: RunningGateway) -> None:
    """No grpc client can misreport an in-process refusal (grpc/grpc#36066 is a socket client's
    bug), so the gateway does not read on to drain the caller before it: what a supervisor sends
    after its hello (its outbox) stays unread, for its next session."""
    await gw.create(name="victim")
    victim = await gw.wait_ready("victim")
    elsewhere, _ = gw.gateway.parts.issuer.mint(victim.id, "li-someone-else")  # type: ignore[arg-type]
    read_past_hello: list[int] = []

    async def hello_then_outbox() -> AsyncIterator[spb.SupervisorMessage]:
        hello = spb.SupervisorHello(sandbox_id=victim.id, instance_id=victim.status.instance_id)
        yield spb.SupervisorMessage(hello=hello)  # not the token's instance
        for index in range(3):
            read_past_hello.append(index)
            yield spb.SupervisorMessage(output=spb.OutputData(data=b"queued"))
        await asyncio.Event().wait()

    call = link_of(gw).connect(hello_then_outbox(), elsewhere)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _first_message(call)
    finally:
        call.cancel()
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert read_past_hello == []
