"""Leaving a `run_stream` loop stops the command and its process group, on both clients and
both of the sync client's transports: `break`, closing the generator, or an exception in the
loop body (issue 33), within `STREAM_STOP_BOUND_SECONDS`. The command leaves two background
children in its process group, so killing the command alone would not pass."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

import pytest

import warmshell
from tests.helpers.cli import CliGateway
from warmshell.sdk.client import STREAM_STOP_BOUND_SECONDS

# The shell's pid is its process group (the sandbox starts each command in a group of its own).
_COMMAND = ["sh", "-c", "sleep 300 & sleep 300 & echo $$; wait"]


def _group_probe(group: int) -> list[str]:
    return ["sh", "-c", f"cat /proc/[0-9]*/stat 2>/dev/null | awk '$5 == {group}' | wc -l"]


class _Left(Exception):
    """Raised in a loop body to leave it."""


def _leave_by_break(sb: warmshell.Sandbox) -> int:
    for event in sb.run_stream(_COMMAND):
        return int(event.stdout)
    raise AssertionError("no output")


def _leave_by_close(sb: warmshell.Sandbox) -> int:
    with contextlib.closing(sb.run_stream(_COMMAND)) as stream:
        return int(next(stream).stdout)


def _leave_by_exception(sb: warmshell.Sandbox) -> int:
    group = 0
    try:
        for event in sb.run_stream(_COMMAND):
            group = int(event.stdout)
            raise _Left
    except _Left:
        pass
    return group


def _assert_group_ends(sb: warmshell.Sandbox, group: int) -> None:
    started = time.monotonic()
    while (left := int(sb.run(_group_probe(group)).stdout)) != 0:
        elapsed = time.monotonic() - started
        assert elapsed < STREAM_STOP_BOUND_SECONDS, f"{left} processes still run {elapsed:.2f} s after leaving"
        time.sleep(0.02)


@pytest.mark.parametrize("leave", [_leave_by_break, _leave_by_close, _leave_by_exception])
def test_leaving_a_sync_stream_stops_the_command_and_its_group(
    client: warmshell.Client, leave: Callable[[warmshell.Sandbox], int]
) -> None:
    with client.create() as sb:
        for _ in range(5):  # the gateway once missed one cancel in four: repeat to catch a race
            _assert_group_ends(sb, leave(sb))


def test_the_probe_sees_a_running_group(client: warmshell.Client) -> None:
    """The check above cannot pass for a command that never ran: while the stream is open, the
    probe counts the shell and its two children."""
    with client.create() as sb, contextlib.closing(sb.run_stream(_COMMAND)) as stream:
        assert int(sb.run(_group_probe(int(next(stream).stdout))).stdout) == 3


@pytest.fixture
async def aclient(gateway: CliGateway) -> AsyncIterator[warmshell.AsyncClient]:
    async with warmshell.AsyncClient(state_dir=gateway.state_dir) as client:
        yield client


async def _assert_group_ends_async(sb: warmshell.AsyncSandbox, group: int) -> None:
    started = time.monotonic()
    while (left := int((await sb.run(_group_probe(group))).stdout)) != 0:
        elapsed = time.monotonic() - started
        assert elapsed < STREAM_STOP_BOUND_SECONDS, f"{left} processes still run {elapsed:.2f} s after leaving"
        await asyncio.sleep(0.02)


async def test_leaving_an_async_stream_stops_the_command_and_its_group(aclient: warmshell.AsyncClient) -> None:
    async with await aclient.create() as sb:
        for _ in range(3):
            # `break` alone: the generator is closed when collected, which asyncio does at once.
            async for event in sb.run_stream(_COMMAND):
                group = int(event.stdout)
                break
            await _assert_group_ends_async(sb, group)

            async with contextlib.aclosing(sb.run_stream(_COMMAND)) as stream:
                async for event in stream:
                    group = int(event.stdout)
                    break
            await _assert_group_ends_async(sb, group)

            try:
                async for event in sb.run_stream(_COMMAND):
                    group = int(event.stdout)
                    raise _Left
            except _Left:
                pass
            await _assert_group_ends_async(sb, group)

            # Streamed stdin takes the other call (ExecSandboxStream).
            streamed = sb.run_stream(_COMMAND, stdin=iter([b""]))
            group = int((await anext(streamed)).stdout)
            await streamed.aclose()
            await _assert_group_ends_async(sb, group)
