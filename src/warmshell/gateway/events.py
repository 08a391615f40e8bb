"""Per-sandbox event fan-out for WatchSandbox: record changes, progress lines and workload output.

Output and progress are kept in bounded in-memory buffers so a watcher that arrives late (the
CLI right after CreateSandbox) still sees everything from the start.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from warmshell.core.ids import SandboxId

__all__ = ["Changed", "Closing", "Deleted", "EventBus", "Output", "Progress", "SandboxEventItem"]

OUTPUT_BUFFER_BYTES = 1024 * 1024
PROGRESS_HISTORY = 64
SUBSCRIBER_QUEUE = 4096
# A watcher that falls this far behind the workload's output misses output (never its events):
# the workload writes as fast as it likes, and each watcher must not hold more than this of it.
SUBSCRIBER_OUTPUT_BYTES = 4 * OUTPUT_BUFFER_BYTES
SUBSCRIBER_OUTPUT_ITEMS = SUBSCRIBER_QUEUE // 2  # the other half stays free for changes and Deleted


@dataclass(frozen=True)
class Changed:
    """The stored record changed; re-read it."""


@dataclass(frozen=True)
class Closing:
    """The gateway is shutting down: watch again (another replica, or this one's successor)."""


@dataclass(frozen=True)
class Deleted:
    """The sandbox is gone."""


@dataclass(frozen=True)
class Progress:
    """A step on the way to Ready."""

    timestamp_ms: int
    reason: str
    message: str
    warning: bool = False


@dataclass(frozen=True)
class Output:
    """A chunk of the workload's output."""

    stderr: bool
    data: bytes


SandboxEventItem = Changed | Closing | Deleted | Progress | Output


class _Subscription(asyncio.Queue[SandboxEventItem]):
    """One watcher's queue, counting the output it holds."""

    def __init__(self) -> None:
        super().__init__(SUBSCRIBER_QUEUE)
        self.output_bytes = 0
        self.output_items = 0

    def _put(self, item: SandboxEventItem) -> None:
        super()._put(item)
        if isinstance(item, Output):
            self.output_bytes += len(item.data)
            self.output_items += 1

    def _get(self) -> SandboxEventItem:
        item: SandboxEventItem = super()._get()
        if isinstance(item, Output):
            self.output_bytes -= len(item.data)
            self.output_items -= 1
        return item

    def behind_on_output(self) -> bool:
        """Whether it holds as much output as a watcher may (more is not queued for it)."""
        return self.output_bytes >= SUBSCRIBER_OUTPUT_BYTES or self.output_items >= SUBSCRIBER_OUTPUT_ITEMS


@dataclass
class _Channel:
    subscribers: set[_Subscription] = field(default_factory=set)
    output: deque[Output] = field(default_factory=deque)
    output_bytes: int = 0
    progress: deque[Progress] = field(default_factory=lambda: deque(maxlen=PROGRESS_HISTORY))


class EventBus:
    """Fan-out of sandbox events to watchers, with replay buffers."""

    def __init__(self) -> None:
        self._channels: dict[SandboxId, _Channel] = {}
        self._on_change: list[Callable[[SandboxId | None], None]] = []

    def on_change(self, callback: Callable[[SandboxId | None], None]) -> None:
        """Call `callback` with a sandbox's id each time its record changes or goes, watched or
        not (this gateway's writes and, with replicas, the others' heard), and with None when
        every record may have changed (another replica's writes were missed)."""
        self._on_change.append(callback)

    def publish(self, sandbox_id: SandboxId, item: SandboxEventItem) -> None:
        """Deliver to every watcher of the sandbox (and buffer progress and output)."""
        if self._on_change and isinstance(item, Changed | Deleted):
            for callback in self._on_change:
                callback(sandbox_id)
        channel = self._channels.get(sandbox_id)
        if channel is None:
            if not isinstance(item, Output | Progress):
                return  # no watcher to tell and nothing to keep for a later one (most writes)
            channel = self._channels[sandbox_id] = _Channel()
        if isinstance(item, Output):
            channel.output.append(item)
            channel.output_bytes += len(item.data)
            while channel.output_bytes > OUTPUT_BUFFER_BYTES and len(channel.output) > 1:
                channel.output_bytes -= len(channel.output.popleft().data)
        elif isinstance(item, Progress):
            channel.progress.append(item)
        for queue in list(channel.subscribers):
            if isinstance(item, Output) and queue.behind_on_output():
                continue
            try:
                queue.put_nowait(item)
            except asyncio.QueueFull:
                # A watcher this far behind gets a re-read instead of every intermediate change.
                continue

    def changed_everywhere(self) -> None:
        """Every watched sandbox may have changed (another replica's writes were missed)."""
        for callback in self._on_change:
            callback(None)
        for sandbox_id in list(self._channels):
            self.publish(sandbox_id, Changed())

    def close_all(self) -> None:
        """Tell every watcher the gateway is going away (shutdown)."""
        for channel in self._channels.values():
            for queue in list(channel.subscribers):
                with contextlib.suppress(asyncio.QueueFull):
                    queue.put_nowait(Closing())

    def forget(self, sandbox_id: SandboxId) -> None:
        """Drop buffers of a deleted sandbox (after telling watchers)."""
        self.publish(sandbox_id, Deleted())
        self._channels.pop(sandbox_id, None)

    @asynccontextmanager
    async def subscribe(
        self, sandbox_id: SandboxId, *, replay_output: bool
    ) -> AsyncIterator[asyncio.Queue[SandboxEventItem]]:
        """A queue of events for one sandbox, pre-filled with buffered progress (and output)."""
        channel = self._channels.get(sandbox_id)
        if channel is None:
            channel = self._channels[sandbox_id] = _Channel()
        queue = _Subscription()
        for progress in channel.progress:
            queue.put_nowait(progress)
        if replay_output:
            for chunk in channel.output:
                if queue.behind_on_output():
                    break
                queue.put_nowait(chunk)
        channel.subscribers.add(queue)
        try:
            yield queue
        finally:
            channel.subscribers.discard(queue)
