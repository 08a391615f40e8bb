"""Time for the driver's timed loops (the Lease's elector, the extension probes, the profile
reconciler): one small protocol, so tests drive them with a fake clock instead of sleeping."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

__all__ = ["Clock", "SystemClock"]


class Clock(Protocol):
    """Time as the elector sees it: a monotonic reading for deadlines, the wall clock for the
    timestamps written on the Lease, and a way to wait."""

    def monotonic(self) -> float: ...

    def wall(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The real clock."""

    def monotonic(self) -> float:
        """`time.monotonic()`."""
        return time.monotonic()

    def wall(self) -> float:
        """`time.time()`."""
        return time.time()

    async def sleep(self, seconds: float) -> None:
        """`asyncio.sleep`."""
        await asyncio.sleep(seconds)
