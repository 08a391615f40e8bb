"""The SDK's file transfers over the gateway's byte stream (one-time ticket, plain socket), both
clients, through a real gateway with a real local sandbox: large files go over it, small ones and
gateways that do not offer it stay on gRPC, and a stream that cannot be reached falls back to gRPC.
The gateway runs in this process so that the test can count what its byte stream carried."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

import warmshell
from tests.helpers.gateway import RunningGateway, running_gateway
from tests.integration.security.support import sandbox
from warmshell.core.transfers import INLINE_MAX_BYTES
from warmshell.gateway.bytestream import ByteStream
from warmshell.sdk.transfers import TRANSFER_MIN_BYTES

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is required")

NAME = "stream"
BIG = os.urandom(3 * 1024 * 1024 + 7)


def _stream(gw: RunningGateway) -> ByteStream:
    stream = gw.gateway.parts.byte_stream
    assert stream is not None
    return stream


async def _settled(stream: ByteStream) -> int:
    """What the stream carried, once its connections have ended (a download's is counted after
    its client has read the last byte)."""
    async with asyncio.timeout(10):
        while stream.connections:
            await asyncio.sleep(0.01)
    return stream.completed


async def _round_trip_async(client: warmshell.AsyncClient, tmp_path: Path) -> None:
    sb = await client.get(NAME)
    assert await sb.files.write("/workspace/big", BIG) == len(BIG)
    assert await sb.files.read("/workspace/big") == BIG
    local = tmp_path / "up.bin"
    local.write_bytes(BIG[::-1])
    assert await sb.files.upload(local, "/workspace/up.bin", mode=0o600) == len(BIG)
    assert await sb.files.download("/workspace/up.bin", tmp_path / "back.bin") == len(BIG)
    assert (tmp_path / "back.bin").read_bytes() == BIG[::-1]
    assert (await sb.files.stat("/workspace/up.bin")).mode == 0o600
    with pytest.raises(warmshell.NotFound, match="/workspace/nope: no such file"):
        await sb.files.read("/workspace/nope")
    with pytest.raises(warmshell.PermissionDenied, match="read-only"):
        await sb.files.write("/usr/planted", BIG)


def _round_trip_sync(gw: RunningGateway, tmp_path: Path) -> None:
    with warmshell.Client(state_dir=gw.gateway.config.state_dir) as client:
        files = client.files(NAME)
        assert files.write("/workspace/sync", BIG) == len(BIG)
        assert files.read("/workspace/sync") == BIG
        local = tmp_path / "sync-up.bin"
        local.write_bytes(BIG[1:])
        assert files.upload(local, "/workspace/sync-up") == len(BIG) - 1
        assert files.download("/workspace/sync-up", tmp_path / "sync-back") == len(BIG) - 1
        assert (tmp_path / "sync-back").read_bytes() == BIG[1:]
        with pytest.raises(warmshell.NotFound):
            files.read("/workspace/nope")


async def test_both_clients_move_large_files_over_the_byte_stream(tmp_path: Path) -> None:
    async with running_gateway(tmp_path / "state") as gw:
        await sandbox(gw, NAME)
        stream = _stream(gw)
        async with warmshell.AsyncClient(state_dir=tmp_path / "state") as client:
            await _round_trip_async(client, tmp_path)
            assert await _settled(stream) == 4  # two writes, two reads (the refused ones do not count)
            sb = await client.get(NAME)
            small = b"x" * (TRANSFER_MIN_BYTES - 1)
            assert await sb.files.write("/workspace/small", small) == len(small)
            assert await _settled(stream) == 4  # below the threshold: gRPC
        await asyncio.to_thread(_round_trip_sync, gw, tmp_path)
        assert await _settled(stream) == 8


async def test_over_tcp_the_ticket_names_a_port_on_the_gateways_host(tmp_path: Path) -> None:
    async with running_gateway(tmp_path / "state", listen_tcp="127.0.0.1:0") as gw:
        await sandbox(gw, NAME)
        stream = _stream(gw)
        assert stream.tcp_port
        token = gw.token
        async with warmshell.AsyncClient(f"127.0.0.1:{gw.gateway.tcp_port}", token) as client:
            sb = await client.get(NAME)
            await sb.files.write("/workspace/tcp", BIG)
            assert await sb.files.read("/workspace/tcp") == BIG
        assert await _settled(stream) == 2


async def test_without_the_stream_or_out_of_its_reach_transfers_go_over_grpc(tmp_path: Path) -> None:
    async with running_gateway(tmp_path / "off", **{"files.transfer_stream": False}) as gw:
        assert gw.gateway.parts.byte_stream is None
        await sandbox(gw, NAME)
        async with warmshell.AsyncClient(state_dir=tmp_path / "off") as client:
            await _round_trip_async(client, tmp_path)
    async with running_gateway(tmp_path / "state") as gw:
        await sandbox(gw, NAME)
        # A client that reaches the gateway's socket alone (bound elsewhere without files.sock).
        alone = tmp_path / "alone"
        alone.mkdir()
        (alone / "gateway.sock").symlink_to(gw.gateway.paths.socket)
        async with warmshell.AsyncClient(f"unix://{alone / 'gateway.sock'}", gw.token) as client:
            await _round_trip_async(client, tmp_path)
        assert await _settled(_stream(gw)) == 0


async def test_a_small_read_is_one_call_with_both_clients(tmp_path: Path) -> None:
    small = os.urandom(INLINE_MAX_BYTES)
    async with running_gateway(tmp_path / "state") as gw:
        await sandbox(gw, NAME)
        stream = _stream(gw)
        async with warmshell.AsyncClient(state_dir=tmp_path / "state") as client:
            sb = await client.get(NAME)
            await sb.files.write("/workspace/small", small)
            await sb.files.write("/workspace/empty", b"")
            assert await sb.files.read("/workspace/small") == small
            assert [c async for c in sb.files.read_chunks("/workspace/small")] == [small]
            assert await sb.files.read("/workspace/empty") == b""
            assert await sb.files.download("/workspace/small", tmp_path / "small") == len(small)
            with pytest.raises(warmshell.NotFound, match="/workspace/nope: no such file"):
                await sb.files.read("/workspace/nope")
            await sb.files.write("/workspace/larger", small + b"!")
            assert await sb.files.read("/workspace/larger") == small + b"!"
        assert (tmp_path / "small").read_bytes() == small
        assert (await _settled(stream), len(stream.book)) == (1, 0)  # the larger file alone; no ticket left

        def sync_round() -> None:
            with warmshell.Client(state_dir=tmp_path / "state") as sync_client:
                files = sync_client.files(NAME)
                assert files.read("/workspace/small") == small
                assert list(files.read_chunks("/workspace/empty")) == []
                assert files.read("/workspace/larger") == small + b"!"
                with pytest.raises(warmshell.NotFound):
                    files.read("/workspace/nope")

        await asyncio.to_thread(sync_round)
        assert (await _settled(stream), len(stream.book)) == (2, 0)


def _repo(root: Path) -> Path:
    repo = root / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "mod.py").write_text("VALUE = 1\n")
    (repo / "blob.bin").write_bytes(BIG)
    (repo / "link").symlink_to("pkg/mod.py")
    return repo


def _same_tree(a: Path, b: Path) -> None:
    assert (b / "blob.bin").read_bytes() == (a / "blob.bin").read_bytes()
    assert (b / "pkg" / "mod.py").read_text() == "VALUE = 1\n"
    assert os.readlink(b / "link") == "pkg/mod.py"


async def test_bulk_transfers_go_over_the_byte_stream_with_both_clients(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    async with running_gateway(tmp_path / "state") as gw:
        await sandbox(gw, NAME)
        stream = _stream(gw)
        async with warmshell.AsyncClient(state_dir=tmp_path / "state") as client:
            sb = await client.get(NAME)
            summary = await sb.files.upload_dir(repo, "/workspace/repo")
            assert (summary.entries, summary.bytes_written) == (4, len(BIG) + len("VALUE = 1\n"))
            await sb.files.download_dir("/workspace/repo", tmp_path / "back")
            _same_tree(repo, tmp_path / "back")
            assert await _settled(stream) == 2
            # A small archive goes over UploadTar (below the threshold); a download always streams.
            await sb.files.write_files({"/workspace/small/a": b"a"})
            assert await _settled(stream) == 2
            with pytest.raises(warmshell.NotFound):
                await sb.files.download_dir("/workspace/none", tmp_path / "none")

        def sync_round() -> None:
            with warmshell.Client(state_dir=tmp_path / "state") as sync_client:
                files = sync_client.files(NAME)
                assert files.upload_dir(repo, "/workspace/sync-repo").entries == 4
                files.download_dir("/workspace/sync-repo", tmp_path / "sync-back")
                _same_tree(repo, tmp_path / "sync-back")

        await asyncio.to_thread(sync_round)
        assert await _settled(stream) == 4
