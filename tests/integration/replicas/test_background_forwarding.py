"""Background commands with two replicas on kubesim and Postgres: the commands live on the replica
holding the sandbox's session, and a start, a listing and a reattach reach them through either
replica (forwarded as the execs are), stdin and the exit included."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from tests.helpers.replicas import ReplicaSet, wait_phase
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
    await stubs[other].DeleteSandbox(pb.SandboxRef(name="bg"), metadata=md)
