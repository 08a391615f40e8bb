"""How many pods a simulated node starts at once.

A real kubelet does not start every pod the moment it is bound: image pulls are serialised (or
bounded by ``maxParallelImagePulls``) and the runtime creates sandboxes a few at a time. Here every
pod start is a real process start on this machine, so hundreds at once (a warm pool filled from
nothing) thrash the host. A pod holds one of its node's ``Timing.max_parallel_pod_starts`` slots
from its first container start until it is started: every app container running (or, for one with
a readiness probe, Ready), or one exited, or ``Timing.pod_start_timeout`` passed (a pod that never
gets Ready must not stall the node).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["StartSlots"]


class StartSlots:
    """Per-node bounded start slots; ``limit`` 0 means unbounded."""

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError(f"max_parallel_pod_starts must be >= 0 (0 = unbounded), got {limit}")
        self._limit = limit
        self._nodes: dict[str, asyncio.Semaphore] = {}
        self._busy: dict[str, int] = {}

    def busy(self, node: str) -> int:
        """Slots of ``node`` held now (for tests and benchmarks)."""
        return self._busy.get(node, 0)

    async def acquire(self, node: str) -> Callable[[], None]:
        """Wait for a slot of ``node``; returns its release (idempotent, safe from any callback)."""
        semaphore = None
        if self._limit:
            semaphore = self._nodes.setdefault(node, asyncio.Semaphore(self._limit))
            await semaphore.acquire()
        self._busy[node] = self._busy.get(node, 0) + 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            self._busy[node] -= 1
            if semaphore is not None:
                semaphore.release()

        return release
