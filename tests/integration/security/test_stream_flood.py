"""More concurrent calls on one connection than the gateway allows (its HTTP/2
MAX_CONCURRENT_STREAMS) are refused by the server with RST_STREAM REFUSED_STREAM, which grpcio
passes on as a raw "Received RST_STREAM with error code 7". The SDK queues its own calls below the
limit, so a fan-out on one client is never refused; and where a refusal reaches it anyway (a
limit lower than it assumed), it says what happened: an `Unavailable` that the call was refused and
not started, so it is safe to retry."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

import warmshell
from tests.helpers.gateway import RunningGateway, running_gateway
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.api.v1 import sandbox_pb2_grpc
from warmshell.gateway import listening
from warmshell.sdk import errors

CALLS = 3 * listening.MAX_STREAMS_PER_CONNECTION


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[RunningGateway]:
    async with running_gateway(tmp_path / "state", listen_tcp="127.0.0.1:0") as running:
        yield running


async def test_a_raw_burst_past_the_stream_limit_is_refused_and_the_sdk_says_safe_to_retry(
    gw: RunningGateway,
) -> None:
    address = f"127.0.0.1:{gw.gateway.tcp_port}"
    metadata = (("authorization", f"Bearer {gw.token}"),)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = sandbox_pb2_grpc.SandboxServiceStub(channel)
        await stub.ListSandboxes(pb.ListSandboxesRequest(), metadata=metadata)  # the server's SETTINGS known
        answers = await asyncio.gather(
            *(stub.ListSandboxes(pb.ListSandboxesRequest(), metadata=metadata) for _ in range(CALLS)),
            return_exceptions=True,
        )
    refused = [a for a in answers if isinstance(a, grpc.aio.AioRpcError)]
    # grpcio does not queue what the server will not take: the attack reproduces on a raw channel.
    assert refused, "no call was refused: the attack no longer reproduces"
    for failure in refused:
        assert "RST_STREAM" in (failure.details() or ""), failure
        said = errors.error_for(failure.code().name, failure.details() or "", address=address)
        assert isinstance(said, warmshell.Unavailable), repr(said)
        assert "refused the call" in said.details, said
        assert "safe to retry" in said.details, said
        assert "RST_STREAM" not in str(said)
        assert "warmshell gateway start" not in str(said)  # it is running


async def test_the_same_burst_through_one_sdk_client_is_never_refused(gw: RunningGateway) -> None:
    async with warmshell.AsyncClient(f"127.0.0.1:{gw.gateway.tcp_port}", gw.token) as client:
        answers = await asyncio.gather(*(client.list() for _ in range(CALLS)), return_exceptions=True)
    assert [a for a in answers if isinstance(a, BaseException)] == []
