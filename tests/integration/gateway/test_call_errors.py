"""Over real gRPC: a gateway bug reaches the client as INTERNAL with a plain message (not UNKNOWN
with a class name), and a request message over `max_request_bytes` — an exec, a file write chunk
— is RESOURCE_EXHAUSTED naming the limit, never INTERNAL."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from tests.helpers.gateway import running_gateway
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.api.v1 import sandbox_pb2_grpc
from warmshell.gateway.calls import INTERNAL_MESSAGE

LIMIT = 64 * 1024
SECRET = "sk-never-in-a-status"


async def test_an_unexpected_exception_is_internal_and_logged_without_its_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="warmshell.gateway.calls")
    async with running_gateway(tmp_path / "state") as gw:

        def broken() -> dict[str, int]:
            raise ValueError(f"bad value {SECRET}")

        with monkeypatch.context() as patch:  # undone before the gateway's own loops could call it
            patch.setattr(gw.gateway.parts.manager, "miss_counts", broken)
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await gw.stub.ListPools(pb.ListPoolsRequest(), metadata=gw.metadata)
        assert failed.value.code() == grpc.StatusCode.INTERNAL
        assert failed.value.details() == INTERNAL_MESSAGE
        # The gateway serves on after it.
        assert (await gw.stub.ListSandboxes(pb.ListSandboxesRequest(), metadata=gw.metadata)).sandboxes == []
    assert "ListPools" in caplog.text
    assert "ValueError" in caplog.text
    assert SECRET not in caplog.text


async def test_messages_over_the_request_limit_are_resource_exhausted_naming_it(tmp_path: Path) -> None:
    async with running_gateway(tmp_path / "state", max_request_bytes=LIMIT) as gw:
        await gw.create(name="big")
        assert (await gw.wait_ready("big")).status.phase == pb.SANDBOX_PHASE_READY
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await gw.exec("big", ["echo", "x" * (2 * LIMIT)])
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert str(LIMIT) in (refused.value.details() or "")

        files = sandbox_pb2_grpc.FileServiceStub(gw.channel)

        async def write() -> AsyncIterator[pb.WriteFileRequest]:
            yield pb.WriteFileRequest(header=pb.WriteFileHeader(name="big", path="/workspace/f"))
            yield pb.WriteFileRequest(data=b"small")
            yield pb.WriteFileRequest(data=b"x" * (2 * LIMIT))

        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await files.WriteFile(write(), metadata=gw.metadata)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert str(LIMIT) in (refused.value.details() or "")
        # A chunk within the limit still writes.

        async def small() -> AsyncIterator[pb.WriteFileRequest]:
            yield pb.WriteFileRequest(header=pb.WriteFileHeader(name="big", path="/workspace/f"))
            yield pb.WriteFileRequest(data=b"y" * (LIMIT // 2))

        assert (await files.WriteFile(small(), metadata=gw.metadata)).bytes_written == LIMIT // 2
