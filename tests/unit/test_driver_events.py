"""The driver's event fan-out."""

from __future__ import annotations

from warmshell.core.ids import SandboxId
from warmshell.drivers.base import DriverEvent
from warmshell.drivers.events import Hub

EVENT = DriverEvent(SandboxId("sbx-1"), deleted=True)


async def test_a_subscription_gets_events_published_after_subscribing_before_iterating() -> None:
    hub = Hub()
    hub.publish(EVENT)  # before: not delivered
    first, second = hub.subscribe(), hub.subscribe()
    hub.publish(EVENT)
    hub.close()
    assert [e async for e in first] == [EVENT]
    assert [e async for e in second] == [EVENT]
    assert [e async for e in hub.subscribe()] == []  # after close: ends at once


async def test_aclose_unsubscribes_without_iterating() -> None:
    hub = Hub()
    subscription = hub.subscribe()
    await subscription.aclose()
    hub.publish(EVENT)
    assert [e async for e in subscription] == []
