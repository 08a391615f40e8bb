"""How much of one exec's output the supervisor may still send up its session before the gateway
grants more (the gateway's side is `gateway.execs`).

The exec's output sink waits here, so a client that reads slowly stops the command's pipe from
being read, and the command blocks in write(2) instead of anyone buffering or dropping output.
"""

from __future__ import annotations

import asyncio

__all__ = ["OutputWindow"]


class OutputWindow:
    """A byte budget: `take` waits for some, `grant` returns some."""

    def __init__(self, size: int) -> None:
        self._available = size
        self._changed = asyncio.Event()

    async def take(self, wanted: int) -> int:
        """Wait until some budget is left, take up to `wanted` of it and return how much."""
        while self._available <= 0:
            self._changed.clear()
            await self._changed.wait()
        taken = min(wanted, self._available)
        self._available -= taken
        return taken

    def grant(self, size: int) -> None:
        """The gateway passed `size` more bytes on to the client."""
        self._available += size
        self._changed.set()
