"""A wide fan-out on one client against a real gateway (issue 33): 500 calls at once, past the
gateway's 128 streams per connection, all succeed, from one AsyncClient's tasks and from threads
sharing one Client (both transports); the calls beyond the client's limit wait for a stream
(`warmshell.sdk.queueing`) instead of being refused."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

import pytest

import warmshell
from tests.helpers.cli import CliGateway

CALLS = 500


@pytest.fixture
async def aclient(gateway: CliGateway) -> AsyncIterator[warmshell.AsyncClient]:
    async with warmshell.AsyncClient(state_dir=gateway.state_dir) as client:
        yield client


async def test_500_file_writes_and_500_reads_at_once_on_one_client(aclient: warmshell.AsyncClient) -> None:
    async with aclient.create() as sb:
        await sb.files.mkdir("/workspace/fan")
        written = await asyncio.gather(*(sb.files.write(f"/workspace/fan/{i}", str(i)) for i in range(CALLS)))
        assert written == [len(str(i)) for i in range(CALLS)]
        assert aclient._slots is not None
        assert aclient._slots.in_use == 0  # every slot given back
        read = await asyncio.gather(*(sb.files.read(f"/workspace/fan/{i}") for i in range(CALLS)))
        assert read == [str(i).encode() for i in range(CALLS)]
        infos = await asyncio.gather(*(sb.info() for _ in range(CALLS)))
        assert {info.id for info in infos} == {sb.id}
        assert len(await sb.files.list("/workspace/fan")) == CALLS


def test_500_threads_on_one_sync_client(client: warmshell.Client) -> None:
    with client.create() as sb, ThreadPoolExecutor(CALLS) as pool:
        sb.files.mkdir("/workspace/fan")
        written = list(pool.map(lambda i: sb.files.write(f"/workspace/fan/{i}", str(i)), range(CALLS)))
        assert written == [len(str(i)) for i in range(CALLS)]
        assert {info.id for info in pool.map(lambda _: sb.info(), range(CALLS))} == {sb.id}
