"""Messages waiting to go up the current supervisor session.

A gRPC call's request iterator can outlive its call (grpc.aio keeps consuming it in a task of its
own), so a plain shared queue would let the previous session's iterator steal the first message
queued after a reconnect — an exec's output or exit would be lost. Each reader therefore takes
messages only while its session is still the current one.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator

from warmshell.api.v1 import supervisor_pb2 as spb

__all__ = ["Outbox"]


class Outbox:
    """A FIFO of supervisor messages, read by at most one live session at a time."""

    def __init__(self) -> None:
        self._items: deque[spb.SupervisorMessage] = deque()
        self._changed = asyncio.Event()
        self._generation = 0

    def put(self, message: spb.SupervisorMessage) -> None:
        """Queue a message for whichever session is current (now or after a reconnect)."""
        self._items.append(message)
        self._changed.set()

    def new_session(self) -> int:
        """Start a session; readers of older sessions stop without taking anything."""
        self._generation += 1
        self._changed.set()
        return self._generation

    async def stream(self, generation: int, first: spb.SupervisorMessage) -> AsyncIterator[spb.SupervisorMessage]:
        """`first`, then queued messages for as long as `generation` is the current session."""
        yield first
        while True:
            while not self._items:
                if generation != self._generation:
                    return
                self._changed.clear()
                await self._changed.wait()
            if generation != self._generation:
                return
            yield self._items.popleft()
