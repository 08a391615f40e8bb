"""Fan-out of driver events to every open `watch()`, shared by the drivers: each subscriber gets
its own queue, so a slow consumer never holds up the driver (the gateway has one consumer)."""

from __future__ import annotations

import asyncio

from warmshell.drivers.base import DriverEvent

__all__ = ["Hub", "Subscription"]


class Hub:
    """Publish to all current subscribers; `close()` ends every subscription."""

    def __init__(self) -> None:
        self._queues: set[asyncio.Queue[DriverEvent | None]] = set()
        self._closed = False

    def publish(self, event: DriverEvent) -> None:
        """Deliver to every subscriber (never blocks)."""
        for queue in self._queues:
            queue.put_nowait(event)

    def close(self) -> None:
        """End every subscription; later subscriptions end at once."""
        self._closed = True
        for queue in self._queues:
            queue.put_nowait(None)

    def subscribe(self) -> Subscription:
        """Events published from this call on (not from the first iteration), until `close()`."""
        queue: asyncio.Queue[DriverEvent | None] = asyncio.Queue()
        if self._closed:
            queue.put_nowait(None)
        else:
            self._queues.add(queue)
        return Subscription(self._queues, queue)


class Subscription:
    """One subscriber's events; `aclose()` unsubscribes even if it was never iterated."""

    def __init__(self, queues: set[asyncio.Queue[DriverEvent | None]], queue: asyncio.Queue[DriverEvent | None]):
        self._queues = queues
        self._queue: asyncio.Queue[DriverEvent | None] | None = queue

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> DriverEvent:
        if self._queue is None:
            raise StopAsyncIteration
        event = await self._queue.get()
        if event is None:
            await self.aclose()
            raise StopAsyncIteration
        return event

    async def aclose(self) -> None:
        """Stop receiving events."""
        if self._queue is not None:
            self._queues.discard(self._queue)
            self._queue = None
