"""Waiting helpers for local-driver tests: conditions with deadlines, never bare sleeps."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from warmshell.drivers.base import DriverEvent


async def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll `predicate` until it holds; fail after `timeout` seconds."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.005)


async def read_when_present(path: Path, timeout: float = 10.0) -> str:
    """The content of a file once it exists (writers rename it into place when complete)."""
    await wait_until(path.exists, timeout)
    return path.read_text()


async def next_event(
    events: AsyncIterator[DriverEvent],
    predicate: Callable[[DriverEvent], bool],
    timeout: float = 10.0,
) -> DriverEvent:
    """The first event matching `predicate`."""
    async with asyncio.timeout(timeout):
        async for event in events:
            if predicate(event):
                return event
    raise AssertionError("the watch ended before the expected event")
