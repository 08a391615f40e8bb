"""Waiting on the driver's watch for a condition (no sleeps, bounded by a deadline)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from warmshell.drivers.base import DriverEvent


async def next_event(
    events: AsyncIterator[DriverEvent], predicate: Callable[[DriverEvent], bool], timeout: float = 20.0
) -> DriverEvent:
    """The first event from `events` that satisfies `predicate`."""
    async with asyncio.timeout(timeout):
        async for event in events:
            if predicate(event):
                return event
    raise AssertionError("the watch ended before the condition held")
