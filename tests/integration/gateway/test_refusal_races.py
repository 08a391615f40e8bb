"""Every refusal of a request stream, and every other end of one (a failure mid-way, an exec's
exit), reaches a caller that keeps writing as the call ends.

grpcio's asyncio client reports INTERNAL instead of the server's status when one of its writes
starts after the server ended the call (grpc/grpc#36066): an SDK user then sees "Internal error"
for a sandbox that does not exist, and a supervisor retries a refusal as a lost gateway. Each
status here is sent only once the caller's messages have been read (`tests/helpers/writerace`).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from tests.helpers.gateway import RunningGateway
from tests.helpers.writerace import codes_of_racing_writes
from warmshell.api.v1 import image_pb2 as ipb
from warmshell.api.v1 import image_pb2_grpc, sandbox_pb2_grpc, supervisor_pb2_grpc
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.core.errors import UnavailableError
from warmshell.core.models import SandboxId
from warmshell.gateway import calls, file_service

_BAD = (("authorization", "Bearer not-the-token"),)
_CHUNK = b"x" * 16 * 1024


def _stdin_after(first: pb.ExecStreamRequest) -> list[pb.ExecStreamRequest]:
    return [first, *(pb.ExecStreamRequest(stdin=_CHUNK) for _ in range(3)), pb.ExecStreamRequest(close_stdin=True)]


async def test_an_exec_stream_on_a_missing_sandbox_or_without_the_token_reports_its_refusal(
    gw: RunningGateway,
) -> None:
    start = pb.ExecStreamRequest(start=pb.ExecStreamStart(exec=pb.ExecSandboxRequest(name="missing", command=["cat"])))
    messages = _stdin_after(start)

    def exec_stream(md: Any) -> Any:
        return lambda requests: gw.stub.ExecSandboxStream(requests, metadata=md)

    assert set(await codes_of_racing_writes(exec_stream(gw.metadata), messages)) == {grpc.StatusCode.NOT_FOUND}
    assert set(await codes_of_racing_writes(exec_stream(_BAD), messages)) == {grpc.StatusCode.UNAUTHENTICATED}


async def test_a_reattach_to_a_missing_sandbox_reports_its_refusal(gw: RunningGateway) -> None:
    attach = pb.ExecStreamRequest(attach=pb.ProcessRef(name="missing", pid=7))
    codes = await codes_of_racing_writes(
        lambda requests: gw.stub.ConnectProcess(requests, metadata=gw.metadata), _stdin_after(attach)
    )
    assert set(codes) == {grpc.StatusCode.NOT_FOUND}


async def test_file_uploads_without_the_token_report_their_refusal(gw: RunningGateway) -> None:
    files = sandbox_pb2_grpc.FileServiceStub(gw.channel)
    write = [pb.WriteFileRequest(header=pb.WriteFileHeader(name="s", path="/workspace/f"))]
    write += [pb.WriteFileRequest(data=_CHUNK) for _ in range(3)]
    upload = [pb.UploadTarRequest(header=pb.UploadTarHeader(name="s", path="/workspace"))]
    upload += [pb.UploadTarRequest(data=_CHUNK) for _ in range(3)]
    codes = await codes_of_racing_writes(lambda requests: files.WriteFile(requests, metadata=_BAD), write)
    codes += await codes_of_racing_writes(lambda requests: files.UploadTar(requests, metadata=_BAD), upload)
    assert set(codes) == {grpc.StatusCode.UNAUTHENTICATED}


async def test_an_image_import_without_a_header_or_the_token_reports_its_refusal(gw: RunningGateway) -> None:
    images = image_pb2_grpc.ImageServiceStub(gw.channel)
    data = [ipb.ImportImageRequest(data=_CHUNK) for _ in range(4)]
    headed = [ipb.ImportImageRequest(header=ipb.ImportImageHeader(name="x")), *data]

    def importing(md: Any) -> Any:
        return lambda requests: images.ImportImage(requests, metadata=md)

    codes = await codes_of_racing_writes(importing(gw.metadata), data)
    assert set(codes) == {grpc.StatusCode.INVALID_ARGUMENT}
    assert set(await codes_of_racing_writes(importing(_BAD), headed)) == {grpc.StatusCode.UNAUTHENTICATED}


async def test_a_session_refused_after_its_hello_reports_its_refusal(gw: RunningGateway) -> None:
    """A supervisor sends what its outbox holds (the workload's output, its exit) right after
    its hello; a session refused once the hello is read (another sandbox's hello, a deleted
    sandbox) must still reach it as that refusal, or it reconnects instead of stopping."""
    await gw.create(name="a")
    await gw.create(name="b")
    a = await gw.wait_ready("a")
    b = await gw.wait_ready("b")
    stub = supervisor_pb2_grpc.SupervisorServiceStub(gw.channel)
    issuer = gw.gateway.parts.issuer
    queued = [spb.SupervisorMessage(output=spb.OutputData(data=_CHUNK)) for _ in range(3)]
    queued.append(spb.SupervisorMessage(workload_exited=spb.WorkloadExited(exit_code=0)))

    def session(record: pb.Sandbox, hello_of: pb.Sandbox) -> tuple[Any, list[spb.SupervisorMessage]]:
        token, _ = issuer.mint(record.id, record.status.instance_id)
        bearer = (("authorization", f"Bearer {token}"),)
        hello = spb.SupervisorHello(sandbox_id=hello_of.id, instance_id=hello_of.status.instance_id)

        def connect(requests: AsyncIterator[spb.SupervisorMessage]) -> Any:
            return stub.ConnectSupervisor(requests, metadata=bearer)

        return connect, [spb.SupervisorMessage(hello=hello), *queued]

    assert set(await codes_of_racing_writes(*session(a, b))) == {grpc.StatusCode.PERMISSION_DENIED}
    deleted = session(b, b)
    await gw.delete("b")
    assert set(await codes_of_racing_writes(*deleted)) == {grpc.StatusCode.NOT_FOUND}


async def test_a_refused_registration_on_one_stream_reports_its_refusal(gw: RunningGateway) -> None:
    stub = supervisor_pb2_grpc.SupervisorServiceStub(gw.channel)
    hello = spb.SupervisorMessage(hello=spb.SupervisorHello(sandbox_id="00000000-0000-0000-0000-000000000000"))
    attempts = itertools.count()

    def registering() -> list[spb.SupervisorMessage]:
        # A credential of its own each time: the registrations' rate limit is per credential.
        forged = spb.RegisterSupervisorRequest(bootstrap_credential=f"not-a-credential-{next(attempts)}")
        return [spb.SupervisorMessage(register=forged), hello, hello]

    codes = await codes_of_racing_writes(stub.OpenSupervisor, registering)
    assert set(codes) == {grpc.StatusCode.UNAUTHENTICATED}, codes


async def test_a_session_that_fails_once_accepted_reports_its_status(
    gw: RunningGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session accepted and then failed (the store unreachable as it records the session) ends
    while the supervisor is still sending (its outbox, then its workload's output as it comes):
    it must read UNAVAILABLE (retry), whatever the timing, not INTERNAL. The session's reader is
    waiting for that output when the session fails, and must not take the stream with it."""
    await gw.create(name="a")
    a = await gw.wait_ready("a")
    manager = gw.gateway.parts.manager
    manager.sessions.end(SandboxId(a.id), "its supervisor is replaced by this test's")
    recorded = manager.on_session

    async def unreachable(sandbox_id: SandboxId, *, connected: bool, **fields: Any) -> None:
        if connected:
            await asyncio.sleep(0.002)  # the store's answer, in the middle of the writes' delays
            raise UnavailableError("the store is unreachable")
        await recorded(sandbox_id, connected=connected, **fields)

    monkeypatch.setattr(manager, "on_session", unreachable)
    stub = supervisor_pb2_grpc.SupervisorServiceStub(gw.channel)
    token, _ = gw.gateway.parts.issuer.mint(a.id, a.status.instance_id)
    bearer = (("authorization", f"Bearer {token}"),)
    hello = spb.SupervisorMessage(hello=spb.SupervisorHello(sandbox_id=a.id, instance_id=a.status.instance_id))

    async def hello_then(output: AsyncIterator[spb.SupervisorMessage]) -> AsyncIterator[spb.SupervisorMessage]:
        yield hello
        async for message in output:
            yield message

    output = [spb.SupervisorMessage(output=spb.OutputData(data=_CHUNK)) for _ in range(3)]
    codes = await codes_of_racing_writes(lambda out: stub.ConnectSupervisor(hello_then(out), metadata=bearer), output)
    # Two sessions at a time: the second may find the first still open (ALREADY_EXISTS, refused).
    assert grpc.StatusCode.UNAVAILABLE in codes
    assert set(codes) <= {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ALREADY_EXISTS}, codes


async def test_an_exec_that_ends_while_its_stdin_is_sent_reports_its_end(gw: RunningGateway) -> None:
    """A command that exits while its client is still sending stdin (its relay waiting for the
    next message) ends the call OK, after the exit event, not INTERNAL: the SDK reads a streamed
    stdin's call to its end."""
    await gw.create(name="e")
    await gw.wait_ready("e")
    start = pb.ExecStreamRequest(start=pb.ExecStreamStart(exec=pb.ExecSandboxRequest(name="e", command=["true"])))

    async def start_then(stdin: AsyncIterator[pb.ExecStreamRequest]) -> AsyncIterator[pb.ExecStreamRequest]:
        yield start
        async for message in stdin:
            yield message

    stdin = [*(pb.ExecStreamRequest(stdin=_CHUNK) for _ in range(3)), pb.ExecStreamRequest(close_stdin=True)]
    codes = await codes_of_racing_writes(
        lambda requests: gw.stub.ExecSandboxStream(start_then(requests), metadata=gw.metadata), stdin
    )
    assert set(codes) == {grpc.StatusCode.OK}, codes


async def test_a_refused_write_waits_for_its_client_once(gw: RunningGateway, monkeypatch: pytest.MonkeyPatch) -> None:
    """A refused write waits for its client's last writes up to the file streams' bound, and
    then answers: not a second time up to the bound of callers not yet authenticated."""
    monkeypatch.setattr(file_service, "_DRAIN_SECONDS", 0.3)
    monkeypatch.setattr(calls, "REFUSAL_DRAIN_SECONDS", 5.0)
    files = sandbox_pb2_grpc.FileServiceStub(gw.channel)
    done_writing = asyncio.Event()

    async def held_open() -> AsyncIterator[pb.WriteFileRequest]:
        yield pb.WriteFileRequest(header=pb.WriteFileHeader(name="missing", path="/workspace/f"))
        await done_writing.wait()  # a client that sends nothing more and does not half-close

    started = asyncio.get_running_loop().time()
    try:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await files.WriteFile(held_open(), metadata=gw.metadata)
    finally:
        done_writing.set()
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert 0.3 <= asyncio.get_running_loop().time() - started < 3.0
