"""CreateSandbox with `wait_ready` on a real gateway: one call answers with the Ready sandbox
(warm and cold), a reply that times out is still Provisioning (the caller watches on, as with a
gateway that ignores the field), and a sandbox that fails or is deleted while the call waits
ends it as a watch would."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from tests.helpers.gateway import RunningGateway, pool_named, running_gateway, wait_pools
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.core import deadlines
from warmshell.core.ids import SandboxId

PROFILE = 'version = 1\nworkspace = "default"\nreplicas = 1\n[environment]\nPOOL = "waits"\n'


def _request(name: str, timeout_ms: int = 20_000, **spec: object) -> pb.CreateSandboxRequest:
    return pb.CreateSandboxRequest(name=name, spec=pb.SandboxSpec(**spec), wait_ready=True, ready_timeout_ms=timeout_ms)


async def test_one_call_answers_ready_warm_and_cold(tmp_path: Path) -> None:
    pools = tmp_path / "pools"
    pools.mkdir()
    (pools / "waits.toml").write_text(PROFILE)
    settings = {"local.pools_dir": str(pools), "local.pool_reload_interval_seconds": 0.1}
    async with running_gateway(tmp_path / "state", **settings) as gw:
        await wait_pools(gw, lambda r: (p := pool_named(r, "waits")) is not None and p.idle >= 1)
        warm = await gw.stub.CreateSandbox(_request("warm", environment={"POOL": "waits"}), metadata=gw.metadata)
        cold = await gw.stub.CreateSandbox(_request("cold", environment={"POOL": "none"}), metadata=gw.metadata)
        for reply, allocation in ((warm, "warm"), (cold, "cold")):
            assert reply.status.phase == pb.SANDBOX_PHASE_READY, reply
            assert reply.status.allocation == allocation
            assert reply.status.timeline.ready_us >= reply.status.timeline.requested_us > 0
            # The reply is the stored sandbox as it is, not a guess.
            assert (await gw.get(reply.name)).resource_version == reply.resource_version
        code, out, _ = await gw.exec("cold", ["echo", "hi"])
        assert (code, out) == (0, b"hi\n")


async def _never_ready(gw: RunningGateway, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sessions open but are never recorded: every sandbox stays Provisioning."""

    async def ignored(sandbox_id: SandboxId, *, connected: bool, session_id: str = "") -> None:
        return None

    monkeypatch.setattr(gw.gateway.parts.manager, "on_session", ignored)


async def test_a_wait_that_times_out_answers_provisioning(gw: RunningGateway, monkeypatch: pytest.MonkeyPatch) -> None:
    await _never_ready(gw, monkeypatch)
    started = asyncio.get_running_loop().time()
    reply = await gw.stub.CreateSandbox(_request("slow", timeout_ms=300), metadata=gw.metadata)
    assert reply.status.phase == pb.SANDBOX_PHASE_PROVISIONING
    assert asyncio.get_running_loop().time() - started >= 0.3
    # Without wait_ready the reply comes at once, as before the field existed.
    reply = await gw.stub.CreateSandbox(pb.CreateSandboxRequest(name="old-client"), metadata=gw.metadata)
    assert reply.status.phase == pb.SANDBOX_PHASE_PROVISIONING


async def test_a_sandbox_that_fails_while_waited_on_ends_the_call(
    gw: RunningGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _never_ready(gw, monkeypatch)
    manager = gw.gateway.parts.manager
    monkeypatch.setattr(manager, "deadlines", deadlines.ProvisioningDeadlines(cold_seconds=0.3, warm_seconds=0.3))
    reply = await gw.stub.CreateSandbox(_request("doomed"), metadata=gw.metadata)
    assert reply.status.phase == pb.SANDBOX_PHASE_ERROR
    ready = next(c for c in reply.status.conditions if c.type == "Ready")
    assert ready.reason == deadlines.REASON


async def test_a_sandbox_deleted_while_waited_on_ends_the_call(
    gw: RunningGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _never_ready(gw, monkeypatch)
    call = asyncio.ensure_future(gw.stub.CreateSandbox(_request("gone"), metadata=gw.metadata))
    async with asyncio.timeout(10):
        while not [
            s
            for s in (await gw.stub.ListSandboxes(pb.ListSandboxesRequest(), metadata=gw.metadata)).sandboxes
            if s.name == "gone"
        ]:
            await asyncio.sleep(0.01)  # (the call has not reached the gateway yet)
    await gw.delete("gone")
    (outcome,) = await asyncio.wait_for(asyncio.gather(call, return_exceptions=True), 10)
    if isinstance(outcome, grpc.aio.AioRpcError):  # removed before the waiter read it again
        assert outcome.code() == grpc.StatusCode.NOT_FOUND
        assert "default/gone was deleted before it was Ready" in (outcome.details() or "")
    else:  # it saw the sandbox Deleting: terminal, the call is over
        assert isinstance(outcome, pb.Sandbox)
        assert outcome.status.phase == pb.SANDBOX_PHASE_DELETING
