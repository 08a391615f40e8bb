"""The supervisor's per-exec output window: waits for credit, never over-spends."""

from __future__ import annotations

import asyncio

from warmshell.sandboxio.window import OutputWindow


async def test_take_spends_at_most_what_is_left_and_waits_for_a_grant() -> None:
    window = OutputWindow(100)
    assert await window.take(60) == 60
    assert await window.take(60) == 40
    waiting = asyncio.ensure_future(window.take(10))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    window.grant(5)
    assert await asyncio.wait_for(waiting, 1.0) == 5
