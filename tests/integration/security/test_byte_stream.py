"""Attacks on the byte stream (a file's bytes over a plain socket, admitted by a one-time ticket
from `OpenFileTransfer`), on a real gateway with real local sandboxes.

The stream has no bearer token: the ticket is the credential. Each attempt here is one a client
(or anyone who can reach the socket) could make: replay, reuse for another direction, expiry,
forgery, more or fewer bytes than the ticket names, links and `..` in the target, silent and
numerous connections, and a ticket whose sandbox was deleted. Nothing half-written may remain
after a refused upload, and no connection, task or fd may outlive its bound."""

from __future__ import annotations

import asyncio
import io
import os
import secrets
import shutil
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from tests.helpers.gateway import RunningGateway, running_gateway
from tests.integration.drivers_local.support import needs_bwrap
from tests.integration.security.support import sandbox, sh
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.api.v1 import sandbox_pb2_grpc
from warmshell.core.transfers import FRAME_HEADER_BYTES, PREFACE, TICKET_BYTES, Status, parse_status

pytestmark = [needs_bwrap, pytest.mark.skipif(shutil.which("python3") is None, reason="no python3 in /usr")]

NAME = "bytes"
OTHER = "bytes-other"
UP, DOWN = pb.TRANSFER_DIRECTION_UPLOAD, pb.TRANSFER_DIRECTION_DOWNLOAD
UP_ARCHIVE, DOWN_ARCHIVE = pb.TRANSFER_DIRECTION_UPLOAD_ARCHIVE, pb.TRANSFER_DIRECTION_DOWNLOAD_ARCHIVE
IDLE = 1.0
TICKET_TTL = 2.0
MAX_CONNECTIONS = 8


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[RunningGateway]:
    overrides = {
        "files.transfer_idle_seconds": IDLE,
        "files.transfer_ticket_seconds": TICKET_TTL,
        "files.transfer_max_connections": MAX_CONNECTIONS,
    }
    async with running_gateway(tmp_path / "state", **overrides) as running:
        await sandbox(running, NAME)
        yield running


async def ticket(
    gw: RunningGateway, path: str, direction: pb.TransferDirection.ValueType, size: int = 0, name: str = NAME
) -> bytes:
    stub = sandbox_pb2_grpc.FileServiceStub(gw.channel)
    request = pb.FileTransferRequest(file=pb.FileRef(name=name, path=path), direction=direction, size=size)
    reply = await stub.OpenFileTransfer(request, metadata=gw.metadata)
    assert len(reply.ticket) == TICKET_BYTES, reply
    assert reply.unix_socket == "files.sock", reply
    return bytes(reply.ticket)


async def connect(gw: RunningGateway) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_unix_connection(str(gw.gateway.paths.transfer_socket))


async def status_of(reader: asyncio.StreamReader) -> Status:
    async with asyncio.timeout(10):
        return parse_status(await reader.readline())


async def upload(gw: RunningGateway, hello: bytes, payload: bytes) -> Status:
    reader, writer = await connect(gw)
    try:
        writer.write(hello + payload)
        await writer.drain()
        writer.write_eof()
        return await status_of(reader)
    finally:
        writer.close()


async def download(gw: RunningGateway, hello: bytes) -> tuple[Status, bytes]:
    reader, writer = await connect(gw)
    try:
        writer.write(hello)
        status = await status_of(reader)
        async with asyncio.timeout(10):
            return status, await reader.read()
    finally:
        writer.close()


async def workspace_listing(gw: RunningGateway) -> str:
    """Every name in /workspace, hidden ones too: a temporary file left behind shows here."""
    return (await sh(gw, NAME, "ls -A /workspace"))[1]


async def test_a_ticket_is_accepted_once(gw: RunningGateway) -> None:
    first = await ticket(gw, "/workspace/once", UP, 5)
    assert await upload(gw, PREFACE + first, b"first") == Status(ok=True, size=5)
    replayed = await upload(gw, PREFACE + first, b"again")
    assert (replayed.ok, replayed.code) == (False, "UNAUTHENTICATED")
    read = await ticket(gw, "/workspace/once", DOWN)
    assert await download(gw, PREFACE + read) == (Status(ok=True, size=5), b"first")
    assert (await download(gw, PREFACE + read))[0].code == "UNAUTHENTICATED"


async def test_a_ticket_moves_only_what_it_names(gw: RunningGateway) -> None:
    await sandbox(gw, OTHER)
    # The stream carries no path or sandbox, only the ticket: an upload ticket for OTHER's
    # file writes that file and nothing in NAME.
    upload_ticket = await ticket(gw, "/workspace/named", UP, 4, name=OTHER)
    assert await upload(gw, PREFACE + upload_ticket, b"mine") == Status(ok=True, size=4)
    assert await workspace_listing(gw) == ""
    assert (await sh(gw, OTHER, "cat /workspace/named"))[1] == "mine"
    # A download ticket used to send bytes: they are ignored, the file is read, not written.
    down = await ticket(gw, "/workspace/named", DOWN, name=OTHER)
    reader, writer = await connect(gw)
    writer.write(PREFACE + down + b"overwrite?")
    assert await status_of(reader) == Status(ok=True, size=4)
    assert await reader.read() == b"mine"
    writer.close()
    assert (await sh(gw, OTHER, "cat /workspace/named"))[1] == "mine"
    # Directions are checked at issue: an unspecified one is refused, naming the field.
    stub = sandbox_pb2_grpc.FileServiceStub(gw.channel)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.OpenFileTransfer(pb.FileTransferRequest(file=pb.FileRef(name=NAME, path="/x")), metadata=gw.metadata)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "direction" in (refused.value.details() or "")


async def test_an_expired_ticket_is_refused(gw: RunningGateway) -> None:
    stale = await ticket(gw, "/workspace/late", UP, 4)
    await asyncio.sleep(TICKET_TTL + 0.2)
    refused = await upload(gw, PREFACE + stale, b"late")
    assert (refused.ok, refused.code) == (False, "UNAUTHENTICATED")
    assert await workspace_listing(gw) == ""


async def test_forged_and_malformed_hellos_are_refused_and_leave_the_real_ticket_usable(gw: RunningGateway) -> None:
    real = await ticket(gw, "/workspace/real", UP, 4)
    flipped = bytes([real[0] ^ 1]) + real[1:]
    for hello in (PREFACE + secrets.token_bytes(TICKET_BYTES), PREFACE + flipped, PREFACE + bytes(TICKET_BYTES)):
        refused = await upload(gw, hello, b"fake")
        assert (refused.ok, refused.code) == (False, "UNAUTHENTICATED"), hello
    # The right ticket behind the wrong preface is not accepted either (and is then spent? no:
    # a hello that is not one never reaches the book).
    wrong_preface = await upload(gw, b"WSX0" + real, b"fake")
    assert wrong_preface.code == "UNAUTHENTICATED"
    # A short hello, then the end: the connection just closes.
    reader, writer = await connect(gw)
    writer.write(PREFACE + real[:10])
    writer.write_eof()
    assert await reader.read() == b""
    writer.close()
    assert await upload(gw, PREFACE + real, b"real") == Status(ok=True, size=4)
    assert await workspace_listing(gw) == "real\n"


async def test_more_or_fewer_bytes_than_the_ticket_names_leave_nothing(gw: RunningGateway) -> None:
    await sh(gw, NAME, "echo kept > /workspace/target")
    more = await ticket(gw, "/workspace/target", UP, 1024)
    refused = await upload(gw, PREFACE + more, os.urandom(1024 + 10))
    assert (refused.ok, refused.code) == (False, "INVALID_ARGUMENT"), refused
    assert "more than the 1024 bytes" in refused.message
    fewer = await ticket(gw, "/workspace/target", UP, 1024 * 1024)
    refused = await upload(gw, PREFACE + fewer, os.urandom(1000))
    assert (refused.ok, refused.code) == (False, "INVALID_ARGUMENT"), refused
    assert "ended after 1000 of 1048576 bytes" in refused.message
    # The old content stands, and no temporary file is left beside it.
    assert (await sh(gw, NAME, "cat /workspace/target"))[1] == "kept\n"
    assert await workspace_listing(gw) == "target\n"
    # A size over the gateway's max_file_bytes gets no ticket at all.
    stub = sandbox_pb2_grpc.FileServiceStub(gw.channel)
    huge = pb.FileTransferRequest(file=pb.FileRef(name=NAME, path="/workspace/huge"), direction=UP, size=2**40)
    with pytest.raises(grpc.aio.AioRpcError) as exhausted:
        await stub.OpenFileTransfer(huge, metadata=gw.metadata)
    assert exhausted.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_links_and_dot_dot_in_the_target_are_refused_as_grpc_refuses_them(
    gw: RunningGateway, tmp_path: Path
) -> None:
    host_file = tmp_path / "host-file"
    host_file.write_bytes(b"HOST")
    await sh(
        gw, NAME, f"ln -s {tmp_path} /workspace/out && ln -s /etc /workspace/etc && ln -s /nowhere /workspace/dangling"
    )
    stub = sandbox_pb2_grpc.FileServiceStub(gw.channel)
    for path in (f"/workspace/out/{host_file.name}", "/workspace/etc/hosts", f"/workspace/../..{host_file}"):
        up = await ticket(gw, path, UP, 4)
        streamed = await upload(gw, PREFACE + up, b"evil")
        call = stub.WriteFile(metadata=gw.metadata)
        await call.write(pb.WriteFileRequest(header=pb.WriteFileHeader(name=NAME, path=path)))
        await call.write(pb.WriteFileRequest(data=b"evil"))
        await call.done_writing()
        try:
            await call
            grpc_code = "OK"
        except grpc.aio.AioRpcError as exc:
            grpc_code = exc.code().name
        assert not streamed.ok, path
        assert streamed.code == grpc_code, (path, streamed, grpc_code)
        # Reads resolve inside the sandbox as ReadFile does (its own /etc/hosts is readable).
        down = await ticket(gw, path, DOWN)
        read_status, content = await download(gw, PREFACE + down)
        try:
            chunks = [c.data async for c in stub.ReadFile(pb.FileRef(name=NAME, path=path), metadata=gw.metadata)]
            expected = ("OK", b"".join(chunks))
        except grpc.aio.AioRpcError as exc:
            expected = (exc.code().name, b"")
        assert (read_status.code or "OK", content) == expected, path
        assert b"HOST" not in content
    assert host_file.read_bytes() == b"HOST"
    # A final symlink is replaced, never written through (as WriteFile does).
    up = await ticket(gw, "/workspace/dangling", UP, 3)
    assert await upload(gw, PREFACE + up, b"new") == Status(ok=True, size=3)
    assert (await sh(gw, NAME, "test -L /workspace/dangling || cat /workspace/dangling; ls /nowhere"))[1] == "new"


async def test_silent_connections_are_closed_and_leave_no_fd_or_task(gw: RunningGateway) -> None:
    stream = gw.gateway.parts.byte_stream
    assert stream is not None
    fds_before = len(os.listdir("/proc/self/fd"))
    # One that never sends its hello; one that sends a valid ticket and half its bytes.
    silent_reader, silent = await connect(gw)
    stalled_ticket = await ticket(gw, "/workspace/stalled", UP, 1024 * 1024)
    stalled_reader, stalled = await connect(gw)
    stalled.write(PREFACE + stalled_ticket + os.urandom(300 * 1024))
    await stalled.drain()
    async with asyncio.timeout(IDLE * 6):
        assert await silent_reader.read() == b""
        refused = await status_of(stalled_reader)
    assert (refused.ok, refused.code) == (False, "DEADLINE_EXCEEDED"), refused
    for writer in (silent, stalled):
        writer.close()
    async with asyncio.timeout(IDLE * 6):
        while stream.connections:
            await asyncio.sleep(0.05)
    assert await workspace_listing(gw) == ""
    assert len(os.listdir("/proc/self/fd")) <= fds_before


async def test_connections_past_the_bound_are_closed_at_accept(gw: RunningGateway) -> None:
    stream = gw.gateway.parts.byte_stream
    assert stream is not None
    opened = [await connect(gw) for _ in range(MAX_CONNECTIONS * 4)]
    await asyncio.sleep(0.2)
    assert stream.connections <= MAX_CONNECTIONS
    # Those past the bound were closed straight away; the others go at the hello timeout.
    async with asyncio.timeout(IDLE * 6):
        ends = [await reader.read() for reader, _ in opened]
    assert ends == [b""] * len(opened)
    for _, writer in opened:
        writer.close()
    async with asyncio.timeout(IDLE * 6):
        while stream.connections:
            await asyncio.sleep(0.05)
    good = await ticket(gw, "/workspace/after", UP, 2)
    assert await upload(gw, PREFACE + good, b"ok") == Status(ok=True, size=2)


async def test_a_ticket_for_a_deleted_sandbox_is_refused(gw: RunningGateway) -> None:
    await sandbox(gw, OTHER)
    orphan = await ticket(gw, "/workspace/x", UP, 1, name=OTHER)
    await gw.delete(OTHER)
    refused = await upload(gw, PREFACE + orphan, b"x")
    assert not refused.ok
    assert refused.code in ("NOT_FOUND", "FAILED_PRECONDITION"), refused


async def test_only_an_api_client_gets_a_ticket(gw: RunningGateway) -> None:
    stub = sandbox_pb2_grpc.FileServiceStub(gw.channel)
    request = pb.FileTransferRequest(file=pb.FileRef(name=NAME, path="/workspace/x"), direction=UP, size=1)
    for metadata in ((), (("authorization", "Bearer not-the-token"),)):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.OpenFileTransfer(request, metadata=metadata)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    missing = pb.FileTransferRequest(file=pb.FileRef(name="nobody", path="/workspace/x"), direction=UP, size=1)
    with pytest.raises(grpc.aio.AioRpcError) as not_found:
        await stub.OpenFileTransfer(missing, metadata=gw.metadata)
    assert not_found.value.code() == grpc.StatusCode.NOT_FOUND


def _tar(*members: tuple[str, bytes | str]) -> bytes:
    """A tar of regular files (bytes) and symbolic links (str: the target)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, content in members:
            info = tarfile.TarInfo(name)
            if isinstance(content, str):
                info.type, info.linkname = tarfile.SYMTYPE, content
                tar.addfile(info)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    return out.getvalue()


async def test_an_archive_over_the_stream_is_refused_where_upload_tar_refuses_it(gw: RunningGateway) -> None:
    stub = sandbox_pb2_grpc.FileServiceStub(gw.channel)
    hostile = {
        "dot-dot": _tar(("../escape", b"x")),
        "absolute": _tar(("/etc/evil", b"x")),
        "through a link": _tar(("out", "/"), ("out/etc/evil", b"x")),
    }
    for name, archive in hostile.items():
        up = await ticket(gw, f"/workspace/{name}", UP_ARCHIVE, len(archive))
        streamed = await upload(gw, PREFACE + up, archive)

        async def requests(archive: bytes = archive, name: str = name) -> AsyncIterator[pb.UploadTarRequest]:
            yield pb.UploadTarRequest(header=pb.UploadTarHeader(name=NAME, path=f"/workspace/grpc-{name}"))
            yield pb.UploadTarRequest(data=archive)

        try:
            await stub.UploadTar(requests(), metadata=gw.metadata)
            grpc_code = "OK"
        except grpc.aio.AioRpcError as exc:
            grpc_code = exc.code().name
        assert not streamed.ok, name
        assert streamed.code == grpc_code == "INVALID_ARGUMENT", (name, streamed)
    assert (await sh(gw, NAME, "ls /etc/evil /escape 2>&1; true"))[1].count("No such file") == 2
    # A tar longer than its ticket says is refused too.
    archive = _tar(("a", b"content"))
    short = await ticket(gw, "/workspace/short", UP_ARCHIVE, len(archive) - 512)
    refused = await upload(gw, PREFACE + short, archive)
    assert (refused.ok, refused.code) == (False, "INVALID_ARGUMENT"), refused


async def test_an_archive_download_sends_links_as_links_and_refusals_after_the_end_frame(
    gw: RunningGateway, tmp_path: Path
) -> None:
    (tmp_path / "secret").write_bytes(b"HOST SECRET")
    await sh(
        gw, NAME, f"mkdir -p /workspace/d && echo inside > /workspace/d/f && ln -s {tmp_path}/secret /workspace/d/l"
    )
    down = await ticket(gw, "/workspace/d", DOWN_ARCHIVE)
    reader, writer = await connect(gw)
    writer.write(PREFACE + down)
    body = bytearray()
    while length := int.from_bytes(await reader.readexactly(FRAME_HEADER_BYTES), "big"):
        body += await reader.readexactly(length)
    assert await status_of(reader) == Status(ok=True, size=len(body))
    writer.close()
    with tarfile.open(fileobj=io.BytesIO(bytes(body))) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert members["l"].issym()
        assert members["l"].linkname == f"{tmp_path}/secret"
        assert tar.extractfile("f").read() == b"inside\n"  # type: ignore[union-attr]
    assert b"HOST SECRET" not in body
    missing = await ticket(gw, "/workspace/none", DOWN_ARCHIVE)
    reader, writer = await connect(gw)
    writer.write(PREFACE + missing)
    assert await reader.readexactly(FRAME_HEADER_BYTES) == bytes(FRAME_HEADER_BYTES)
    refused = await status_of(reader)
    writer.close()
    assert (refused.ok, refused.code) == (False, "NOT_FOUND"), refused


async def test_a_transfer_cut_by_the_gateways_stop_leaves_nothing(gw: RunningGateway) -> None:
    stream = gw.gateway.parts.byte_stream
    assert stream is not None
    await sh(gw, NAME, "echo kept > /workspace/target")
    cut = await ticket(gw, "/workspace/target", UP, 4 * 1024 * 1024)
    reader, writer = await connect(gw)
    writer.write(PREFACE + cut + os.urandom(1024 * 1024))
    await writer.drain()
    async with asyncio.timeout(5):
        while not stream.connections:
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)  # the thread is splicing, then waits for the rest
    await stream.aclose()  # what a gateway stop does with the transfers in flight
    assert stream.connections == 0
    async with asyncio.timeout(5):
        assert await reader.read() == b""  # closed, no status: the gateway is going away
    writer.close()
    assert (await sh(gw, NAME, "cat /workspace/target"))[1] == "kept\n"
    assert await workspace_listing(gw) == "target\n"
