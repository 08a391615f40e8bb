"""Attacks on background commands (real gateway, real bwrap'd sandboxes): a sandbox's own token
cannot list, start or attach; a pid names a command of one sandbox only; a flood of output
nobody reads costs the gateway the ring and no more; a sandbox cannot pile up commands past the
cap; a malformed reattach is refused naming the field; a copied sandbox token cannot make the
gateway adopt forged commands."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.helpers.gateway import RunningGateway, running_gateway
from tests.integration.security.support import sandbox, still_real
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.api.v1 import supervisor_pb2_grpc
from warmshell.gateway import background

pytestmark = pytest.mark.timeout(120)
HISTORY = 64 * 1024


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[RunningGateway]:
    async with running_gateway(tmp_path / "state", exec_history_bytes=HISTORY) as running:
        yield running


def start(name: str, *command: str) -> pb.StartProcessRequest:
    return pb.StartProcessRequest(start=pb.ExecStreamStart(exec=pb.ExecSandboxRequest(name=name, command=command)))


async def attach(gw: RunningGateway, *requests: pb.ExecStreamRequest) -> tuple[bytes, int | None]:
    """ConnectProcess with `requests`: the output and the exit code it answered."""

    async def sent() -> AsyncIterator[pb.ExecStreamRequest]:
        for request in requests:
            yield request

    out, code = b"", None
    async for event in gw.stub.ConnectProcess(sent(), metadata=gw.metadata):
        out += event.stdout
        code = event.exit_code if event.HasField("exit_code") else code
    return out, code


async def refused(call: Any) -> grpc.aio.AioRpcError:
    """How `call` (a unary call, or a stream read to its end) failed; fails the test if it did not."""
    try:
        if hasattr(call, "__aiter__"):
            async for _ in call:
                pass
        else:
            await call
    except grpc.aio.AioRpcError as failed:
        return failed
    raise AssertionError("the call was not refused")


async def test_a_sandbox_token_cannot_reach_background_commands(gw: RunningGateway) -> None:
    await sandbox(gw, "victim")
    started = await gw.stub.StartProcess(start("victim", "sleep", "60"), metadata=gw.metadata)
    record = await gw.gateway.parts.records.get_by_name("default", "victim")
    token, _ = gw.gateway.parts.issuer.mint(record.id, record.status.instance_id)
    as_sandbox = (("authorization", f"Bearer {token}"),)
    listing = await refused(gw.stub.ListProcesses(pb.SandboxRef(name="victim"), metadata=as_sandbox))
    assert listing.code() == grpc.StatusCode.PERMISSION_DENIED
    starting = await refused(gw.stub.StartProcess(start("victim", "true"), metadata=as_sandbox))
    assert starting.code() == grpc.StatusCode.PERMISSION_DENIED

    async def attaching() -> AsyncIterator[pb.ExecStreamRequest]:
        yield pb.ExecStreamRequest(attach=pb.ProcessRef(name="victim", pid=started.pid))

    attached = await refused(gw.stub.ConnectProcess(attaching(), metadata=as_sandbox))
    assert attached.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_a_pid_names_a_command_of_its_own_sandbox_only(gw: RunningGateway) -> None:
    await sandbox(gw, "a")
    await sandbox(gw, "b")
    mine = await gw.stub.StartProcess(start("a", "sh", "-c", "echo secret-of-a"), metadata=gw.metadata)
    assert mine.pid == 1
    elsewhere = await refused(
        gw.stub.ConnectProcess(
            iter_requests(pb.ExecStreamRequest(attach=pb.ProcessRef(name="b", pid=mine.pid))), metadata=gw.metadata
        )
    )
    assert elsewhere.code() == grpc.StatusCode.NOT_FOUND
    assert (elsewhere.details() or "").startswith("pid: ")
    other_workspace = pb.ProcessRef(name="a", workspace="other", pid=mine.pid)
    missing = await refused(
        gw.stub.ConnectProcess(iter_requests(pb.ExecStreamRequest(attach=other_workspace)), metadata=gw.metadata)
    )
    assert missing.code() == grpc.StatusCode.NOT_FOUND
    assert (await gw.stub.ListProcesses(pb.SandboxRef(name="b"), metadata=gw.metadata)).processes == []
    out, code = await attach(gw, pb.ExecStreamRequest(attach=pb.ProcessRef(name="a", pid=mine.pid)))
    assert (out, code) == (b"secret-of-a\n", 0)


async def iter_requests(*requests: pb.ExecStreamRequest) -> AsyncIterator[pb.ExecStreamRequest]:
    for request in requests:
        yield request


async def test_a_flood_nobody_reads_costs_the_ring_alone(gw: RunningGateway) -> None:
    await sandbox(gw, "flood")
    total = 64 * 1024 * 1024
    started = await gw.stub.StartProcess(start("flood", "head", "-c", str(total), "/dev/zero"), metadata=gw.metadata)
    ref = pb.SandboxRef(name="flood")
    async with asyncio.timeout(60):  # nobody attached: it runs at full speed, into the ring
        while (info := (await gw.stub.ListProcesses(ref, metadata=gw.metadata)).processes[0]).state == "running":
            await asyncio.sleep(0.05)
    assert (info.exit_code, info.output_bytes, info.dropped_bytes) == (0, total, total - HISTORY)
    record = await gw.gateway.parts.records.get_by_name("default", "flood")
    ring = gw.gateway.parts.background.get(record.id, started.pid).ring
    assert ring.end - ring.start == HISTORY  # what the gateway holds of it
    out, code = await attach(gw, pb.ExecStreamRequest(attach=pb.ProcessRef(name="flood", pid=started.pid)))
    assert (len(out), code) == (HISTORY, 0)
    await still_real(gw, "flood")


async def test_a_sandbox_cannot_pile_up_background_commands(gw: RunningGateway) -> None:
    await sandbox(gw, "pile")
    for _ in range(background.MAX_RUNNING):
        await gw.stub.StartProcess(start("pile", "sleep", "60"), metadata=gw.metadata)
    over = await refused(gw.stub.StartProcess(start("pile", "sleep", "60"), metadata=gw.metadata))
    assert over.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"{background.MAX_RUNNING} background commands" in (over.details() or "")
    await still_real(gw, "pile")


async def test_a_malformed_reattach_is_refused_naming_the_field(gw: RunningGateway) -> None:
    await sandbox(gw, "shape")
    started = await gw.stub.StartProcess(start("shape", "sleep", "60"), metadata=gw.metadata)
    no_attach = await refused(
        gw.stub.ConnectProcess(iter_requests(pb.ExecStreamRequest(stdin=b"x")), metadata=gw.metadata)
    )
    assert no_attach.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (no_attach.details() or "").startswith("attach: ")
    ref = pb.ProcessRef(name="shape", pid=started.pid)
    twice = await refused(
        gw.stub.ConnectProcess(
            iter_requests(pb.ExecStreamRequest(attach=ref), pb.ExecStreamRequest(attach=ref)), metadata=gw.metadata
        )
    )
    assert twice.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (twice.details() or "").startswith("attach: ")
    signal = await refused(
        gw.stub.ConnectProcess(
            iter_requests(pb.ExecStreamRequest(attach=ref), pb.ExecStreamRequest(signal=99)), metadata=gw.metadata
        )
    )
    assert signal.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (signal.details() or "").startswith("signal: ")
    [info] = (await gw.stub.ListProcesses(pb.SandboxRef(name="shape"), metadata=gw.metadata)).processes
    assert info.state == "running"  # refusing a client's call stops nothing


async def test_a_copied_sandbox_token_cannot_inject_background_commands(gw: RunningGateway) -> None:
    """The list a new session adopts comes from the sandbox's supervisor, outside the workload.
    Suppose the sandbox token leaked anyway: a forged supervisor's hello (a pid of the sandbox
    under another command, pids of another sandbox) opens no session while the real one lives, and
    names no other sandbox; the sandbox's commands stay what they were."""
    victim = await sandbox(gw, "victim")
    bystander = await sandbox(gw, "bystander")
    started = await gw.stub.StartProcess(start("victim", "sh", "-c", "echo real; sleep 60"), metadata=gw.metadata)
    token, _ = gw.gateway.parts.issuer.mint(victim.id, victim.status.instance_id)
    forged = [
        spb.BackgroundExec(pid=started.pid, exec_id="f" * 32, command=["forged"]),
        spb.BackgroundExec(pid=started.pid + 1, exec_id="e" * 32, command=["forged"]),
    ]
    stub = supervisor_pb2_grpc.SupervisorServiceStub(gw.channel)
    for sandbox_id in (victim.id, bystander.id):

        async def hello(sandbox_id: str = sandbox_id) -> AsyncIterator[spb.SupervisorMessage]:
            yield spb.SupervisorMessage(
                hello=spb.SupervisorHello(
                    sandbox_id=sandbox_id, instance_id=victim.status.instance_id, background=forged
                )
            )

        session = stub.ConnectSupervisor(hello(), metadata=(("authorization", f"Bearer {token}"),))
        failed = await refused(session)
        assert failed.code() in (grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.PERMISSION_DENIED), failed
    for name, expected in (("victim", [(started.pid, "sh")]), ("bystander", [])):
        listed = await gw.stub.ListProcesses(pb.SandboxRef(name=name), metadata=gw.metadata)
        assert [(p.pid, p.command[0]) for p in listed.processes] == expected
    await still_real(gw, "victim")
    await still_real(gw, "bystander")
