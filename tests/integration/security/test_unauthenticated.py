"""Attacks as a network client with no credential (or a wrong one), on the Unix socket and on TCP.

Every public RPC, and every supervisor RPC, is refused UNAUTHENTICATED before it looks at the
request: a bad request learns nothing (not even that it is bad), a streaming call that sends
nothing is not left waiting, and nothing is created, deleted or changed. Oversized messages and
a flood of streams are refused while the real client's calls carry on."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from aiohttp import ClientSession

from tests.helpers.gateway import RunningGateway, running_gateway
from tests.integration.drivers_local.support import needs_bwrap
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.api.v1 import sandbox_pb2_grpc, supervisor_pb2_grpc
from warmshell.api.v1 import supervisor_pb2 as spb

pytestmark = [needs_bwrap]

VICTIM = "victim"
UNAUTH = grpc.StatusCode.UNAUTHENTICATED
# A refusal is immediate: nothing waits for a message an unauthenticated caller may never send.
PROMPT_SECONDS = 5.0
# About one call in 300 whose client is still sending its request when the gateway's refusal
# arrives ends, on the client, with this instead of the refusal (a gRPC core race, seen with
# the unauthenticated ExecSandboxStream): the handler never ran, so it is a refusal too.
CORE_RACE = (grpc.StatusCode.INTERNAL, "Internal error from Core")


class Silence:
    """Request streams that send nothing until the test ends them (a finished call leaves its
    request stream to the caller, so each is ended here rather than left pending)."""

    def __init__(self) -> None:
        self._over = asyncio.Event()

    async def stream(self) -> AsyncIterator[Any]:
        await self._over.wait()
        return
        yield  # an async generator that yields nothing

    async def end(self) -> None:
        self._over.set()
        await asyncio.sleep(0.1)  # let every call's request poller see the end


@pytest.fixture
async def silence() -> AsyncIterator[Silence]:
    quiet = Silence()
    yield quiet
    await quiet.end()


async def _one(message: Any) -> AsyncIterator[Any]:
    yield message


def _calls(
    channel: grpc.aio.Channel, silent: Callable[[], AsyncIterator[Any]]
) -> dict[str, Callable[[Any], Awaitable[object]]]:
    """Every RPC a client can reach, each with a request that would act on the victim, or on a
    path or field that is itself invalid (so validation before authentication would show)."""
    sandboxes = sandbox_pb2_grpc.SandboxServiceStub(channel)
    files = sandbox_pb2_grpc.FileServiceStub(channel)
    sup = supervisor_pb2_grpc.SupervisorServiceStub(channel)
    ref = pb.SandboxRef(name=VICTIM)
    fref = pb.FileRef(name=VICTIM, path="/workspace/f")

    def drain(call: Any) -> Awaitable[object]:
        async def run() -> object:
            return [message async for message in call]

        return run()

    return {
        "CreateSandbox": lambda md: sandboxes.CreateSandbox(pb.CreateSandboxRequest(name="intruder"), metadata=md),
        "GetSandbox": lambda md: sandboxes.GetSandbox(ref, metadata=md),
        "ListSandboxes": lambda md: sandboxes.ListSandboxes(pb.ListSandboxesRequest(all_workspaces=True), metadata=md),
        "DeleteSandbox": lambda md: sandboxes.DeleteSandbox(ref, metadata=md),
        "RefreshTtl": lambda md: sandboxes.RefreshTtl(pb.RefreshTtlRequest(name=VICTIM, ttl_seconds=1), metadata=md),
        "ListPools": lambda md: sandboxes.ListPools(pb.ListPoolsRequest(all_workspaces=True), metadata=md),
        "WatchSandbox": lambda md: drain(sandboxes.WatchSandbox(pb.WatchSandboxRequest(name=VICTIM), metadata=md)),
        "ExecSandbox": lambda md: drain(
            sandboxes.ExecSandbox(
                pb.ExecSandboxRequest(name=VICTIM, command=["touch", "/workspace/pwned"]), metadata=md
            )
        ),
        "ExecSandboxStream/silent": lambda md: drain(sandboxes.ExecSandboxStream(silent(), metadata=md)),
        "ExecSandboxStream": lambda md: drain(
            sandboxes.ExecSandboxStream(
                _one(
                    pb.ExecStreamRequest(
                        start=pb.ExecStreamStart(
                            exec=pb.ExecSandboxRequest(name=VICTIM, command=["touch", "/workspace/pwned"])
                        )
                    )
                ),
                metadata=md,
            )
        ),
        "ReadFile": lambda md: drain(files.ReadFile(fref, metadata=md)),
        "ReadFile/bad-path": lambda md: drain(files.ReadFile(pb.FileRef(name=VICTIM, path="relative"), metadata=md)),
        "WriteFile/silent": lambda md: files.WriteFile(silent(), metadata=md),
        "WriteFile": lambda md: files.WriteFile(
            _one(pb.WriteFileRequest(header=pb.WriteFileHeader(name=VICTIM, path="/workspace/pwned"))), metadata=md
        ),
        "WriteFile/bad-mode": lambda md: files.WriteFile(
            _one(pb.WriteFileRequest(header=pb.WriteFileHeader(name=VICTIM, path="/workspace/p", mode=0o77777))),
            metadata=md,
        ),
        "StatFile": lambda md: files.StatFile(fref, metadata=md),
        "StatFile/bad-path": lambda md: files.StatFile(pb.FileRef(name=VICTIM, path=""), metadata=md),
        "ListFiles": lambda md: files.ListFiles(pb.FileRef(name=VICTIM, path="/"), metadata=md),
        "ListFiles/bad-path": lambda md: files.ListFiles(pb.FileRef(name=VICTIM, path="/a\0b"), metadata=md),
        "RemoveFile": lambda md: files.RemoveFile(pb.RemoveFileRequest(file=fref), metadata=md),
        "RemoveFile/bad-path": lambda md: files.RemoveFile(
            pb.RemoveFileRequest(file=pb.FileRef(name=VICTIM, path="x")), metadata=md
        ),
        "MakeDirectory": lambda md: files.MakeDirectory(
            pb.MakeDirectoryRequest(directory=pb.FileRef(name=VICTIM, path="/workspace/pwned")), metadata=md
        ),
        "MakeDirectory/bad-mode": lambda md: files.MakeDirectory(
            pb.MakeDirectoryRequest(directory=pb.FileRef(name=VICTIM, path="/workspace/p"), mode=0o77777), metadata=md
        ),
        "ConnectSupervisor/silent": lambda md: drain(sup.ConnectSupervisor(silent(), metadata=md)),
        "ConnectSupervisor": lambda md: drain(
            sup.ConnectSupervisor(
                _one(spb.SupervisorMessage(hello=spb.SupervisorHello(sandbox_id="x", instance_id="y"))), metadata=md
            )
        ),
        "RefreshSandboxToken": lambda md: sup.RefreshSandboxToken(spb.RefreshSandboxTokenRequest(), metadata=md),
    }


def _wrong_credentials(token: str) -> dict[str, tuple[tuple[str, str], ...]]:
    return {
        "none": (),
        "empty bearer": (("authorization", "Bearer "),),
        "garbage": (("authorization", "Bearer not-the-token"),),
        "wrong scheme": (("authorization", f"Basic {token}"),),
        "token prefix": (("authorization", f"Bearer {token[:-1]}"),),
        "token plus a byte": (("authorization", f"Bearer {token}x"),),
        "as another header": (("x-api-token", token),),
    }


async def _refusal(call: Awaitable[object]) -> tuple[grpc.StatusCode, str]:
    try:
        async with asyncio.timeout(PROMPT_SECONDS):
            result = await call
    except grpc.aio.AioRpcError as err:
        return err.code(), err.details() or ""
    except TimeoutError:
        return grpc.StatusCode.DEADLINE_EXCEEDED, "the gateway kept an unauthenticated call waiting"
    return grpc.StatusCode.OK, f"accepted: {result!r}"


async def _victim(gw: RunningGateway) -> pb.Sandbox:
    await gw.create(name=VICTIM)
    ready = await gw.wait_ready(VICTIM)
    assert ready.status.phase == pb.SANDBOX_PHASE_READY, ready
    return ready


@pytest.mark.parametrize("transport", ["unix", "tcp"])
async def test_every_rpc_without_a_valid_credential_is_refused_before_anything_else(
    gw: RunningGateway, silence: Silence, transport: str
) -> None:
    before = await _victim(gw)
    target = f"unix://{gw.gateway.paths.socket}" if transport == "unix" else f"127.0.0.1:{gw.gateway.tcp_port}"
    wrong = _wrong_credentials(gw.token)
    async with grpc.aio.insecure_channel(target) as channel:
        calls = _calls(channel, silence.stream)
        outcomes = {}
        for rpc, call in calls.items():
            for label, metadata in wrong.items():
                outcomes[rpc, label] = await _refusal(call(metadata))
    accepted = sorted(
        (rpc, label, code.name, details)
        for (rpc, label), (code, details) in outcomes.items()
        if code != UNAUTH and (code, details) != CORE_RACE
    )
    assert accepted == [], accepted
    # The refusals say what to present, and never echo what was presented.
    assert all(gw.token[:8] not in details for _, details in outcomes.values())
    # Nothing happened: no sandbox made or removed, no file, the lifetime untouched.
    listed = await gw.stub.ListSandboxes(pb.ListSandboxesRequest(all_workspaces=True), metadata=gw.metadata)
    assert [s.name for s in listed.sandboxes] == [VICTIM]
    after = await gw.get(VICTIM)
    assert after.status.phase == pb.SANDBOX_PHASE_READY
    assert after.lifetime == before.lifetime
    assert await gw.exec(VICTIM, ["/bin/sh", "-c", "ls -A /workspace; echo REAL"]) == (0, b"REAL\n", b"")


async def test_an_oversized_message_without_a_credential_is_refused_and_costs_nothing(gw: RunningGateway) -> None:
    await _victim(gw)
    limit = gw.gateway.config.max_request_bytes
    async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.gateway.tcp_port}") as channel:
        stub = sandbox_pb2_grpc.SandboxServiceStub(channel)
        files = sandbox_pb2_grpc.FileServiceStub(channel)
        for _ in range(5):
            code, _ = await _refusal(stub.CreateSandbox(pb.CreateSandboxRequest(name="x" * (4 * limit))))
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
            big = pb.WriteFileRequest(header=pb.WriteFileHeader(name=VICTIM, path="/workspace/" + "y" * (4 * limit)))
            code, _ = await _refusal(files.WriteFile(_one(big)))
            assert code in (grpc.StatusCode.RESOURCE_EXHAUSTED, UNAUTH)
    assert await gw.exec(VICTIM, ["echo", "REAL"]) == (0, b"REAL\n", b"")


async def test_a_flood_of_unauthenticated_streams_holds_nothing_and_the_client_carries_on(
    gw: RunningGateway, silence: Silence
) -> None:
    await _victim(gw)
    flood = 600  # several connections' worth of the per-connection stream limit
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{gw.gateway.tcp_port}") for _ in range(6)]
    try:
        calls = []
        for i in range(flood):
            channel = channels[i % len(channels)]
            stubs = (sandbox_pb2_grpc.SandboxServiceStub(channel), sandbox_pb2_grpc.FileServiceStub(channel))
            calls.append(
                stubs[0].ExecSandboxStream(silence.stream()) if i % 2 else stubs[1].WriteFile(silence.stream())
            )

        try:
            async with asyncio.timeout(30):
                codes = await asyncio.gather(*(call.code() for call in calls))
            details = await asyncio.gather(*(call.details() for call in calls))
        finally:
            await silence.end()
        # Each is refused: unauthenticated, or (past the streams one connection may carry, the
        # client's channels sharing one connection) refused by HTTP/2 before any handler runs.
        refused = {(UNAUTH, ""), (grpc.StatusCode.UNAVAILABLE, "REFUSED_STREAM")}
        outcomes = {(c, "REFUSED_STREAM" if "error code 7" in d else "") for c, d in zip(codes, details, strict=True)}
        assert outcomes <= refused, outcomes
        assert (UNAUTH, "") in outcomes
        # Meanwhile, and after, the real client's calls are served.
        assert await gw.exec(VICTIM, ["echo", "REAL"]) == (0, b"REAL\n", b"")
    finally:
        for channel in channels:
            with contextlib.suppress(Exception):
                await channel.close(grace=None)


async def test_the_http_side_is_loopback_and_tells_no_secrets(gw: RunningGateway) -> None:
    await _victim(gw)
    assert gw.gateway.config.http_host == "127.0.0.1"
    async with ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{gw.gateway.http_port}/metrics") as response:
            body = await response.text()
        assert response.status == 200
        for path in ("/", "/debug", "/admin", "/metrics/../api-token", "/api-token"):
            async with http.get(f"http://127.0.0.1:{gw.gateway.http_port}{path}") as other:
                assert other.status == 404, path
    record = await gw.get(VICTIM)
    for secret in (gw.token, record.id, record.status.instance_id, str(gw.gateway.paths.root)):
        assert secret not in body, secret


def _closed_by_gateway(conn: socket.socket, within: float) -> tuple[bool, set[int]]:
    """Read HTTP/2 frames until the gateway closes `conn` (True) or `within` seconds pass;
    with the frame types seen (4 SETTINGS, 6 PING, 7 GOAWAY, 8 WINDOW_UPDATE)."""
    conn.settimeout(within)
    buffer, types = b"", set[int]()
    try:
        while chunk := conn.recv(4096):
            buffer += chunk
            while len(buffer) >= 9 and len(buffer) >= 9 + int.from_bytes(buffer[:3], "big"):
                types.add(buffer[3])
                buffer = buffer[9 + int.from_bytes(buffer[:3], "big") :]
    except (TimeoutError, ConnectionResetError):
        return False, types
    return True, types


async def test_idle_connections_without_a_credential_cannot_lock_clients_out(tmp_path: Path) -> None:
    # An unauthenticated network peer opens more TCP connections than the server accepts and
    # sends nothing on them. The Unix socket (the CLI, local SDKs) stays served; on TCP, each of
    # them is closed once its handshake timeout passes (gRPC's default was 120 s, during which
    # TCP clients were locked out: the finding), and then TCP clients are served again while
    # the peer still holds its ends open.
    handshake = 1.0
    async with running_gateway(
        tmp_path / "state", listen_tcp="127.0.0.1:0", max_connections=16, handshake_timeout_seconds=handshake
    ) as gw:
        held = [socket.create_connection(("127.0.0.1", gw.gateway.tcp_port)) for _ in range(64)]
        try:
            await asyncio.sleep(0.5)
            listed = await gw.stub.ListSandboxes(pb.ListSandboxesRequest(), metadata=gw.metadata, timeout=10)
            assert list(listed.sandboxes) == []
            closed = await asyncio.gather(*(asyncio.to_thread(_closed_by_gateway, c, handshake + 10) for c in held))
            assert all(was_closed for was_closed, _ in closed)
            options = [("grpc.use_local_subchannel_pool", 1)]
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.gateway.tcp_port}", options=options) as channel:
                stub = sandbox_pb2_grpc.SandboxServiceStub(channel)
                code, _ = await _refusal(stub.ListSandboxes(pb.ListSandboxesRequest(), metadata=gw.metadata, timeout=9))
            assert code == grpc.StatusCode.OK
        finally:
            for conn in held:
                conn.close()


async def test_a_connection_that_completes_its_handshake_and_makes_no_call_is_closed(tmp_path: Path) -> None:
    # The next step of the same flood: speak just enough HTTP/2 (the preface and SETTINGS) to
    # pass the handshake, then stay silent. Without an idle bound such a connection kept its
    # accept slot for good; now it gets GOAWAY and is closed.
    async with running_gateway(
        tmp_path / "state", listen_tcp="127.0.0.1:0", max_connections=16, connection_idle_seconds=1.0
    ) as gw:
        conn = socket.create_connection(("127.0.0.1", gw.gateway.tcp_port))
        try:
            conn.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
            was_closed, frames = await asyncio.to_thread(_closed_by_gateway, conn, 15)
            assert was_closed
            assert {4, 7} <= frames  # its SETTINGS came (the handshake passed), then GOAWAY
        finally:
            conn.close()
