"""`queueing.StreamSlots`: calls past the limit wait in order, a slot comes back when a call
ends, and a wait given up holds none (the fan-out itself: tests/integration/sdk/test_fan_out.py)."""

from __future__ import annotations

import asyncio

from warmshell.sdk import queueing


async def test_past_the_limit_calls_wait_for_a_stream_and_a_cancelled_wait_takes_none() -> None:
    slots = queueing.StreamSlots(limit=2)
    started: list[int] = []

    class Call:
        def __init__(self) -> None:
            self.done: list[object] = []

        def add_done_callback(self, callback: object) -> None:
            self.done.append(callback)

    calls: list[Call] = []

    async def continuation(details: object, request: int) -> Call:
        started.append(request)
        calls.append(Call())
        return calls[-1]

    admitted = [asyncio.ensure_future(slots.admit(continuation, None, n)) for n in range(4)]
    await asyncio.sleep(0)
    assert started == [0, 1]
    assert slots.in_use == 2
    admitted[2].cancel()  # gave up while queued: holds no slot
    await asyncio.sleep(0)
    for callback in calls[0].done:
        callback(calls[0])  # type: ignore[operator]
    await asyncio.wait_for(admitted[3], 5)
    assert started == [0, 1, 3]
    assert slots.in_use == 2


async def test_a_call_that_writes_as_it_goes_takes_a_slot_until_it_ends() -> None:
    slots = queueing.StreamSlots(limit=1)

    class Call:
        def __init__(self) -> None:
            self.done: list[object] = []

        def add_done_callback(self, callback: object) -> None:
            self.done.append(callback)

    first = await slots.open(Call)  # type: ignore[arg-type,type-var]
    second = asyncio.ensure_future(slots.open(Call))  # type: ignore[arg-type,type-var]
    await asyncio.sleep(0)
    assert not second.done()
    for callback in first.done:
        callback(first)  # type: ignore[operator]
    await asyncio.wait_for(second, 5)
    assert slots.in_use == 1
