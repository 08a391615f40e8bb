"""A controller-runtime style work queue: keys, not events; one worker per key at a time.

A key added while it is being reconciled is reconciled once more afterwards (never concurrently);
a reconcile may ask to run again after a delay; failures retry with a growing per-key backoff.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
log = logging.getLogger(__name__)

_FAILURE_BACKOFF = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0)


class WorkQueue(Generic[K]):
    """Deduplicating queue feeding ``workers`` concurrent reconciles."""

    def __init__(
        self,
        name: str,
        reconcile: Callable[[K], Awaitable[float | None]],
        *,
        workers: int,
        delay: float = 0.0,
    ) -> None:
        self.name = name
        self._reconcile = reconcile
        self._workers = workers
        self._delay = delay
        self._queue: asyncio.Queue[K] = asyncio.Queue()
        self._queued: set[K] = set()
        self._active: set[K] = set()
        self._dirty: set[K] = set()
        self._failures: dict[K, int] = {}
        self._timers: dict[K, asyncio.TimerHandle] = {}

    def add(self, key: K) -> None:
        """Enqueue after the configured reconcile delay (informer + queue lag)."""
        if self._delay > 0:
            self.add_after(key, self._delay)
        else:
            self._add_now(key)

    def add_after(self, key: K, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        when = loop.time() + max(seconds, 0.0)
        timer = self._timers.get(key)
        if timer is not None:
            if timer.when() <= when:
                return  # an earlier run is already due
            timer.cancel()
        self._timers[key] = loop.call_at(when, self._fire, key)

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self._add_now(key)

    def _add_now(self, key: K) -> None:
        if key in self._active:
            self._dirty.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)

    async def run(self) -> None:
        """Run the workers until cancelled."""
        try:
            async with asyncio.TaskGroup() as tg:
                for _ in range(self._workers):
                    tg.create_task(self._worker())
        finally:
            for timer in self._timers.values():
                timer.cancel()
            self._timers.clear()

    async def _worker(self) -> None:
        while True:
            key = await self._queue.get()
            self._queued.discard(key)
            self._active.add(key)
            try:
                again = await self._reconcile(key)
                self._failures.pop(key, None)
            except asyncio.CancelledError:
                raise
            except Exception:
                n = self._failures.get(key, 0) + 1
                self._failures[key] = n
                again = _FAILURE_BACKOFF[min(n, len(_FAILURE_BACKOFF)) - 1]
                log.warning("%s: reconcile %s failed (attempt %d)", self.name, key, n, exc_info=True)
            finally:
                self._active.discard(key)
            if key in self._dirty:
                self._dirty.discard(key)
                self._add_now(key)
            elif again is not None:
                self.add_after(key, again)
