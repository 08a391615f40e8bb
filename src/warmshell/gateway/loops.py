"""Background loops of a running gateway (reconcilers, heartbeats, change feeds): started by name,
cancelled and awaited together when the part that started them stops."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any

__all__ = ["Loops"]


class Loops:
    """A set of tasks that run until `aclose()`; a loop is expected to run until cancelled, so
    one that is done early has died (`running` shows which are still alive)."""

    def __init__(self) -> None:
        self._tasks: list[asyncio.Task[None]] = []

    def start(self, loop: Coroutine[Any, Any, None], *, name: str) -> None:
        """Run `loop` in a task of its own until `aclose()`."""
        self._tasks.append(asyncio.create_task(loop, name=name))

    @property
    def tasks(self) -> tuple[asyncio.Task[None], ...]:
        """The loops started and not yet closed (a done one among them has died)."""
        return tuple(self._tasks)

    async def aclose(self) -> None:
        """Cancel every loop and wait until each has ended."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
