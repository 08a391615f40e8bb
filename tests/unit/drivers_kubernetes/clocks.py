"""A fake clock for the elector and the reconciler: time moves only when a test advances it."""

from __future__ import annotations

import asyncio
import heapq
import itertools


class FakeClock:
    """`monotonic()` and `wall()` read the same fake time; `sleep` waits until `advance` passes
    its deadline."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.now + seconds, next(self._order), future))
        await future

    async def advance(self, seconds: float, *, step: float = 0.25) -> None:
        """Move time forward in steps, letting every task that wakes run to its next wait."""
        end = self.now + seconds
        while True:
            await settle()
            self.now = min(end, self.now + step)
            while self._sleepers and self._sleepers[0][0] <= self.now:
                _, _, future = heapq.heappop(self._sleepers)
                if not future.done():
                    future.set_result(None)
            await settle()
            if self.now >= end:
                return


async def settle(rounds: int = 30) -> None:
    """Let ready tasks run until they block again (in-memory fakes never truly wait)."""
    for _ in range(rounds):
        await asyncio.sleep(0)
