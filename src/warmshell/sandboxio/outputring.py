"""A background command's output while nobody may be reading it: the last `capacity` bytes, in
order, each reader following at its own position; what falls off the front is counted, so a
reader that fell behind learns how much it missed instead of reading a silent gap.

The supervisor keeps the command's ring (it outlives the gateway's session); the gateway keeps a
copy fed from it by offset (`append_at`), so a new session replays only what the gateway lacks.
The bounds on a sandbox's background commands are here too, as both sides enforce them.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

__all__ = ["EXITED_RETENTION_SECONDS", "MAX_EXITED", "MAX_RUNNING", "Changes", "Chunk", "OutputRing"]

# Per sandbox: background commands running at once, exited ones kept, and for how long.
MAX_RUNNING = 16
MAX_EXITED = 16
EXITED_RETENTION_SECONDS = 3600


@dataclass(frozen=True)
class Chunk:
    """Output as the command wrote it: `offset` counts every byte it wrote before this one."""

    offset: int
    stderr: bool
    data: bytes


class OutputRing:
    """The last `capacity` bytes of a command's stdout and stderr, interleaved as they came."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.end = 0  # every byte ever appended
        self._held = 0
        self._chunks: deque[Chunk] = deque()

    @property
    def start(self) -> int:
        """The offset of the oldest byte still held; everything before it was dropped."""
        return self.end - self._held

    def append(self, stderr: bool, data: bytes) -> None:
        """Keep `data` (its tail, if longer than the ring), dropping the oldest bytes past capacity."""
        offset, self.end = self.end, self.end + len(data)
        if len(data) > self.capacity:
            offset, data = self.end - self.capacity, data[len(data) - self.capacity :]
        if not data:
            return
        self._chunks.append(Chunk(offset, stderr, data))
        self._held += len(data)
        while self._held > self.capacity:
            first = self._chunks.popleft()
            excess = self._held - self.capacity
            if excess < len(first.data):  # cut its head, keep the rest
                self._chunks.appendleft(Chunk(first.offset + excess, first.stderr, first.data[excess:]))
                self._held -= excess
            else:
                self._held -= len(first.data)

    def append_at(self, offset: int, stderr: bool, data: bytes) -> None:
        """Keep output that starts at `offset` of the command's output: what is already held is
        skipped; a gap (bytes this ring never received) drops everything held before it."""
        if offset > self.end:
            self._chunks.clear()
            self._held, self.end = 0, offset
        self.append(stderr, data[self.end - offset :])

    def read(self, position: int) -> tuple[int, list[Chunk]]:
        """What a reader at `position` has not read: how many of those bytes were dropped, then
        the chunks held after them (the reader's next position is `end`)."""
        dropped = max(0, self.start - position)
        chunks = []
        for chunk in self._chunks:
            skip = position - chunk.offset
            if skip >= len(chunk.data):
                continue
            chunks.append(Chunk(position, chunk.stderr, chunk.data[skip:]) if skip > 0 else chunk)
        return dropped, chunks


class Changes:
    """Wakes whoever follows a ring at its next change (more output, or its command's end)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def next(self) -> asyncio.Event:
        """The event set at the next change: taken before reading the ring, so none is missed."""
        return self._event

    def notify(self) -> None:
        """Wake everyone waiting for a change."""
        self._event.set()
        self._event = asyncio.Event()
