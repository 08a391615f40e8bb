"""Driver event fan-out: every watcher sees events published after it subscribed."""

from __future__ import annotations

import asyncio

from warmshell.core.ids import SandboxId
from warmshell.drivers.base import DriverEvent
from warmshell.drivers.local.events import EventHub


async def test_fan_out_from_subscription_until_close() -> None:
    hub = EventHub()
    hub.publish(DriverEvent(SandboxId("before")))  # nobody subscribed: dropped
    first, second = hub.watch(), hub.watch()
    hub.publish(DriverEvent(SandboxId("a")))
    hub.publish(DriverEvent(SandboxId("b"), deleted=True))
    hub.close()
    seen_first = [e.sandbox_id async for e in first]
    seen_second = [e.sandbox_id async for e in second]
    assert seen_first == seen_second == ["a", "b"]
    assert [e async for e in hub.watch()] == []  # watching a closed hub ends at once


async def test_a_watcher_that_leaves_is_forgotten() -> None:
    hub = EventHub()
    events = hub.watch()
    hub.publish(DriverEvent(SandboxId("a")))
    assert (await asyncio.wait_for(events.__anext__(), 1)).sandbox_id == "a"
    await events.aclose()  # type: ignore[attr-defined]
    assert hub._queues == set()
