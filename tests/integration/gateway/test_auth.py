"""Principals: each credential may call only its own RPCs; spoofed supervisors get nothing."""

from __future__ import annotations

import grpc
import pytest

from tests.helpers.gateway import RunningGateway
from tests.helpers.writerace import codes_of_racing_writes
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.api.v1 import supervisor_pb2_grpc


def _supervisor_stub(gw: RunningGateway) -> supervisor_pb2_grpc.SupervisorServiceStub:
    return supervisor_pb2_grpc.SupervisorServiceStub(gw.channel)


async def _code_of(call: object) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    return err.value.code()


async def test_public_api_needs_the_api_token(gw: RunningGateway) -> None:
    request = pb.ListSandboxesRequest()
    assert await _code_of(gw.stub.ListSandboxes(request)) == grpc.StatusCode.UNAUTHENTICATED
    bad = (("authorization", "Bearer not-the-token"),)
    assert await _code_of(gw.stub.ListSandboxes(request, metadata=bad)) == grpc.StatusCode.UNAUTHENTICATED


async def test_sandbox_token_cannot_use_public_api_and_api_token_cannot_refresh(gw: RunningGateway) -> None:
    await gw.create(name="s1")
    await gw.wait_ready("s1")
    record = await gw.gateway.parts.records.get_by_name("default", "s1")
    token, _ = gw.gateway.parts.issuer.mint(record.id, record.status.instance_id)
    as_sandbox = (("authorization", f"Bearer {token}"),)
    code = await _code_of(gw.stub.ListSandboxes(pb.ListSandboxesRequest(), metadata=as_sandbox))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    refreshed = await _supervisor_stub(gw).RefreshSandboxToken(spb.RefreshSandboxTokenRequest(), metadata=as_sandbox)
    assert refreshed.token
    code = await _code_of(
        _supervisor_stub(gw).RefreshSandboxToken(spb.RefreshSandboxTokenRequest(), metadata=gw.metadata)
    )
    assert code == grpc.StatusCode.PERMISSION_DENIED


async def test_forged_bootstrap_credentials_are_refused(gw: RunningGateway) -> None:
    await gw.create(name="victim")
    victim = await gw.wait_ready("victim")
    stub = _supervisor_stub(gw)
    forged = [
        "",  # nothing
        "not-a-credential",  # not a local credential at all
        f"wsl1.{victim.status.instance_id}.{'A' * 43}",  # a real instance id with a guessed secret
        "wsl1.li-0000000000000000.secret",  # an instance that does not exist
    ]
    for credential in forged:
        call = stub.RegisterSupervisor(spb.RegisterSupervisorRequest(bootstrap_credential=credential))
        code = await _code_of(call.read())
        assert code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED), credential


async def test_connect_with_token_of_another_sandbox_is_refused(gw: RunningGateway) -> None:
    await gw.create(name="a")
    await gw.create(name="b")
    a = await gw.wait_ready("a")
    b = await gw.wait_ready("b")
    token, _ = gw.gateway.parts.issuer.mint(a.id, a.status.instance_id)

    async def hello_for_b():  # type: ignore[no-untyped-def]
        yield spb.SupervisorMessage(hello=spb.SupervisorHello(sandbox_id=b.id))

    call = _supervisor_stub(gw).ConnectSupervisor(hello_for_b(), metadata=(("authorization", f"Bearer {token}"),))
    assert await _code_of(call.read()) == grpc.StatusCode.PERMISSION_DENIED


async def test_a_refused_session_reports_its_status_to_a_caller_that_writes_at_once(gw: RunningGateway) -> None:
    """A supervisor writes its hello as soon as its call opens. grpcio's asyncio client reports
    INTERNAL instead of the server's status when such a write starts after the server ended the
    call (grpc/grpc#36066), and a supervisor retries INTERNAL as "gateway unreachable"; the
    gateway reads the caller's hello before refusing, so every attempt gets the refusal."""
    stub = _supervisor_stub(gw)
    bad = (("authorization", "Bearer not-a-sandbox-token"),)
    hello = spb.SupervisorMessage(hello=spb.SupervisorHello(sandbox_id="00000000-0000-0000-0000-000000000000"))
    codes = await codes_of_racing_writes(lambda requests: stub.ConnectSupervisor(requests, metadata=bad), [hello])
    assert set(codes) == {grpc.StatusCode.UNAUTHENTICATED}, codes
