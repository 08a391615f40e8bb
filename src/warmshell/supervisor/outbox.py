"""Messages waiting to go up the current supervisor session, bounded in bytes of output.

A gRPC call's request iterator can outlive its call (grpc.aio keeps consuming it in a task of its
own), so a plain shared queue would let the previous session's iterator steal the first message
queued after a reconnect — an exec's output or exit would be lost. Each reader therefore takes
messages only while its session is still the current one.

Output waits for room: while `max_bytes` of output are queued (the gateway is away, or reads
slower than the workload writes), `put` of more output blocks, so the command's pipe stops
being read and the workload blocks in write(2) — backpressure, never a dropped chunk and never
an unbounded queue. Exec output is also bounded by its credit window (`window`); the workload's
own output has no window, so this bound is what holds it. Other messages (exits, heartbeats)
are few and small and never wait, so a full outbox cannot stall the session itself.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator

from warmshell.api.v1 import supervisor_pb2 as spb

__all__ = ["DEFAULT_MAX_BYTES", "Outbox"]

DEFAULT_MAX_BYTES = 1024 * 1024  # per sandbox; the local driver runs every supervisor in the gateway


def _output_bytes(message: spb.SupervisorMessage) -> int:
    return len(message.output.data) if message.WhichOneof("message") == "output" else 0


def _of_an_exec(message: spb.SupervisorMessage) -> bool:
    kind = message.WhichOneof("message")
    if kind == "output":
        return bool(message.output.exec_id)  # the workload's own output has none
    return kind in ("exec_exited", "exec_input_credit")


class Outbox:
    """A FIFO of supervisor messages, read by at most one live session at a time."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self._items: deque[spb.SupervisorMessage] = deque()
        self._changed = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._generation = 0
        self._max_bytes = max_bytes
        self.queued_bytes = 0  # output bytes waiting to be sent

    async def put(self, message: spb.SupervisorMessage) -> None:
        """Queue a message for whichever session is current (now or after a reconnect); output
        first waits until less than `max_bytes` of output is queued."""
        size = _output_bytes(message)
        while size and self.queued_bytes >= self._max_bytes:
            self._room.clear()
            await self._room.wait()
        self.queued_bytes += size
        self._append(message)

    def put_control(self, message: spb.SupervisorMessage) -> None:
        """Queue a message that is not output (a credit, a file result: each bounded by its own
        window) from synchronous code; it never waits."""
        if _output_bytes(message):
            raise ValueError("output goes through put(), which waits for room")
        self._append(message)

    def _append(self, message: spb.SupervisorMessage) -> None:
        self._items.append(message)
        self._changed.set()

    def new_session(self) -> int:
        """Start a session; readers of older sessions stop without taking anything. What was
        queued for the old session's execs is dropped: the gateway ended its execs with the
        session, and a background command's output is sent again from its ring to the session
        that follows it (stale copies would count against that session's window)."""
        self._generation += 1
        kept = deque(m for m in self._items if not _of_an_exec(m))
        if len(kept) != len(self._items):
            self._items = kept
            self.queued_bytes = sum(_output_bytes(m) for m in kept)
            if self.queued_bytes < self._max_bytes:
                self._room.set()
        self._changed.set()
        return self._generation

    def _take(self) -> spb.SupervisorMessage:
        message = self._items.popleft()
        self.queued_bytes -= _output_bytes(message)
        if self.queued_bytes < self._max_bytes:
            self._room.set()
        return message

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
            yield self._take()
