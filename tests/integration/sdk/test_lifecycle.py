"""Handles a harness holds on to, against a real gateway: `async with client.create(...)` without
`await`, awaitable `AsyncProcess.close()`, `Process.wait(timeout=)`, `get_or_create` on both
clients (issue 33)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

import warmshell
from tests.helpers.cli import CliGateway
from warmshell.sdk.client import STREAM_STOP_BOUND_SECONDS


@pytest.fixture
async def aclient(gateway: CliGateway) -> AsyncIterator[warmshell.AsyncClient]:
    async with warmshell.AsyncClient(state_dir=gateway.state_dir) as client:
        yield client


async def test_async_with_create_needs_no_await_and_deletes_at_the_end(aclient: warmshell.AsyncClient) -> None:
    async with aclient.create(name="ctx-box") as sb:
        assert sb.last_info.phase is warmshell.Phase.READY
        assert (await sb.run(["echo", "in"])).stdout == b"in\n"
    with pytest.raises(warmshell.NotFound):
        await aclient.get("ctx-box")
    # Awaiting it is still the way to a handle that outlives a block.
    sb = await aclient.create(name="awaited-box")
    try:
        assert (await aclient.get("awaited-box")).id == sb.id
    finally:
        assert await sb.delete() is True


async def test_async_process_close_is_awaited_and_stops_the_group(aclient: warmshell.AsyncClient) -> None:
    async with aclient.create() as sb:
        process = await sb.start(["sh", "-c", "sleep 300 & echo $$; wait"])
        event = await process.recv()
        assert event is not None
        group = int(event.stdout)
        await process.close()
        probe = ["sh", "-c", f"cat /proc/[0-9]*/stat 2>/dev/null | awk '$5 == {group}' | wc -l"]
        started = time.monotonic()
        while int((await sb.run(probe)).stdout) != 0:
            assert time.monotonic() - started < STREAM_STOP_BOUND_SECONDS
            await asyncio.sleep(0.02)
        # A timed-out wait leaves the command running; the next wait goes on where it left.
        waiting = await sb.start(["sh", "-c", "read line; exit 4"])
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await waiting.wait()
        await waiting.send("go\n")
        assert await waiting.wait() == 4
        await waiting.close()


def test_process_wait_with_a_timeout(client: warmshell.Client) -> None:
    with client.create() as sb, sb.start(["sh", "-c", "echo ready; read line; echo got $line; exit 4"]) as process:
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="still runs"):
            process.wait(timeout=0.3)
        assert 0.3 <= time.monotonic() - started < 5
        assert process.exit_code is None
        process.send("go\n")
        assert process.wait(timeout=30) == 4
        assert process.wait(timeout=0) == 4  # already exited: no waiting, the same code


def test_get_or_create_returns_the_matching_sandbox_and_names_what_differs(client: warmshell.Client) -> None:
    first = client.get_or_create(
        "goc-box", env={"A": "1"}, cpu="0.5", labels={"team": "a"}, ttl_seconds=600, secrets={"KEY": "v1"}
    )
    try:
        assert first.last_info.phase is warmshell.Phase.READY
        # The same spec, a quantity written another way, a secret's value unseen: the same sandbox.
        again = client.get_or_create("goc-box", env={"A": "1"}, cpu="500m", secrets={"KEY": "v2"}, ttl_seconds=600)
        assert again.id == first.id
        assert client.get_or_create("goc-box").id == first.id  # nothing given: nothing to differ
        with pytest.raises(warmshell.Conflict) as conflict:
            client.get_or_create("goc-box", env={"A": "2"}, cpu="1", labels={"team": "a"})
        assert "different env, cpu" in str(conflict.value)
        assert client.get("goc-box").id == first.id  # left as it was
    finally:
        first.delete()


async def test_get_or_create_on_the_async_client(aclient: warmshell.AsyncClient) -> None:
    first = await aclient.get_or_create("agoc-box", command=["sleep", "300"], memory="64Mi")
    try:
        assert (await aclient.get_or_create("agoc-box", memory="67108864")).id == first.id
        with pytest.raises(warmshell.Conflict, match="different command"):
            await aclient.get_or_create("agoc-box", command=["sleep", "301"])
    finally:
        await first.delete()
