"""Background commands with two replicas on kubesim and Postgres: the commands live on the replica
holding the sandbox's session, and a start, a listing and a reattach reach them through either
replica (forwarded as the execs are), stdin and the exit included; and they outlive the replica
holding the session."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
import pytest

from tests.helpers.replicas import ReplicaSet, wait_phase
from tests.helpers.writerace import codes_of_racing_writes
from warmshell.api.v1 import sandbox_pb2 as pb

from .scenario import owner_of

pytestmark = pytest.mark.timeout(180)


async def test_background_commands_are_reached_through_either_replica(replicas: ReplicaSet) -> None:
    first, second = await replicas.start_one(), await replicas.start_one()
    stubs = {r.id: replicas.stub(r.tcp) for r in (first, second)}
    md = replicas.metadata
    await stubs[first.id].CreateSandbox(pb.CreateSandboxRequest(name="bg"), metadata=md)
    owner = owner_of(await wait_phase(stubs[second.id], md, "bg"))
    other = next(r for r in stubs if r != owner)
    command = pb.ExecSandboxRequest(name="bg", command=["sh", "-c", "echo ready; read line; echo got $line; exit 4"])
    started = await stubs[other].StartProcess(
        pb.StartProcessRequest(start=pb.ExecStreamStart(exec=command), open_stdin=True), metadata=md
    )
    for via in (owner, other):
        listed = await stubs[via].ListProcesses(pb.SandboxRef(name="bg"), metadata=md)
        assert [(p.pid, p.state) for p in listed.processes] == [(started.pid, "running")]

    async def attach_and_send() -> AsyncIterator[pb.ExecStreamRequest]:
        yield pb.ExecStreamRequest(attach=pb.ProcessRef(name="bg", pid=started.pid))
        yield pb.ExecStreamRequest(stdin=b"hello\n")

    out, code = b"", None
    async for event in stubs[other].ConnectProcess(attach_and_send(), metadata=md):
        out += event.stdout
        if event.HasField("exit_code"):
            code = event.exit_code
    assert (out, code) == (b"ready\ngot hello\n", 4)

    async def attach_unknown() -> AsyncIterator[pb.ExecStreamRequest]:
        yield pb.ExecStreamRequest(attach=pb.ProcessRef(name="bg", pid=started.pid + 100))

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        async for _ in stubs[other].ConnectProcess(attach_unknown(), metadata=md):
            pass
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert (refused.value.details() or "").startswith("pid: ")
    # The owner's refusal, relayed, reaches a caller still writing its stdin (grpc/grpc#36066).
    attach = pb.ExecStreamRequest(attach=pb.ProcessRef(name="bg", pid=started.pid + 100))
    unknown = [attach, *(pb.ExecStreamRequest(stdin=b"x" * 16384) for _ in range(3))]
    codes = await codes_of_racing_writes(lambda requests: stubs[other].ConnectProcess(requests, metadata=md), unknown)
    assert set(codes) == {grpc.StatusCode.NOT_FOUND}
    await stubs[other].DeleteSandbox(pb.SandboxRef(name="bg"), metadata=md)


async def test_background_commands_survive_the_death_of_the_replica_holding_their_session(
    replicas: ReplicaSet,
) -> None:
    """SIGKILL of the replica holding the session: the pod's supervisor reconnects through the
    Service to the survivor, which re-adopts its commands under the same pids."""
    first, second = await replicas.start_one(), await replicas.start_one()
    stubs = {r.id: replicas.stub(r.tcp) for r in (first, second)}
    md = replicas.metadata
    await stubs[first.id].CreateSandbox(pb.CreateSandboxRequest(name="bg"), metadata=md)
    owner = owner_of(await wait_phase(stubs[second.id], md, "bg"))
    survivor = next(r for r in (first, second) if r.id != owner)
    script = "echo before; sleep 2; echo during; read line; echo got $line; exit 3"
    command = pb.ExecSandboxRequest(name="bg", command=["sh", "-c", script])
    started = await stubs[survivor.id].StartProcess(
        pb.StartProcessRequest(start=pb.ExecStreamStart(exec=command), open_stdin=True), metadata=md
    )
    async with asyncio.timeout(30):  # it runs in the pod (StartProcess answers before it starts)
        while not (await stubs[owner].ListProcesses(pb.SandboxRef(name="bg"), metadata=md)).processes[0].output_bytes:
            await asyncio.sleep(0.05)
    replicas.kill(next(r for r in (first, second) if r.id == owner))
    stub = stubs[survivor.id]
    async with asyncio.timeout(60):
        while True:  # until the supervisor's new session (on the survivor) has re-adopted it
            with contextlib.suppress(grpc.aio.AioRpcError):
                listed = await stub.ListProcesses(pb.SandboxRef(name="bg"), metadata=md)
                if [p.pid for p in listed.processes] == [started.pid]:
                    break
            await asyncio.sleep(0.2)

    async def attach_and_send() -> AsyncIterator[pb.ExecStreamRequest]:
        yield pb.ExecStreamRequest(attach=pb.ProcessRef(name="bg", pid=started.pid))
        yield pb.ExecStreamRequest(stdin=b"again\n")

    out, code = b"", None
    async for event in stub.ConnectProcess(attach_and_send(), metadata=md):
        out += event.stdout
        if event.HasField("exit_code"):
            code = event.exit_code
    assert (out, code) == (b"before\nduring\ngot again\n", 3)
    await stub.DeleteSandbox(pb.SandboxRef(name="bg"), metadata=md)
