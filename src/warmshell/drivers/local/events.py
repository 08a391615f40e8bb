"""Fan-out of driver events to every `watch()` caller, until the driver closes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from warmshell.drivers.base import DriverEvent

__all__ = ["EventHub"]


class EventHub:
    """Each watcher gets its own unbounded queue: a slow watcher never blocks the driver."""

    def __init__(self) -> None:
        self._queues: set[asyncio.Queue[DriverEvent | None]] = set()
        self._closed = False

    def publish(self, event: DriverEvent) -> None:
        """Deliver to every current watcher."""
        for queue in self._queues:
            queue.put_nowait(event)

    def close(self) -> None:
        """End every watch."""
        self._closed = True
        for queue in self._queues:
            queue.put_nowait(None)

    def watch(self) -> AsyncIterator[DriverEvent]:
        """Events published from this call on (not from the first iteration), until `close()`."""
        queue: asyncio.Queue[DriverEvent | None] = asyncio.Queue()
        if self._closed:
            queue.put_nowait(None)
        else:
            self._queues.add(queue)
        return self._drain(queue)

    async def _drain(self, queue: asyncio.Queue[DriverEvent | None]) -> AsyncIterator[DriverEvent]:
        try:
            while (event := await queue.get()) is not None:
                yield event
        finally:
            self._queues.discard(queue)
